"""Kaldi fbank on kaldi-native-fbank, one wrapper for every model's frontend (the ASR encoder's, the FSMN-VAD's,
CAM++'s): :class:`FbankOptions` (the options a FunASR frontend config sets; the rest at Kaldi's defaults),
:func:`fbank` of a whole signal and :class:`FbankStream` of one given in pieces. Each frontend module turns its
own config into FbankOptions and adds what is its own (LFR stacking, CMVN, mean removal)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

# kaldi_native_fbank.FbankOptions, part by part ("": its own fields): (its field, FbankOptions' field, type)
_KNF_FIELDS: dict[str, tuple[tuple[str, str, type], ...]] = {
    "frame_opts": (("samp_freq", "sample_rate", float), ("frame_length_ms", "frame_length_ms", float),
                   ("frame_shift_ms", "frame_shift_ms", float), ("dither", "dither", float),
                   ("snip_edges", "snip_edges", bool), ("window_type", "window", str),
                   ("preemph_coeff", "preemphasis", float), ("remove_dc_offset", "remove_dc_offset", bool),
                   ("round_to_power_of_two", "round_to_power_of_two", bool)),
    "mel_opts": (("num_bins", "num_mel_bins", int), ("low_freq", "low_freq", float),
                 ("high_freq", "high_freq", float)),
    "": (("energy_floor", "energy_floor", float), ("raw_energy", "raw_energy", bool),
         ("use_energy", "use_energy", bool), ("use_log_fbank", "use_log_fbank", bool),
         ("use_power", "use_power", bool), ("htk_compat", "htk_compat", bool)),
}


@dataclass(frozen=True)
class FbankOptions:
    """kaldi-native-fbank's ``FbankOptions`` as a value (defaults: Kaldi's, except ``dither`` 0). Samples are
    multiplied by ``input_scale`` first (FunASR's frontends take 16-bit-scaled audio: 32768)."""

    sample_rate: float
    num_mel_bins: int
    frame_length_ms: float = 25.0
    frame_shift_ms: float = 10.0
    window: str = "povey"
    dither: float = 0.0
    preemphasis: float = 0.97
    remove_dc_offset: bool = True
    snip_edges: bool = True
    round_to_power_of_two: bool = True
    low_freq: float = 20.0
    high_freq: float = 0.0
    energy_floor: float = 0.0
    raw_energy: bool = True
    use_energy: bool = False
    use_log_fbank: bool = True
    use_power: bool = True
    htk_compat: bool = False
    input_scale: float = 1.0

    def knf(self) -> Any:
        """These options as a ``kaldi_native_fbank.FbankOptions``."""
        import kaldi_native_fbank as knf

        opts = knf.FbankOptions()
        for part, fields in _KNF_FIELDS.items():
            target = getattr(opts, part) if part else opts
            for theirs, ours, kind in fields:
                setattr(target, theirs, kind(getattr(self, ours)))
        return opts

    def scaled(self, samples: np.ndarray) -> np.ndarray:
        x = np.asarray(samples, dtype=np.float32).reshape(-1)
        if self.input_scale != 1.0:
            x = x * np.float32(self.input_scale)
        return np.ascontiguousarray(x, dtype=np.float32)


def fbank(samples: np.ndarray, opts: FbankOptions) -> np.ndarray:
    """Kaldi fbank of float samples at ``opts.sample_rate`` -> float32[frames, num_mel_bins]."""
    return FbankStream(opts).accept(samples, final=True)


class FbankStream:
    """:func:`fbank` over audio given in pieces: :meth:`accept` returns the frames each piece completes (a frame
    is complete once its window has arrived); together they are exactly ``fbank`` of the whole audio (Kaldi
    frames are computed from their own window alone). Nothing is kept but the samples of the next window."""

    def __init__(self, opts: FbankOptions) -> None:
        import kaldi_native_fbank as knf

        self.opts = opts
        self._fb = knf.OnlineFbank(opts.knf())
        self.frames = 0  # frames returned so far

    def accept(self, samples: np.ndarray, final: bool = False) -> np.ndarray:
        """The next samples -> the frames they complete, float32[k, num_mel_bins]; ``final``: no more audio
        follows (frames that need no more samples are completed)."""
        o = self.opts
        if len(samples):
            self._fb.accept_waveform(float(o.sample_rate), o.scaled(samples))
        if final:
            self._fb.input_finished()
        n = self._fb.num_frames_ready
        if n == self.frames:
            return np.zeros((0, o.num_mel_bins), np.float32)
        out = np.stack([self._fb.get_frame(i) for i in range(self.frames, n)]).astype(np.float32)  # copies
        self._fb.pop(n - self.frames)  # knf keeps every frame otherwise
        self.frames = n
        return out
