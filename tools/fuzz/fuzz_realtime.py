#!/usr/bin/env python3
"""Fuzz WebSocket message sequences -> the realtime handler
(``fun_asr.serve.protocols.funasr_realtime.handle``, FunASR's protocol) and ``fun_asr.asr.stream.Stream``
underneath, over a real Session (the micro model, FunASR's FSMN-VAD) and the server's batching decoder.

Input: records ``[kind u8][length u16 LE][payload]``; kind % 5: 0 a text message (START, STOP, HOTWORDS:...,
LANGUAGE:..., anything), 1 a binary frame of the payload's bytes, 2 a binary frame of real speech (payload: start
in 10 ms units u16, length in ms u16; int16 PCM from examples/), 3 a frame of near-silence (length in ms u16),
4 the client disconnects. After the last record the client disconnects. Seeds: FunASR client sessions
(START, speech in 100 ms frames, silence, STOP), hotwords and language switches, disconnects mid-sentence, audio
before START, odd-length frames, unknown commands, a frame flood over the input buffer, 300 hotwords.
A finding: an exception escaping the handler, a message that is not a JSON object with "event" or "sentences",
a STOP without its "stopped" event, the stream counter not back to 0 after the disconnect (a leaked stream), or a
stream still being fed or closed (in a worker thread) after the handler returned: it decodes on for a client that
is gone, and a process exiting meanwhile crashes in ggml's teardown (what made a 10 s run fail once).

    python tools/fuzz/fuzz_realtime.py [-max_total_time=S] [-atheris_runs=N] | --replay FILES...
"""

from __future__ import annotations

import asyncio
import collections
import json
import logging
import os
import struct
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import _fuzzlib  # noqa: E402

MODULES = ["fun_asr", "fun_asr.serve.protocols.funasr_realtime", "fun_asr.asr.stream", "fun_asr.serve.app",
           "fun_asr.vad", "fun_asr.asr.session"]
MAX_RECORDS = 400
_state: dict[str, Any] = {}


def rec(kind: int, payload: bytes) -> bytes:
    return struct.pack("<BH", kind, len(payload)) + payload


def text(s: str) -> bytes:
    return rec(0, s.encode())


def speech(start_ms: int, ms: int) -> bytes:
    return rec(2, struct.pack("<HH", start_ms // 10, ms))


def quiet(ms: int) -> bytes:
    return rec(3, struct.pack("<H", ms))


def seeds(out: Path) -> None:
    frames = b"".join(speech(t, 100) for t in range(0, 1500, 100))
    plans = {
        "funasr-client": text("START") + frames + quiet(2500) + text("STOP"),
        "hotwords-language": text("HOTWORDS:FunASR,ggml") + text("LANGUAGE:en") + text("START") + frames
        + text("LANGUAGE:zh") + text("HOTWORDS:") + quiet(300) + text("STOP"),
        "disconnect-mid": text("START") + frames + rec(4, b""),
        "before-start": speech(0, 200) + text("stop") + text("start") + rec(1, b"\x01\x02\x03") + text("COMMIT")
        + text("nonsense") + text("LANGUAGE:klingon") + text("STOP"),
        "twice": text("START") + speech(0, 500) + text("START") + speech(500, 500) + text("STOP") + text("STOP"),
        "flood": text("START") + b"".join(speech(0, 1000) for _ in range(8)) + text("STOP"),
        "many-hotwords": text("HOTWORDS:" + ",".join(f"w{i}" for i in range(300))) + text("START") + speech(0, 500)
        + text("STOP"),
        "long-hotword": text("START") + text("HOTWORDS:" + "x" * 500) + speech(0, 800) + text("STOP"),
        "raw-bytes": text("START") + rec(1, bytes(range(256)) * 4) + rec(1, b"\xff\x7f" * 800) + text("STOP"),
    }
    for name, data in plans.items():
        (out / f"{name}.ws").write_bytes(data)


class FakeWebSocket:
    """What the handler uses of Starlette's WebSocket: accept, receive, send_text, close."""

    def __init__(self, messages: list[dict[str, Any]]) -> None:
        self.incoming = collections.deque(messages)
        self.sent: list[str] = []
        self.closed: int | None = None
        self.headers: dict[str, str] = {}

    async def accept(self) -> None:
        pass

    async def receive(self) -> dict[str, Any]:
        await asyncio.sleep(0)
        if not self.incoming:
            return {"type": "websocket.disconnect", "code": 1000}
        return self.incoming.popleft()

    async def send_text(self, data: str) -> None:
        self.sent.append(data)

    async def close(self, code: int = 1000) -> None:
        self.closed = code


def _count_running(cls: type, names: tuple[str, ...]) -> list[int]:
    """Wraps ``cls``'s methods ``names`` so that ``[n]`` (returned) counts the calls running now, in any thread."""
    import functools
    import threading

    lock, running = threading.Lock(), [0]

    def wrap(fn: Any) -> Any:
        @functools.wraps(fn)
        def counted(self: Any, *args: Any, **kwargs: Any) -> Any:
            with lock:
                running[0] += 1
            try:
                return fn(self, *args, **kwargs)
            finally:
                with lock:
                    running[0] -= 1
        return counted

    for name in names:
        setattr(cls, name, wrap(getattr(cls, name)))
    return running


def setup() -> None:
    import warnings

    import _seeds
    import numpy as np

    import fun_asr
    from fun_asr.serve.core.batcher import Batcher
    from fun_asr.serve.protocols.funasr_realtime import RealtimeLimits

    logging.getLogger("fun_asr").setLevel(logging.ERROR)
    warnings.filterwarnings("ignore", category=fun_asr.FunAsrWarning)
    session = fun_asr.Session(_seeds.micro_gguf(), device="cpu", threads=1, vad="fsmn", vad_model=_seeds.vad_gguf(),
                              progress=False)
    clip = np.concatenate([_seeds.speech(10.0, n, 0.0) for n in ("en_hello.wav", "zh_weather.wav", "ja_hello.wav")])
    from fun_asr.asr.stream import Stream

    _state["running"] = _count_running(Stream, ("feed", "close", "commit"))
    _state.update(session=session, batcher=Batcher(session, 2, 4), counter=[0], pcm=_seeds.pcm16(clip),
                  limits=RealtimeLimits(max_streams=16, idle_seconds=5.0, max_seconds=20.0, buffer_seconds=3.0))
    rng = np.random.default_rng(0)
    _state["noise"] = _seeds.pcm16((2e-4 * rng.standard_normal(16000 * 10)).astype(np.float32))


def parse(data: bytes) -> list[dict[str, Any]]:
    pcm, noise = _state["pcm"], _state["noise"]
    msgs: list[dict[str, Any]] = []
    pos = 0
    while pos + 3 <= len(data) and len(msgs) < MAX_RECORDS:
        kind, n = struct.unpack_from("<BH", data, pos)
        payload = data[pos + 3 : pos + 3 + n]
        pos += 3 + n
        kind %= 5
        if kind == 0:
            msgs.append({"type": "websocket.receive", "text": payload.decode("utf-8", "replace")})
        elif kind == 1:
            msgs.append({"type": "websocket.receive", "bytes": payload})
        elif kind == 2:
            start, ms = struct.unpack("<HH", payload[:4].ljust(4, b"\0"))
            a = (start * 160 * 2) % max(len(pcm), 2)
            a -= a % 2
            msgs.append({"type": "websocket.receive", "bytes": pcm[a : a + min(ms, 3000) * 32]})
        elif kind == 3:
            (ms,) = struct.unpack("<H", payload[:2].ljust(2, b"\0"))
            msgs.append({"type": "websocket.receive", "bytes": noise[: min(ms, 10000) * 32]})
        else:
            msgs.append({"type": "websocket.disconnect", "code": 1001})
            break
    return msgs


_COMMANDS = ["START", "STOP", "start", " STOP ", "COMMIT", "HOTWORDS:a,b", "HOTWORDS:", "HOTWORDS:" + "w," * 250,
             "HOTWORDS:" + "y" * 150, "LANGUAGE:en", "LANGUAGE:zh", "LANGUAGE:", "LANGUAGE:中文", "LANGUAGE:xx",
             "", "\x00", "START\nSTOP", "{\"mode\": \"2pass\"}"]


def _records(data: bytes) -> list[tuple[int, bytes]]:
    out, pos = [], 0
    while pos + 3 <= len(data):
        kind, n = struct.unpack_from("<BH", data, pos)
        out.append((kind, data[pos + 3 : pos + 3 + n]))
        pos += 3 + n
    return out


def custom_mutator(data: bytes, max_size: int, seed: int) -> bytes:
    """Half of the time libFuzzer's byte mutations; otherwise one change to the message sequence: a command,
    a speech or silence frame, raw bytes or a disconnect inserted; a message dropped, duplicated, moved, or its
    payload mutated."""
    import random

    import atheris

    rng = random.Random(seed)
    if rng.random() < 0.4:
        return atheris.Mutate(data, max_size)
    recs = _records(data)
    op = rng.random()
    i = rng.randrange(len(recs) + 1)
    if op < 0.4 or not recs:
        choice = rng.random()
        if choice < 0.35:
            new = (0, rng.choice(_COMMANDS).encode())
        elif choice < 0.7:
            new = (2, struct.pack("<HH", rng.randrange(0, 1200), rng.choice([10, 30, 60, 100, 480, 960, 2000])))
        elif choice < 0.85:
            new = (3, struct.pack("<H", rng.choice([60, 500, 2100, 3000])))
        elif choice < 0.95:
            new = (1, rng.randbytes(rng.choice([1, 2, 3, 320, 3200])))
        else:
            new = (4, b"")
        recs.insert(i, new)
    elif op < 0.55:
        del recs[min(i, len(recs) - 1)]
    elif op < 0.7:
        j = min(i, len(recs) - 1)
        recs.insert(j, recs[j])
    elif op < 0.8:
        j, k = rng.randrange(len(recs)), rng.randrange(len(recs))
        recs[j], recs[k] = recs[k], recs[j]
    else:
        j = min(i, len(recs) - 1)
        recs[j] = (recs[j][0], atheris.Mutate(recs[j][1], max(16, len(recs[j][1]) * 2))[:65535])
    out = b"".join(rec(k, p) for k, p in recs)
    return out if len(out) <= max_size else atheris.Mutate(data, max_size)


def one_input(data: bytes) -> None:
    from fun_asr.serve.protocols.funasr_realtime import handle

    msgs = parse(data)
    ws = FakeWebSocket(msgs)
    counter = _state["counter"]
    asyncio.run(asyncio.wait_for(handle(ws, _state["session"], _state["batcher"].submit, _state["limits"], counter, 4),
                                 timeout=120))
    if counter[0] != 0:
        counter[0] = 0
        raise _fuzzlib.Finding("the stream counter is not back to 0 after the connection ended (a leaked stream)")
    running = _state["running"]
    if running[0]:
        import time

        left = running[0]
        deadline = time.monotonic() + 120
        while running[0] and time.monotonic() < deadline:  # (so that the next input starts alone)
            time.sleep(0.01)
        raise _fuzzlib.Finding(f"{left} stream call(s) (feed/close/commit) still running in a thread after the "
                               "handler returned: the connection's audio is decoded on after it ended")
    stops = 0
    for m in ws.sent:
        doc = json.loads(m)
        if not isinstance(doc, dict) or not ("event" in doc or "sentences" in doc):
            raise _fuzzlib.Finding(f"unexpected message {m[:200]}")
        if doc.get("event") == "stopped":
            stops += 1
        _fuzzlib.feedback(f"{doc.get('event', 'result')} {str(doc.get('error', ''))[:30]}")
    # every STOP that the handler read before the disconnect is answered
    read = [m for m in msgs[: len(msgs) - len(ws.incoming)] if m.get("text", "").strip().upper() == "STOP"]
    if stops < len(read):
        raise _fuzzlib.Finding(f"{len(read)} STOP commands, {stops} 'stopped' events")


if __name__ == "__main__":
    _fuzzlib.main("realtime", sys.modules[__name__])
