"""Warning categories and codes, so that callers (and tests) can filter exactly what they expect.

Every warning fun-asr records is a :class:`Notice` in the result it is about (``Transcription.warnings``:
the message as a ``str``, with a stable ``code``), so nothing depends on warnings being shown. Per-recording
events are also issued as ``FunAsrWarning`` subclasses; conditions of the whole Session (``no_vad``,
``word_timestamps_unavailable``) are logged once per Session (logger ``fun_asr``) instead of once per result.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from fun_asr.errors import Message

# Every code a Notice can carry (docs/python.md, warnings).
CODES = {
    "input_truncated": "the file holds less audio than its header promises",
    "too_short": "the audio is shorter than one 25 ms analysis frame",
    "truncated": "a segment hit max_new_tokens: its text may be cut",
    "repetition": "the repetition guard stopped a segment caught in an n-gram loop",
    "no_vad": "no FSMN-VAD: long audio was cut at pauses, and silence or noise may produce text",
    "word_timestamps_unavailable": "word timestamps were asked for but the model has no CTC head",
    "word_timestamps_failed": "a segment's forced alignment failed: it has segment-level times only",
    "error": "the recording could not be read or transcribed",
    "language_unknown": "the language is not one of the model's: it reached the prompt as written (as FunASR)",
}


class Notice(str):
    """A warning message (the string itself: the Python API's words) with its code (one of :data:`CODES`) and,
    where it names options or settings, ``detail``: the :class:`fun_asr.errors.Message` that says it in another
    front end's words (:func:`fun_asr.errors.render`)."""

    code: str
    detail: Message | None

    def __new__(cls, code: str, message: str | Message) -> Notice:
        if code not in CODES:
            raise ValueError(f"unknown notice code {code!r}: accepted {', '.join(CODES)}")
        detail = None if isinstance(message, str) else message
        self = super().__new__(cls, message if detail is None else detail.render())
        self.code, self.detail = code, detail
        return self

    def __reduce__(self) -> tuple[type, tuple[str, str | Message]]:  # pickling (Ray) keeps the code and detail
        return (Notice, (self.code, str(self) if self.detail is None else self.detail))


class FunAsrWarning(UserWarning):
    """Base class of fun-asr's warnings."""


class InputWarning(FunAsrWarning):
    """Something about the audio: a truncated file, audio too short to hear."""


class TruncatedOutputWarning(FunAsrWarning):
    """A segment hit max_new_tokens: its text may be cut."""


class RepetitionWarning(FunAsrWarning):
    """The repetition guard stopped a segment caught in an n-gram loop."""


class TimestampWarning(FunAsrWarning):
    """A segment's word timestamps could not be computed (its subtitle falls back to one segment cue)."""


class RecordingFailedWarning(FunAsrWarning):
    """transcribe_batch: one recording failed (its result carries ``error``); the others went on."""


__all__ = ["CODES", "FunAsrWarning", "InputWarning", "Notice", "RecordingFailedWarning", "RepetitionWarning",
           "TimestampWarning", "TruncatedOutputWarning"]
