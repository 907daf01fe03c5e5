"""fun-asr: Fun-ASR-Nano speech recognition on ggml, without PyTorch."""

from __future__ import annotations

from fun_asr import _core
from fun_asr._core import dequantize, quantize, system_info
from fun_asr.converter import ConversionReport, convert, inspect_gguf
from fun_asr.model import load_model
from fun_asr.notices import (
    FunAsrWarning,
    InputWarning,
    RecordingFailedWarning,
    RepetitionWarning,
    TruncatedOutputWarning,
)
from fun_asr.session import Segment, Session, Transcription

__version__ = "0.1.0"

__all__ = [
    "ConversionReport",
    "FunAsrWarning",
    "InputWarning",
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
