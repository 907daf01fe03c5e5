"""Speech recognition on a loaded model: :class:`~fun_asr.asr.session.Session` (the orchestrator), its options,
results, prompt and tokenizer, CTC word timestamps, streaming, and the output formats."""

from __future__ import annotations

from fun_asr.asr.option_table import OPTIONS
from fun_asr.asr.results import Segment, Transcription
from fun_asr.asr.session import Session
from fun_asr.errors import use_options

use_options(OPTIONS)  # errors name the options as each front end spells them (fun_asr.errors)

__all__ = ["Segment", "Session", "Transcription"]
