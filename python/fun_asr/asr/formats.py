"""Output formats: txt, json, srt, vtt. With speaker labels (``diarize``): txt has one line per speaker turn
(``[SPK0] text``), srt cues start with ``[SPK0]``, vtt cues are voice spans (``<v SPK0>text``), json has each
segment's ``speaker`` and the speaker timeline. With ``mark_below`` the text formats write each word the recognizer
gave a probability below it as ``(word?)``. With ``max_line_width`` (and ``max_line_count``) srt/vtt cues are
wrapped into lines of at most that many characters (at spaces; text without spaces at characters) and a cue
with more lines than ``max_line_count`` is split into several, timed by the segment's word times where it has
them, else by its time shared out in proportion to the characters."""

from __future__ import annotations

import json
import re
from typing import TYPE_CHECKING, Any

from fun_asr.asr.option_table import OUTPUT_OPTIONS, check_lines

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


# text written without spaces between words: CJK ideographs, kana, hangul, full-width forms
_CJK = "\u2e80-\u9fff\uac00-\ud7af\uf900-\ufaff\uff00-\uffef"
_UNIT = re.compile(rf"\s*(?:[{_CJK}]|[^\s{_CJK}]+)")
# CJK punctuation never starts a line: it stays with the character before it
_CJK_PUNCT = re.compile("[\u3000-\u303f\uff01-\uff0f\uff1a-\uff20\uff3b-\uff40\uff5b-\uff65]+")


def _units(text: str) -> list[str]:
    """``text`` cut where a line may break: words (with the white space before them), single CJK characters."""
    units: list[str] = []
    for u in _UNIT.findall(text):
        if units and _CJK_PUNCT.fullmatch(u):
            units[-1] += u
        else:
            units.append(u)
    return units


def _joined(units: list[str]) -> str:
    return "".join(units).strip()


def wrap_lines(text: str, width: int) -> list[str]:
    """``text`` as lines of at most ``width`` characters, broken at spaces (text without spaces at characters);
    a word longer than ``width`` is a line of its own."""
    return [_joined(line) for line in _wrap(_units(text), width)]


def _wrap(units: list[str], width: int) -> list[list[str]]:
    lines: list[list[str]] = []
    for u in units:
        if lines and len(_joined([*lines[-1], u])) <= width:
            lines[-1].append(u)
        else:
            lines.append([u])
    return lines


def _char_times(s: Segment, text: str) -> list[tuple[float, float]] | None:
    """The (start, end) of each non-space character of ``text``, from the word times of ``s`` (None when it has
    none, or its words do not spell ``text``)."""
    words = [w for w in (s.words or []) if w.get("start") is not None]
    if not words or "".join("".join(w["word"].split()) for w in words) != "".join(text.split()):
        return None
    return [(float(w["start"]), float(w["end"])) for w in words for _ in "".join(w["word"].split())]


def _line_cues(s: Segment, text: str, width: int, count: int | None) -> list[tuple[float, float, str]]:
    """A segment's cue as cues of at most ``count`` lines of at most ``width`` characters."""
    lines = _wrap(_units(text), width)
    count = count or len(lines)
    times = _char_times(s, text)
    total = sum(len("".join(u.split())) for u in _units(text)) or 1
    cues, at = [], 0
    for k in range(0, len(lines), count):
        group = lines[k:k + count]
        n = sum(len("".join(u.split())) for line in group for u in line)
        if times is not None and n:
            a, b = times[at][0], times[at + n - 1][1]
        else:  # the segment's time shared out in proportion to the characters
            a = s.start + (s.end - s.start) * at / total
            b = s.end if k + count >= len(lines) else s.start + (s.end - s.start) * (at + n) / total
        cues.append((a, b, "\n".join(_joined(line) for line in group)))
        at += n
    return cues


def _lined(t: Transcription, mark_below: float | None, width: int, count: int | None
           ) -> list[tuple[float, float, str, str | None]]:
    """(start, end, text, speaker label) cues of at most ``count`` lines of at most ``width`` characters each."""
    return [(a, b, text, s.speaker_label) for s in _cues(t)
            for a, b, text in _line_cues(s, segment_text(s, mark_below), width, count)]


def line_options(t: Transcription, max_line_width: Any = None, max_line_count: Any = None
                 ) -> tuple[int | None, int | None]:
    """The subtitle line options: those given, else those the transcription was made with
    (``Transcription.options``); checked (ValueError naming the option)."""
    given = {k: v for k, v in zip(OUTPUT_OPTIONS, (max_line_width, max_line_count), strict=True) if v is not None}
    lines = check_lines({**{k: t.options.get(k) for k in OUTPUT_OPTIONS}, **given})
    return lines.get("max_line_width"), lines.get("max_line_count")


def _subtitle_cues(t: Transcription, words: bool, mark_below: float | None, max_line_width: Any,
                   max_line_count: Any) -> list[tuple[float, float, str, str | None]]:
    width, count = line_options(t, max_line_width, max_line_count)
    return _timed(t, words, mark_below) if width is None else _lined(t, mark_below, width, count)


def subtitle_cues(t: Transcription, words: bool = False, mark_below: float | None = None, *,
                  max_line_width: int | None = None, max_line_count: int | None = None) -> list[dict[str, Any]]:
    """The srt/vtt cues as data: ``{"start", "end", "text"}`` (seconds; a cue's lines joined by ``"\\n"``), and
    ``speaker`` (its label) where the transcription has speakers; the options as :func:`to_srt` takes them."""
    return [{"start": round(a, 3), "end": round(b, 3), "text": text, **({"speaker": spk} if spk else {})}
            for a, b, text, spk in _subtitle_cues(t, words, mark_below, max_line_width, max_line_count)]


def to_srt(t: Transcription, words: bool = False, mark_below: float | None = None, *,
           max_line_width: int | None = None, max_line_count: int | None = None) -> str:
    """SubRip subtitles: one cue per segment (``words``: per word), or with ``max_line_width`` cues of lines of
    at most that many characters, at most ``max_line_count`` lines each (None: the result's options)."""
    blocks = []
    cues = _subtitle_cues(t, words, mark_below, max_line_width, max_line_count)
    for i, (a, b, text, spk) in enumerate(cues, 1):
        blocks.append(f"{i}\n{_stamp(a, ',')} --> {_stamp(b, ',')}\n{f'[{spk}] ' if spk else ''}{text}\n")
    return "\n".join(blocks)


def _vtt_escape(text: str) -> str:
    """Text inside a vtt voice span: ``&``, ``<`` and ``>`` escaped (WebVTT cue text syntax)."""
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


def to_vtt(t: Transcription, words: bool = False, mark_below: float | None = None, *,
           max_line_width: int | None = None, max_line_count: int | None = None) -> str:
    """WebVTT subtitles, cut into cues as :func:`to_srt`."""
    lines = ["WEBVTT", ""]
    for a, b, text, spk in _subtitle_cues(t, words, mark_below, max_line_width, max_line_count):
        lines += [f"{_stamp(a, '.')} --> {_stamp(b, '.')}", f"<v {spk}>{_vtt_escape(text)}" if spk else text, ""]
    return "\n".join(lines)


def render(t: Transcription, fmt: str, words: bool = False, mark_below: float | None = None, *,
           max_line_width: int | None = None, max_line_count: int | None = None) -> str:
    """``words``: srt/vtt with one cue per word (CTC token) when the transcription has word times.
    ``mark_below``: in txt/srt/vtt, each word whose probability is below it written ``(word?)`` (json has the
    probabilities themselves). ``max_line_width``, ``max_line_count``: srt/vtt lines of at most that many
    characters, cues of at most that many lines (None: the transcription's options; see :func:`to_srt`)."""
    if mark_below is not None and not 0.0 <= mark_below <= 1.0:
        raise ValueError(f"mark_below must be a probability from 0 to 1, got {mark_below!r}")
    if fmt in ("srt", "vtt"):
        return (to_srt if fmt == "srt" else to_vtt)(t, words, mark_below, max_line_width=max_line_width,
                                                   max_line_count=max_line_count)
    if fmt == "txt":
        return to_txt(t, mark_below)
    if fmt == "json":
        return to_json(t)
    raise ValueError(f"unknown format {fmt!r}: accepted {', '.join(FORMATS)}")
