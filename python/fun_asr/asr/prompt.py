"""FunASR's prompt (docs/model.md, Prompt), built from the prompt spec stored in every GGUF.

The prompt is kept as *runs* of text, each marked trusted (the spec's strings) or not (what a user gave:
hotwords, a language name), so that the tokenizer reads special tokens (``<|im_end|>``, ...) only from the
spec's strings and never from user text (:meth:`fun_asr.asr.tokenizer.TextTokenizer.encode_runs`).
"""

from __future__ import annotations

import re
import unicodedata
from dataclasses import dataclass
from typing import Any

from fun_asr.errors import OptionError

Run = tuple[str, bool]  # (text, trusted)


@dataclass(frozen=True)
class PromptSpec:
    system: str
    template: str
    hotwords_prefix: str
    hotwords_separator: str
    hotwords_suffix: str
    transcribe: str
    transcribe_to: str
    no_itn: str
    end: str
    audio_placeholder: str = "{audio}"
    fake_token_halvings: int = 3

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> PromptSpec:
        return cls(
            system=d["system"], template=d["template"], hotwords_prefix=d["hotwords_prefix"],
            hotwords_separator=d["hotwords_separator"], hotwords_suffix=d["hotwords_suffix"],
            transcribe=d["transcribe"], transcribe_to=d["transcribe_to"], no_itn=d["no_itn"], end=d["end"],
            audio_placeholder=d.get("audio_placeholder", "{audio}"),
            fake_token_halvings=int(d.get("fake_token_len", {}).get("halvings", 3)),
        )


def split_hotwords(text: str) -> list[str]:
    """Hotwords of one string: separated by commas (as FunASR's services split them) or line breaks (as in
    FunASR's hotword files), each stripped; empty ones dropped."""
    return [h.strip() for h in re.split(r"[,\r\n]", text) if h.strip()]


def check_hotword(word: str) -> None:
    """ValueError for a hotword holding a control character (a newline, a tab, NUL, ...): hotwords are words
    or phrases, and a line break inside one would end its line of the prompt."""
    for ch in word:
        if unicodedata.category(ch) == "Cc":
            raise OptionError("option.value", "{p[hotwords]}hotword {start!r} contains the control character "
                              "U+{char:04X}; hotwords are words or phrases (separate several with commas or line "
                              "breaks)", option="hotwords", start=word[:20], char=ord(ch))


def instruction_runs(spec: PromptSpec, language_name: str | None, itn: bool, hotwords: list[str]) -> list[Run]:
    """FunASR get_prompt(): optional hotword context, the transcription request, ITN switch, colon."""
    runs: list[Run] = []
    if hotwords:
        runs.append((spec.hotwords_prefix, True))
        for i, word in enumerate(hotwords):
            if i:
                runs.append((spec.hotwords_separator, True))
            runs.append((word, False))
        runs.append((spec.hotwords_suffix, True))
    if language_name is None:
        runs.append((spec.transcribe, True))
    else:
        head, sep, tail = spec.transcribe_to.partition("{language}")
        runs += [(head, True), (language_name, False), (tail, True)] if sep else [(spec.transcribe_to, True)]
    if not itn:
        runs.append((spec.no_itn, True))
    runs.append((spec.end, True))
    return runs


def instruction(spec: PromptSpec, language_name: str | None, itn: bool, hotwords: list[str]) -> str:
    return "".join(text for text, _ in instruction_runs(spec, language_name, itn, hotwords))


def prompt_runs(spec: PromptSpec, language_name: str | None, itn: bool,
                hotwords: list[str]) -> tuple[list[Run], list[Run]]:
    """The chat-formatted prompt before and after the audio rows, as runs of trusted and user text."""
    before: list[Run] = []
    after: list[Run] = []
    target = before
    found = False
    for piece in re.split(r"(\{system\}|\{instruction\}|" + re.escape(spec.audio_placeholder) + ")", spec.template):
        if piece == spec.audio_placeholder:
            if found:
                raise ValueError("prompt template has more than one audio placeholder")
            found, target = True, after
        elif piece == "{system}":
            target.append((spec.system, True))
        elif piece == "{instruction}":
            target += instruction_runs(spec, language_name, itn, hotwords)
        elif piece:
            target.append((piece, True))
    if not found:
        raise ValueError("prompt template has no audio placeholder")
    return before, after


def prompt_text(spec: PromptSpec, language_name: str | None, itn: bool, hotwords: list[str]) -> tuple[str, str]:
    """The chat-formatted text before and after the audio rows."""
    before, after = prompt_runs(spec, language_name, itn, hotwords)
    return "".join(t for t, _ in before), "".join(t for t, _ in after)
