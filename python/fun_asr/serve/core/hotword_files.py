"""FunASR's hotword files and postprocess hotwords, as its realtime server reads them: ``--hotword-file`` (one
hotword per line), ``--postprocess-hotword-file`` and the ``POSTPROCESS_HOTWORDS:`` command (``wrong=>right``
pairs: exact text replacements in each closed sentence)."""

from __future__ import annotations

import os
from pathlib import Path

_ARROWS = ("=>", "->", "→")  # FunASR's postprocess hotword separators, in the order it tries them


def read_hotword_file(path: str | os.PathLike[str]) -> list[str]:
    """FunASR's ``--hotword-file``: one hotword per line (each stripped; blank lines skipped; a comma is part
    of its hotword, as FunASR reads the file). UTF-8 (a byte-order mark is skipped)."""
    try:
        text = Path(path).read_text(encoding="utf-8-sig")
    except FileNotFoundError:
        raise ValueError(f"hotword file {str(path)!r} does not exist (FunASR's format: one hotword per line)") from None
    except UnicodeDecodeError as exc:
        raise ValueError(f"hotword file {str(path)!r} is not UTF-8 text ({exc.reason} at byte {exc.start})") from None
    return [line.strip() for line in text.splitlines() if line.strip()]


def _postprocess_line(line: str) -> tuple[str, str] | None:
    """One line of FunASR's postprocess hotwords: ``wrong=>right`` -> (wrong, right); a bare word -> (word,
    word) (FunASR's fuzzy target, which its realtime server does not match fuzzily); a blank line, a ``#``
    comment, or a pair with an empty side -> None."""
    s = line.strip()
    if not s or s.startswith("#"):
        return None
    for arrow in _ARROWS:
        if arrow in s:
            wrong, right = (x.strip() for x in s.split(arrow, 1))
            return (wrong, right) if wrong and right else None
    return s, s


def parse_postprocess_hotwords(payload: str) -> dict[str, str]:
    """The ``POSTPROCESS_HOTWORDS:`` command's text: pairs separated by commas or line breaks."""
    pairs = (_postprocess_line(line) for line in payload.replace(",", "\n").splitlines())
    return {w: r for w, r in (p for p in pairs if p is not None)}


def read_postprocess_hotword_file(path: str | os.PathLike[str]) -> dict[str, str]:
    """FunASR's ``--postprocess-hotword-file``: ``wrong=>right`` per line (a comma belongs to its line)."""
    try:
        text = Path(path).read_text(encoding="utf-8-sig")
    except FileNotFoundError:
        raise ValueError(f"postprocess hotword file {str(path)!r} does not exist (FunASR's format: one "
                         "'wrong=>right' pair per line)") from None
    except UnicodeDecodeError as exc:
        raise ValueError(f"postprocess hotword file {str(path)!r} is not UTF-8 text ({exc.reason} at byte "
                         f"{exc.start})") from None
    pairs = (_postprocess_line(line) for line in text.splitlines())
    return {w: r for w, r in (p for p in pairs if p is not None)}


def apply_postprocess_hotwords(text: str, pairs: dict[str, str]) -> str:
    """FunASR's exact replacements: longest ``wrong`` first, every occurrence, left to right, never inside
    a replacement just made."""
    for wrong in sorted(pairs, key=len, reverse=True):
        right, at = pairs[wrong], 0
        while (i := text.find(wrong, at)) >= 0:
            text = text[:i] + right + text[i + len(wrong):]
            at = i + len(right)
    return text


__all__ = ["apply_postprocess_hotwords", "parse_postprocess_hotwords", "read_hotword_file",
           "read_postprocess_hotword_file"]
