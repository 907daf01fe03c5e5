"""Transcription options, checked once per call: :class:`TranscribeOptions` and the checks of each option."""

from __future__ import annotations

import dataclasses
import json
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, TypedDict

import numpy as np

from fun_asr.asr.prompt import check_hotword, split_hotwords
from fun_asr.audio.decode import Limits
from fun_asr.speakers.diarize import SpeakerOptions
from fun_asr.vad.config import VadConfig

MAX_SILENCE_MS = 600_000  # an end silence longer than 10 minutes is a mistake, not a setting


@dataclass(frozen=True)
class VadOptions:
    """FunASR 1.4.16's per-call FSMN-VAD options, as ``AutoModel.generate(**kwargs)`` hands them to
    ``FsmnVADStreaming.inference`` (``funasr/models/fsmn_vad_streaming/model.py``); None = the VAD's own.

    - ``silence_schedule``: the dynamic end-silence table ``((accumulated_speech_ms, silence_ms), ...)``:
      before each offline chunk (60 s) the first row whose limit is >= the speech accumulated so far sets
      the end silence (``max(silence_ms - speech_to_sil_time_thres, 0)``) and ``speech_noise_thres`` 0.5;
      no matching row keeps the previous values. Default ``DEFAULT_SILENCE_SCHEDULE``.
    - ``dynamic_silence``: the schedule on or off. FunASR's default: on unless ``max_end_silence_time``
      is given (``kwargs.get("dynamic_silence", kwargs.get("max_end_silence_time") is None)``); off, the
      end silence is fixed (``max_end_silence_time``, else the config's 800 ms) with the config's
      ``speech_noise_thres`` (0.6).
    - ``max_end_silence_time``: a fixed end silence in ms (turns the schedule off unless
      ``dynamic_silence=True``, when the schedule overrides it before every chunk).
    """

    silence_schedule: tuple[tuple[float, int], ...] | None = None
    dynamic_silence: bool | None = None
    max_end_silence_time: int | None = None

    @property
    def given(self) -> bool:
        return any(v is not None for v in dataclasses.astuple(self))

    def apply(self, cfg: VadConfig) -> VadConfig:
        """``cfg`` with these options (the ones given) in place."""
        kw: dict[str, Any] = {}
        if self.silence_schedule is not None:
            kw["silence_schedule"] = self.silence_schedule
        if self.dynamic_silence is not None:
            kw["dynamic_silence"] = self.dynamic_silence
        if self.max_end_silence_time is not None:
            kw["max_end_silence_ms"] = self.max_end_silence_time
        return dataclasses.replace(cfg, **kw) if kw else cfg

    def kwargs(self) -> dict[str, Any]:
        """The options given, as ``Session.transcribe``/``transcribe_batch`` keyword arguments."""
        return {k: v for k, v in dataclasses.asdict(self).items() if v is not None}

    def to_dict(self) -> dict[str, Any]:
        """The options given, JSON-ready (an infinite schedule limit is the string ``"inf"``)."""
        out = self.kwargs()
        if self.silence_schedule is not None:
            out["silence_schedule"] = [["inf" if math.isinf(a) else (int(a) if a == int(a) else a), b]
                                       for a, b in self.silence_schedule]
        return out


@dataclass(frozen=True)
class TranscribeOptions:
    language: str | None = None
    itn: bool = True
    hotwords: tuple[str, ...] = ()
    max_new_tokens: int = 512
    segment_seconds: float = 30.0
    repetition_guard: bool = True
    ignore_eos: bool = False  # benchmarks only: always generate max_new_tokens
    vad: bool = False  # segment with the Session's FSMN-VAD (else cut at pauses)
    word_timestamps: bool = False  # CTC forced alignment (checkpoints with the CTC head only)
    no_vad: bool = False  # the VAD would have run but the Session has none: results carry the no_vad warning
    vad_options: VadOptions = VadOptions()  # FunASR's per-call VAD kwargs (silence_schedule, dynamic_silence, ...)
    diarize: bool = False  # speaker labels (CAM++ + FunASR's clustering): Segment.speaker
    speakers: SpeakerOptions = SpeakerOptions()  # num_speakers / min_speakers / max_speakers / speaker_clustering

    def vad_config(self, base: VadConfig) -> VadConfig:
        """The VAD config this call runs with: the forced cut at ``segment_seconds`` (FunASR's
        ``max_single_segment_time``), then the per-call :class:`VadOptions`."""
        cfg = dataclasses.replace(base, max_single_segment_ms=int(round(self.segment_seconds * 1000)))
        return self.vad_options.apply(cfg)


class OptionArgs(TypedDict, total=False):
    """The transcription options as keyword arguments: those of :meth:`fun_asr.Session.options` (which checks
    them and documents each), taken as they are by ``Session.transcribe`` and ``Session.transcribe_batch``."""

    language: str | None
    itn: bool
    hotwords: list[str] | str | None
    max_new_tokens: int
    segment_seconds: float
    repetition_guard: bool
    ignore_eos: bool
    vad: bool | None
    word_timestamps: bool
    silence_schedule: Any
    dynamic_silence: bool | None
    max_end_silence_time: int | None
    diarize: bool
    num_speakers: int | None
    min_speakers: int | None
    max_speakers: int | None
    speaker_clustering: str | None


def check_option_names(given: dict[str, Any], where: str) -> None:
    """TypeError naming an unknown keyword argument of ``where`` and the options accepted."""
    unknown = sorted(set(given) - set(OptionArgs.__annotations__))
    if unknown:
        raise TypeError(f"{where}() got an unexpected keyword argument {unknown[0]!r}; the transcription options "
                        f"are {', '.join(OptionArgs.__annotations__)}")


def check_batch_size(batch_size: object) -> None:
    if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
        raise ValueError(f"batch_size must be a positive integer, got {batch_size!r}")


def check_draft(draft: Any, what: str, vocab: int) -> list[int]:
    """A draft as a list of token ids, each in [0, vocab) (checked before anything is decoded)."""
    if isinstance(draft, str | bytes) or not hasattr(draft, "__iter__"):
        raise TypeError(f"{what} must be a list of token ids (ints), got {type(draft).__name__}")
    ids = list(draft)
    if not all(isinstance(t, int | np.integer) and not isinstance(t, bool) for t in ids):
        raise TypeError(f"{what} must be a list of token ids (ints)")
    bad = [int(t) for t in ids if not 0 <= t < vocab]
    if bad:
        raise ValueError(f"{what}: token id {bad[0]} is outside the vocabulary [0, {vocab})")
    return [int(t) for t in ids]


def check_hotwords(hotwords: list[str] | tuple[str, ...] | str | None, limits: Limits) -> tuple[str, ...]:
    """Hotwords as a tuple of stripped words (one string is split at commas and line breaks); TypeError or
    ValueError naming what is wrong (a type, a control character, too many, too long)."""
    if isinstance(hotwords, str):
        hotwords = split_hotwords(hotwords)
    elif hotwords is not None and not isinstance(hotwords, list | tuple):
        raise TypeError(f"hotwords must be a list of strings or one comma-separated string, got "
                        f"{type(hotwords).__name__}")
    if hotwords is not None and not all(isinstance(h, str) for h in hotwords):
        raise TypeError("hotwords must be strings")
    words = tuple(h.strip() for h in (hotwords or []) if h and h.strip())
    for h in words:
        check_hotword(h)
    if len(words) > limits.max_hotwords:
        raise ValueError(f"{len(words)} hotwords; at most {limits.max_hotwords} are accepted "
                         "(Session(limits=Limits(max_hotwords=...)))")
    long = [h for h in words if len(h) > limits.max_hotword_chars]
    if long:
        raise ValueError(f"hotword {long[0][:20]!r}... has {len(long[0])} characters; at most "
                         f"{limits.max_hotword_chars} are accepted")
    return words


def check_lengths(max_new_tokens: int, segment_seconds: float, max_segment_seconds: float, limits: Limits) -> None:
    """``max_new_tokens`` a positive integer within the limits, ``segment_seconds`` a number within the encoder's
    position table."""
    if isinstance(max_new_tokens, bool) or not isinstance(max_new_tokens, int) or max_new_tokens < 1:
        raise ValueError(f"max_new_tokens must be a positive integer, got {max_new_tokens!r}")
    if isinstance(segment_seconds, bool) or not isinstance(segment_seconds, int | float):
        raise TypeError(f"segment_seconds must be a number, got {type(segment_seconds).__name__}")
    if not 1.0 <= segment_seconds <= max_segment_seconds:
        raise ValueError(f"segment_seconds must be between 1 and {max_segment_seconds:.2f} "
                         f"(the encoder's position table), got {segment_seconds}")
    if max_new_tokens > limits.max_new_tokens:
        raise ValueError(f"max_new_tokens must be at most {limits.max_new_tokens}, got {max_new_tokens}")


def _schedule_rows(value: object) -> tuple[tuple[float, int], ...]:
    if isinstance(value, str | bytes) or not isinstance(value, Sequence):
        raise TypeError(f"silence_schedule must be a list of (accumulated_speech_ms, silence_ms) pairs, e.g. "
                        f"[(10000, 2000), (float('inf'), 100)], got {type(value).__name__}")
    if not value:
        raise ValueError("silence_schedule is empty: give at least one (accumulated_speech_ms, silence_ms) pair")
    rows = []
    for i, row in enumerate(value):
        if isinstance(row, str | bytes) or not isinstance(row, Sequence) or len(row) != 2:
            raise TypeError(f"silence_schedule[{i}] must be a pair (accumulated_speech_ms, silence_ms), got "
                            f"{row!r:.60}")
        limit, silence = row
        if isinstance(limit, str) and limit.strip().lower() in ("inf", "infinity"):  # JSON has no infinity
            limit = math.inf
        if isinstance(limit, bool) or not isinstance(limit, int | float) or math.isnan(limit) or limit < 0:
            raise ValueError(f"silence_schedule[{i}]: accumulated_speech_ms must be a number >= 0 (inf for the last "
                             f"row), got {limit!r}")
        if (isinstance(silence, bool) or not isinstance(silence, int | float) or not math.isfinite(silence)
                or silence != int(silence)):
            raise ValueError(f"silence_schedule[{i}]: silence_ms must be a whole number of milliseconds, got "
                             f"{silence!r}")
        if not 0 <= silence <= MAX_SILENCE_MS:
            raise ValueError(f"silence_schedule[{i}]: silence_ms must be between 0 and {MAX_SILENCE_MS}, got {silence}")
        if rows and not limit > rows[-1][0]:
            raise ValueError(f"silence_schedule[{i}]: the limits must increase (FunASR takes the first row whose limit "
                             f"is >= the accumulated speech, so this row could never apply): {rows[-1][0]:g} then "
                             f"{limit:g}")
        rows.append((float(limit), int(silence)))
    return tuple(rows)


def parse_silence_schedule(text: str) -> tuple[tuple[float, int], ...]:
    """A schedule written on a command line: ``"10000:2000,20000:1000,inf:100"`` (accumulated speech ms :
    end silence ms, comma-separated) or JSON ``[[10000, 2000], ..., ["inf", 100]]``; ValueError naming the
    problem otherwise."""
    text = text.strip()
    if text.startswith("["):
        try:
            rows = json.loads(text)
        except json.JSONDecodeError as exc:
            raise ValueError(f"silence schedule {text!r:.60}: not JSON ({exc.msg})") from None
        if not isinstance(rows, list):
            raise ValueError(f"silence schedule {text!r:.60}: expected a JSON list of [ms, silence_ms] pairs")
    else:
        rows = []
        for part in text.split(","):
            a, sep, b = part.strip().partition(":")
            if not sep:
                raise ValueError(f"silence schedule entry {part.strip()!r}: write accumulated_speech_ms:silence_ms, "
                                 "e.g. 10000:2000,inf:100")
            try:
                rows.append((float(a), float(b)))
            except ValueError:
                raise ValueError(f"silence schedule entry {part.strip()!r}: both sides must be numbers (inf for the "
                                 "last limit)") from None
    try:
        return _schedule_rows(rows)
    except TypeError as exc:
        raise ValueError(str(exc)) from None


def check_vad_options(silence_schedule: object = None, dynamic_silence: object = None,
                      max_end_silence_time: object = None) -> VadOptions:
    """FunASR's per-call VAD kwargs checked (TypeError/ValueError naming the option and what is accepted).
    ``silence_schedule`` with the schedule off (``dynamic_silence=False``, or ``max_end_silence_time``
    without ``dynamic_silence=True``) would be ignored by FunASR: refused here instead."""
    schedule = None
    if silence_schedule is not None:
        schedule = (parse_silence_schedule(silence_schedule) if isinstance(silence_schedule, str)
                    else _schedule_rows(silence_schedule))
    if dynamic_silence is not None and not isinstance(dynamic_silence, bool):
        raise TypeError(f"dynamic_silence must be True, False or None (FunASR's default: on unless "
                        f"max_end_silence_time is given), got {dynamic_silence!r}")
    if max_end_silence_time is not None:
        v = max_end_silence_time
        if isinstance(v, bool) or not isinstance(v, int) or not 0 <= v <= MAX_SILENCE_MS:
            raise ValueError(f"max_end_silence_time must be a whole number of milliseconds between 0 and "
                             f"{MAX_SILENCE_MS}, got {v!r}")
    dynamic = dynamic_silence if dynamic_silence is not None else max_end_silence_time is None
    if schedule is not None and not dynamic:
        why = "dynamic_silence=False" if dynamic_silence is False else "max_end_silence_time turns it off"
        raise ValueError(f"silence_schedule is only used by the dynamic end-silence schedule, which is off here "
                         f"({why}); pass dynamic_silence=True to use the schedule, or leave silence_schedule out")
    return VadOptions(schedule, dynamic_silence, max_end_silence_time)
