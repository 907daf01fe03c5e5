"""Errors in OpenAI's shape (``{"error": {"message", "type", "param", "code"}}``) and the request-field helpers
shared by the server's routes."""

from __future__ import annotations

from fastapi.responses import JSONResponse

from fun_asr.asr.messages import cli_words


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


def _words(exc: BaseException) -> str:
    """A Session/audio message in a client's words (request fields, the server's flags)."""
    return cli_words(str(exc), segment_flag="fun-asr-serve --max-segment-seconds",
                     max_audio_flag="fun-asr-serve --max-audio-seconds", hotwords="hotwords")

