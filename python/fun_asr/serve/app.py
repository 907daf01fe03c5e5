"""An OpenAI-compatible transcription server (`fun-asr-serve`) over one shared Session.

POST /v1/audio/transcriptions (multipart, as OpenAI's): file, model, language, prompt (used as
comma-separated hotwords), response_format (json, text, srt, vtt, verbose_json), temperature (only
0), plus the extensions itn and hotwords. GET /v1/models, GET /health. Errors use OpenAI's shape
{"error": {"message", "type", "param", "code"}}.
"""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import json
import logging
import queue
import threading
import time
import uuid
import warnings
from concurrent.futures import Future
from typing import Any

import anyio
import numpy as np
from fastapi import FastAPI, Request, WebSocket
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, PlainTextResponse, Response
from starlette.datastructures import UploadFile
from starlette.exceptions import HTTPException as StarletteHTTPException

from fun_asr.asr.formats import render
from fun_asr.asr.messages import cli_words
from fun_asr.asr.prompt import split_hotwords
from fun_asr.asr.session import Session, Transcription
from fun_asr.audio.decode import SAMPLE_RATE, AudioError, AudioInfo, decode_audio
from fun_asr.notices import FunAsrWarning, Notice
from fun_asr.serve.ws_realtime import RealtimeLimits
from fun_asr.serve.ws_realtime import handle as realtime_handle

log = logging.getLogger("fun_asr.server")
access_log = logging.getLogger("fun_asr.access")

RESPONSE_FORMATS = ("json", "text", "srt", "vtt", "verbose_json")
MODEL_ALIASES = ("fun-asr", "fun-asr-nano", "whisper-1")
LANGUAGE_NAMES = {"zh": "chinese", "en": "english", "ja": "japanese"}


class ApiError(Exception):
    def __init__(self, status: int, message: str, param: str | None = None, code: str | None = None,
                 kind: str = "invalid_request_error") -> None:
        super().__init__(message)
        self.status, self.message, self.param, self.code, self.kind = status, message, param, code, kind


def _error(status: int, message: str, param: str | None = None, code: str | None = None,
           kind: str = "invalid_request_error") -> JSONResponse:
    return JSONResponse(status_code=status,
                        content={"error": {"message": message, "type": kind, "param": param, "code": code}})


def _bool(value: str | None, name: str, default: bool) -> bool:
    if value is None or value == "":
        return default
    v = value.strip().lower()
    if v in ("1", "true", "yes", "on"):
        return True
    if v in ("0", "false", "no", "off"):
        return False
    raise ApiError(400, f"{name} must be true or false, got {value!r}", name, "invalid_value")


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


class Batcher:
    """One worker thread owns the model: it takes queued requests and transcribes up to `max_batch`
    with equal options together (Session.transcribe_batch: one decoding pass for all of them)."""

    def __init__(self, session: Session, max_batch: int, max_new_tokens: int, segment_seconds: float = 30.0) -> None:
        self.session, self.max_batch, self.max_new_tokens = session, max(1, max_batch), max_new_tokens
        self.segment_seconds = segment_seconds
        self.jobs: queue.Queue[tuple[tuple, tuple[np.ndarray, str], Future] | None] = queue.Queue()
        self.thread = threading.Thread(target=self._work, name="fun-asr-batcher", daemon=True)
        self.thread.start()

    def submit(self, samples: np.ndarray, options: tuple, name: str = "upload") -> Future:  # Future[Transcription]
        fut: Future = Future()
        self.jobs.put((options, (samples, name), fut))
        return fut

    def close(self) -> None:
        self.jobs.put(None)
        self.thread.join(timeout=60)

    def _work(self) -> None:
        held: list[tuple[tuple, tuple[np.ndarray, str], Future]] = []
        while True:
            first = held.pop(0) if held else self.jobs.get()
            if first is None:
                return
            batch = [first]
            stop = False
            while len(batch) < self.max_batch:
                try:
                    job = self.jobs.get(timeout=0.005)
                except queue.Empty:
                    break
                if job is None:
                    stop = True
                    break
                (batch if job[0] == first[0] else held).append(job)
            self._run(batch)
            if stop:
                for _, _, fut in held:
                    fut.set_exception(RuntimeError("server is shutting down"))
                return

    def _run(self, batch: list[tuple[tuple, tuple[np.ndarray, str], Future]]) -> None:
        # options: (language, itn, hotwords, max_new_tokens, segment_seconds, vad, word_timestamps); None =
        # the server's setting. Streams decode their VAD sentences without running the offline VAD again.
        batch = [job for job in batch if job[2].set_running_or_notify_cancel()]  # drop timed-out requests
        if not batch:
            return
        language, itn, hotwords, max_new, seconds, vad, words = batch[0][0]
        try:
            results = self.session.transcribe_batch(
                [job[1][0] for job in batch], sample_rate=SAMPLE_RATE, language=language, itn=itn,
                hotwords=list(hotwords), max_new_tokens=max_new or self.max_new_tokens, batch_size=len(batch),
                segment_seconds=seconds or self.segment_seconds, names=[job[1][1] for job in batch], vad=vad,
                word_timestamps=words)
        except Exception as exc:  # noqa: BLE001 - handed to every waiting request
            for _, _, fut in batch:
                fut.set_exception(exc)
            return
        for (_, _, fut), result in zip(batch, results, strict=True):
            if result.ok:
                fut.set_result(result)
            else:
                fut.set_exception(ValueError(result.error))


def _words(exc: BaseException) -> str:
    """A Session/audio message in a client's words (request fields, the server's flags)."""
    return cli_words(str(exc), segment_flag="fun-asr-serve --max-segment-seconds",
                     max_audio_flag="fun-asr-serve --max-audio-seconds", hotwords="hotwords")


def _decode(data: bytes, name: str) -> tuple[np.ndarray, AudioInfo]:
    return decode_audio(data, name=name)


def create_app(session: Session, *, model_id: str, max_upload_mb: float = 100.0, max_concurrency: int = 8,
               max_new_tokens: int = 512, segment_seconds: float = 30.0,
               realtime: RealtimeLimits | None = None, api_key: str | None = None,
               cors_origins: list[str] | None = None, request_timeout: float = 600.0,
               max_queue: int = 256) -> FastAPI:
    session.options(max_new_tokens=max_new_tokens, segment_seconds=segment_seconds)  # checked once, at start
    batcher: Batcher | None = None

    @contextlib.asynccontextmanager
    async def lifespan(_app: FastAPI):  # noqa: ANN202
        nonlocal batcher
        batcher = Batcher(session, max_concurrency, max_new_tokens, segment_seconds)
        try:
            yield
        finally:
            await anyio.to_thread.run_sync(batcher.close)

    # Each result's warnings are logged once per request (below); the Session's own Python warnings
    # for the same events would print them a second time.
    warnings.filterwarnings("ignore", category=FunAsrWarning, module=r"fun_asr\.serve\.app")
    app = FastAPI(title="fun-asr", description="OpenAI-compatible speech-to-text with Fun-ASR-Nano", lifespan=lifespan)
    max_bytes = int(max_upload_mb * 1024 * 1024)
    created = int(time.time())
    if cors_origins:  # none unless asked
        from fastapi.middleware.cors import CORSMiddleware

        app.add_middleware(CORSMiddleware, allow_origins=cors_origins, allow_methods=["GET", "POST"],
                           allow_headers=["Authorization", "Content-Type", "X-Request-Id"])

    def authorized(headers: Any) -> bool:
        if not api_key:
            return True
        got = headers.get("authorization", "")
        scheme, _, token = got.partition(" ")
        return scheme.lower() == "bearer" and hmac.compare_digest(token.strip().encode(), api_key.encode())

    @app.middleware("http")
    async def access(request: Request, call_next: Any) -> Response:
        """Request ids, the API key, and one structured access-log line per request (never the audio)."""
        rid = request.headers.get("x-request-id") or uuid.uuid4().hex[:16]
        request.state.rid = rid
        t0 = time.perf_counter()
        if request.url.path != "/health" and not authorized(request.headers):
            response: Response = _error(401, "missing or wrong API key: send 'Authorization: Bearer <key>'", None,
                                        "invalid_api_key")
        else:
            response = await call_next(request)
        response.headers["X-Request-Id"] = rid
        access_log.info("%s", json.dumps({
            "ts": round(time.time(), 3), "id": rid, "method": request.method, "path": request.url.path,
            "status": response.status_code, "ms": round((time.perf_counter() - t0) * 1e3, 1),
            "bytes_in": int(request.headers.get("content-length") or 0),
            "client": request.client.host if request.client else None}))
        return response

    @app.exception_handler(ApiError)
    async def _api_error(_req: Request, exc: ApiError) -> JSONResponse:
        return _error(exc.status, exc.message, exc.param, exc.code, exc.kind)

    @app.exception_handler(RequestValidationError)
    async def _validation(_req: Request, exc: RequestValidationError) -> JSONResponse:
        first = exc.errors()[0] if exc.errors() else {}
        param = str(first.get("loc", ["", ""])[-1]) or None
        return _error(400, f"invalid request: {first.get('msg', 'bad input')}", param, "invalid_value")

    @app.exception_handler(StarletteHTTPException)
    async def _http_error(req: Request, exc: StarletteHTTPException) -> JSONResponse:
        if exc.status_code == 404:
            return _error(404, f"unknown route {req.method} {req.url.path}: this server has POST "
                               "/v1/audio/transcriptions, GET /v1/models, GET /health", None, "not_found")
        if exc.status_code == 405:
            return _error(405, f"method {req.method} is not allowed on {req.url.path}", None, "method_not_allowed")
        return _error(exc.status_code, str(exc.detail), None, None)

    @app.exception_handler(Exception)
    async def _internal(_req: Request, exc: Exception) -> JSONResponse:
        log.exception("internal error")
        return _error(500, f"internal error: {exc}", None, None, "server_error")

    limits = realtime or RealtimeLimits()
    live = [0]  # streams connected now

    @app.websocket("/{path:path}")
    async def realtime_ws(ws: WebSocket, path: str) -> None:  # noqa: ARG001 - FunASR serves any path
        """FunASR's realtime protocol on every path (ws://host:port/ as FunASR's clients connect)."""
        if not authorized(ws.headers):
            access_log.info("%s", json.dumps({"ts": round(time.time(), 3), "method": "WEBSOCKET",
                                              "path": ws.url.path, "status": 403, "reason": "api key"}))
            await ws.close(code=1008)  # before accept: the upgrade is refused (HTTP 403)
            return
        if session.vad is None:
            await ws.accept()
            await ws.send_text(json.dumps({"event": "error", "error": "streaming needs the FSMN-VAD; start the "
                                                                      "server with --vad fsmn (or --vad-model)"}))
            await ws.close(code=1011)
            return
        assert batcher is not None
        await realtime_handle(ws, session, batcher.submit, limits, live, max_new_tokens)

    @app.get("/health")
    async def health() -> dict[str, str]:
        return {"status": "ok", "model": model_id}

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

    return app
