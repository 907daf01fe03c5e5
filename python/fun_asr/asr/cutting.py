"""One recording in flight: its state, rolling buffers, and the cutter that turns arriving samples into segments
(FunASR's FSMN-VAD, or the pause splitter without one).
"""

from __future__ import annotations

import os
import time
from typing import Any

import numpy as np

from fun_asr.asr.options import TranscribeOptions
from fun_asr.asr.results import Segment
from fun_asr.audio.decode import SAMPLE_RATE
from fun_asr.audio.frontend import FbankStream, FrontendConfig
from fun_asr.audio.pauses import PauseSplitter
from fun_asr.errors import FunAsrError, Message, names_input
from fun_asr.notices import Notice
from fun_asr.vad.native import FsmnVad, OfflineVad


class CutItem:
    """One recording on its way through _run."""

    def __init__(self, index: int) -> None:
        self.index = index
        self.source: str = f"input {index}"
        # the recording's 16 kHz samples and (VAD path) fbank frames: while it streams through _run, only
        # the tail that segments to come need (_Rolling; len() counts all of them)
        self.samples: np.ndarray | _Rolling = np.zeros(0, np.float32)
        self.segments: list[Segment] = []
        self.spans: list[tuple[int, int]] = []
        self.fbank: np.ndarray | _Rolling | None = None
        self.segmentation: str | None = None
        self.warnings: list[str] = []
        self.input_truncated = False
        self.empty_reason: str | None = None
        self.error: str | None = None
        self.speakers: Any = None  # diarize: the RecordingSpeakers collecting this recording's speaker windows
        self.speaker_turns: list[tuple[float, float, int]] | None = None  # diarize: the speaker timeline
        self.draft: list[int] | None = None  # token ids its transcript probably contains (speculative decoding)
        self.draft_stats: dict[str, int] = {}  # with a draft: decode_passes, draft_proposed, draft_accepted
        self.enc_out: dict[int, np.ndarray] = {}  # segment -> encoder output, for the CTC head (drafts, timestamps)
        self.timings = {"load_ms": 0.0, "frontend_ms": 0.0, "vad_ms": 0.0, "encode_ms": 0.0, "prefill_ms": 0.0,
                        "decode_ms": 0.0}

    def fail(self, exc: BaseException | None) -> None:
        msg = str(exc) or type(exc).__name__
        named = exc is not None and names_input(exc) == self.source  # the message names the recording already
        if isinstance(exc, FunAsrError):  # kept as data: each front end says it in its words
            self.error = Notice("error", exc.message if named else Message("{source}: {error}", source=self.source,
                                                                             error=exc))
        else:
            self.error = msg if named else f"{self.source}: {msg}"
        self.segments = []
        self.enc_out.clear()


class _Rolling:
    """The tail of an array that grows piece by piece: indexed by absolute position (``[a:b]``, from
    ``base`` on), the pieces wholly before a point dropped (:meth:`drop_before`); ``len()`` counts every
    row ever appended."""

    def __init__(self, width: int | None = None) -> None:
        self._empty = np.zeros((0,) if width is None else (0, width), np.float32)
        self._parts: list[np.ndarray] = []
        self._starts: list[int] = []
        self.base = 0  # first row still held
        self.end = 0

    def __len__(self) -> int:
        return self.end

    def append(self, rows: np.ndarray) -> None:
        if len(rows):
            if not self._parts:
                self.base = self.end
            self._parts.append(rows)
            self._starts.append(self.end)
            self.end += len(rows)

    def __getitem__(self, key: slice) -> np.ndarray:
        a, b, step = key.indices(self.end)
        if step != 1:
            raise IndexError("_Rolling takes [a:b] slices")
        if b <= a:
            return self._empty
        if a < self.base:
            raise IndexError(f"rows {a}:{b} were dropped (rows from {self.base} on are held)")
        pieces = [part[max(a - s, 0) : min(b - s, len(part))] for part, s in zip(self._parts, self._starts, strict=True)
                  if s < b and s + len(part) > a]
        return pieces[0] if len(pieces) == 1 else np.concatenate(pieces)

    def drop_before(self, k: int) -> None:
        """Forgets the pieces that end at or before row ``k``."""
        while self._parts and self._starts[0] + len(self._parts[0]) <= k:
            self._parts.pop(0)
            self._starts.pop(0)
        self.base = self._starts[0] if self._parts else self.end


class Cutter:
    """Cuts one recording into segments as its 16 kHz samples arrive: FunASR's FSMN-VAD (1.4.16's offline
    algorithm, 60 s chunks, over the ASR fbank: the VAD's frames are the ASR's frames) or, without it, the
    pause splitter; the same spans as on the whole recording. Keeps in ``item.samples``/``item.fbank``
    what the segments to come need (:meth:`trim`)."""

    def __init__(self, frontend: FrontendConfig, vad: FsmnVad | None, item: CutItem, opts: TranscribeOptions) -> None:
        self.item = item
        self.timings = item.timings
        self.shift = int(round(frontend.sample_rate * frontend.frame_shift_ms / 1000))
        item.samples = _Rolling()
        self.vad: OfflineVad | None = None
        self.pauses: PauseSplitter | None = None
        if vad is not None and opts.vad:
            item.segmentation = "vad"
            cfg = opts.vad_config(vad.cfg)  # segment_seconds as the forced cut, the call's VAD kwargs
            self.vad = vad.offline(cfg)
            self.fbank = FbankStream(frontend)
            item.fbank = _Rolling(frontend.num_mel_bins)
        else:
            item.segmentation = "pauses"
            item.fbank = None
            self.pauses = PauseSplitter(opts.segment_seconds)

    def feed(self, block: np.ndarray) -> list[tuple[int, int]]:
        """The next samples -> the spans [a, b) (samples) decided by now."""
        item = self.item
        item.samples.append(block)
        if self.pauses is not None:
            if len(item.samples) - self.pauses.start <= self.pauses.max_len:
                return []  # no cut yet
            return self.pauses.cuts(item.samples[self.pauses.start :], self.pauses.start)
        t0 = time.perf_counter()
        frames = self.fbank.accept(block)
        item.fbank.append(frames)
        self.timings["frontend_ms"] += (time.perf_counter() - t0) * 1e3
        t0 = time.perf_counter()
        segs = self.vad.feed(block, frames)
        self.timings["vad_ms"] += (time.perf_counter() - t0) * 1e3
        return self._spans(segs)

    def finish(self) -> list[tuple[int, int]]:
        """The end of the recording -> the last spans."""
        if self.pauses is not None:
            return self.pauses.cuts(self.item.samples[self.pauses.start :], self.pauses.start, final=True)
        t0 = time.perf_counter()
        segs = self.vad.close()
        self.timings["vad_ms"] += (time.perf_counter() - t0) * 1e3
        return self._spans(segs)

    def _spans(self, segs: list[list[int]]) -> list[tuple[int, int]]:
        ms, n = SAMPLE_RATE // 1000, len(self.item.samples)  # FunASR cuts the audio at ms * 16
        return [(s * ms, min(e * ms, n)) for s, e in segs]

    def trim(self) -> None:
        """Drops what no segment to come can need (after the decided spans have been encoded)."""
        item = self.item
        if self.pauses is not None:
            item.samples.drop_before(self.pauses.start)
        else:
            k = self.vad.first_pending_frame()
            item.fbank.drop_before(k)
            item.samples.drop_before(k * self.shift)
            self.vad.forget_before(k)

    def no_speech_prob(self, a: int, b: int) -> float | None:
        """Samples [a, b) (a span just decided): the VAD's mean silence probability over its frames; None
        without a VAD (the pause splitter has no probabilities)."""
        if self.vad is None:
            return None
        ms = SAMPLE_RATE // 1000
        return self.vad.silence_probability(a // ms, -(-b // ms))

    def release(self) -> None:
        """The recording is done: nothing more is needed (len(item.samples) still counts its samples)."""
        if isinstance(self.item.samples, _Rolling):
            self.item.samples.drop_before(len(self.item.samples))
        self.item.fbank = None


def source_name(audio: object, index: int, count: int) -> str:
    """A file's name; "<array>"/"<audio bytes>" with their position when several were given."""
    if isinstance(audio, str | os.PathLike):
        name = os.fspath(audio)
    elif isinstance(audio, np.ndarray):
        name = "<array>"
    else:
        name = str(getattr(audio, "name", "<audio bytes>"))
    return f"input {index} {name}" if count > 1 and name.startswith("<") else name
