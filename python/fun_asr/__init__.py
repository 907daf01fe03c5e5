"""fun-asr: Fun-ASR-Nano speech recognition on ggml, without PyTorch."""

from __future__ import annotations

import os as _os

# ggml's CPU backend synchronises its threads with an OpenMP barrier after every graph node; libgomp
# spins 300,000 times at each before sleeping. When another process holds a core (a busy laptop, CI
# beside a build) the spinning thread steals the time slice the late thread needs: measured here,
# 2-thread encode 7.8 s instead of 1.6 s and decode steps 776 ms instead of 135 ms. A short spin keeps
# the quiet-machine speed and caps that loss. Set before the extension (and libgomp) loads; an explicit
# OMP_WAIT_POLICY or GOMP_SPINCOUNT from the user wins.
if "OMP_WAIT_POLICY" not in _os.environ and "GOMP_SPINCOUNT" not in _os.environ:
    _os.environ["GOMP_SPINCOUNT"] = "10000"

from fun_asr import _compat, _core  # noqa: E402
from fun_asr._core import dequantize, quantize, system_info  # noqa: E402
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

_compat.install()  # the flat layout's module paths (fun_asr.session, ...) still import

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
