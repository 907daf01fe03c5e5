"""The text of FunASR runtime's messages: the units the online pass commits (:class:`Online`: what two
consecutive partials agree on), the separators between sentences the clients concatenate, and the offline
pass's ``timestamp`` and ``stamp_sents`` from a decode's CTC token times (:func:`stamps`)."""

from __future__ import annotations

import bisect
import json
import re
from typing import Any

import numpy as np

from fun_asr.asr.ctc import funasr_text

# -- text: units, the online pass, separators -----------------------------------------------------------

_CJK = "\u2e80-\u9fff\uac00-\ud7af\uf900-\ufaff\uff00-\uffef"
_UNIT = re.compile(rf"\s*(?:[{_CJK}]|[^\s{_CJK}]+)")
_CJK_CHAR = re.compile(rf"[{_CJK}]")


def _units(text: str) -> list[str]:
    """Words (with the space before them) and single CJK characters: what the online pass commits."""
    return _UNIT.findall(text)


def separator(tail: str, text: str) -> str:
    """The space between two sentences when both sides are not CJK (the clients concatenate texts)."""
    if not tail or not text or tail.isspace() or text[0].isspace():
        return ""
    return "" if _CJK_CHAR.match(tail) or _CJK_CHAR.match(text[0]) else " "


class Online:
    """The online pass of one open sentence: partial decodes re-decode the whole sentence so far, and the
    clients append each message's text, so only what two consecutive partials agree on is sent (units,
    never retracted)."""

    def __init__(self) -> None:
        self.reset()

    def reset(self) -> None:
        self.sent: list[str] = []
        self.prev: list[str] | None = None
        self.start: int | None = None

    def partial(self, text: str, start: int) -> tuple[str, bool]:
        """(new text to send, whether it is the sentence's first)."""
        units = _units(text)
        self.start = start
        if self.prev is None:
            self.prev = units
            return "", False
        agreed: list[str] = []
        for a, b in zip(self.prev, units, strict=False):
            if a != b:
                break
            agreed.append(a)
        self.prev = units
        n = len(self.sent)
        if len(agreed) <= n or agreed[:n] != self.sent:
            return "", False
        self.sent = agreed
        return "".join(agreed[n:]), n == 0

    def final(self, text: str) -> tuple[str, bool]:
        """The rest of the closed sentence's text after what was sent (online mode: append-only)."""
        units = _units(text)
        n = len(self.sent)
        self.reset()
        return "".join(units[n:]), n == 0


# -- timestamps -----------------------------------------------------------------------------------------

_HTML5_SPLIT = set("。？，、?., ")  # html5 handleWithTimestamp splits the text at these (and ',')
_PIECE_END = _HTML5_SPLIT - {" "}  # they close a stamp_sents piece (funasr-runtime: ，。？、,? ; we add '.')
_LETTERS = re.compile(r"[A-Za-z]+")


def char_times(result: Any, tokenizer: Any) -> list[tuple[str, int, int]] | None:
    """(char, start_ms, end_ms) for every non-space character of a decode's text, from its CTC token times
    (relative to the decoded audio); None when there are none or they cannot be matched to the text."""
    out: list[tuple[str, int, int]] = []
    for seg in result.segments:
        if not seg.text.strip():
            continue
        words = seg.words or []
        if not words:
            return None
        for variant in (funasr_text(v) for v in (seg.text, " " + seg.text, seg.text + " ", " " + seg.text + " ")):
            ids = tokenizer.encode(variant)
            if len(ids) == len(words) and all(tokenizer.decode([i]) == w["word"] for i, w in zip(ids, words,
                                                                                                  strict=True)):
                break
        else:
            return None
        ends = np.cumsum([len(tokenizer.decoder.get(int(i), b"")) for i in ids]).tolist()  # byte end per token
        pos = 0
        for ch in variant:
            n = len(ch.encode("utf-8"))
            first = bisect.bisect_right(ends, pos)
            last = bisect.bisect_right(ends, pos + n - 1)
            pos += n
            if ch.isspace():
                continue
            if last >= len(words):
                return None
            out.append((ch, int(round(words[first]["start"] * 1000)), int(round(words[last]["end"] * 1000))))
    return out or None


def stamps(text: str, times: list[tuple[str, int, int]], offset_ms: int) -> dict[str, Any]:
    """``timestamp`` (a JSON string, one [start, end] per unit the html5 page counts: a word of ASCII letters,
    else each UTF-16 code unit of a word) and ``stamp_sents`` for ``text``, from per-character times; {}
    when the times do not fit the text."""
    chars = [c for c in text if not c.isspace()]
    if [c for c, _, _ in times] != chars or any(c.isspace() and c != " " for c in text):
        return {}  # (the page splits at plain spaces only)
    it = iter(times)
    pairs: list[list[int]] = []
    pieces: list[dict[str, Any]] = []
    seg_units: list[str] = []
    seg_ts: list[list[int]] = []
    word: list[tuple[str, int, int]] = []

    def flush_word() -> None:
        if not word:
            return
        w = "".join(c for c, _, _ in word)
        if _LETTERS.fullmatch(w):
            ts = [offset_ms + min(a for _, a, _ in word), offset_ms + max(b for _, _, b in word)]
            pairs.append(ts)
            seg_units.append(w)
            seg_ts.append(ts)
        else:
            for c, a, b in word:
                ts = [offset_ms + a, offset_ms + b]
                pairs.extend([ts] * (len(c.encode("utf-16-le")) // 2))
                seg_units.append(c)
                seg_ts.append(ts)
        word.clear()

    def close_piece(punc: str) -> None:
        if seg_ts:
            pieces.append({"text_seg": " ".join(seg_units), "punc": punc, "start": seg_ts[0][0],
                           "end": seg_ts[-1][1], "ts_list": [list(t) for t in seg_ts]})
        seg_units.clear()
        seg_ts.clear()

    for c in text:
        timed = None if c.isspace() else next(it)
        if c in _HTML5_SPLIT or c.isspace():
            flush_word()
            if c in _PIECE_END:
                close_piece(c)
        else:
            assert timed is not None
            word.append(timed)
    flush_word()
    close_piece("")
    if not pairs:
        return {}
    return {"timestamp": json.dumps(pairs, separators=(",", ":")), "stamp_sents": pieces}


__all__ = ["stamps"]
