"""OpenAI's transcription API: ``POST /v1/audio/transcriptions`` (multipart, as OpenAI's: file, model, language,
prompt (used as comma-separated hotwords), response_format (json, text, srt, vtt, verbose_json), temperature (only
0), stream (OpenAI's server-sent ``transcript.text.delta`` / ``transcript.text.done`` events), include[]=logprobs
(each token's ``{token, logprob, bytes}``, as OpenAI's newer models return them), plus the extensions itn, hotwords
and FunASR's spk) and ``GET /v1/models``, decoded through the server's shared batcher."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, PlainTextResponse, Response
from starlette.datastructures import FormData, UploadFile
from starlette.exceptions import HTTPException as StarletteHTTPException

from fun_asr.asr.formats import render
from fun_asr.asr.option_table import OPTIONS, OUTPUT_OPTIONS, check_lines, form_values
from fun_asr.asr.session import Session, Transcription
from fun_asr.errors import FunAsrError
from fun_asr.serve.core.context import ServerContext, read_upload, transcribe_upload
from fun_asr.serve.core.errors import ApiError, client_words, speaker_options, upload_too_large
from fun_asr.serve.core.requests import DecodeRequest
from fun_asr.serve.protocols.openai.models import (
    ModelEntry,
    ModelList,
    TranscriptionJson,
    TranscriptionRequest,
    VerboseTranscription,
)
from fun_asr.serve.protocols.openai.protocol import (
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
    lines: dict[str, Any] = field(default_factory=dict)  # max_line_width / max_line_count (srt, vtt)


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


def transcription_fields(form: FormData, ctx: ServerContext) -> TranscriptionFields:
    """The request's fields, read once (:meth:`TranscriptionRequest.from_form`) and checked against the Session
    (400 naming the field) before anything is decoded."""
    req = TranscriptionRequest.from_form(form, ctx.model_id)
    return TranscriptionFields(req.response_format, req.stream, req.words, req.logprobs, decode_request(req, ctx),
                               _line_fields(form, req.response_format))


def decode_request(req: TranscriptionRequest, ctx: ServerContext) -> DecodeRequest:
    """The request's transcription options, checked against the Session: its speaker model (``spk``), the
    hotword limits and the decoder's context, the language (each a 400 naming its field)."""
    session = ctx.session
    diarize = speaker_options(session, req.spk)
    try:
        # the count/length limits, control characters and the decoder's context: a 400 at once
        session.options(hotwords=list(req.hotwords), max_new_tokens=ctx.max_new_tokens,
                        segment_seconds=ctx.segment_seconds)
    except (ValueError, TypeError) as exc:
        raise ApiError(400, client_words(exc), "hotwords", "invalid_value") from None
    try:  # a name the model lacks is used as written (as FunASR)
        language = session.normalize_language(req.language)
    except (ValueError, TypeError) as exc:
        raise ApiError(400, client_words(exc), "language", "invalid_value") from None
    return DecodeRequest(language, req.itn, req.hotwords, word_timestamps=req.words, vad_kwargs=diarize)


def _line_fields(form: FormData, fmt: str) -> dict[str, Any]:
    """``max_line_width`` / ``max_line_count`` (the srt/vtt subtitle lines), checked: 400 naming the field."""
    try:
        lines = check_lines(form_values(form, OUTPUT_OPTIONS))
    except FunAsrError as exc:
        field_ = OPTIONS[exc.option].form if exc.option in OPTIONS else None
        raise ApiError(400, client_words(exc), field_, "invalid_value") from None
    if lines and fmt not in ("srt", "vtt"):
        field_ = OPTIONS[next(iter(lines))].form
        raise ApiError(400, f"{field_} shapes srt/vtt subtitles: send response_format srt or vtt, got {fmt!r}",
                       field_, "invalid_value")
    return lines


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
    body = render(result, "txt" if fields.fmt == "text" else fields.fmt, **fields.lines)
    return PlainTextResponse(body, media_type=f"{media}; charset=utf-8", headers=headers)


def add_openai_routes(app: FastAPI, ctx: ServerContext) -> None:
    """GET /v1/models and POST /v1/audio/transcriptions on ``app``."""

    @app.get("/v1/models", response_model=ModelList, response_model_exclude_none=True)
    async def models() -> ModelList:
        return ModelList(data=[ModelEntry(**model_entry(ctx.model_id, ctx.created, getattr(ctx.session, "demo",
                                                                                            False)))])

    @app.post("/v1/audio/transcriptions", response_model=TranscriptionJson | VerboseTranscription,
              responses={200: {"content": {"text/plain": {}, "application/x-subrip": {}, "text/vtt": {},
                                           "text/event-stream": {}}}})
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
