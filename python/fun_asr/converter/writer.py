"""Writes the GGUF: metadata (docs/model.md, GGUF package) first, then tensors streamed one at a time.

Only one tensor is in memory at once (its float32 copy and its packed bytes), so converting the
830M checkpoint never holds it twice. Output goes to a temporary file beside the target and is
renamed into place at the end; on any error the temporary file is removed.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

import gguf
import numpy as np

from fun_asr import _core
from fun_asr.converter.output import (  # noqa: F401 - re-exported
    ConversionReport,
    OutputError,
    _write_metadata,
    atomic_output,
    check_output,
)
from fun_asr.converter.plan import Placement, check_package_type, place
from fun_asr.converter.submodel import SPEAKER, SUBMODELS, VAD
from fun_asr.model.checkpoint import Checkpoint
from fun_asr.model.funasr_checkpoint import HF_NO_CTC, detect_layout, open_checkpoint
from fun_asr.model.metadata import ARCH, check_tensors, gguf_metadata  # noqa: F401 - re-exported
from fun_asr.model.tensor_names import tensor_table


def _ggml_type(name: str) -> gguf.GGMLQuantizationType:
    return gguf.GGMLQuantizationType[name.upper()]



def _pack(ckpt: Checkpoint, p: Placement, threads: int) -> np.ndarray:
    """The tensor's bytes in its target type, as a uint8 array of the GGUF byte shape."""
    name, shape = p.entry.hf, p.entry.shape
    stored = ckpt.dtype(name)
    if p.type == "f32" and stored == "F32" or p.type == "f16" and stored == "F16":
        return np.ascontiguousarray(ckpt.raw(name)).view(np.uint8).reshape(*shape[:-1], -1)
    x = ckpt.float32(name).reshape(-1, shape[-1])
    packed = _core.quantize(x, p.type, threads=threads)
    return np.frombuffer(packed, dtype=np.uint8).reshape(*shape[:-1], -1)



def convert(src: str | os.PathLike[str], dst: str | os.PathLike[str], type: str = "q8_0", *,
            progress: bool = True, threads: int = 0, repo_id: str | None = None,
            revision: str | None = None, overwrite: bool = False,
            encoder_type: str | None = None, vad_model: str | os.PathLike[str] | None = None,
            speaker_model: str | os.PathLike[str] | None = None) -> ConversionReport:
    """Converts a Fun-ASR-Nano checkpoint folder into one GGUF file.

    ``src`` is a Hugging Face folder (config.json + safetensors) or a FunASR/ModelScope folder
    (model.pt + config.yaml + Qwen3-0.6B/); :func:`fun_asr.model.funasr_checkpoint.detect_layout` tells which,
    and ``ConversionReport.layout`` records it. Identical weights give identical tensors in both
    layouts; a FunASR folder with its complete CTC head also stores the CTC tensors and tokenizer
    (``ConversionReport.ctc``). A FunASR FSMN-VAD folder is converted by
    its record (:mod:`fun_asr.converter.submodel`: ``type`` does not apply: it stays F32); a FunASR CAM++ folder
    the same way (``type`` f16 gives F16 convolutions, any other F32).

    ``type`` is the package type: ``f32``, ``f16``, ``q8_0`` or ``q4_k_m``. ``repo_id`` and
    ``revision`` are recorded in the metadata (guessed from a huggingface_hub cache path if not
    given). Raises ``CheckpointError``/``ConfigError`` (both ``ValueError``) naming the file or
    tensor on a bad checkpoint; no partial output is left behind. ``dst`` must not exist unless
    ``overwrite`` (and then it must be a regular file that is not one of the inputs); it is never
    inside the checkpoint folder (``OutputError``). The file gets the usual permissions (umask).

    ``vad_model`` embeds an FSMN-VAD in the package (a FunASR ``fsmn-vad`` folder, an ``fsmn_vad`` GGUF, or
    another package that embeds one): its ``vad.*`` tensors (F32) and ``fsmn_vad.*`` settings, so that a
    Session loads the recognizer and its VAD from this one file (``ConversionReport.vad``).

    ``speaker_model`` embeds a CAM++ speaker model the same way (a FunASR CAM++ folder, a ``campplus`` GGUF, or
    another package that embeds one): its ``spk.*`` tensors (F32 from a folder; as stored, F32 or F16, from a
    GGUF) and ``campplus.*`` settings
    (``ConversionReport.speaker``); :meth:`fun_asr.speakers.native.SpeakerModel.from_package` loads it.
    """
    package = check_package_type(type)
    start = time.perf_counter()
    out = Path(dst)
    check_output(out, Path(src), overwrite)
    given = {VAD: vad_model, SPEAKER: speaker_model}
    for kind, extra in given.items():
        if extra is not None:
            extra_path = Path(extra).expanduser()
            if extra_path.is_file() and out.exists() and os.path.samefile(extra_path, out):
                raise OutputError(f"{out}: is the same file as the {kind.what} being embedded; write the GGUF "
                                  "elsewhere")
    layout = detect_layout(src)
    for kind in SUBMODELS:  # a sub-model's own folder: its own GGUF
        if layout != kind.arch:
            continue
        for other, extra in given.items():
            if extra is not None:
                raise ValueError(f"{src}: is a {kind.folder}, not a recognizer checkpoint; {other.flag} "
                                 f"({other.option}=) embeds a {other.what} in a recognizer package, so give the "
                                 "Fun-ASR-Nano checkpoint as the source")
        return kind.convert(src, dst, kind.tensor_type(package), overwrite=overwrite, repo_id=repo_id,
                            revision=revision)
    # what the package embeds, read (and checked) before the long part: F32, or as stored in a sub-model GGUF
    embedded = {kind: kind.for_embedding(extra) for kind, extra in given.items() if extra is not None}
    sub_meta = {k: v for meta, _ in embedded.values() for k, v in meta.items()}
    sub_tensors = [t for _, tensors in embedded.values() for t in tensors]
    ckpt = open_checkpoint(src)
    hp = ckpt.hparams
    placements = [place(entry, package, hp, encoder_type) for entry in tensor_table(hp)]
    check_tensors(ckpt, [p.entry for p in placements])

    try:
        with atomic_output(out, Path(src), overwrite) as tmp:
            w = gguf.GGUFWriter(tmp, ARCH)
            _write_metadata(w, {**gguf_metadata(ckpt, hp, package, repo_id, revision), **sub_meta})
            for p in placements:
                row_bytes = _core.quantized_row_bytes(p.type, p.entry.shape[-1])
                byte_shape = (*p.entry.shape[:-1], row_bytes)
                w.add_tensor_info(p.entry.gguf, byte_shape, np.dtype(np.uint8),
                                  int(np.prod(byte_shape)), raw_dtype=_ggml_type(p.type))
            for name, arr in sub_tensors:
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
            for _, arr in sub_tensors:
                w.write_tensor_data(arr)
            bar.close()
            w.close()
    finally:
        ckpt.close()

    counts: dict[str, int] = {}
    for p in placements:
        counts[p.type] = counts.get(p.type, 0) + 1
    for _, arr in sub_tensors:
        key = "f16" if arr.dtype == np.float16 else "f32"
        counts[key] = counts.get(key, 0) + 1
    return ConversionReport(
        path=out,
        package_type=package,
        tensor_count=len(placements) + len(sub_tensors),
        file_bytes=out.stat().st_size,
        seconds=time.perf_counter() - start,
        type_counts=counts,
        fallbacks=[(p.entry.gguf, p.wanted, p.type) for p in placements if p.fell_back],
        layout=layout,
        ctc=hp.ctc is not None,
        ctc_unavailable=None if hp.ctc is not None else (getattr(ckpt, "ctc_unavailable", None) or HF_NO_CTC),
        vad=embedded[VAD][0].get(f"{VAD.arch}.source") if VAD in embedded else None,
        speaker=embedded[SPEAKER][0].get(f"{SPEAKER.arch}.source") if SPEAKER in embedded else None,
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
