"""FunASR 1.4.16 as the reference for the FSMN-VAD (test-only helper).

Install (torch==2.13.0 is already in the `test` extra; funasr's own dependency list pulls modelscope,
umap-learn, hydra, oss2, ... none of which the VAD path imports, hence --no-deps):

    python -m pip install --no-deps funasr==1.4.16 omegaconf==2.4.0 kaldiio==2.18.1 librosa==0.11.0 lazy_loader==0.6
    python -m pip install onnxruntime==1.32.0      # the ONNX cross-check (pulls flatbuffers, protobuf)

What each is for: ``funasr.auto.auto_model`` imports omegaconf and ``funasr.utils.load_utils``, which
imports kaldiio and librosa at module level (librosa 0.11 only needs lazy_loader to import; numba,
scipy, scikit-learn are loaded lazily and never reached here). soundfile, tqdm, numpy, PyYAML,
kaldi-native-fbank and torch come with fun-asr and its test extra. ``import funasr`` walks every
submodule and swallows import errors (the "Please install torch_complex" lines are harmless).

Fbank backend: 1.4.16's ``funasr/utils/fbank.py`` uses ``torchaudio.compliance.kaldi`` when ``import
torchaudio.compliance.kaldi`` succeeds and kaldi-native-fbank otherwise; with torchaudio absent (it does
not load beside torch 2.13) FunASR computes fbank with kaldi-native-fbank, as we do, so features agree
to the last bit and probabilities to float rounding of the network.
"""

from __future__ import annotations

import contextlib
import io
import os
from functools import lru_cache
from pathlib import Path
from typing import Any

import numpy as np

FUNASR_VERSION = "1.4.16"
INSTALL_LINES = (
    "python -m pip install --no-deps funasr==1.4.16 omegaconf==2.4.0 kaldiio==2.18.1 librosa==0.11.0 "
    "lazy_loader==0.6",
    "python -m pip install onnxruntime==1.32.0",
)


@lru_cache(maxsize=1)
def _import_funasr():  # noqa: ANN202
    with contextlib.redirect_stdout(io.StringIO()):
        import funasr
        from funasr import AutoModel  # noqa: F401
    return funasr


@lru_cache(maxsize=1)
def funasr_available() -> bool:
    """True when funasr 1.4.16 and the modules its VAD path imports are installed. Checked without
    importing them (``import funasr`` takes seconds and imports every submodule), so that collecting
    tests stays cheap; a broken install then fails the tests that use it instead of skipping them."""
    try:
        from importlib.metadata import version
        from importlib.util import find_spec

        if version("funasr") != FUNASR_VERSION:
            return False
        return all(find_spec(m) is not None
                   for m in ("torch", "omegaconf", "kaldiio", "librosa", "lazy_loader", "kaldi_native_fbank"))
    except Exception:  # noqa: BLE001 - not installed, or an odd environment: not available
        return False


def fbank_backend() -> str:
    """'torchaudio' or 'kaldi-native-fbank': what FunASR's frontend computes fbank with here."""
    _import_funasr()
    from funasr.utils import fbank

    return "torchaudio" if fbank._HAS_TORCHAUDIO else "kaldi-native-fbank"


@contextlib.contextmanager
def _isolated():  # noqa: ANN202
    """FunASR sets torch's thread count (AutoModel and every generate) and seeds the global RNGs (random,
    numpy, torch) when it builds a model; undo both so that other tests in the session do not notice,
    and swallow its prints."""
    import random

    import torch

    threads = torch.get_num_threads()
    states = random.getstate(), np.random.get_state(), torch.random.get_rng_state()
    try:
        with contextlib.redirect_stdout(io.StringIO()):
            yield
    finally:
        torch.set_num_threads(threads)
        random.setstate(states[0])
        np.random.set_state(states[1])
        torch.random.set_rng_state(states[2])


@lru_cache(maxsize=8)
def automodel(model_dir: str, max_single_segment_time: int | None = None) -> Any:
    """``AutoModel(model=model_dir, disable_update=True)`` (cached), CPU, one thread, no progress bar."""
    _import_funasr()
    from funasr import AutoModel

    kw: dict[str, Any] = {}
    if max_single_segment_time is not None:
        kw["max_single_segment_time"] = int(max_single_segment_time)
    with _isolated():
        return AutoModel(model=str(model_dir), disable_update=True, disable_pbar=True, log_level="ERROR",
                         device="cpu", ncpu=1, **kw)


def _input(samples: np.ndarray | str | os.PathLike) -> np.ndarray | str:
    if isinstance(samples, (str, os.PathLike)):
        return str(samples)
    return np.ascontiguousarray(samples, dtype=np.float32).reshape(-1)


class _Recorder:
    """Records the encoder's softmax outputs and the frame decibels FunASR computes, per forward call."""

    def __init__(self, model: Any) -> None:
        self.model = model
        self.probs: list[np.ndarray] = []
        self.decibels: list[np.ndarray] = []

    def __enter__(self) -> _Recorder:
        net = self.model.model
        self._hook = net.encoder.register_forward_hook(
            lambda mod, args, out: self.probs.append(out.detach().float().numpy()[0].copy()))
        orig = net.ComputeDecibel

        def compute_decibel(cache=None, frame_count=None):  # noqa: ANN001, ANN202
            n0 = len(cache["stats"].decibel)
            orig(cache=cache, frame_count=frame_count)
            self.decibels.append(np.asarray(cache["stats"].decibel[n0:], dtype=np.float32))

        net.ComputeDecibel = compute_decibel
        return self

    def __exit__(self, *exc: object) -> None:
        self._hook.remove()
        del self.model.model.ComputeDecibel

    def cat_probs(self, n_classes: int = 248) -> np.ndarray:
        return np.concatenate(self.probs) if self.probs else np.zeros((0, n_classes), np.float32)

    def cat_decibels(self) -> np.ndarray:
        return np.concatenate(self.decibels) if self.decibels else np.zeros(0, np.float32)


def vad_trace(model_dir: str | Path, samples: np.ndarray | str, max_single_segment_time: int | None = None,
              **generate_kwargs: Any) -> tuple[list[list[int]], np.ndarray, np.ndarray, list[int]]:
    """Offline ``generate(input=samples)``: (segments, softmax probs [T, C], decibels [T], frames per
    forward call). ``generate_kwargs`` go to generate (e.g. ``max_end_silence_time``, ``speech_noise_thres``)."""
    m = automodel(str(model_dir), max_single_segment_time)
    with _Recorder(m) as rec, _isolated():
        res = m.generate(input=_input(samples), **generate_kwargs)
    segs = [list(map(int, s)) for s in res[0]["value"]]
    return segs, rec.cat_probs(), rec.cat_decibels(), [p.shape[0] for p in rec.probs]


def vad_segments(model_dir: str | Path, samples: np.ndarray | str, max_single_segment_time: int | None = None,
                 **generate_kwargs: Any) -> list[list[int]]:
    """FunASR's offline VAD segments ``[[start_ms, end_ms], ...]``."""
    return vad_trace(model_dir, samples, max_single_segment_time, **generate_kwargs)[0]


def vad_frame_probs(model_dir: str | Path, samples: np.ndarray | str) -> np.ndarray:
    """FunASR's softmax outputs float32[T, 248] (column 0 = silence) for a whole clip, from its own
    frontend (WavFrontendOnline) and torch model, as run by the offline generate()."""
    return vad_trace(model_dir, samples)[1]


def vad_stream(model_dir: str | Path, samples: np.ndarray, chunk_ms: int = 60,
               max_single_segment_time: int | None = None,
               **generate_kwargs: Any) -> tuple[list[list[list[int]]], np.ndarray]:
    """FunASR's streaming mode as in its docs: ``generate(input=chunk, cache=cache, is_final=last,
    chunk_size=chunk_ms)`` over consecutive ``chunk_ms`` pieces. Returns (events per call -- ``[beg, -1]``,
    ``[-1, end]``, ``[beg, end]`` -- and the softmax probs of all frames)."""
    m = automodel(str(model_dir), max_single_segment_time)
    x = _input(samples)
    stride = int(chunk_ms * 16000 / 1000)
    n = int((len(x) - 1) / stride + 1)
    cache: dict = {}
    events: list[list[list[int]]] = []
    with _Recorder(m) as rec, _isolated():
        for i in range(n):
            res = m.generate(input=x[i * stride: (i + 1) * stride], cache=cache, is_final=i == n - 1,
                             chunk_size=chunk_ms, **generate_kwargs)
            events.append([list(map(int, s)) for s in res[0]["value"]])
    return events, rec.cat_probs()


def encoder_probs(model_dir: str | Path, feats: np.ndarray, chunk: int | None = None,
                  max_single_segment_time: int | None = None) -> np.ndarray:
    """FunASR's torch FSMN (``model.encoder``) on given features [T, 400], whole or in ``chunk``-frame
    pieces with its own streaming caches (``cache_layer_i``). (``max_single_segment_time`` only picks
    which cached AutoModel to reuse.)"""
    import torch

    m = automodel(str(model_dir), max_single_segment_time)
    feats = np.ascontiguousarray(feats, dtype=np.float32)
    step = chunk or max(feats.shape[0], 1)
    cache: dict = {}
    outs = []
    with torch.no_grad():
        for i in range(0, feats.shape[0], step):
            outs.append(m.model.encoder(torch.from_numpy(feats[i: i + step])[None], cache=cache)[0].numpy())
    return np.concatenate(outs) if outs else np.zeros((0, 248), np.float32)


def server_vad_segments(model_dir: str | Path, samples: np.ndarray, message_ms: int = 60,
                        max_single_segment_time: int | None = None) -> list[list[int]]:
    """FunASR 1.4.16's realtime server VAD (``DynamicStreamingVAD``) fed ``message_ms`` messages, then
    ``finalize()`` and the server's tail fallback (``_finalize_server_session``): closed segments in ms."""
    _import_funasr()
    import torch
    from funasr.models.fsmn_vad_streaming.dynamic_vad import DynamicStreamingVAD

    model = automodel(str(model_dir), max_single_segment_time)
    x = np.ascontiguousarray(samples, dtype=np.float32).reshape(-1)
    step = 16 * message_ms
    with _isolated():
        vad = DynamicStreamingVAD(model)
        out: list[list[int]] = []
        for i in range(0, x.size, step):
            out += [list(map(int, s)) for s in vad.feed(torch.from_numpy(x[i: i + step].copy()), is_final=False)]
        duration = x.size * 1000 // 16000
        tail = [[max(0, int(s[0])), min(duration, int(s[1]))] for s in (vad.finalize() or [])]
        tail = [s for s in tail if s[1] > s[0]]
        if not tail and vad.current_speech_start is not None:
            tail = [[int(vad.current_speech_start), duration]]
        out += tail
    return out
