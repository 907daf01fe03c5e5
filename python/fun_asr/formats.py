"""Output formats: txt, json, srt, vtt."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from fun_asr.session import Segment, Transcription

FORMATS = ("txt", "json", "srt", "vtt")
JSON_SCHEMA_VERSION = 1


def _stamp(seconds: float, sep: str) -> str:
    ms = int(round(seconds * 1000))
    h, rem = divmod(ms, 3_600_000)
    m, rem = divmod(rem, 60_000)
    s, ms = divmod(rem, 1000)
    return f"{h:02d}:{m:02d}:{s:02d}{sep}{ms:03d}"


def to_txt(t: Transcription) -> str:
    return t.text + "\n"


def to_json(t: Transcription) -> str:
    return json.dumps(t.to_dict(), ensure_ascii=False, indent=2) + "\n"


def _cues(t: Transcription) -> list[Segment]:
    """Segments with text: an empty cue (silence, a too-short tail) is never written."""
    return [s for s in t.segments if s.text.strip()]


def to_srt(t: Transcription) -> str:
    blocks = []
    for i, s in enumerate(_cues(t), 1):
        blocks.append(f"{i}\n{_stamp(s.start, ',')} --> {_stamp(s.end, ',')}\n{s.text}\n")
    return "\n".join(blocks)


def to_vtt(t: Transcription) -> str:
    lines = ["WEBVTT", ""]
    for s in _cues(t):
        lines += [f"{_stamp(s.start, '.')} --> {_stamp(s.end, '.')}", s.text, ""]
    return "\n".join(lines)


def render(t: Transcription, fmt: str) -> str:
    try:
        return {"txt": to_txt, "json": to_json, "srt": to_srt, "vtt": to_vtt}[fmt](t)
    except KeyError:
        raise ValueError(f"unknown format {fmt!r}: accepted {', '.join(FORMATS)}") from None
