"""FunASR's offline HTTP service, ``POST /asr``: the route (:mod:`~fun_asr.serve.protocols.funasr_http.api_router`)
and its answer and fields (:mod:`~fun_asr.serve.protocols.funasr_http.protocol`)."""

from __future__ import annotations

from fun_asr.serve.protocols.funasr_http.api_router import add_funasr_routes
from fun_asr.serve.protocols.funasr_http.protocol import ASR_PATH, asr_response, vad_options

__all__ = ["ASR_PATH", "add_funasr_routes", "asr_response", "vad_options"]
