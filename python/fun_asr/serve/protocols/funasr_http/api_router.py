"""FunASR's offline HTTP service: ``POST /asr`` as FunASR's ``serve_vllm.py`` and ``funasr-server`` answer it
(multipart ``file``, ``language``, ``hotwords``, ``spk``, ``timestamp`` -> ``{text, segments: [{text, start, end,
words?}], duration, processing_time, rtf}``; errors as FastAPI's ``{"detail": ...}``), decoded through the
server's shared batcher."""

from __future__ import annotations

import time
from collections.abc import Callable, Coroutine
from typing import Annotated, Any

from fastapi import Depends, FastAPI, File, Request, UploadFile
from fastapi.responses import Response
from fastapi.routing import APIRoute

from fun_asr.asr.prompt import split_hotwords
from fun_asr.serve.core.context import ServerContext, read_upload, transcribe_upload
from fun_asr.serve.core.errors import ApiError, client_words, form_bool, speaker_options, upload_too_large
from fun_asr.serve.core.requests import DecodeRequest
from fun_asr.serve.protocols.funasr_http.models import AsrRequest, AsrResponse
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
                  form: Annotated[AsrRequest, Depends(AsrRequest.as_form)]) -> dict[str, Any]:
        """FunASR's offline recognition of one uploaded file: text, segments with times (and word times with
        timestamp=true on a model with a CTC head), duration, processing_time, rtf (:class:`AsrRequest`,
        :class:`AsrResponse`)."""
        diarize = speaker_options(session, form.spk)
        data = await read_upload(file, ctx)
        # timestamp=true is FunASR's default: word times where the model has a CTC head. Sent explicitly to a
        # model without one, the result says so (word_timestamps_unavailable) instead of leaving them out.
        sent = "timestamp" in (await request.form())
        decode = decode_request(form, ctx, form.timestamp and (session.aligner is not None or sent), diarize)
        t0 = time.perf_counter()
        result = await transcribe_upload(ctx, data, file.filename or "upload", decode)
        seconds = time.perf_counter() - t0
        return asr_response(result, decode.word_timestamps and session.aligner is not None, seconds)

    app.router.add_api_route(ASR_PATH, asr, methods=["POST"], route_class_override=LimitedRoute,
                             response_model=AsrResponse, response_model_exclude_unset=True,
                             summary="FunASR's offline recognition (serve_vllm.py POST /asr)")


def decode_request(form: AsrRequest, ctx: ServerContext, want_words: bool,
                   diarize: tuple[tuple[str, bool], ...]) -> DecodeRequest:
    """The request's transcription options, checked against the Session (a 400 naming the field): the hotword
    limits, the language's characters and the decoder's context; FunASR's VAD kwargs."""
    session = ctx.session
    words = split_hotwords(form.hotwords)  # FunASR splits at commas and strips each
    try:  # the hotword limits, the language's characters, the decoder's context: a 400 before decoding
        session.options(language=form.language, hotwords=words, max_new_tokens=ctx.max_new_tokens,
                        segment_seconds=ctx.segment_seconds)
    except (ValueError, TypeError) as exc:
        raise ApiError(400, client_words(exc), "hotwords", "invalid_value") from None
    dynamic = None if form.dynamic_silence is None else form_bool(form.dynamic_silence, "dynamic_silence", True)
    end_silence = None
    if form.max_end_silence_time is not None:
        try:
            end_silence = int(form.max_end_silence_time)
        except ValueError:
            raise ApiError(400, f"max_end_silence_time must be a whole number of milliseconds, got "
                                f"{form.max_end_silence_time!r:.40}", "max_end_silence_time", "invalid_value") from None
    try:
        vad_kwargs = vad_options(session, form.silence_schedule, dynamic, end_silence)
    except (ValueError, TypeError) as exc:
        raise ApiError(400, client_words(exc), "silence_schedule", "invalid_value") from None
    # without VAD kwargs or spk, the same request as a /v1 request's (batched together)
    return DecodeRequest(form.language, True, tuple(words), word_timestamps=want_words,
                         vad_kwargs=vad_kwargs + diarize)
