"""FunASR's WavFrontend (docs/model.md, Frontend): x32768, Kaldi fbank (80 mel, 25/10 ms, hamming, dither 0),
then LFR stacking m=7, n=6 -> float32[T_lfr, 560]."""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from fun_asr.audio.fbank import FbankOptions
from fun_asr.audio.fbank import FbankStream as KaldiFbankStream
from fun_asr.audio.fbank import fbank as kaldi_fbank


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


def fbank_options(cfg: FrontendConfig) -> FbankOptions:
    """The encoder frontend's Kaldi fbank options (FunASR's WavFrontend: no dither, power spectrum, log mel)."""
    return FbankOptions(sample_rate=cfg.sample_rate, num_mel_bins=cfg.num_mel_bins,
                        frame_length_ms=cfg.frame_length_ms, frame_shift_ms=cfg.frame_shift_ms, window=cfg.window,
                        preemphasis=cfg.preemphasis, input_scale=cfg.input_scale)


def fbank(samples: np.ndarray, cfg: FrontendConfig) -> np.ndarray:
    """Kaldi fbank of 16 kHz float samples in [-1, 1] -> float32[frames, num_mel_bins]."""
    return kaldi_fbank(samples, fbank_options(cfg))


class FbankStream(KaldiFbankStream):
    """:func:`fbank` over audio given in pieces (:class:`fun_asr.audio.fbank.FbankStream` with the encoder
    frontend's options): together the pieces' frames are exactly ``fbank`` of the whole audio."""

    def __init__(self, cfg: FrontendConfig) -> None:
        super().__init__(fbank_options(cfg))
        self.cfg = cfg


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
