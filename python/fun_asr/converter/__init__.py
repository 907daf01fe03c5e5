"""HF safetensors checkpoint -> one self-contained GGUF (F32, F16, Q8_0, Q4_K_M)."""

from __future__ import annotations

from fun_asr.converter.inspect import format_inspection, inspect_gguf
from fun_asr.converter.plan import PACKAGE_TYPES
from fun_asr.converter.writer import ConversionReport, convert

__all__ = ["PACKAGE_TYPES", "ConversionReport", "convert", "format_inspection", "inspect_gguf"]
