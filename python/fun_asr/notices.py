"""Warning categories, so that callers (and tests) can filter exactly what they expect.

Every warning fun-asr issues is a ``FunAsrWarning``; each is also recorded in the result it is about
(``Transcription.warnings``), so nothing depends on warnings being shown.
"""

from __future__ import annotations


class FunAsrWarning(UserWarning):
    """Base class of fun-asr's warnings."""


class InputWarning(FunAsrWarning):
    """Something about the audio: a truncated file, audio too short to hear."""


class TruncatedOutputWarning(FunAsrWarning):
    """A segment hit max_new_tokens: its text may be cut."""


class RepetitionWarning(FunAsrWarning):
    """The repetition guard stopped a segment caught in an n-gram loop."""


class RecordingFailedWarning(FunAsrWarning):
    """transcribe_batch: one recording failed (its result carries ``error``); the others went on."""


__all__ = ["FunAsrWarning", "InputWarning", "RecordingFailedWarning", "RepetitionWarning", "TruncatedOutputWarning"]
