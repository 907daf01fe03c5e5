"""FunASR's WavFrontend (DESIGN §2.1): x32768, Kaldi fbank (80 mel, 25/10 ms, hamming, dither 0),
then LFR stacking m=7, n=6 -> float32[T_lfr, 560]."""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class FrontendConfig:
    sample_rate: int = 16000
    input_scale: float = 32768.0
    num_mel_bins: int = 80
    frame_length_ms: float = 25.0
    frame_shift_ms: float = 10.0
    window: str = "hamming"
    preemphasis: float = 0.97
    lfr_m: int = 7
    lfr_n: int = 6

    @classmethod
    def from_spec(cls, spec: dict) -> FrontendConfig:
        f = spec["frontend"]
        fb = f["fbank"]
        return cls(sample_rate=f["sample_rate"], input_scale=f["input_scale"], num_mel_bins=fb["num_mel_bins"],
                   frame_length_ms=fb["frame_length_ms"], frame_shift_ms=fb["frame_shift_ms"],
                   window=fb["window"], preemphasis=fb["preemphasis"], lfr_m=f["lfr_m"], lfr_n=f["lfr_n"])

    @property
    def seconds_per_lfr_frame(self) -> float:
        return self.frame_shift_ms / 1000.0 * self.lfr_n

    @property
    def samples_per_frame(self) -> int:
        """Samples in one analysis window (25 ms): less audio gives no feature frame at all."""
        return int(round(self.sample_rate * self.frame_length_ms / 1000.0))


def _fbank_options(cfg: FrontendConfig):  # noqa: ANN202 - knf.FbankOptions
    import kaldi_native_fbank as knf

    opts = knf.FbankOptions()
    opts.frame_opts.samp_freq = cfg.sample_rate
    opts.frame_opts.dither = 0.0
    opts.frame_opts.window_type = cfg.window
    opts.frame_opts.frame_length_ms = cfg.frame_length_ms
    opts.frame_opts.frame_shift_ms = cfg.frame_shift_ms
    opts.frame_opts.preemph_coeff = cfg.preemphasis
    opts.frame_opts.remove_dc_offset = True
    opts.frame_opts.snip_edges = True
    opts.mel_opts.num_bins = cfg.num_mel_bins
    opts.energy_floor = 0.0
    opts.use_power = True
    opts.use_log_fbank = True
    return opts


def fbank(samples: np.ndarray, cfg: FrontendConfig) -> np.ndarray:
    """Kaldi fbank of 16 kHz float samples in [-1, 1] -> float32[frames, num_mel_bins]."""
    import kaldi_native_fbank as knf

    fb = knf.OnlineFbank(_fbank_options(cfg))
    fb.accept_waveform(cfg.sample_rate, np.ascontiguousarray(samples * cfg.input_scale, dtype=np.float32))
    fb.input_finished()
    n = fb.num_frames_ready
    if n == 0:
        return np.zeros((0, cfg.num_mel_bins), np.float32)
    return np.stack([fb.get_frame(i) for i in range(n)]).astype(np.float32, copy=False)


class FbankStream:
    """:func:`fbank` over audio given in pieces: :meth:`accept` returns the frames each piece completes
    (a frame is complete once its 25 ms window has arrived); together they are exactly ``fbank`` of the
    whole audio (Kaldi frames are computed from their own window alone). Nothing is kept but the
    samples of the next frame's window."""

    def __init__(self, cfg: FrontendConfig) -> None:
        import kaldi_native_fbank as knf

        self.cfg = cfg
        self._fb = knf.OnlineFbank(_fbank_options(cfg))
        self.frames = 0  # frames returned so far

    def accept(self, samples: np.ndarray) -> np.ndarray:
        """The next 16 kHz samples in [-1, 1] -> the frames they complete, float32[k, num_mel_bins]."""
        cfg = self.cfg
        if len(samples):
            self._fb.accept_waveform(cfg.sample_rate, np.ascontiguousarray(samples * cfg.input_scale,
                                                                          dtype=np.float32))
        n = self._fb.num_frames_ready
        if n == self.frames:
            return np.zeros((0, cfg.num_mel_bins), np.float32)
        out = np.stack([self._fb.get_frame(i) for i in range(self.frames, n)]).astype(np.float32)  # copies
        self._fb.pop(n - self.frames)  # knf keeps every frame otherwise
        self.frames = n
        return out


def lfr(frames: np.ndarray, m: int, n: int) -> np.ndarray:
    """Low frame rate stacking: (m-1)//2 copies of frame 0 in front, ceil(T/n) rows of m frames,
    the last frame repeated where a window runs past the end."""
    T, d = frames.shape
    if T == 0:
        return np.zeros((0, d * m), np.float32)
    left = (m - 1) // 2
    padded = np.concatenate([np.repeat(frames[:1], left, axis=0), frames])
    t_lfr = math.ceil(T / n)
    idx = np.arange(t_lfr)[:, None] * n + np.arange(m)[None, :]
    idx = np.minimum(idx, padded.shape[0] - 1)
    return np.ascontiguousarray(padded[idx].reshape(t_lfr, d * m), dtype=np.float32)


def features(samples: np.ndarray, cfg: FrontendConfig) -> np.ndarray:
    """16 kHz mono float samples -> LFR features float32[T_lfr, num_mel_bins * lfr_m]."""
    return lfr(fbank(samples, cfg), cfg.lfr_m, cfg.lfr_n)


def fake_token_len(t_lfr: int, halvings: int = 3) -> int:
    """How many adaptor rows FunASR splices into the prompt: L = (L - 1) // 2 + 1, three times."""
    n = t_lfr
    for _ in range(halvings):
        n = (n - 1) // 2 + 1
    return n
