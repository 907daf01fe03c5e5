"""Languages: the model spec's codes and names, FunASR's own aliases, the prompt's language string, and a guess
from the script of a text."""

from __future__ import annotations

import unicodedata
from typing import Any

from fun_asr.notices import Notice

# FunASR's own aliases (funasr/models/fun_asr_nano/inference_vllm.py, the engine behind its servers): a code,
# looked up lower-cased, becomes the prompt's language name. Any other string reaches FunASR's prompt
# ("语音转写成{language}") as it was sent; so it does here, with the notice ``language_unknown``.
FUNASR_PROMPT_ALIASES = {"zh": "中文", "en": "英文", "ja": "日文", "ko": "韩文"}
# Names for a code FunASR knows that this model's table may not have (verbose_json reports English names).
ENGLISH_NAMES = {"zh": "chinese", "en": "english", "ja": "japanese", "ko": "korean"}
MAX_LANGUAGE_CHARS = 64  # a language name is a word or two; longer input is refused, not cut


def accepted_languages(spec: dict[str, Any]) -> str:
    """The model's languages for a message: ``zh (chinese, mandarin, 中文); en (...)``."""
    return "; ".join(f"{code} ({', '.join(n for n in entry['names'] if n != code)})"
                     for code, entry in spec["languages"].items())


def normalize_language(spec: dict[str, Any], language: str | None) -> str | None:
    """The language a caller gave, as a transcription carries it: None, "", blanks and "auto" -> None
    (automatic); a name of the model spec (code, English or native name, any case) -> its code; one of
    FunASR's alias codes (zh, en, ja, ko) -> that code; any other string -> the string itself (stripped),
    which then reaches the prompt as written, as FunASR passes it (see :func:`language_prompt_name`; results
    carry the ``language_unknown`` notice). TypeError for a non-string; ValueError for a control character or
    more than :data:`MAX_LANGUAGE_CHARS` characters."""
    if language is None:
        return None
    if not isinstance(language, str):
        raise TypeError(f"language must be a string, got {type(language).__name__}")
    text = language.strip()
    if text == "" or text.lower() == "auto":
        return None
    for ch in text:
        if unicodedata.category(ch) == "Cc":
            raise ValueError(f"language {text[:20]!r} contains the control character U+{ord(ch):04X}; a language "
                             f"is a name such as {accepted_languages(spec)}")
    if len(text) > MAX_LANGUAGE_CHARS:
        raise ValueError(f"language {text[:20]!r}... has {len(text)} characters; at most {MAX_LANGUAGE_CHARS} are "
                         f"accepted (a name such as {accepted_languages(spec)})")
    key = text.lower()
    for code, entry in spec["languages"].items():
        if key == code or key in [n.lower() for n in entry["names"]]:
            return code
    if key in FUNASR_PROMPT_ALIASES:
        return key
    return text


def is_model_language(spec: dict[str, Any], language: str | None) -> bool:
    """Whether a normalized language is one of the model spec's (None, automatic, counts as one)."""
    return language is None or language in spec["languages"]


def language_prompt_name(spec: dict[str, Any], language: str | None) -> str | None:
    """The string the prompt says for a normalized language: the spec's ``prompt_name`` (中文, 英文, 日文, ...),
    else FunASR's alias (ko -> 韩文), else the language as the caller wrote it; None for automatic."""
    if language is None:
        return None
    entry = spec["languages"].get(language)
    if entry is not None:
        return str(entry["prompt_name"])
    return FUNASR_PROMPT_ALIASES.get(language.lower(), language)


def language_notice(spec: dict[str, Any], language: str | None) -> Notice | None:
    """The ``language_unknown`` notice for a normalized language the model spec does not list; None otherwise."""
    if is_model_language(spec, language):
        return None
    assert language is not None
    said = language_prompt_name(spec, language)
    return Notice("language_unknown",
                  f"language {language!r} is not one of this model's languages ({accepted_languages(spec)}): it "
                  f"reaches the prompt as {said!r}, as in FunASR; the model may ignore it or transcribe poorly")


def english_name(spec: dict[str, Any], language: str | None) -> str | None:
    """A normalized language's English name (zh -> chinese, sv -> swedish on the 31-language table); a
    language the spec does not list is returned as it is; None for None."""
    if language is None:
        return None
    if language in ENGLISH_NAMES:
        return ENGLISH_NAMES[language]
    entry = spec["languages"].get(language)
    if entry is not None:
        for name in entry["names"]:
            if name != language and name.isascii() and name.replace(" ", "").isalpha():
                return name
    return language


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


def is_cjk(ch: str) -> bool:
    o = ord(ch)
    return (0x3000 <= o <= 0x9FFF) or (0xF900 <= o <= 0xFAFF) or (0xFF00 <= o <= 0xFFEF) or (0xAC00 <= o <= 0xD7AF)
