"""FunASR FSMN-VAD folder (``model.pt``, ``config.yaml``, ``am.mvn``) -> one small GGUF (arch ``fsmn_vad``).

``model.pt`` is read by the restricted unpickler (:mod:`fun_asr.model.torch_pickle`: no pickle code runs,
strides honoured). Every tensor stays F32; the CMVN vectors of ``am.mvn`` become the tensors
``vad.cmvn.shift``/``vad.cmvn.scale``; ``config.yaml`` (decision thresholds, frontend) is kept whole
as JSON under ``fsmn_vad.config_json``; the network's dimensions go under ``fsmn_vad.*``.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

from fun_asr.vad.files import ARCH, hparams, metadata, read_vad_folder


def convert_vad(src: str | os.PathLike[str], dst: str | os.PathLike[str], *, overwrite: bool = False,
                repo_id: str | None = None, revision: str | None = None):  # noqa: ANN201 - ConversionReport
    """FunASR FSMN-VAD folder -> GGUF (F32). Same output rules as :func:`fun_asr.convert` (never an
    input, a device or an existing file without ``overwrite``)."""
    from fun_asr.converter.output import ConversionReport, check_output, write_gguf_file

    start = time.perf_counter()
    out = Path(dst)
    check_output(out, Path(src), overwrite)
    conf, meta, tensors = read_vad_folder(src)
    if repo_id or revision:
        meta = metadata(conf, hparams(conf), repo_id, revision)
    write_gguf_file(out, Path(src), ARCH, meta, tensors, overwrite)
    return ConversionReport(path=out, package_type="fsmn_vad, f32", tensor_count=len(tensors),
                            file_bytes=out.stat().st_size, seconds=time.perf_counter() - start,
                            type_counts={"f32": len(tensors)})
