"""The checks of the transcription options that take more than a type (hotwords, lengths, FunASR's per-call VAD
options) and :class:`VadOptions`; :mod:`fun_asr.asr.option_table` declares each option with its check."""

from __future__ import annotations

import dataclasses
import json
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from fun_asr.asr.prompt import check_hotword, split_hotwords
from fun_asr.audio.decode import Limits
from fun_asr.errors import OptionError, OptionTypeError
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
        raise OptionError("limit.hotwords", "{p[hotwords]}{count} hotwords; at most {most} are accepted"
                          "{l[max_hotwords]}", option="hotwords", limit="max_hotwords", count=len(words),
                          most=limits.max_hotwords)
    long = [h for h in words if len(h) > limits.max_hotword_chars]
    if long:
        raise OptionError("limit.hotword_chars", "{p[hotwords]}hotword {start!r}... has {chars} characters; at most "
                          "{most} are accepted", option="hotwords", limit="max_hotword_chars", start=long[0][:20],
                          chars=len(long[0]), most=limits.max_hotword_chars)
    return words


def check_lengths(max_new_tokens: int, segment_seconds: float, max_segment_seconds: float, limits: Limits) -> None:
    """``max_new_tokens`` a positive integer within the limits, ``segment_seconds`` a number within the encoder's
    position table."""
    if isinstance(max_new_tokens, bool) or not isinstance(max_new_tokens, int) or max_new_tokens < 1:
        raise OptionError("option.range", "{o[max_new_tokens]} must be a positive integer, got {value!r}",
                          option="max_new_tokens", value=max_new_tokens)
    if isinstance(segment_seconds, bool) or not isinstance(segment_seconds, int | float):
        raise OptionTypeError("option.type", "{o[segment_seconds]} must be a number, got {kind}",
                              option="segment_seconds", kind=type(segment_seconds).__name__)
    if not 1.0 <= segment_seconds <= max_segment_seconds:
        raise OptionError("option.range", "{o[segment_seconds]} must be between 1 and {most:.2f} (the encoder's "
                          "position table), got {value}", option="segment_seconds", most=max_segment_seconds,
                          value=segment_seconds)
    if max_new_tokens > limits.max_new_tokens:
        raise OptionError("limit.max_new_tokens", "{o[max_new_tokens]} must be at most {most}, got {value}",
                          option="max_new_tokens", limit="max_new_tokens", most=limits.max_new_tokens,
                          value=max_new_tokens)


def _schedule_rows(value: object) -> tuple[tuple[float, int], ...]:
    if isinstance(value, str | bytes) or not isinstance(value, Sequence):
        raise OptionTypeError("option.type", "{o[silence_schedule]} must be a list of (accumulated_speech_ms, "
                              "silence_ms) pairs, e.g. [(10000, 2000), (float('inf'), 100)], got {kind}",
                              option="silence_schedule", kind=type(value).__name__)
    if not value:
        raise OptionError("option.value", "{o[silence_schedule]} is empty: give at least one (accumulated_speech_ms, "
                          "silence_ms) pair", option="silence_schedule")
    rows = []
    for i, row in enumerate(value):
        if isinstance(row, str | bytes) or not isinstance(row, Sequence) or len(row) != 2:
            raise OptionTypeError("option.type", "{o[silence_schedule]}[{i}] must be a pair (accumulated_speech_ms, "
                                  "silence_ms), got {row!r:.60}", option="silence_schedule", i=i, row=row)
        limit, silence = row
        if isinstance(limit, str) and limit.strip().lower() in ("inf", "infinity"):  # JSON has no infinity
            limit = math.inf
        if isinstance(limit, bool) or not isinstance(limit, int | float) or math.isnan(limit) or limit < 0:
            raise _row_error(i, "accumulated_speech_ms must be a number >= 0 (inf for the last row), got {bound!r}",
                             bound=limit)
        if (isinstance(silence, bool) or not isinstance(silence, int | float) or not math.isfinite(silence)
                or silence != int(silence)):
            raise _row_error(i, "silence_ms must be a whole number of milliseconds, got {silence!r}", silence=silence)
        if not 0 <= silence <= MAX_SILENCE_MS:
            raise _row_error(i, "silence_ms must be between 0 and {most}, got {silence}", most=MAX_SILENCE_MS,
                             silence=silence)
        if rows and not limit > rows[-1][0]:
            raise _row_error(i, "the limits must increase (FunASR takes the first row whose limit is >= the "
                             "accumulated speech, so this row could never apply): {prev:g} then {bound:g}",
                             prev=rows[-1][0], bound=limit)
        rows.append((float(limit), int(silence)))
    return tuple(rows)


def _row_error(i: int, said: str, **values: Any) -> OptionError:
    """Row ``i`` of a silence schedule is wrong: ``said`` (a template of :mod:`fun_asr.errors`) says how."""
    return OptionError("option.value", "{o[silence_schedule]}[{i}]: " + said, option="silence_schedule", i=i,
                       **values)


def parse_silence_schedule(text: str) -> tuple[tuple[float, int], ...]:
    """A schedule written on a command line: ``"10000:2000,20000:1000,inf:100"`` (accumulated speech ms :
    end silence ms, comma-separated) or JSON ``[[10000, 2000], ..., ["inf", 100]]``; ValueError naming the
    problem otherwise."""
    text = text.strip()
    if text.startswith("["):
        try:
            rows = json.loads(text)
        except json.JSONDecodeError as exc:
            raise OptionError("option.value", "silence schedule {text!r:.60}: not JSON ({why})",
                              option="silence_schedule", text=text, why=exc.msg) from None
        if not isinstance(rows, list):
            raise OptionError("option.value", "silence schedule {text!r:.60}: expected a JSON list of [ms, "
                              "silence_ms] pairs", option="silence_schedule", text=text)
    else:
        rows = []
        for part in text.split(","):
            a, sep, b = part.strip().partition(":")
            if not sep:
                raise OptionError("option.value", "silence schedule entry {entry!r}: write "
                                  "accumulated_speech_ms:silence_ms, e.g. 10000:2000,inf:100",
                                  option="silence_schedule", entry=part.strip())
            try:
                rows.append((float(a), float(b)))
            except ValueError:
                raise OptionError("option.value", "silence schedule entry {entry!r}: both sides must be numbers "
                                  "(inf for the last limit)", option="silence_schedule", entry=part.strip()) from None
    try:
        return _schedule_rows(rows)
    except OptionTypeError as exc:  # (a command line's text: a ValueError)
        raise OptionError(exc.code, exc.message.template, option=exc.option, **exc.values) from None


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
        raise OptionTypeError("option.type", "{o[dynamic_silence]} must be True, False or None (FunASR's default: "
                              "on unless {o[max_end_silence_time]} is given), got {value!r}",
                              option="dynamic_silence", value=dynamic_silence)
    if max_end_silence_time is not None:
        v = max_end_silence_time
        if isinstance(v, bool) or not isinstance(v, int) or not 0 <= v <= MAX_SILENCE_MS:
            raise OptionError("option.range", "{o[max_end_silence_time]} must be a whole number of milliseconds "
                              "between 0 and {most}, got {value!r}", option="max_end_silence_time",
                              most=MAX_SILENCE_MS, value=v)
    dynamic = dynamic_silence if dynamic_silence is not None else max_end_silence_time is None
    if schedule is not None and not dynamic:
        why = "{o[dynamic_silence=False]}" if dynamic_silence is False else "{o[max_end_silence_time]} turns it off"
        raise OptionError("option.needs", "{o[silence_schedule]} is only used by the dynamic end-silence schedule, "
                          f"which is off here ({why}); pass {{o[dynamic_silence=True]}} to use the schedule, or leave "
                          "{o[silence_schedule]} out", option="silence_schedule")
    return VadOptions(schedule, dynamic_silence, max_end_silence_time)
