"""The demo model with a trained CTC head (tools/train_tiny_ctc.py): a package whose CTC head hears.

FunASR's own checkpoints carry a CTC head (word timestamps, and here the drafts of speculative decoding); the
demo model, a Hugging Face layout checkpoint, has none. ``demo_with_ctc(dest, type)`` writes the demo package
of that type with the committed head added (``ctc.*`` tensors, F32, and the ``fun_asr_nano.ctc.*`` metadata a
FunASR conversion writes: dimensions, blank id, the SenseVoice-style tiktoken vocabulary). Needs numpy, gguf and
safetensors only (no torch).
"""

from __future__ import annotations

import base64
import json
from pathlib import Path
from typing import Any

import numpy as np

DATA = Path(__file__).resolve().parent / "data" / "tiny_trained"
ARTIFACT_WEIGHTS = DATA / "ctc_head.safetensors"
ARTIFACT_JSON = DATA / "ctc_head.json"


def _recipe() -> dict[str, Any]:
    from fun_asr.model.spec import load_spec

    return load_spec()["ctc"]["tokenizers"]["SenseVoiceTokenizer"]


CTC_PATTERN: str = _recipe()["pattern"]


def specials() -> list[str]:
    """The SenseVoice tokenizer's special tokens (num_languages 8749, as FunASR's default)."""
    from fun_asr.model.funasr_checkpoint import expand_specials

    return expand_specials(_recipe(), 8749)


def ranks_text(ranks: list[bytes]) -> str:
    return "".join(f"{base64.b64encode(t).decode()} {i}\n" for i, t in enumerate(ranks))


def tokenizer(ranks: list[bytes]) -> Any:
    """fun_asr's CtcTokenizer over these BPE ranks and the SenseVoice specials (vocab = ranks + specials)."""
    from fun_asr.asr.ctc import CtcTokenizer

    return CtcTokenizer.from_tiktoken(ranks_text(ranks), CTC_PATTERN, specials())


def demo_gguf(work: Path, package_type: str) -> Path:
    """The demo checkpoint converted to `package_type` (cached in `work`)."""
    import fun_asr
    from trained_model import trained_checkpoint

    out = Path(work) / f"demo-{package_type}.gguf"
    if not out.exists():
        ckpt = Path(work) / "demo-ckpt"
        if not (ckpt / "model.safetensors").exists():
            trained_checkpoint(ckpt)
        fun_asr.convert(ckpt, out, package_type, progress=False)
    return out


def head_tensors(d_enc: int) -> tuple[dict[str, np.ndarray], dict[str, Any]]:
    """The committed head as GGUF tensors (F32) and its settings (ctc_head.json)."""
    from safetensors.numpy import load_file

    conf = json.loads(ARTIFACT_JSON.read_text("utf-8"))
    st = {k: v.astype(np.float32) for k, v in load_file(str(ARTIFACT_WEIGHTS)).items()}
    vocab, used = int(conf["vocab"]), np.asarray(conf["used_rows"], np.int64)
    lo_w = np.zeros((vocab, d_enc), np.float32)
    lo_b = np.full(vocab, float(conf["unused_bias"]), np.float32)
    lo_w[used] = st["ctc.ctc_lo.weight.used_rows"]
    lo_b[used] = st["ctc.ctc_lo.bias.used_rows"]
    tensors = {
        "ctc.proj1.weight": st["ctc_decoder.linear1.weight"], "ctc.proj1.bias": st["ctc_decoder.linear1.bias"],
        "ctc.proj2.weight": st["ctc_decoder.linear2.weight"], "ctc.proj2.bias": st["ctc_decoder.linear2.bias"],
        "ctc.output.weight": lo_w, "ctc.output.bias": lo_b,
    }
    return tensors, conf


def ctc_metadata(d_model: int, proj: int, n_heads: int, ffn: int, n_layers: int, ranks: list[bytes],
                 source: str) -> dict[str, Any]:
    """The ``fun_asr_nano.ctc.*`` keys a FunASR conversion writes for a CTC head of these dimensions over the
    SenseVoice-style vocabulary `ranks` + specials (blank = the last id)."""
    vocab = len(ranks) + len(specials())
    k = "fun_asr_nano."
    return {
        k + "ctc.embedding_length": d_model, k + "ctc.projector_length": proj, k + "ctc.attention.head_count": n_heads,
        k + "ctc.feed_forward_length": ffn, k + "ctc.block_count": n_layers, k + "ctc.vocab_size": vocab,
        k + "ctc.blank_id": vocab - 1, k + "ctc.attention.layer_norm_epsilon": 1e-12, k + "ctc.frame_ms": 60,
        k + "ctc.tokenizer.type": "tiktoken", k + "ctc.tokenizer.name": "SenseVoiceTokenizer",
        k + "ctc.tokenizer.pattern": CTC_PATTERN, k + "ctc.tokenizer.ranks": ranks_text(ranks),
        k + "ctc.tokenizer.specials": json.dumps(specials(), ensure_ascii=False), k + "ctc.tokenizer.source": source,
    }


def add_ctc_head(src: Path, dest: Path, ctc_meta: dict[str, Any],
                 tensors: list[tuple[str, np.ndarray, Any]]) -> Path:
    """A copy of the package `src` with a CTC head: its metadata plus `ctc_meta` (its ``ctc.unavailable``
    dropped), its tensors plus `tensors` ((name, array, raw ggml type or None for a plain F32 array))."""
    import gguf

    from fun_asr.converter.output import write_gguf
    from fun_asr.model.native import model_metadata

    meta = model_metadata(src)
    meta.pop("fun_asr_nano.ctc.unavailable", None)
    meta.update(ctc_meta)
    kept = [(t.name, np.asarray(t.data), t.tensor_type) for t in gguf.GGUFReader(src).tensors]
    write_gguf(dest, str(meta["general.architecture"]), meta, kept + list(tensors))
    return dest


def demo_with_ctc(dest: str | Path, package_type: str = "f32", work: str | Path | None = None) -> Path:
    """The demo package of `package_type` with the trained CTC head (its tensors F32): written to `dest`."""
    from fun_asr.model.native import model_metadata

    dest = Path(dest)
    src = demo_gguf(Path(work) if work is not None else dest.parent, package_type)
    d_enc = int(model_metadata(src)["fun_asr_nano.encoder.embedding_length"])
    tensors, conf = head_tensors(d_enc)
    ranks = [base64.b64decode(r) for r in conf["ranks"]]
    assert len(ranks) + len(specials()) == conf["vocab"], "ctc_head.json does not match the SenseVoice specials"
    meta = ctc_metadata(d_enc, int(conf["proj"]), 4, d_enc // 4, 0, ranks, "tests/data/tiny_trained/ctc_head.json")
    return add_ctc_head(src, dest, meta, [(name, arr, None) for name, arr in tensors.items()])
