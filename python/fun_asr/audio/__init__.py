"""Audio in: any file, bytes or array -> 16 kHz mono float32 (:mod:`~fun_asr.audio.decode`), FunASR's fbank + LFR
frontend (:mod:`~fun_asr.audio.frontend`) and the pause splitter used without a VAD (:mod:`~fun_asr.audio.pauses`)."""

from __future__ import annotations

from fun_asr.audio.decode import (
    SAMPLE_RATE,
    AudioError,
    AudioInfo,
    AudioInput,
    AudioReader,
    Limits,
    decode_audio,
    load_audio,
)

__all__ = ["SAMPLE_RATE", "AudioError", "AudioInfo", "AudioInput", "AudioReader", "Limits", "decode_audio",
           "load_audio"]
