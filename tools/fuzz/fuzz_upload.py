#!/usr/bin/env python3
"""Fuzz HTTP uploads -> the server's ``POST /v1/audio/transcriptions`` (``fun_asr.serve.app.create_app``, in-process
through ``fastapi.testclient.TestClient``, over a real Session: the micro model + FunASR's FSMN-VAD).

Input: header lines (``Name: value``), a blank line, then the request body. Seeds: multipart bodies as the
OpenAI client sends them, with clips in several containers and every field (model, response_format in each
format, language, prompt, hotwords, itn, temperature, timestamp_granularities[]), a missing file, an empty file,
a wrong API key. The server runs with ``--api-key``, a 1 MB upload limit and 4 new tokens per segment.
A finding: an answer other than 200/400/401/413/429/504, an error body not in OpenAI's shape, a 200 body that
does not parse for its response_format, a missing X-Request-Id, or an exception escaping the app.

    python tools/fuzz/fuzz_upload.py [-max_total_time=S] [-atheris_runs=N] | --replay FILES...
"""

from __future__ import annotations

import json
import logging
import os
import sys
from pathlib import Path

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import _fuzzlib  # noqa: E402

MODULES = ["fun_asr", "fun_asr.serve.app", "fun_asr.serve.protocols.funasr_realtime", "fun_asr.asr.formats",
           "fun_asr.asr.session"]
API_KEY = "fuzz-key"
BOUNDARY = "fuzzboundary7MA4YWxk"
EXPECTED = {200, 400, 401, 413, 429, 504}
_client = None


def multipart(fields: list[tuple[str, str | bytes, str | None]], boundary: str = BOUNDARY) -> bytes:
    """A multipart/form-data body: (name, value, filename or None) parts."""
    out = []
    for name, value, filename in fields:
        disp = f'form-data; name="{name}"' + (f'; filename="{filename}"' if filename is not None else "")
        head = f"--{boundary}\r\nContent-Disposition: {disp}\r\n"
        if filename is not None:
            head += "Content-Type: application/octet-stream\r\n"
        data = value.encode() if isinstance(value, str) else value
        out.append(head.encode() + b"\r\n" + data + b"\r\n")
    return b"".join(out) + f"--{boundary}--\r\n".encode()


def request_bytes(body: bytes, key: str | None = API_KEY, content_type: str | None = None) -> bytes:
    heads = [f"Content-Type: {content_type or f'multipart/form-data; boundary={BOUNDARY}'}"]
    if key is not None:
        heads.append(f"Authorization: Bearer {key}")
    heads.append("X-Request-Id: fuzz-1")
    return ("\n".join(heads) + "\n\n").encode() + body


def seeds(out: Path) -> None:
    import _seeds

    clips = _seeds.audio_clips()
    wav, flac = clips["pcm16.wav"], clips["pcm16.flac"]
    plans: dict[str, bytes] = {}
    for fmt in ("json", "text", "srt", "vtt", "verbose_json"):
        plans[f"wav-{fmt}"] = request_bytes(multipart([("file", wav, "a.wav"), ("model", "whisper-1", None),
                                                       ("response_format", fmt, None)]))
    plans["flac-all-fields"] = request_bytes(multipart([
        ("file", flac, "b.flac"), ("model", "fun-asr-nano", None), ("language", "en", None),
        ("prompt", "hello,world", None), ("hotwords", "FunASR, ggml", None), ("itn", "false", None),
        ("temperature", "0", None), ("timestamp_granularities[]", "word", None),
        ("timestamp_granularities[]", "segment", None), ("response_format", "verbose_json", None)]))
    for name in ("vorbis.ogg", "mp3.mp3", "truncated.wav", "float-stereo-44k.wav", "tiny.wav"):
        if name in clips:
            plans[f"clip-{name}"] = request_bytes(multipart([("file", clips[name], name)]))
    plans["no-file"] = request_bytes(multipart([("model", "whisper-1", None)]))
    plans["empty-file"] = request_bytes(multipart([("file", b"", "e.wav")]))
    plans["not-audio"] = request_bytes(multipart([("file", b"hello world, not audio", "x.wav")]))
    plans["wrong-key"] = request_bytes(multipart([("file", wav, "a.wav")]), key="nope")
    plans["urlencoded"] = request_bytes(b"model=whisper-1&language=en",
                                        content_type="application/x-www-form-urlencoded")
    plans["zh-language"] = request_bytes(multipart([("file", wav, "a.wav"), ("language", "中文", None)]))
    for name, data in plans.items():
        (out / f"{name}.req").write_bytes(data)


def setup() -> None:
    global _client
    import _seeds
    from fastapi.testclient import TestClient

    import fun_asr
    from fun_asr.audio.decode import Limits
    from fun_asr.serve.app import create_app

    logging.getLogger("fun_asr").setLevel(logging.ERROR)
    import warnings

    warnings.filterwarnings("ignore", category=fun_asr.FunAsrWarning)
    session = fun_asr.Session(_seeds.micro_gguf(), device="cpu", threads=1, vad="fsmn",
                              vad_model=_seeds.vad_gguf(), progress=False, limits=Limits(max_audio_seconds=60))
    app = create_app(session, model_id="fun-asr-nano", max_upload_mb=1, max_concurrency=2, max_new_tokens=4,
                     api_key=API_KEY, request_timeout=60)
    _client = TestClient(app, raise_server_exceptions=True)
    _client.__enter__()  # runs the lifespan: the batching worker starts


def _split(data: bytes) -> tuple[dict[str, str], bytes]:
    head, sep, body = data.partition(b"\n\n")
    if not sep:
        return {}, data
    headers: dict[str, str] = {}
    for line in head.split(b"\n"):
        name, colon, value = line.partition(b":")
        name = name.strip().decode("latin-1")
        value_s = value.strip().decode("latin-1")
        # what an HTTP client can send at all: a token name, a value without control characters
        token = all(c.isascii() and (c.isalnum() or c in "-_") for c in name)
        if not colon or not name or not token or name.lower() in (
                "content-length", "transfer-encoding", "host", "connection", "expect"):
            continue
        if any(not 32 <= ord(c) < 127 for c in value_s):
            continue
        headers[name] = value_s
    return headers, body


_FIELDS = ["file", "model", "language", "prompt", "hotwords", "itn", "temperature", "response_format",
           "timestamp_granularities[]", "timestamp_granularities"]
_VALUES = ["", "0", "1", "true", "false", "yes", "nan", "inf", "-0", "0.0", "1e309", "en", "zh", "ja", "auto",
           "english", "中文", "klingon", "json", "text", "srt", "vtt", "verbose_json", "word", "segment", "whisper-1",
           "fun-asr", "fun-asr-nano", ",", ",,,", "a," * 300, "x" * 101, "\u00e9\u00e8", "\x00", "%s%n", "../../etc"]


def custom_mutator(data: bytes, max_size: int, seed: int) -> bytes:
    """Half of the time libFuzzer's byte mutations; otherwise one multipart-aware change: a field's value set to
    an interesting one or mutated, a part renamed, dropped, duplicated or added, the file's bytes mutated."""
    import random

    import atheris

    rng = random.Random(seed)
    if rng.random() < 0.5:
        return atheris.Mutate(data, max_size)
    headers, body = _split(data)
    ctype = headers.get("Content-Type", "")
    if "boundary=" not in ctype:
        return atheris.Mutate(data, max_size)
    boundary = ctype.split("boundary=", 1)[1].split(";")[0].strip().strip('"').encode()
    chunks = body.split(b"--" + boundary)
    parts = []
    for c in chunks[1:]:
        if c.startswith(b"--"):
            break
        head, _, value = c.partition(b"\r\n\r\n")
        parts.append([head, value[:-2] if value.endswith(b"\r\n") else value])
    if not parts:
        return atheris.Mutate(data, max_size)
    op = rng.random()
    i = rng.randrange(len(parts))
    if op < 0.35:
        parts[i][1] = rng.choice(_VALUES).encode()
    elif op < 0.6:
        parts[i][1] = atheris.Mutate(parts[i][1], max(64, len(parts[i][1]) * 2))
    elif op < 0.7:
        parts[i][0] = parts[i][0].replace(b'name="', f'name="{rng.choice(_FIELDS)}" x="'.encode(), 1)
    elif op < 0.8:
        del parts[i]
    elif op < 0.9:
        parts.insert(i, list(parts[i]))
    else:
        parts.append([f'\r\nContent-Disposition: form-data; name="{rng.choice(_FIELDS)}"'.encode(),
                      rng.choice(_VALUES).encode()])
    out_body = b"".join(b"--" + boundary + h + b"\r\n\r\n" + v + b"\r\n" for h, v in parts)
    out_body += b"--" + boundary + b"--\r\n"
    head = data.partition(b"\n\n")[0]
    out = head + b"\n\n" + out_body
    return out if len(out) <= max_size else atheris.Mutate(data, max_size)


def one_input(data: bytes) -> None:
    assert _client is not None
    headers, body = _split(data)
    r = _client.post("/v1/audio/transcriptions", content=body, headers=headers)
    if r.status_code not in EXPECTED:
        raise _fuzzlib.Finding(f"HTTP {r.status_code}: {r.text[:500]}")
    if not r.headers.get("x-request-id"):
        raise _fuzzlib.Finding(f"HTTP {r.status_code} without X-Request-Id")
    if r.status_code != 200:
        err = r.json().get("error")
        if not isinstance(err, dict) or set(err) != {"message", "type", "param", "code"} or not err["message"]:
            raise _fuzzlib.Finding(f"HTTP {r.status_code} error body not in OpenAI's shape: {r.text[:300]}")
        _fuzzlib.feedback(f"{r.status_code} {err['code']} {err['param']}")
        return
    ctype = r.headers.get("content-type", "")
    if ctype.startswith("application/json"):
        doc = r.json()
        if not isinstance(doc.get("text"), str):
            raise _fuzzlib.Finding(f"200 JSON without text: {r.text[:300]}")
        _fuzzlib.feedback("200 json" + (" verbose" if "segments" in doc else ""))
    elif not any(ctype.startswith(t) for t in ("text/plain", "application/x-subrip", "text/vtt")):
        raise _fuzzlib.Finding(f"200 with content-type {ctype!r}")
    else:
        _fuzzlib.feedback("200 " + ctype.split(";")[0])
    json.dumps(r.text)


if __name__ == "__main__":
    _fuzzlib.main("upload", sys.modules[__name__])
