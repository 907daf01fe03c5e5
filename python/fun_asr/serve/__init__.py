"""The HTTP/WebSocket server: the FastAPI app (:mod:`~fun_asr.serve.app`: OpenAI's transcription API, auth, limits,
access log) and FunASR's realtime WebSocket protocol (:mod:`~fun_asr.serve.ws_realtime`)."""
