"""Live audio in pieces (a stream's ``feed``): numpy arrays of the shapes and dtypes ``Session.transcribe`` takes
(mono or multichannel, float or int PCM), or little-endian int16 bytes, at any rate fixed by the first piece -> 16 kHz
mono float32 (channels averaged), resampled as one continuous signal (soxr)."""

from __future__ import annotations

from typing import Any

import numpy as np

from fun_asr.audio.decode import SAMPLE_RATE, AudioError, Layout, array_to_mono


class LiveAudio:
    """One stream's input side: :meth:`to_16k` each piece, :meth:`flush` at the end (the resampler's tail)."""

    def __init__(self) -> None:
        self.rate: int | None = None
        self.layout: Layout | None = None  # the multichannel pieces' (transposed, channels): settles short ones
        self._resampler: Any = None

    def to_16k(self, pcm: Any, sample_rate: int = SAMPLE_RATE) -> np.ndarray:
        """16 kHz mono float32 of one piece. A numpy array is read as ``Session.transcribe`` reads one
        (:func:`~fun_asr.audio.decode.array_to_mono`): ``[samples]``, ``[samples, channels]`` or ``[channels,
        samples]``, float16/32/64 or int16/int32 PCM, channels averaged; a piece too short to show its layout (32
        frames or fewer) is read as the stream's earlier multichannel pieces were. AudioError naming what is wrong
        (odd byte count, an ambiguous shape, another dtype, NaN/inf, a bad rate, a rate that changed within the
        stream)."""
        if isinstance(sample_rate, bool) or not isinstance(sample_rate, int) or sample_rate < 1000:
            raise AudioError(f"sample_rate must be an integer number of Hz (>= 1000), got {sample_rate!r}")
        if isinstance(pcm, bytes | bytearray | memoryview):
            if len(pcm) % 2:
                raise AudioError(f"PCM bytes must be 16-bit samples (an even byte count), got {len(pcm)} bytes")
            x = np.frombuffer(bytes(pcm), dtype="<i2").astype(np.float32) / 32768.0
        else:
            x, layout = array_to_mono(np.asarray(pcm), sample_rate, "stream audio", self.layout)
            self.layout = layout or self.layout
        if not np.isfinite(x).all():
            raise AudioError("stream audio contains NaN or infinite samples")
        if self.rate is None:
            self.rate = sample_rate
            if sample_rate != SAMPLE_RATE:
                import soxr

                self._resampler = soxr.ResampleStream(sample_rate, SAMPLE_RATE, 1, dtype="float32", quality="HQ")
        elif sample_rate != self.rate:
            raise AudioError(f"sample_rate changed from {self.rate} to {sample_rate} Hz within one stream")
        if self._resampler is not None:
            x = self._resampler.resample_chunk(x)
        return np.ascontiguousarray(x, dtype=np.float32)

    def flush(self) -> np.ndarray:
        """The resampler's last samples (empty at 16 kHz)."""
        if self._resampler is None:
            return np.zeros(0, np.float32)
        return np.ascontiguousarray(self._resampler.resample_chunk(np.zeros(0, np.float32), last=True),
                                    dtype=np.float32)
