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

from fun_asr.converter.output import ConversionReport
from fun_asr.converter.submodel import SPEAKER


def speaker_tensor_type(package: str) -> str:
    """The tensor type a CAM++ GGUF gets for a package type: f16 stays f16, everything else is F32 (CAM++ has
    no quantized form: Q8_0/Q4_K do not apply to its convolutions)."""
    return SPEAKER.tensor_type(package)


def convert_speaker(src: str | os.PathLike[str], dst: str | os.PathLike[str], type: str = "f32", *,
                    overwrite: bool = False, repo_id: str | None = None,
                    revision: str | None = None) -> ConversionReport:
    """FunASR CAM++ folder -> GGUF (``type`` f32 or f16 for the conv/matrix tensors):
    :meth:`fun_asr.converter.submodel.SubModel.convert` of ``SPEAKER``."""
    return SPEAKER.convert(src, dst, type, overwrite=overwrite, repo_id=repo_id, revision=revision)
