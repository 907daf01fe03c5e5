"""FunASR CAM++ folder (``config.yaml`` + ``campplus_cn_common.bin``) -> one small GGUF (arch ``campplus``).

The weights file is read by the restricted unpickler (:mod:`fun_asr.model.torch_pickle`: no pickle code runs);
:func:`fun_asr.speakers.files.read_campplus_folder` folds every batch norm (float64) and lays the tensors out
as the native graph takes them (model_specs/campplus.json, the one table). Conv and matrix tensors are F32 or
F16 (``type``); kernels and biases stay F32. ``config.yaml`` is kept whole as JSON under
``campplus.config_json``, the architecture's numbers under ``campplus.*``, the model spec (frontend options,
tensor table) under ``campplus.model_spec``, the license (Apache-2.0, the model card's) under
``general.license``.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

from fun_asr.speakers.files import ARCH, TENSOR_TYPES, cast, hparams, metadata, read_campplus_folder


def speaker_tensor_type(package: str) -> str:
    """The tensor type a CAM++ GGUF gets for a package type: f16 stays f16, everything else is F32 (CAM++ has
    no quantized form: Q8_0/Q4_K do not apply to its convolutions)."""
    return package.lower() if package.lower() in TENSOR_TYPES else "f32"


def convert_speaker(src: str | os.PathLike[str], dst: str | os.PathLike[str], type: str = "f32", *,
                    overwrite: bool = False, repo_id: str | None = None,
                    revision: str | None = None):  # noqa: ANN201 - ConversionReport
    """FunASR CAM++ folder -> GGUF (``type`` f32 or f16 for the conv/matrix tensors). Same output rules as
    :func:`fun_asr.convert` (never an input, a device or an existing file without ``overwrite``)."""
    from fun_asr.converter.output import ConversionReport, check_output, write_gguf_file

    if type not in TENSOR_TYPES:
        raise ValueError(f"unknown speaker model type {type!r}: accepted {', '.join(TENSOR_TYPES)}")
    start = time.perf_counter()
    out = Path(dst)
    check_output(out, Path(src), overwrite)
    conf, meta, tensors = read_campplus_folder(src)
    hp = hparams(conf)
    if repo_id or revision:
        meta = metadata(conf, hp, repo_id, revision)
    meta["general.file_type"] = 1 if type == "f16" else 0
    meta[f"{ARCH}.source"] = repo_id or str(Path(src).resolve())
    tensors = cast(tensors, hp, type)
    write_gguf_file(out, Path(src), ARCH, meta, tensors, overwrite)
    counts: dict[str, int] = {}
    for _, arr in tensors:
        key = "f16" if arr.dtype.itemsize == 2 else "f32"
        counts[key] = counts.get(key, 0) + 1
    return ConversionReport(path=out, package_type=f"{ARCH}, {type}", tensor_count=len(tensors),
                            file_bytes=out.stat().st_size, seconds=time.perf_counter() - start, type_counts=counts,
                            layout=ARCH)
