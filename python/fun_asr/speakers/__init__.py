"""Who spoke when: FunASR's CAM++ speaker embeddings (``funasr/models/campplus``, FunASR 1.4.16) and its
diarization pipeline around them.

- :mod:`~fun_asr.speakers.frontend` -- CAM++'s features: Kaldi fbank (80 mel) minus its mean over time;
- :mod:`~fun_asr.speakers.native` -- :class:`SpeakerModel`, the native ggml CAM++ (embeddings of windows);
- :mod:`~fun_asr.speakers.timeline` -- ``sv_chunk``, ``postprocess`` and ``distribute_spk`` as FunASR's;
- :mod:`~fun_asr.speakers.cluster` -- FunASR's ``ClusterBackend`` (spectral / UMAP+HDBSCAN / k-means,
  ``merge_by_cos``) on scikit-learn, scipy and umap-learn;
- :mod:`~fun_asr.speakers.tracker` -- speakers while streaming, re-clustered at the end (FunASR's realtime);
- :mod:`~fun_asr.speakers.diarize` -- the pieces put together for a recording.
"""

from __future__ import annotations

from fun_asr.speakers.native import SpeakerModel

__all__ = ["SpeakerModel"]
