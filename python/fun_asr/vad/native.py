"""An FSMN-VAD model put together (:class:`FsmnVad`: the native ggml network or the numpy reference, CMVN,
config) and its runners over audio in pieces: :class:`OfflineVad` (the same segments as one call, bounded
memory) and :class:`VadStream` (FunASR's streaming events).
"""

from __future__ import annotations

import copy
import dataclasses
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from fun_asr.audio.fbank import FbankStream
from fun_asr.vad.config import STREAMING_SILENCE_SCHEDULE, VadConfig
from fun_asr.vad.detector import OfflineChunks, Schedule, ServerSchedule, new_detector, silence_column
from fun_asr.vad.frontend import (
    fbank_options,
    frame_decibels,
    lfr_rows,
    num_fbank_frames,
    read_am_mvn,
    vad_fbank,
    vad_features,
)
from fun_asr.vad.network import FsmnWeights, vad_network_numpy


class FsmnVad:
    """An FSMN-VAD model: the network (native ggml by default, or the numpy reference), CMVN and config.

    :meth:`load` takes an ``fsmn_vad`` GGUF (``fun-asr-convert``) or a FunASR folder (``model.pt``,
    ``config.yaml``, ``am.mvn``); :meth:`from_dir` builds the numpy reference from a folder."""

    CHUNK_FRAMES = 6000  # frames per network call for a whole clip (60 s; caches carry across calls)

    def __init__(self, weights: FsmnWeights | None, shift: np.ndarray | None, scale: np.ndarray | None,
                 cfg: VadConfig, native: Any = None) -> None:
        self.weights = weights
        self.native = native  # fun_asr._core.VadModel: CMVN + network in ggml
        self.cfg = cfg
        if native is None and weights is None:
            raise ValueError("FsmnVad needs the native network or numpy weights")
        in_dim = native.info()["input_dim"] if native is not None else weights.in1[0].shape[1]
        self.shift = None if shift is None else np.asarray(shift, np.float32)
        self.scale = None if scale is None else np.asarray(scale, np.float32)
        if native is None and (self.shift is None or self.scale is None
                               or self.shift.shape != (in_dim,) or self.scale.shape != (in_dim,)):
            raise ValueError(f"CMVN must have {in_dim} values per vector (the network's input width)")
        if cfg.frontend.n_mels * cfg.frontend.lfr_m != in_dim:
            raise ValueError(f"frontend gives {cfg.frontend.n_mels}x{cfg.frontend.lfr_m} values per frame; "
                             f"the network takes {in_dim}")

    @classmethod
    def from_dir(cls, path: str | Path, **overrides: Any) -> FsmnVad:
        """The numpy reference network of a FunASR folder (tests; :meth:`load` is the fast path)."""
        from fun_asr.model.torch_pickle import load_state_dict

        path = Path(path)
        cfg = VadConfig.from_yaml(path / "config.yaml", **overrides)
        shift, scale = read_am_mvn(path / "am.mvn")
        return cls(FsmnWeights.from_state_dict(load_state_dict(path / "model.pt")), shift, scale, cfg)

    @classmethod
    def load(cls, path: str | Path, threads: int = 1, **overrides: Any) -> FsmnVad:
        """The native network of an ``fsmn_vad`` GGUF or a FunASR VAD folder."""
        from fun_asr.vad.files import load_native

        native, conf = load_native(path, threads=threads)
        return cls(None, None, None, VadConfig.from_dict(conf, **overrides), native=native)

    @property
    def threads(self) -> int:
        return self.native.threads if self.native is not None else 1

    def new_cache(self) -> np.ndarray:
        """Zero FSMN caches float32[n_layers, lorder-1, proj] (no history)."""
        if self.native is not None:
            i = self.native.info()
            return np.zeros((i["n_layers"], i["lorder"] - 1, i["proj_dim"]), np.float32)
        return np.stack(self.weights.new_cache())

    def silence_probs(self, raw_feats: np.ndarray, cache: np.ndarray, cfg: VadConfig | None = None) -> np.ndarray:
        """Silence probability per frame of LFR features before CMVN [T, in_dim]; ``cache`` carries."""
        cfg = cfg or self.cfg
        if raw_feats.shape[0] == 0:
            return np.zeros(0, np.float64)
        if self.native is not None and len(cfg.sil_pdf_ids) == 1:
            return self.native.forward(np.ascontiguousarray(raw_feats, np.float32), cache,
                                       int(cfg.sil_pdf_ids[0])).astype(np.float64)
        return silence_column(self.probs(raw_feats, cache), cfg.sil_pdf_ids)

    def probs(self, raw_feats: np.ndarray, cache: np.ndarray) -> np.ndarray:
        """Every class's probability [T, n_classes] of LFR features before CMVN; ``cache`` carries."""
        if self.native is not None:
            return self.native.forward(np.ascontiguousarray(raw_feats, np.float32), cache, -1)
        feats = (raw_feats + self.shift) * self.scale
        return vad_network_numpy(self.weights, feats, cache)

    def features(self, samples: np.ndarray) -> np.ndarray:
        """CMVN'd LFR features (numpy reference path)."""
        if self.shift is None:
            raise ValueError("features() needs the CMVN vectors (a model from from_dir)")
        return vad_features(samples, self.shift, self.scale, self.cfg.frontend)

    def frame_probs(self, samples: np.ndarray, fbank: np.ndarray | None = None) -> np.ndarray:
        """Softmax outputs float32[T, n_classes] of a whole clip (``fbank``: its frames, if computed)."""
        fe = self.cfg.frontend
        fb = vad_fbank(np.asarray(samples, np.float32).reshape(-1), fe) if fbank is None else fbank
        T = fb.shape[0]
        cache = self.new_cache()
        parts = [self.probs(lfr_rows(fb, a, min(self.CHUNK_FRAMES, T - a), T, fe.lfr_m), cache)
                 for a in range(0, T, self.CHUNK_FRAMES)]
        return np.concatenate(parts) if parts else np.zeros((0, 0), np.float32)

    def clip_silence_probs(self, fb: np.ndarray, cfg: VadConfig | None = None) -> np.ndarray:
        """Silence probability of every frame of a clip from its fbank frames, in CHUNK_FRAMES calls."""
        cfg = cfg or self.cfg
        T = fb.shape[0]
        cache = self.new_cache()
        parts = [self.silence_probs(lfr_rows(fb, a, min(self.CHUNK_FRAMES, T - a), T, cfg.frontend.lfr_m), cache,
                                    cfg) for a in range(0, T, self.CHUNK_FRAMES)]
        return np.concatenate(parts) if parts else np.zeros(0, np.float64)

    def segments(self, samples: np.ndarray, cfg: VadConfig | None = None, fbank: np.ndarray | None = None,
                 **overrides: Any) -> list[list[int]]:
        """``[[start_ms, end_ms], ...]`` of a whole clip, as FunASR 1.4.16's offline AutoModel.
        ``fbank``: the clip's Kaldi fbank frames when already computed (the ASR frontend shares them)."""
        cfg = cfg or self.cfg
        if overrides:
            cfg = dataclasses.replace(cfg, **overrides)
        samples = np.asarray(samples, dtype=np.float32).reshape(-1)
        fb = vad_fbank(samples, cfg.frontend) if fbank is None else fbank
        if fb.shape[0] != num_fbank_frames(samples.size, cfg.frontend):
            raise ValueError(f"fbank has {fb.shape[0]} frames; {samples.size} samples make "
                             f"{num_fbank_frames(samples.size, cfg.frontend)}")
        offline = OfflineVad(self, cfg)
        return offline.feed(samples, fb) + offline.close()

    def offline(self, cfg: VadConfig | None = None, **overrides: Any) -> OfflineVad:
        """:meth:`segments` for audio that arrives in pieces (a long file read block by block)."""
        cfg = cfg or self.cfg
        if overrides:
            cfg = dataclasses.replace(cfg, **overrides)
        return OfflineVad(self, cfg)

    def stream(self, chunk_ms: int = 60, cfg: VadConfig | None = None, schedule: str = "offline", *,
               server_schedule: Sequence[tuple[float, int]] | None = None, **overrides: Any) -> VadStream:
        """Streaming VAD: ``schedule="offline"`` as ``AutoModel.generate(cache=..., chunk_size=60)`` (the
        config's ``silence_schedule``/``dynamic_silence``), ``"server"`` as FunASR's realtime server
        (``DynamicStreamingVAD(silence_schedule=server_schedule)``, default ``STREAMING_SILENCE_SCHEDULE``)."""
        cfg = cfg or self.cfg
        if overrides:
            cfg = dataclasses.replace(cfg, **overrides)
        return VadStream(self, chunk_ms, cfg, schedule, server_schedule=server_schedule)



class OfflineVad:
    """:meth:`FsmnVad.segments` over audio given in pieces, with the same segments as one call on the
    whole clip: the network runs in the same ``CHUNK_FRAMES`` calls (each once its frames' right context
    has arrived), 1.4.16's 60 s offline chunks run once each is known not to be the last one. Memory
    stays bounded: only the frames and samples not yet through the network are kept.

    :meth:`feed` takes the next 16 kHz samples, and, when the caller computes the fbank anyway (the ASR
    frontend shares it), the frames those samples complete; :meth:`close` ends the clip. Both return the
    segments ``[[start_ms, end_ms], ...]`` completed so far, in order."""

    def __init__(self, vad: FsmnVad, cfg: VadConfig | None = None) -> None:
        self.vad = vad
        self.cfg = cfg or vad.cfg
        fe = self.cfg.frontend
        self._chunks = OfflineChunks(self.cfg)
        self._cache = vad.new_cache()
        self._knf: Any = None  # own fbank when the caller gives none
        self._fb = np.zeros((0, fe.n_mels), np.float32)  # fbank frames from self._fb_base on
        self._fb_base = 0
        self._s = np.zeros(0, np.float32)  # samples from self._s_base on
        self._s_base = 0
        self.n_samples = 0
        self._net = 0  # frames through the network
        self._closed = False
        self._sil = np.zeros(0, np.float64)  # each frame's silence probability, from frame self._sil_base on
        self._sil_base = 0

    def first_pending_frame(self) -> int:
        """No segment still to be returned starts before this fbank frame."""
        return self._chunks.det.first_pending_frame()

    def silence_probability(self, start_ms: int, end_ms: int) -> float | None:
        """The mean silence probability (the network's silence column, which the detector compares with
        ``speech_noise_thres``) over the frames that start in [start_ms, end_ms): a returned segment's
        ``no_speech_prob``. None when none of those frames is held (before :meth:`forget_before`'s frame)."""
        shift = self.cfg.frontend.frame_shift
        a = max(-(-int(start_ms) // shift), self._sil_base)
        b = min(-(-int(end_ms) // shift), self._sil_base + self._sil.size)
        if b <= a:
            return None
        return float(np.mean(self._sil[a - self._sil_base : b - self._sil_base], dtype=np.float64))

    def forget_before(self, frame: int) -> None:
        """Frames before ``frame`` are no longer asked about (:meth:`silence_probability`)."""
        drop = min(frame - self._sil_base, self._sil.size)
        if drop > 0:
            self._sil, self._sil_base = self._sil[drop:], self._sil_base + drop

    def feed(self, samples: np.ndarray, fbank: np.ndarray | None = None) -> list[list[int]]:
        """The next samples (16 kHz float in [-1, 1]); ``fbank``: the fbank frames they complete (exactly
        ``num_fbank_frames(all samples so far)`` frames in all), else computed here."""
        if self._closed:
            raise ValueError("OfflineVad is closed")
        fe = self.cfg.frontend
        samples = np.asarray(samples, dtype=np.float32).reshape(-1)
        if fbank is None:
            if self._knf is None:
                self._knf = FbankStream(fbank_options(fe))
            fbank = self._knf.accept(samples)
        self.n_samples += samples.size
        if self._fb_base + self._fb.shape[0] + fbank.shape[0] != num_fbank_frames(self.n_samples, fe):
            raise ValueError(f"{self.n_samples} samples make {num_fbank_frames(self.n_samples, fe)} fbank frames; "
                             f"got {self._fb_base + self._fb.shape[0] + fbank.shape[0]}")
        self._s = np.concatenate([self._s, samples]) if self._s.size else samples
        self._fb = np.concatenate([self._fb, fbank]) if self._fb.size else fbank
        return self._advance(False)

    def close(self) -> list[list[int]]:
        """Ends the clip: the last chunks run and an open segment closes."""
        if self._closed:
            return []
        self._closed = True
        return self._advance(True)

    def _advance(self, final: bool) -> list[list[int]]:
        cfg, fe = self.cfg, self.cfg.frontend
        total = num_fbank_frames(self.n_samples, fe)
        step, right = FsmnVad.CHUNK_FRAMES, self._chunks.keep
        while self._net < total:
            a = self._net
            if not final and total < a + step + right:
                break  # the chunk's last rows still wait for their right context
            count = min(step, total - a)
            rows = lfr_rows(self._fb, a, count, total, fe.lfr_m, base=self._fb_base)
            probs = self.vad.silence_probs(rows, self._cache, cfg)
            dbs = frame_decibels(self._s, a, count, self._s_base, fe)
            silence = silence_column(probs, cfg.sil_pdf_ids)
            self._chunks.push(silence, dbs)
            self._sil = np.concatenate([self._sil, np.asarray(silence, np.float64).reshape(-1)])
            self._net = a + count
            keep_fb = max(self._net - (fe.lfr_m - 1) // 2, 0) - self._fb_base  # the next rows' left context
            if keep_fb > 0:
                self._fb, self._fb_base = self._fb[keep_fb:], self._fb_base + keep_fb
            keep_s = self._net * fe.shift_samples - self._s_base
            if keep_s > 0:
                self._s, self._s_base = self._s[keep_s:], self._s_base + keep_s
        return self._chunks.run(self.n_samples, final)


class VadStream:
    """FunASR 1.4.16's streaming VAD: ``AutoModel.generate(input=chunk, cache=cache, is_final=...,
    chunk_size=chunk_ms)`` called once per :meth:`feed`. Incoming audio is cut into ``chunk_ms`` pieces
    (a remainder waits for the next call); each piece goes through the streaming frontend (frames are
    emitted once their LFR right context has arrived), the network with carried caches, the dynamic
    schedule (``chunk_ms`` per piece crossed in speech) and the detector. Returns FunASR's events."""

    def __init__(self, vad: FsmnVad, chunk_ms: int = 60, cfg: VadConfig | None = None,
                 schedule: str = "offline", *, server_schedule: Sequence[tuple[float, int]] | None = None) -> None:
        self.vad = vad
        self.cfg = cfg or vad.cfg
        if chunk_ms <= 0:
            raise ValueError(f"chunk_ms must be > 0, got {chunk_ms}")
        if schedule not in ("offline", "server"):
            raise ValueError(f"schedule must be 'offline' (AutoModel.generate) or 'server' (realtime server), "
                             f"got {schedule!r}")
        if server_schedule is not None and schedule != "server":
            raise ValueError("server_schedule is the realtime server's table (schedule='server'); the offline "
                             "schedule's is the config's silence_schedule")
        self.server_schedule = STREAMING_SILENCE_SCHEDULE
        if server_schedule is not None:
            try:
                rows = tuple((float(a), int(b)) for a, b in server_schedule)
            except (TypeError, ValueError):
                rows = ()
            if not rows or any(a < 0 or b < 0 for a, b in rows):
                raise ValueError(f"server_schedule must be [(accumulated_ms, silence_ms), ...] with values >= 0, got "
                                 f"{server_schedule!r:.80}")
            self.server_schedule = rows
        self.chunk_ms = chunk_ms
        self.schedule = schedule
        self.reset()

    def reset(self) -> None:
        fe = self.cfg.frontend
        self._stride = int(self.chunk_ms * fe.fs / 1000)
        self._pending = np.zeros(0, np.float32)  # samples not yet cut into a chunk
        self._fbank = FbankStream(fbank_options(fe))
        self._samples = np.zeros(0, np.float32)  # waveform from absolute sample self._sample_base on
        self._sample_base = 0
        self._n_samples = 0  # samples given to the frontend
        self._fb = np.zeros((0, fe.n_mels), np.float32)  # fbank frames from self._fb_base on
        self._fb_base = 0
        self._emitted = 0  # VAD frames emitted
        self._cache = self.vad.new_cache()
        self._det = new_detector(self.cfg)
        self._sched = (Schedule(self.cfg, self.chunk_ms) if self.schedule == "offline"
                       else ServerSchedule(self.cfg, self.server_schedule))
        self.frame_probs: list[np.ndarray] = []  # per piece, for tests/diagnostics (silence column)

    @property
    def frames(self) -> int:
        return self._emitted

    def _frontend(self, piece: np.ndarray, final: bool) -> tuple[np.ndarray, np.ndarray]:
        fe = self.cfg.frontend
        new = self._fbank.accept(piece)
        if piece.size:
            self._samples = np.concatenate([self._samples, piece])
            self._n_samples += piece.size
        total = num_fbank_frames(self._n_samples, fe)
        if new.shape[0]:
            self._fb = np.concatenate([self._fb, new]) if self._fb.size else new
        right = (fe.lfr_m - 1) - (fe.lfr_m - 1) // 2
        upto = total if final else max(total - right, 0)
        count = upto - self._emitted
        if count <= 0:
            return np.zeros((0, fe.n_mels * fe.lfr_m), np.float32), np.zeros(0, np.float32)
        feats = lfr_rows(self._fb, self._emitted, count, total, fe.lfr_m, base=self._fb_base)
        dbs = frame_decibels(self._samples, self._emitted, count, self._sample_base, fe)
        self._emitted = upto
        # drop what no later frame needs
        left = (fe.lfr_m - 1) // 2
        keep_fb = max(min(self._emitted - left, total - 1), 0) - self._fb_base
        if keep_fb > 0:
            self._fb = self._fb[keep_fb:]
            self._fb_base += keep_fb
        keep_s = self._emitted * fe.shift_samples - self._sample_base
        if keep_s > 0:
            self._samples = self._samples[keep_s:]
            self._sample_base += keep_s
        return feats, dbs

    def predicted_end(self, min_silence_ms: int = 0, horizon_ms: int = 10_000) -> int | None:
        """Where the open sentence would end (ms, as its end event would say) if only silence came from here
        on: a copy of the detector and of the end-silence schedule runs over silent frames, ``chunk_ms`` at a
        time, until it closes the sentence (at most ``horizon_ms``). None outside speech, while the frames
        have been silent for less than ``min_silence_ms``, or past the horizon. Audio that comes later may
        still change the end (speech again); this only says where it would be."""
        det = self._det
        if not det.in_speech or det.silence_ms < min_silence_ms:
            return None
        det, sched = det.fork(), copy.copy(self._sched)
        per_chunk = max(1, self._stride // self.cfg.frontend.shift_samples)
        silent, quiet = np.ones(per_chunk), np.full(per_chunk, -100.0)  # silence probability 1, -100 dB
        for _ in range(max(1, horizon_ms // self.chunk_ms)):
            sched.before_chunk(det, self._stride)
            events = det.accept(silent, quiet, streaming=True)
            sched.after_chunk(events)
            for _beg, end in events:
                if end >= 0:
                    return int(end)
        return None

    def feed(self, samples: np.ndarray, is_final: bool = False) -> list[list[int]]:
        """Next audio (16 kHz float in [-1, 1]); ``is_final`` on the last call flushes and closes the stream
        (the object is reset afterwards, like FunASR's cache)."""
        audio = np.concatenate([self._pending, np.asarray(samples, dtype=np.float32).reshape(-1)])
        stride = self._stride
        n = audio.size // stride + int(is_final)
        events: list[list[int]] = []
        for i in range(n):
            final = is_final and i == n - 1
            piece = audio[i * stride: (i + 1) * stride]
            self._sched.before_chunk(self._det, piece.size)
            feats, dbs = self._frontend(piece, final)
            if feats.shape[0] == 0:
                continue
            probs = self.vad.silence_probs(feats, self._cache, self.cfg)
            self.frame_probs.append(probs)
            ev = self._det.accept(probs, dbs, is_final=final, streaming=True)
            events.extend(ev)
            self._sched.after_chunk(ev)
        if is_final:
            self.reset()
        else:
            self._pending = audio[n * stride:].copy()
        return events
