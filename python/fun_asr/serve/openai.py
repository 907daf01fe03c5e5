"""OpenAI's transcription API: ``POST /v1/audio/transcriptions`` (multipart, as OpenAI's: file, model, language,
prompt (used as comma-separated hotwords), response_format (json, text, srt, vtt, verbose_json), temperature (only
0), stream (OpenAI's server-sent ``transcript.text.delta`` / ``transcript.text.done`` events), plus the extensions
itn, hotwords and FunASR's spk) and ``GET /v1/models``; and the upload/decode/batcher steps every route shares."""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

import anyio
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, PlainTextResponse, Response, StreamingResponse
from starlette.datastructures import UploadFile

from fun_asr.asr.assemble import join_text
from fun_asr.asr.formats import render
from fun_asr.asr.language import english_name
from fun_asr.asr.prompt import split_hotwords
from fun_asr.asr.session import Session, Transcription
from fun_asr.audio.decode import AudioError
from fun_asr.notices import Notice
from fun_asr.serve.batcher import Batcher, _decode
from fun_asr.serve.errors import ApiError, _bool, _words, speaker_options
from fun_asr.serve.words import ClientWords

log = logging.getLogger("fun_asr.server")
# notices about the Session, not the request: logged once by the Session, still in every response
SESSION_WIDE = frozenset({"no_vad", "word_timestamps_unavailable", "language_unknown"})

RESPONSE_FORMATS = ("json", "text", "srt", "vtt", "verbose_json")
STREAM_FORMATS = ("json", "text")  # as OpenAI: a stream of transcript.text events replaces these two
MODEL_ALIASES = ("fun-asr", "fun-asr-nano", "whisper-1")
LANGUAGE_NAMES = {"zh": "chinese", "en": "english", "ja": "japanese", "ko": "korean"}


@dataclass
class ServerContext:
    """What the routes share: the Session, the server's settings and (once the app has started) its batcher."""

    session: Session
    model_id: str
    max_upload_mb: float
    max_new_tokens: int
    segment_seconds: float
    max_queue: int
    request_timeout: float
    created: int = field(default_factory=lambda: int(time.time()))
    batcher: Batcher | None = None
    words: ClientWords | None = None  # messages as clients read them (no server paths); None: built from session

    def __post_init__(self) -> None:
        if self.words is None:
            self.words = ClientWords(self.session, self.model_id)

    @property
    def max_bytes(self) -> int:
        return int(self.max_upload_mb * 1024 * 1024)


async def read_upload(upload: UploadFile, ctx: ServerContext) -> bytes:
    """The uploaded file's bytes: 413 past ``--max-upload-mb``, 400 for an empty file."""
    data = await upload.read(ctx.max_bytes + 1)
    if len(data) > ctx.max_bytes:
        raise ApiError(413, f"upload exceeds the limit of {ctx.max_upload_mb:g} MB", "file", "file_too_large")
    if not data:
        raise ApiError(400, "the uploaded file is empty", "file", "empty_file")
    return data


async def transcribe_upload(ctx: ServerContext, data: bytes, name: str, options: tuple) -> Transcription:
    """Decodes an upload off the event loop and transcribes it through the shared batcher (``options`` as
    :meth:`Batcher.submit` takes them): 400 for audio that cannot be read, 429 past ``--max-queue`` waiting
    requests, 504 past ``--request-timeout``. The result's warnings are logged once, here (as they are), then
    put in the client's words (no server paths: :class:`~fun_asr.serve.words.ClientWords`; codes unchanged)."""
    try:
        samples, info = await anyio.to_thread.run_sync(_decode, data, name)
    except AudioError as exc:
        raise ApiError(400, _words(exc), "file", "invalid_audio") from None
    batcher = ctx.batcher
    assert batcher is not None
    if batcher.jobs.qsize() >= ctx.max_queue:
        raise ApiError(429, f"server busy: {batcher.jobs.qsize()} requests are waiting (limit {ctx.max_queue}); "
                            "retry later", None, "rate_limit_exceeded", "rate_limit_error")
    fut = batcher.submit(samples, options, name)
    try:
        result: Transcription = await asyncio.wait_for(asyncio.wrap_future(fut), timeout=ctx.request_timeout)
    except asyncio.TimeoutError:
        fut.cancel()
        raise ApiError(504, f"the transcription took longer than {ctx.request_timeout:g} s", None, "timeout",
                       "server_error") from None
    except ValueError as exc:
        raise ApiError(400, _words(exc), None, "invalid_value") from None
    if info.truncated:
        result.input_truncated = True
        result.warnings[:0] = [Notice("input_truncated", w) for w in info.warnings]
    for w in result.warnings:
        if getattr(w, "code", None) not in SESSION_WIDE:  # those the Session logs once, not per request
            log.warning("%s", w)
    words = ctx.words
    assert words is not None
    result.warnings = [Notice(w.code, words(w)) if isinstance(w, Notice) else words(w) for w in result.warnings]
    return result


def segment_words(segment: Any) -> list[dict[str, Any]]:
    """A segment's word (CTC token) times as OpenAI and FunASR give them: ``{"word", "start", "end"}`` (s)."""
    return [{"word": w["word"], "start": w["start"], "end": w["end"]} for w in (segment.words or [])]


def verbose_json(t: Transcription, words: bool = False, spec: dict[str, Any] | None = None) -> dict[str, Any]:
    """OpenAI's verbose_json, with FunASR's ``words`` inside each segment (``[]`` unless word timestamps were
    asked for) and fun-asr's extensions (truncation flags, warnings, segmentation, timings)."""
    lang = t.detected_language  # the requested language, else inferred from the text's script
    if spec is not None:
        language = english_name(spec, lang) or "unknown"
    else:
        language = LANGUAGE_NAMES.get(lang or "", lang or "unknown")
    extra: dict[str, Any] = {}
    if words:  # timestamp_granularities=["word"]: OpenAI's words list (empty without a CTC head)
        extra["words"] = [w for s in t.segments for w in segment_words(s)]
    return {
        "task": "transcribe",
        "language": language,
        "duration": round(t.duration, 3),
        "text": t.text,
        "truncated": t.truncated,
        "input_truncated": t.input_truncated,
        "warnings": [str(w) for w in t.warnings],
        "warning_codes": t.warning_codes,
        "segmentation": t.segmentation,
        "segments": [
            {"id": i, "seek": int(s.start * 100), "start": s.start, "end": s.end, "text": s.text,
             "tokens": s.tokens, "temperature": 0.0, "stop_reason": s.stop_reason, "truncated": s.truncated,
             "repetition": s.repetition, "words": segment_words(s) if words else [],
             **({} if s.speaker is None else {"speaker": s.speaker_label})}
            for i, s in enumerate(t.segments)
        ],
        **({} if t.speakers is None else {"num_speakers": t.num_speakers, "speakers": [
            {"start": round(a, 3), "end": round(b, 3), "speaker": f"SPK{k}"} for a, b, k in t.speakers]}),
        "timings": t.timings,
        **extra,
    }


def stream_events(t: Transcription, spec: dict[str, Any]) -> list[dict[str, Any]]:
    """OpenAI's streamed transcription: one ``transcript.text.delta`` per decoded segment with text (its text,
    after the separator the transcript puts before it, so that the deltas add up to the text exactly), then
    ``transcript.text.done`` with the whole text (and the json format's truncation flags)."""
    events: list[dict[str, Any]] = []
    deltas: list[str] = []
    prev = None
    for s in t.segments:
        if not s.text:
            continue
        # the separator depends only on the text before it (its last character) and this segment: join the
        # pair, not everything shown so far (linear in the transcript, also for hours of segments)
        delta = s.text if prev is None else join_text([prev, s], t.language, spec)[len(prev.text):]
        events.append({"type": "transcript.text.delta", "delta": delta})
        deltas.append(delta)
        prev = s
    text = "".join(deltas)
    if text != t.text:  # never expected (join_text builds t.text); the deltas must add up to the text
        raise RuntimeError(f"streamed deltas {text!r} do not add up to the transcript {t.text!r}")
    events.append({"type": "transcript.text.done", "text": t.text, "truncated": t.truncated,
                   "input_truncated": t.input_truncated})
    return events


def sse_response(events: list[dict[str, Any]]) -> StreamingResponse:
    """Server-sent events as OpenAI sends them: ``data: <json>`` blocks, then ``data: [DONE]``."""

    async def body() -> AsyncIterator[str]:
        for event in events:
            yield f"data: {json.dumps(event, ensure_ascii=False, separators=(',', ':'))}\n\n"
        yield "data: [DONE]\n\n"

    return StreamingResponse(body(), media_type="text/event-stream",
                             headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})


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
        language = field("language")
        try:
            session.normalize_language(language)  # a name the model lacks is used as written (as FunASR)
        except (ValueError, TypeError) as exc:
            raise ApiError(400, str(exc), "language", "invalid_value") from None

        name = upload.filename or "upload"
        result = await transcribe_upload(ctx, data, name, (language, itn, tuple(hotwords), None, None, None, words)
                                         + ((diarize,) if diarize else ()))

        if stream:
            return sse_response(stream_events(result, session.spec))
        if fmt == "json":
            return JSONResponse({"text": result.text, "truncated": result.truncated,
                                 "input_truncated": result.input_truncated})
        if fmt == "verbose_json":
            return JSONResponse(verbose_json(result, words, session.spec))
        media = {"text": "text/plain", "srt": "application/x-subrip", "vtt": "text/vtt"}[fmt]
        body = render(result, "txt" if fmt == "text" else fmt)
        return PlainTextResponse(body, media_type=f"{media}; charset=utf-8")
