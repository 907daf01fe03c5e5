"""Writes the GGUF: metadata (DESIGN §3) first, then tensors streamed one at a time.

Only one tensor is in memory at once (its float32 copy and its packed bytes), so converting the
830M checkpoint never holds it twice. Output goes to a temporary file beside the target and is
renamed into place at the end; on any error the temporary file is removed.
"""

from __future__ import annotations

import json
import os
import stat
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import gguf
import numpy as np

from fun_asr import _core
from fun_asr.checkpoint import Checkpoint, CheckpointError
from fun_asr.converter.plan import FILE_TYPE, Placement, check_package_type, place
from fun_asr.funasr_checkpoint import HF_NO_CTC, FunasrCheckpoint, detect_layout, language_table, open_checkpoint
from fun_asr.hparams import HParams
from fun_asr.spec import FAMILY, load_spec, spec_text
from fun_asr.tensor_names import TensorEntry, tensor_table

ARCH = FAMILY


@dataclass
class ConversionReport:
    path: Path
    package_type: str
    tensor_count: int
    file_bytes: int
    seconds: float
    type_counts: dict[str, int] = field(default_factory=dict)
    fallbacks: list[tuple[str, str, str]] = field(default_factory=list)  # (tensor, wanted, used)
    layout: str = "hf"  # hf | funasr | fsmn_vad: the layout that was read
    ctc: bool = False  # the CTC head (timestamps) was stored
    ctc_unavailable: str | None = None  # why not, when it was not
    vad: str | None = None  # the FSMN-VAD embedded in the package (where it came from), if any

    def summary(self) -> str:
        counts = ", ".join(f"{k}: {v}" for k, v in sorted(self.type_counts.items()))
        lines = [
            f"wrote {self.path} ({self.file_bytes / 1e6:.1f} MB, {self.tensor_count} tensors, "
            f"{self.package_type}) in {self.seconds:.1f} s — {counts}"
        ]
        if self.layout != "fsmn_vad":
            lines.append("  CTC head stored: word timestamps available" if self.ctc
                         else f"  no CTC head: {self.ctc_unavailable}")
            lines.append(f"  FSMN-VAD embedded: {self.vad}" if self.vad else
                         "  no FSMN-VAD embedded: long audio is cut at pauses unless a VAD is given at run time "
                         "(--vad-model); re-convert with --vad-model to embed one")
        for name, wanted, used in self.fallbacks:
            lines.append(f"  fallback: {name} {wanted} -> {used} (row length not a multiple of the {wanted} block)")
        return "\n".join(lines)


def _ggml_type(name: str) -> gguf.GGMLQuantizationType:
    return gguf.GGMLQuantizationType[name.upper()]


def check_tensors(ckpt: Checkpoint | FunasrCheckpoint, entries: list[TensorEntry]) -> None:
    """Every table entry present with its shape, and nothing else; errors name the tensor."""
    expected = {e.hf: e for e in entries}
    missing = [n for n in expected if n not in ckpt.tensors]
    if missing:
        more = f" (and {len(missing) - 1} more)" if len(missing) > 1 else ""
        raise CheckpointError(f"{ckpt.path}: missing tensor {missing[0]}{more}")
    extra = [n for n in ckpt.tensors if n not in expected]
    if extra:
        hint = (
            " (tie_word_embeddings is true, so lm_head.weight is not expected)"
            if "lm_head.weight" in extra
            else ""
        )
        raise CheckpointError(
            f"{ckpt.path}: unexpected tensor {extra[0]}{hint}"
            + (f" (and {len(extra) - 1} more)" if len(extra) > 1 else "")
            + "; the config does not account for it"
        )
    for name, entry in expected.items():
        got = ckpt.tensors[name].shape
        if tuple(got) != entry.shape:
            raise CheckpointError(
                f"{ckpt.path}: tensor {name} has shape {list(got)}, expected {list(entry.shape)} from config.json"
            )


def gguf_metadata(ckpt: Checkpoint | FunasrCheckpoint, hp: HParams, package: str | None = None,
                  repo_id: str | None = None, revision: str | None = None) -> dict[str, Any]:
    """Every GGUF metadata key of DESIGN §3 for this checkpoint, as plain Python values.

    The GGUF writer stores ints as uint32, floats as float32, lists as int arrays; loading a checkpoint
    directory directly hands the same dict to the native loader, so both paths read one set of keys.
    Both layouts (HF, FunASR) give the same keys; a FunASR checkpoint with its CTC head adds
    ``fun_asr_nano.ctc.*`` (dimensions, blank id, and the CTC tokenizer ``ctc.tokenizer.*``), one without
    says why in ``fun_asr_nano.ctc.unavailable``.
    """
    spec = load_spec()
    e, a, d = hp.encoder, hp.adaptor, hp.decoder
    k = f"{ARCH}."
    meta: dict[str, Any] = {
        "general.architecture": ARCH,
        "general.type": "model",
        "general.name": "Fun-ASR-Nano",
        "general.license": spec["license"]["name"],
        "general.license.link": spec["license"]["url"],
        "general.quantization_version": gguf.GGML_QUANT_VERSION,
    }
    if package is not None:
        meta["general.file_type"] = FILE_TYPE[package]
    repo_id, revision = repo_id or ckpt.repo_id, revision or ckpt.revision
    if repo_id and repo_id.startswith("modelscope:"):
        meta["general.source.modelscope.repository"] = repo_id.split(":", 1)[1]
        meta["general.source.url"] = f"https://modelscope.cn/models/{repo_id.split(':', 1)[1]}"
    elif repo_id:
        meta["general.source.huggingface.repository"] = repo_id
        meta["general.source.url"] = f"https://huggingface.co/{repo_id}"
    if revision:
        meta["general.source.revision"] = revision
    meta.update({
        k + "encoder.input_size": e.input_size,
        k + "encoder.num_mel_bins": e.num_mel_bins,
        k + "encoder.num_stacked_frames": e.num_stacked_frames,
        k + "encoder.embedding_length": e.d_model,
        k + "encoder.block_count": e.n_layers,
        k + "encoder.tp_block_count": e.n_tp_layers,
        k + "encoder.attention.head_count": e.n_heads,
        k + "encoder.feed_forward_length": e.ffn,
        k + "encoder.fsmn_kernel_size": e.fsmn_kernel,
        k + "encoder.context_length": e.max_positions,
        k + "encoder.attention.layer_norm_epsilon": float(e.eps),
        k + "adaptor.embedding_length": a.d_model,
        k + "adaptor.projector_length": a.proj,
        k + "adaptor.block_count": a.n_layers,
        k + "adaptor.attention.head_count": a.n_heads,
        k + "adaptor.feed_forward_length": a.ffn,
        k + "adaptor.attention.layer_norm_epsilon": float(a.eps),
        k + "decoder.embedding_length": d.d_model,
        k + "decoder.block_count": d.n_layers,
        k + "decoder.attention.head_count": d.n_heads,
        k + "decoder.attention.head_count_kv": d.n_kv_heads,
        k + "decoder.attention.key_length": d.head_dim,
        k + "decoder.feed_forward_length": d.ffn,
        k + "decoder.vocab_size": d.vocab,
        k + "decoder.context_length": d.max_positions,
        k + "decoder.attention.layer_norm_rms_epsilon": float(d.rms_eps),
        k + "decoder.rope.freq_base": float(d.rope_theta),
        k + "decoder.tie_word_embeddings": d.tie_embeddings,
        k + "decoder.eos_token_ids": ckpt.eos_token_ids(),
        k + "prompt": json.dumps(getattr(ckpt, "prompt", None) or spec["prompt"], ensure_ascii=False),
        k + "model_spec": spec_text(),
        k + "source.config_json": json.dumps(ckpt.config, ensure_ascii=False),
        k + "source.layout": getattr(ckpt, "layout", "hf"),
        k + "language_table": getattr(ckpt, "language_table", None)
        or language_table(spec, [repo_id or "", str(ckpt.path)], ckpt.config),
    })
    if hp.ctc is not None:
        c = hp.ctc
        meta.update({
            k + "ctc.embedding_length": c.d_model,
            k + "ctc.projector_length": c.proj,
            k + "ctc.attention.head_count": c.n_heads,
            k + "ctc.feed_forward_length": c.ffn,
            k + "ctc.block_count": c.n_layers,
            k + "ctc.vocab_size": c.vocab,
            k + "ctc.blank_id": c.blank_id,
            k + "ctc.attention.layer_norm_epsilon": float(c.eps),
            k + "ctc.frame_ms": c.frame_ms,
        })
    else:
        meta[k + "ctc.unavailable"] = getattr(ckpt, "ctc_unavailable", None) or HF_NO_CTC
    extra = getattr(ckpt, "extra_metadata", None)
    if extra is not None:
        meta.update(extra())
    for key, value in (
        ("source.preprocessor_config_json", ckpt.preprocessor_config),
        ("source.generation_config_json", ckpt.generation_config),
        ("source.tokenizer_config_json", ckpt.tokenizer_config),
    ):
        if value is not None:
            meta[k + key] = json.dumps(value, ensure_ascii=False)
    meta[gguf.Keys.Tokenizer.HF_JSON] = ckpt.tokenizer_json
    if ckpt.chat_template:
        meta[gguf.Keys.Tokenizer.CHAT_TEMPLATE] = ckpt.chat_template
    return meta


def _write_metadata(w: gguf.GGUFWriter, meta: dict[str, Any]) -> None:
    for key, value in meta.items():
        if key == "general.architecture":
            continue  # GGUFWriter writes it from its arch argument
        if isinstance(value, bool):
            w.add_bool(key, value)
        elif isinstance(value, int):
            w.add_uint32(key, value)
        elif isinstance(value, float):
            w.add_float32(key, value)
        elif isinstance(value, str):
            w.add_string(key, value)
        else:
            w.add_array(key, list(value))


def _pack(ckpt: Checkpoint, p: Placement, threads: int) -> np.ndarray:
    """The tensor's bytes in its target type, as a uint8 array of the GGUF byte shape."""
    name, shape = p.entry.hf, p.entry.shape
    stored = ckpt.dtype(name)
    if p.type == "f32" and stored == "F32" or p.type == "f16" and stored == "F16":
        return np.ascontiguousarray(ckpt.raw(name)).view(np.uint8).reshape(*shape[:-1], -1)
    x = ckpt.float32(name).reshape(-1, shape[-1])
    packed = _core.quantize(x, p.type, threads=threads)
    return np.frombuffer(packed, dtype=np.uint8).reshape(*shape[:-1], -1)


class OutputError(ValueError):
    """The output path would destroy something: an input, a non-regular file, or (without
    overwrite) an existing file."""


def check_output(out: Path, src: Path, overwrite: bool) -> None:
    """Refuses an output that is (or is inside) the checkpoint being read, that exists and is not a
    regular file (a device, a directory, ...), or that exists at all unless ``overwrite``."""
    src = src.resolve()
    target = out.expanduser().absolute()
    try:
        parent = target.parent.resolve()
    except OSError:
        parent = target.parent
    if parent == src or src in parent.parents:
        raise OutputError(f"{out}: is inside the checkpoint folder being read ({src}); write the GGUF elsewhere "
                          "(default: beside the folder, SRC-TYPE.gguf)")
    if os.path.lexists(target):
        try:
            st = target.stat()
        except OSError as exc:  # a dangling symlink
            raise OutputError(f"{out}: exists and cannot be examined ({exc.strerror}); remove it first") from None
        if target.is_dir():
            raise OutputError(f"{out}: is a directory; give the output .gguf file path")
        if not stat.S_ISREG(st.st_mode):
            raise OutputError(f"{out}: exists and is not a regular file (a device, pipe or socket); refusing to "
                              "replace it")
        inputs = [p for p in src.iterdir() if p.is_file()] if src.is_dir() else [src]
        for p in inputs:
            try:
                same = os.path.samefile(p, target)
            except OSError:
                same = False
            if same:
                raise OutputError(f"{out}: is the same file as the input {p}; write the GGUF elsewhere")
        if not overwrite:
            raise OutputError(f"{out}: already exists; pass --force (overwrite=True) to replace it")


def _umask() -> int:
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def convert(src: str | os.PathLike[str], dst: str | os.PathLike[str], type: str = "q8_0", *,
            progress: bool = True, threads: int = 0, repo_id: str | None = None,
            revision: str | None = None, overwrite: bool = False,
            encoder_type: str | None = None, vad_model: str | os.PathLike[str] | None = None) -> ConversionReport:
    """Converts a Fun-ASR-Nano checkpoint folder into one GGUF file.

    ``src`` is a Hugging Face folder (config.json + safetensors) or a FunASR/ModelScope folder
    (model.pt + config.yaml + Qwen3-0.6B/); :func:`fun_asr.funasr_checkpoint.detect_layout` tells which,
    and ``ConversionReport.layout`` records it. Identical weights give identical tensors in both
    layouts; a FunASR folder with its complete CTC head also stores the CTC tensors and tokenizer
    (``ConversionReport.ctc``). A FunASR FSMN-VAD folder is converted by
    :func:`fun_asr.converter.vad.convert_vad` (``type`` does not apply: it stays F32).

    ``type`` is the package type: ``f32``, ``f16``, ``q8_0`` or ``q4_k_m``. ``repo_id`` and
    ``revision`` are recorded in the metadata (guessed from a huggingface_hub cache path if not
    given). Raises ``CheckpointError``/``ConfigError`` (both ``ValueError``) naming the file or
    tensor on a bad checkpoint; no partial output is left behind. ``dst`` must not exist unless
    ``overwrite`` (and then it must be a regular file that is not one of the inputs); it is never
    inside the checkpoint folder (``OutputError``). The file gets the usual permissions (umask).

    ``vad_model`` embeds an FSMN-VAD in the package (a FunASR ``fsmn-vad`` folder, an ``fsmn_vad`` GGUF, or
    another package that embeds one): its ``vad.*`` tensors (F32) and ``fsmn_vad.*`` settings, so that a
    Session loads the recognizer and its VAD from this one file (``ConversionReport.vad``).
    """
    package = check_package_type(type)
    start = time.perf_counter()
    out = Path(dst)
    check_output(out, Path(src), overwrite)
    if vad_model is not None:
        vad_path = Path(vad_model).expanduser()
        if vad_path.is_file() and out.exists() and os.path.samefile(vad_path, out):
            raise OutputError(f"{out}: is the same file as the VAD model being embedded; write the GGUF elsewhere")
    layout = detect_layout(src)
    if layout == "fsmn_vad" and vad_model is not None:
        raise ValueError(f"{src}: is an FSMN-VAD folder; --vad-model (vad_model=) embeds a VAD in a recognizer "
                         "package, so give the Fun-ASR-Nano checkpoint as the source")
    if layout == "fsmn_vad":
        from fun_asr.converter.vad import convert_vad

        report = convert_vad(src, dst, overwrite=overwrite, repo_id=repo_id, revision=revision)
        report.layout = "fsmn_vad"
        return report
    vad_meta: dict[str, Any] = {}
    vad_tensors: list[tuple[str, np.ndarray]] = []
    if vad_model is not None:
        from fun_asr.converter.vad import vad_for_embedding

        vad_meta, vad_tensors = vad_for_embedding(vad_model)  # read (and checked) before the long part
    ckpt = open_checkpoint(src)
    hp = ckpt.hparams
    placements = [place(entry, package, hp, encoder_type) for entry in tensor_table(hp)]
    check_tensors(ckpt, [p.entry for p in placements])

    try:
        out.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp_name = tempfile.mkstemp(prefix=f".{out.name}.", suffix=".partial", dir=out.parent)
    except OSError as exc:
        ckpt.close()
        raise OutputError(f"{out}: cannot write there ({exc.strerror or exc})") from None
    os.close(fd)
    tmp = Path(tmp_name)
    try:
        w = gguf.GGUFWriter(tmp, ARCH)
        _write_metadata(w, {**gguf_metadata(ckpt, hp, package, repo_id, revision), **vad_meta})
        for p in placements:
            row_bytes = _core.quantized_row_bytes(p.type, p.entry.shape[-1])
            byte_shape = (*p.entry.shape[:-1], row_bytes)
            w.add_tensor_info(p.entry.gguf, byte_shape, np.dtype(np.uint8),
                              int(np.prod(byte_shape)), raw_dtype=_ggml_type(p.type))
        for name, arr in vad_tensors:
            w.add_tensor_info(name, arr.shape, arr.dtype, arr.nbytes)
        w.write_header_to_file()
        w.write_kv_data_to_file()
        w.write_ti_data_to_file()
        bar = _progress(placements, progress)
        for p in placements:
            data = _pack(ckpt, p, threads)
            w.write_tensor_data(data)
            bar.update(p.entry.shape and int(np.prod(p.entry.shape)))
            del data
        for _, arr in vad_tensors:
            w.write_tensor_data(arr)
        bar.close()
        w.close()
        os.chmod(tmp, 0o666 & ~_umask())  # mkstemp made it 0600
        check_output(out, Path(src), overwrite)  # again: the path may have appeared meanwhile
        if overwrite:
            os.replace(tmp, out)
        else:
            try:
                os.link(tmp, out)  # fails if out exists: never replaces a file that appeared meanwhile
                tmp.unlink()
            except FileExistsError:
                raise OutputError(f"{out}: appeared while converting; pass --force (overwrite=True) to replace "
                                  "it") from None
            except OSError:  # no hard links on this file system
                os.replace(tmp, out)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    finally:
        ckpt.close()

    counts: dict[str, int] = {}
    for p in placements:
        counts[p.type] = counts.get(p.type, 0) + 1
    if vad_tensors:
        counts["f32"] = counts.get("f32", 0) + len(vad_tensors)
    return ConversionReport(
        path=out,
        package_type=package,
        tensor_count=len(placements) + len(vad_tensors),
        file_bytes=out.stat().st_size,
        seconds=time.perf_counter() - start,
        type_counts=counts,
        fallbacks=[(p.entry.gguf, p.wanted, p.type) for p in placements if p.fell_back],
        layout=layout,
        ctc=hp.ctc is not None,
        ctc_unavailable=None if hp.ctc is not None else (getattr(ckpt, "ctc_unavailable", None) or HF_NO_CTC),
        vad=vad_meta.get("fsmn_vad.source") if vad_tensors else None,
    )


class _NoBar:
    def update(self, n: int) -> None:
        pass

    def close(self) -> None:
        pass


def _progress(placements: list[Placement], enabled: bool):  # noqa: ANN202 - tqdm or a no-op
    if not enabled:
        return _NoBar()
    from tqdm import tqdm

    total = sum(int(np.prod(p.entry.shape)) for p in placements)
    return tqdm(total=total, unit="par", unit_scale=True, desc="converting", leave=False)
