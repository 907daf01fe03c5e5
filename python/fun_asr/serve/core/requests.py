"""What one decode asks of the server's shared decoder: :class:`DecodeRequest`, the options the batcher
decodes with (``None``: the server's setting). Requests with equal options are decoded together."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class DecodeRequest:
    """The decoding options of one request to the batcher; equal requests share a decoding pass.

    ``max_new_tokens``, ``segment_seconds`` and ``vad`` left ``None`` are the server's settings
    (``--max-new-tokens``, ``--max-segment-seconds``, the Session's VAD); ``vad_kwargs`` are FunASR's VAD kwargs
    of a request (and ``diarize`` for ``spk``) as (name, value) pairs. Streams decode their VAD sentences with
    ``vad=False`` (the offline VAD does not run again)."""

    language: str | None = None
    itn: bool = True
    hotwords: tuple[str, ...] = ()
    max_new_tokens: int | None = None
    segment_seconds: float | None = None
    vad: bool | None = None
    word_timestamps: bool = False
    vad_kwargs: tuple[tuple[str, Any], ...] = ()


__all__ = ["DecodeRequest"]
