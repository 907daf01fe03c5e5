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
class SpeakerFrontendConfig:
    sample_rate: int = 16000
    input_scale: float = 1.0
    num_mel_bins: int = 80
    frame_length_ms: float = 25.0
    frame_shift_ms: float = 10.0
    window: str = "povey"
    dither: float = 0.0
    preemphasis: float = 0.97
    remove_dc_offset: bool = True
    round_to_power_of_two: bool = True
    snip_edges: bool = True
    low_freq: float = 20.0
    high_freq: float = 0.0
    energy_floor: float = 1.0
    raw_energy: bool = True
    use_energy: bool = False
    use_log_fbank: bool = True
    use_power: bool = True
    htk_compat: bool = False
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


def fbank_options(cfg: SpeakerFrontendConfig) -> FbankOptions:
    """CAM++'s Kaldi fbank options: every field of its frontend config."""
    return FbankOptions(
        sample_rate=float(cfg.sample_rate), num_mel_bins=int(cfg.num_mel_bins),
        frame_length_ms=float(cfg.frame_length_ms), frame_shift_ms=float(cfg.frame_shift_ms),
        window=str(cfg.window), dither=float(cfg.dither), preemphasis=float(cfg.preemphasis),
        remove_dc_offset=bool(cfg.remove_dc_offset), snip_edges=bool(cfg.snip_edges),
        round_to_power_of_two=bool(cfg.round_to_power_of_two), low_freq=float(cfg.low_freq),
        high_freq=float(cfg.high_freq), energy_floor=float(cfg.energy_floor), raw_energy=bool(cfg.raw_energy),
        use_energy=bool(cfg.use_energy), use_log_fbank=bool(cfg.use_log_fbank), use_power=bool(cfg.use_power),
        htk_compat=bool(cfg.htk_compat), input_scale=float(cfg.input_scale))


def fbank(samples: np.ndarray, cfg: SpeakerFrontendConfig = DEFAULT_FRONTEND) -> np.ndarray:
    """Kaldi fbank of float samples (``cfg.sample_rate``) -> float32[frames, num_mel_bins] (no mean removal)."""
    return kaldi_fbank(samples, fbank_options(cfg))


def speaker_features(samples: np.ndarray, cfg: SpeakerFrontendConfig = DEFAULT_FRONTEND) -> np.ndarray:
    """CAM++'s input for one window: fbank minus its mean over time (float32[frames, num_mel_bins])."""
    feats = fbank(samples, cfg)
    if cfg.subtract_mean and feats.shape[0]:
        feats = feats - feats.mean(axis=0, dtype=np.float32, keepdims=True)
    return np.ascontiguousarray(feats, dtype=np.float32)
