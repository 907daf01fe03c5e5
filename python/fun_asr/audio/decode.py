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
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import BinaryIO

import numpy as np

from fun_asr.errors import FunAsrError, naming

SAMPLE_RATE = 16000
MAX_CHANNELS = 32  # more "channels" than this means the array's axes are the other way round
MAX_SAMPLE = 1e6  # |sample| above this is garbage, not audio (int16-scaled float files stay under 32768)
_BLOCK_FRAMES = 1 << 16  # small enough that a decoder error near a cut keeps what came before

AudioInput = str | os.PathLike | bytes | bytearray | memoryview | BinaryIO | np.ndarray
ACCEPTED = ("a path (str or os.PathLike), bytes, a binary file object (opened with 'rb'), or a numpy array "
            "with sample_rate=")


class AudioError(ValueError):
    """The audio could not be read or is not usable (empty, non-finite, unknown rate, over a limit). ``source``:
    the recording the message starts with (``"NAME: what is wrong"``), or None where it names none
    (:func:`fun_asr.errors.names_input`)."""

    def __init__(self, *args: object, source: str | None = None) -> None:
        super().__init__(*args)
        self.source = source


class AudioLimitError(FunAsrError, AudioError):
    """A recording over ``Limits.max_audio_seconds`` (code ``limit.audio_seconds``)."""


def too_long(name: str, seconds: float | None, most: float) -> AudioLimitError:
    """The error of recording ``name`` (``seconds`` long; None: more than ``most``, its length unknown)."""
    said = "more than {most:g}" if seconds is None else "{seconds:.1f}"
    return naming(AudioLimitError("limit.audio_seconds", "{name}: " + said + " s of audio; at most {most:g} s are "
                                  "accepted{l[max_audio_seconds]}", limit="max_audio_seconds", name=name,
                                  seconds=seconds, most=most), name)


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


def _decode_failed(name: str, exc: BaseException, target: object) -> AudioError:
    why = str(exc).replace(repr(target), "the data")  # not "<_io.BytesIO object at 0x7f...>"
    return AudioError(f"{name}: cannot decode audio ({why}); accepted: files libsndfile reads "
                      f"(wav, flac, ogg/vorbis/opus, mp3, aiff, ...)", source=name)


# an array's layout: (transposed, i.e. [channels, samples], and its channel count)
Layout = tuple[bool, int]


def _layout_2d(shape: tuple[int, ...], name: str, known: Layout | None = None) -> tuple[bool, int, int]:
    """(transposed, channels, frames) of a 2-D array's shape. ``known``: the layout of a stream's earlier pieces,
    which settles a piece too short to tell by itself (both axes at most :data:`MAX_CHANNELS`)."""
    a, b = shape
    if a <= MAX_CHANNELS < b:  # (channels, samples): what librosa and torchaudio return
        return True, a, b
    if b <= MAX_CHANNELS < a:  # (samples, channels)
        return False, b, a
    if known is not None and shape[0 if known[0] else 1] == known[1]:
        return known[0], known[1], shape[1 if known[0] else 0]
    raise AudioError(
        f"{name}: audio array of shape {tuple(shape)} is ambiguous: accepted [samples], [samples, channels] or "
        f"[channels, samples] with at most {MAX_CHANNELS} channels and more samples than channels; "
        "pass a 1-D array for mono", source=name,
    )


def _array_layout(audio: np.ndarray, sample_rate: int | None, name: str,
                  known: Layout | None = None) -> tuple[np.ndarray, bool, AudioInfo]:
    """The array as given, whether it is [channels, samples] (read transposed), and its AudioInfo; the
    samples are converted to float32 block by block (:func:`_array_block`). ``known``: see :func:`_layout_2d`."""
    if sample_rate is None:
        raise AudioError(f"{name}: a numpy array needs sample_rate= (e.g. sample_rate=16000)", source=name)
    if isinstance(sample_rate, bool) or not isinstance(sample_rate, int | np.integer):
        raise TypeError(f"sample_rate must be an integer number of Hz, got {sample_rate!r}")
    x = audio
    if x.dtype not in (np.int16, np.int32, np.float32, np.float64, np.float16):
        raise AudioError(f"{name}: unsupported sample dtype {x.dtype}: accepted float32, float64, float16, int16, "
                         "int32", source=name)
    transposed = False
    if x.ndim == 1:
        channels, frames = 1, x.shape[0]
    elif x.ndim == 2:
        transposed, channels, frames = _layout_2d(x.shape, name, known)
    else:
        raise AudioError(f"{name}: audio array must be [samples], [samples, channels] or [channels, samples], "
                         f"got shape {x.shape}", source=name)
    return x, transposed, AudioInfo(name, int(sample_rate), int(channels), int(frames))


def _array_block(x: np.ndarray, transposed: bool, a: int, b: int) -> np.ndarray:
    """Frames [a, b) of an array as float32 [frames, channels] (int16/int32 PCM scaled to [-1, 1])."""
    part = x[:, a:b] if transposed else x[a:b]
    if part.dtype == np.int16:
        part = part.astype(np.float32) / 32768.0
    elif part.dtype == np.int32:
        part = part.astype(np.float32) / 2147483648.0
    else:
        part = part.astype(np.float32, copy=False)
    if part.ndim == 1:
        return part[:, None]
    return part.T if transposed else part


def downmix(block: np.ndarray) -> np.ndarray:
    """float32 ``[frames, channels]`` -> mono float32 ``[frames]``: the channels averaged, as every recording
    (file, array, piped input, a stream's pieces) becomes mono."""
    mono = block.mean(axis=1) if block.shape[1] > 1 else block[:, 0]
    return np.ascontiguousarray(mono, dtype=np.float32)


def array_to_mono(audio: np.ndarray, sample_rate: int, name: str = "<array>",
                  known: Layout | None = None) -> tuple[np.ndarray, Layout | None]:
    """A numpy array as :func:`decode_audio` reads it, to mono float32 at its own rate: ``[samples]``,
    ``[samples, channels]`` or ``[channels, samples]`` (the same layout rules; ``known``: a stream's layout so
    far, for pieces too short to tell), float16/32/64 or int16/int32 PCM (scaled to [-1, 1]), channels averaged
    (:func:`downmix`). Returns the samples and the array's layout (None for 1-D). AudioError naming what is wrong
    (an ambiguous shape, a dtype); the samples' values are the caller's to check."""
    x, transposed, info = _array_layout(audio, sample_rate, name, known)
    mono = downmix(_array_block(x, transposed, 0, info.frames))
    return mono, (None if x.ndim == 1 else (transposed, info.channels))


class AudioReader:
    """One recording read block by block as 16 kHz mono float32 in [-1, 1] (channels averaged,
    resampled with soxr's streaming resampler): the blocks joined are exactly :func:`decode_audio`'s
    samples, and a long file is never held whole.

    Opening checks what is known up front (the path, the header's length, rate and channels against
    ``limits``); :meth:`blocks` checks each block as it comes (NaN or infinite samples, magnitudes, a
    length over the limit without a header) and raises :class:`AudioError` naming the recording.
    ``info`` is complete (frames, truncation, warnings) once :meth:`blocks` has run to its end."""

    def __init__(self, audio: AudioInput, sample_rate: int | None = None, name: str | None = None,
                 limits: Limits | None = None) -> None:
        self.limits = lim = limits or Limits()
        check_audio_input(audio)
        self._sf: object = None
        self._array: np.ndarray | None = None
        self._transposed = False
        self._wav_frames: int | None = None
        self._declared: int | None = None
        self._target: object = None
        if isinstance(audio, np.ndarray):
            self._array, self._transposed, self.info = _array_layout(audio, sample_rate, name or "<array>")
            self._declared = self.info.frames
        else:
            if sample_rate is not None:
                raise AudioError("sample_rate= is only for numpy arrays; files carry their own rate")
            self._open(audio, name, lim.max_audio_seconds)
        name, rate = self.info.name, self.info.sample_rate
        try:
            if not lim.min_sample_rate <= rate <= lim.max_sample_rate:
                raise AudioError(f"{name}: sample rate {rate} Hz is outside the accepted {lim.min_sample_rate}-"
                                 f"{lim.max_sample_rate} Hz", source=name)
            if self.info.channels > lim.max_channels:
                raise AudioError(f"{name}: {self.info.channels} channels; at most {lim.max_channels} are accepted",
                                 source=name)
            if self._array is not None and self.info.frames > lim.max_audio_seconds * rate:
                raise too_long(name, self.info.frames / rate, lim.max_audio_seconds)
        except AudioError:
            self.close()
            raise

    @property
    def name(self) -> str:
        return self.info.name

    @property
    def expected_seconds(self) -> float | None:
        """The length the array or the file's header gives (None when unknown, e.g. a streamed WAV)."""
        return self._declared / self.info.sample_rate if self._declared is not None else None

    def _open(self, source: str | os.PathLike | bytes | bytearray | memoryview | BinaryIO, given: str | None,
              max_seconds: float) -> None:
        import soundfile as sf

        name = given or (os.fspath(source) if isinstance(source, str | os.PathLike) else "<audio bytes>")
        if isinstance(source, str | os.PathLike):
            if os.path.isdir(source):
                raise AudioError(f"{name}: is a directory, not an audio file", source=name)
            if not os.path.exists(source):
                raise naming(FileNotFoundError(f"{name}: no such audio file"), name)
            total = os.path.getsize(source)
            if total == 0 and os.path.isfile(source):
                raise AudioError(f"{name}: file is empty (0 bytes)", source=name)
            with open(source, "rb") as f:
                head = f.read(1 << 16)
            target: object = os.fspath(source)
        else:
            if isinstance(source, bytes | bytearray | memoryview):
                data = bytes(source)
            else:
                name = given or str(getattr(source, "name", "<file object>"))
                data = source.read()
                if isinstance(data, str):
                    raise naming(TypeError(f"{name}: file object is in text mode; open it in binary mode ('rb')"), name)
                if data is None:
                    data = b""
                data = bytes(data)
            if not data:
                raise AudioError(f"{name}: no data (0 bytes)", source=name)
            head, total, target = data[: 1 << 16], len(data), io.BytesIO(data)
        self._wav_frames = _wav_declared_frames(head, total)
        self._target = target
        try:
            f = sf.SoundFile(target)
        except (sf.LibsndfileError, RuntimeError, TypeError) as exc:
            raise _decode_failed(name, exc, target) from None
        self._sf = f
        rate, channels = int(f.samplerate), int(f.channels)
        self._declared = int(f.frames) if f.seekable() and 0 < f.frames < 2**62 else None
        self.info = AudioInfo(name, rate, channels, 0)
        if rate > 0 and self._declared is not None and self._declared > max_seconds * rate:
            self.close()
            raise too_long(name, self._declared / rate, max_seconds)

    def close(self) -> None:
        if self._sf is not None:
            self._sf.close()
            self._sf = None

    def __enter__(self) -> AudioReader:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _source_blocks(self) -> Iterator[np.ndarray]:
        """float32 [frames, channels] blocks at the source rate."""
        if self._array is not None:
            for a in range(0, self.info.frames, _BLOCK_FRAMES):
                yield _array_block(self._array, self._transposed, a, min(a + _BLOCK_FRAMES, self.info.frames))
            return
        import soundfile as sf

        f, name, rate = self._sf, self.info.name, self.info.sample_rate
        max_seconds = self.limits.max_audio_seconds
        decoded = 0
        while True:
            try:
                block = f.read(_BLOCK_FRAMES, dtype="float32", always_2d=True)
            except (sf.LibsndfileError, RuntimeError) as exc:  # e.g. "flac decoder lost sync" at a cut
                if decoded == 0:
                    raise _decode_failed(name, exc, self._target) from None
                self.info.decode_error = str(exc)
                break
            except TypeError as exc:
                raise _decode_failed(name, exc, self._target) from None
            if len(block) == 0:
                break
            decoded += len(block)
            if decoded > max_seconds * rate:  # no header length (a stream, or one that lies): stop here
                raise too_long(name, None, max_seconds)
            yield block

    def blocks(self) -> Iterator[np.ndarray]:
        """16 kHz mono float32 blocks (about 4 s of the source each); AudioError on unusable audio."""
        info, lim = self.info, self.limits
        name, rate = info.name, info.sample_rate
        resampler = None
        if rate != SAMPLE_RATE:
            import soxr

            resampler = soxr.ResampleStream(rate, SAMPLE_RATE, 1, dtype="float32", quality="HQ")
        frames = 0
        try:
            for x in self._source_blocks():
                frames += len(x)
                if not np.isfinite(x).all():
                    raise AudioError(f"{name}: audio contains NaN or infinite samples", source=name)
                peak = float(np.abs(x).max())
                if peak > MAX_SAMPLE:  # float files can hold anything; beyond this the fbank's power overflows
                    raise AudioError(f"{name}: samples reach {peak:.3g}; float audio must be in [-1, 1] (magnitudes "
                                     f"over {MAX_SAMPLE:g} are refused)", source=name)
                mono = downmix(x)
                if resampler is not None:
                    mono = resampler.resample_chunk(mono)
                if mono.size:
                    yield np.ascontiguousarray(mono, dtype=np.float32)
            info.frames = frames
            if self._array is None:
                promised = [d for d in (self._declared, self._wav_frames) if d is not None and d > frames]
                info.declared_frames = max(promised) if promised else None
                if info.truncated:
                    of = f" of the {info.declared_frames / rate:.2f} s its header promises" if info.declared_frames \
                        else ""
                    why = f" (decoder: {info.decode_error})" if info.decode_error else ""
                    info.warnings.append(f"{name}: file is truncated: only {frames / rate:.2f} s{of} could be "
                                         f"read{why}")
            if frames > lim.max_audio_seconds * rate:
                raise too_long(name, frames / rate, lim.max_audio_seconds)
            if frames == 0:
                extra = f" ({info.warnings[0]})" if info.warnings else ""
                raise AudioError(f"{name}: audio is empty (0 samples){extra}", source=name)
            if resampler is not None:
                tail = resampler.resample_chunk(np.zeros(0, np.float32), last=True)
                if tail.size:
                    yield np.ascontiguousarray(tail, dtype=np.float32)
        finally:
            self.close()


def decode_audio(audio: AudioInput, sample_rate: int | None = None,
                 name: str | None = None, limits: Limits | None = None) -> tuple[np.ndarray, AudioInfo]:
    """16 kHz mono float32 samples and what was found while reading them (`AudioInfo`).
    ``name`` replaces the recording's name in messages (default: its path, ``<array>``, ...).
    :class:`AudioReader` gives the same samples block by block."""
    reader = AudioReader(audio, sample_rate, name, limits)
    parts = list(reader.blocks())
    samples = np.concatenate(parts) if len(parts) > 1 else parts[0] if parts else np.zeros(0, np.float32)
    return np.ascontiguousarray(samples, dtype=np.float32), reader.info


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
