"""Errors in OpenAI's shape (``{"error": {"message", "type", "param", "code"}}``) and, on FunASR's routes, in
FastAPI's shape as FunASR's servers answer (``{"detail": ...}``); and the request-field helpers shared by the
server's routes."""

from __future__ import annotations

from fastapi.responses import JSONResponse

from fun_asr.errors import render

# The routes that speak FunASR's offline HTTP protocol (serve/protocols/funasr_http): their errors are FastAPI's.
FUNASR_PATHS = ("/asr",)
UPLOAD_FLAG = "fun-asr-serve --max-upload-mb"  # what a 413 names: the limit a client cannot change itself
# Every 429 (past --max-queue) carries ``Retry-After`` with this many seconds: a fixed small value, since the
# decoder takes all waiting requests off the queue whenever a decoding slot frees or a batch ends (serve/core/
# batcher.py), so a place in the queue frees up within about one decoding step or batch.
RETRY_AFTER_SECONDS = 1


def upload_too_large(max_upload_mb: float, size: int | None = None) -> ApiError:
    """The 413 of an upload over the limit (every route's), naming the server's flag; ``size``: the bytes the
    request declared, where known."""
    what = "upload" if size is None else f"upload of {size} bytes"
    return ApiError(413, f"{what} exceeds the limit of {max_upload_mb:g} MB ({UPLOAD_FLAG})", "file",
                    "file_too_large")


def speaker_options(session: object, spk: bool) -> tuple[tuple[str, bool], ...]:
    """``spk=true``: the ``diarize`` kwarg for the batcher, after checking that the server has a speaker model
    (ApiError 400 naming how to give one: fun-asr-serve --speaker-model); ``spk=false``: none."""
    if not spk:
        return ()
    try:
        session.options(diarize=True)  # type: ignore[attr-defined]  # loads the speaker model on first use
    except (ValueError, OSError) as exc:
        raise ApiError(400, f"spk=true: {render(exc, 'http-client')}", "spk", "unsupported_value") from None
    return (("diarize", True),)


class ApiError(Exception):
    def __init__(self, status: int, message: str, param: str | None = None, code: str | None = None,
                 kind: str = "invalid_request_error") -> None:
        super().__init__(message)
        self.status, self.message, self.param, self.code, self.kind = status, message, param, code, kind


def error_headers(status: int) -> dict[str, str] | None:
    """The headers an error answer carries: ``Retry-After`` (:data:`RETRY_AFTER_SECONDS`) on a 429."""
    return {"Retry-After": str(RETRY_AFTER_SECONDS)} if status == 429 else None


def _error(status: int, message: str, param: str | None = None, code: str | None = None,
           kind: str = "invalid_request_error") -> JSONResponse:
    return JSONResponse(status_code=status, headers=error_headers(status),
                        content={"error": {"message": message, "type": kind, "param": param, "code": code}})


def is_funasr_path(path: str) -> bool:
    """Whether a request path is one of FunASR's routes (errors as ``{"detail": ...}``)."""
    return path.rstrip("/") in FUNASR_PATHS


def detail_error(status: int, message: str) -> JSONResponse:
    """An error as FastAPI's HTTPException answers it (FunASR's servers): ``{"detail": "message"}``."""
    return JSONResponse(status_code=status, headers=error_headers(status), content={"detail": message})


def error_for(path: str, status: int, message: str, param: str | None = None, code: str | None = None,
              kind: str = "invalid_request_error") -> JSONResponse:
    """The error in the shape of the route it answers: FunASR's on FunASR's routes, else OpenAI's (every route's
    429 with ``Retry-After``: :func:`error_headers`)."""
    if is_funasr_path(path):
        return detail_error(status, message)
    return _error(status, message, param, code, kind)


def form_bool(value: str | None, name: str, default: bool) -> bool:
    if value is None or value == "":
        return default
    v = value.strip().lower()
    if v in ("1", "true", "yes", "on"):
        return True
    if v in ("0", "false", "no", "off"):
        return False
    raise ApiError(400, f"{name} must be true or false, got {value!r}", name, "invalid_value")


def client_words(exc: BaseException) -> str:
    """A Session/audio error in an HTTP client's words (:func:`fun_asr.errors.render`: request fields, the
    server's flags; the app's error handlers also hide server paths: :class:`fun_asr.serve.words.ClientWords`)."""
    return render(exc, "http-client")
