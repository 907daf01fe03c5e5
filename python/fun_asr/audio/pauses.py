"""Splitting long audio at quiet points so that no segment exceeds the model's window."""

from __future__ import annotations

import numpy as np

SAMPLE_RATE = 16000


class PauseSplitter:
    """:func:`split_points` over audio that arrives in pieces (the same spans as one call on the whole).

    :meth:`cuts` is given the samples from :attr:`start` on (at least) and returns the spans that can be
    cut already; the caller may drop every sample before :attr:`start` afterwards."""

    def __init__(self, max_seconds: float, search_seconds: float = 5.0, window_seconds: float = 0.1,
                 rate: int = SAMPLE_RATE) -> None:
        self.max_len = int(max_seconds * rate)
        if self.max_len <= 0:
            raise ValueError("max_seconds must be > 0")
        self.win = max(1, int(window_seconds * rate))
        self.hop = max(1, rate // 100)
        self.search = min(int(search_seconds * rate), self.max_len // 2)
        self.start = 0  # where the next span begins (absolute sample)

    def cuts(self, samples: np.ndarray, base: int = 0, final: bool = False) -> list[tuple[int, int]]:
        """Spans ``[(start, end)]`` decided by the audio so far: ``samples[i]`` is absolute sample
        ``base + i`` and holds everything from :attr:`start` on; ``final``: nothing follows (the last span
        ends at the end of the audio)."""
        if base > self.start:
            raise ValueError(f"samples from {base} on, but the next span starts at {self.start}")
        n = base + len(samples)
        spans = []
        while n - self.start > self.max_len:
            start = self.start
            lo, hi = start + self.max_len - self.search, start + self.max_len
            region = samples[lo - base : hi - base].astype(np.float64)
            if len(region) >= self.win:
                sq = np.concatenate([[0.0], np.cumsum(region**2)])
                starts = np.arange(0, len(region) - self.win + 1, self.hop)
                energy = sq[starts + self.win] - sq[starts]
                best = starts[int(np.argmin(energy))]
                cut = lo + best + self.win // 2
            else:
                cut = hi
            spans.append((start, cut))
            self.start = cut
        if final:
            spans.append((self.start, n))
            self.start = n
        return spans


def split_points(samples: np.ndarray, max_seconds: float, search_seconds: float = 5.0,
                 window_seconds: float = 0.1, rate: int = SAMPLE_RATE) -> list[tuple[int, int]]:
    """[(start, end)] sample ranges covering the audio without gaps, each at most max_seconds.

    Each cut is placed at the quietest `window_seconds` window (lowest RMS, 10 ms hop) within the
    last `search_seconds` before the limit, so a pause there is used rather than cutting a word.
    """
    return PauseSplitter(max_seconds, search_seconds, window_seconds, rate).cuts(samples, 0, final=True)
