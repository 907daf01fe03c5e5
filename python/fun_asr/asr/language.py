"""Languages: the model spec's codes and names, and a guess from the script of a text."""

from __future__ import annotations

from typing import Any


def normalize_language(spec: dict[str, Any], language: str | None) -> str | None:
    """A language name of the model spec (code, English name or native name) -> its code; None,
    "" and "auto" -> None (automatic). ValueError naming the accepted names otherwise."""
    if language is None or language == "" or str(language).lower() == "auto":
        return None
    if not isinstance(language, str):
        raise TypeError(f"language must be a string, got {type(language).__name__}")
    key = language.strip().lower()
    for code, entry in spec["languages"].items():
        if key == code or key in [n.lower() for n in entry["names"]]:
            return code
    accepted = []
    for code, entry in spec["languages"].items():
        accepted.append(f"{code} ({', '.join(n for n in entry['names'] if n != code)})")
    raise ValueError(f"unsupported language {language!r}: accepted {'; '.join(accepted)}; or no language for "
                     "automatic")


def guess_language(text: str) -> str | None:
    """The language a transcript's script suggests: kana -> ja, hangul -> ko, other CJK -> zh,
    Latin letters -> en; None for text without letters."""
    kana = hangul = han = latin = 0
    for ch in text:
        o = ord(ch)
        if 0x3040 <= o <= 0x30FF or 0x31F0 <= o <= 0x31FF:
            kana += 1
        elif 0xAC00 <= o <= 0xD7AF or 0x1100 <= o <= 0x11FF:
            hangul += 1
        elif 0x4E00 <= o <= 0x9FFF or 0x3400 <= o <= 0x4DBF:
            han += 1
        elif ch.isascii() and ch.isalpha():
            latin += 1
    if kana:
        return "ja"
    if hangul:
        return "ko"
    if han:
        return "zh"
    return "en" if latin else None


def _is_cjk(ch: str) -> bool:
    o = ord(ch)
    return (0x3000 <= o <= 0x9FFF) or (0xF900 <= o <= 0xFAFF) or (0xFF00 <= o <= 0xFFEF) or (0xAC00 <= o <= 0xD7AF)
