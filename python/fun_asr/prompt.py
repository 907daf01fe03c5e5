"""FunASR's prompt (DESIGN §2.5), built from the prompt spec stored in every GGUF."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


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


def instruction(spec: PromptSpec, language_name: str | None, itn: bool, hotwords: list[str]) -> str:
    """FunASR get_prompt(): optional hotword context, the transcription request, ITN switch, colon."""
    text = ""
    if hotwords:
        text = spec.hotwords_prefix + spec.hotwords_separator.join(hotwords) + spec.hotwords_suffix
    text += spec.transcribe if language_name is None else spec.transcribe_to.replace("{language}", language_name)
    if not itn:
        text += spec.no_itn
    return text + spec.end


def prompt_text(spec: PromptSpec, language_name: str | None, itn: bool, hotwords: list[str]) -> tuple[str, str]:
    """The chat-formatted text before and after the audio rows."""
    full = spec.template.replace("{system}", spec.system).replace(
        "{instruction}", instruction(spec, language_name, itn, hotwords)
    )
    before, sep, after = full.partition(spec.audio_placeholder)
    if not sep:
        raise ValueError("prompt template has no audio placeholder")
    return before, after
