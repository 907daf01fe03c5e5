"""Transcription options, checked once per call: :class:`TranscribeOptions` and the checks of each option."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, TypedDict

import numpy as np

from fun_asr.asr.option_checks import (
    MAX_SILENCE_MS,
    VadOptions,
    check_hotwords,
    check_lengths,
    check_vad_options,
    parse_silence_schedule,
)
from fun_asr.asr.option_table import OPTIONS, OUTPUT_OPTIONS, unknown_option
from fun_asr.speakers.diarize import SpeakerOptions
from fun_asr.vad.config import VadConfig

__all__ = ["MAX_SILENCE_MS", "OptionArgs", "TranscribeOptions", "VadOptions", "check_batch_size", "check_draft",
           "check_hotwords", "check_lengths", "check_option_names", "check_vad_options", "parse_silence_schedule"]


@dataclass(frozen=True)
class TranscribeOptions:
    language: str | None = None
    itn: bool = True
    hotwords: tuple[str, ...] = ()
    max_new_tokens: int = OPTIONS["max_new_tokens"].default
    segment_seconds: float = OPTIONS["segment_seconds"].default
    repetition_guard: bool = True
    ignore_eos: bool = False  # benchmarks only: always generate max_new_tokens
    vad: bool = False  # segment with the Session's FSMN-VAD (else cut at pauses)
    word_timestamps: bool = False  # CTC forced alignment (checkpoints with the CTC head only)
    no_vad: bool = False  # the VAD would have run but the Session has none: results carry the no_vad warning
    vad_options: VadOptions = VadOptions()  # FunASR's per-call VAD kwargs (silence_schedule, dynamic_silence, ...)
    diarize: bool = False  # speaker labels (CAM++ + FunASR's clustering): Segment.speaker
    speakers: SpeakerOptions = SpeakerOptions()  # num_speakers / min_speakers / max_speakers / speaker_clustering
    max_line_width: int | None = None  # srt/vtt: characters per subtitle line (fun_asr.asr.formats.render)
    max_line_count: int | None = None  # srt/vtt: lines per cue

    def output_options(self) -> dict[str, Any]:
        """The srt/vtt options given (``max_line_width``, ``max_line_count``): what a result records."""
        return {k: getattr(self, k) for k in OUTPUT_OPTIONS if getattr(self, k) is not None}

    def vad_config(self, base: VadConfig) -> VadConfig:
        """The VAD config this call runs with: the forced cut at ``segment_seconds`` (FunASR's
        ``max_single_segment_time``), then the per-call :class:`VadOptions`."""
        cfg = dataclasses.replace(base, max_single_segment_ms=int(round(self.segment_seconds * 1000)))
        return self.vad_options.apply(cfg)


class OptionArgs(TypedDict, total=False):
    """The transcription options as keyword arguments: those of :meth:`fun_asr.Session.options` (which checks
    them and documents each), taken as they are by ``Session.transcribe`` and ``Session.transcribe_batch``."""

    language: str | None
    itn: bool
    hotwords: list[str] | str | None
    max_new_tokens: int
    segment_seconds: float
    repetition_guard: bool
    ignore_eos: bool
    vad: bool | None
    word_timestamps: bool
    silence_schedule: Any
    dynamic_silence: bool | None
    max_end_silence_time: int | None
    diarize: bool
    num_speakers: int | None
    min_speakers: int | None
    max_speakers: int | None
    speaker_clustering: str | None
    max_line_width: int | None
    max_line_count: int | None


def check_option_names(given: dict[str, Any], where: str) -> None:
    """TypeError naming an unknown keyword argument of ``where`` and the options accepted (:data:`OPTIONS`)."""
    unknown_option(given, where)


def check_batch_size(batch_size: object) -> None:
    if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
        raise ValueError(f"batch_size must be a positive integer, got {batch_size!r}")


def check_draft(draft: Any, what: str, vocab: int) -> list[int]:
    """A draft as a list of token ids, each in [0, vocab) (checked before anything is decoded)."""
    if isinstance(draft, str | bytes) or not hasattr(draft, "__iter__"):
        raise TypeError(f"{what} must be a list of token ids (ints), got {type(draft).__name__}")
    ids = list(draft)
    if not all(isinstance(t, int | np.integer) and not isinstance(t, bool) for t in ids):
        raise TypeError(f"{what} must be a list of token ids (ints)")
    bad = [int(t) for t in ids if not 0 <= t < vocab]
    if bad:
        raise ValueError(f"{what}: token id {bad[0]} is outside the vocabulary [0, {vocab})")
    return [int(t) for t in ids]
