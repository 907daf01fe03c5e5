"""Output formats: txt, json, srt, vtt. With speaker labels (``diarize``): txt has one line per speaker turn
(``[SPK0] text``), srt cues start with ``[SPK0]``, vtt cues are voice spans (``<v SPK0>text``), json has each
segment's ``speaker`` and the speaker timeline."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from fun_asr.asr.session import Segment, Transcription

FORMATS = ("txt", "json", "srt", "vtt")
JSON_SCHEMA_VERSION = 1


def _stamp(seconds: float, sep: str) -> str:
    ms = int(round(seconds * 1000))
    h, rem = divmod(ms, 3_600_000)
    m, rem = divmod(rem, 60_000)
    s, ms = divmod(rem, 1000)
    return f"{h:02d}:{m:02d}:{s:02d}{sep}{ms:03d}"


def to_txt(t: Transcription) -> str:
    if t.speakers is None:
        return t.text + "\n"
    lines: list[tuple[str | None, list[str]]] = []  # consecutive segments of one speaker: one line
    for s in _cues(t):
        if lines and lines[-1][0] == s.speaker_label:
            lines[-1][1].append(s.text)
        else:
            lines.append((s.speaker_label, [s.text]))
    return "".join(f"[{spk}] {' '.join(texts)}\n" if spk else f"{' '.join(texts)}\n" for spk, texts in lines) \
        or "\n"


def to_json(t: Transcription) -> str:
    return json.dumps(t.to_dict(), ensure_ascii=False, indent=2) + "\n"


def _cues(t: Transcription) -> list[Segment]:
    """Segments with text: an empty cue (silence, a too-short tail) is never written."""
    return [s for s in t.segments if s.text.strip()]


def _timed(t: Transcription, words: bool) -> list[tuple[float, float, str, str | None]]:
    """(start, end, text, speaker label) cues: segments, or with ``words`` each word (CTC token) that has text.
    A segment with text but no word times (its alignment failed, or none was computed) is one segment cue: a
    subtitle never loses text that the transcript has."""
    cues = []
    for s in _cues(t):
        spk = s.speaker_label
        timed = [(w["start"], w["end"], w["word"].strip(), spk) for w in (s.words or []) if w["word"].strip()] \
            if words else []
        cues += timed or [(s.start, s.end, s.text, spk)]
    return cues


def to_srt(t: Transcription, words: bool = False) -> str:
    blocks = []
    for i, (a, b, text, spk) in enumerate(_timed(t, words), 1):
        blocks.append(f"{i}\n{_stamp(a, ',')} --> {_stamp(b, ',')}\n{f'[{spk}] ' if spk else ''}{text}\n")
    return "\n".join(blocks)


def _vtt_escape(text: str) -> str:
    """Text inside a vtt voice span: ``&``, ``<`` and ``>`` escaped (WebVTT cue text syntax)."""
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


def to_vtt(t: Transcription, words: bool = False) -> str:
    lines = ["WEBVTT", ""]
    for a, b, text, spk in _timed(t, words):
        lines += [f"{_stamp(a, '.')} --> {_stamp(b, '.')}", f"<v {spk}>{_vtt_escape(text)}" if spk else text, ""]
    return "\n".join(lines)


def render(t: Transcription, fmt: str, words: bool = False) -> str:
    """``words``: srt/vtt with one cue per word (CTC token) when the transcription has word times."""
    if fmt in ("srt", "vtt"):
        return (to_srt if fmt == "srt" else to_vtt)(t, words)
    try:
        return {"txt": to_txt, "json": to_json}[fmt](t)
    except KeyError:
        raise ValueError(f"unknown format {fmt!r}: accepted {', '.join(FORMATS)}") from None
