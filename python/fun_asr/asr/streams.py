"""A live stream from a Session (:meth:`fun_asr.Session.stream`): FunASR's realtime-server semantics
(:class:`fun_asr.asr.stream.Stream`) or Fun-ASR-Nano's streaming SDK (:class:`fun_asr.asr.chunked.ChunkedStream`),
its options checked before it starts."""

from __future__ import annotations

import inspect
from typing import Any

from fun_asr.asr.chunked import ChunkedOptions, ChunkedStream
from fun_asr.asr.option_table import default
from fun_asr.asr.stream import Stream, StreamOptions


def _stream_signature() -> inspect.Signature:
    """``Session.stream``'s parameters: the first three options by position, the rest by name."""
    p = inspect.Parameter
    named = {"max_new_tokens": None, "repetition_guard": default("repetition_guard"), "stream_options": None,
             "decoder": None, "mode": "vad", "chunk_ms": None, "rollback_chars": None}
    return inspect.Signature([p("self", p.POSITIONAL_OR_KEYWORD),
                              *(p(n, p.POSITIONAL_OR_KEYWORD, default=default(n))
                                for n in ("language", "itn", "hotwords")),
                              *(p(n, p.KEYWORD_ONLY, default=d) for n, d in named.items())])


STREAM_SIGNATURE = _stream_signature()


def open_stream(session: Any, *args: Any, **kwargs: Any) -> Any:
    """The stream :meth:`fun_asr.Session.stream` describes (``session`` checks its options and decodes); the
    arguments are :data:`STREAM_SIGNATURE`'s."""
    a = STREAM_SIGNATURE.bind(session, *args, **kwargs)
    a.apply_defaults()
    v = dict(a.arguments)
    if v["mode"] not in ("vad", "chunked"):
        raise ValueError(f"mode must be 'vad' (FunASR's realtime server: VAD sentences and partials) or "
                         f"'chunked' (Fun-ASR-Nano's streaming SDK: fixed and unfixed text), got {v['mode']!r}")
    return _chunked(session, v) if v["mode"] == "chunked" else _vad(session, v)


def _chunked(session: Any, v: dict[str, Any]) -> ChunkedStream:
    if v["decoder"] is not None:
        raise ValueError("mode='chunked' decodes with the fixed text forced as the answer's start; a "
                         "replacement decoder= is for mode='vad' only")
    if v["stream_options"] is not None and not isinstance(v["stream_options"], ChunkedOptions):
        raise TypeError(f"mode='chunked' takes stream_options=ChunkedOptions(...), got "
                        f"{type(v['stream_options']).__name__}")
    copts = v["stream_options"] or ChunkedOptions()
    copts = copts.replace(**{k: v[k] for k in ("chunk_ms", "rollback_chars", "max_new_tokens") if v[k] is not None})
    if copts.window_seconds > session.max_segment_seconds:
        raise ValueError(f"window_seconds ({copts.window_seconds:g}) is longer than the encoder's window "
                         f"({session.max_segment_seconds:.2f} s)")
    opts = session.options(v["language"], v["itn"], v["hotwords"], copts.max_new_tokens, copts.window_seconds,
                           v["repetition_guard"], vad=False)
    return ChunkedStream(session, opts, copts)


def _vad(session: Any, v: dict[str, Any]) -> Stream:
    if v["chunk_ms"] is not None or v["rollback_chars"] is not None:
        raise ValueError("chunk_ms and rollback_chars are options of mode='chunked' (Fun-ASR-Nano's streaming "
                         "SDK); mode='vad' takes stream_options=StreamOptions(...)")
    max_new_tokens = default("max_new_tokens") if v["max_new_tokens"] is None else v["max_new_tokens"]
    opts = session.options(v["language"], v["itn"], v["hotwords"], max_new_tokens,
                           repetition_guard=v["repetition_guard"])
    # a partial never needs more tokens than a closed sentence (FunASR: 200 and 512)
    sopts = v["stream_options"] or StreamOptions(max_new_tokens=max_new_tokens,
                                                 partial_max_new_tokens=min(200, max_new_tokens))
    return Stream(session, opts, sopts, v["decoder"])
