"""OpenAI's transcription API: ``POST /v1/audio/transcriptions`` (multipart, as OpenAI's: file, model, language,
prompt (used as comma-separated hotwords), response_format (json, text, srt, vtt, verbose_json), temperature (only
0), stream (OpenAI's server-sent ``transcript.text.delta`` / ``transcript.text.done`` events), include[]=logprobs
(each token's ``{token, logprob, bytes}``, as OpenAI's newer models return them), plus the extensions itn, hotwords
and FunASR's spk) and ``GET /v1/models``, decoded through the server's shared batcher."""

from __future__ import annotations

from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, PlainTextResponse, Response
from starlette.datastructures import UploadFile

from fun_asr.asr.formats import render
from fun_asr.asr.prompt import split_hotwords
from fun_asr.serve.core.context import ServerContext, read_upload, transcribe_upload
from fun_asr.serve.core.errors import ApiError, _bool, _words, speaker_options
from fun_asr.serve.core.requests import DecodeRequest
from fun_asr.serve.protocols.openai.protocol import (
    MODEL_ALIASES,
    RESPONSE_FORMATS,
    STREAM_FORMATS,
    segment_logprobs,
    sse_response,
    stream_events,
    transcript_logprobs,
    verbose_json,
)


def add_openai_routes(app: FastAPI, ctx: ServerContext) -> None:
    """GET /v1/models and POST /v1/audio/transcriptions on ``app``."""
    session, model_id, max_upload_mb = ctx.session, ctx.model_id, ctx.max_upload_mb
    max_bytes, max_new_tokens, segment_seconds = ctx.max_bytes, ctx.max_new_tokens, ctx.segment_seconds
    created = ctx.created

    @app.get("/v1/models")
    async def models() -> dict[str, Any]:
        return {"object": "list",
                "data": [{"id": model_id, "object": "model", "created": created, "owned_by": "fun-asr"}]}

    @app.post("/v1/audio/transcriptions")
    async def transcriptions(request: Request) -> Response:
        length = request.headers.get("content-length")
        if length and length.isdigit() and int(length) > max_bytes + 64 * 1024:
            raise ApiError(413, f"upload of {int(length)} bytes exceeds the limit of {max_upload_mb:g} MB",
                           "file", "file_too_large")
        try:
            form = await request.form()
        except Exception as exc:  # malformed multipart or a part over the limit
            if "maximum" in str(exc).lower() or "too large" in str(exc).lower():
                raise ApiError(413, f"upload exceeds the limit of {max_upload_mb:g} MB", "file",
                               "file_too_large") from None
            raise ApiError(400, f"could not parse the multipart form: {exc}", None, "invalid_request") from None
        upload = form.get("file")
        if not isinstance(upload, UploadFile):
            raise ApiError(400, "missing 'file': send the audio as a multipart file field named 'file'", "file",
                           "missing_file")
        data = await read_upload(upload, ctx)

        def field(name: str) -> str | None:
            v = form.get(name)
            return v if isinstance(v, str) and v != "" else None

        model = field("model")
        if model is not None and model not in (model_id, *MODEL_ALIASES):
            raise ApiError(400, f"unknown model {model!r}: this server serves {model_id!r} (aliases: "
                                f"{', '.join(MODEL_ALIASES)})", "model", "model_not_found")
        fmt = field("response_format") or "json"
        if fmt not in RESPONSE_FORMATS:
            raise ApiError(400, f"unsupported response_format {fmt!r}: accepted {', '.join(RESPONSE_FORMATS)}",
                           "response_format", "invalid_value")
        stream = _bool(field("stream"), "stream", False)
        if stream and fmt not in STREAM_FORMATS:
            raise ApiError(400, f"stream=true sends OpenAI's transcript.text events, which replace response_format "
                                f"{' or '.join(STREAM_FORMATS)}; got response_format {fmt!r} (send stream=false for "
                                "it)", "stream", "invalid_value")
        diarize = speaker_options(session, _bool(field("spk"), "spk", False))
        temperature = field("temperature")
        if temperature is not None:
            try:
                temp = float(temperature)
            except ValueError:
                raise ApiError(400, f"temperature must be a number, got {temperature!r}", "temperature",
                               "invalid_value") from None
            if temp != 0.0:
                raise ApiError(400, "only temperature 0 is supported (greedy decoding, as FunASR)", "temperature",
                               "invalid_value")
        hotwords = split_hotwords(field("hotwords") or "") + split_hotwords(field("prompt") or "")
        try:
            # the count/length limits, control characters and the decoder's context: a 400 at once
            session.options(hotwords=hotwords, max_new_tokens=max_new_tokens, segment_seconds=segment_seconds)
        except (ValueError, TypeError) as exc:
            raise ApiError(400, _words(exc), "hotwords", "invalid_value") from None
        itn = _bool(field("itn"), "itn", True)
        granularities = [g for key in ("timestamp_granularities[]", "timestamp_granularities")
                         for g in form.getlist(key) if isinstance(g, str)]
        bad = [g for g in granularities if g not in ("word", "segment")]
        if bad:
            raise ApiError(400, f"unsupported timestamp_granularities {bad[0]!r}: accepted word, segment",
                           "timestamp_granularities", "invalid_value")
        words = "word" in granularities
        include = [g for key in ("include[]", "include") for g in form.getlist(key) if isinstance(g, str)]
        bad = [g for g in include if g != "logprobs"]
        if bad:
            raise ApiError(400, f"unsupported include {bad[0]!r}: accepted logprobs", "include", "invalid_value")
        with_logprobs = bool(include)
        if with_logprobs and not stream and fmt not in ("json", "verbose_json"):
            raise ApiError(400, f"include[]=logprobs comes with response_format json or verbose_json (or stream=true); "
                                f"got response_format {fmt!r}", "include", "invalid_value")
        language = field("language")
        try:
            session.normalize_language(language)  # a name the model lacks is used as written (as FunASR)
        except (ValueError, TypeError) as exc:
            raise ApiError(400, str(exc), "language", "invalid_value") from None

        name = upload.filename or "upload"
        request = DecodeRequest(language, itn, tuple(hotwords), word_timestamps=words, vad_kwargs=diarize)
        result = await transcribe_upload(ctx, data, name, request)

        def logprobs_of(segment: Any) -> list[dict[str, Any]]:
            return segment_logprobs(segment, session.tokenizer.token_bytes, session.stop_ids)

        logprobs = transcript_logprobs(result, session.tokenizer.token_bytes, session.stop_ids) \
            if with_logprobs and not stream else None
        if stream:
            return sse_response(stream_events(result, session.spec, logprobs_of if with_logprobs else None))
        if fmt == "json":
            return JSONResponse({"text": result.text, "truncated": result.truncated,
                                 "input_truncated": result.input_truncated,
                                 **({} if logprobs is None else {"logprobs": logprobs})})
        if fmt == "verbose_json":
            return JSONResponse(verbose_json(result, words, session.spec, logprobs))
        media = {"text": "text/plain", "srt": "application/x-subrip", "vtt": "text/vtt"}[fmt]
        body = render(result, "txt" if fmt == "text" else fmt)
        return PlainTextResponse(body, media_type=f"{media}; charset=utf-8")
