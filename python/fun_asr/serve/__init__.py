"""The HTTP/WebSocket server: the app put together (:mod:`~fun_asr.serve.app`: auth, request ids, access log,
errors), OpenAI's transcription API (:mod:`~fun_asr.serve.openai`), the shared batched decoder
(:mod:`~fun_asr.serve.batcher`) and FunASR's realtime WebSocket protocol (:mod:`~fun_asr.serve.ws_realtime`)."""
