"""The HTTP/WebSocket server: the app put together (:mod:`~fun_asr.serve.app`: auth, request ids, access log,
errors, the table of WebSocket protocols), what the protocols share (:mod:`~fun_asr.serve.core`: the server's
state, the decode request and the batcher that decodes it, errors, the WebSocket connection layer, the stream
decoder) and the protocols, one package each (:mod:`~fun_asr.serve.protocols`): OpenAI's transcription API,
FunASR's offline service ``POST /asr``, FunASR's realtime WebSocket protocol, FunASR runtime's
online/offline/2pass WebSocket protocol and the web page."""
