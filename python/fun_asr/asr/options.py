"""Transcription options, checked once per call: :class:`TranscribeOptions` and the checks of each option."""

from __future__ import annotations

from dataclasses import dataclass

from fun_asr.asr.prompt import check_hotword, split_hotwords
from fun_asr.audio.decode import Limits


@dataclass(frozen=True)
class TranscribeOptions:
    language: str | None = None
    itn: bool = True
    hotwords: tuple[str, ...] = ()
    max_new_tokens: int = 512
    segment_seconds: float = 30.0
    repetition_guard: bool = True
    ignore_eos: bool = False  # benchmarks only: always generate max_new_tokens
    vad: bool = False  # segment with the Session's FSMN-VAD (else cut at pauses)
    word_timestamps: bool = False  # CTC forced alignment (checkpoints with the CTC head only)
    no_vad: bool = False  # the VAD would have run but the Session has none: results carry the no_vad warning


def check_hotwords(hotwords: list[str] | tuple[str, ...] | str | None, limits: Limits) -> tuple[str, ...]:
    """Hotwords as a tuple of stripped words (one string is split at commas and line breaks); TypeError or
    ValueError naming what is wrong (a type, a control character, too many, too long)."""
    if isinstance(hotwords, str):
        hotwords = split_hotwords(hotwords)
    elif hotwords is not None and not isinstance(hotwords, list | tuple):
        raise TypeError(f"hotwords must be a list of strings or one comma-separated string, got "
                        f"{type(hotwords).__name__}")
    if hotwords is not None and not all(isinstance(h, str) for h in hotwords):
        raise TypeError("hotwords must be strings")
    words = tuple(h.strip() for h in (hotwords or []) if h and h.strip())
    for h in words:
        check_hotword(h)
    if len(words) > limits.max_hotwords:
        raise ValueError(f"{len(words)} hotwords; at most {limits.max_hotwords} are accepted "
                         "(Session(limits=Limits(max_hotwords=...)))")
    long = [h for h in words if len(h) > limits.max_hotword_chars]
    if long:
        raise ValueError(f"hotword {long[0][:20]!r}... has {len(long[0])} characters; at most "
                         f"{limits.max_hotword_chars} are accepted")
    return words


def check_lengths(max_new_tokens: int, segment_seconds: float, max_segment_seconds: float, limits: Limits) -> None:
    """``max_new_tokens`` a positive integer within the limits, ``segment_seconds`` a number within the encoder's
    position table."""
    if isinstance(max_new_tokens, bool) or not isinstance(max_new_tokens, int) or max_new_tokens < 1:
        raise ValueError(f"max_new_tokens must be a positive integer, got {max_new_tokens!r}")
    if isinstance(segment_seconds, bool) or not isinstance(segment_seconds, int | float):
        raise TypeError(f"segment_seconds must be a number, got {type(segment_seconds).__name__}")
    if not 1.0 <= segment_seconds <= max_segment_seconds:
        raise ValueError(f"segment_seconds must be between 1 and {max_segment_seconds:.2f} "
                         f"(the encoder's position table), got {segment_seconds}")
    if max_new_tokens > limits.max_new_tokens:
        raise ValueError(f"max_new_tokens must be at most {limits.max_new_tokens}, got {max_new_tokens}")
