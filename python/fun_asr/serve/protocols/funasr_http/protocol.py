"""FunASR's offline HTTP answer and request fields: the ``POST /asr`` response (:func:`asr_response`) and
FunASR's ``generate()`` VAD kwargs of a request, checked (:func:`vad_options`)."""

from __future__ import annotations

from typing import Any

from fun_asr.asr.options import check_vad_options, parse_silence_schedule
from fun_asr.asr.session import Transcription
from fun_asr.serve.core.context import segment_confidence, segment_words

ASR_PATH = "/asr"


def asr_response(result: Transcription, words: bool, seconds: float) -> dict[str, Any]:
    """FunASR's /asr answer: the text, each segment's text and times in seconds (with ``words``, FunASR's
    ``{"word", "start", "end"}`` list, when word timestamps were computed), the audio's duration, the
    processing time and its real-time factor; plus fun-asr's ``warnings`` and ``warning_codes`` and each
    segment's ``avg_logprob``, ``compression_ratio`` and ``no_speech_prob`` (keys FunASR's clients do not read:
    its converter to OpenAI's format copies named fields only)."""
    segments = []
    for s in result.segments:
        seg: dict[str, Any] = {"text": s.text, "start": round(s.start, 3), "end": round(s.end, 3),
                               **segment_confidence(s)}
        if words:
            seg["words"] = segment_words(s)
        if s.speaker is not None:  # spk=true: FunASR's server labels, "SPK0", "SPK1", ...
            seg["speaker"] = s.speaker_label
        segments.append(seg)
    duration = result.duration
    return {"text": result.text, "segments": segments, "duration": duration,
            "processing_time": round(seconds, 3), "rtf": round(seconds / duration, 4) if duration > 0 else 0,
            "warnings": [str(w) for w in result.warnings], "warning_codes": result.warning_codes}


def vad_options(session: Any, silence_schedule: str | None, dynamic_silence: bool | None,
                max_end_silence_time: int | None) -> tuple[tuple[str, Any], ...]:
    """FunASR's VAD kwargs of a request, checked (ValueError/TypeError naming the field) as the batcher takes
    them: (name, value) pairs of the given ones."""
    schedule = None if silence_schedule is None else parse_silence_schedule(silence_schedule)
    if schedule is None and dynamic_silence is None and max_end_silence_time is None:
        return ()
    if session.vad is None:
        raise ValueError("silence_schedule, dynamic_silence and max_end_silence_time set the FSMN-VAD, and this "
                         "server has none")
    return tuple(sorted(check_vad_options(schedule, dynamic_silence, max_end_silence_time).kwargs().items()))


__all__ = ["ASR_PATH", "asr_response", "vad_options"]
