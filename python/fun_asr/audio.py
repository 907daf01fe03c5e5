"""Audio in: any file soundfile reads (wav, flac, ogg, mp3, ...), bytes, file objects or arrays,
converted to 16 kHz mono float32 in [-1, 1] (channels averaged, resampled with soxr)."""

from __future__ import annotations

import io
import os
from typing import BinaryIO

import numpy as np

SAMPLE_RATE = 16000

AudioInput = str | os.PathLike | bytes | bytearray | BinaryIO | np.ndarray


class AudioError(ValueError):
    """The audio could not be read or is not usable (empty, non-finite, unknown rate)."""


def _read(source: str | os.PathLike | bytes | bytearray | BinaryIO) -> tuple[np.ndarray, int]:
    import soundfile as sf

    name = str(source) if isinstance(source, str | os.PathLike) else "<audio bytes>"
    if isinstance(source, str | os.PathLike) and not os.path.exists(source):
        raise FileNotFoundError(f"{source}: no such audio file")
    if isinstance(source, bytes | bytearray):
        source = io.BytesIO(bytes(source))
    try:
        data, rate = sf.read(source, dtype="float32", always_2d=True)
    except (sf.LibsndfileError, RuntimeError, TypeError) as exc:
        raise AudioError(
            f"{name}: cannot decode audio ({exc}); accepted: files libsndfile reads "
            f"(wav, flac, ogg/vorbis/opus, mp3, aiff, ...)"
        ) from None
    return data, int(rate)


def load_audio(audio: AudioInput, sample_rate: int | None = None) -> np.ndarray:
    """Returns 16 kHz mono float32 samples.

    ``audio``: a path, bytes, a binary file object, or a numpy array ``[samples]`` /
    ``[samples, channels]`` (float in [-1, 1], or int16/int32 PCM) with ``sample_rate``.
    """
    if isinstance(audio, np.ndarray):
        if sample_rate is None:
            raise AudioError("a numpy array needs sample_rate= (e.g. sample_rate=16000)")
        x = audio
        if x.dtype == np.int16:
            x = x.astype(np.float32) / 32768.0
        elif x.dtype == np.int32:
            x = x.astype(np.float32) / 2147483648.0
        elif x.dtype in (np.float32, np.float64):
            x = x.astype(np.float32, copy=False)
        else:
            raise AudioError(f"unsupported sample dtype {x.dtype}: accepted float32, float64, int16, int32")
        if x.ndim == 1:
            x = x[:, None]
        elif x.ndim != 2:
            raise AudioError(f"audio array must be [samples] or [samples, channels], got shape {x.shape}")
        rate = int(sample_rate)
        name = "<array>"
    else:
        if sample_rate is not None:
            raise AudioError("sample_rate= is only for numpy arrays; files carry their own rate")
        x, rate = _read(audio)
        name = str(audio) if isinstance(audio, str | os.PathLike) else "<audio bytes>"
    if rate <= 0:
        raise AudioError(f"{name}: invalid sample rate {rate}")
    if x.shape[0] == 0:
        raise AudioError(f"{name}: audio is empty (0 samples)")
    if not np.isfinite(x).all():
        raise AudioError(f"{name}: audio contains NaN or infinite samples")
    mono = x.mean(axis=1) if x.shape[1] > 1 else x[:, 0]
    if rate != SAMPLE_RATE:
        import soxr

        mono = soxr.resample(mono, rate, SAMPLE_RATE, quality="HQ")
    return np.ascontiguousarray(mono, dtype=np.float32)
