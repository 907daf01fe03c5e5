"""fun-asr: Fun-ASR-Nano speech recognition on ggml, without PyTorch."""

from __future__ import annotations

from fun_asr import _core
from fun_asr._core import dequantize, quantize, system_info

__version__ = "0.1.0"

__all__ = ["__version__", "_core", "dequantize", "quantize", "system_info"]
