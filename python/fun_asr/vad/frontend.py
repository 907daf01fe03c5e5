"""The VAD's frontend, FunASR's ``WavFrontendOnline``: the CMVN file, fbank + LFR features and the per-frame decibels
the decision logic reads.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from fun_asr.audio.fbank import FbankOptions
from fun_asr.audio.fbank import fbank as kaldi_fbank
from fun_asr.vad.config import VadFrontendConfig


def read_am_mvn(path: str | Path) -> tuple[np.ndarray, np.ndarray]:
    """``(shift, scale)`` float32 vectors of a Kaldi nnet text CMVN file (``<AddShift>``, ``<Rescale>``,
    each followed by a ``<LearnRateCoef> 0 [ v1 v2 ... ]`` line)."""
    text = Path(path).read_text(encoding="utf-8")
    lines = text.splitlines()
    found: dict[str, np.ndarray] = {}
    for i, line in enumerate(lines):
        tok = line.split()
        if tok and tok[0] in ("<AddShift>", "<Rescale>") and i + 1 < len(lines):
            nxt = lines[i + 1]
            if "[" not in nxt or "]" not in nxt:
                raise ValueError(f"{path}: {tok[0]} is not followed by a '[ ... ]' vector line")
            body = nxt[nxt.index("[") + 1: nxt.rindex("]")].split()
            vec = np.array([float(x) for x in body], dtype=np.float32)
            if len(tok) >= 2 and tok[1].isdigit() and int(tok[1]) != vec.size:
                raise ValueError(f"{path}: {tok[0]} declares {tok[1]} values, the vector has {vec.size}")
            found[tok[0]] = vec
    if "<AddShift>" not in found or "<Rescale>" not in found:
        raise ValueError(f"{path}: not a Kaldi nnet CMVN file (needs <AddShift> and <Rescale>)")
    shift, scale = found["<AddShift>"], found["<Rescale>"]
    if shift.shape != scale.shape:
        raise ValueError(f"{path}: <AddShift> has {shift.size} values, <Rescale> {scale.size}")
    return shift, scale


def num_fbank_frames(n_samples: int, fe: VadFrontendConfig = VadFrontendConfig()) -> int:
    """Kaldi snip-edges frame count: frames whose 25 ms window fits in ``n_samples``."""
    if n_samples < fe.frame_samples:
        return 0
    return (n_samples - fe.frame_samples) // fe.shift_samples + 1


def fbank_options(fe: VadFrontendConfig) -> FbankOptions:
    """The FSMN-VAD frontend's Kaldi fbank options (FunASR's WavFrontend with the VAD's config.yaml)."""
    return FbankOptions(sample_rate=fe.fs, num_mel_bins=fe.n_mels, frame_length_ms=float(fe.frame_length),
                        frame_shift_ms=float(fe.frame_shift), window=fe.window, dither=float(fe.dither),
                        preemphasis=0.97, input_scale=32768.0)


def vad_fbank(samples: np.ndarray, fe: VadFrontendConfig) -> np.ndarray:
    return kaldi_fbank(samples, fbank_options(fe))


def lfr_rows(fb: np.ndarray, first: int, count: int, total: int, m: int, base: int = 0) -> np.ndarray:
    """LFR rows ``first .. first+count-1`` (lfr_n = 1): fbank frames ``t - (m-1)//2 .. t + m-1-(m-1)//2``
    clamped to ``[0, total-1]``; ``fb[i]`` holds fbank frame ``base + i``."""
    left = (m - 1) // 2
    idx = np.arange(first, first + count)[:, None] + np.arange(-left, m - left)[None, :]
    idx = np.clip(idx, 0, total - 1) - base
    return fb[idx].reshape(count, m * fb.shape[1])


def vad_features(samples: np.ndarray, shift: np.ndarray, scale: np.ndarray,
                 fe: VadFrontendConfig = VadFrontendConfig()) -> np.ndarray:
    """16 kHz float samples in [-1, 1] -> CMVN'd LFR features float32[T, n_mels * lfr_m], T = fbank frames."""
    samples = np.asarray(samples, dtype=np.float32).reshape(-1)
    fb = vad_fbank(samples, fe)
    T = fb.shape[0]
    if T == 0:
        return np.zeros((0, fe.n_mels * fe.lfr_m), np.float32)
    feats = lfr_rows(fb, 0, T, T, fe.lfr_m)
    feats += shift
    feats *= scale
    return feats


def frame_decibels(samples: np.ndarray, first: int = 0, count: int | None = None, sample_base: int = 0,
                   fe: VadFrontendConfig = VadFrontendConfig()) -> np.ndarray:
    """FunASR's ``ComputeDecibel``: ``10 log10(sum(x^2) + 1e-6)`` over each frame's 400 samples (unscaled
    float32 waveform). ``samples[0]`` is absolute sample ``sample_base``; returns frames first..first+count-1."""
    samples = np.asarray(samples, dtype=np.float32).reshape(-1)
    if count is None:
        count = num_fbank_frames(sample_base + samples.shape[0], fe) - first
    out = np.empty(max(count, 0), np.float32)
    block = 4096
    for b in range(0, count, block):
        n = min(block, count - b)
        starts = (first + b + np.arange(n)) * fe.shift_samples - sample_base
        frames = samples[starts[:, None] + np.arange(fe.frame_samples)]
        out[b: b + n] = 10 * np.log10(np.sum(np.square(frames), axis=1) + 0.000001)
    return out
