"""OpenAI's transcription API as typed models: the ``POST /v1/audio/transcriptions`` request
(:class:`TranscriptionRequest`, read once from the multipart form by :meth:`TranscriptionRequest.from_form`), the
JSON answers (:class:`TranscriptionJson` for ``response_format=json``, :class:`VerboseTranscription` for
``verbose_json``) and ``GET /v1/models`` (:class:`ModelList`).

The answers' extra keys (fun-asr's notices, truncation flags, timings) are declared too; models allow further
keys, as OpenAI's SDK keeps them. The wire format is :mod:`fun_asr.serve.protocols.openai.protocol`'s."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field
from starlette.datastructures import FormData

from fun_asr.asr.prompt import split_hotwords
from fun_asr.serve.core.errors import ApiError, form_bool
from fun_asr.serve.protocols.openai.protocol import MODEL_ALIASES, RESPONSE_FORMATS, STREAM_FORMATS

ResponseFormat = Literal["json", "text", "srt", "vtt", "verbose_json"]


class _Open(BaseModel):
    model_config = ConfigDict(extra="allow")


# -- the request ----------------------------------------------------------------------------------------------


def _field(form: FormData, name: str) -> str | None:
    v = form.get(name)
    return v if isinstance(v, str) and v != "" else None


def _listed(form: FormData, name: str, accepted: tuple[str, ...]) -> list[str]:
    """A list field (``name[]`` or ``name``), every value one of ``accepted`` (else 400)."""
    values = [g for key in (f"{name}[]", name) for g in form.getlist(key) if isinstance(g, str)]
    bad = [g for g in values if g not in accepted]
    if bad:
        raise ApiError(400, f"unsupported {name} {bad[0]!r}: accepted {', '.join(accepted)}", name, "invalid_value")
    return values


def _temperature(form: FormData) -> float:
    temperature = _field(form, "temperature")
    if temperature is None:
        return 0.0
    try:
        temp = float(temperature)
    except ValueError:
        raise ApiError(400, f"temperature must be a number, got {temperature!r}", "temperature",
                       "invalid_value") from None
    if temp != 0.0:
        raise ApiError(400, "only temperature 0 is supported (greedy decoding, as FunASR)", "temperature",
                       "invalid_value")
    return temp


class TranscriptionRequest(BaseModel):
    """A ``/v1/audio/transcriptions`` request's fields (all but the file), as OpenAI's SDK sends them: ``model``,
    ``response_format``, ``stream``, ``temperature`` (only 0), ``language``, ``prompt`` (comma-separated
    hotwords), ``timestamp_granularities[]``, ``include[]``; fun-asr's extensions ``hotwords``, ``itn`` and
    FunASR's ``spk``."""

    model_config = ConfigDict(frozen=True)

    model: str | None = None
    response_format: ResponseFormat = "json"
    stream: bool = False
    temperature: float = 0.0
    language: str | None = None
    hotwords: tuple[str, ...] = ()  # hotwords, then prompt's, each split at commas and line breaks
    itn: bool = True
    spk: bool = False
    timestamp_granularities: tuple[Literal["word", "segment"], ...] = ()
    include: tuple[Literal["logprobs"], ...] = ()

    @classmethod
    def from_form(cls, form: FormData, model_id: str) -> TranscriptionRequest:
        """The request read from its multipart form, each field checked as it is read (an :class:`ApiError` 400
        naming the field: an unknown model or format, a stream of a format that has none, a temperature but 0,
        a boolean that is not one, a granularity or include that is not OpenAI's)."""
        model = _field(form, "model")
        if model is not None and model not in (model_id, *MODEL_ALIASES):
            raise ApiError(400, f"unknown model {model!r}: this server serves {model_id!r} (aliases: "
                                f"{', '.join(MODEL_ALIASES)})", "model", "model_not_found")
        fmt = _field(form, "response_format") or "json"
        if fmt not in RESPONSE_FORMATS:
            raise ApiError(400, f"unsupported response_format {fmt!r}: accepted {', '.join(RESPONSE_FORMATS)}",
                           "response_format", "invalid_value")
        stream = form_bool(_field(form, "stream"), "stream", False)
        if stream and fmt not in STREAM_FORMATS:
            raise ApiError(400, f"stream=true sends OpenAI's transcript.text events, which replace response_format "
                                f"{' or '.join(STREAM_FORMATS)}; got response_format {fmt!r} (send stream=false for "
                                "it)", "stream", "invalid_value")
        temperature = _temperature(form)
        spk = form_bool(_field(form, "spk"), "spk", False)
        hotwords = split_hotwords(_field(form, "hotwords") or "") + split_hotwords(_field(form, "prompt") or "")
        itn = form_bool(_field(form, "itn"), "itn", True)
        granularities = _listed(form, "timestamp_granularities", ("word", "segment"))
        include = _listed(form, "include", ("logprobs",))
        if include and not stream and fmt not in ("json", "verbose_json"):
            raise ApiError(400, f"include[]=logprobs comes with response_format json or verbose_json (or "
                                f"stream=true); got response_format {fmt!r}", "include", "invalid_value")
        return cls(model=model, response_format=fmt, stream=stream, temperature=temperature,
                   language=_field(form, "language"), hotwords=tuple(hotwords), itn=itn, spk=spk,
                   timestamp_granularities=tuple(granularities), include=tuple(include))

    @property
    def words(self) -> bool:
        """``timestamp_granularities[]=word``: word times."""
        return "word" in self.timestamp_granularities

    @property
    def logprobs(self) -> bool:
        """``include[]=logprobs``: each token's log-probability."""
        return bool(self.include)


# -- the answers ----------------------------------------------------------------------------------------------


class Logprob(_Open):
    """One token of ``include[]=logprobs``, as OpenAI's newer models return them."""

    token: str
    logprob: float
    bytes: list[int]


class Word(_Open):
    """A word's times (s), and the decoder's ``probability`` of it where there is one."""

    word: str
    start: float
    end: float
    probability: float | None = None


class TranscriptionJson(_Open):
    """``response_format=json``: OpenAI's ``{"text"}``, with fun-asr's truncation flags and notices (and
    ``logprobs`` with ``include[]=logprobs``)."""

    text: str
    truncated: bool
    input_truncated: bool
    warnings: list[str]
    warning_codes: list[str]
    logprobs: list[Logprob] | None = None


class VerboseSegment(_Open):
    """One segment of ``verbose_json``: OpenAI's fields, FunASR's ``words`` and fun-asr's extensions."""

    id: int
    seek: int
    start: float
    end: float
    text: str
    tokens: list[int]
    temperature: float
    avg_logprob: float | None = None
    compression_ratio: float | None = None
    no_speech_prob: float | None = None
    stop_reason: str | None = None
    truncated: bool
    repetition: bool
    words: list[Word]
    token_words: list[dict[str, Any]]
    speaker: str | None = None


class SpeakerTurn(_Open):
    start: float
    end: float
    speaker: str


class VerboseTranscription(_Open):
    """``response_format=verbose_json``: OpenAI's fields with each segment's confidence, word times and
    fun-asr's extensions (truncation flags, notices, segmentation, speakers, timings)."""

    task: Literal["transcribe"] = "transcribe"
    language: str
    duration: float
    text: str
    truncated: bool
    input_truncated: bool
    warnings: list[str]
    warning_codes: list[str]
    segmentation: str | None = None
    segments: list[VerboseSegment]
    num_speakers: int | None = None
    speakers: list[SpeakerTurn] | None = None
    timings: dict[str, float] = Field(default_factory=dict)
    words: list[Word] | None = None
    logprobs: list[Logprob] | None = None


class ModelEntry(_Open):
    """The served model as OpenAI's model object; the 20-word demo model adds ``demo`` and ``description``."""

    id: str
    object: Literal["model"] = "model"
    created: int
    owned_by: str
    demo: bool | None = None
    description: str | None = None


class ModelList(BaseModel):
    """``GET /v1/models``."""

    object: Literal["list"] = "list"
    data: list[ModelEntry]


__all__ = ["Logprob", "ModelEntry", "ModelList", "ResponseFormat", "SpeakerTurn", "TranscriptionJson",
           "TranscriptionRequest", "VerboseSegment", "VerboseTranscription", "Word"]
