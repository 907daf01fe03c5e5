"""Speaker windows and the speaker timeline, as FunASR 1.4.16's ``funasr/models/campplus/utils.py``.

- :func:`sv_chunk` -- each speech segment cut into 1.5 s windows every 0.75 s (the last one ends at the segment's
  end; a segment shorter than a window gives one window, zero-padded to 1.5 s);
- :func:`speaker_timeline` -- FunASR's ``postprocess``: window labels renumbered by first appearance
  (``correct_labels``), consecutive touching windows of one speaker joined (``merge_seque``), the overlap of
  two neighbouring turns split at its middle, then ``smooth``: times rounded to 10 ms and turns shorter than
  0.7 s given to the nearer neighbour (all this only when there are two turns or more, as FunASR);
- :func:`speaker_centers` -- each speaker's mean window embedding (``return_spk_center``);
- :func:`distribute_speakers` -- FunASR's ``distribute_spk``: every sentence takes the speaker it overlaps most,
  with FunASR's accounting (a speaker's overlap is counted twice when it takes the lead, and later turns of the
  leading speaker add to its total).

Times are in seconds, except the sentences' ``start`` / ``end`` (milliseconds, as FunASR's ``sentence_info``).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

import numpy as np

WINDOW_S = 1.5  # FunASR sv_chunk: seg_dur
SHIFT_S = 0.75  # ... seg_shift
MIN_TURN_S = 0.7  # smooth(mindur=0.7)
OVERLAP_EPS_S = 1e-4  # postprocess: is_overlapped


def sv_chunk(segments: Iterable[Sequence[Any]], fs: int = 16000) -> list[tuple[float, float, np.ndarray]]:
    """Speaker windows ``(start_s, end_s, samples)`` of speech segments ``(start_s, end_s, samples)``.

    Each segment's samples (1-D) are cut into windows of ``int(1.5 * fs)`` samples every ``int(0.75 * fs)``;
    the last window is moved back to end at the segment's end; a window shorter than 1.5 s (a short segment) is
    zero-padded at the end. A window's times are the segment's ``start_s`` plus its sample offsets over ``fs``
    (the segment's ``end_s`` is not used, as in FunASR). An empty segment gives no window."""
    if isinstance(fs, bool) or not isinstance(fs, int | np.integer):
        raise ValueError(f"fs must be an integer sample rate, got {fs!r}")
    length, shift = int(WINDOW_S * fs), int(SHIFT_S * fs)
    if shift < 1:
        raise ValueError(f"fs must be at least 2 Hz, got {fs}")
    windows: list[tuple[float, float, np.ndarray]] = []
    for index, segment in enumerate(segments):
        try:
            seg_start, _seg_end, data = segment
        except (TypeError, ValueError):
            raise ValueError(f"segment {index} must be (start_s, end_s, samples), got {type(segment).__name__}"
                             ) from None
        data = np.asarray(data)
        if data.ndim != 1:
            raise ValueError(f"segment {index}: samples must be 1-D, got shape {data.shape}")
        seg_start = float(seg_start)
        last_end = 0
        for offset in range(0, data.shape[0], shift):
            end = min(offset + length, data.shape[0])
            if end <= last_end:
                break
            last_end = end
            begin = max(0, end - length)
            window = data[begin:end]
            if window.shape[0] < length:
                window = np.pad(window, (0, length - window.shape[0]), "constant")
            windows.append((begin / fs + seg_start, end / fs + seg_start, window))
    return windows


def correct_labels(labels: Iterable[Any]) -> np.ndarray:
    """Labels renumbered 0, 1, ... in order of first appearance (FunASR's ``correct_labels``), int64."""
    ids: dict[Any, int] = {}
    return np.array([ids.setdefault(lab, len(ids)) for lab in np.asarray(labels).tolist()], dtype=np.int64)


def _join_turns(turns: list[list[Any]]) -> list[list[Any]]:
    """FunASR's ``merge_seque``: a turn of the previous turn's speaker that starts no later than it ends extends
    it (to the new turn's end)."""
    out = [turns[0]]
    for turn in turns[1:]:
        if turn[2] != out[-1][2] or turn[0] > out[-1][1]:
            out.append(turn)
        else:
            out[-1][1] = turn[1]
    return out


def _smooth(turns: list[list[Any]], min_turn_s: float = MIN_TURN_S) -> list[list[Any]]:
    """FunASR's ``smooth``: round the times to 10 ms (Python's ``round``) and give each turn shorter than
    ``min_turn_s`` the speaker of its nearer neighbour (in order, so a changed turn counts as its new speaker for
    the next), then join again. One turn: left as it is (not rounded)."""
    if len(turns) < 2:
        return turns
    last = len(turns) - 1
    for i, turn in enumerate(turns):
        turn[0] = round(turn[0], 2)
        turn[1] = round(turn[1], 2)
        if turn[1] - turn[0] < min_turn_s:
            if i == 0:
                turn[2] = turns[1][2]
            elif i == last:
                turn[2] = turns[i - 1][2]
            elif turn[0] - turns[i - 1][1] <= turns[i + 1][0] - turn[1]:
                turn[2] = turns[i - 1][2]
            else:
                turn[2] = turns[i + 1][2]
    return _join_turns(turns)


def speaker_timeline(windows: Sequence[Sequence[Any]], labels: Any) -> list[list[Any]]:
    """FunASR's ``postprocess``: the speaker turns ``[start_s, end_s, speaker]`` of windows ``(start_s, end_s,
    ...)`` (in time order, as FunASR sorts them) with one label each. Speakers are 0, 1, ... by first appearance
    (Python ints). No windows: no turns."""
    labels = np.asarray(labels)
    if labels.ndim != 1 or len(windows) != labels.shape[0]:
        raise ValueError(f"need one label per window: {len(windows)} windows, labels of shape {labels.shape}")
    if not len(windows):
        return []
    speakers = correct_labels(labels).tolist()
    turns = _join_turns([[float(w[0]), float(w[1]), spk] for w, spk in zip(windows, speakers, strict=True)])
    for i in range(1, len(turns)):
        if turns[i - 1][1] > turns[i][0] + OVERLAP_EPS_S:
            middle = (turns[i][0] + turns[i - 1][1]) / 2
            turns[i][0] = middle
            turns[i - 1][1] = middle
    return _smooth(turns)


def speaker_centers(labels: Any, embeddings: Any) -> np.ndarray:
    """``[speakers, D]``: row i is the mean embedding of the windows of speaker i, speakers numbered as
    :func:`speaker_timeline` numbers them (FunASR's ``return_spk_center``). No windows: ``[0, D]``."""
    emb = np.asarray(embeddings)
    labels = np.asarray(labels)
    if emb.ndim != 2 or labels.ndim != 1 or emb.shape[0] != labels.shape[0]:
        raise ValueError(f"need embeddings [N, D] and N labels, got shapes {emb.shape} and {labels.shape}")
    if labels.shape[0] == 0:
        return np.zeros((0, emb.shape[1]), dtype=emb.dtype)
    speakers = correct_labels(labels)
    return np.stack([emb[speakers == i].mean(0) for i in range(int(speakers.max()) + 1)])


def distribute_speakers(sentences: list[dict[str, Any]], timeline: Iterable[Sequence[Any]]) -> list[dict[str, Any]]:
    """FunASR's ``distribute_spk``: sets each sentence's ``'spk'`` (int) to the timeline speaker it overlaps most
    and returns ``sentences``. Sentence ``start``/``end`` are milliseconds, the timeline's seconds. FunASR's
    accounting is kept: when a speaker takes the lead its overlap is added a second time, and every later turn
    of the leading speaker adds to the total it must be beaten by. No overlap at all: speaker 0."""
    turns = [(float(a) * 1000, float(b) * 1000, spk) for a, b, spk in timeline]
    for index, sentence in enumerate(sentences):
        try:
            start, end = sentence["start"], sentence["end"]
        except (KeyError, TypeError):
            raise ValueError(f"sentence {index} must be a dict with 'start' and 'end' (ms)") from None
        best_spk: Any = 0
        best = 0
        for turn_start, turn_end, spk in turns:
            overlap = max(min(end, turn_end) - max(start, turn_start), 0)
            if overlap > best:
                best = overlap
                best_spk = spk
            if overlap > 0 and best_spk == spk:
                best += overlap
        sentence["spk"] = int(best_spk)
    return sentences


__all__ = ["MIN_TURN_S", "SHIFT_S", "WINDOW_S", "correct_labels", "distribute_speakers", "speaker_centers",
           "speaker_timeline", "sv_chunk"]
