"""FunASR's offline HTTP service: ``POST /asr`` as FunASR's ``serve_vllm.py`` and ``funasr-server`` answer it
(multipart ``file``, ``language``, ``hotwords``, ``spk``, ``timestamp`` -> ``{text, segments: [{text, start, end,
words?}], duration, processing_time, rtf}``; errors as FastAPI's ``{"detail": ...}``), decoded through the
server's shared batcher."""

from __future__ import annotations

import time
from collections.abc import Callable, Coroutine
from typing import Annotated, Any

from fastapi import FastAPI, File, Form, Request, UploadFile
from fastapi.responses import JSONResponse, Response
from fastapi.routing import APIRoute

from fun_asr.asr.prompt import split_hotwords
from fun_asr.serve.core.context import ServerContext, read_upload, transcribe_upload
from fun_asr.serve.core.errors import ApiError, _bool, _words, speaker_options, upload_too_large
from fun_asr.serve.core.requests import DecodeRequest
from fun_asr.serve.protocols.funasr_http.protocol import ASR_PATH, asr_response, vad_options


def add_funasr_routes(app: FastAPI, ctx: ServerContext) -> None:
    """``POST /asr`` on ``app``. Its fields are declared as FunASR declares them, so FastAPI checks them exactly
    as FunASR's server does (a missing ``file`` or a ``spk``/``timestamp`` that is not a boolean: 422 with
    FastAPI's ``detail`` list)."""
    session = ctx.session
    limit = ctx.max_bytes + 64 * 1024  # the multipart envelope around the file

    class LimitedRoute(APIRoute):
        """Refuses a body over the upload limit by its Content-Length, before the form is read."""

        def get_route_handler(self) -> Callable[[Request], Coroutine[Any, Any, Response]]:
            handler = super().get_route_handler()

            async def checked(request: Request) -> Response:
                length = request.headers.get("content-length")
                if length and length.isdigit() and int(length) > limit:
                    raise upload_too_large(ctx.max_upload_mb, int(length))
                return await handler(request)

            return checked

    async def asr(request: Request, file: Annotated[UploadFile, File()],
                  language: Annotated[str | None, Form()] = None, hotwords: Annotated[str, Form()] = "",
                  spk: Annotated[bool, Form()] = False, timestamp: Annotated[bool, Form()] = True,
                  silence_schedule: Annotated[str | None, Form()] = None,
                  dynamic_silence: Annotated[str | None, Form()] = None,
                  max_end_silence_time: Annotated[str | None, Form()] = None) -> JSONResponse:
        """FunASR's offline recognition of one uploaded file: text, segments with times (and word times with
        timestamp=true on a model with a CTC head), duration, processing_time, rtf. Extensions: FunASR's
        ``generate()`` VAD kwargs ``silence_schedule`` (``"10000:2000,...,inf:100"`` or a JSON list of pairs),
        ``dynamic_silence``, ``max_end_silence_time``."""
        diarize = speaker_options(session, spk)
        data = await read_upload(file, ctx)
        words = split_hotwords(hotwords)  # FunASR splits at commas and strips each
        try:  # the hotword limits, the language's characters, the decoder's context: a 400 before decoding
            session.options(language=language, hotwords=words, max_new_tokens=ctx.max_new_tokens,
                            segment_seconds=ctx.segment_seconds)
        except (ValueError, TypeError) as exc:
            raise ApiError(400, _words(exc), "hotwords", "invalid_value") from None
        # timestamp=true is FunASR's default: word times where the model has a CTC head. Sent explicitly to a
        # model without one, the result says so (word_timestamps_unavailable) instead of leaving them out.
        sent = "timestamp" in (await request.form())
        want_words = timestamp and (session.aligner is not None or sent)
        dynamic = None if dynamic_silence is None else _bool(dynamic_silence, "dynamic_silence", True)
        end_silence = None
        if max_end_silence_time is not None:
            try:
                end_silence = int(max_end_silence_time)
            except ValueError:
                raise ApiError(400, f"max_end_silence_time must be a whole number of milliseconds, got "
                                    f"{max_end_silence_time!r:.40}", "max_end_silence_time", "invalid_value") from None
        try:
            vad_kwargs = vad_options(session, silence_schedule, dynamic, end_silence)
        except (ValueError, TypeError) as exc:
            raise ApiError(400, str(exc), "silence_schedule", "invalid_value") from None
        t0 = time.perf_counter()
        # without VAD kwargs or spk, the same request as a /v1 request's (batched together)
        request = DecodeRequest(language, True, tuple(words), word_timestamps=want_words,
                                vad_kwargs=vad_kwargs + diarize)
        result = await transcribe_upload(ctx, data, file.filename or "upload", request)
        seconds = time.perf_counter() - t0
        return JSONResponse(asr_response(result, want_words and session.aligner is not None, seconds))

    app.router.add_api_route(ASR_PATH, asr, methods=["POST"], route_class_override=LimitedRoute,
                             summary="FunASR's offline recognition (serve_vllm.py POST /asr)")
