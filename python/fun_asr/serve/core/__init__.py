"""What the server's protocols share: the server's state (:mod:`~fun_asr.serve.core.context`), the decode
request (:mod:`~fun_asr.serve.core.requests`) and the batcher that decodes it (:mod:`~fun_asr.serve.core.batcher`),
errors (:mod:`~fun_asr.serve.core.errors`), the WebSocket streams' limits and hotword files
(:mod:`~fun_asr.serve.core.limits`, :mod:`~fun_asr.serve.core.hotword_files`), the stream decoder
(:mod:`~fun_asr.serve.core.decoder`) and the WebSocket connection layer (:mod:`~fun_asr.serve.core.websocket`).
Nothing here imports a protocol or the app."""
