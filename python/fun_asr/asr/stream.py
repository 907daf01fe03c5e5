"""Real-time streaming (``Session.stream()``): FunASR 1.4.16's realtime-server semantics (docs/streaming.md).

Audio arrives in chunks of any size. Every 60 ms of it goes through the streaming FSMN-VAD with the
realtime server's end-silence schedule (``DynamicStreamingVAD``: 2000 ms of silence closes a sentence
that has lasted up to 5 s, ... 100 ms once it passes 45 s); a sentence the VAD closes is decoded in
full (``max_new_tokens`` 512, repetition guard) and reported once as a ``sentence`` event; while a
sentence is open it is re-decoded for ``partial`` events — first once 480 ms have arrived (and the
open sentence holds at least 480 ms), then every 960 ms — over at most its last 8 s with a 200-token
cap. The text of a closed sentence is exactly what ``Session.transcribe`` gives for that piece of audio
(the same decode). Times are integer milliseconds from the start of the stream.

The decisions are made on the audio's own clock (every 60 ms step), never on how it was chunked, so
feeding a file in pieces of 10 ms, 1 s or all at once gives the same sentences.

``StreamOptions(endpoint="client")`` is FunASR's client endpoint mode (``realtime_ws.py --endpoint-mode
client``): no VAD runs; the caller ends each utterance with :meth:`Stream.commit` (the protocol's ``COMMIT``),
which decodes all audio since the previous commit as one sentence; partials follow the same schedule,
counted from the utterance's start. An utterance is bounded: once ``max_sentence_s`` (30 s, the VAD's forced
cut in server mode) of audio has come without a commit, the stream commits it itself, at that sample, and
records that commit's final result with a ``notice`` (:meth:`Stream.take_auto_commits`); FunASR's
``realtime_ws.py`` does not bound it (its buffer then grows until COMMIT).

The stream keeps the audio it may still decode (the open sentence, and ``lookback_s`` before it) as a list of
60 ms chunks, joined only for a decode, so each step costs the same however long the sentence has been open.
"""

from __future__ import annotations

import bisect
import math
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np

from fun_asr.asr.confidence import mean_logprob
from fun_asr.asr.option_table import OPTIONS
from fun_asr.asr.options import TranscribeOptions
from fun_asr.asr.results import Transcription
from fun_asr.audio.decode import SAMPLE_RATE
from fun_asr.audio.live import LiveAudio
from fun_asr.errors import SetupError, StateError
from fun_asr.vad.native import FsmnVad


class Session(Protocol):
    """What a stream needs of :class:`fun_asr.Session` (which builds streams; this module does not import it)."""

    vad: FsmnVad | None
    max_segment_seconds: float

    def transcribe(self, audio: Any, **kwargs: Any) -> Transcription: ...

# what a decode gives: (text, tokens), or (text, tokens, their mean log-probability: None without)
Decoded = tuple[str, list[int]] | tuple[str, list[int], float | None]


class Decoder(Protocol):
    """A stream's decode function (``Session.stream(decoder=...)``; the server plugs in its shared batched
    decoder, :class:`fun_asr.serve.core.decoder.StreamDecoder`): the 16 kHz ``samples`` decoded with at most
    ``max_new_tokens`` new tokens.

    ``draft``: the open sentence's previous partial tokens (None: none yet): lossless speculative decoding
    (``Session.transcribe(draft=)``), the same tokens as without it; a decoder may ignore it. ``partial``: whether
    this decode is a partial; a decoder may answer a partial with None ("skipped": the server's decoder is busy
    with closed sentences or the request went stale in its queue), and the stream then keeps its previous partial
    and asks again with the next 60 ms of audio. A closed sentence is never skipped. ``speculative``: the partial
    is a speculative closing decode (:attr:`StreamOptions.speculate_silence_ms`): probably a sentence's decode,
    worth decoding before other partials (the server's batcher does). A function that takes only the samples and
    the token cap is made one by :func:`plain_decoder`."""

    def __call__(self, samples: np.ndarray, max_new_tokens: int, /, *, draft: list[int] | None = None,
                 partial: bool = False, speculative: bool = False) -> Decoded | None: ...


class PlainDecoder(Protocol):
    """A decode function that takes only the samples and the token cap (no draft, and it is not told which decodes
    are partials): :func:`plain_decoder` makes it a :class:`Decoder`."""

    def __call__(self, samples: np.ndarray, max_new_tokens: int, /) -> Decoded | None: ...


def plain_decoder(fn: PlainDecoder) -> Decoder:
    """``fn`` as a :class:`Decoder` that leaves the draft and the partial and speculative flags out."""

    def decode(samples: np.ndarray, max_new_tokens: int, /, *, draft: list[int] | None = None,
               partial: bool = False, speculative: bool = False) -> Decoded | None:
        return fn(samples, max_new_tokens)

    return decode


@dataclass
class StreamEvent:
    """``partial``: the open sentence's current text (it may still change), from ``start`` to the audio
    so far (``end``); ``sentence``: a closed sentence, final, with its token ids."""

    type: str  # "partial" | "sentence"
    text: str
    start: int  # ms from stream start
    end: int  # ms
    tokens: list[int] = field(default_factory=list)
    speaker: int | None = None  # with a speaker tracker: the sentence's speaker (FunASR's "spk")
    # a sentence's mean token log-probability (Segment.avg_logprob over its tokens), where the decoder gave one
    avg_logprob: float | None = None

    @property
    def confidence(self) -> float | None:
        """exp(avg_logprob): the geometric mean of the sentence's token probabilities, in (0, 1] (None without)."""
        return None if self.avg_logprob is None else math.exp(self.avg_logprob)

    def to_dict(self) -> dict[str, Any]:
        d: dict[str, Any] = {"type": self.type, "text": self.text, "start": self.start, "end": self.end}
        if self.type == "sentence":
            d["tokens"] = list(self.tokens)
            if self.speaker is not None:
                d["spk"] = self.speaker
            if self.avg_logprob is not None:
                d["avg_logprob"] = self.avg_logprob
        return d


@dataclass(frozen=True)
class StreamOptions:
    """FunASR 1.4.16 realtime-server constants (``RealtimeASRSession``), all overridable."""

    first_partial_ms: int = 480  # first partial decode once this much audio arrived
    partial_interval_ms: int = 960  # then every this much
    partial_window_s: float = 8.0  # partials re-decode at most the open sentence's last 8 s
    partial_max_new_tokens: int = 200
    max_new_tokens: int = OPTIONS["max_new_tokens"].default  # a closed sentence
    min_sentence_ms: int = 100  # FunASR skips closed segments under 1600 samples
    lookback_s: float = 5.0  # audio kept before the open sentence (the VAD reports starts late)
    vad_chunk_ms: int = 60
    # the VAD's forced cut (max_single_segment_time); client endpoints: auto-commit
    max_sentence_s: float = OPTIONS["segment_seconds"].default
    endpoint: str = "server"  # "server": the VAD ends sentences; "client": commit() does (FunASR's COMMIT)
    # Speculative closing decode: once the open sentence has been silent this long, its partial decodes the
    # sentence as the VAD would close it if the silence went on (VadStream.predicted_end); when the VAD does
    # close it there, that decode is the sentence's (the same audio and token limit: the same tokens). 0 = off.
    speculate_silence_ms: int = 200
    speculate_max_s: float = 15.0  # sentences longer than this are not speculated on (a wrong guess costs more)

    def check(self) -> None:
        for name in ("first_partial_ms", "partial_interval_ms", "partial_max_new_tokens", "max_new_tokens",
                     "vad_chunk_ms"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise ValueError(f"{name} must be a positive integer, got {v!r}")
        v = self.speculate_silence_ms
        if isinstance(v, bool) or not isinstance(v, int) or v < 0:
            raise ValueError(f"speculate_silence_ms must be an integer >= 0 (0 = off), got {v!r}")
        if not self.partial_window_s > 0 or not self.max_sentence_s >= 1:
            raise ValueError("partial_window_s must be > 0 and max_sentence_s >= 1")
        if not self.speculate_max_s > 0:
            raise ValueError(f"speculate_max_s must be > 0, got {self.speculate_max_s!r}")
        if self.endpoint not in ("server", "client"):
            raise ValueError(f"endpoint must be 'server' (the VAD ends sentences) or 'client' (commit() does), got "
                             f"{self.endpoint!r}")


def _percentiles(values: list[float]) -> dict[str, float | int]:
    if not values:
        return {"count": 0}
    a = np.asarray(values, dtype=np.float64)
    return {"count": len(values), "p50": round(float(np.percentile(a, 50)), 1),
            "p95": round(float(np.percentile(a, 95)), 1), "max": round(float(a.max()), 1)}


class Stream:
    """One live audio stream (see the module docstring). Not thread-safe: feed it from one thread."""

    def __init__(self, session: Session, opts: TranscribeOptions, stream_opts: StreamOptions | None = None,
                 decoder: Decoder | None = None, speakers: Any = None) -> None:
        self.sopts = stream_opts or StreamOptions()
        self.sopts.check()
        self.client_endpoints = self.sopts.endpoint == "client"
        if session.vad is None and not self.client_endpoints:
            raise SetupError("stream.needs_vad", "{h[stream_vad]}", option="vad_model")
        self.session = session
        self.opts = opts
        self._decode_fn: Decoder = decoder or self._decode_local
        # the open sentence's latest partial tokens: the draft of its next decode (partial or closing)
        self._draft: list[int] | None = None
        # applied to each closed sentence's text (the server's POSTPROCESS_HOTWORDS); tokens stay as decoded
        self.postprocess: Callable[[str], str] | None = None
        # FunASR's realtime speakers (--enable-spk): a fun_asr.speakers.tracker.SpeakerTracker gives each closed
        # sentence a speaker as it closes, and re-clusters them all at close()/commit() (the final result)
        self.speakers: Any = speakers
        self._vad: Any = None
        if not self.client_endpoints:
            import dataclasses

            assert session.vad is not None
            cfg = dataclasses.replace(session.vad.cfg,
                                      max_single_segment_ms=int(round(self.sopts.max_sentence_s * 1000)))
            self._vad = session.vad.stream(self.sopts.vad_chunk_ms, cfg, schedule="server")
        self._step = SAMPLE_RATE * self.sopts.vad_chunk_ms // 1000
        self._pending = np.zeros(0, np.float32)  # < one VAD step, not yet processed
        self._chunks: deque[np.ndarray] = deque()  # audio from absolute sample _buf_start to total_samples
        self._buf_start = 0
        self._max_utterance = int(self.sopts.max_sentence_s * SAMPLE_RATE)  # client endpoints: auto-commit here
        self.total_samples = 0  # processed (VAD'd) samples
        self._received = 0  # samples received (processed + pending)
        self._input = LiveAudio()  # pieces at any fixed rate -> 16 kHz
        self.speech_start: int | None = None  # ms, the open sentence's start (VAD)
        self._last_decode = 0
        self._first_decode_done = False
        self.sentences: list[StreamEvent] = []
        self.partial: StreamEvent | None = None
        self.closed = False
        self._arrivals: list[tuple[int, float]] = []  # (samples received after a feed, wall time it began)
        self._sentence_delays: list[float] = []  # speech end arrived -> sentence event (VAD end silence included)
        self._close_delays: list[float] = []  # the audio that closed the sentence arrived -> sentence event
        self._first_partial_delays: list[float] = []
        self.partials_decoded = 0  # partial decodes made
        self.partials_skipped = 0  # partial decodes a busy decoder skipped (the decoder's choice; see Decoder)
        self.sentences_speculated = 0  # closed sentences whose decode was the speculative partial's (no wait)
        # the last speculative decode: (start_ms, end_ms, options) of the sentence it assumed, its (text, tokens);
        # options: the stream's TranscribeOptions then (a server that changes them mid-sentence replaces them)
        self._spec: tuple[tuple[int, int, Any], tuple[Any, ...]] | None = None
        self._partial_seen_for: int | None = None
        self._commit_mark = 0  # samples received when the last utterance was committed (client endpoints)
        self._committed: list[StreamEvent] = []  # the last commit's sentence (client endpoints)
        self._auto_finals: list[dict[str, Any]] = []  # final results of automatic commits not taken yet

    # -- input ---------------------------------------------------------------------------------------

    def _to_16k(self, pcm: Any, sample_rate: int) -> np.ndarray:
        return self._input.to_16k(pcm, sample_rate)

    def feed(self, pcm: Any, sample_rate: int = SAMPLE_RATE) -> list[StreamEvent]:
        """More audio: a numpy array as ``Session.transcribe`` takes one (``[samples]``, ``[samples, channels]`` or
        ``[channels, samples]``; float in [-1, 1] or int16/int32 PCM; channels averaged, as transcribe does), or
        raw little-endian int16 mono bytes. Returns the events it caused (``sentence`` and ``partial``), in
        order; :meth:`close` returns the last ones."""
        if self.closed:
            raise RuntimeError("the stream is closed")
        t_in = time.perf_counter()
        x = self._to_16k(pcm, sample_rate)
        self._received += x.size
        self._arrivals.append((self._received, t_in))
        self._pending = np.concatenate([self._pending, x]) if self._pending.size else x
        events: list[StreamEvent] = []
        n = self._pending.size // self._step
        for i in range(n):  # a partial only for the newest audio: one that is already stale is not decoded
            events += self._process(self._pending[i * self._step : (i + 1) * self._step], final=False,
                                    partial_ok=i == n - 1)
        self._pending = self._pending[n * self._step :].copy()
        return events

    def close(self) -> list[StreamEvent]:
        """End of audio: flushes the VAD (FunASR's finalize), decodes the open sentence, returns the
        last events (client endpoints: commits the last utterance). Afterwards ``response(is_final=True)``
        is the final result."""
        if self.closed:
            return []
        tail = self._input.flush()
        if tail.size:
            self._received += tail.size
            self._pending = np.concatenate([self._pending, tail])
        if self.client_endpoints:
            events = self.commit()
        else:
            events = self._process(self._pending, final=True)
            self.sentences = self._finalize_speakers(self.sentences)
        self._pending = np.zeros(0, np.float32)
        self.closed = True
        self.partial = None
        return events

    def commit(self) -> list[StreamEvent]:
        """Client endpoints (FunASR's ``COMMIT``): ends the utterance: all audio received since the last
        commit is decoded as one sentence (none if under ``min_sentence_ms`` or no text); returns its
        event. Afterwards ``response(is_final=True)`` holds that sentence only, as FunASR's commit result."""
        if not self.client_endpoints:
            raise StateError("stream.endpoint", "{h[commit]} ends utterances in client endpoint mode "
                             "({o[endpoint=client]}); {h[its_vad]}", option="endpoint")
        if self.closed:
            raise RuntimeError("the stream is closed")
        events: list[StreamEvent] = []
        if self._pending.size:  # (may reach max_sentence_s: that commit comes first)
            events += self._process(self._pending, final=False, partial_ok=False)
            self._pending = np.zeros(0, np.float32)
        return events + self._end_utterance()

    def _end_utterance(self) -> list[StreamEvent]:
        events: list[StreamEvent] = []
        if self.speech_start is not None:
            events = self._close_sentence(self.speech_start, self.duration_ms)
        self._committed = self._finalize_speakers(events)
        self.speech_start = None
        self.partial = None
        self._chunks.clear()  # FunASR releases the utterance's audio
        self._buf_start = self.total_samples
        self._first_decode_done = False
        self._last_decode = self.total_samples
        self._commit_mark = self.total_samples  # all audio received up to here has been processed
        return events

    def _auto_commit(self) -> list[StreamEvent]:
        """Client endpoints: the utterance reached ``max_sentence_s`` without a commit: commit it here."""
        events = self._end_utterance()
        self._auto_finals.append({**self.response(is_final=True), "notice": (
            f"no COMMIT for {self.sopts.max_sentence_s:g} s of audio (the longest utterance): committed "
            "automatically here; the stream goes on")})
        return events

    def take_auto_commits(self) -> list[dict[str, Any]]:
        """Client endpoints: the final results (``response(is_final=True)`` then, plus ``notice``) of the
        utterances the stream committed itself at ``max_sentence_s`` since the last call, oldest first."""
        out, self._auto_finals = self._auto_finals, []
        return out

    @property
    def buffered_samples(self) -> int:
        """Samples the stream holds for decoding (the open sentence and the look-back before it)."""
        return self.total_samples - self._buf_start

    @property
    def uncommitted_samples(self) -> int:
        """Samples received since the last commit (or the start): what a ``COMMIT`` or ``STOP`` would end."""
        return self._received - self._commit_mark

    # -- the realtime loop ---------------------------------------------------------------------------

    @property
    def duration_ms(self) -> int:
        return self.total_samples * 1000 // SAMPLE_RATE

    def _process(self, piece: np.ndarray, final: bool, partial_ok: bool = True) -> list[StreamEvent]:
        if piece.size:
            self._chunks.append(piece.copy())  # a copy: `piece` may be a view of a whole frame
        self.total_samples += piece.size
        events: list[StreamEvent] = []
        if self.client_endpoints:  # no VAD: the utterance starts with its first audio (ClientEndpointVAD)
            if piece.size and self.speech_start is None:
                self.speech_start = (self.total_samples - piece.size) * 1000 // SAMPLE_RATE
            if (self.speech_start is not None
                    and self.total_samples - self.speech_start * SAMPLE_RATE // 1000 >= self._max_utterance):
                return events + self._auto_commit()
            if partial_ok and self._should_decode():
                events += self._partial()
            self._compact()
            return events
        if final:  # DynamicStreamingVAD.finalize(): 10 ms of zeros with is_final
            vad_events = self._vad.feed(np.concatenate([piece, np.zeros(SAMPLE_RATE // 100, np.float32)]),
                                        is_final=True)
        else:
            vad_events = self._vad.feed(piece)
        closed_any = False
        for beg, end in vad_events:
            if beg >= 0 and end == -1:
                self.speech_start = beg
                continue
            start = beg if beg >= 0 else (self.speech_start if self.speech_start is not None else 0)
            closed_any = True
            events += self._close_sentence(start, end)
            self.speech_start = None
        if final:
            if not closed_any and self.speech_start is not None:  # the server's tail fallback
                events += self._close_sentence(self.speech_start, self.duration_ms)
            self.speech_start = None
            return events
        spec = self._speculate() if partial_ok else None
        if spec is not None:
            events += spec
        elif partial_ok and self._should_decode():
            events += self._partial()
        self._compact()
        return events

    def _should_decode(self) -> bool:
        wait = self.sopts.partial_interval_ms if self._first_decode_done else self.sopts.first_partial_ms
        return self.total_samples - self._last_decode >= wait * SAMPLE_RATE // 1000

    def _slice(self, a: int, b: int) -> np.ndarray:
        """The held audio from absolute sample ``a`` to ``b`` (clipped to what is held), as one array."""
        lo, hi = max(a, self._buf_start), min(b, self.total_samples)
        if hi <= lo:
            return np.zeros(0, np.float32)
        parts: list[np.ndarray] = []
        end = self.total_samples
        for c in reversed(self._chunks):  # the newest first: partials want the end
            start = end - c.size
            if start < hi and end > lo:
                parts.append(c[max(0, lo - start) : min(c.size, hi - start)])
            if start <= lo:
                break
            end = start
        parts.reverse()
        return parts[0] if len(parts) == 1 else np.concatenate(parts)

    def _close_sentence(self, start_ms: int, end_ms: int) -> list[StreamEvent]:
        start_ms, end_ms = max(0, int(start_ms)), min(self.duration_ms, int(end_ms))
        self.partial = None
        self._partial_seen_for = None
        draft, self._draft = self._draft, None  # the next sentence starts without one
        audio = self._slice(start_ms * SAMPLE_RATE // 1000, end_ms * SAMPLE_RATE // 1000)
        if end_ms <= start_ms or audio.size < self.sopts.min_sentence_ms * SAMPLE_RATE // 1000:
            return []
        spec, self._spec = self._spec, None
        if spec is not None and spec[0] == (start_ms, end_ms, self.opts):  # decoded already: same audio, options
            decoded: tuple[Any, ...] | None = spec[1]
            self.sentences_speculated += 1
        else:
            decoded = self._decode(audio, self.sopts.max_new_tokens, draft, partial=False)
        if decoded is None:
            raise RuntimeError("the stream's decoder skipped a closed sentence (only partials may be skipped)")
        text, tokens = decoded[0], decoded[1]
        if self.postprocess is not None:
            text = self.postprocess(text)
        if not text.strip():
            return []
        ev = StreamEvent("sentence", text, start_ms, end_ms, list(tokens),
                         avg_logprob=decoded[2] if len(decoded) > 2 else None)
        if self.speakers is not None:  # FunASR's assign_streaming: this sentence's windows, clustered with the last
            sentence = {"text": text, "start": start_ms, "end": end_ms}
            self.speakers.assign(audio, start_ms / 1000, end_ms / 1000, sentence)
            ev.speaker = int(sentence["spk"])
        self.sentences.append(ev)
        self._sentence_delays.append(self._delay_ms(end_ms))
        self._close_delays.append(self._delay_ms(self.duration_ms))
        return [ev]

    def _finalize_speakers(self, sentences: list[StreamEvent]) -> list[StreamEvent]:
        """FunASR's final re-clustering (``HybridSpeakerTracker.finalize``): every sentence's speaker again from all
        the windows held; a sentence that two speakers share for long enough is split (its text cut in proportion
        to time, as FunASR does; the parts carry no token ids)."""
        if self.speakers is None or not sentences:
            return sentences
        final = self.speakers.finalize([{"text": s.text, "start": s.start, "end": s.end, "spk": s.speaker}
                                        for s in sentences])
        by_key = {(s.text, s.start, s.end): s for s in sentences}
        out = []
        for d in final:
            old = by_key.get((d["text"], int(d["start"]), int(d["end"])))
            out.append(StreamEvent("sentence", d["text"], int(d["start"]), int(d["end"]),
                                   list(old.tokens) if old is not None else [],
                                   None if d.get("spk") is None else int(d["spk"]),
                                   old.avg_logprob if old is not None else None))
        return out

    def _speculate(self) -> list[StreamEvent] | None:
        """The open sentence has been silent for ``speculate_silence_ms``: decode it as the VAD would close it
        if the silence went on (start -> the predicted end), with the closing decode's token limit, as this
        step's partial; while the pause goes on after it, no partial is decoded (the text would be the same,
        over more silence). None when there is nothing to speculate on (the regular partial schedule goes on)."""
        if (self.sopts.speculate_silence_ms <= 0 or self.speech_start is None
                or self.total_samples < self.sopts.first_partial_ms * SAMPLE_RATE // 1000):
            return None
        end = self._vad.predicted_end(self.sopts.speculate_silence_ms)
        start_ms = max(0, int(self.speech_start))
        if self._spec is not None and self._spec[0] == (start_ms, end, self.opts):
            return []  # decoded already, and the pause goes on: its partial stands (no partial over silence)
        if end is None or end > self.duration_ms or end - start_ms > self.sopts.speculate_max_s * 1000:
            return None
        audio = self._slice(start_ms * SAMPLE_RATE // 1000, end * SAMPLE_RATE // 1000)
        if audio.size < self.sopts.min_sentence_ms * SAMPLE_RATE // 1000:
            return None
        decoded = self._decode(audio, self.sopts.max_new_tokens, self._draft, partial=True, speculative=True)
        if decoded is None:  # skipped by a busy decoder: asked again next step
            self.partials_skipped += 1
            return []
        self.partials_decoded += 1
        text, tokens = decoded[0], decoded[1]
        self._spec = ((start_ms, end, self.opts), (text, list(tokens), *decoded[2:]))
        return self._partial_event(text, tokens, start_ms)

    def _partial(self) -> list[StreamEvent]:
        first = self.sopts.first_partial_ms * SAMPLE_RATE // 1000
        if self.client_endpoints:  # counted from the utterance's start
            if self.speech_start is None or self.total_samples - self.speech_start * SAMPLE_RATE // 1000 < first:
                return []
        elif self.total_samples < first:
            return []
        if self.speech_start is None:
            self._last_decode = self.total_samples
            self.partial = None
            self._draft = None
            return []
        start = self.speech_start * SAMPLE_RATE // 1000
        window = int(self.sopts.partial_window_s * SAMPLE_RATE)
        start = max(start, self.total_samples - window, self._buf_start)
        audio = self._slice(start, self.total_samples)
        if audio.size < self.sopts.partial_interval_ms * SAMPLE_RATE // 2000:
            return []  # under half an interval of speech: wait (FunASR's chunk_samples // 2)
        decoded = self._decode(audio, self.sopts.partial_max_new_tokens, self._draft, partial=True)
        if decoded is None:  # skipped by a busy decoder: the previous partial stands; asked again next step
            self.partials_skipped += 1
            return []
        self.partials_decoded += 1
        text, tokens = decoded[0], decoded[1]
        return self._partial_event(text, tokens, start * 1000 // SAMPLE_RATE)

    def _partial_event(self, text: str, tokens: list[int], start_ms: int) -> list[StreamEvent]:
        self._draft = list(tokens) or None
        self._last_decode = self.total_samples
        if not text.strip():
            self.partial = None
            return []
        self._first_decode_done = True
        self.partial = StreamEvent("partial", text, start_ms, self.duration_ms)
        if self._partial_seen_for != self.speech_start:
            self._partial_seen_for = self.speech_start
            self._first_partial_delays.append(self._delay_ms(self.speech_start or 0))
        return [self.partial]

    def _compact(self) -> None:
        if self.speech_start is not None:
            keep = self.speech_start * SAMPLE_RATE // 1000
        else:
            keep = self.total_samples - int(self.sopts.lookback_s * SAMPLE_RATE)
        keep = min(self.total_samples, max(self._buf_start, keep))
        while self._chunks and self._buf_start + self._chunks[0].size <= keep:
            self._buf_start += self._chunks.popleft().size
        if self._chunks and keep > self._buf_start:  # a copy, so that the dropped samples are freed
            self._chunks[0] = self._chunks[0][keep - self._buf_start :].copy()
            self._buf_start = keep
        # arrival times of audio no longer held are not asked for again (kept 1 s back: ms rounding)
        old = bisect.bisect_left(self._arrivals, self._buf_start - SAMPLE_RATE, key=lambda e: e[0])
        if old:
            del self._arrivals[:old]

    def _decode(self, audio: np.ndarray, max_new_tokens: int, draft: list[int] | None,
                partial: bool, speculative: bool = False) -> Decoded | None:
        """The decode function on `audio`, with the draft (None when empty) and the partial and speculative
        flags (None: a skipped partial)."""
        return self._decode_fn(audio, max_new_tokens, draft=draft or None, partial=partial, speculative=speculative)

    def _decode_local(self, audio: np.ndarray, max_new_tokens: int, /, *, draft: list[int] | None = None,
                      partial: bool = False, speculative: bool = False) -> tuple[str, list[int], float | None]:
        """The Session's own decode (a :class:`Decoder`): every decode, partial or not, is decoded."""
        o = self.opts
        seconds = min(self.session.max_segment_seconds, max(o.segment_seconds, audio.size / SAMPLE_RATE + 1.0))
        r = self.session.transcribe(audio, sample_rate=SAMPLE_RATE, language=o.language, itn=o.itn,
                                    hotwords=list(o.hotwords), max_new_tokens=max_new_tokens,
                                    segment_seconds=seconds, repetition_guard=o.repetition_guard, vad=False,
                                    draft=draft)
        return r.text, [t for s in r.segments for t in s.tokens], mean_logprob(r.segments)

    # -- results -------------------------------------------------------------------------------------

    def _delay_ms(self, audio_ms: int) -> float:
        """Wall time from when the audio at `audio_ms` arrived (its feed began) until now."""
        need = audio_ms * SAMPLE_RATE // 1000
        for received, t in self._arrivals:
            if received >= need:
                return (time.perf_counter() - t) * 1000.0
        return 0.0

    def response(self, is_final: bool = False) -> dict[str, Any]:
        """FunASR's realtime result: every closed sentence so far (with fun-asr's ``confidence``:
        :attr:`StreamEvent.confidence`, 4 places), the open one's partial text. Client
        endpoints: the final result (after commit() or close()) holds the committed utterance's sentence; the
        others hold none (FunASR's locked sentences are reset at each commit)."""
        shown = (self._committed if is_final else []) if self.client_endpoints else self.sentences
        sentences = [{"text": s.text, "start": s.start, "end": s.end,
                      **({} if s.speaker is None else {"spk": s.speaker}),
                      **({} if s.confidence is None else {"confidence": round(s.confidence, 4)})} for s in shown]
        if is_final:
            return {"sentences": sentences, "partial": "", "partial_start_ms": 0, "duration_ms": self.duration_ms,
                    "is_final": True}
        if self.partial is not None:
            start = self.partial.start
        elif self.speech_start is not None:
            start = self.speech_start
        else:
            start = self.duration_ms
        return {"sentences": sentences, "partial": self.partial.text if self.partial else "",
                "partial_start_ms": int(start), "duration_ms": self.duration_ms, "is_final": False}

    def latency(self) -> dict[str, dict[str, float | int]]:
        """Wall-clock delays (ms), meaningful when audio is fed at real time: ``sentence_final``, the
        sentence's speech end arrived -> its sentence event (includes the VAD's end silence, up to 2 s
        for a short sentence under FunASR's schedule); ``sentence_close``, the audio on which the VAD
        closed the sentence arrived -> its sentence event (the decoding delay); ``first_partial``, speech
        start arrived -> the sentence's first partial."""
        return {"sentence_final": _percentiles(self._sentence_delays),
                "sentence_close": _percentiles(self._close_delays),
                "first_partial": _percentiles(self._first_partial_delays)}


__all__ = ["Decoded", "Decoder", "PlainDecoder", "Stream", "StreamEvent", "StreamOptions", "plain_decoder"]
