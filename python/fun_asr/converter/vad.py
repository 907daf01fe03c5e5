"""FunASR FSMN-VAD folder (``model.pt``, ``config.yaml``, ``am.mvn``) -> one small GGUF (arch ``fsmn_vad``).

``model.pt`` is read by the restricted unpickler (:mod:`fun_asr.model.torch_pickle`: no pickle code runs,
strides honoured). Every tensor stays F32; the CMVN vectors of ``am.mvn`` become the tensors
``vad.cmvn.shift``/``vad.cmvn.scale``; ``config.yaml`` (decision thresholds, frontend) is kept whole
as JSON under ``fsmn_vad.config_json``; the network's dimensions go under ``fsmn_vad.*``.
"""

from __future__ import annotations

import os

from fun_asr.converter.output import ConversionReport
from fun_asr.converter.submodel import VAD


def convert_vad(src: str | os.PathLike[str], dst: str | os.PathLike[str], *, overwrite: bool = False,
                repo_id: str | None = None, revision: str | None = None) -> ConversionReport:
    """FunASR FSMN-VAD folder -> GGUF (F32): :meth:`fun_asr.converter.submodel.SubModel.convert` of ``VAD``."""
    return VAD.convert(src, dst, overwrite=overwrite, repo_id=repo_id, revision=revision)
