"""FunASR runtime's WebSocket protocol (funasr-runtime's 2pass server: online, offline, 2pass): its messages
(:mod:`~fun_asr.serve.protocols.funasr_runtime.protocol`), their text and timestamps
(:mod:`~fun_asr.serve.protocols.funasr_runtime.text`) and its connection
(:mod:`~fun_asr.serve.protocols.funasr_runtime.serving`)."""

from __future__ import annotations

from fun_asr.serve.protocols.funasr_runtime.protocol import MODES, parse_hotwords
from fun_asr.serve.protocols.funasr_runtime.serving import PROTOCOL
from fun_asr.serve.protocols.funasr_runtime.text import stamps

__all__ = ["MODES", "PROTOCOL", "parse_hotwords", "stamps"]
