"""FunASR's realtime WebSocket protocol (``START``, ``STOP``, ``HOTWORDS:``, ``LANGUAGE:``, ``COMMIT``, ``SPK:``
and binary PCM): its messages (:mod:`~fun_asr.serve.protocols.funasr_realtime.protocol`) and its connection
(:mod:`~fun_asr.serve.protocols.funasr_realtime.serving`); the server-wide stream settings it is named after
(``RealtimeLimits`` and FunASR's hotword files) are shared by every WebSocket protocol (:mod:`fun_asr.serve.core`)
and importable from here too."""

from __future__ import annotations

from fun_asr.serve.core.hotword_files import (
    apply_postprocess_hotwords,
    parse_postprocess_hotwords,
    read_hotword_file,
    read_postprocess_hotword_file,
)
from fun_asr.serve.core.limits import RealtimeLimits, realtime_limits, uvicorn_ws_options
from fun_asr.serve.protocols.funasr_realtime.serving import PROTOCOL, handle, serve_websocket

__all__ = ["PROTOCOL", "RealtimeLimits", "apply_postprocess_hotwords", "handle", "parse_postprocess_hotwords",
           "read_hotword_file", "read_postprocess_hotword_file", "realtime_limits", "serve_websocket",
           "uvicorn_ws_options"]
