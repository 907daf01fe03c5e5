"""OpenAI's transcription API: ``POST /v1/audio/transcriptions`` (multipart, as OpenAI's: file, model, language,
prompt (used as comma-separated hotwords), response_format (json, text, srt, vtt, verbose_json), temperature (only
0), plus the extensions itn and hotwords) and ``GET /v1/models``."""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass, field
from typing import Any

import anyio
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, PlainTextResponse, Response
from starlette.datastructures import UploadFile

from fun_asr.asr.formats import render
from fun_asr.asr.prompt import split_hotwords
from fun_asr.asr.session import Session, Transcription
from fun_asr.audio.decode import AudioError
from fun_asr.notices import Notice
from fun_asr.serve.batcher import Batcher, _decode
from fun_asr.serve.errors import ApiError, _bool, _words

log = logging.getLogger("fun_asr.server")

RESPONSE_FORMATS = ("json", "text", "srt", "vtt", "verbose_json")
MODEL_ALIASES = ("fun-asr", "fun-asr-nano", "whisper-1")
LANGUAGE_NAMES = {"zh": "chinese", "en": "english", "ja": "japanese"}


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

    @property
    def max_bytes(self) -> int:
        return int(self.max_upload_mb * 1024 * 1024)


def verbose_json(t: Transcription, words: bool = False) -> dict[str, Any]:
    lang = t.detected_language  # the requested language, else inferred from the text's script
    extra: dict[str, Any] = {}
    if words:  # timestamp_granularities=["word"]: OpenAI's words list (empty without a CTC head)
        extra["words"] = [{"word": w["word"], "start": w["start"], "end": w["end"]} for w in (t.words or [])]
    return {
        "task": "transcribe",
        "language": LANGUAGE_NAMES.get(lang or "", lang or "unknown"),
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
             "repetition": s.repetition}
            for i, s in enumerate(t.segments)
        ],
        "timings": t.timings,
        **extra,
    }


def add_openai_routes(app: FastAPI, ctx: ServerContext) -> None:
    """GET /v1/models and POST /v1/audio/transcriptions on ``app``."""
    session, model_id, max_upload_mb = ctx.session, ctx.model_id, ctx.max_upload_mb
    max_bytes, max_new_tokens, segment_seconds = ctx.max_bytes, ctx.max_new_tokens, ctx.segment_seconds
    max_queue, request_timeout, created = ctx.max_queue, ctx.request_timeout, ctx.created

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
        data = await upload.read(max_bytes + 1)
        if len(data) > max_bytes:
            raise ApiError(413, f"upload exceeds the limit of {max_upload_mb:g} MB", "file", "file_too_large")
        if not data:
            raise ApiError(400, "the uploaded file is empty", "file", "empty_file")

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
            session.normalize_language(language)
        except ValueError as exc:
            raise ApiError(400, str(exc), "language", "invalid_value") from None

        name = upload.filename or "upload"
        try:
            samples, info = await anyio.to_thread.run_sync(_decode, data, name)
        except AudioError as exc:
            raise ApiError(400, _words(exc), "file", "invalid_audio") from None
        batcher = ctx.batcher
        assert batcher is not None
        if batcher.jobs.qsize() >= max_queue:
            raise ApiError(429, f"server busy: {batcher.jobs.qsize()} requests are waiting (limit {max_queue}); "
                                "retry later", None, "rate_limit_exceeded", "rate_limit_error")
        fut = batcher.submit(samples, (language, itn, tuple(hotwords), None, None, None, words), name)
        try:
            result: Transcription = await asyncio.wait_for(asyncio.wrap_future(fut), timeout=request_timeout)
        except asyncio.TimeoutError:
            fut.cancel()
            raise ApiError(504, f"the transcription took longer than {request_timeout:g} s", None, "timeout",
                           "server_error") from None
        except ValueError as exc:
            raise ApiError(400, _words(exc), None, "invalid_value") from None
        if info.truncated:
            result.input_truncated = True
            result.warnings[:0] = [Notice("input_truncated", w) for w in info.warnings]
        for w in result.warnings:
            log.warning("%s", w)

        if fmt == "json":
            return JSONResponse({"text": result.text, "truncated": result.truncated,
                                 "input_truncated": result.input_truncated})
        if fmt == "verbose_json":
            return JSONResponse(verbose_json(result, words))
        media = {"text": "text/plain", "srt": "application/x-subrip", "vtt": "text/vtt"}[fmt]
        body = render(result, "txt" if fmt == "text" else fmt)
        return PlainTextResponse(body, media_type=f"{media}; charset=utf-8")
