"""The server's shared state (:class:`ServerContext`: the Session, the server's settings, the batcher once the
app has started) and the steps every HTTP route shares: an upload read within ``--max-upload-mb``
(:func:`read_upload`), decoded off the event loop and transcribed through the batcher (:func:`transcribe_upload`),
and a segment's word times as OpenAI and FunASR give them (:func:`segment_words`)."""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass, field
from typing import Any

import anyio
from starlette.datastructures import UploadFile

from fun_asr.asr.session import Session, Transcription
from fun_asr.audio.decode import AudioError
from fun_asr.notices import Notice
from fun_asr.serve.core.batcher import Batcher, decode_batch_item
from fun_asr.serve.core.errors import RETRY_AFTER_SECONDS, ApiError, client_words, upload_too_large
from fun_asr.serve.core.requests import DecodeRequest
from fun_asr.serve.words import ClientWords

log = logging.getLogger("fun_asr.server")
# notices about the Session, not the request: logged once by the Session, still in every response
SESSION_WIDE = frozenset({"no_vad", "word_timestamps_unavailable", "language_unknown"})


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
        raise upload_too_large(ctx.max_upload_mb)
    if not data:
        raise ApiError(400, "the uploaded file is empty", "file", "empty_file")
    return data


async def transcribe_upload(ctx: ServerContext, data: bytes, name: str, request: DecodeRequest) -> Transcription:
    """Decodes an upload off the event loop and transcribes it through the shared batcher (with ``request``'s
    options): 400 for audio that cannot be read, 429 past ``--max-queue`` waiting requests (answered with
    ``Retry-After``: :func:`~fun_asr.serve.core.errors.error_headers`), 504 past ``--request-timeout``. The result's
    warnings are logged once, here (as they are), then put in the client's words (no server paths:
    :class:`~fun_asr.serve.words.ClientWords`; codes unchanged)."""
    try:
        samples, info = await anyio.to_thread.run_sync(decode_batch_item, data, name)
    except AudioError as exc:
        raise ApiError(400, client_words(exc), "file", "invalid_audio") from None
    batcher = ctx.batcher
    assert batcher is not None
    if batcher.jobs.qsize() >= ctx.max_queue:
        raise ApiError(429, f"server busy: {batcher.jobs.qsize()} requests are waiting (limit {ctx.max_queue}); "
                            f"retry in {RETRY_AFTER_SECONDS} s (Retry-After)", None, "rate_limit_exceeded",
                       "rate_limit_error")
    fut = batcher.submit(samples, request, name)
    try:
        result: Transcription = await asyncio.wait_for(asyncio.wrap_future(fut), timeout=ctx.request_timeout)
    except asyncio.TimeoutError:
        fut.cancel()
        raise ApiError(504, f"the transcription took longer than {ctx.request_timeout:g} s", None, "timeout",
                       "server_error") from None
    except ValueError as exc:
        raise ApiError(400, client_words(exc), None, "invalid_value") from None
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
    """A segment's word (CTC token) times as OpenAI and FunASR give them: ``{"word", "start", "end"}`` (s), plus
    the decoder's ``probability`` of the word (faster-whisper's field) where it has one."""
    return [{"word": w["word"], "start": w["start"], "end": w["end"],
             **({"probability": w["probability"]} if w.get("probability") is not None else {})}
            for w in (segment.words or [])]


def segment_confidence(segment: Any) -> dict[str, Any]:
    """A segment's confidence fields as OpenAI's verbose_json names them: ``avg_logprob`` (the mean token
    log-probability), ``compression_ratio`` (Whisper's) and ``no_speech_prob`` (the VAD's mean silence probability
    over the segment; None where no VAD cut it)."""
    return {"avg_logprob": segment.avg_logprob, "compression_ratio": segment.compression_ratio,
            "no_speech_prob": segment.no_speech_prob}


__all__ = ["SESSION_WIDE", "ServerContext", "read_upload", "segment_confidence", "segment_words", "transcribe_upload"]
