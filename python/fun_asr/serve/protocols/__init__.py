"""The server's protocols, one package each: OpenAI's transcription API (``openai``), FunASR's offline HTTP
service (``funasr_http``), FunASR's realtime WebSocket protocol (``funasr_realtime``), FunASR runtime's
online/offline/2pass WebSocket protocol (``funasr_runtime``) and the web page (``web``). Each builds on
:mod:`fun_asr.serve.core` only; :mod:`fun_asr.serve.app` puts them together."""
