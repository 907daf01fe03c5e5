"""fun-asr: Fun-ASR-Nano speech recognition on ggml, without PyTorch."""

from __future__ import annotations

import os as _os

# ggml's CPU backend synchronises its threads with an OpenMP barrier after every graph node (~700 per
# decoded token); libgomp spins GOMP_SPINCOUNT times at each before sleeping (300,000 by default).
# When another process holds a core (a busy laptop, CI beside a build) the spinning thread steals the
# time slice the late thread needs. Measured on 2 cores beside one busy process (Q4_K_M, 10 s clip,
# 2 threads): the default spin 7.8 s encode instead of 1.6 s; 10,000 spins 4.0x the quiet time;
# 500 spins (~14 us here) 1.8x with the quiet speed kept; 300 or fewer (<= 8 us) lose quiet speed.
# The count is set from a wait in microseconds (FUN_ASR_SPIN_US, default 15) and this CPU's time per
# spin iteration (a `pause` takes ~3 ns on older Intel cores, ~30 ns on AMD Zen, ~45 ns on newer
# Intel), measured by fun_asr._spin (no libgomp) before the extension (and libgomp) loads. An explicit
# OMP_WAIT_POLICY or GOMP_SPINCOUNT from the user wins.
if "OMP_WAIT_POLICY" not in _os.environ and "GOMP_SPINCOUNT" not in _os.environ:
    from fun_asr import _spin

    try:
        _spin_us = float(_os.environ.get("FUN_ASR_SPIN_US", "15"))
    except ValueError:
        import warnings as _warnings

        _warnings.warn(f"FUN_ASR_SPIN_US={_os.environ['FUN_ASR_SPIN_US']!r} is not a number of microseconds; "
                       "using 15", stacklevel=2)
        _spin_us = 15.0
    _os.environ["GOMP_SPINCOUNT"] = str(max(50, min(1_000_000, round(_spin_us * 1000.0 / max(_spin.spin_ns(), 0.5)))))

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
