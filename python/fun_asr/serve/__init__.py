"""The HTTP/WebSocket server: the app put together (:mod:`~fun_asr.serve.app`: auth, request ids, access log,
errors), OpenAI's transcription API (:mod:`~fun_asr.serve.openai`), FunASR's offline service ``POST /asr``
(:mod:`~fun_asr.serve.funasr_http`), the shared batched decoder (:mod:`~fun_asr.serve.batcher`), and FunASR's
WebSocket protocols: the runtime's 2pass (:mod:`~fun_asr.serve.ws_2pass`, which also tells them apart) and the
realtime one (:mod:`~fun_asr.serve.ws_realtime`)."""
