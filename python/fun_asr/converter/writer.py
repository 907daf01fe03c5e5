"""Writes the GGUF: metadata (docs/model.md, GGUF package) first, then tensors streamed one at a time.

Only one tensor is in memory at once (its float32 copy and its packed bytes), so converting the
830M checkpoint never holds it twice. Output goes to a temporary file beside the target and is
renamed into place at the end; on any error the temporary file is removed.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import gguf
import numpy as np

from fun_asr import _core
from fun_asr.converter.output import (  # noqa: F401 - re-exported
    ConversionReport,
    OutputError,
    atomic_output,
    check_output,
    write_metadata,
)
from fun_asr.converter.plan import Placement, check_package_type, place
from fun_asr.converter.submodel import SPEAKER, SUBMODELS, VAD, SubModel, Tensors
from fun_asr.model.checkpoint import Checkpoint
from fun_asr.model.funasr_checkpoint import HF_NO_CTC, detect_layout, open_checkpoint
from fun_asr.model.metadata import ARCH, check_tensors, gguf_metadata  # noqa: F401 - re-exported
from fun_asr.model.tensor_names import tensor_table

_Given = dict[SubModel, str | os.PathLike[str] | None]  # what convert() got for each sub-model family


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
            revision: str | None = None, overwrite: bool = False, encoder_type: str | None = None,
            **embed: str | os.PathLike[str] | None) -> ConversionReport:
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

    ``embed``: the sub-models to embed, one keyword per family of :data:`~fun_asr.converter.submodel.SUBMODELS`
    (its ``option``: ``vad_model``, ``speaker_model``; any other keyword is a TypeError).

    ``vad_model`` embeds an FSMN-VAD in the package (a FunASR ``fsmn-vad`` folder, an ``fsmn_vad`` GGUF, or
    another package that embeds one): its ``vad.*`` tensors (F32) and ``fsmn_vad.*`` settings, so that a
    Session loads the recognizer and its VAD from this one file (``ConversionReport.vad``).

    ``speaker_model`` embeds a CAM++ speaker model the same way (a FunASR CAM++ folder, a ``campplus`` GGUF, or
    another package that embeds one): its ``spk.*`` tensors (F32 from a folder; as stored, F32 or F16, from a
    GGUF) and ``campplus.*`` settings
    (``ConversionReport.speaker``); :meth:`fun_asr.speakers.native.SpeakerModel.from_package` loads it.
    """
    given = _submodels_to_embed(embed)
    package = check_package_type(type)
    start = time.perf_counter()
    out = Path(dst)
    check_output(out, Path(src), overwrite)
    _check_not_embedding_output(given, out)
    layout = detect_layout(src)
    own = next((kind for kind in SUBMODELS if kind.arch == layout), None)
    if own is not None:  # a sub-model's own folder: its own GGUF
        _check_nothing_to_embed(src, own, given)
        return own.convert(src, dst, own.tensor_type(package), overwrite=overwrite, repo_id=repo_id,
                           revision=revision)
    # what the package embeds, read (and checked) before the long part: F32, or as stored in a sub-model GGUF
    embedded = _Embedded({kind: kind.for_embedding(extra) for kind, extra in given.items() if extra is not None})
    ckpt = open_checkpoint(src)
    hp = ckpt.hparams
    placements = [place(entry, package, hp, encoder_type) for entry in tensor_table(hp)]
    check_tensors(ckpt, [p.entry for p in placements])
    try:
        with atomic_output(out, Path(src), overwrite) as tmp:
            meta = {**gguf_metadata(ckpt, hp, package, repo_id, revision), **embedded.meta}
            _write_package(tmp, meta, _Tensors(ckpt, placements, embedded.tensors), progress, threads)
    finally:
        ckpt.close()
    return ConversionReport(
        path=out,
        package_type=package,
        tensor_count=len(placements) + len(embedded.tensors),
        file_bytes=out.stat().st_size,
        seconds=time.perf_counter() - start,
        type_counts=_type_counts(placements, embedded.tensors),
        fallbacks=[(p.entry.gguf, p.wanted, p.type) for p in placements if p.fell_back],
        layout=layout,
        ctc=hp.ctc is not None,
        ctc_unavailable=None if hp.ctc is not None else (getattr(ckpt, "ctc_unavailable", None) or HF_NO_CTC),
        vad=embedded.source(VAD),
        speaker=embedded.source(SPEAKER),
    )


def _submodels_to_embed(embed: dict[str, str | os.PathLike[str] | None]) -> _Given:
    """Each sub-model family (in ``SUBMODELS`` order) and what :func:`convert` was given for it under its
    ``option`` keyword (None: nothing); a keyword that is no family's option is a TypeError, as for any function."""
    options = {kind.option for kind in SUBMODELS}
    for name in embed:
        if name not in options:
            raise TypeError(f"convert() got an unexpected keyword argument {name!r}")
    return {kind: embed.get(kind.option) for kind in SUBMODELS}


def _check_not_embedding_output(given: _Given, out: Path) -> None:
    """OutputError when a sub-model to embed is the output file itself."""
    for kind, extra in given.items():
        if extra is not None:
            extra_path = Path(extra).expanduser()
            if extra_path.is_file() and out.exists() and os.path.samefile(extra_path, out):
                raise OutputError(f"{out}: is the same file as the {kind.what} being embedded; write the GGUF "
                                  "elsewhere")


def _check_nothing_to_embed(src: str | os.PathLike[str], own: SubModel, given: _Given) -> None:
    """ValueError when a sub-model is to be embedded but ``src`` is itself a sub-model's folder (``own``)."""
    for other, extra in given.items():
        if extra is not None:
            raise ValueError(f"{src}: is a {own.folder}, not a recognizer checkpoint; {other.flag} "
                             f"({other.option}=) embeds a {other.what} in a recognizer package, so give the "
                             "Fun-ASR-Nano checkpoint as the source")


@dataclass(frozen=True)
class _Embedded:
    """The sub-models a package embeds: each one's metadata and tensors, by family (in ``SUBMODELS`` order)."""

    models: dict[SubModel, tuple[dict[str, Any], Tensors]]

    @property
    def meta(self) -> dict[str, Any]:
        return {k: v for meta, _ in self.models.values() for k, v in meta.items()}

    @property
    def tensors(self) -> Tensors:
        return [t for _, tensors in self.models.values() for t in tensors]

    def source(self, kind: SubModel) -> str | None:
        """Where the embedded ``kind`` came from (its ``<arch>.source`` metadata); None when none is embedded."""
        return self.models[kind][0].get(f"{kind.arch}.source") if kind in self.models else None


@dataclass(frozen=True)
class _Tensors:
    """A package's tensors in file order: the recognizer's (packed from ``ckpt`` one at a time as ``placements``
    say), then the embedded sub-models' (as they are)."""

    ckpt: Checkpoint
    placements: list[Placement]
    extra: Tensors


def _write_package(tmp: Path, meta: dict[str, Any], tensors: _Tensors, progress: bool, threads: int) -> None:
    """The GGUF at ``tmp``: ``meta``, the tensor infos, then the tensors streamed one at a time."""
    w = gguf.GGUFWriter(tmp, ARCH)
    write_metadata(w, meta)
    for p in tensors.placements:
        row_bytes = _core.quantized_row_bytes(p.type, p.entry.shape[-1])
        byte_shape = (*p.entry.shape[:-1], row_bytes)
        w.add_tensor_info(p.entry.gguf, byte_shape, np.dtype(np.uint8),
                          int(np.prod(byte_shape)), raw_dtype=_ggml_type(p.type))
    for name, arr in tensors.extra:
        w.add_tensor_info(name, arr.shape, arr.dtype, arr.nbytes)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_ti_data_to_file()
    bar = _progress(tensors.placements, progress)
    for p in tensors.placements:
        data = _pack(tensors.ckpt, p, threads)
        w.write_tensor_data(data)
        bar.update(p.entry.shape and int(np.prod(p.entry.shape)))
        del data
    for _, arr in tensors.extra:
        w.write_tensor_data(arr)
    bar.close()
    w.close()


def _type_counts(placements: list[Placement], extra: Tensors) -> dict[str, int]:
    """How many tensors of each type the package holds (embedded ones: f16 or f32)."""
    counts: dict[str, int] = {}
    for p in placements:
        counts[p.type] = counts.get(p.type, 0) + 1
    for _, arr in extra:
        key = "f16" if arr.dtype == np.float16 else "f32"
        counts[key] = counts.get(key, 0) + 1
    return counts


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
