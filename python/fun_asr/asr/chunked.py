"""Chunked streaming (``Session.stream(mode="chunked")``): Fun-ASR-Nano's streaming SDK, fixed and unfixed text.

FunASR's ``FunASRNanoStreamingVLLM.streaming_generate`` (``funasr/models/fun_asr_nano/inference_vllm_streaming.py``,
run by Fun-ASR's ``examples/streaming_sdk.py``) and the torch loop of Fun-ASR's ``demo2.py``: every ``chunk_ms``
(720 ms) of audio, the whole audio so far is encoded again (cumulative re-encoding) and decoded with the text
already fixed given as the start of the assistant's answer (``prev_text``); the answer's last ``rollback_chars``
(8) characters stay *unfixed* (they may change with more audio), the rest becomes *fixed*. Each result is the
SDK's ``{"text", "fixed_text", "is_final", "chunk_idx", "audio_duration_ms"}``; at the end everything is fixed.

What is kept exactly: 720 ms chunks measured on the audio clock, the whole audio re-encoded each chunk, the
greedy decode of at most ``max_new_tokens`` (200) per chunk, ``rollback_chars`` (8) characters held back once
the text is "meaningful" and longer than that, the fixed text as the assistant prefix (``prev_text``), the
final result with everything fixed.

What differs, and why:

- **The fixed text is never rewritten.** The vLLM engine decodes its first 10 chunks independently (its fixed
  text can shrink or change between chunks) because it batches every chunk of a file into one call after the
  fact; a live stream cannot. Here, as in ``demo2.py``, every chunk is decoded with the fixed text forced as
  the answer's start, so later text can only extend it. It is forced as the *token ids* the model produced
  (not re-tokenized text), and the cut is moved back to a token boundary (so at least ``rollback_chars`` are
  held back, never half a token or half a UTF-8 character): with greedy decoding, a decode whose forced start
  is what the model would have produced anyway is token for token the unforced decode, so a short clip's
  final text equals ``Session.transcribe(audio, vad=False)`` whenever no fixed word had to be taken back.
- **"Meaningful" counts letters of any script.** The SDK fixes nothing until the text has 2 CJK characters
  (so English never gets fixed text before the end); here 2 letters or digits of any script (``str.isalnum``:
  for Chinese text the same test).
- **Bounded windows.** The SDK re-encodes everything from the start; a live stream cannot grow without limit.
  Once a window holds ``window_seconds`` (30 s) of audio, it is closed at its quietest 100 ms in the last
  ``search_seconds`` (5 s): that part's decode (forced with its fixed text) is fixed in full and a new window
  starts at the cut. To keep the cut behind the fixed text, a window stops fixing more text
  ``search_seconds`` before its limit.
- **No output cleaning.** The SDK strips tags and filler tokens (``<...>``, ``[noise]``, ``/sil``) from vLLM
  output; the text here is the decode as is (as ``Session.transcribe`` gives it). A decode stopped by the
  repetition guard fixes nothing new.
"""

from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np

from fun_asr.asr.language import is_cjk
from fun_asr.asr.option_table import OPTIONS
from fun_asr.asr.options import TranscribeOptions
from fun_asr.audio.decode import SAMPLE_RATE
from fun_asr.audio.live import LiveAudio
from fun_asr.audio.pauses import PauseSplitter


class _Tokenizer(Protocol):
    def encode_plain(self, text: str) -> list[int]: ...

    def decode(self, ids: list[int]) -> str: ...


class Session(Protocol):
    """What a chunked stream needs of :class:`fun_asr.Session` (which builds it; this module does not import it)."""

    tokenizer: _Tokenizer
    max_segment_seconds: float

    def _decode_audio(self, samples: np.ndarray, opts: TranscribeOptions, forced: list[int], max_new_tokens: int,
                      draft: list[int] | None = None) -> tuple[list[int], str, dict[str, float]]: ...


@dataclass(frozen=True)
class ChunkedOptions:
    """The streaming SDK's parameters (``FunASRNanoStreamingVLLM``: ``chunk_ms=720``, ``rollback_chars=8``,
    ``max_new_tokens=200``), then ours: the re-encoding window and an initial ``prev_text``."""

    chunk_ms: int = 720  # a decode every this much audio
    rollback_chars: int = 8  # characters at the end of the text that stay unfixed
    max_new_tokens: int = 200  # per chunk's decode
    # the most audio re-encoded at once (then the window closes at a pause)
    window_seconds: float = OPTIONS["segment_seconds"].default
    search_seconds: float = 5.0  # where the window's cut is looked for: its last this many seconds
    prev_text: str = ""  # text the answer starts with (FunASR's prev_text): fixed from the start

    def replace(self, **changes: Any) -> ChunkedOptions:
        out = dataclasses.replace(self, **changes)
        out.check()
        return out

    def check(self) -> None:
        for name in ("chunk_ms", "rollback_chars", "max_new_tokens"):
            v = getattr(self, name)
            low = 0 if name == "rollback_chars" else 1
            if isinstance(v, bool) or not isinstance(v, int) or v < low:
                raise ValueError(f"{name} must be an integer >= {low}, got {v!r}")
        for name in ("window_seconds", "search_seconds"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int | float) or not v > 0:
                raise ValueError(f"{name} must be a number of seconds > 0, got {v!r}")
        if self.chunk_ms > 60_000:
            raise ValueError(f"chunk_ms must be at most 60000, got {self.chunk_ms}")
        if self.window_seconds * 1000 < 4 * self.chunk_ms:
            raise ValueError(f"window_seconds ({self.window_seconds:g}) must hold at least 4 chunks of chunk_ms "
                             f"({self.chunk_ms} ms)")
        if self.search_seconds > self.window_seconds / 2:
            raise ValueError(f"search_seconds ({self.search_seconds:g}) must be at most half of window_seconds "
                             f"({self.window_seconds:g})")
        if not isinstance(self.prev_text, str):
            raise TypeError(f"prev_text must be a string, got {type(self.prev_text).__name__}")


@dataclass
class ChunkEvent:
    """One result of the stream, the SDK's dict: the whole ``text`` so far, its ``fixed_text`` (a prefix of
    ``text`` that no later event changes), ``is_final`` (the last event: everything fixed), ``chunk_idx``
    (1, 2, ...), ``audio_duration_ms`` (the audio decoded for it)."""

    text: str
    fixed_text: str
    is_final: bool
    chunk_idx: int
    audio_duration_ms: float

    @property
    def unfixed_text(self) -> str:
        """The end of ``text`` that may still change."""
        return self.text[len(self.fixed_text):]

    def to_dict(self) -> dict[str, Any]:
        return {"text": self.text, "fixed_text": self.fixed_text, "is_final": self.is_final,
                "chunk_idx": self.chunk_idx, "audio_duration_ms": self.audio_duration_ms}


def _meaningful(text: str) -> bool:
    """The SDK's ``_is_meaningful`` (at least 2 CJK characters), for any script: 2 letters or digits."""
    return sum(ch.isalnum() for ch in text) >= 2


def _join(a: str, b: str) -> str:
    """Two windows' texts as one: no space between CJK characters, one otherwise."""
    if not a or not b:
        return a or b
    return a + ("" if is_cjk(a[-1]) and is_cjk(b[0]) else " ") + b


class ChunkedStream:
    """One live stream in chunked mode (see the module docstring). Not thread-safe: feed it from one thread.

    :meth:`feed` takes audio (numpy arrays as ``Session.transcribe`` takes them: mono or ``[samples, channels]``
    / ``[channels, samples]``, float in [-1, 1] or int16/int32 PCM, channels averaged; or raw little-endian int16
    bytes; at any sample rate) and returns a :class:`ChunkEvent` for every ``chunk_ms`` boundary the audio crossed;
    :meth:`close` decodes the rest and returns the final event (everything fixed)."""

    def __init__(self, session: Session, opts: TranscribeOptions, chunked: ChunkedOptions | None = None) -> None:
        self.session = session
        self.opts = opts
        self.copts = chunked or ChunkedOptions()
        self.copts.check()
        if self.copts.window_seconds > session.max_segment_seconds:
            raise ValueError(f"window_seconds ({self.copts.window_seconds:g}) is longer than the encoder's window "
                             f"({session.max_segment_seconds:.2f} s)")
        self._chunk = SAMPLE_RATE * self.copts.chunk_ms // 1000
        self._splitter = PauseSplitter(self.copts.window_seconds, self.copts.search_seconds)
        self._freeze = self._splitter.max_len - self._splitter.search  # no more fixing past this (window-relative)
        self._input = LiveAudio()  # pieces at any fixed rate -> 16 kHz
        self._buf = np.zeros(0, np.float32)  # audio from absolute sample self._wstart (the window's start) on
        self._wstart = 0
        self.received = 0  # 16 kHz samples received
        self._next = self._chunk  # the next chunk boundary (absolute sample)
        self._committed = ""  # the text of the closed windows
        self._fixed: list[int] = self.session.tokenizer.encode_plain(self.copts.prev_text)  # this window's
        self._last: tuple[int, list[int]] | None = None  # (end sample, all tokens) of the window's last decode
        self.chunk_idx = 0
        self.cuts: list[int] = []  # where windows were closed (absolute 16 kHz samples)
        self.last: ChunkEvent | None = None  # the latest event
        self.closed = False
        # what it cost and how the text behaved
        self._stats = {"decodes": 0, "encoded_seconds": 0.0, "encode_ms": 0.0, "decode_ms": 0.0, "forced_tokens": 0,
                       "new_tokens": 0, "windows": 1, "rewrites": 0, "rewritten_chars": 0, "decode_passes": 0,
                       "draft_proposed": 0, "draft_accepted": 0}
        self._first_fixed_ms: float | None = None

    # -- input ---------------------------------------------------------------------------------------

    def _to_16k(self, pcm: Any, sample_rate: int) -> np.ndarray:
        return self._input.to_16k(pcm, sample_rate)

    def feed(self, pcm: Any, sample_rate: int = SAMPLE_RATE) -> list[ChunkEvent]:
        """More audio; returns one event per ``chunk_ms`` boundary it crossed (none while a chunk fills)."""
        if self.closed:
            raise RuntimeError("the stream is closed")
        self._append(self._to_16k(pcm, sample_rate))
        events = []
        while self.received >= self._next:
            events.append(self._step(self._next, final=False))
            self._next += self._chunk
        return events

    def close(self) -> list[ChunkEvent]:
        """End of audio: decodes what came after the last chunk boundary; the final event has everything fixed."""
        if self.closed:
            return []
        tail = self._input.flush()
        if tail.size:
            self._append(tail)
        events = []
        while self.received >= self._next:  # (the resampler's tail may complete a chunk)
            events.append(self._step(self._next, final=False))
            self._next += self._chunk
        events.append(self._step(self.received, final=True))
        self.closed = True
        self._buf = np.zeros(0, np.float32)
        return events

    # aliases in the style of other streaming APIs
    push = feed
    finish = close

    def _append(self, x: np.ndarray) -> None:
        if x.size:
            self._buf = np.concatenate([self._buf, x]) if self._buf.size else x.copy()
            self.received += x.size

    # -- the chunk loop --------------------------------------------------------------------------------

    def _audio(self, a: int, b: int) -> np.ndarray:
        return self._buf[a - self._wstart : b - self._wstart]

    def _decode(self, end: int) -> tuple[list[int], str]:
        """The window's audio up to ``end`` decoded with its fixed tokens forced: (all tokens, stop reason)."""
        audio = self._audio(self._wstart, end)
        # The window's previous decode, past the fixed tokens, is the draft of this one: lossless
        # speculative decoding (the same tokens; most of them verified several per decoder pass).
        n = len(self._fixed)
        draft = self._last[1][n:] if self._last is not None and self._last[1][:n] == self._fixed else None
        new, reason, t = self.session._decode_audio(audio, self.opts, self._fixed, self.copts.max_new_tokens,
                                                    draft=draft)
        st = self._stats
        st["decodes"] += 1
        st["decode_passes"] += int(t.get("decode_passes", 0))
        st["draft_proposed"] += int(t.get("draft_proposed", 0))
        st["draft_accepted"] += int(t.get("draft_accepted", 0))
        st["encoded_seconds"] += audio.size / SAMPLE_RATE
        st["encode_ms"] += t["encode_ms"]
        st["decode_ms"] += t["decode_ms"]
        st["forced_tokens"] += len(self._fixed)
        st["new_tokens"] += len(new)
        return self._fixed + new, reason

    def _text(self, ids: list[int]) -> str:
        return self.session.tokenizer.decode(ids).strip()

    def _close_window(self, end: int) -> None:
        """The window holds more than window_seconds: cut it at its quietest point, fix its text in full, start
        the next window at the cut."""
        spans = self._splitter.cuts(self._audio(self._wstart, end), self._wstart)
        for a, cut in spans:
            ids, _ = self._decode(cut)
            self._committed = _join(self._committed, self._text(ids))
            self._fixed = []
            self._last = None
            self._buf = self._buf[cut - a :]
            self._wstart = cut
            self.cuts.append(cut)
            self._stats["windows"] += 1

    def _fix(self, ids: list[int], text: str) -> list[int]:
        """The longest token prefix of ``ids`` (at least the fixed ones) whose text leaves the last
        ``rollback_chars`` characters of ``text`` unfixed and ends on a whole character."""
        n = len(self._fixed)
        if len(text) <= self.copts.rollback_chars or not _meaningful(text):
            return self._fixed
        limit = len(text) - self.copts.rollback_chars
        best = n
        for k in range(n + 1, len(ids) + 1):
            t = self._text(ids[:k])
            if len(t) > limit:
                break
            if not t.endswith("\ufffd"):
                best = k
        return ids[:best]

    def _step(self, end: int, final: bool) -> ChunkEvent:
        if end - self._wstart > self._splitter.max_len:
            self._close_window(end)
        if self._last is not None and self._last[0] == end:
            ids, reason = self._last[1], "reused"  # nothing new since the last decode: the same decode
        else:
            ids, reason = self._decode(end)
            self._last = (end, ids)
        window_text = self._text(ids)
        if final:
            self._fixed = ids
        elif end - self._wstart <= self._freeze and reason != "repetition":
            self._fixed = self._fix(ids, window_text)
        text = _join(self._committed, window_text)
        fixed = _join(self._committed, self._text(self._fixed))
        if not text.startswith(fixed):  # (not reached: the fixed tokens start every decode of the window)
            raise RuntimeError(f"chunked stream: fixed text {fixed!r} is not the start of {text!r}")
        self.chunk_idx += 1
        ev = ChunkEvent(text, fixed, final, self.chunk_idx, end * 1000 / SAMPLE_RATE)
        if self.last is not None:
            prev = self.last.text
            if not text.startswith(prev):
                self._stats["rewrites"] += 1
                self._stats["rewritten_chars"] += len(prev) - len(os.path.commonprefix([prev, text]))
        if fixed and not final and self._first_fixed_ms is None:
            self._first_fixed_ms = ev.audio_duration_ms
        self.last = ev
        return ev

    # -- results -------------------------------------------------------------------------------------

    @property
    def text(self) -> str:
        return self.last.text if self.last is not None else ""

    @property
    def fixed_text(self) -> str:
        return self.last.fixed_text if self.last is not None else ""

    @property
    def duration_ms(self) -> float:
        return self.received * 1000 / SAMPLE_RATE

    def stats(self) -> dict[str, Any]:
        """What the stream cost and how its text behaved: ``decodes``, ``encoded_seconds`` (audio through the
        encoder, re-encoding included), ``encode_ms``/``decode_ms`` (wall time), ``forced_tokens`` (fixed
        tokens prefilled again), ``new_tokens``, ``decode_passes`` (decoder graphs after the prefills),
        ``draft_proposed``/``draft_accepted`` (the previous decode's tokens verified as a draft / kept),
        ``windows``, ``rewrites`` (events whose text did not extend
        the previous one's: the unfixed part changed), ``rewritten_chars`` (characters taken back),
        ``first_fixed_ms`` (audio time of the first event with fixed text; None: none before the end),
        ``audio_seconds``."""
        st = dict(self._stats)
        st["encode_ms"] = round(st["encode_ms"], 3)
        st["decode_ms"] = round(st["decode_ms"], 3)
        st["encoded_seconds"] = round(st["encoded_seconds"], 3)
        st["first_fixed_ms"] = self._first_fixed_ms
        st["audio_seconds"] = self.received / SAMPLE_RATE
        return st


__all__ = ["ChunkEvent", "ChunkedOptions", "ChunkedStream"]
