"""CAM++'s features, as FunASR 1.4.16's ``funasr.models.campplus.utils.extract_feature``: Kaldi fbank with
torchaudio's ``kaldi.fbank`` defaults and 80 mel bins (FunASR's ``funasr.utils.fbank``, which computes it with
kaldi-native-fbank when torchaudio is absent: the same library and options are used here), on the float
samples as given (in [-1, 1]; no x32768 as in the ASR frontend), then minus the mean over time.

The options are data (model_specs/campplus.json ``frontend``, copied into every speaker GGUF):
dither 0, povey window, 25/10 ms, preemphasis 0.97, DC removal, snip_edges, power spectrum, log,
mel from 20 Hz to Nyquist. One feature frame per 10 ms; a window of n samples has
``1 + (n - 400) // 160`` frames (none under 400 samples).
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any

import numpy as np

from fun_asr.audio.fbank import FbankOptions
from fun_asr.audio.fbank import fbank as kaldi_fbank


@dataclass(frozen=True)
class SpeakerFrontendConfig(FbankOptions):
    """CAM++'s frontend: Kaldi fbank (every :class:`~fun_asr.audio.fbank.FbankOptions` field, with FunASR's
    CAM++ defaults: 16 kHz, 80 mel bins, energy floor 1) minus its mean over time."""

    sample_rate: float = 16000
    num_mel_bins: int = 80
    energy_floor: float = 1.0
    subtract_mean: bool = True

    @classmethod
    def from_spec(cls, spec: dict[str, Any]) -> SpeakerFrontendConfig:
        """The ``frontend`` section of a campplus model spec (unknown keys such as ``doc`` are ignored)."""
        section = spec.get("frontend", {})
        if not isinstance(section, dict):
            raise ValueError("campplus model spec: 'frontend' must be an object")
        names = {f.name: f.type for f in fields(cls)}
        return cls(**{k: v for k, v in section.items() if k in names})

    @property
    def frame_samples(self) -> int:
        return int(round(self.sample_rate * self.frame_length_ms / 1000.0))

    @property
    def shift_samples(self) -> int:
        return int(round(self.sample_rate * self.frame_shift_ms / 1000.0))


DEFAULT_FRONTEND = SpeakerFrontendConfig()


def num_frames(n_samples: int, cfg: SpeakerFrontendConfig = DEFAULT_FRONTEND) -> int:
    """Feature frames of ``n_samples`` samples (Kaldi snip_edges: frames whose window fits)."""
    if not cfg.snip_edges:
        return (n_samples + cfg.shift_samples // 2) // cfg.shift_samples
    if n_samples < cfg.frame_samples:
        return 0
    return (n_samples - cfg.frame_samples) // cfg.shift_samples + 1


def fbank(samples: np.ndarray, cfg: SpeakerFrontendConfig = DEFAULT_FRONTEND) -> np.ndarray:
    """Kaldi fbank of float samples (``cfg.sample_rate``) -> float32[frames, num_mel_bins] (no mean removal)."""
    return kaldi_fbank(samples, cfg)


def speaker_features(samples: np.ndarray, cfg: SpeakerFrontendConfig = DEFAULT_FRONTEND) -> np.ndarray:
    """CAM++'s input for one window: fbank minus its mean over time (float32[frames, num_mel_bins])."""
    feats = fbank(samples, cfg)
    if cfg.subtract_mean and feats.shape[0]:
        feats = feats - feats.mean(axis=0, dtype=np.float32, keepdims=True)
    return np.ascontiguousarray(feats, dtype=np.float32)
