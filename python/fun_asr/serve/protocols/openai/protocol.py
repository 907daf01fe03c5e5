"""OpenAI's transcription responses: the formats (json, text, srt, vtt, verbose_json: :func:`verbose_json`),
the streamed ``transcript.text.delta`` / ``transcript.text.done`` events (:func:`stream_events`) sent as
server-sent events (:func:`sse_response`), the served model as GET /v1/models lists it (:func:`model_entry`) and the
model names a request may give."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Callable, Sequence
from typing import Any

from fastapi.responses import StreamingResponse

from fun_asr.asr.assemble import join_text
from fun_asr.asr.confidence import spoken, token_logprobs
from fun_asr.asr.language import english_name
from fun_asr.asr.session import Transcription
from fun_asr.serve.core.context import segment_confidence, segment_words

RESPONSE_FORMATS = ("json", "text", "srt", "vtt", "verbose_json")
STREAM_FORMATS = ("json", "text")  # as OpenAI: a stream of transcript.text events replaces these two
MODEL_ALIASES = ("fun-asr", "fun-asr-nano", "whisper-1")
LANGUAGE_NAMES = {"zh": "chinese", "en": "english", "ja": "japanese", "ko": "korean"}
# Every transcription answer's notice codes (``warning_codes``, comma-separated; empty: none), in every format:
# the only place text, srt and vtt (plain text bodies) can carry them.
WARNING_CODES_HEADER = "X-Warning-Codes"


def notices(t: Transcription) -> dict[str, Any]:
    """fun-asr's notices as every JSON answer carries them: ``warnings`` (messages) and ``warning_codes``."""
    return {"warnings": [str(w) for w in t.warnings], "warning_codes": list(t.warning_codes)}


def json_response(t: Transcription, logprobs: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    """OpenAI's ``json`` format, ``{"text"}``, with fun-asr's truncation flags and notices (extra keys, which
    OpenAI's SDK keeps) and ``logprobs`` where ``include[]=logprobs`` asked for them."""
    return {"text": t.text, "truncated": t.truncated, "input_truncated": t.input_truncated, **notices(t),
            **({} if logprobs is None else {"logprobs": logprobs})}


def model_entry(model_id: str, created: int, demo: bool = False) -> dict[str, Any]:
    """The served model as OpenAI's model object (``id``, ``object``, ``created``, ``owned_by``); the 20-word
    demo model (``-m demo``) adds ``demo: true`` and a ``description`` of what it knows (the web page shows
    it)."""
    entry: dict[str, Any] = {"id": model_id, "object": "model", "created": created, "owned_by": "fun-asr"}
    if demo:
        from fun_asr.model.demo import SUMMARY

        entry.update(demo=True, description=SUMMARY[0].upper() + SUMMARY[1:] + ".")
    return entry


def verbose_json(t: Transcription, words: bool = False, spec: dict[str, Any] | None = None,
                 logprobs: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    """OpenAI's verbose_json (each segment's ``avg_logprob``, ``compression_ratio``, ``no_speech_prob``), with
    FunASR's ``words`` inside each segment (``[]`` unless word timestamps were asked for; each word with the
    decoder's ``probability``), each segment's ``token_words`` (its text as words with their ``probability``:
    Segment.token_words, with or without word times), ``logprobs`` where ``include[]=logprobs`` asked for them,
    and fun-asr's extensions (truncation flags, warnings, segmentation, timings)."""
    lang = t.detected_language  # the requested language, else inferred from the text's script
    if spec is not None:
        language = english_name(spec, lang) or "unknown"
    else:
        language = LANGUAGE_NAMES.get(lang or "", lang or "unknown")
    extra: dict[str, Any] = {}
    if words:  # timestamp_granularities=["word"]: OpenAI's words list (empty without a CTC head)
        extra["words"] = [w for s in t.segments for w in segment_words(s)]
    return {
        "task": "transcribe",
        "language": language,
        "duration": round(t.duration, 3),
        "text": t.text,
        "truncated": t.truncated,
        "input_truncated": t.input_truncated,
        **notices(t),
        "segmentation": t.segmentation,
        "segments": [
            {"id": i, "seek": int(s.start * 100), "start": s.start, "end": s.end, "text": s.text,
             "tokens": s.tokens, "temperature": 0.0, **segment_confidence(s), "stop_reason": s.stop_reason,
             "truncated": s.truncated,
             "repetition": s.repetition, "words": segment_words(s) if words else [],
             "token_words": s.token_words or [],
             **({} if s.speaker is None else {"speaker": s.speaker_label})}
            for i, s in enumerate(t.segments)
        ],
        **({} if t.speakers is None else {"num_speakers": t.num_speakers, "speakers": [
            {"start": round(a, 3), "end": round(b, 3), "speaker": f"SPK{k}"} for a, b, k in t.speakers]}),
        "timings": t.timings,
        **extra,
        **({} if logprobs is None else {"logprobs": logprobs}),
    }


def transcript_logprobs(t: Transcription, token_bytes: Callable[[int], bytes], stop_ids: Sequence[int]
                        ) -> list[dict[str, Any]]:
    """OpenAI's ``logprobs`` (``include[]=logprobs``): ``{"token", "logprob", "bytes"}`` for every token of the
    transcript, segment after segment (stop tokens left out)."""
    return [e for s in t.segments for e in segment_logprobs(s, token_bytes, stop_ids)]


def segment_logprobs(s: Any, token_bytes: Callable[[int], bytes], stop_ids: Sequence[int]) -> list[dict[str, Any]]:
    tokens, logprobs = spoken(s.tokens, s.token_logprobs, stop_ids)
    return [] if logprobs is None else token_logprobs(tokens, logprobs, token_bytes)


def stream_events(t: Transcription, spec: dict[str, Any],
                  logprobs: Callable[[Any], list[dict[str, Any]]] | None = None) -> list[dict[str, Any]]:
    """OpenAI's streamed transcription: one ``transcript.text.delta`` per decoded segment with text (its text,
    after the separator the transcript puts before it, so that the deltas add up to the text exactly), then
    ``transcript.text.done`` with the whole text (and the json format's truncation flags and notices). With
    ``logprobs`` (a segment's ``logprobs`` entries: ``include[]=logprobs``) each delta carries its segment's and
    the done event all of them, as OpenAI's events do."""
    events: list[dict[str, Any]] = []
    deltas: list[str] = []
    every: list[dict[str, Any]] = []
    prev = None
    for s in t.segments:
        if not s.text:
            continue
        # the separator depends only on the text before it (its last character) and this segment: join the
        # pair, not everything shown so far (linear in the transcript, also for hours of segments)
        delta = s.text if prev is None else join_text([prev, s], t.language, spec)[len(prev.text):]
        event: dict[str, Any] = {"type": "transcript.text.delta", "delta": delta}
        if logprobs is not None:
            event["logprobs"] = logprobs(s)
            every += event["logprobs"]
        events.append(event)
        deltas.append(delta)
        prev = s
    text = "".join(deltas)
    if text != t.text:  # never expected (join_text builds t.text); the deltas must add up to the text
        raise RuntimeError(f"streamed deltas {text!r} do not add up to the transcript {t.text!r}")
    done: dict[str, Any] = {"type": "transcript.text.done", **json_response(t)}
    if logprobs is not None:
        done["logprobs"] = every
    events.append(done)
    return events


def sse_response(events: list[dict[str, Any]], headers: dict[str, str] | None = None) -> StreamingResponse:
    """Server-sent events as OpenAI sends them: ``data: <json>`` blocks, then ``data: [DONE]`` (``headers``:
    more response headers)."""

    async def body() -> AsyncIterator[str]:
        for event in events:
            yield f"data: {json.dumps(event, ensure_ascii=False, separators=(',', ':'))}\n\n"
        yield "data: [DONE]\n\n"

    return StreamingResponse(body(), media_type="text/event-stream",
                             headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no", **(headers or {})})


__all__ = ["LANGUAGE_NAMES", "MODEL_ALIASES", "RESPONSE_FORMATS", "STREAM_FORMATS", "WARNING_CODES_HEADER",
           "json_response", "model_entry", "notices", "segment_logprobs", "sse_response", "stream_events",
           "transcript_logprobs", "verbose_json"]
