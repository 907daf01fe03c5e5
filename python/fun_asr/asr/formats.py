"""Output formats: txt, json, srt, vtt. With speaker labels (``diarize``): txt has one line per speaker turn
(``[SPK0] text``), srt cues start with ``[SPK0]``, vtt cues are voice spans (``<v SPK0>text``), json has each
segment's ``speaker`` and the speaker timeline. With ``mark_below`` the text formats write each word the recognizer
gave a probability below it as ``(word?)``."""

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


def _marked(word: str) -> str:
    """A low-confidence word as the text outputs mark it: ``(word?)``, white space in front kept."""
    body = word.lstrip()
    return f"{word[: len(word) - len(body)]}({body}?)" if body else word


def segment_text(s: Segment, mark_below: float | None = None) -> str:
    """The segment's text; with ``mark_below``, each word whose probability is below it written ``(word?)``
    (Segment.token_words; a segment without them, or whose words do not spell its text, unmarked)."""
    if mark_below is None or not s.token_words:
        return s.text
    if "".join(w["word"] for w in s.token_words).strip() != s.text:
        return s.text
    return "".join(_marked(w["word"]) if w["probability"] < mark_below else w["word"] for w in s.token_words).strip()


def _marked_transcript(t: Transcription, mark_below: float | None) -> str:
    """The transcript's text with each segment's text marked (the separators between them as they are)."""
    if mark_below is None:
        return t.text
    out, at = [], 0
    for s in t.segments:
        if not s.text:
            continue
        i = t.text.find(s.text, at)
        if i < 0:  # (never expected: the text joins the segments' texts)
            return t.text
        out += [t.text[at:i], segment_text(s, mark_below)]
        at = i + len(s.text)
    return "".join(out) + t.text[at:]


def to_txt(t: Transcription, mark_below: float | None = None) -> str:
    if t.speakers is None:
        return _marked_transcript(t, mark_below) + "\n"
    lines: list[tuple[str | None, list[str]]] = []  # consecutive segments of one speaker: one line
    for s in _cues(t):
        if lines and lines[-1][0] == s.speaker_label:
            lines[-1][1].append(segment_text(s, mark_below))
        else:
            lines.append((s.speaker_label, [segment_text(s, mark_below)]))
    return "".join(f"[{spk}] {' '.join(texts)}\n" if spk else f"{' '.join(texts)}\n" for spk, texts in lines) \
        or "\n"


def to_json(t: Transcription) -> str:
    return json.dumps(t.to_dict(), ensure_ascii=False, indent=2) + "\n"


def _cues(t: Transcription) -> list[Segment]:
    """Segments with text: an empty cue (silence, a too-short tail) is never written."""
    return [s for s in t.segments if s.text.strip()]


def _timed(t: Transcription, words: bool, mark_below: float | None = None
           ) -> list[tuple[float, float, str, str | None]]:
    """(start, end, text, speaker label) cues: segments, or with ``words`` each word (CTC token) that has text.
    A segment with text but no word times (its alignment failed, or none was computed) is one segment cue: a
    subtitle never loses text that the transcript has. ``mark_below``: low-confidence words as ``(word?)``."""
    def word_text(w: dict) -> str:
        low = mark_below is not None and w.get("probability") is not None and w["probability"] < mark_below
        return _marked(w["word"].strip()) if low else w["word"].strip()

    cues = []
    for s in _cues(t):
        spk = s.speaker_label
        timed = [(w["start"], w["end"], word_text(w), spk) for w in (s.words or []) if w["word"].strip()] \
            if words else []
        cues += timed or [(s.start, s.end, segment_text(s, mark_below), spk)]
    return cues


def to_srt(t: Transcription, words: bool = False, mark_below: float | None = None) -> str:
    blocks = []
    for i, (a, b, text, spk) in enumerate(_timed(t, words, mark_below), 1):
        blocks.append(f"{i}\n{_stamp(a, ',')} --> {_stamp(b, ',')}\n{f'[{spk}] ' if spk else ''}{text}\n")
    return "\n".join(blocks)


def _vtt_escape(text: str) -> str:
    """Text inside a vtt voice span: ``&``, ``<`` and ``>`` escaped (WebVTT cue text syntax)."""
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


def to_vtt(t: Transcription, words: bool = False, mark_below: float | None = None) -> str:
    lines = ["WEBVTT", ""]
    for a, b, text, spk in _timed(t, words, mark_below):
        lines += [f"{_stamp(a, '.')} --> {_stamp(b, '.')}", f"<v {spk}>{_vtt_escape(text)}" if spk else text, ""]
    return "\n".join(lines)


def render(t: Transcription, fmt: str, words: bool = False, mark_below: float | None = None) -> str:
    """``words``: srt/vtt with one cue per word (CTC token) when the transcription has word times.
    ``mark_below``: in txt/srt/vtt, each word whose probability is below it written ``(word?)`` (json has the
    probabilities themselves)."""
    if mark_below is not None and not 0.0 <= mark_below <= 1.0:
        raise ValueError(f"mark_below must be a probability from 0 to 1, got {mark_below!r}")
    if fmt in ("srt", "vtt"):
        return (to_srt if fmt == "srt" else to_vtt)(t, words, mark_below)
    if fmt == "txt":
        return to_txt(t, mark_below)
    if fmt == "json":
        return to_json(t)
    raise ValueError(f"unknown format {fmt!r}: accepted {', '.join(FORMATS)}")
