"""fun-asr: Fun-ASR-Nano speech recognition on ggml, without PyTorch."""

from __future__ import annotations

import os as _os

# libgomp's spin count, set before _core (and libgomp, which reads it once) loads: see _spinwait.py.
if "OMP_WAIT_POLICY" not in _os.environ and "GOMP_SPINCOUNT" not in _os.environ:
    from fun_asr._spinwait import set_spin_count

    set_spin_count()
    del set_spin_count

from fun_asr import _core  # noqa: E402
from fun_asr._core import Interrupted, dequantize, quantize, system_info  # noqa: E402
from fun_asr.asr.session import Segment, Session, Transcription
from fun_asr.converter import ConversionReport, convert, inspect_gguf
from fun_asr.model.native import load_model
from fun_asr.notices import (
    FunAsrWarning,
    InputWarning,
    RecordingFailedWarning,
    RepetitionWarning,
    TruncatedOutputWarning,
)

__version__ = "0.1.0"

__all__ = [
    "ConversionReport",
    "FunAsrWarning",
    "InputWarning",
    "Interrupted",
    "RecordingFailedWarning",
    "RepetitionWarning",
    "TruncatedOutputWarning",
    "Segment",
    "Session",
    "Transcription",
    "__version__",
    "_core",
    "convert",
    "dequantize",
    "inspect_gguf",
    "load_model",
    "quantize",
    "system_info",
]
