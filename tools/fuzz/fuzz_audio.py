#!/usr/bin/env python3
"""Fuzz audio file bytes -> ``fun_asr.audio.decode.decode_audio`` -> ``fun_asr.audio.frontend.features`` (and the VAD's
frontend, ``fun_asr.vad.vad_features``).

Seeds: a clip of examples/en_hello.wav written by soundfile as WAV (PCM 8/16/24, float, u-law, stereo,
3 channels, WAVEX, RF64, W64), FLAC, OGG (Vorbis, Opus), MP3, AIFF, CAF, AU, plus a truncated WAV, a streamed
WAV (size fields 0xFFFFFFFF) and one shorter than a frame. Documented error: AudioError (a ValueError) naming
the problem; anything else, or a crash, is a finding. The limits are the defaults except max_audio_seconds=60.

    python tools/fuzz/fuzz_audio.py [-max_total_time=S] [-atheris_runs=N] | --replay FILES...
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import _fuzzlib  # noqa: E402

MODULES = ["fun_asr.audio.decode", "fun_asr.audio.frontend", "fun_asr.vad"]
MAX_SECONDS = 60.0


def seeds(out: Path) -> None:
    import _seeds

    for name, data in _seeds.audio_clips().items():
        (out / name).write_bytes(data)


def setup() -> None:
    pass


def one_input(data: bytes) -> None:
    import numpy as np

    from fun_asr.audio.decode import AudioError, Limits, decode_audio
    from fun_asr.audio.frontend import FrontendConfig, features
    from fun_asr.vad import VadFrontendConfig, vad_features

    try:
        samples, info = decode_audio(data, name="fuzz", limits=Limits(max_audio_seconds=MAX_SECONDS))
    except AudioError as exc:
        _fuzzlib.feedback(exc)
        return
    # resampling a few frames can leave none: the Session then says "too_short", as for any audio under 25 ms
    empty_ok = info.frames > 0 and info.sample_rate != 16000
    if (samples.dtype != np.float32 or samples.ndim != 1 or (not samples.size and not empty_ok)
            or not np.isfinite(samples).all()):
        raise _fuzzlib.Finding(f"decode_audio returned {samples.dtype} {samples.shape} (finite: "
                               f"{np.isfinite(samples).all()})")
    if samples.size > MAX_SECONDS * 16000 + 16000:
        raise _fuzzlib.Finding(f"decode_audio returned {samples.size / 16000:.1f} s over the {MAX_SECONDS} s limit")
    f = features(samples, FrontendConfig())
    if f.shape[1] != 560 or not np.isfinite(f).all():
        raise _fuzzlib.Finding(f"features {f.shape} finite={np.isfinite(f).all()}")
    ones = np.ones(400, np.float32)
    vad_features(samples, np.zeros(400, np.float32), ones, VadFrontendConfig())
    _fuzzlib.feedback(f"ok {info.channels} {info.truncated} {min(info.sample_rate // 8000, 8)}")


if __name__ == "__main__":
    _fuzzlib.main("audio", sys.modules[__name__])
