"""The web page of ``fun-asr-serve``: ``GET /`` (``serve/static/index.html``) and its files under ``/web/`` (plain
HTML, CSS and JavaScript shipped in the package: no build step, nothing fetched from elsewhere at run time).

The page holds no data, so it loads without the API key (:func:`is_page_request`: the app's key check lets
these GET requests through); everything it asks the server for needs the key as every client does (the page
sends ``Authorization: Bearer KEY`` over HTTP and ``?api_key=KEY`` on the WebSocket). It talks to the
server's own routes only: ``GET /v1/models`` (whether a key is needed, the model id), ``POST
/v1/audio/transcriptions`` with ``response_format=verbose_json`` (a file) and the realtime WebSocket on ``/``
(the microphone, FunASR's realtime protocol: :mod:`fun_asr.serve.protocols.funasr_realtime`). docs/web.md describes it.
"""

from __future__ import annotations

import logging
from pathlib import Path

from fastapi import FastAPI
from fastapi.responses import Response
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.requests import Request
from starlette.routing import Route

log = logging.getLogger("fun_asr.server")
STATIC = Path(__file__).resolve().parents[2] / "static"  # serve/static: the files shipped in the package
PAGE = "index.html"
ASSET_PREFIX = "/web/"
# the files the page loads, with their media types: nothing else under static/ is served
ASSETS = {"app.js": "text/javascript; charset=utf-8", "app.css": "text/css; charset=utf-8",
          "worklet.js": "text/javascript; charset=utf-8", "favicon.svg": "image/svg+xml"}
# same-origin only (the page's own files, its server's HTTP routes and WebSocket, blob: URLs for the decoded
# audio and the downloads); nothing from another host can load or run
CSP = ("default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data: blob:; "
       "media-src 'self' blob:; connect-src 'self' ws: wss:; worker-src 'self' blob:; object-src 'none'; "
       "base-uri 'none'; form-action 'none'; frame-ancestors 'none'")
HEADERS = {"Content-Security-Policy": CSP, "X-Content-Type-Options": "nosniff", "Cache-Control": "no-cache",
           "Referrer-Policy": "no-referrer"}


def is_page_request(method: str, path: str) -> bool:
    """Whether a request is for the page or one of its files (GET ``/``, ``/web/<file>``): these need no API
    key (they hold no data)."""
    return method == "GET" and (path == "/" or (path.startswith(ASSET_PREFIX)
                                                          and path[len(ASSET_PREFIX):] in ASSETS))


def _file(name: str, media_type: str) -> Response:
    try:
        body = (STATIC / name).read_bytes()
    except OSError:  # a broken install: say which file is missing (where: in the server's log only)
        log.error("the web page's file %s is missing from %s: reinstall fun-asr", name, STATIC)
        raise StarletteHTTPException(500, f"the web page's file {name} is missing from this server's fun-asr "
                                          "package: reinstall fun-asr") from None
    return Response(body, media_type=media_type, headers=HEADERS)


def add_web_routes(app: FastAPI) -> None:
    """``GET /`` (the page; listed in the 404 message as ``GET /``) and ``GET /web/{name}`` (its files: a
    plain route, not listed) on ``app``."""

    @app.get("/", include_in_schema=False)
    async def page() -> Response:
        return _file(PAGE, "text/html; charset=utf-8")

    async def asset(request: Request) -> Response:
        name = request.path_params["name"]
        if name not in ASSETS:
            raise StarletteHTTPException(404)
        return _file(name, ASSETS[name])

    app.router.routes.append(Route(ASSET_PREFIX + "{name}", asset, methods=["GET"]))


__all__ = ["ASSETS", "add_web_routes", "is_page_request"]
