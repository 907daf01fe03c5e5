"""Audio in: any file soundfile reads (wav, flac, ogg, mp3, ...), bytes, file objects or arrays,
converted to 16 kHz mono float32 in [-1, 1] (channels averaged, resampled with soxr).

Nothing is dropped silently: a file whose header promises more audio than it holds (a truncated
download or copy) is read as far as it goes and reported (`AudioInfo.truncated`, a warning from
`load_audio`); arrays must say unambiguously which axis holds the channels.
"""

from __future__ import annotations

import io
import os
import struct
import warnings
from dataclasses import dataclass, field
from typing import BinaryIO

import numpy as np

SAMPLE_RATE = 16000
MAX_CHANNELS = 32  # more "channels" than this means the array's axes are the other way round
MAX_SAMPLE = 1e6  # |sample| above this is garbage, not audio (int16-scaled float files stay under 32768)
_BLOCK_FRAMES = 1 << 16  # small enough that a decoder error near a cut keeps what came before

AudioInput = str | os.PathLike | bytes | bytearray | memoryview | BinaryIO | np.ndarray
ACCEPTED = ("a path (str or os.PathLike), bytes, a binary file object (opened with 'rb'), or a numpy array "
            "with sample_rate=")


class AudioError(ValueError):
    """The audio could not be read or is not usable (empty, non-finite, unknown rate, over a limit)."""


@dataclass(frozen=True)
class Limits:
    """What a Session accepts (every limit gives a ValueError naming it; all configurable:
    ``Session(limits=Limits(max_audio_seconds=...))``; the server has matching flags)."""

    max_audio_seconds: float = 24 * 3600.0  # one recording (before resampling)
    min_sample_rate: int = 1000
    max_sample_rate: int = 384_000
    max_channels: int = MAX_CHANNELS
    max_hotwords: int = 200
    max_hotword_chars: int = 100
    max_new_tokens: int = 4096  # per segment; the decoder's context bounds it too


@dataclass
class AudioInfo:
    """What reading one recording found out about it."""

    name: str
    sample_rate: int  # the source's rate (before resampling to 16 kHz)
    channels: int
    frames: int  # frames decoded, at the source rate
    declared_frames: int | None = None  # frames the header promises, when more than were decoded
    decode_error: str | None = None  # the decoder stopped with this error after some audio
    warnings: list[str] = field(default_factory=list)

    @property
    def truncated(self) -> bool:
        """The file holds less audio than its header promises (e.g. a partial download)."""
        return self.decode_error is not None or (self.declared_frames is not None
                                                 and self.frames < self.declared_frames)

    @property
    def duration(self) -> float:
        return self.frames / self.sample_rate if self.sample_rate > 0 else 0.0


def check_audio_input(audio: object, what: str = "audio") -> None:
    """TypeError naming what is accepted unless `audio` is one recording we can read."""
    if isinstance(audio, np.ndarray | bytes | bytearray | memoryview | str | os.PathLike):
        if isinstance(audio, str) and audio == "":
            raise AudioError(f"{what} is an empty path")
        return
    if isinstance(audio, io.TextIOBase):
        raise TypeError(f"{what} is a file opened in text mode ({getattr(audio, 'name', 'file object')}); "
                        "open it in binary mode: open(path, 'rb')")
    if hasattr(audio, "read"):
        return
    if isinstance(audio, list | tuple):
        raise TypeError(f"{what} is a {type(audio).__name__}: give one recording as {ACCEPTED} — raw samples as "
                        "np.asarray(samples, dtype=np.float32); several recordings go to transcribe_batch")
    raise TypeError(f"{what} must be {ACCEPTED}; got {type(audio).__name__}")


def _wav_declared_frames(head: bytes, total_size: int) -> int | None:
    """Frames a RIFF/WAVE header promises when its data chunk claims more bytes than the file holds.

    Streamed WAVs (size fields 0 or 0xFFFFFFFF, as written to pipes) and RF64 promise nothing.
    """
    if len(head) < 12 or head[:4] != b"RIFF" or head[8:12] != b"WAVE":
        return None
    pos, block_align = 12, 0
    while pos + 8 <= len(head):
        cid, size = head[pos : pos + 4], struct.unpack("<I", head[pos + 4 : pos + 8])[0]
        if cid == b"fmt " and pos + 8 + 14 <= len(head):
            block_align = struct.unpack("<H", head[pos + 8 + 12 : pos + 8 + 14])[0]
        if cid == b"data":
            if size in (0, 0xFFFFFFFF) or block_align <= 0:
                return None
            available = total_size - (pos + 8)
            return size // block_align if size > available else None
        pos += 8 + size + (size & 1)
    return None


def _read(source: str | os.PathLike | bytes | bytearray | memoryview | BinaryIO,
          name: str | None, max_seconds: float = float("inf")) -> tuple[np.ndarray, AudioInfo]:
    import soundfile as sf

    given = name
    name = given or (os.fspath(source) if isinstance(source, str | os.PathLike) else "<audio bytes>")
    if isinstance(source, str | os.PathLike):
        if os.path.isdir(source):
            raise AudioError(f"{name}: is a directory, not an audio file")
        if not os.path.exists(source):
            raise FileNotFoundError(f"{name}: no such audio file")
        with open(source, "rb") as f:
            head = f.read(1 << 16)
        total = os.path.getsize(source)
        target: object = name
    else:
        if isinstance(source, bytes | bytearray | memoryview):
            data = bytes(source)
        else:
            name = given or str(getattr(source, "name", "<file object>"))
            data = source.read()
            if isinstance(data, str):
                raise TypeError(f"{name}: file object is in text mode; open it in binary mode ('rb')")
            if data is None:
                data = b""
            data = bytes(data)
        if not data:
            raise AudioError(f"{name}: no data (0 bytes)")
        head, total, target = data[: 1 << 16], len(data), io.BytesIO(data)
    wav_frames = _wav_declared_frames(head, total)
    blocks: list[np.ndarray] = []
    decoded = 0
    error: str | None = None
    try:
        with sf.SoundFile(target) as f:
            rate, channels = int(f.samplerate), int(f.channels)
            declared = int(f.frames) if f.seekable() and 0 < f.frames < 2**62 else None
            if rate > 0 and declared is not None and declared > max_seconds * rate:
                raise AudioError(f"{name}: {declared / rate:.1f} s of audio; at most {max_seconds:g} s are accepted "
                                 "(Limits.max_audio_seconds)")
            while True:
                try:
                    block = f.read(_BLOCK_FRAMES, dtype="float32", always_2d=True)
                except (sf.LibsndfileError, RuntimeError) as exc:  # e.g. "flac decoder lost sync" at a cut
                    if not blocks:
                        raise
                    error = str(exc)
                    break
                if len(block) == 0:
                    break
                blocks.append(block)
                decoded += len(block)
                if decoded > max_seconds * rate:  # no header length (a stream, or one that lies): stop here
                    raise AudioError(f"{name}: more than {max_seconds:g} s of audio; at most {max_seconds:g} s are "
                                     "accepted (Limits.max_audio_seconds)")
    except AudioError:
        raise
    except (sf.LibsndfileError, RuntimeError, TypeError) as exc:
        why = str(exc).replace(repr(target), "the data")  # not "<_io.BytesIO object at 0x7f...>"
        raise AudioError(
            f"{name}: cannot decode audio ({why}); accepted: files libsndfile reads "
            f"(wav, flac, ogg/vorbis/opus, mp3, aiff, ...)"
        ) from None
    x = np.concatenate(blocks) if blocks else np.zeros((0, channels), np.float32)
    promised = [d for d in (declared, wav_frames) if d is not None and d > len(x)]
    info = AudioInfo(name, rate, channels, len(x), max(promised) if promised else None, decode_error=error)
    if info.truncated:
        of = f" of the {info.declared_frames / rate:.2f} s its header promises" if info.declared_frames else ""
        why = f" (decoder: {error})" if error else ""
        info.warnings.append(f"{name}: file is truncated: only {len(x) / rate:.2f} s{of} could be read{why}")
    return x, info


def _from_array(audio: np.ndarray, sample_rate: int | None, name: str) -> tuple[np.ndarray, AudioInfo]:
    if sample_rate is None:
        raise AudioError(f"{name}: a numpy array needs sample_rate= (e.g. sample_rate=16000)")
    if isinstance(sample_rate, bool) or not isinstance(sample_rate, int | np.integer):
        raise TypeError(f"sample_rate must be an integer number of Hz, got {sample_rate!r}")
    x = audio
    if x.dtype == np.int16:
        x = x.astype(np.float32) / 32768.0
    elif x.dtype == np.int32:
        x = x.astype(np.float32) / 2147483648.0
    elif x.dtype in (np.float32, np.float64, np.float16):
        x = x.astype(np.float32, copy=False)
    else:
        raise AudioError(f"{name}: unsupported sample dtype {x.dtype}: accepted float32, float64, float16, int16, "
                         "int32")
    if x.ndim == 1:
        x = x[:, None]
    elif x.ndim == 2:
        a, b = x.shape
        if a <= MAX_CHANNELS < b:  # (channels, samples): what librosa and torchaudio return
            x = x.T
        elif not (b <= MAX_CHANNELS < a):  # not (samples, channels) either
            raise AudioError(
                f"{name}: audio array of shape {x.shape} is ambiguous: accepted [samples], [samples, channels] or "
                f"[channels, samples] with at most {MAX_CHANNELS} channels and more samples than channels; "
                "pass a 1-D array for mono"
            )
    else:
        raise AudioError(f"{name}: audio array must be [samples], [samples, channels] or [channels, samples], "
                         f"got shape {x.shape}")
    return x, AudioInfo(name, int(sample_rate), int(x.shape[1]), int(x.shape[0]))


def decode_audio(audio: AudioInput, sample_rate: int | None = None,
                 name: str | None = None, limits: Limits | None = None) -> tuple[np.ndarray, AudioInfo]:
    """16 kHz mono float32 samples and what was found while reading them (`AudioInfo`).
    ``name`` replaces the recording's name in messages (default: its path, ``<array>``, ...)."""
    lim = limits or Limits()
    check_audio_input(audio)
    if isinstance(audio, np.ndarray):
        x, info = _from_array(audio, sample_rate, name or "<array>")
    else:
        if sample_rate is not None:
            raise AudioError("sample_rate= is only for numpy arrays; files carry their own rate")
        x, info = _read(audio, name, lim.max_audio_seconds)
    name, rate = info.name, info.sample_rate
    if not lim.min_sample_rate <= rate <= lim.max_sample_rate:
        raise AudioError(f"{name}: sample rate {rate} Hz is outside the accepted {lim.min_sample_rate}-"
                         f"{lim.max_sample_rate} Hz")
    if x.shape[1] > lim.max_channels:
        raise AudioError(f"{name}: {x.shape[1]} channels; at most {lim.max_channels} are accepted")
    if x.shape[0] > lim.max_audio_seconds * rate:
        raise AudioError(f"{name}: {x.shape[0] / rate:.1f} s of audio; at most {lim.max_audio_seconds:g} s are "
                         "accepted (Limits.max_audio_seconds)")
    if x.shape[0] == 0:
        extra = f" ({info.warnings[0]})" if info.warnings else ""
        raise AudioError(f"{name}: audio is empty (0 samples){extra}")
    if not np.isfinite(x).all():
        raise AudioError(f"{name}: audio contains NaN or infinite samples")
    peak = float(np.abs(x).max())
    if peak > MAX_SAMPLE:  # float files can hold anything; beyond this the fbank's power overflows float32
        raise AudioError(f"{name}: samples reach {peak:.3g}; float audio must be in [-1, 1] (magnitudes over "
                         f"{MAX_SAMPLE:g} are refused)")
    mono = x.mean(axis=1) if x.shape[1] > 1 else x[:, 0]
    if rate != SAMPLE_RATE:
        import soxr

        mono = soxr.resample(mono, rate, SAMPLE_RATE, quality="HQ")
    return np.ascontiguousarray(mono, dtype=np.float32), info


def load_audio(audio: AudioInput, sample_rate: int | None = None) -> np.ndarray:
    """Returns 16 kHz mono float32 samples.

    ``audio``: a path, bytes, a binary file object, or a numpy array ``[samples]``,
    ``[samples, channels]`` or ``[channels, samples]`` (float in [-1, 1], or int16/int32 PCM) with
    ``sample_rate``. A truncated file is read as far as it goes, with a warning.
    """
    samples, info = decode_audio(audio, sample_rate)
    from fun_asr.notices import InputWarning

    for w in info.warnings:
        warnings.warn(w, InputWarning, stacklevel=2)
    return samples
