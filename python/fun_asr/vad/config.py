"""FSMN-VAD settings: FunASR 1.4.16's ``model_conf`` (:class:`VadConfig`), the frontend's (:class:`VadFrontendConfig`)
and the end-silence schedules.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

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
    nullable = {f.name for f in dataclasses.fields(cls) if "None" in str(f.type)}  # `int | None` options
    out: dict[str, Any] = {}
    for k, v in values.items():
        if k not in defaults:
            continue
        d = defaults[k]
        if isinstance(d, bool) or isinstance(v, bool):
            ok = isinstance(v, bool) and isinstance(d, bool) or (isinstance(d, bool) and v in (0, 1))
        elif isinstance(d, int) or (d is None and k in nullable):
            ok = isinstance(v, int) or (v is None and k in nullable)  # FunASR's integer options never take null
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
    max_end_silence_time: int = 800  # ms; the end silence with the schedule off and no max_end_silence_ms
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
    # Fixed end silence (FunASR: generate(max_end_silence_time=...), which turns the dynamic schedule off
    # unless dynamic_silence=True); None = the config's max_end_silence_time when the schedule is off.
    max_end_silence_ms: int | None = None
    silence_schedule: tuple[tuple[float, int], ...] = DEFAULT_SILENCE_SCHEDULE  # generate(silence_schedule=...)
    # generate(dynamic_silence=...): the schedule on/off; None = FunASR's default, on unless
    # max_end_silence_ms (max_end_silence_time) is given.
    dynamic_silence: bool | None = None
    dynamic_speech_noise_thres: float = 0.5  # what 1.4.16's dynamic schedule sets speech_noise_thres to
    offline_chunk_ms: int = 60000  # FunASR's offline inference() chunk_size
    frontend: VadFrontendConfig = field(default_factory=VadFrontendConfig)

    @property
    def dynamic(self) -> bool:
        """The dynamic end-silence schedule is on (FunASR: ``kwargs.get("dynamic_silence",
        kwargs.get("max_end_silence_time") is None)``)."""
        return self.max_end_silence_ms is None if self.dynamic_silence is None else self.dynamic_silence

    @property
    def end_silence_ms(self) -> int:
        """The end silence a stream starts with (FunASR's ``init_cache``: ``max_end_silence_time`` given to
        generate, else the config's); the schedule, when on, replaces it before the first chunk."""
        return self.max_end_silence_time if self.max_end_silence_ms is None else self.max_end_silence_ms

    @property
    def segment_limit_ms(self) -> int:
        return self.max_single_segment_time if self.max_single_segment_ms is None else self.max_single_segment_ms

    @classmethod
    def from_dict(cls, conf: Mapping[str, Any], **overrides: Any) -> VadConfig:
        """From a parsed config.yaml (``model_conf`` and ``frontend_conf`` sections); unknown keys are ignored."""
        if not isinstance(conf, Mapping):
            raise ValueError(f"VAD config must be a mapping (config.yaml), got {type(conf).__name__}")
        kw = _typed_section(cls, conf, "model_conf", skip={"frontend", "dynamic_silence"})
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
        if self.dynamic_silence is not None and not isinstance(self.dynamic_silence, bool):
            raise ValueError(f"dynamic_silence must be True, False or None, got {self.dynamic_silence!r}")
        if not self.silence_schedule:
            raise ValueError("silence_schedule needs at least one (accumulated_speech_ms, silence_ms) row")
