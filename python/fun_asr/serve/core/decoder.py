"""The server's shared batched decoder as a stream's decode function (:class:`StreamDecoder`): every WebSocket
stream decodes its sentences and partials through the batcher, so concurrent streams share decoding passes."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from concurrent.futures import Future
from typing import Any

import numpy as np

from fun_asr.asr.confidence import mean_logprob
from fun_asr.asr.option_table import default
from fun_asr.audio.decode import SAMPLE_RATE
from fun_asr.serve.core.requests import DecodeRequest


class StreamDecoder:
    """A stream's decoder (``Session.stream(decoder=StreamDecoder(...).decode)``) on the server's batcher.

    ``submit`` is :meth:`~fun_asr.serve.core.batcher.Batcher.submit`; ``request`` the stream's options now (a
    :class:`DecodeRequest`, or a function giving it at each decode: a connection whose options change between
    decodes). Each decode asks for the given ``max_new_tokens``, a segment long enough for the audio (at least
    30 s, at most the Session's longest) and no VAD (the stream's VAD cut the sentence already); word
    timestamps, when the request asks for them, for closed sentences only. ``on_sentence`` gets each closed
    sentence's Transcription."""

    def __init__(self, submit: Callable[..., Future], session: Any,
                 request: DecodeRequest | Callable[[], DecodeRequest],
                 on_sentence: Callable[[Any], None] | None = None) -> None:
        self.submit, self.session, self.request, self.on_sentence = submit, session, request, on_sentence

    def decode(self, samples: np.ndarray, max_new_tokens: int, *, draft: list[int] | None = None,
               partial: bool = False, speculative: bool = False) -> tuple[str, list[int], float | None] | None:
        """(text, tokens, their mean log-probability) of ``samples``; None for a partial the batcher skipped (busy
        with closed sentences: the stream keeps its previous partial and asks again)."""
        base = self.request if isinstance(self.request, DecodeRequest) else self.request()
        seconds = min(self.session.max_segment_seconds,
                      max(default("segment_seconds"), samples.size / SAMPLE_RATE + 1.0))
        request = dataclasses.replace(base, max_new_tokens=max_new_tokens, segment_seconds=seconds, vad=False,
                                      word_timestamps=base.word_timestamps and not partial)
        result = self.submit(samples, request, "stream", draft, partial, speculative).result()
        if result is None:
            return None
        if not partial and self.on_sentence is not None:
            self.on_sentence(result)
        return result.text, [t for s in result.segments for t in s.tokens], mean_logprob(result.segments)


__all__ = ["StreamDecoder"]
