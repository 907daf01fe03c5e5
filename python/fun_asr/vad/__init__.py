"""FunASR's FSMN-VAD (``funasr/models/fsmn_vad_streaming``, FunASR 1.4.16): which parts of a recording are speech.

Layers, each usable alone (docs/model.md, FSMN-VAD; times are integer milliseconds, one frame is 10 ms, frame
``t`` covers samples ``[160 t, 160 t + 400)``):

- :mod:`~fun_asr.vad.config` -- :class:`VadConfig` (``model_conf`` of ``config.yaml`` under FunASR's names, plus
  our options) and the end-silence schedules;
- :mod:`~fun_asr.vad.frontend` -- FunASR's ``WavFrontendOnline`` (x32768, Kaldi fbank 80 mel 25/10 ms, LFR m=5
  n=1, CMVN) and the per-frame decibels;
- :mod:`~fun_asr.vad.network` -- the FSMN network in numpy (the reference for the native graph);
- :mod:`~fun_asr.vad.detector` -- the decision logic of ``FsmnVADStreaming`` and 1.4.16's offline
  ``inference()`` (:func:`detect_segments`);
- :mod:`~fun_asr.vad.native` -- :class:`FsmnVad`, the model put together, and the same over audio in pieces:
  :class:`OfflineVad` (bounded memory, the same segments), :class:`VadStream` (FunASR's streaming events);
- :mod:`~fun_asr.vad.files` -- FunASR folders, ``fsmn_vad`` GGUFs and embedded VADs -> config, tensors, native;
"""

from __future__ import annotations

from fun_asr.vad.config import DEFAULT_SILENCE_SCHEDULE, STREAMING_SILENCE_SCHEDULE, VadConfig, VadFrontendConfig
from fun_asr.vad.detector import VadDetector, detect_segments
from fun_asr.vad.frontend import frame_decibels, num_fbank_frames, read_am_mvn, vad_features
from fun_asr.vad.native import FsmnVad, OfflineVad, VadStream
from fun_asr.vad.network import FsmnWeights, vad_network_numpy

__all__ = [
    "DEFAULT_SILENCE_SCHEDULE", "STREAMING_SILENCE_SCHEDULE", "VadConfig", "VadFrontendConfig",
    "read_am_mvn", "vad_features", "frame_decibels", "num_fbank_frames", "FsmnWeights",
    "vad_network_numpy", "VadDetector", "detect_segments", "OfflineVad", "VadStream", "FsmnVad",
]
