"""The server (`fun-asr-serve`) put together over one shared Session: the FastAPI app with its lifespan (the
batcher), the API key (a header, or ``?api_key=`` in the URL: :func:`api_key_ok`), request ids and one access-log
line per request (never the query string), errors in OpenAI's shape (FastAPI's on FunASR's routes) and, like every
message a client gets, without server paths (:class:`~fun_asr.serve.words.ClientWords`), and the protocols
(:mod:`fun_asr.serve.protocols`): OpenAI's transcription API, FunASR's offline ``POST /asr``, the web page at
``/``, GET /health, and on every path the WebSocket protocols of :data:`WEBSOCKET_PROTOCOLS` (FunASR runtime's
online/offline/2pass and FunASR's realtime protocol), told apart by a connection's first message.
"""

from __future__ import annotations

import contextlib
import hmac
import json
import logging
import re
import time
import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any
from urllib.parse import unquote_plus

import anyio
from fastapi import FastAPI, Request, WebSocket
from fastapi.exception_handlers import request_validation_exception_handler
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from fastapi.routing import APIRoute
from starlette.exceptions import HTTPException as StarletteHTTPException

from fun_asr.asr.session import Session
from fun_asr.serve.core.batcher import Batcher
from fun_asr.serve.core.context import ServerContext
from fun_asr.serve.core.errors import ApiError, error_for, is_funasr_path
from fun_asr.serve.core.limits import RealtimeLimits
from fun_asr.serve.core.websocket import MAX_FILE_MB, StreamServer, WebSocketProtocol, dispatch
from fun_asr.serve.protocols import funasr_realtime, funasr_runtime
from fun_asr.serve.protocols.funasr_http import add_funasr_routes
from fun_asr.serve.protocols.openai import RESPONSE_FORMATS, add_openai_routes, verbose_json  # noqa: F401
from fun_asr.serve.protocols.web import add_web_routes, is_page_request
from fun_asr.serve.words import ClientWords

log = logging.getLogger("fun_asr.server")
access_log = logging.getLogger("fun_asr.access")

API_KEY_PARAM = "api_key"  # ?api_key=KEY: for clients that cannot set headers (a browser's WebSocket)
_QUERY_PAIR = re.compile(r"((?:^|[?&;])([^=&#;\s\"?]+)=)([^&#;\s\"]*)")

# The WebSocket protocols on every path, told apart by a connection's first message: the first that recognises
# it serves the connection; the last is the fallback (any first message). A new protocol is one more record.
WEBSOCKET_PROTOCOLS: tuple[WebSocketProtocol, ...] = (
    funasr_runtime.PROTOCOL,  # a JSON object: FunASR runtime's online/offline/2pass
    funasr_realtime.PROTOCOL,  # anything else (START, LANGUAGE:x, binary audio ...): FunASR's realtime protocol
)


def api_key_ok(api_key: str | None, headers: Mapping[str, str], query: Mapping[str, str] | None = None) -> bool:
    """Whether a request may pass: no key is configured, or it sends the key as ``Authorization: Bearer KEY``
    or as the URL's ``?api_key=KEY`` (browsers cannot set headers on a WebSocket; a key in a URL can land in
    proxies' logs and browser history, which this server's own access log never records). Constant-time."""
    if not api_key:
        return True
    want = api_key.encode()
    scheme, _, token = headers.get("authorization", "").partition(" ")
    if scheme.lower() == "bearer" and hmac.compare_digest(token.strip().encode(), want):
        return True
    given = query.get(API_KEY_PARAM) if query is not None else None
    return given is not None and hmac.compare_digest(given.encode(), want)


def redact_api_key(text: str) -> str:
    """A URL or log line with any ``api_key=`` value replaced by ``***``: every query pair whose name, decoded as
    Starlette decodes it (``%61pi_key``, ``api+key`` …, any case), is ``api_key``."""
    def hide(m: re.Match[str]) -> str:
        return m.group(1) + "***" if unquote_plus(m.group(2)).lower() == API_KEY_PARAM else m.group(0)

    return _QUERY_PAIR.sub(hide, text)


class _RedactApiKey(logging.Filter):
    """Hides ``?api_key=`` values in uvicorn's own log lines (its access log and its WebSocket lines print
    the path with the query string)."""

    def filter(self, record: logging.LogRecord) -> bool:
        if isinstance(record.args, tuple):
            record.args = tuple(redact_api_key(a) if isinstance(a, str) else a for a in record.args)
        if isinstance(record.msg, str):
            record.msg = redact_api_key(record.msg)
        return True


def _redact_uvicorn_logs() -> None:
    for name in ("uvicorn.access", "uvicorn.error"):
        logger = logging.getLogger(name)
        if not any(isinstance(f, _RedactApiKey) for f in logger.filters):
            logger.addFilter(_RedactApiKey())


async def serve_websocket(ws: WebSocket, session: Session, batcher: Batcher | None, limits: RealtimeLimits,
                          counter: list[int], max_new_tokens: int, *, authorized: bool,
                          max_file_mb: float = MAX_FILE_MB, words: ClientWords | None = None) -> None:
    """The WebSocket route's whole body (:func:`~fun_asr.serve.core.websocket.dispatch` over
    :data:`WEBSOCKET_PROTOCOLS`): ``counter`` holds the connections open now (--max-streams), ``authorized``
    whether the API key was given, ``max_file_mb`` the largest non-PCM upload (the server's --max-upload-mb),
    ``words`` the server's :class:`~fun_asr.serve.words.ClientWords` (messages without server paths; None: one
    for ``session``)."""
    server = StreamServer(session, batcher, limits, counter, max_new_tokens, max_file_mb, words)
    await dispatch(ws, server, WEBSOCKET_PROTOCOLS, authorized=authorized)


def _routes(app: FastAPI) -> str:
    """The app's HTTP routes for a 404 message: ``POST /v1/audio/transcriptions, GET /v1/models, ...``."""
    out = [f"{m} {r.path}" for r in app.routes if isinstance(r, APIRoute) for m in sorted(r.methods)]
    return ", ".join(out) + ", and FunASR's realtime WebSocket on every path"


@dataclass(frozen=True, kw_only=True)
class AppSettings:
    """The server's settings, the keywords of :func:`create_app` (fun-asr-serve's flags): ``model_id`` the model's
    name as clients see it; ``max_upload_mb`` the largest upload; ``max_concurrency`` the batcher's width;
    ``max_new_tokens`` and ``segment_seconds`` every decode's limits; ``realtime`` the WebSocket streams' limits
    (None: the defaults); ``api_key`` the key every route but the page and /health asks for (None: none);
    ``cors_origins`` the origins CORS allows (None: no CORS); ``request_timeout`` and ``max_queue`` a request's
    longest wait and the most requests waiting."""

    model_id: str
    max_upload_mb: float = 100.0
    max_concurrency: int = 8
    max_new_tokens: int = 512
    segment_seconds: float = 30.0
    realtime: RealtimeLimits | None = None
    api_key: str | None = None
    cors_origins: list[str] | None = None
    request_timeout: float = 600.0
    max_queue: int = 256


def create_app(session: Session, **settings: Any) -> FastAPI:
    """The server's app over ``session``; ``settings``: :class:`AppSettings`'s fields as keywords (``model_id``
    required; any other keyword is a TypeError)."""
    return _create_app(session, AppSettings(**settings))


def _create_app(session: Session, settings: AppSettings) -> FastAPI:
    model_id, max_new_tokens, segment_seconds = settings.model_id, settings.max_new_tokens, settings.segment_seconds
    api_key = settings.api_key
    session.options(max_new_tokens=max_new_tokens, segment_seconds=segment_seconds)  # checked once, at start
    # what clients read: the server's flags and request fields, never a path on the server (the model's file is
    # the model_id; the server's own log keeps the paths)
    words = ClientWords(session, model_id)
    ctx = ServerContext(session, model_id, settings.max_upload_mb, max_new_tokens, segment_seconds,
                        settings.max_queue, settings.request_timeout, words=words)

    @contextlib.asynccontextmanager
    async def lifespan(_app: FastAPI):  # noqa: ANN202
        ctx.batcher = Batcher(session, settings.max_concurrency, max_new_tokens, segment_seconds)
        try:
            yield
        finally:
            await anyio.to_thread.run_sync(ctx.batcher.close)

    app = FastAPI(title="fun-asr", description="OpenAI-compatible speech-to-text with Fun-ASR-Nano", lifespan=lifespan)
    app.state.context = ctx  # the routes' shared state (the batcher once started), for tests and extensions
    if settings.cors_origins:  # none unless asked
        from fastapi.middleware.cors import CORSMiddleware

        app.add_middleware(CORSMiddleware, allow_origins=settings.cors_origins, allow_methods=["GET", "POST"],
                           allow_headers=["Authorization", "Content-Type", "X-Request-Id"])

    _redact_uvicorn_logs()  # uvicorn prints paths with their query string: never a key

    def authorized(headers: Any, query: Mapping[str, str] | None = None) -> bool:
        """The API key check of every HTTP route and of the WebSocket (pass ``ws.query_params`` for ?api_key=)."""
        return api_key_ok(api_key, headers, query)

    @app.middleware("http")
    async def access(request: Request, call_next: Any) -> Response:
        """Request ids, the API key, and one structured access-log line per request (never the audio)."""
        rid = request.headers.get("x-request-id") or uuid.uuid4().hex[:16]
        request.state.rid = rid
        t0 = time.perf_counter()
        if request.url.path != "/health" and not is_page_request(request.method, request.url.path) \
                and not authorized(request.headers, request.query_params):
            response: Response = error_for(request.url.path, 401, "missing or wrong API key: send 'Authorization: "
                                           "Bearer <key>' (or ?api_key=<key> in the URL)", None, "invalid_api_key")
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
    async def _api_error(req: Request, exc: ApiError) -> JSONResponse:
        return error_for(req.url.path, exc.status, words(exc.message), exc.param, exc.code, exc.kind)

    @app.exception_handler(RequestValidationError)
    async def _validation(req: Request, exc: RequestValidationError) -> JSONResponse:
        if is_funasr_path(req.url.path):  # FunASR's server answers FastAPI's 422 with its "detail" list
            return await request_validation_exception_handler(req, exc)
        first = exc.errors()[0] if exc.errors() else {}
        param = str(first.get("loc", ["", ""])[-1]) or None
        return error_for(req.url.path, 400, words(f"invalid request: {first.get('msg', 'bad input')}"), param,
                         "invalid_value")

    @app.exception_handler(StarletteHTTPException)
    async def _http_error(req: Request, exc: StarletteHTTPException) -> JSONResponse:
        path = req.url.path
        if exc.status_code == 404:
            return error_for(path, 404, f"unknown route {req.method} {path}: this server has {_routes(app)}", None,
                             "not_found")
        if exc.status_code == 405:
            return error_for(path, 405, f"method {req.method} is not allowed on {path}", None, "method_not_allowed")
        return error_for(path, exc.status_code, words(str(exc.detail)), None, None)

    @app.exception_handler(Exception)
    async def _internal(req: Request, exc: Exception) -> JSONResponse:
        log.exception("internal error")
        return error_for(req.url.path, 500, words(f"internal error: {exc}"), None, None, "server_error")

    limits = settings.realtime or RealtimeLimits()
    live = [0]  # streams connected now

    @app.websocket("/{path:path}")
    async def realtime_ws(ws: WebSocket, path: str) -> None:  # noqa: ARG001 - FunASR serves any path
        """The WebSocket protocols on every path (ws://host:port/ as FunASR's clients connect)."""
        await serve_websocket(ws, session, ctx.batcher, limits, live, max_new_tokens,
                              authorized=authorized(ws.headers, ws.query_params), max_file_mb=ctx.max_upload_mb,
                              words=words)

    @app.get("/health")
    async def health() -> dict[str, str]:
        return {"status": "ok", "model": model_id}

    add_openai_routes(app, ctx)
    add_funasr_routes(app, ctx)
    add_web_routes(app)  # GET /: the web page (serve/protocols/web), no key needed to load it

    return app
