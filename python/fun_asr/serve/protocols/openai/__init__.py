"""OpenAI's transcription API: the routes (:mod:`~fun_asr.serve.protocols.openai.api_router`) and the response
formats and streamed events (:mod:`~fun_asr.serve.protocols.openai.protocol`)."""

from __future__ import annotations

from fun_asr.serve.protocols.openai.api_router import add_openai_routes
from fun_asr.serve.protocols.openai.protocol import RESPONSE_FORMATS, sse_response, stream_events, verbose_json

__all__ = ["RESPONSE_FORMATS", "add_openai_routes", "sse_response", "stream_events", "verbose_json"]
