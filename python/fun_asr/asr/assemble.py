"""A recording's result put together: its segments' text joined as the language writes it, the notices of the
recording and of the Session (each also raised as its Python warning), and the timings."""

from __future__ import annotations

import warnings
from typing import Any

from fun_asr.asr.cutting import CutItem
from fun_asr.asr.language import is_cjk
from fun_asr.asr.options import TranscribeOptions
from fun_asr.asr.results import Segment, Transcription
from fun_asr.audio.decode import SAMPLE_RATE
from fun_asr.errors import Message
from fun_asr.notices import (
    InputWarning,
    Notice,
    RecordingFailedWarning,
    RepetitionWarning,
    TimestampWarning,
    TruncatedOutputWarning,
)

_CATEGORY = {"input_truncated": InputWarning, "too_short": InputWarning, "truncated": TruncatedOutputWarning,
             "repetition": RepetitionWarning, "word_timestamps_failed": TimestampWarning}


def join_text(segments: list[Segment], language: str | None, spec: dict[str, Any]) -> str:
    """The segments' texts as one: joined as the spec says for ``language``; with no language (or one the spec
    does not list), no space between CJK characters and a space otherwise."""
    sep_for = {code: e.get("join", " ") for code, e in spec["languages"].items()}
    text = ""
    for s in segments:
        if not s.text:
            continue
        if text:
            if language in sep_for:  # a language the spec lacks (reached the prompt as written) joins as automatic
                sep = sep_for[language]
            else:
                sep = "" if is_cjk(text[-1]) and is_cjk(s.text[0]) else " "
            text += sep
        text += s.text
    return text


def assemble(item: CutItem, opts: TranscribeOptions, options: dict[str, Any], total_ms: float | None,
             spec: dict[str, Any], session_notes: list[Notice], warn: bool = True) -> Transcription:
    """The :class:`Transcription` of ``item``. Its own notices (truncated input, cut or stopped segments) are
    raised as warnings here (unless not ``warn``), pointing at the caller of ``Session.transcribe*``;
    ``session_notes`` (no VAD, no CTC head) are only recorded (logged once elsewhere)."""
    timings = item.timings
    if item.error is not None:
        if warn:
            warnings.warn(item.error, RecordingFailedWarning, stacklevel=5)
        return Transcription("", [], opts.language, 0.0, timings, dict(options), item.source,
                             [item.error if isinstance(item.error, Notice) else Notice("error", item.error)], False,
                             "error", item.error)
    notes: list[Notice] = [w if isinstance(w, Notice) else Notice("input_truncated", w) for w in item.warnings]
    for s in item.segments:
        if s.truncated:
            notes.append(Notice("truncated", Message(
                "{source}: segment {start:.2f}-{end:.2f} s hit {o[max_new_tokens]}={most}; its text may be cut "
                "(raise {o[max_new_tokens]})", source=item.source, start=s.start, end=s.end, most=opts.max_new_tokens)))
        if s.repetition:
            notes.append(Notice("repetition", f"{item.source}: segment {s.start:.2f}-{s.end:.2f} s was stopped "
                                "by the repetition guard"))
    for note in notes if warn else ():
        warnings.warn(note, _CATEGORY[note.code], stacklevel=5)
    notes += session_notes
    item.warnings = notes
    duration = len(item.samples) / SAMPLE_RATE
    n_tokens = sum(len(s.tokens) for s in item.segments)
    timings["total_ms"] = total_ms if total_ms is not None else sum(timings.values())
    timings["tokens"] = n_tokens
    timings["tokens_per_s"] = n_tokens / (timings["decode_ms"] / 1e3) if timings["decode_ms"] > 0 else 0.0
    timings["real_time_factor"] = timings["total_ms"] / 1e3 / duration if duration > 0 else 0.0
    timings.update(item.draft_stats)  # counts, not times: after the sums above
    return Transcription(join_text(item.segments, opts.language, spec), item.segments, opts.language, duration,
                         {k: round(v, 3) if isinstance(v, float) else v for k, v in timings.items()},
                         dict(options), item.source, list(item.warnings), item.input_truncated,
                         item.empty_reason, segmentation=item.segmentation, speakers=item.speaker_turns)
