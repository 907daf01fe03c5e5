"""OpenAI's transcription API: ``POST /v1/audio/transcriptions`` (multipart, as OpenAI's: file, model, language,
prompt (used as comma-separated hotwords), response_format (json, text, srt, vtt, verbose_json), temperature (only
0), stream (OpenAI's server-sent ``transcript.text.delta`` / ``transcript.text.done`` events), include[]=logprobs
(each token's ``{token, logprob, bytes}``, as OpenAI's newer models return them), plus the extensions itn, hotwords
and FunASR's spk) and ``GET /v1/models``, decoded through the server's shared batcher."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, PlainTextResponse, Response
from starlette.datastructures import FormData, UploadFile
from starlette.exceptions import HTTPException as StarletteHTTPException

from fun_asr.asr.formats import render
from fun_asr.asr.prompt import split_hotwords
from fun_asr.asr.session import Session, Transcription
from fun_asr.serve.core.context import ServerContext, read_upload, transcribe_upload
from fun_asr.serve.core.errors import ApiError, _bool, _words, speaker_options, upload_too_large
from fun_asr.serve.core.requests import DecodeRequest
from fun_asr.serve.protocols.openai.protocol import (
    MODEL_ALIASES,
    RESPONSE_FORMATS,
    STREAM_FORMATS,
    WARNING_CODES_HEADER,
    json_response,
    model_entry,
    segment_logprobs,
    sse_response,
    stream_events,
    transcript_logprobs,
    verbose_json,
)


@dataclass(frozen=True)
class TranscriptionFields:
    """A ``/v1/audio/transcriptions`` request's fields, checked (:func:`transcription_fields`)."""

    fmt: str  # response_format
    stream: bool
    words: bool  # timestamp_granularities[]=word
    logprobs: bool  # include[]=logprobs
    request: DecodeRequest


async def read_form(request: Request, ctx: ServerContext) -> FormData:
    """The multipart form: 413 past ``--max-upload-mb`` by the declared Content-Length (before reading it; a file
    over it without one: :func:`~fun_asr.serve.core.context.read_upload`), 400 for a form that cannot be parsed
    (malformed, over a thousand parts, a text field over Starlette's 1 MB: none of them the upload limit)."""
    length = request.headers.get("content-length")
    if length and length.isdigit() and int(length) > ctx.max_bytes + 64 * 1024:  # + the multipart envelope
        raise upload_too_large(ctx.max_upload_mb, int(length))
    try:
        return await request.form()
    except Exception as exc:  # Starlette's HTTPException(400) for a multipart error, or the parser's own
        detail = exc.detail if isinstance(exc, StarletteHTTPException) else exc
        raise ApiError(400, f"could not parse the multipart form: {detail}", None, "invalid_request") from None


def _field(form: FormData, name: str) -> str | None:
    v = form.get(name)
    return v if isinstance(v, str) and v != "" else None


def _listed(form: FormData, name: str, accepted: tuple[str, ...]) -> list[str]:
    """A list field (``name[]`` or ``name``), every value one of ``accepted`` (else 400)."""
    values = [g for key in (f"{name}[]", name) for g in form.getlist(key) if isinstance(g, str)]
    bad = [g for g in values if g not in accepted]
    if bad:
        raise ApiError(400, f"unsupported {name} {bad[0]!r}: accepted {', '.join(accepted)}", name, "invalid_value")
    return values


def _format_fields(form: FormData, model_id: str) -> tuple[str, bool]:
    """``model``, ``response_format``, ``stream`` and ``temperature`` checked: (format, stream)."""
    model = _field(form, "model")
    if model is not None and model not in (model_id, *MODEL_ALIASES):
        raise ApiError(400, f"unknown model {model!r}: this server serves {model_id!r} (aliases: "
                            f"{', '.join(MODEL_ALIASES)})", "model", "model_not_found")
    fmt = _field(form, "response_format") or "json"
    if fmt not in RESPONSE_FORMATS:
        raise ApiError(400, f"unsupported response_format {fmt!r}: accepted {', '.join(RESPONSE_FORMATS)}",
                       "response_format", "invalid_value")
    stream = _bool(_field(form, "stream"), "stream", False)
    if stream and fmt not in STREAM_FORMATS:
        raise ApiError(400, f"stream=true sends OpenAI's transcript.text events, which replace response_format "
                            f"{' or '.join(STREAM_FORMATS)}; got response_format {fmt!r} (send stream=false for "
                            "it)", "stream", "invalid_value")
    temperature = _field(form, "temperature")
    if temperature is not None:
        try:
            temp = float(temperature)
        except ValueError:
            raise ApiError(400, f"temperature must be a number, got {temperature!r}", "temperature",
                           "invalid_value") from None
        if temp != 0.0:
            raise ApiError(400, "only temperature 0 is supported (greedy decoding, as FunASR)", "temperature",
                           "invalid_value")
    return fmt, stream


def transcription_fields(form: FormData, ctx: ServerContext) -> TranscriptionFields:
    """The request's fields, each checked (400 naming the field) before anything is decoded."""
    session = ctx.session
    fmt, stream = _format_fields(form, ctx.model_id)
    diarize = speaker_options(session, _bool(_field(form, "spk"), "spk", False))
    hotwords = split_hotwords(_field(form, "hotwords") or "") + split_hotwords(_field(form, "prompt") or "")
    try:
        # the count/length limits, control characters and the decoder's context: a 400 at once
        session.options(hotwords=hotwords, max_new_tokens=ctx.max_new_tokens, segment_seconds=ctx.segment_seconds)
    except (ValueError, TypeError) as exc:
        raise ApiError(400, _words(exc), "hotwords", "invalid_value") from None
    itn = _bool(_field(form, "itn"), "itn", True)
    words = "word" in _listed(form, "timestamp_granularities", ("word", "segment"))
    logprobs = bool(_listed(form, "include", ("logprobs",)))
    if logprobs and not stream and fmt not in ("json", "verbose_json"):
        raise ApiError(400, f"include[]=logprobs comes with response_format json or verbose_json (or stream=true); "
                            f"got response_format {fmt!r}", "include", "invalid_value")
    language = _field(form, "language")
    try:
        session.normalize_language(language)  # a name the model lacks is used as written (as FunASR)
    except (ValueError, TypeError) as exc:
        raise ApiError(400, str(exc), "language", "invalid_value") from None
    request = DecodeRequest(language, itn, tuple(hotwords), word_timestamps=words, vad_kwargs=diarize)
    return TranscriptionFields(fmt, stream, words, logprobs, request)


def transcription_response(result: Transcription, fields: TranscriptionFields, session: Session) -> Response:
    """The answer in the asked format. Every one carries the result's notice codes: in the JSON (``warnings``,
    ``warning_codes``: json, verbose_json, the stream's ``transcript.text.done``) and, for every format (text, srt
    and vtt are plain text), in the :data:`WARNING_CODES_HEADER` header."""
    headers = {WARNING_CODES_HEADER: ",".join(result.warning_codes)}

    def logprobs_of(segment: Any) -> list[dict[str, Any]]:
        return segment_logprobs(segment, session.tokenizer.token_bytes, session.stop_ids)

    if fields.stream:
        return sse_response(stream_events(result, session.spec, logprobs_of if fields.logprobs else None), headers)
    logprobs = transcript_logprobs(result, session.tokenizer.token_bytes, session.stop_ids) \
        if fields.logprobs else None
    if fields.fmt == "json":
        return JSONResponse(json_response(result, logprobs), headers=headers)
    if fields.fmt == "verbose_json":
        return JSONResponse(verbose_json(result, fields.words, session.spec, logprobs), headers=headers)
    media = {"text": "text/plain", "srt": "application/x-subrip", "vtt": "text/vtt"}[fields.fmt]
    body = render(result, "txt" if fields.fmt == "text" else fields.fmt)
    return PlainTextResponse(body, media_type=f"{media}; charset=utf-8", headers=headers)


def add_openai_routes(app: FastAPI, ctx: ServerContext) -> None:
    """GET /v1/models and POST /v1/audio/transcriptions on ``app``."""

    @app.get("/v1/models")
    async def models() -> dict[str, Any]:
        return {"object": "list",
                "data": [model_entry(ctx.model_id, ctx.created, getattr(ctx.session, "demo", False))]}

    @app.post("/v1/audio/transcriptions")
    async def transcriptions(request: Request) -> Response:
        form = await read_form(request, ctx)
        upload = form.get("file")
        if not isinstance(upload, UploadFile):
            raise ApiError(400, "missing 'file': send the audio as a multipart file field named 'file'", "file",
                           "missing_file")
        data = await read_upload(upload, ctx)
        fields = transcription_fields(form, ctx)
        result = await transcribe_upload(ctx, data, upload.filename or "upload", fields.request)
        return transcription_response(result, fields, ctx.session)
