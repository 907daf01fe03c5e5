"""Transcription options, checked once per call: :class:`TranscribeOptions` and the checks of each option."""

from __future__ import annotations

from dataclasses import dataclass


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
