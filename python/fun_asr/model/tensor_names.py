"""The one tensor-name table (model_specs/fun_asr_nano.json, "tensors"), expanded for a config.

The converter maps HF names to GGUF names with it; the native loader checks GGUF names and shapes
against the same table (it is copied into every GGUF as part of the model spec).
"""

from __future__ import annotations

from dataclasses import dataclass

from fun_asr.model.hparams import HParams
from fun_asr.model.spec import load_spec

MAX_NAME_LEN = 63  # GGML_MAX_NAME - 1


@dataclass(frozen=True)
class TensorEntry:
    hf: str
    gguf: str
    shape: tuple[int, ...]  # torch order: [out, in]
    kind: str  # matrix | embedding | output | norm | bias | fsmn
    stack: str  # enc | adp | dec | ctc
    layer: int | None
    funasr: str = ""  # name in a FunASR model.pt ({enc}/{enc_norm} still to resolve, see funasr_checkpoint)
    funasr_part: str | None = None  # "k/n": rows k of n of a fused tensor (linear_q_k_v)


def _expand(group: list[dict], stack: str, layers: range | tuple[int, ...] | list[int],
            hp: HParams) -> list[TensorEntry]:
    out = []
    for i in layers:
        sym = hp.symbols(i)
        for e in group:
            shape = tuple(s if isinstance(s, int) else sym[s] for s in e["shape"])
            out.append(
                TensorEntry(
                    hf=e["hf"].replace("{i}", str(i)),
                    gguf=e["gguf"].replace("{i}", str(i)),
                    shape=shape,
                    kind=e["kind"],
                    stack=stack,
                    layer=None if "{i}" not in e["gguf"] else i,
                    funasr=e.get("funasr", "").replace("{i}", str(i)),
                    funasr_part=e.get("funasr_part"),
                )
            )
    return out


def tensor_table(hp: HParams) -> list[TensorEntry]:
    """Every tensor a checkpoint of this config holds, in file order (encoder, adaptor, decoder, and the
    CTC head when ``hp.ctc`` is set)."""
    t = load_spec()["tensors"]
    e, a, d = hp.encoder, hp.adaptor, hp.decoder
    entries: list[TensorEntry] = []
    for i in range(e.n_layers):
        entries += _expand(t["encoder_layer"], "enc", [i], hp)
        if i in e.norm_layers:
            entries += _expand(t["encoder_norm_layer"], "enc", [i], hp)
    entries += _expand(t["adaptor"], "adp", [None], hp)  # type: ignore[list-item]
    entries += _expand(t["adaptor_layer"], "adp", range(a.n_layers), hp)
    entries += _expand(t["decoder"], "dec", [None], hp)  # type: ignore[list-item]
    if not d.tie_embeddings:
        entries += _expand(t["decoder_untied"], "dec", [None], hp)  # type: ignore[list-item]
    entries += _expand(t["decoder_layer"], "dec", range(d.n_layers), hp)
    if hp.ctc is not None:
        entries += _expand(t["ctc"], "ctc", [None], hp)  # type: ignore[list-item]
        entries += _expand(t["ctc_layer"], "ctc", range(hp.ctc.n_layers), hp)
        entries += _expand(t["ctc_output"], "ctc", [None], hp)  # type: ignore[list-item]
    for entry in entries:
        assert len(entry.gguf) <= MAX_NAME_LEN, entry.gguf
    return entries
