"""FunASR's FSMN-VAD (``funasr/models/fsmn_vad_streaming``, FunASR 1.4.16) in numpy: DESIGN §6.

Pieces, each usable alone:

- :class:`VadConfig` -- ``model_conf`` of the model's ``config.yaml`` under FunASR's names, plus our
  options (``max_single_segment_ms``, ``max_end_silence_ms`` = None for 1.4.16's dynamic schedule, ...).
- :func:`read_am_mvn` -- the Kaldi nnet text CMVN (``<AddShift>`` then ``<Rescale>``).
- :func:`vad_features` / :func:`frame_decibels` -- FunASR's ``WavFrontendOnline`` (x32768, Kaldi fbank
  80 mel 25/10 ms hamming, dither 0, LFR m=5 n=1, CMVN ``(x + shift) * scale``) and the per-frame energy
  in dB that the decision logic also reads.
- :class:`FsmnWeights` / :func:`vad_network_numpy` -- the FSMN network, offline or chunked with the
  carried 19-frame FSMN caches (one per layer).
- :class:`VadDetector` -- the decision logic of ``FsmnVADStreaming`` (window detector, start/end rules,
  look-back/look-ahead, ``max_single_segment_time`` forced cuts, SNR/decibel gates), fed per-frame
  silence probabilities incrementally.
- :func:`detect_segments` -- 1.4.16's offline ``inference()``: 60 s chunks with the dynamic
  end-silence schedule; :class:`OfflineVad` -- the same over a clip given in pieces (bounded memory,
  the same segments); :class:`VadStream` -- its streaming mode (``generate(cache=..., is_final=...,
  chunk_size=60)``), returning FunASR's ``[beg, -1]`` / ``[-1, end]`` / ``[beg, end]`` events.
- :class:`FsmnVad` -- a model folder (``model.pt``, ``config.yaml``, ``am.mvn``) put together.

Times are integer milliseconds; one frame is 10 ms; frame ``t`` covers samples ``[160 t, 160 t + 400)``.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

__all__ = [
    "DEFAULT_SILENCE_SCHEDULE", "STREAMING_SILENCE_SCHEDULE", "VadConfig", "VadFrontendConfig",
    "read_am_mvn", "vad_features", "frame_decibels", "num_fbank_frames", "FsmnWeights",
    "vad_network_numpy", "VadDetector", "detect_segments", "OfflineVad", "VadStream", "FsmnVad",
]

# FunASR 1.4.16 model.py: (accumulated speech ms, end-silence ms); the first row whose limit is >= the
# accumulated time applies. inference() adds its chunk_size (60 s offline) per chunk boundary crossed in
# speech, so offline only the 2000 / 200 / 100 ms rows are ever reached.
DEFAULT_SILENCE_SCHEDULE: tuple[tuple[float, int], ...] = (
    (10000, 2000), (20000, 1000), (30000, 800), (40000, 600), (50000, 400), (60000, 200), (math.inf, 100))
# FunASR 1.4.16 model.py STREAMING_SILENCE_SCHEDULE (defined, unused by inference(); DynamicStreamingVAD
# in dynamic_vad.py uses the same values).
STREAMING_SILENCE_SCHEDULE: tuple[tuple[float, int], ...] = (
    (5000, 2000), (10000, 1500), (15000, 1000), (30000, 800), (45000, 400), (math.inf, 100))


@dataclass(frozen=True)
class VadFrontendConfig:
    """``frontend_conf`` of config.yaml (``WavFrontendOnline``)."""

    fs: int = 16000
    window: str = "hamming"
    n_mels: int = 80
    frame_length: int = 25  # ms
    frame_shift: int = 10  # ms
    dither: float = 0.0
    lfr_m: int = 5
    lfr_n: int = 1

    @property
    def frame_samples(self) -> int:
        return int(self.frame_length * self.fs / 1000)

    @property
    def shift_samples(self) -> int:
        return int(self.frame_shift * self.fs / 1000)


_MAX_FRONTEND = {"fs": 384_000, "n_mels": 1024, "frame_length": 1000, "frame_shift": 1000, "lfr_m": 64, "lfr_n": 64}


def _typed_section(cls: type, conf: Mapping[str, Any], section: str, skip: set[str] = frozenset()) -> dict[str, Any]:
    """The known keys of ``conf[section]``, each of its field's type (int, float, bool, str), with a ValueError
    naming the key otherwise; unknown keys are ignored (as FunASR does)."""
    values = conf.get(section) or {}
    if not isinstance(values, Mapping):
        raise ValueError(f"config.yaml {section} must be a mapping, got {type(values).__name__}")
    defaults = {f.name: f.default for f in dataclasses.fields(cls) if f.name not in skip}
    out: dict[str, Any] = {}
    for k, v in values.items():
        if k not in defaults:
            continue
        d = defaults[k]
        if isinstance(d, bool) or isinstance(v, bool):
            ok = isinstance(v, bool) and isinstance(d, bool) or (isinstance(d, bool) and v in (0, 1))
        elif isinstance(d, int) or (d is None and k.endswith("_ms")):
            ok = isinstance(v, int) or (v is None and k.endswith("_ms"))  # our *_ms options take None
        elif isinstance(d, float):
            ok = isinstance(v, int | float) and math.isfinite(v)
        elif isinstance(d, str):
            ok = isinstance(v, str)
        else:
            ok = True  # tuples (sil_pdf_ids, silence_schedule): checked by the caller
        if not ok:
            raise ValueError(f"config.yaml {section}.{k} must be {type(d).__name__ if d is not None else 'an int'}, "
                             f"got {v!r:.60}")
        out[k] = v
    return out


@dataclass(frozen=True)
class VadConfig:
    """FunASR's ``VADXOptions`` (names and defaults of funasr 1.4.16; config.yaml ``model_conf`` overrides
    them), then our options.

    FunASR options that only matter for other modes are kept for fidelity: ``detect_mode`` 0 (single
    utterance) uses ``max_start_silence_time``; ``snr_mode``, ``nn_eval_block_size``, ``dcd_block_size``,
    ``speech_noise_thresh_low/high`` and ``output_frame_probs`` have no effect in 1.4.16.
    """

    sample_rate: int = 16000
    detect_mode: int = 1  # 1 = multiple utterances (reset after each end point), 0 = single utterance
    snr_mode: int = 0
    max_end_silence_time: int = 800  # ms; used when the dynamic schedule is off (max_end_silence_ms given)
    max_start_silence_time: int = 3000
    do_start_point_detection: bool = True
    do_end_point_detection: bool = True
    window_size_ms: int = 200
    sil_to_speech_time_thres: int = 150
    speech_to_sil_time_thres: int = 150
    speech_2_noise_ratio: float = 1.0
    do_extend: int = 1
    lookback_time_start_point: int = 200
    lookahead_time_end_point: int = 100
    max_single_segment_time: int = 60000  # config value; max_single_segment_ms below overrides it
    nn_eval_block_size: int = 8
    dcd_block_size: int = 4
    snr_thres: float = -100.0
    noise_frame_num_used_for_snr: int = 100
    decibel_thres: float = -100.0
    speech_noise_thres: float = 0.6  # used with a fixed end silence; the dynamic schedule forces 0.5
    fe_prior_thres: float = 1e-4
    silence_pdf_num: int = 1
    sil_pdf_ids: tuple[int, ...] = (0,)
    speech_noise_thresh_low: float = -0.1
    speech_noise_thresh_high: float = 0.3
    output_frame_probs: bool = False
    frame_in_ms: int = 10
    frame_length_ms: int = 25
    # --- our options ---
    # Forced cut of a segment longer than this (FunASR's max_single_segment_time, as FunASR's ASR pipeline
    # passes it: vad_kwargs={"max_single_segment_time": 30000}); None = the config's value.
    max_single_segment_ms: int | None = 30000
    # Fixed end silence (FunASR: generate(max_end_silence_time=...), which turns the dynamic schedule off);
    # None = FunASR 1.4.16's default dynamic schedule.
    max_end_silence_ms: int | None = None
    silence_schedule: tuple[tuple[float, int], ...] = DEFAULT_SILENCE_SCHEDULE
    dynamic_speech_noise_thres: float = 0.5  # what 1.4.16's dynamic schedule sets speech_noise_thres to
    offline_chunk_ms: int = 60000  # FunASR's offline inference() chunk_size
    frontend: VadFrontendConfig = field(default_factory=VadFrontendConfig)

    @property
    def dynamic(self) -> bool:
        return self.max_end_silence_ms is None

    @property
    def segment_limit_ms(self) -> int:
        return self.max_single_segment_time if self.max_single_segment_ms is None else self.max_single_segment_ms

    @classmethod
    def from_dict(cls, conf: Mapping[str, Any], **overrides: Any) -> VadConfig:
        """From a parsed config.yaml (``model_conf`` and ``frontend_conf`` sections); unknown keys are ignored."""
        if not isinstance(conf, Mapping):
            raise ValueError(f"VAD config must be a mapping (config.yaml), got {type(conf).__name__}")
        kw = _typed_section(cls, conf, "model_conf", skip={"frontend"})
        if "sil_pdf_ids" in kw:
            ids = kw["sil_pdf_ids"]
            if not isinstance(ids, list | tuple) or not ids or not all(
                    isinstance(x, int) and not isinstance(x, bool) and 0 <= x < 4096 for x in ids):
                raise ValueError(f"config.yaml model_conf.sil_pdf_ids must be a list of class ids, got {ids!r:.80}")
            kw["sil_pdf_ids"] = tuple(ids)
        if "silence_schedule" in kw:
            rows = kw["silence_schedule"]
            if not isinstance(rows, list | tuple) or not rows or not all(
                    isinstance(r, list | tuple) and len(r) == 2 and all(
                        isinstance(x, int | float) and not isinstance(x, bool) for x in r) for r in rows):
                raise ValueError(f"config.yaml model_conf.silence_schedule must be [[ms, silence_ms], ...], got "
                                 f"{rows!r:.80}")
            kw["silence_schedule"] = tuple((float(a), int(b)) for a, b in rows)
        fkw = _typed_section(VadFrontendConfig, conf, "frontend_conf")
        for k in ("fs", "n_mels", "frame_length", "frame_shift", "lfr_m", "lfr_n"):
            if k in fkw and not 0 < fkw[k] <= _MAX_FRONTEND[k]:
                raise ValueError(f"config.yaml frontend_conf.{k} = {fkw[k]} is outside 1..{_MAX_FRONTEND[k]}")
        kw["frontend"] = VadFrontendConfig(**fkw)
        kw.update(overrides)
        cfg = cls(**kw)
        cfg.validate()
        return cfg

    @classmethod
    def from_yaml(cls, path: str | Path, **overrides: Any) -> VadConfig:
        import yaml

        with open(path, encoding="utf-8") as f:
            conf = yaml.safe_load(f) or {}
        return cls.from_dict(conf, **overrides)

    def validate(self) -> None:
        fe = self.frontend
        if fe.lfr_n != 1:
            raise ValueError(f"VAD frontend lfr_n={fe.lfr_n}: one VAD frame per fbank frame (lfr_n=1) is accepted")
        if self.frame_in_ms != fe.frame_shift or self.frame_length_ms != fe.frame_length:
            raise ValueError(f"frame_in_ms/frame_length_ms ({self.frame_in_ms}/{self.frame_length_ms}) must equal "
                             f"the frontend's frame_shift/frame_length ({fe.frame_shift}/{fe.frame_length})")
        if len(self.sil_pdf_ids) != self.silence_pdf_num:
            raise ValueError(f"silence_pdf_num={self.silence_pdf_num} but sil_pdf_ids={self.sil_pdf_ids}")
        if self.window_size_ms < self.frame_in_ms:
            raise ValueError(f"window_size_ms={self.window_size_ms} is shorter than one frame")


# ------------------------------------------------------------------------------------------------------
# Frontend


def read_am_mvn(path: str | Path) -> tuple[np.ndarray, np.ndarray]:
    """``(shift, scale)`` float32 vectors of a Kaldi nnet text CMVN file (``<AddShift>``, ``<Rescale>``,
    each followed by a ``<LearnRateCoef> 0 [ v1 v2 ... ]`` line)."""
    text = Path(path).read_text(encoding="utf-8")
    lines = text.splitlines()
    found: dict[str, np.ndarray] = {}
    for i, line in enumerate(lines):
        tok = line.split()
        if tok and tok[0] in ("<AddShift>", "<Rescale>") and i + 1 < len(lines):
            nxt = lines[i + 1]
            if "[" not in nxt or "]" not in nxt:
                raise ValueError(f"{path}: {tok[0]} is not followed by a '[ ... ]' vector line")
            body = nxt[nxt.index("[") + 1: nxt.rindex("]")].split()
            vec = np.array([float(x) for x in body], dtype=np.float32)
            if len(tok) >= 2 and tok[1].isdigit() and int(tok[1]) != vec.size:
                raise ValueError(f"{path}: {tok[0]} declares {tok[1]} values, the vector has {vec.size}")
            found[tok[0]] = vec
    if "<AddShift>" not in found or "<Rescale>" not in found:
        raise ValueError(f"{path}: not a Kaldi nnet CMVN file (needs <AddShift> and <Rescale>)")
    shift, scale = found["<AddShift>"], found["<Rescale>"]
    if shift.shape != scale.shape:
        raise ValueError(f"{path}: <AddShift> has {shift.size} values, <Rescale> {scale.size}")
    return shift, scale


def num_fbank_frames(n_samples: int, fe: VadFrontendConfig = VadFrontendConfig()) -> int:
    """Kaldi snip-edges frame count: frames whose 25 ms window fits in ``n_samples``."""
    if n_samples < fe.frame_samples:
        return 0
    return (n_samples - fe.frame_samples) // fe.shift_samples + 1


def _fbank_opts(fe: VadFrontendConfig):  # noqa: ANN202
    import kaldi_native_fbank as knf

    opts = knf.FbankOptions()
    opts.frame_opts.samp_freq = fe.fs
    opts.frame_opts.dither = float(fe.dither)
    opts.frame_opts.window_type = fe.window
    opts.frame_opts.frame_length_ms = float(fe.frame_length)
    opts.frame_opts.frame_shift_ms = float(fe.frame_shift)
    opts.frame_opts.preemph_coeff = 0.97
    opts.frame_opts.remove_dc_offset = True
    opts.frame_opts.snip_edges = True
    opts.mel_opts.num_bins = fe.n_mels
    opts.energy_floor = 0.0
    opts.use_power = True
    opts.use_log_fbank = True
    return opts


def _fbank(samples: np.ndarray, fe: VadFrontendConfig) -> np.ndarray:
    import kaldi_native_fbank as knf

    fb = knf.OnlineFbank(_fbank_opts(fe))
    fb.accept_waveform(fe.fs, np.ascontiguousarray(samples * np.float32(32768), dtype=np.float32))
    fb.input_finished()
    n = fb.num_frames_ready
    if n == 0:
        return np.zeros((0, fe.n_mels), np.float32)
    return np.stack([fb.get_frame(i) for i in range(n)]).astype(np.float32, copy=False)


def _lfr_rows(fb: np.ndarray, first: int, count: int, total: int, m: int, base: int = 0) -> np.ndarray:
    """LFR rows ``first .. first+count-1`` (lfr_n = 1): fbank frames ``t - (m-1)//2 .. t + m-1-(m-1)//2``
    clamped to ``[0, total-1]``; ``fb[i]`` holds fbank frame ``base + i``."""
    left = (m - 1) // 2
    idx = np.arange(first, first + count)[:, None] + np.arange(-left, m - left)[None, :]
    idx = np.clip(idx, 0, total - 1) - base
    return fb[idx].reshape(count, m * fb.shape[1])


def vad_features(samples: np.ndarray, shift: np.ndarray, scale: np.ndarray,
                 fe: VadFrontendConfig = VadFrontendConfig()) -> np.ndarray:
    """16 kHz float samples in [-1, 1] -> CMVN'd LFR features float32[T, n_mels * lfr_m], T = fbank frames."""
    samples = np.asarray(samples, dtype=np.float32).reshape(-1)
    fb = _fbank(samples, fe)
    T = fb.shape[0]
    if T == 0:
        return np.zeros((0, fe.n_mels * fe.lfr_m), np.float32)
    feats = _lfr_rows(fb, 0, T, T, fe.lfr_m)
    feats += shift
    feats *= scale
    return feats


def frame_decibels(samples: np.ndarray, first: int = 0, count: int | None = None, sample_base: int = 0,
                   fe: VadFrontendConfig = VadFrontendConfig()) -> np.ndarray:
    """FunASR's ``ComputeDecibel``: ``10 log10(sum(x^2) + 1e-6)`` over each frame's 400 samples (unscaled
    float32 waveform). ``samples[0]`` is absolute sample ``sample_base``; returns frames first..first+count-1."""
    samples = np.asarray(samples, dtype=np.float32).reshape(-1)
    if count is None:
        count = num_fbank_frames(sample_base + samples.shape[0], fe) - first
    out = np.empty(max(count, 0), np.float32)
    block = 4096
    for b in range(0, count, block):
        n = min(block, count - b)
        starts = (first + b + np.arange(n)) * fe.shift_samples - sample_base
        frames = samples[starts[:, None] + np.arange(fe.frame_samples)]
        out[b: b + n] = 10 * np.log10(np.sum(np.square(frames), axis=1) + 0.000001)
    return out


# ------------------------------------------------------------------------------------------------------
# Network


@dataclass
class FsmnWeights:
    """The FSMN network (``encoder.*`` of model.pt), float32, linear weights as [out, in]."""

    in1: tuple[np.ndarray, np.ndarray]
    in2: tuple[np.ndarray, np.ndarray]
    layers: list[tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]]  # linear W, taps [proj, lorder], affine W, b
    out1: tuple[np.ndarray, np.ndarray]
    out2: tuple[np.ndarray, np.ndarray]

    @property
    def lorder(self) -> int:
        return self.layers[0][1].shape[1]

    @property
    def proj_dim(self) -> int:
        return self.layers[0][1].shape[0]

    @classmethod
    def from_state_dict(cls, sd: Mapping[str, np.ndarray], prefix: str = "encoder.") -> FsmnWeights:
        def get(name: str) -> np.ndarray:
            key = prefix + name
            if key not in sd:
                raise KeyError(f"FSMN-VAD weights lack {key!r}")
            return np.ascontiguousarray(sd[key], dtype=np.float32)

        def affine(name: str) -> tuple[np.ndarray, np.ndarray]:
            return get(f"{name}.linear.weight"), get(f"{name}.linear.bias")

        layers = []
        i = 0
        while f"{prefix}fsmn.{i}.linear.linear.weight" in sd:
            conv = get(f"fsmn.{i}.fsmn_block.conv_left.weight")  # [proj, 1, lorder, 1]
            if conv.ndim != 4 or conv.shape[1] != 1 or conv.shape[3] != 1:
                raise ValueError(f"fsmn.{i}.fsmn_block.conv_left.weight has shape {conv.shape}, "
                                 "expected [proj, 1, lorder, 1]")
            if f"{prefix}fsmn.{i}.fsmn_block.conv_right.weight" in sd:
                raise ValueError("FSMN blocks with a right context (rorder > 0) are not supported")
            taps = np.ascontiguousarray(conv[:, 0, :, 0])
            w_aff, b_aff = affine(f"fsmn.{i}.affine")
            layers.append((get(f"fsmn.{i}.linear.linear.weight"), taps, w_aff, b_aff))
            i += 1
        if not layers:
            raise KeyError(f"FSMN-VAD weights have no {prefix}fsmn.0.* layer")
        return cls(affine("in_linear1"), affine("in_linear2"), layers, affine("out_linear1"), affine("out_linear2"))

    def new_cache(self) -> list[np.ndarray]:
        """Zero FSMN caches: per layer the last ``lorder - 1`` projected frames, float32[lorder-1, proj]."""
        return [np.zeros((taps.shape[1] - 1, taps.shape[0]), np.float32) for _, taps, _, _ in self.layers]


def _fsmn_memory(z: np.ndarray, taps: np.ndarray, cache: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``m_t = z_t + sum_j taps[:, j] * z_{t - (L-1) + j}`` over the cache + z; returns (m, new cache)."""
    T = z.shape[0]
    L = taps.shape[1]
    padded = np.concatenate([cache, z], axis=0)  # [L-1+T, D]
    m = z.copy()
    for j in range(L):
        m += taps[:, j] * padded[j: j + T]
    return m, padded[T:] if T else cache


def vad_network_numpy(weights: FsmnWeights, feats: np.ndarray, cache: list[np.ndarray] | None = None) -> np.ndarray:
    """Softmax outputs float32[T, n_classes] of the FSMN network on CMVN'd LFR features [T, 400].

    ``cache``: None for a whole clip (zero history), or the list from :meth:`FsmnWeights.new_cache`, updated
    in place, to run a clip in chunks (same result as one call)."""
    x = np.asarray(feats, dtype=np.float32)
    if x.ndim != 2:
        raise ValueError(f"feats must be [T, dim], got shape {x.shape}")
    w, b = weights.in1
    x = x @ w.T + b
    w, b = weights.in2
    x = np.maximum(x @ w.T + b, 0)
    caches = weights.new_cache() if cache is None else cache
    for i, (w_lin, taps, w_aff, b_aff) in enumerate(weights.layers):
        z = x @ w_lin.T
        m, caches[i] = _fsmn_memory(z, taps, caches[i])
        x = np.maximum(m @ w_aff.T + b_aff, 0)
    w, b = weights.out1
    x = x @ w.T + b
    w, b = weights.out2
    x = x @ w.T + b
    x -= x.max(axis=-1, keepdims=True) if x.shape[0] else 0
    np.exp(x, out=x)
    x /= x.sum(axis=-1, keepdims=True)
    return x


# ------------------------------------------------------------------------------------------------------
# Decision logic (FsmnVADStreaming.DetectOneFrame and friends)

_START_NOT_DETECTED, _IN_SPEECH, _END_DETECTED = 1, 2, 3  # VadStateMachine
_SPEECH2SPEECH, _SPEECH2SIL, _SIL2SIL, _SIL2SPEECH = 0, 1, 2, 3  # AudioChangeState


class _Seg:
    __slots__ = ("start_ms", "end_ms", "has_start", "has_end")

    def __init__(self, start_ms: int) -> None:
        self.start_ms = start_ms
        self.end_ms = start_ms
        self.has_start = False
        self.has_end = False


class VadDetector:
    """FunASR 1.4.16's per-stream VAD state (``cache["stats"]`` + ``WindowDetector``) and frame rules.

    Feed it every frame's silence probability (column ``sil_pdf_ids`` of the softmax, summed if several)
    and decibels, in order, through :meth:`accept`, one call per FunASR ``forward`` (the chunk). Its
    thresholds (``end_silence_ms``, ``speech_noise_thres``) may change between calls, as FunASR's schedule
    does."""

    def __init__(self, cfg: VadConfig, end_silence_ms: int | None = None,
                 speech_noise_thres: float | None = None) -> None:
        self.cfg = cfg
        frame = cfg.frame_in_ms
        self._win_size = int(cfg.window_size_ms / frame)
        self._sil2speech = int(cfg.sil_to_speech_time_thres / frame)
        self._speech2sil = int(cfg.speech_to_sil_time_thres / frame)
        self._latency = self._win_size + (int(cfg.lookback_time_start_point / frame) if cfg.do_extend else 0)
        self._lookahead = int(cfg.lookahead_time_end_point / frame)
        self._max_seg_frames = cfg.segment_limit_ms / frame  # float, as FunASR compares
        # Stats.max_end_sil_frame_cnt_thresh (a time in ms despite its name)
        end = cfg.max_end_silence_time if end_silence_ms is None else end_silence_ms
        self.max_end_sil_ms = end - cfg.speech_to_sil_time_thres
        self.speech_noise_thres = cfg.speech_noise_thres if speech_noise_thres is None else speech_noise_thres
        self.frames = 0  # frm_cnt
        self.noise_average_decibel = -100.0
        self.number_end_time_detected = 0
        self.data_buf_start_frame = 0
        self._segs: list[_Seg] = []
        self._out_offset = 0
        self._next_seg = True
        self._reset_detection()

    # -- thresholds --------------------------------------------------------------------------------
    def set_end_silence(self, silence_ms: int) -> None:
        """What FunASR's dynamic schedule does: ``max(silence_ms - speech_to_sil_time_thres, 0)``."""
        self.max_end_sil_ms = max(silence_ms - self.cfg.speech_to_sil_time_thres, 0)

    @property
    def in_speech(self) -> bool:
        return self._state == _IN_SPEECH

    def first_pending_frame(self) -> int:
        """No segment that :meth:`accept` has not returned yet starts before this frame: the open one
        (if any) starts here or later, and a later one at most the start look-back before the next frame."""
        starts = [seg.start_ms // self.cfg.frame_in_ms for seg in self._segs[self._out_offset:]]
        return max(0, min([*starts, self.frames - self._latency]))

    # -- state ---------------------------------------------------------------------------------------
    def _reset_window(self) -> None:
        self._win = [0] * self._win_size
        self._win_sum = 0
        self._win_pos = 0
        self._win_speech = False  # pre_frame_state

    def _reset_detection(self) -> None:
        self._sil_count = 0  # continous_silence_frame_count
        self._latest_speech = 0  # latest_confirmed_speech_frame
        self._latest_silence = -1  # lastest_confirmed_silence_frame
        self._confirmed_start = -1
        self._confirmed_end = -1
        self._state = _START_NOT_DETECTED
        self._reset_window()

    # -- per frame -----------------------------------------------------------------------------------
    def _frame_is_speech(self, p_sil: float, db: float) -> bool:
        """GetFrameState."""
        cfg = self.cfg
        snr = db - self.noise_average_decibel
        if db < cfg.decibel_thres:
            return False
        # FunASR: noise_prob = log(p_sil) * ratio; speech_prob = log(1 - p_sil);
        # speech if exp(speech_prob) >= exp(noise_prob) + speech_noise_thres (a log(0) would raise there).
        noise = math.exp(math.log(p_sil) * cfg.speech_2_noise_ratio) if p_sil > 0 else 0.0
        rest = 1.0 - p_sil
        speech = math.exp(math.log(rest)) if rest > 0 else 0.0
        if speech >= noise + self.speech_noise_thres:
            return snr >= cfg.snr_thres and db >= cfg.decibel_thres
        if self.noise_average_decibel < -99.9:
            self.noise_average_decibel = db
        else:
            n = cfg.noise_frame_num_used_for_snr
            self.noise_average_decibel = (db + self.noise_average_decibel * (n - 1)) / n
        return False

    def _window(self, speech: bool) -> int:
        """WindowDetector.DetectOneFrame."""
        cur = 1 if speech else 0
        self._win_sum += cur - self._win[self._win_pos]
        self._win[self._win_pos] = cur
        self._win_pos = (self._win_pos + 1) % self._win_size
        if not self._win_speech and self._win_sum >= self._sil2speech:
            self._win_speech = True
            return _SIL2SPEECH
        if self._win_speech and self._win_sum <= self._speech2sil:
            self._win_speech = False
            return _SPEECH2SIL
        return _SPEECH2SPEECH if self._win_speech else _SIL2SIL

    def _pop_to_output(self, frame: int, first_is_start: bool, last_is_end: bool) -> None:
        """PopDataToOutputBuf(frame, 1, ...): extends (or opens) the current segment through ``frame``."""
        self.data_buf_start_frame = max(self.data_buf_start_frame, frame)  # PopDataBufTillFrame
        if not self._segs or first_is_start:
            self._segs.append(_Seg(frame * self.cfg.frame_in_ms))
        seg = self._segs[-1]
        self.data_buf_start_frame += 1
        seg.end_ms = (frame + 1) * self.cfg.frame_in_ms
        if first_is_start:
            seg.has_start = True
        if last_is_end:
            seg.has_end = True

    def _on_voice_detected(self, frame: int) -> None:
        self._latest_speech = frame
        self._pop_to_output(frame, False, False)

    def _on_silence_detected(self, frame: int) -> None:
        self._latest_silence = frame
        if self._state == _START_NOT_DETECTED:
            self.data_buf_start_frame = max(self.data_buf_start_frame, frame)

    def _on_voice_start(self, frame: int, fake: bool = False) -> None:
        if self._confirmed_start == -1:
            self._confirmed_start = frame
        if not fake and self._state == _START_NOT_DETECTED:
            self._pop_to_output(self._confirmed_start, True, False)

    def _on_voice_end(self, frame: int, fake: bool) -> None:
        for t in range(self._latest_speech + 1, frame):
            self._on_voice_detected(t)
        if self._confirmed_end == -1:
            self._confirmed_end = frame
        if not fake:
            self._pop_to_output(self._confirmed_end, False, True)
        self.number_end_time_detected += 1

    def _end_segment(self, frame: int) -> None:
        self._on_voice_end(frame, False)
        self._state = _END_DETECTED

    def _detect_one_frame(self, speech: bool, cur: int, is_final: bool) -> None:
        cfg = self.cfg
        if speech and not (1.0 > cfg.fe_prior_thres):
            speech = False
        change = self._window(speech)
        state = self._state
        too_long = cur - self._confirmed_start + 1 > self._max_seg_frames
        if change == _SIL2SPEECH:
            self._sil_count = 0
            if state == _START_NOT_DETECTED:
                start = max(self.data_buf_start_frame, cur - self._latency)
                self._on_voice_start(start)
                self._state = _IN_SPEECH
                for t in range(start + 1, cur + 1):
                    self._on_voice_detected(t)
            elif state == _IN_SPEECH:
                for t in range(self._latest_speech + 1, cur):
                    self._on_voice_detected(t)
                if too_long:
                    self._end_segment(cur)
                elif not is_final:
                    self._on_voice_detected(cur)
                else:
                    self._end_segment(cur)
        elif change == _SPEECH2SIL or change == _SPEECH2SPEECH:
            self._sil_count = 0
            if state == _IN_SPEECH:
                if too_long:
                    self._end_segment(cur)
                elif not is_final:
                    self._on_voice_detected(cur)
                else:
                    self._end_segment(cur)
        else:  # _SIL2SIL
            self._sil_count += 1
            if state == _START_NOT_DETECTED:
                single_timeout = (cfg.detect_mode == 0
                                  and self._sil_count * cfg.frame_in_ms > cfg.max_start_silence_time)
                if single_timeout or (is_final and self.number_end_time_detected == 0):
                    for t in range(self._latest_silence + 1, cur):
                        self._on_silence_detected(t)
                    self._on_voice_start(0, fake=True)
                    self._on_voice_end(0, fake=True)
                    self._state = _END_DETECTED
                elif cur >= self._latency:
                    self._on_silence_detected(cur - self._latency)
            elif state == _IN_SPEECH:
                if self._sil_count * cfg.frame_in_ms >= self.max_end_sil_ms:
                    lookback = int(self.max_end_sil_ms / cfg.frame_in_ms)
                    if cfg.do_extend:
                        lookback = max(0, lookback - self._lookahead - 1)
                    self._end_segment(cur - lookback)
                elif too_long:
                    self._end_segment(cur)
                elif cfg.do_extend and not is_final:
                    if self._sil_count <= self._lookahead:
                        self._on_voice_detected(cur)
                elif is_final:
                    self._end_segment(cur)
        if self._state == _END_DETECTED and cfg.detect_mode == 1:
            self._reset_detection()

    # -- per chunk -----------------------------------------------------------------------------------
    def accept(self, silence_probs: Sequence[float] | np.ndarray, decibels: Sequence[float] | np.ndarray,
               is_final: bool = False, streaming: bool = False) -> list[list[int]]:
        """One FunASR ``forward`` call over the next frames. Returns, as FunASR does:

        - ``streaming=False``: completed segments ``[start_ms, end_ms]`` (and, when ``is_final``, every
          segment not returned yet, an open one included);
        - ``streaming=True``: events ``[beg, -1]`` (start), ``[-1, end]`` (end), ``[beg, end]`` (both).

        No frames -> no detection at all (FunASR returns before detecting, even when ``is_final``)."""
        probs = np.asarray(silence_probs).reshape(-1).astype(np.float64)  # exact for float32 input
        dbs = np.asarray(decibels).reshape(-1).astype(np.float64)
        n = probs.shape[0]
        if dbs.shape[0] != n:
            raise ValueError(f"{n} probabilities but {dbs.shape[0]} decibel values")
        if n == 0:
            return []
        base = self.frames
        self.frames += n
        if self._state != _END_DETECTED:
            p_list, db_list = probs.tolist(), dbs.tolist()
            for k in range(n):
                speech = self._frame_is_speech(p_list[k], db_list[k])
                self._detect_one_frame(speech, base + k, is_final and k == n - 1)
        return self._collect(is_final, streaming)

    def _collect(self, is_final: bool, streaming: bool) -> list[list[int]]:
        out = []
        for i in range(self._out_offset, len(self._segs)):
            seg = self._segs[i]
            if streaming:
                if not seg.has_start or (not self._next_seg and not seg.has_end):
                    continue
                start = seg.start_ms if self._next_seg else -1
                if seg.has_end:
                    end = seg.end_ms
                    self._next_seg = True
                    self._out_offset += 1
                else:
                    end = -1
                    self._next_seg = False
            else:
                if not is_final and (not seg.has_start or not seg.has_end):
                    continue
                start, end = seg.start_ms, seg.end_ms
                self._out_offset += 1
            out.append([start, end])
        return out


def _silence_column(probs: np.ndarray, sil_pdf_ids: Sequence[int]) -> np.ndarray:
    """The silence probability per frame from softmax outputs [T, C] (FunASR sums ``sil_pdf_ids``)."""
    probs = np.asarray(probs)
    if probs.ndim == 1:
        return probs  # already the silence column
    if len(sil_pdf_ids) == 1:
        return probs[:, sil_pdf_ids[0]].astype(np.float32)
    out = np.zeros(probs.shape[0], np.float64)
    for i in sil_pdf_ids:
        out += probs[:, i].astype(np.float64)
    return out


class _Schedule:
    """FunASR 1.4.16 inference()'s dynamic end silence, carried across chunks (and generate calls)."""

    def __init__(self, cfg: VadConfig, chunk_ms: int) -> None:
        self.cfg = cfg
        self.chunk_ms = chunk_ms
        self.accumulated_ms = 0
        self.in_speech = False

    def before_chunk(self, det: VadDetector, n_samples: int = 0) -> None:
        if not self.cfg.dynamic:
            return
        if det.in_speech or self.in_speech:
            self.accumulated_ms += self.chunk_ms
            self.in_speech = True
        for limit_ms, silence_ms in self.cfg.silence_schedule:
            if self.accumulated_ms <= limit_ms:
                det.set_end_silence(silence_ms)
                det.speech_noise_thres = self.cfg.dynamic_speech_noise_thres
                break

    def after_chunk(self, events: list[list[int]]) -> None:
        if events and self.cfg.dynamic:
            self.accumulated_ms = 0
            self.in_speech = False


class _ServerSchedule:
    """FunASR 1.4.16's realtime server (``DynamicStreamingVAD``, ``dynamic_vad.py``): before every
    chunk, the end silence follows how long the open sentence has lasted (audio end, this chunk
    included, minus the sentence's start; 0 outside speech) through ``STREAMING_SILENCE_SCHEDULE``, and
    ``speech_noise_thres`` is 0.5. FunASR applies it per received message; here per ``chunk_ms`` piece,
    which is the same for 60 ms messages and makes the result independent of how audio is fed."""

    def __init__(self, cfg: VadConfig, table: Sequence[tuple[float, int]] = STREAMING_SILENCE_SCHEDULE,
                 speech_noise_thres: float = 0.5) -> None:
        self.fs = cfg.frontend.fs
        self.table = tuple(table)
        self.thres = speech_noise_thres
        self.samples = 0
        self.speech_start_ms: int | None = None

    def before_chunk(self, det: VadDetector, n_samples: int = 0) -> None:
        self.samples += n_samples
        acc = 0 if self.speech_start_ms is None else max(0, self.samples * 1000 // self.fs - self.speech_start_ms)
        silence = self.table[-1][1]
        for limit_ms, silence_ms in self.table:
            if acc <= limit_ms:
                silence = silence_ms
                break
        det.set_end_silence(silence)
        det.speech_noise_thres = self.thres

    def after_chunk(self, events: list[list[int]]) -> None:
        for beg, end in events:
            if beg >= 0 and end == -1:
                self.speech_start_ms = beg
            elif end >= 0:
                self.speech_start_ms = None


def _new_detector(cfg: VadConfig) -> VadDetector:
    # init_cache: a max_end_silence_time passed to generate() replaces the config's (and turns the schedule off)
    return VadDetector(cfg, end_silence_ms=cfg.max_end_silence_time if cfg.dynamic else cfg.max_end_silence_ms)


class _OfflineChunks:
    """1.4.16's offline ``inference()`` loop over per-frame values that arrive in pieces: the clip in
    ``offline_chunk_ms`` (60 s) chunks, each chunk's frames (those the streaming frontend has emitted by
    then: all but the last two until the final chunk) through the detector, the dynamic end-silence
    schedule stepped before each chunk. A chunk runs once it is known not to be the last one (more audio
    than its end has arrived) and its frames are in, or at :meth:`run` with ``final``."""

    def __init__(self, cfg: VadConfig) -> None:
        fe = cfg.frontend
        self.cfg = cfg
        self.stride = int(cfg.offline_chunk_ms * fe.fs / 1000)
        self.keep = (fe.lfr_m - 1) - (fe.lfr_m - 1) // 2  # LFR right context the streaming frontend waits for
        self.det = _new_detector(cfg)
        self.sched = _Schedule(cfg, cfg.offline_chunk_ms)
        self.chunk = 0  # next chunk
        self.done = 0  # frames given to the detector
        self._p = np.zeros(0, np.float64)  # frames from self._base on, not yet given to the detector
        self._db = np.zeros(0, np.float32)
        self._base = 0

    @property
    def frames(self) -> int:
        """Frames pushed so far."""
        return self._base + self._p.shape[0]

    def push(self, silence_probs: np.ndarray, decibels: np.ndarray) -> None:
        if silence_probs.shape[0] != decibels.shape[0]:
            raise ValueError(f"{silence_probs.shape[0]} probabilities but {decibels.shape[0]} decibel values")
        self._p = np.concatenate([self._p, silence_probs]) if self._p.size else silence_probs
        self._db = np.concatenate([self._db, decibels]) if self._db.size else decibels

    def run(self, n_samples: int, final: bool = False) -> list[list[int]]:
        """The chunks that can run with ``n_samples`` samples of audio so far (``final``: the whole clip,
        every frame pushed); returns their segments ``[[start_ms, end_ms], ...]``."""
        fe = self.cfg.frontend
        total = num_fbank_frames(n_samples, fe)
        if final and self.frames != total:
            raise ValueError(f"{n_samples} samples make {total} frames; got {self.frames} frame values")
        out: list[list[int]] = []
        if final and total == 0:
            return out
        last = n_samples // self.stride  # the final chunk's index, once n_samples is the clip's length
        while self.chunk < last or (final and self.chunk == last):
            is_final = final and self.chunk == last
            upto = total if is_final else max(num_fbank_frames((self.chunk + 1) * self.stride, fe) - self.keep, 0)
            if upto > self.frames:
                break  # its frames are not all in yet
            self.sched.before_chunk(self.det)
            a, b = self.done - self._base, max(upto - self._base, 0)
            segs = self.det.accept(self._p[a:b], self._db[a:b], is_final=is_final, streaming=False)
            self.done = max(self.done, upto)
            out.extend(segs)
            self.sched.after_chunk(bool(segs))
            self.chunk += 1
            drop = self.done - self._base
            self._p, self._db, self._base = self._p[drop:], self._db[drop:], self.done
        return out


def detect_segments(silence_probs: np.ndarray, decibels: np.ndarray, n_samples: int,
                    cfg: VadConfig = VadConfig()) -> list[list[int]]:
    """Speech segments ``[[start_ms, end_ms], ...]`` of a whole clip, as FunASR 1.4.16's offline
    ``AutoModel.generate(input=clip)``: the clip in ``offline_chunk_ms`` (60 s) chunks, each chunk's frames
    (those the streaming frontend has emitted by then: all but the last two until the final chunk) through
    the detector, the dynamic end-silence schedule stepped before each chunk.

    ``silence_probs``/``decibels``: one value per frame of the whole clip (``num_fbank_frames(n_samples)``);
    ``silence_probs`` may also be the full softmax output [T, C]."""
    p = _silence_column(silence_probs, cfg.sil_pdf_ids)
    db = np.asarray(decibels, dtype=np.float32).reshape(-1)
    total = num_fbank_frames(n_samples, cfg.frontend)
    if p.shape[0] != total or db.shape[0] != total:
        raise ValueError(f"{n_samples} samples make {total} frames; got {p.shape[0]} probabilities and "
                         f"{db.shape[0]} decibel values")
    chunks = _OfflineChunks(cfg)
    chunks.push(p, db)
    return chunks.run(n_samples, final=True)


class OfflineVad:
    """:meth:`FsmnVad.segments` over audio given in pieces, with the same segments as one call on the
    whole clip: the network runs in the same ``CHUNK_FRAMES`` calls (each once its frames' right context
    has arrived), 1.4.16's 60 s offline chunks run once each is known not to be the last one. Memory
    stays bounded: only the frames and samples not yet through the network are kept.

    :meth:`feed` takes the next 16 kHz samples, and, when the caller computes the fbank anyway (the ASR
    frontend shares it), the frames those samples complete; :meth:`close` ends the clip. Both return the
    segments ``[[start_ms, end_ms], ...]`` completed so far, in order."""

    def __init__(self, vad: FsmnVad, cfg: VadConfig | None = None) -> None:
        self.vad = vad
        self.cfg = cfg or vad.cfg
        fe = self.cfg.frontend
        self._chunks = _OfflineChunks(self.cfg)
        self._cache = vad.new_cache()
        self._knf: Any = None  # own fbank when the caller gives none
        self._fb = np.zeros((0, fe.n_mels), np.float32)  # fbank frames from self._fb_base on
        self._fb_base = 0
        self._s = np.zeros(0, np.float32)  # samples from self._s_base on
        self._s_base = 0
        self.n_samples = 0
        self._net = 0  # frames through the network
        self._closed = False

    def first_pending_frame(self) -> int:
        """No segment still to be returned starts before this fbank frame."""
        return self._chunks.det.first_pending_frame()

    def feed(self, samples: np.ndarray, fbank: np.ndarray | None = None) -> list[list[int]]:
        """The next samples (16 kHz float in [-1, 1]); ``fbank``: the fbank frames they complete (exactly
        ``num_fbank_frames(all samples so far)`` frames in all), else computed here."""
        if self._closed:
            raise ValueError("OfflineVad is closed")
        fe = self.cfg.frontend
        samples = np.asarray(samples, dtype=np.float32).reshape(-1)
        if fbank is None:
            if self._knf is None:
                import kaldi_native_fbank as knf

                self._knf = knf.OnlineFbank(_fbank_opts(fe))
            if samples.size:
                self._knf.accept_waveform(fe.fs, samples * np.float32(32768))
            have, ready = self._fb_base + self._fb.shape[0], self._knf.num_frames_ready
            fbank = (np.stack([self._knf.get_frame(i) for i in range(have, ready)]).astype(np.float32)
                     if ready > have else np.zeros((0, fe.n_mels), np.float32))
            if ready > have:
                self._knf.pop(ready - have)
        self.n_samples += samples.size
        if self._fb_base + self._fb.shape[0] + fbank.shape[0] != num_fbank_frames(self.n_samples, fe):
            raise ValueError(f"{self.n_samples} samples make {num_fbank_frames(self.n_samples, fe)} fbank frames; "
                             f"got {self._fb_base + self._fb.shape[0] + fbank.shape[0]}")
        self._s = np.concatenate([self._s, samples]) if self._s.size else samples
        self._fb = np.concatenate([self._fb, fbank]) if self._fb.size else fbank
        return self._advance(False)

    def close(self) -> list[list[int]]:
        """Ends the clip: the last chunks run and an open segment closes."""
        if self._closed:
            return []
        self._closed = True
        return self._advance(True)

    def _advance(self, final: bool) -> list[list[int]]:
        cfg, fe = self.cfg, self.cfg.frontend
        total = num_fbank_frames(self.n_samples, fe)
        step, right = FsmnVad.CHUNK_FRAMES, self._chunks.keep
        while self._net < total:
            a = self._net
            if not final and total < a + step + right:
                break  # the chunk's last rows still wait for their right context
            count = min(step, total - a)
            rows = _lfr_rows(self._fb, a, count, total, fe.lfr_m, base=self._fb_base)
            probs = self.vad.silence_probs(rows, self._cache, cfg)
            dbs = frame_decibels(self._s, a, count, self._s_base, fe)
            self._chunks.push(_silence_column(probs, cfg.sil_pdf_ids), dbs)
            self._net = a + count
            keep_fb = max(self._net - (fe.lfr_m - 1) // 2, 0) - self._fb_base  # the next rows' left context
            if keep_fb > 0:
                self._fb, self._fb_base = self._fb[keep_fb:], self._fb_base + keep_fb
            keep_s = self._net * fe.shift_samples - self._s_base
            if keep_s > 0:
                self._s, self._s_base = self._s[keep_s:], self._s_base + keep_s
        return self._chunks.run(self.n_samples, final)


class VadStream:
    """FunASR 1.4.16's streaming VAD: ``AutoModel.generate(input=chunk, cache=cache, is_final=...,
    chunk_size=chunk_ms)`` called once per :meth:`feed`. Incoming audio is cut into ``chunk_ms`` pieces
    (a remainder waits for the next call); each piece goes through the streaming frontend (frames are
    emitted once their LFR right context has arrived), the network with carried caches, the dynamic
    schedule (``chunk_ms`` per piece crossed in speech) and the detector. Returns FunASR's events."""

    def __init__(self, vad: FsmnVad, chunk_ms: int = 60, cfg: VadConfig | None = None,
                 schedule: str = "offline") -> None:
        self.vad = vad
        self.cfg = cfg or vad.cfg
        if chunk_ms <= 0:
            raise ValueError(f"chunk_ms must be > 0, got {chunk_ms}")
        if schedule not in ("offline", "server"):
            raise ValueError(f"schedule must be 'offline' (AutoModel.generate) or 'server' (realtime server), "
                             f"got {schedule!r}")
        self.chunk_ms = chunk_ms
        self.schedule = schedule
        self.reset()

    def reset(self) -> None:
        import kaldi_native_fbank as knf

        fe = self.cfg.frontend
        self._stride = int(self.chunk_ms * fe.fs / 1000)
        self._pending = np.zeros(0, np.float32)  # samples not yet cut into a chunk
        self._fbank = knf.OnlineFbank(_fbank_opts(fe))
        self._samples = np.zeros(0, np.float32)  # waveform from absolute sample self._sample_base on
        self._sample_base = 0
        self._n_samples = 0  # samples given to the frontend
        self._fb = np.zeros((0, fe.n_mels), np.float32)  # fbank frames from self._fb_base on
        self._fb_base = 0
        self._emitted = 0  # VAD frames emitted
        self._cache = self.vad.new_cache()
        self._det = _new_detector(self.cfg)
        self._sched = _Schedule(self.cfg, self.chunk_ms) if self.schedule == "offline" else _ServerSchedule(self.cfg)
        self.frame_probs: list[np.ndarray] = []  # per piece, for tests/diagnostics (silence column)

    @property
    def frames(self) -> int:
        return self._emitted

    def _frontend(self, piece: np.ndarray, final: bool) -> tuple[np.ndarray, np.ndarray]:
        fe = self.cfg.frontend
        if piece.size:
            self._fbank.accept_waveform(fe.fs, piece * np.float32(32768))
            self._samples = np.concatenate([self._samples, piece])
            self._n_samples += piece.size
        total = num_fbank_frames(self._n_samples, fe)
        have = self._fb_base + self._fb.shape[0]
        if total > have:
            new = np.stack([self._fbank.get_frame(i) for i in range(have, total)]).astype(np.float32, copy=False)
            self._fbank.pop(total - have)  # knf keeps every frame otherwise
            self._fb = np.concatenate([self._fb, new]) if self._fb.size else new
        right = (fe.lfr_m - 1) - (fe.lfr_m - 1) // 2
        upto = total if final else max(total - right, 0)
        count = upto - self._emitted
        if count <= 0:
            return np.zeros((0, fe.n_mels * fe.lfr_m), np.float32), np.zeros(0, np.float32)
        feats = _lfr_rows(self._fb, self._emitted, count, total, fe.lfr_m, base=self._fb_base)
        dbs = frame_decibels(self._samples, self._emitted, count, self._sample_base, fe)
        self._emitted = upto
        # drop what no later frame needs
        left = (fe.lfr_m - 1) // 2
        keep_fb = max(min(self._emitted - left, total - 1), 0) - self._fb_base
        if keep_fb > 0:
            self._fb = self._fb[keep_fb:]
            self._fb_base += keep_fb
        keep_s = self._emitted * fe.shift_samples - self._sample_base
        if keep_s > 0:
            self._samples = self._samples[keep_s:]
            self._sample_base += keep_s
        return feats, dbs

    def feed(self, samples: np.ndarray, is_final: bool = False) -> list[list[int]]:
        """Next audio (16 kHz float in [-1, 1]); ``is_final`` on the last call flushes and closes the stream
        (the object is reset afterwards, like FunASR's cache)."""
        audio = np.concatenate([self._pending, np.asarray(samples, dtype=np.float32).reshape(-1)])
        stride = self._stride
        n = audio.size // stride + int(is_final)
        events: list[list[int]] = []
        for i in range(n):
            final = is_final and i == n - 1
            piece = audio[i * stride: (i + 1) * stride]
            self._sched.before_chunk(self._det, piece.size)
            feats, dbs = self._frontend(piece, final)
            if feats.shape[0] == 0:
                continue
            probs = self.vad.silence_probs(feats, self._cache, self.cfg)
            self.frame_probs.append(probs)
            ev = self._det.accept(probs, dbs, is_final=final, streaming=True)
            events.extend(ev)
            self._sched.after_chunk(ev)
        if is_final:
            self.reset()
        else:
            self._pending = audio[n * stride:].copy()
        return events


class FsmnVad:
    """An FSMN-VAD model: the network (native ggml by default, or the numpy reference), CMVN and config.

    :meth:`load` takes an ``fsmn_vad`` GGUF (``fun-asr-convert``) or a FunASR folder (``model.pt``,
    ``config.yaml``, ``am.mvn``); :meth:`from_dir` builds the numpy reference from a folder."""

    CHUNK_FRAMES = 6000  # frames per network call for a whole clip (60 s; caches carry across calls)

    def __init__(self, weights: FsmnWeights | None, shift: np.ndarray | None, scale: np.ndarray | None,
                 cfg: VadConfig, native: Any = None) -> None:
        self.weights = weights
        self.native = native  # fun_asr._core.VadModel: CMVN + network in ggml
        self.cfg = cfg
        if native is None and weights is None:
            raise ValueError("FsmnVad needs the native network or numpy weights")
        in_dim = native.info()["input_dim"] if native is not None else weights.in1[0].shape[1]
        self.shift = None if shift is None else np.asarray(shift, np.float32)
        self.scale = None if scale is None else np.asarray(scale, np.float32)
        if native is None and (self.shift is None or self.scale is None
                               or self.shift.shape != (in_dim,) or self.scale.shape != (in_dim,)):
            raise ValueError(f"CMVN must have {in_dim} values per vector (the network's input width)")
        if cfg.frontend.n_mels * cfg.frontend.lfr_m != in_dim:
            raise ValueError(f"frontend gives {cfg.frontend.n_mels}x{cfg.frontend.lfr_m} values per frame; "
                             f"the network takes {in_dim}")

    @classmethod
    def from_dir(cls, path: str | Path, **overrides: Any) -> FsmnVad:
        """The numpy reference network of a FunASR folder (tests; :meth:`load` is the fast path)."""
        from fun_asr.torch_pickle import load_state_dict

        path = Path(path)
        cfg = VadConfig.from_yaml(path / "config.yaml", **overrides)
        shift, scale = read_am_mvn(path / "am.mvn")
        return cls(FsmnWeights.from_state_dict(load_state_dict(path / "model.pt")), shift, scale, cfg)

    @classmethod
    def load(cls, path: str | Path, threads: int = 1, **overrides: Any) -> FsmnVad:
        """The native network of an ``fsmn_vad`` GGUF or a FunASR VAD folder."""
        from fun_asr.converter.vad import load_native

        native, conf = load_native(path, threads=threads)
        return cls(None, None, None, VadConfig.from_dict(conf, **overrides), native=native)

    @property
    def threads(self) -> int:
        return self.native.threads if self.native is not None else 1

    def new_cache(self) -> np.ndarray:
        """Zero FSMN caches float32[n_layers, lorder-1, proj] (no history)."""
        if self.native is not None:
            i = self.native.info()
            return np.zeros((i["n_layers"], i["lorder"] - 1, i["proj_dim"]), np.float32)
        return np.stack(self.weights.new_cache())

    def silence_probs(self, raw_feats: np.ndarray, cache: np.ndarray, cfg: VadConfig | None = None) -> np.ndarray:
        """Silence probability per frame of LFR features before CMVN [T, in_dim]; ``cache`` carries."""
        cfg = cfg or self.cfg
        if raw_feats.shape[0] == 0:
            return np.zeros(0, np.float64)
        if self.native is not None and len(cfg.sil_pdf_ids) == 1:
            return self.native.forward(np.ascontiguousarray(raw_feats, np.float32), cache,
                                       int(cfg.sil_pdf_ids[0])).astype(np.float64)
        return _silence_column(self.probs(raw_feats, cache), cfg.sil_pdf_ids)

    def probs(self, raw_feats: np.ndarray, cache: np.ndarray) -> np.ndarray:
        """Every class's probability [T, n_classes] of LFR features before CMVN; ``cache`` carries."""
        if self.native is not None:
            return self.native.forward(np.ascontiguousarray(raw_feats, np.float32), cache, -1)
        feats = (raw_feats + self.shift) * self.scale
        return vad_network_numpy(self.weights, feats, cache)

    def features(self, samples: np.ndarray) -> np.ndarray:
        """CMVN'd LFR features (numpy reference path)."""
        if self.shift is None:
            raise ValueError("features() needs the CMVN vectors (a model from from_dir)")
        return vad_features(samples, self.shift, self.scale, self.cfg.frontend)

    def frame_probs(self, samples: np.ndarray, fbank: np.ndarray | None = None) -> np.ndarray:
        """Softmax outputs float32[T, n_classes] of a whole clip (``fbank``: its frames, if computed)."""
        fe = self.cfg.frontend
        fb = _fbank(np.asarray(samples, np.float32).reshape(-1), fe) if fbank is None else fbank
        T = fb.shape[0]
        cache = self.new_cache()
        parts = [self.probs(_lfr_rows(fb, a, min(self.CHUNK_FRAMES, T - a), T, fe.lfr_m), cache)
                 for a in range(0, T, self.CHUNK_FRAMES)]
        return np.concatenate(parts) if parts else np.zeros((0, 0), np.float32)

    def clip_silence_probs(self, fb: np.ndarray, cfg: VadConfig | None = None) -> np.ndarray:
        """Silence probability of every frame of a clip from its fbank frames, in CHUNK_FRAMES calls."""
        cfg = cfg or self.cfg
        T = fb.shape[0]
        cache = self.new_cache()
        parts = [self.silence_probs(_lfr_rows(fb, a, min(self.CHUNK_FRAMES, T - a), T, cfg.frontend.lfr_m), cache,
                                    cfg) for a in range(0, T, self.CHUNK_FRAMES)]
        return np.concatenate(parts) if parts else np.zeros(0, np.float64)

    def segments(self, samples: np.ndarray, cfg: VadConfig | None = None, fbank: np.ndarray | None = None,
                 **overrides: Any) -> list[list[int]]:
        """``[[start_ms, end_ms], ...]`` of a whole clip, as FunASR 1.4.16's offline AutoModel.
        ``fbank``: the clip's Kaldi fbank frames when already computed (the ASR frontend shares them)."""
        cfg = cfg or self.cfg
        if overrides:
            cfg = dataclasses.replace(cfg, **overrides)
        samples = np.asarray(samples, dtype=np.float32).reshape(-1)
        fb = _fbank(samples, cfg.frontend) if fbank is None else fbank
        if fb.shape[0] != num_fbank_frames(samples.size, cfg.frontend):
            raise ValueError(f"fbank has {fb.shape[0]} frames; {samples.size} samples make "
                             f"{num_fbank_frames(samples.size, cfg.frontend)}")
        offline = OfflineVad(self, cfg)
        return offline.feed(samples, fb) + offline.close()

    def offline(self, cfg: VadConfig | None = None, **overrides: Any) -> OfflineVad:
        """:meth:`segments` for audio that arrives in pieces (a long file read block by block)."""
        cfg = cfg or self.cfg
        if overrides:
            cfg = dataclasses.replace(cfg, **overrides)
        return OfflineVad(self, cfg)

    def stream(self, chunk_ms: int = 60, cfg: VadConfig | None = None, schedule: str = "offline",
               **overrides: Any) -> VadStream:
        """Streaming VAD: ``schedule="offline"`` as ``AutoModel.generate(cache=..., chunk_size=60)``,
        ``"server"`` as FunASR's realtime server (``DynamicStreamingVAD``)."""
        cfg = cfg or self.cfg
        if overrides:
            cfg = dataclasses.replace(cfg, **overrides)
        return VadStream(self, chunk_ms, cfg, schedule)
