"""Audio arriving on a pipe (``fun-asr-transcribe --stream -``), decoded as it comes.

The first bytes say what it is: WAV (RIFF/WAVE, RF64), FLAC (``fLaC``), OGG (``OggS``) or MP3 (``ID3`` or an
MPEG audio frame sync); headerless PCM only when the caller says so (``raw_rate``: 16-bit little-endian mono).
Nothing waits for the end of the input, so a live recorder (``arecord -t wav``, ``sox -d -t flac -``, ``ffmpeg
... -f ogg -``) gives audio while it still records:

- WAV: the RIFF header is parsed here (sizes 0 or 0xFFFFFFFF, as written to pipes, mean "until the end"; RF64's
  ``ds64`` sizes are used) and PCM 8/16/24/32-bit integer or 32/64-bit float is converted block by block; other
  WAV codecs (A-law, ADPCM, ...) go to libsndfile like the compressed formats.
- FLAC: libsndfile over a file object that hands out the bytes as they arrive (libsndfile's FLAC decoder does
  not work on a pipe's file descriptor, but reads forward through a file object that keeps the recent bytes).
- OGG (Vorbis, Opus), MP3 and other WAV codecs: libsndfile on a pipe's file descriptor, which it decodes
  incrementally; a thread copies the bytes already read to identify the format, then the rest of the input.

Blocks are mono float32 at the source's rate (channels averaged, as :mod:`fun_asr.audio.decode` does);
resampling to 16 kHz is the stream's (``Stream.feed(block, sample_rate=...)``, soxr's streaming resampler).
"""

from __future__ import annotations

import os
import select
import signal
import struct
import threading
from collections.abc import Iterator
from typing import Any

import numpy as np

from fun_asr.audio.decode import MAX_CHANNELS, MAX_SAMPLE, AudioError, downmix

ACCEPTED = "WAV, FLAC, OGG or MP3"
KIND_NAMES = {"wav": "WAV", "flac": "FLAC", "ogg": "OGG", "mp3": "MP3", "raw": "raw PCM"}
MIN_RATE, MAX_RATE = 1000, 384_000
_HEAD = 12  # bytes needed to tell the formats apart (RIFF....WAVE)
_KEEP = 1 << 20  # bytes kept behind the read position for a decoder that looks back
_FAKE_END = 1 << 50  # the "length" a decoder is told: unknown until the input ends
_WAV_PCM, _WAV_FLOAT, _WAV_EXTENSIBLE = 1, 3, 0xFFFE
_OTHER_FORMATS = (  # (offset, magic, name): named in the error for inputs we do not decode
    (4, b"ftyp", "MP4/M4A"), (0, b"\x1a\x45\xdf\xa3", "Matroska/WebM"), (0, b"FORM", "AIFF"), (0, b"caff", "CAF"),
    (0, b".snd", "AU"), (0, b"#!AMR", "AMR"), (0, b"RIFX", "big-endian RIFF"),
)


class RawPcmConflict(AudioError):
    """``raw_rate`` was given but the input starts with a header we recognize (a usage error)."""


def _mpeg_frame_sync(h: bytes) -> bool:
    """An MPEG audio frame header: 11 sync bits, a valid version, layer, bitrate and sample rate."""
    if len(h) < 4 or h[0] != 0xFF or (h[1] & 0xE0) != 0xE0:
        return False
    version, layer = (h[1] >> 3) & 3, (h[1] >> 1) & 3
    bitrate, rate = h[2] >> 4, (h[2] >> 2) & 3
    return version != 1 and layer != 0 and bitrate != 15 and rate != 3


def sniff(head: bytes) -> str | None:
    """"wav", "flac", "ogg" or "mp3" from an input's first bytes (at least 12 unless the input is shorter)."""
    if len(head) >= 12 and head[:4] in (b"RIFF", b"RF64", b"BW64") and head[8:12] == b"WAVE":
        return "wav"
    if head[:4] == b"fLaC":
        return "flac"
    if head[:4] == b"OggS":
        return "ogg"
    if head[:3] == b"ID3" or _mpeg_frame_sync(head):
        return "mp3"
    return None


def header_kind(head: bytes) -> str | None:
    """A container header (WAV, FLAC, OGG, MP3 with an ID3 tag) at the start of ``head``: what --raw-pcm refuses.
    An MPEG frame sync alone does not count (raw samples near -1 look like one)."""
    kind = sniff(head)
    return None if kind == "mp3" and head[:3] != b"ID3" else kind


def describe(head: bytes) -> str:
    """"starts with 0x...", naming a known format we do not read, for error messages."""
    shown = head[:8].hex()
    for at, magic, fmt in _OTHER_FORMATS:
        if head[at : at + len(magic)] == magic:
            return f"starts with 0x{shown}: {fmt}"
    return f"starts with 0x{shown}"


def _cut_short(head: bytes) -> str | None:
    """The format whose header ``head`` (shorter than _HEAD, the whole input) begins, if any."""
    for magic, kind in ((b"RIFF", "WAV"), (b"RF64", "WAV"), (b"fLaC", "FLAC"), (b"OggS", "OGG"), (b"ID3", "MP3")):
        n = min(len(head), len(magic))
        if n >= 2 and head[:n] == magic[:n]:
            return kind
    return None


class _Input:
    """An input file descriptor's bytes as they arrive, a window of the recent ones kept, so that the sniffing and a
    decoder that looks back (libsndfile's FLAC) can re-read them. A file object for soundfile's virtual IO: its
    "length" is unknown (_FAKE_END) until the input ends; seeks past what has arrived read forward, seeks near the
    fake end fail. An exception while reading (Ctrl-C in a decoder's callback) is kept in ``exc`` and ends it."""

    def __init__(self, fd: int) -> None:
        self.fd = fd
        self._buf = bytearray()
        self._base = 0  # input offset of _buf[0]
        self.pos = 0
        self.eof = False
        self.exc: BaseException | None = None
        self._failed = False  # the last seek failed: tell() says -1 once

    @property
    def end(self) -> int:
        return self._base + len(self._buf)

    def _more(self, n: int) -> bool:
        if self.eof:
            return False
        try:
            b = os.read(self.fd, min(max(n, 1), 1 << 20))
        except BaseException as exc:  # noqa: BLE001 - kept: a decoder's callback must not raise
            self.exc, b = exc, b""
        if not b:
            self.eof = True
            return False
        self._buf += b
        return True

    def read(self, n: int = -1) -> bytes:
        """Up to ``n`` bytes: the kept ones at the position, else what one read of the input gives (b"" at its
        end); never waits for more than one read."""
        if n is None or n < 0:
            n = 1 << 16
        if n == 0 or self.pos >= _FAKE_END // 2:
            return b""
        while self.pos > self.end and self._more(self.pos - self.end):  # after a seek ahead: read up to it
            pass
        if self.pos > self.end or (self.pos == self.end and not self._more(n)):
            return b""
        a = self.pos - self._base
        out = bytes(self._buf[a : a + n])
        self.pos += len(out)
        drop = self.pos - self._base - _KEEP
        if drop > _KEEP:  # amortized: cut once the window is twice what is kept
            del self._buf[:drop]
            self._base += drop
        return out

    def read_exact(self, n: int) -> bytes:
        parts, got = [], 0
        while got < n:
            b = self.read(n - got)
            if not b:
                break
            parts.append(b)
            got += len(b)
        return b"".join(parts)

    def seek(self, offset: int, whence: int = os.SEEK_SET) -> int:
        if whence == os.SEEK_END:
            if self.eof:
                target = self.end + offset
            elif offset == 0:  # soundfile asking for the length: unknown
                target = _FAKE_END
            else:  # e.g. an ID3v1 tag 128 bytes before the end: not on a pipe
                self._failed = True
                return -1
        else:
            target = offset + (self.pos if whence == os.SEEK_CUR else 0)
        if target < self._base or (_FAKE_END // 2 <= target < _FAKE_END):
            self._failed = True
            return -1
        self.pos = target
        return target

    def tell(self) -> int:
        if self._failed:
            self._failed = False
            return -1
        return self.pos

    def seekable(self) -> bool:
        return False


def _unseekable_soundfile() -> type:
    import soundfile as sf

    class _Unseekable(sf.SoundFile):
        """Reads exactly the frames asked for: a pipe's "length" is unknown (soundfile would cap a read at it)."""

        def seekable(self) -> bool:
            return False

    return _Unseekable


def _wav_fmt(name: str, fmt: bytes) -> tuple[int, int, int, int]:
    """A WAV fmt chunk's format tag (WAVE_FORMAT_EXTENSIBLE: its sub-format's), channels, rate and sample width in
    bytes; AudioError for channels or a rate outside what is accepted."""
    tag, channels, rate, _, block_align, bits = struct.unpack("<HHIIHH", fmt[:16])
    if tag == _WAV_EXTENSIBLE and len(fmt) >= 26:
        tag = struct.unpack("<H", fmt[24:26])[0]  # the sub-format GUID's first two bytes
    if not 1 <= channels <= MAX_CHANNELS:
        raise AudioError(f"{name}: WAV with {channels} channels; accepted 1 to {MAX_CHANNELS}", source=name)
    if not MIN_RATE <= rate <= MAX_RATE:
        raise AudioError(f"{name}: sample rate {rate} Hz is outside the accepted {MIN_RATE}-{MAX_RATE} Hz", source=name)
    width = block_align // channels if block_align else (bits + 7) // 8
    return tag, channels, rate, width


def _wav_sample_type(name: str, tag: int, width: int) -> bool | None:
    """Whether the WAV's samples are float (True) or integer PCM (False) of a width read here; None for another
    codec (libsndfile's); AudioError for PCM or float of a width not accepted."""
    if tag == _WAV_PCM and width in (1, 2, 3, 4) or tag == _WAV_FLOAT and width in (4, 8):
        return tag == _WAV_FLOAT
    if tag in (_WAV_PCM, _WAV_FLOAT):
        kind = "float" if tag == _WAV_FLOAT else "integer PCM"
        raise AudioError(f"{name}: WAV {kind} with {width * 8}-bit samples; accepted: integer PCM of 8, 16, 24 or "
                         "32 bits, float of 32 or 64 bits", source=name)
    return None


class PipedAudio:
    """One input file descriptor (standard input, a pipe, a file) read as audio arrives: opening reads and checks the
    header (:class:`AudioError` naming what was seen and what is accepted; :class:`RawPcmConflict` when ``raw_rate``
    is given but a header is there); :meth:`blocks` gives mono float32 at ``rate`` about every ``block_seconds``
    (less when the input pauses). ``warnings`` lists what was cut short (a WAV whose data ends early, a decoder that
    stopped) once :meth:`blocks` has ended."""

    def __init__(self, fd: int, name: str, raw_rate: int | None = None, block_seconds: float = 0.1) -> None:
        self.name = name
        self.src = _Input(fd)
        self.block_seconds = block_seconds
        self.warnings: list[str] = []
        self.frames = 0  # frames given so far, at ``rate``
        self._sf: Any = None
        self._pipe_fd: int | None = None
        self._wake: tuple[int, int] | None = None  # (read, write) ends of the signal wakeup pipe, while relaying
        self._old_wakeup = -1
        self._data_left: int | None = None  # WAV: bytes of PCM still promised (None: until the end)
        self._data_size: int | None = None
        head = self.src.read_exact(_HEAD)
        self.src.seek(0)
        if raw_rate is not None:
            kind = header_kind(head)
            if kind is not None:
                raise RawPcmConflict(f"{name} starts with a {KIND_NAMES[kind]} header, not raw PCM: drop --raw-pcm "
                                     f"({ACCEPTED} are recognized by their headers)", source=name)
            if not head:
                raise AudioError(f"{name}: no data (0 bytes); --raw-pcm reads 16-bit little-endian mono samples",
                                 source=name)
            self.kind, self.rate, self.channels = "raw", int(raw_rate), 1
            self._width, self._float = 2, False
            return
        self.kind = sniff(head)
        if self.kind is None:
            if not head:
                raise AudioError(f"{name}: no data (0 bytes); accepted: {ACCEPTED} (recognized by their headers), "
                                 "or raw 16-bit PCM with --raw-pcm RATE", source=name)
            short = _cut_short(head) if len(head) < _HEAD else None
            if short is not None:
                raise AudioError(f"{name}: the {short} header is cut short: the input ends after {len(head)} bytes",
                                 source=name)
            raise AudioError(f"{name}: not {ACCEPTED} ({describe(head)}); raw PCM needs --raw-pcm RATE "
                             "(16-bit little-endian mono at RATE Hz)", source=name)
        if self.kind == "wav" and self._wav_header():
            return
        self._open_libsndfile()

    @property
    def kind_name(self) -> str:
        return KIND_NAMES[self.kind]

    # -- WAV ------------------------------------------------------------------------------------------------------

    def _wav_header(self) -> bool:
        """Parse RIFF/RF64 up to the data chunk; True when the PCM is read here, False to hand the WAV to libsndfile
        (another codec). The position is left at the first PCM byte (True) or at 0 (False)."""
        fmt, size = self._wav_chunks()
        tag, channels, rate, width = _wav_fmt(self.name, fmt)
        self.rate, self.channels = int(rate), int(channels)
        is_float = _wav_sample_type(self.name, tag, width)
        if is_float is None:
            self.src.seek(0)
            return False
        self._width, self._float = width, is_float
        if size not in (0, 0xFFFFFFFF):  # 0 / 0xFFFFFFFF: written to a pipe, the length unknown
            self._data_left = self._data_size = size
        return True

    def _wav_chunks(self) -> tuple[bytes, int]:
        """Reads the RIFF/RF64 chunks up to the data chunk's header: the fmt chunk's body and the data's size
        (RF64: from its ds64 chunk; 0 or 0xFFFFFFFF: unknown)."""
        name, src = self.name, self.src
        riff = src.read_exact(12)
        rf64 = riff[:4] != b"RIFF"
        fmt: bytes | None = None
        ds64_data: int | None = None
        while True:
            hdr = src.read_exact(8)
            if len(hdr) < 8:
                what = "its fmt chunk" if fmt is None else "its data chunk"
                raise AudioError(f"{name}: the WAV header ends before {what} (the input ends after {src.pos} bytes)",
                                 source=name)
            cid, size = hdr[:4], struct.unpack("<I", hdr[4:])[0]
            if cid == b"data":
                break
            if size == 0xFFFFFFFF:
                raise AudioError(f"{name}: WAV chunk {cid!r} before the data has an unknown size (0xFFFFFFFF)",
                                 source=name)
            body = src.read_exact(size + (size & 1))
            if len(body) < size:
                raise AudioError(f"{name}: the WAV header is cut short in its {cid.decode('latin-1')!r} chunk (the "
                                 f"input ends after {src.pos} bytes)", source=name)
            if cid == b"fmt ":
                fmt = body[:size]
            elif cid == b"ds64" and rf64 and size >= 16:
                ds64_data = struct.unpack("<Q", body[8:16])[0]
        if fmt is None or len(fmt) < 16:
            raise AudioError(f"{name}: WAV without a valid fmt chunk before its data chunk", source=name)
        if rf64 and size == 0xFFFFFFFF and ds64_data is not None:
            size = ds64_data
        return fmt, size

    # -- FLAC, OGG, MP3 and other WAV codecs: libsndfile ----------------------------------------------------------

    def _open_libsndfile(self) -> None:
        import soundfile as sf

        cls = _unseekable_soundfile()
        target: Any
        if self.kind == "flac":  # libsndfile's FLAC decoder loses sync on a pipe's descriptor: a file object
            target = self.src
        else:  # OGG and MP3 look for the end of a file object: a real pipe, fed by a thread
            r, w = os.pipe()
            self._pipe_fd = target = r
            self._watch_signals()
            threading.Thread(target=self._pump, args=(w, self._wake[0] if self._wake else None), name="fun-asr-pipe",
                             daemon=True).start()
        try:
            self._sf = cls(target, closefd=False)
        except (sf.LibsndfileError, RuntimeError, TypeError) as exc:
            self.close()
            self._raise_if_interrupted()
            raise AudioError(f"{self.name}: cannot decode the {self.kind_name} stream ({self._why(exc)})",
                             source=self.name) from None
        self.rate, self.channels = int(self._sf.samplerate), int(self._sf.channels)
        if not MIN_RATE <= self.rate <= MAX_RATE:
            self.close()
            raise AudioError(f"{self.name}: sample rate {self.rate} Hz is outside the accepted {MIN_RATE}-{MAX_RATE} "
                             "Hz", source=self.name)
        if self.channels > MAX_CHANNELS:
            self.close()
            raise AudioError(f"{self.name}: {self.channels} channels; at most {MAX_CHANNELS} are accepted",
                             source=self.name)

    def _watch_signals(self) -> None:
        """Ctrl-C while libsndfile waits on the relay pipe: its read() retries after the signal, so the pump learns
        of it (signal.set_wakeup_fd) and ends the relay; the decoder returns and KeyboardInterrupt is raised."""
        r, w = os.pipe()
        os.set_blocking(r, False)
        os.set_blocking(w, False)
        try:
            self._old_wakeup = signal.set_wakeup_fd(w)
        except ValueError:  # not the main thread: no signals here
            os.close(r)
            os.close(w)
            return
        self._wake = (r, w)

    def _pump(self, w: int, wake: int | None) -> None:
        """Copy the input (from its first byte) into the pipe libsndfile reads, until either side ends or Ctrl-C."""
        try:
            while True:
                if wake is not None and self.src.pos >= self.src.end and not self.src.eof:
                    ready = select.select([self.src.fd, wake], [], [])[0]
                    if wake in ready:
                        try:
                            signals = os.read(wake, 64)
                        except BlockingIOError:
                            continue
                        if not signals:  # closed: the reader is done
                            os.close(wake)
                            wake = None
                        elif signal.SIGINT in signals:
                            break
                        continue
                b = self.src.read(1 << 16)
                if not b:
                    break
                view = memoryview(b)
                while view:
                    view = view[os.write(w, view) :]
        except OSError:  # the reader closed its end
            pass
        finally:
            os.close(w)
            if wake is not None:
                os.close(wake)

    def _why(self, exc: BaseException) -> str:
        return str(exc).replace(repr(self.src), "the input").replace(f"Error opening {self._pipe_fd!r}: ", "") \
            .replace("Error opening the input: ", "")

    def _raise_if_interrupted(self) -> None:
        if self.src.exc is not None and not isinstance(self.src.exc, OSError):
            raise self.src.exc

    # -- blocks ---------------------------------------------------------------------------------------------------

    def blocks(self) -> Iterator[np.ndarray]:
        """Mono float32 blocks at ``rate`` as the input arrives; AudioError on samples that are not audio (NaN,
        magnitudes over 1e6) or a decoder that fails before any audio."""
        try:
            source = self._pcm_blocks() if self._sf is None else self._sf_blocks()
            for x in source:
                if not np.isfinite(x).all():
                    raise AudioError(f"{self.name}: audio contains NaN or infinite samples", source=self.name)
                if x.size and float(np.abs(x).max()) > MAX_SAMPLE:
                    raise AudioError(f"{self.name}: samples reach {float(np.abs(x).max()):.3g}; float audio must be "
                                     f"in [-1, 1] (magnitudes over {MAX_SAMPLE:g} are refused)", source=self.name)
                mono = downmix(x)
                self.frames += len(mono)
                yield mono
            if self.frames == 0:
                raise AudioError(f"{self.name}: the {self.kind_name} stream holds no audio (0 samples)",
                                 source=self.name)
        finally:
            self.close()

    def _pcm_blocks(self) -> Iterator[np.ndarray]:
        frame = self._width * self.channels
        want = max(frame, int(self.rate * self.block_seconds) * frame)
        left = b""
        while self._data_left is None or self._data_left > 0:
            n = want if self._data_left is None else min(want, self._data_left)
            chunk = self.src.read(n)
            if not chunk:
                break
            if self._data_left is not None:
                self._data_left -= len(chunk)
            data = left + chunk
            cut = len(data) - len(data) % frame
            left = data[cut:]
            if cut:
                yield self._convert(data[:cut])
        self._raise_if_interrupted()
        if self._data_left and self._data_size:
            got = (self._data_size - self._data_left) // frame
            self.warnings.append(f"{self.name}: the WAV data ends after {got / self.rate:.2f} s of the "
                                 f"{self._data_size // frame / self.rate:.2f} s its header promises")

    def _convert(self, data: bytes) -> np.ndarray:
        """Interleaved PCM bytes -> float32 [frames, channels] in [-1, 1], scaled as libsndfile does."""
        w, ch = self._width, self.channels
        if self._float:
            x = np.frombuffer(data, dtype="<f4" if w == 4 else "<f8").astype(np.float32)
        elif w == 1:
            x = (np.frombuffer(data, dtype=np.uint8).astype(np.float32) - 128.0) / 128.0
        elif w == 2:
            x = np.frombuffer(data, dtype="<i2").astype(np.float32) / 32768.0
        elif w == 3:
            b = np.frombuffer(data, dtype=np.uint8).reshape(-1, 3)
            wide = np.zeros((b.shape[0], 4), dtype=np.uint8)
            wide[:, 1:] = b
            x = wide.view("<i4")[:, 0].astype(np.float32) / 2147483648.0
        else:
            x = np.frombuffer(data, dtype="<i4").astype(np.float32) / 2147483648.0
        return x.reshape(-1, ch)

    def _sf_blocks(self) -> Iterator[np.ndarray]:
        import soundfile as sf

        n = max(1, int(self.rate * self.block_seconds))
        while True:
            try:
                x = self._sf.read(n, dtype="float32", always_2d=True)
            except (sf.LibsndfileError, RuntimeError) as exc:  # e.g. "flac decoder lost sync" where the input broke
                self._raise_if_interrupted()
                if self.frames == 0:
                    raise AudioError(f"{self.name}: cannot decode the {self.kind_name} stream ({self._why(exc)})",
                                     source=self.name) \
                        from None
                self.warnings.append(f"{self.name}: the {self.kind_name} decoder stopped after "
                                     f"{self.frames / self.rate:.2f} s ({self._why(exc)})")
                return
            self._raise_if_interrupted()
            if len(x) == 0:
                break
            yield x
        promised = int(self._sf.frames) if self._sf is not None else 0
        if 0 < self.frames < promised < 2**62:  # FLAC's STREAMINFO, an MP3's Xing header (not on a pipe's OGG)
            self.warnings.append(f"{self.name}: the {self.kind_name} stream ends after {self.frames / self.rate:.2f} s "
                                 f"of the {promised / self.rate:.2f} s its header promises")

    def close(self) -> None:
        if self._sf is not None:
            self._sf.close()
            self._sf = None
        if self._wake is not None:
            signal.set_wakeup_fd(self._old_wakeup)
            os.close(self._wake[1])  # the pump sees the wakeup pipe closed and stops watching it
            self._wake = None
        if self._pipe_fd is not None:
            os.close(self._pipe_fd)  # the pump's next write fails and it ends
            self._pipe_fd = None
