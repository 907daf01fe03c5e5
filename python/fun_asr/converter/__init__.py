"""Fun-ASR-Nano checkpoint (HF safetensors or FunASR/ModelScope model.pt) -> one self-contained GGUF
(F32, F16, Q8_0, Q4_K_M); FunASR FSMN-VAD folder -> an fsmn_vad GGUF; FunASR CAM++ folder -> a campplus GGUF."""

from __future__ import annotations

from fun_asr.converter.inspect import format_inspection, inspect_gguf
from fun_asr.converter.plan import PACKAGE_TYPES
from fun_asr.converter.writer import ConversionReport, OutputError, convert
from fun_asr.model.funasr_checkpoint import detect_layout, layout_description

__all__ = ["PACKAGE_TYPES", "ConversionReport", "OutputError", "convert", "detect_layout", "format_inspection",
           "inspect_gguf", "layout_description"]
