"""FunASR's offline HTTP service as typed models: the ``POST /asr`` request (:class:`AsrRequest`, its form
fields declared as FunASR's server declares them: :meth:`AsrRequest.as_form`) and its answer
(:class:`AsrResponse`)."""

from __future__ import annotations

from typing import Annotated

from fastapi import Form
from pydantic import BaseModel, ConfigDict


class AsrRequest(BaseModel):
    """``POST /asr``'s fields besides the file: FunASR's ``language``, ``hotwords`` (comma-separated), ``spk``,
    ``timestamp`` (word times; FunASR's default true), and FunASR's ``generate()`` VAD kwargs ``silence_schedule``
    (``"10000:2000,...,inf:100"`` or a JSON list of pairs), ``dynamic_silence``, ``max_end_silence_time``."""

    model_config = ConfigDict(frozen=True)

    language: str | None = None
    hotwords: str = ""
    spk: bool = False
    timestamp: bool = True
    silence_schedule: str | None = None
    dynamic_silence: str | None = None
    max_end_silence_time: str | None = None

    @classmethod
    def as_form(cls, language: Annotated[str | None, Form()] = None, hotwords: Annotated[str, Form()] = "",
                spk: Annotated[bool, Form()] = False, timestamp: Annotated[bool, Form()] = True,
                silence_schedule: Annotated[str | None, Form()] = None,
                dynamic_silence: Annotated[str | None, Form()] = None,
                max_end_silence_time: Annotated[str | None, Form()] = None) -> AsrRequest:
        """The request from its multipart form (a FastAPI dependency: a ``spk`` or ``timestamp`` that is not a
        boolean is FastAPI's 422, as FunASR's server answers it)."""
        return cls(language=language, hotwords=hotwords, spk=spk, timestamp=timestamp,
                   silence_schedule=silence_schedule, dynamic_silence=dynamic_silence,
                   max_end_silence_time=max_end_silence_time)


class AsrWord(BaseModel):
    """A word's times (s) as FunASR gives them, and the decoder's ``probability`` of it where there is one."""

    model_config = ConfigDict(extra="allow")

    word: str
    start: float
    end: float
    probability: float | None = None


class AsrSegment(BaseModel):
    """One segment: FunASR's ``text``, ``start``, ``end`` (s), ``words`` (timestamp=true on a model with a CTC head)
    and ``speaker`` (spk=true); fun-asr's confidence fields."""

    model_config = ConfigDict(extra="allow")

    text: str
    start: float
    end: float
    avg_logprob: float | None = None
    compression_ratio: float | None = None
    no_speech_prob: float | None = None
    words: list[AsrWord] | None = None
    speaker: str | None = None


class AsrResponse(BaseModel):
    """FunASR's ``/asr`` answer: the text, the segments, the audio's duration, the processing time and its
    real-time factor; fun-asr's notices (``warnings``, ``warning_codes``)."""

    model_config = ConfigDict(extra="allow")

    text: str
    segments: list[AsrSegment]
    duration: float
    processing_time: float
    rtf: float | int
    warnings: list[str]
    warning_codes: list[str]


__all__ = ["AsrRequest", "AsrResponse", "AsrSegment", "AsrWord"]
