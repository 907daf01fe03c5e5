"""Splitting long audio at quiet points so that no segment exceeds the model's window."""

from __future__ import annotations

import numpy as np

SAMPLE_RATE = 16000


def split_points(samples: np.ndarray, max_seconds: float, search_seconds: float = 5.0,
                 window_seconds: float = 0.1, rate: int = SAMPLE_RATE) -> list[tuple[int, int]]:
    """[(start, end)] sample ranges covering the audio without gaps, each at most max_seconds.

    Each cut is placed at the quietest `window_seconds` window (lowest RMS, 10 ms hop) within the
    last `search_seconds` before the limit, so a pause there is used rather than cutting a word.
    """
    n = len(samples)
    max_len = int(max_seconds * rate)
    if max_len <= 0:
        raise ValueError("max_seconds must be > 0")
    win = max(1, int(window_seconds * rate))
    hop = max(1, rate // 100)
    search = min(int(search_seconds * rate), max_len // 2)
    spans = []
    start = 0
    while n - start > max_len:
        lo, hi = start + max_len - search, start + max_len
        region = samples[lo:hi].astype(np.float64)
        if len(region) >= win:
            sq = np.concatenate([[0.0], np.cumsum(region**2)])
            starts = np.arange(0, len(region) - win + 1, hop)
            energy = sq[starts + win] - sq[starts]
            best = starts[int(np.argmin(energy))]
            cut = lo + best + win // 2
        else:
            cut = hi
        spans.append((start, cut))
        start = cut
    spans.append((start, n))
    return spans
