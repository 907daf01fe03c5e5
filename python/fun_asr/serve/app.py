"""The server (`fun-asr-serve`) put together over one shared Session: the FastAPI app with its lifespan (the
batcher), the API key, request ids and one access-log line per request, errors in OpenAI's shape, and the routes:
OpenAI's transcription API (:mod:`~fun_asr.serve.openai`), FunASR's realtime WebSocket on every path
(:mod:`~fun_asr.serve.ws_realtime`), GET /health.
"""

from __future__ import annotations

import contextlib
import hmac
import json
import logging
import time
import uuid
import warnings
from typing import Any

import anyio
from fastapi import FastAPI, Request, WebSocket
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from starlette.exceptions import HTTPException as StarletteHTTPException

from fun_asr.asr.session import Session
from fun_asr.notices import FunAsrWarning
from fun_asr.serve.batcher import Batcher
from fun_asr.serve.errors import ApiError, _error
from fun_asr.serve.openai import RESPONSE_FORMATS, ServerContext, add_openai_routes, verbose_json  # noqa: F401
from fun_asr.serve.ws_realtime import RealtimeLimits
from fun_asr.serve.ws_realtime import handle as realtime_handle

log = logging.getLogger("fun_asr.server")
access_log = logging.getLogger("fun_asr.access")


def create_app(session: Session, *, model_id: str, max_upload_mb: float = 100.0, max_concurrency: int = 8,
               max_new_tokens: int = 512, segment_seconds: float = 30.0,
               realtime: RealtimeLimits | None = None, api_key: str | None = None,
               cors_origins: list[str] | None = None, request_timeout: float = 600.0,
               max_queue: int = 256) -> FastAPI:
    session.options(max_new_tokens=max_new_tokens, segment_seconds=segment_seconds)  # checked once, at start
    ctx = ServerContext(session, model_id, max_upload_mb, max_new_tokens, segment_seconds, max_queue,
                        request_timeout)

    @contextlib.asynccontextmanager
    async def lifespan(_app: FastAPI):  # noqa: ANN202
        ctx.batcher = Batcher(session, max_concurrency, max_new_tokens, segment_seconds)
        try:
            yield
        finally:
            await anyio.to_thread.run_sync(ctx.batcher.close)

    # Each result's warnings are logged once per request (below); the Session's own Python warnings
    # for the same events would print them a second time.
    warnings.filterwarnings("ignore", category=FunAsrWarning, module=r"fun_asr\.serve\.")  # (the batcher)
    app = FastAPI(title="fun-asr", description="OpenAI-compatible speech-to-text with Fun-ASR-Nano", lifespan=lifespan)
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
        assert ctx.batcher is not None
        await realtime_handle(ws, session, ctx.batcher.submit, limits, live, max_new_tokens)

    @app.get("/health")
    async def health() -> dict[str, str]:
        return {"status": "ok", "model": model_id}

    add_openai_routes(app, ctx)

    return app
