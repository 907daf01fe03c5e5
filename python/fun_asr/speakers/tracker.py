"""Speakers while streaming, as FunASR 1.4.16's realtime server (``funasr/bin/realtime_ws.py``,
``HybridSpeakerTracker``): every finished sentence gets a speaker at once, and at the end of the stream the
sentences are re-labelled from one clustering of the recent windows, splitting a sentence where the speaker
changes inside it.

How a sentence is labelled (:meth:`SpeakerTracker.assign`): its audio is cut into speaker windows
(:func:`~fun_asr.speakers.timeline.sv_chunk`), their embeddings join a history of the last 128 windows, the
whole history is clustered (:func:`~fun_asr.speakers.cluster.cluster_speakers`) and made a speaker timeline;
each cluster's centre is matched to the known speakers' centres (cosine, greedily in cluster order, each known
speaker at most once per clustering): a match at >= 0.6 keeps that speaker's id (and moves its centre towards
the cluster's, weight ``1 / min(updates + 1, 20)``), no match creates a new id (up to 15; after that the best
free known id is taken). The sentence then takes the timeline speaker it overlaps most.

:meth:`SpeakerTracker.finalize` clusters the history once more (matching only, nothing created or moved):
sentences that end before the history starts keep their streaming speaker; one that straddles the history's
start is cut there (its text in proportion to time); the others take the speaker they overlap most and are
split into parts of >= 3 s where the timeline changes speaker inside them (text cut in proportion to time).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import KW_ONLY, dataclass
from typing import Any

import numpy as np

from fun_asr.speakers.cluster import check_options, cluster_speakers
from fun_asr.speakers.timeline import distribute_speakers, speaker_centers, speaker_timeline, sv_chunk

MATCH_THRESHOLD = 0.6  # HybridSpeakerTracker(threshold=0.6)
HISTORY_WINDOWS = 128  # ... max_history_chunks=128
MAX_IDENTITIES = 15  # ... max_speakers=15
MAX_CENTER_WEIGHT_COUNT = 20  # a centre moves by 1 / min(updates + 1, 20)
MIN_SPLIT_S = 3.0  # finalize(min_split_s=3.0)
NORM_EPS = 1e-12  # torch.nn.functional.normalize's eps


def _unit(v: np.ndarray) -> np.ndarray:
    """``v / max(||v||, 1e-12)`` along the last axis (torch's ``F.normalize``), float32."""
    norm = np.linalg.norm(v, axis=-1, keepdims=True)
    return (v / np.maximum(norm, np.float32(NORM_EPS))).astype(np.float32)


@dataclass(eq=False, repr=False)
class SpeakerTracker:
    """Stable speaker ids for a stream of sentences (FunASR's ``HybridSpeakerTracker``).

    ``embed(windows) -> [N, D]``: the speaker embeddings of N windows (each 1.5 s of samples at
    ``sample_rate``), e.g. :meth:`~fun_asr.speakers.native.SpeakerModel.embed`; used as float32. ``threshold``:
    the cosine at which a cluster is the same person as a known speaker; ``max_history_windows``: how many recent
    windows are clustered; ``max_speakers``: the most speaker ids handed out. ``num_speakers``, ``min_speakers``,
    ``cluster_max_speakers``, ``merge_threshold``, ``seed``, ``clustering`` go to
    :func:`~fun_asr.speakers.cluster.cluster_speakers` (its ``max_speakers`` is ``cluster_max_speakers``, by
    default ``max_speakers``: FunASR's 15 for both; ``clustering`` is FunASR's by default, as its realtime
    server: a history under 20 windows is one speaker). The options are the dataclass's fields (``embed`` ..
    ``max_speakers`` positional, the rest keyword-only); the stream's state is set up after them."""

    embed: Callable[[list[np.ndarray]], Any]
    threshold: float = MATCH_THRESHOLD
    max_history_windows: int = HISTORY_WINDOWS
    max_speakers: int = MAX_IDENTITIES
    _: KW_ONLY
    num_speakers: int | None = None
    min_speakers: int | None = None
    cluster_max_speakers: int | None = None
    merge_threshold: float = 0.78
    seed: int = 0
    clustering: str = "funasr"
    sample_rate: int = 16000

    def __post_init__(self) -> None:
        self._check_own_options()
        if self.cluster_max_speakers is None:
            self.cluster_max_speakers = int(self.max_speakers)
        check_options(self.num_speakers, self.min_speakers, self.cluster_max_speakers, self.merge_threshold)
        self.threshold = float(self.threshold)
        self.max_speakers = int(self.max_speakers)
        self.sample_rate = int(self.sample_rate)
        self.cluster_options: dict[str, Any] = {
            "num_speakers": self.num_speakers, "min_speakers": self.min_speakers,
            "max_speakers": self.cluster_max_speakers, "merge_threshold": self.merge_threshold, "seed": self.seed,
            "clustering": self.clustering}
        cluster_speakers(np.zeros((0, 1), np.float32), **self.cluster_options)  # validates seed too
        self.windows: deque[tuple[float, float]] = deque(maxlen=int(self.max_history_windows))
        self.embeddings: deque[np.ndarray] = deque(maxlen=int(self.max_history_windows))
        self.centers: list[np.ndarray] = []
        self.center_updates: list[int] = []
        self.last_speaker = 0

    def _check_own_options(self) -> None:
        """ValueError for a bad ``embed``, history or speaker limit, ``sample_rate`` or ``threshold``."""
        if not callable(self.embed):
            raise ValueError(f"embed must be a callable windows -> [N, D] embeddings, got {type(self.embed).__name__}")
        for name, value in (("max_history_windows", self.max_history_windows), ("max_speakers", self.max_speakers),
                            ("sample_rate", self.sample_rate)):
            if isinstance(value, bool) or not isinstance(value, int | np.integer) or value < 1:
                raise ValueError(f"{name} must be a positive integer, got {value!r}")
        threshold = self.threshold
        if isinstance(threshold, bool) or not isinstance(threshold, int | float | np.floating) or not (
                -1.0 <= float(threshold) <= 1.0):
            raise ValueError(f"threshold must be a cosine similarity in [-1, 1], got {threshold!r}")

    # -- streaming ---------------------------------------------------------------------------------------------

    def assign(self, samples: Any, start_s: float, end_s: float, sentence: dict[str, Any]) -> int:
        """The speaker of the sentence whose audio is ``samples`` (1-D, ``start_s``..``end_s`` seconds of the
        stream); also sets ``sentence['spk']``. No audio: the previous sentence's speaker."""
        if not isinstance(sentence, dict):
            raise ValueError(f"sentence must be a dict, got {type(sentence).__name__}")
        windows = sv_chunk([(float(start_s), float(end_s), samples)], fs=self.sample_rate)
        if not windows:
            sentence["spk"] = self.last_speaker
            return self.last_speaker
        emb = np.asarray(self.embed([w[2] for w in windows]), dtype=np.float32)
        if emb.ndim != 2 or emb.shape[0] != len(windows) or emb.shape[1] < 1:
            raise ValueError(f"embed must return [{len(windows)}, D] embeddings for {len(windows)} windows, "
                             f"got shape {emb.shape}")
        if self.embeddings and emb.shape[1] != self.embeddings[0].shape[0]:
            raise ValueError(f"embed returned dim {emb.shape[1]}, earlier windows had {self.embeddings[0].shape[0]}")
        for (w_start, w_end, _), row in zip(windows, emb, strict=True):
            self.windows.append((float(w_start), float(w_end)))
            self.embeddings.append(row.copy())
        timeline = self._cluster_history(update=True)
        probe = [{"start": int(float(start_s) * 1000), "end": int(float(end_s) * 1000)}]
        distribute_speakers(probe, timeline)
        self.last_speaker = int(probe[0]["spk"])
        sentence["spk"] = self.last_speaker
        return self.last_speaker

    def _cluster_history(self, update: bool) -> list[list[Any]]:
        """The history's speaker timeline with stable ids."""
        emb = np.stack(list(self.embeddings), axis=0)
        labels = cluster_speakers(emb, **self.cluster_options)
        turns = speaker_timeline(list(self.windows), labels)
        ids = self._match(speaker_centers(labels, emb), update)
        return [[start, end, ids[int(spk)]] for start, end, spk in turns]

    def _match(self, cluster_centers: np.ndarray, update: bool) -> list[int]:
        """A stable id for each cluster centre (``HybridSpeakerTracker._map_cluster_centers``)."""
        ids: list[int] = []
        used: set[int] = set()
        for center in _unit(np.asarray(cluster_centers, dtype=np.float32)):
            best: int | None = None
            best_sim = float("-inf")
            created = False
            sims = np.array([np.dot(center, known) for known in self.centers], dtype=np.float32)
            for candidate in np.argsort(-sims, kind="stable").tolist():
                if candidate not in used:
                    best, best_sim = candidate, float(sims[candidate])
                    break
            matched = best is not None and best_sim >= self.threshold
            if not matched and update and len(self.centers) < self.max_speakers:
                best = len(self.centers)
                self.centers.append(center.copy())
                self.center_updates.append(1)
                matched = created = True
            elif best is None:  # more clusters than known ids: the closest, even if taken
                best = int(np.argmax(sims)) if self.centers else 0
            if update and matched and not created:
                count = self.center_updates[best]
                weight = 1.0 / min(count + 1, MAX_CENTER_WEIGHT_COUNT)
                self.centers[best] = _unit((1.0 - weight) * self.centers[best] + weight * center)
                self.center_updates[best] = count + 1
            ids.append(best)
            used.add(best)
        return ids

    # -- end of stream -----------------------------------------------------------------------------------------

    def finalize(self, sentences: list[dict[str, Any]], min_split_s: float = MIN_SPLIT_S) -> list[dict[str, Any]]:
        """The sentences re-labelled from one clustering of the history (``HybridSpeakerTracker.finalize``).
        Sentences before the history are returned as they are (the same dicts); the others as new dicts; a split
        sentence becomes parts ``{'text', 'start', 'end', 'spk'}`` (other keys dropped, as FunASR).
        Nothing tracked or no sentences: ``sentences`` itself."""
        if not self.embeddings or not sentences:
            return sentences
        timeline = self._cluster_history(update=False)
        history_start = int(min(start for start, _ in self.windows) * 1000)
        out: list[dict[str, Any]] = []
        for sentence in sentences:
            if sentence["end"] <= history_start:
                out.append(sentence)
                continue
            current = dict(sentence)
            if sentence["start"] < history_start:
                text = sentence["text"]
                ratio = (history_start - sentence["start"]) / (sentence["end"] - sentence["start"])
                cut = min(len(text) - 1, max(1, round(len(text) * ratio)))
                head, tail = text[:cut].strip(), text[cut:].strip()
                if not head or not tail:
                    out.append(sentence)
                    continue
                out.append({**sentence, "text": head, "end": history_start})
                current.update(text=tail, start=history_start)
            distribute_speakers([current], timeline)
            out.extend(_split(current, timeline, float(min_split_s)))
        return out

    def reset(self) -> None:
        """Forget everything (a new stream)."""
        self.windows.clear()
        self.embeddings.clear()
        self.centers = []
        self.center_updates = []
        self.last_speaker = 0

    def stats(self) -> dict[str, int | None]:
        """FunASR's ``session_stats`` keys: history size and limit, known speakers and limit, last speaker."""
        return {
            "speaker_history_chunks": len(self.windows),
            "speaker_history_embeddings": len(self.embeddings),
            "speaker_history_limit": self.windows.maxlen,
            "speaker_centers": len(self.centers),
            "speaker_center_limit": self.max_speakers,
            "last_speaker_id": self.last_speaker,
        }


def _split(sentence: dict[str, Any], timeline: Sequence[Sequence[Any]], min_split_s: float) -> list[dict[str, Any]]:
    """``HybridSpeakerTracker._try_split``: the sentence cut where the timeline changes speaker inside it, into
    parts of >= ``min_split_s`` (shorter turns join the part before; a short last part joins the one before),
    its text cut in proportion to the parts' durations. One part: ``[sentence]``."""
    start_s, end_s, text = sentence["start"] / 1000.0, sentence["end"] / 1000.0, sentence["text"]
    pieces = []
    for turn_start, turn_end, spk in timeline:
        a, b = max(start_s, turn_start), min(end_s, turn_end)
        if b > a:
            pieces.append([a, b, int(spk)])
    if len(pieces) <= 1:
        return [sentence]
    joined = [pieces[0]]
    for piece in pieces[1:]:
        prev = joined[-1]
        if piece[2] == prev[2] or piece[1] - piece[0] < min_split_s:
            joined[-1] = [prev[0], piece[1], prev[2]]
        else:
            joined.append(piece)
    parts = [joined[0]]
    for piece in joined[1:]:
        if parts[-1][1] - parts[-1][0] < min_split_s:
            parts[-1] = [parts[-1][0], piece[1], piece[2]]
        else:
            parts.append(piece)
    if len(parts) > 1 and parts[-1][1] - parts[-1][0] < min_split_s:
        parts[-2] = [parts[-2][0], parts[-1][1], parts[-2][2]]
        parts.pop()
    if len(parts) <= 1:
        return [sentence]
    total = sum(b - a for a, b, _ in parts)
    out = []
    pos = 0
    for i, (a, b, spk) in enumerate(parts):
        if i == len(parts) - 1:
            piece_text = text[pos:]
        else:
            n_chars = max(1, int(len(text) * (b - a) / total))
            piece_text = text[pos:pos + n_chars]
            pos += n_chars
        if piece_text.strip():
            out.append({"text": piece_text.strip(), "start": int(a * 1000), "end": int(b * 1000), "spk": spk})
    return out or [sentence]


__all__ = ["SpeakerTracker"]
