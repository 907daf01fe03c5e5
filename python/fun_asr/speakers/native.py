"""CAM++ speaker embeddings on the native ggml graph: :class:`SpeakerModel`.

``SpeakerModel.load(path)`` takes a ``campplus`` GGUF (``fun-asr-convert CAMPP_DIR``), an ASR package GGUF with
an embedded CAM++ (``fun-asr-convert SRC --speaker-model DIR``), or a FunASR/ModelScope CAM++ folder
(``iic/speech_campplus_sv_zh-cn_16k-common``, HF ``funasr/campplus``: config.yaml + campplus_cn_common.bin).
:meth:`SpeakerModel.embed` gives FunASR's ``spk_embedding`` of each window: its features
(:func:`fun_asr.speakers.frontend.speaker_features`) through ``CAMPPlus.forward``.

Windows of unequal length: FunASR's ``extract_feature`` pads the features of a batch with zeros to the longest
window (so a short window's embedding depends on its batch mates); in its diarization every window is exactly
1.5 s (``sv_chunk`` pads the last one of a segment), so that never happens there. Here each window is
computed as if alone -- FunASR's result for that window given by itself; windows of equal length are
batched into one graph (chunked so that the graph's memory stays under ``memory_budget``).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from fun_asr.speakers.files import ARCH, SpeakerModelError, gguf_fields, read_campplus_folder
from fun_asr.speakers.frontend import SpeakerFrontendConfig, num_frames, speaker_features


class SpeakerModel:
    """FunASR's CAM++ (``funasr/models/campplus``, FunASR 1.4.16) on the native ggml graph."""

    def __init__(self, native: Any, frontend: SpeakerFrontendConfig, info: dict[str, Any]) -> None:
        self.native = native  # fun_asr._core.SpeakerModel
        self.frontend = frontend
        self._info = info
        if frontend.num_mel_bins != native.info()["feat_dim"]:
            raise SpeakerModelError(f"the frontend gives {frontend.num_mel_bins} mel bins; the network takes "
                                    f"{native.info()['feat_dim']}")

    def __repr__(self) -> str:
        i = self.native.info()
        return (f"SpeakerModel({self._info.get('source')!r}, {self._info.get('format')}, "
                f"{i['embedding_length']}-d, {i['weight_type']}, threads={i['threads']})")

    # -- loading ------------------------------------------------------------------------------------------

    @classmethod
    def load(cls, path: str | Path, threads: int = 0) -> SpeakerModel:
        """A ``campplus`` GGUF, a package GGUF with an embedded CAM++, or a FunASR/ModelScope CAM++ folder.
        ``threads``: 0 = all cores. Raises :class:`SpeakerModelError` (a ValueError) naming the problem,
        FileNotFoundError for a path that does not exist."""
        from fun_asr import _core

        p = Path(path).expanduser()
        if p.is_dir():
            conf, meta, tensors = read_campplus_folder(p)
            rows = [(name, "f32", list(reversed(arr.shape)), arr) for name, arr in tensors]
            try:
                native = _core.load_speaker_tensors(meta, rows, threads=threads, origin=str(p))
            except RuntimeError as exc:
                raise SpeakerModelError(str(exc)) from None
            info = {"source": str(p.resolve()), "format": "funasr", "license": meta.get("general.license"),
                    "config": conf}
            return cls(native, _frontend_from_spec(meta.get(f"{ARCH}.model_spec")), info)
        if not p.is_file():
            raise FileNotFoundError(f"{p}: no such speaker model (a .gguf file or a FunASR CAM++ folder with "
                                    "config.yaml + campplus_cn_common.bin)")
        fields = gguf_fields(p)
        if f"{ARCH}.embedding_length" not in fields:
            arch = fields.get("general.architecture")
            raise SpeakerModelError(f"{p}: holds no CAM++ speaker model (architecture {arch!r}, no {ARCH}.* metadata: "
                                    "give a campplus GGUF, a package converted with --speaker-model, or a FunASR "
                                    "CAM++ folder)")
        try:
            native = _core.load_speaker_gguf(str(p), threads=threads)
        except RuntimeError as exc:
            text = str(exc)
            raise SpeakerModelError(text if str(p) in text else f"{p}: not a usable CAM++ speaker model ({text})") \
                from None
        embedded = fields.get("general.architecture") != ARCH
        text = fields.get(f"{ARCH}.config_json")
        info = {"source": fields.get(f"{ARCH}.source") or fields.get("general.source.huggingface.repository")
                or str(p.resolve()),
                "format": "embedded" if embedded else "gguf",
                "license": fields.get(f"{ARCH}.license") or fields.get("general.license"),
                "config": json.loads(text) if isinstance(text, str) else None}
        return cls(native, _frontend_from_spec(fields.get(f"{ARCH}.model_spec")), info)

    @classmethod
    def from_package(cls, gguf_path: str | Path, threads: int = 0) -> SpeakerModel | None:
        """The CAM++ embedded in a package GGUF (or a campplus GGUF itself); None when it holds none."""
        p = Path(gguf_path).expanduser()
        if not p.is_file():
            raise FileNotFoundError(f"{p}: no such GGUF file")
        if f"{ARCH}.embedding_length" not in gguf_fields(p):
            return None
        return cls.load(p, threads=threads)

    # -- properties -----------------------------------------------------------------------------------------

    @property
    def embedding_dim(self) -> int:
        return int(self.native.info()["embedding_length"])

    @property
    def sample_rate(self) -> int:
        return int(self.frontend.sample_rate)

    @property
    def min_samples(self) -> int:
        """The shortest window CAM++ takes (its TDNN must leave 2 frames for the standard deviation)."""
        frames = int(self.native.info()["min_frames"])
        return self.frontend.frame_samples + (frames - 1) * self.frontend.shift_samples

    @property
    def threads(self) -> int:
        return int(self.native.threads)

    @threads.setter
    def threads(self, value: int) -> None:
        self.native.threads = int(value)

    @property
    def info(self) -> dict[str, Any]:
        """Where the model came from, its license, its dimensions and settings."""
        return {**self._info, **self.native.info(), "embedding_dim": self.embedding_dim,
                "sample_rate": self.sample_rate, "min_samples": self.min_samples}

    # -- embeddings -----------------------------------------------------------------------------------------

    def features(self, window: np.ndarray) -> np.ndarray:
        """CAM++'s features of one window (fbank minus its mean over time): float32[frames, feat_dim]."""
        return speaker_features(window, self.frontend)

    def embed(self, windows: Sequence[np.ndarray] | np.ndarray, threads: int = 0) -> np.ndarray:
        """FunASR's ``spk_embedding`` of each window: float32[N, embedding_dim].

        ``windows``: a sequence of 1-D float arrays (16 kHz samples in [-1, 1]) or an [N, samples] array. Each
        window is computed as if alone (see the module doc); windows of the same length share one graph.
        ``threads`` > 0: threads for this call (0: the model's, set at load). ValueError for no windows, an
        empty, non-finite, multi-dimensional or too short window (under :attr:`min_samples`)."""
        items = self._windows(windows)
        feats = [self.features(w) for w in items]
        return self.embed_features(feats, threads=threads)

    def embed_features(self, features: Sequence[np.ndarray] | np.ndarray, threads: int = 0) -> np.ndarray:
        """Embeddings of feature windows (each float32[frames, feat_dim], as :meth:`features` gives them)."""
        if isinstance(features, np.ndarray) and features.ndim == 3:
            feats = list(features)
        else:
            feats = list(features)
        if not feats:
            raise ValueError("no windows to embed: give at least one")
        dim = int(self.native.info()["feat_dim"])
        min_frames = int(self.native.info()["min_frames"])
        groups: dict[int, list[int]] = {}
        for i, f in enumerate(feats):
            f = np.asarray(f)
            if f.ndim != 2 or f.shape[1] != dim:
                raise ValueError(f"feature window {i} has shape {list(f.shape)}; expected [frames, {dim}]")
            if f.shape[0] < min_frames:
                raise ValueError(f"feature window {i} has {f.shape[0]} frames; CAM++ needs at least {min_frames}")
            groups.setdefault(f.shape[0], []).append(i)
        out = np.empty((len(feats), self.embedding_dim), np.float32)
        previous = self.native.threads
        if threads < 0:
            raise ValueError(f"threads must be >= 0 (0 = the model's setting), got {threads}")
        if threads:
            self.native.threads = threads
        try:
            for idx in groups.values():
                batch = np.ascontiguousarray(np.stack([feats[i] for i in idx]), dtype=np.float32)
                out[idx] = self.native.embed(batch)
        finally:
            if threads:
                self.native.threads = previous
        return out

    def _windows(self, windows: Sequence[np.ndarray] | np.ndarray) -> list[np.ndarray]:
        if isinstance(windows, np.ndarray):
            if windows.ndim == 1:
                raise ValueError("windows must be a sequence of 1-D arrays or an [N, samples] array; got one 1-D "
                                 "array (wrap a single window in a list)")
            if windows.ndim != 2:
                raise ValueError(f"windows must be an [N, samples] array, got {windows.ndim} dimensions")
        items = list(windows)
        if not items:
            raise ValueError("no windows to embed: give at least one")
        out = []
        need = self.min_samples
        for i, w in enumerate(items):
            a = np.asarray(w)
            if a.ndim != 1:
                raise ValueError(f"window {i} has shape {list(a.shape)}; each window must be 1-D (mono samples)")
            if not np.issubdtype(a.dtype, np.number) or np.issubdtype(a.dtype, np.complexfloating):
                raise ValueError(f"window {i} has dtype {a.dtype}; expected float samples in [-1, 1]")
            if a.size == 0:
                raise ValueError(f"window {i} is empty")
            if a.size < need:
                raise ValueError(f"window {i} has {a.size} samples; CAM++ needs at least {need} "
                                 f"({need / self.sample_rate * 1000:.0f} ms at {self.sample_rate} Hz: "
                                 f"{num_frames(need, self.frontend)} feature frames)")
            a = a.astype(np.float32, copy=False)
            if not np.isfinite(a).all():
                raise ValueError(f"window {i} contains NaN or infinite samples")
            out.append(a)
        return out


def _frontend_from_spec(text: Any) -> SpeakerFrontendConfig:
    """The frontend recorded in the file's model spec, else the one shipped with the package."""
    from fun_asr.model.spec import load_spec

    spec = None
    if isinstance(text, str):
        try:
            spec = json.loads(text)
        except ValueError:
            spec = None
    if not isinstance(spec, dict) or "frontend" not in spec:
        spec = load_spec(ARCH)
    try:
        return SpeakerFrontendConfig.from_spec(spec)
    except (TypeError, ValueError) as exc:
        raise SpeakerModelError(f"campplus model spec: bad frontend section ({exc})") from None
