"""Who spoke when in one recording, FunASR 1.4.16's way (``AutoModel(..., spk_model="cam++")`` in its
``vad_segment`` mode, the one Fun-ASR-Nano gets): each speech segment is cut into 1.5 s windows every 0.75 s
(:func:`~fun_asr.speakers.timeline.sv_chunk`), each window gets a CAM++ embedding, the embeddings of the whole
recording are clustered (:func:`~fun_asr.speakers.cluster.cluster_speakers`), the windows' labels become a
speaker timeline (:func:`~fun_asr.speakers.timeline.speaker_timeline`) and every segment takes the speaker it
overlaps most (:func:`~fun_asr.speakers.timeline.distribute_speakers`).

:class:`RecordingSpeakers` collects the windows while a recording is read segment by segment (the audio is not
kept: only each window's start, end and embedding), and labels the segments at the end.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from fun_asr.speakers.cluster import DEFAULT_CLUSTERING, check_clustering, check_counts

EMBED_BATCH = 32  # windows per native call (one graph): 32 x 1.5 s


@dataclass(frozen=True)
class SpeakerOptions:
    """How many speakers to look for: ``num_speakers`` (FunASR's ``preset_spk_num``: exactly that many) or a
    range ``min_speakers``..``max_speakers`` for the count (FunASR's 1..15 when not given); and how
    (``speaker_clustering``): ``"auto"`` finds the count of a recording under 20 speaker windows (~15 s of
    speech) by agglomerative clustering, ``"funasr"`` keeps FunASR's labels (one speaker there); from 20 windows
    on both are FunASR's clustering (:func:`~fun_asr.speakers.cluster.cluster_speakers`)."""

    num_speakers: int | None = None
    min_speakers: int | None = None
    max_speakers: int | None = None
    speaker_clustering: str = DEFAULT_CLUSTERING

    @classmethod
    def check(cls, num_speakers: Any = None, min_speakers: Any = None, max_speakers: Any = None,
              speaker_clustering: Any = DEFAULT_CLUSTERING) -> SpeakerOptions:
        """The options checked (:func:`~fun_asr.speakers.cluster.check_counts`,
        :func:`~fun_asr.speakers.cluster.check_clustering`: ValueError naming the option)."""
        return cls(*check_counts(num_speakers, min_speakers, max_speakers), check_clustering(speaker_clustering))

    def counts(self) -> dict[str, int]:
        """The counts given (none: the count is found)."""
        return {k: v for k, v in (("num_speakers", self.num_speakers), ("min_speakers", self.min_speakers),
                                  ("max_speakers", self.max_speakers)) if v is not None}

    def to_dict(self) -> dict[str, Any]:
        """The counts given and the clustering (a result's ``options``)."""
        return {**self.counts(), "speaker_clustering": self.speaker_clustering}


class RecordingSpeakers:
    """The speaker windows of one recording, collected segment by segment (:meth:`add`), then labelled
    (:meth:`label`). ``embed_features``: CAM++ feature windows -> ``[N, D]`` embeddings (e.g.
    ``SpeakerModel.embed_features``); ``frontend``: the model's
    :class:`~fun_asr.speakers.frontend.SpeakerFrontendConfig`.

    Each segment's fbank is computed once: a window that starts on a frame boundary takes its frames from it
    (Kaldi frames are independent, so they are the window's own fbank exactly), minus the window's mean; the last
    window of a segment (it ends at the segment's end) and padded short segments are computed on their samples."""

    def __init__(self, embed_features: Callable[[list[np.ndarray]], np.ndarray], frontend: Any = None) -> None:
        from fun_asr.speakers.frontend import DEFAULT_FRONTEND

        self.embed_features = embed_features
        self.frontend = frontend or DEFAULT_FRONTEND
        self.sample_rate = int(self.frontend.sample_rate)
        self.windows: list[tuple[float, float]] = []
        self._done: list[np.ndarray] = []
        self._pending: list[np.ndarray] = []
        self.embed_ms = 0.0

    def add(self, start_s: float, samples: np.ndarray) -> None:
        """The speech segment that starts at ``start_s`` (seconds) and holds ``samples`` (16 kHz float32)."""
        import time

        from fun_asr.speakers.frontend import fbank, num_frames, speaker_features
        from fun_asr.speakers.timeline import sv_chunk

        samples = np.asarray(samples, np.float32)
        if samples.size == 0:
            return
        t0 = time.perf_counter()
        cfg, shift = self.frontend, self.frontend.shift_samples
        end_s = start_s + samples.shape[0] / self.sample_rate
        whole: np.ndarray | None = None
        for ws, we, data in sv_chunk([(start_s, end_s, samples)], fs=self.sample_rate):
            self.windows.append((float(ws), float(we)))
            offset = int(round((ws - start_s) * self.sample_rate))
            n = num_frames(data.shape[0], cfg)
            # unpadded (it lies inside the segment) and on a frame boundary: its frames are the segment's
            if offset % shift == 0 and offset + data.shape[0] <= samples.shape[0] and cfg.snip_edges:
                if whole is None:
                    whole = fbank(samples, cfg)
                k = offset // shift
                f = whole[k:k + n]
                if cfg.subtract_mean and f.shape[0]:
                    f = f - f.mean(axis=0, dtype=np.float32, keepdims=True)
                feats = np.ascontiguousarray(f, dtype=np.float32)
            else:
                feats = speaker_features(data, cfg)
            self._pending.append(feats)
        self.embed_ms += (time.perf_counter() - t0) * 1e3
        if len(self._pending) >= EMBED_BATCH:
            self._flush()

    def _flush(self) -> None:
        if not self._pending:
            return
        import time

        t0 = time.perf_counter()
        self._done.append(np.asarray(self.embed_features(self._pending), np.float32))
        self.embed_ms += (time.perf_counter() - t0) * 1e3
        self._pending = []

    def embeddings(self) -> np.ndarray:
        self._flush()
        if not self._done:
            return np.zeros((0, 0), np.float32)
        return np.concatenate(self._done)

    def label(self, segments: Sequence[tuple[float, float]], options: SpeakerOptions = SpeakerOptions()
              ) -> tuple[list[int | None], list[tuple[float, float, int]]]:
        """The speaker of each segment ((start_s, end_s), in time order) and the speaker timeline
        (``[(start_s, end_s, speaker)]``, FunASR's ``postprocess`` output). No windows (no speech): no
        speakers (each segment None)."""
        from fun_asr.speakers.cluster import cluster_speakers
        from fun_asr.speakers.timeline import distribute_speakers, speaker_timeline

        emb = self.embeddings()
        if emb.shape[0] == 0:
            return [None] * len(segments), []
        order = sorted(range(len(self.windows)), key=lambda i: self.windows[i][0])  # FunASR sorts by start
        windows = [self.windows[i] for i in order]
        emb = emb[order]
        labels = cluster_speakers(emb, num_speakers=options.num_speakers, min_speakers=options.min_speakers,
                                  max_speakers=options.max_speakers, clustering=options.speaker_clustering)
        timeline = [(float(a), float(b), int(s)) for a, b, s in speaker_timeline(windows, labels)]
        sentences = [{"start": int(round(a * 1000)), "end": int(round(b * 1000))} for a, b in segments]
        distribute_speakers(sentences, [list(t) for t in timeline])
        return [int(s["spk"]) for s in sentences], timeline


__all__ = ["EMBED_BATCH", "RecordingSpeakers", "SpeakerOptions"]
