"""A live stream from a Session (:meth:`fun_asr.Session.stream`): FunASR's realtime-server semantics
(:class:`fun_asr.asr.stream.Stream`) or Fun-ASR-Nano's streaming SDK (:class:`fun_asr.asr.chunked.ChunkedStream`),
its options checked before it starts."""

from __future__ import annotations

from typing import Any

from fun_asr.asr.chunked import ChunkedOptions, ChunkedStream
from fun_asr.asr.stream import Stream, StreamOptions


def open_stream(session: Any, language: str | None = None, itn: bool = True,
                hotwords: list[str] | str | None = None, *, max_new_tokens: int | None = None,
                repetition_guard: bool = True, stream_options: Any = None, decoder: Any = None, mode: str = "vad",
                chunk_ms: int | None = None, rollback_chars: int | None = None) -> Any:
    """The stream :meth:`fun_asr.Session.stream` describes (``session`` checks its options and decodes)."""
    if mode not in ("vad", "chunked"):
        raise ValueError(f"mode must be 'vad' (FunASR's realtime server: VAD sentences and partials) or "
                         f"'chunked' (Fun-ASR-Nano's streaming SDK: fixed and unfixed text), got {mode!r}")
    if mode == "chunked":
        if decoder is not None:
            raise ValueError("mode='chunked' decodes with the fixed text forced as the answer's start; a "
                             "replacement decoder= is for mode='vad' only")
        if stream_options is not None and not isinstance(stream_options, ChunkedOptions):
            raise TypeError(f"mode='chunked' takes stream_options=ChunkedOptions(...), got "
                            f"{type(stream_options).__name__}")
        copts = stream_options or ChunkedOptions()
        given = {k: v for k, v in (("chunk_ms", chunk_ms), ("rollback_chars", rollback_chars),
                                   ("max_new_tokens", max_new_tokens)) if v is not None}
        copts = copts.replace(**given)
        if copts.window_seconds > session.max_segment_seconds:
            raise ValueError(f"window_seconds ({copts.window_seconds:g}) is longer than the encoder's window "
                             f"({session.max_segment_seconds:.2f} s)")
        opts = session.options(language, itn, hotwords, copts.max_new_tokens, copts.window_seconds,
                               repetition_guard, vad=False)
        return ChunkedStream(session, opts, copts)
    if chunk_ms is not None or rollback_chars is not None:
        raise ValueError("chunk_ms and rollback_chars are options of mode='chunked' (Fun-ASR-Nano's streaming "
                         "SDK); mode='vad' takes stream_options=StreamOptions(...)")
    max_new_tokens = 512 if max_new_tokens is None else max_new_tokens
    opts = session.options(language, itn, hotwords, max_new_tokens, 30.0, repetition_guard)
    # a partial never needs more tokens than a closed sentence (FunASR: 200 and 512)
    sopts = stream_options or StreamOptions(max_new_tokens=max_new_tokens,
                                            partial_max_new_tokens=min(200, max_new_tokens))
    return Stream(session, opts, sopts, decoder)
