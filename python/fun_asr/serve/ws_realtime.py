"""FunASR's realtime WebSocket protocol (``funasr/bin/realtime_ws.py``, DESIGN §8) over ``Stream``.

Client -> server: text ``START``, ``STOP``, ``HOTWORDS:a,b``, ``LANGUAGE:x`` (case-insensitive, as
FunASR); binary frames of 16 kHz mono little-endian int16 PCM (after START). Server -> client:
``{"event": "started" | "stopped" | "hotwords_set" | "language_set" | "error", ...}`` and results
``{"sentences": [{"text", "start", "end"}], "partial", "partial_start_ms", "duration_ms", "is_final"}``
(``sentences`` cumulative; the STOP result has ``is_final: true`` and an empty partial, also when no
audio came: then with no sentences). A START while a stream runs gets an ``error`` event (the stream
goes on; FunASR would silently restart it, dropping what it had).

Each connection's audio goes through a bounded queue (``buffer_seconds`` of audio): a client sending
faster than the machine transcribes is served as fast as it can be; past the bound a frame is refused
with an ``error`` event (nothing is silently dropped). Idle connections and streams longer than
``max_seconds`` are closed with an ``error`` event; a disconnect frees everything. Decoding goes through
the server's shared batched decoder, so concurrent streams share decoding passes.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import anyio
import numpy as np

from fun_asr.asr.prompt import split_hotwords
from fun_asr.audio.decode import SAMPLE_RATE, AudioError

log = logging.getLogger("fun_asr.server")


@dataclass(frozen=True)
class RealtimeLimits:
    max_streams: int = 16  # concurrent streams; more are refused with an error event
    idle_seconds: float = 60.0  # no message for this long closes the connection
    max_seconds: float = 4 * 3600.0  # audio per stream
    buffer_seconds: float = 30.0  # audio waiting to be processed, per stream


class _State:
    def __init__(self) -> None:
        self.language: str | None = None
        self.hotwords: list[str] = []
        self.stream: Any = None
        self.active = False


async def handle(ws: Any, session: Any, submit: Callable[[np.ndarray, tuple, str], Any], limits: RealtimeLimits,
                 counter: list[int], max_new_tokens: int) -> None:
    """One WebSocket connection (Starlette ``WebSocket``), FunASR's realtime protocol."""
    from starlette.websockets import WebSocketDisconnect

    await ws.accept()
    if counter[0] >= limits.max_streams:
        await ws.send_text(json.dumps({"event": "error", "error": f"too many concurrent streams (limit "
                                       f"{limits.max_streams}); try again later"}))
        await ws.close(code=1013)
        return
    counter[0] += 1
    state = _State()
    queue: asyncio.Queue[bytes] = asyncio.Queue()
    queued = [0]  # bytes waiting
    limit_bytes = int(limits.buffer_seconds * SAMPLE_RATE) * 2

    async def send(obj: dict[str, Any]) -> None:
        with contextlib.suppress(Exception):
            await ws.send_text(json.dumps(obj, ensure_ascii=False))

    def decoder(audio: np.ndarray, max_new: int) -> tuple[str, list[int]]:
        seconds = min(session.max_segment_seconds, max(30.0, audio.size / SAMPLE_RATE + 1.0))
        result = submit(audio, (state.language, True, tuple(state.hotwords), max_new, seconds, False, False),
                        "stream").result()
        return result.text, [t for s in result.segments for t in s.tokens]

    def new_stream() -> Any:
        from fun_asr.asr.stream import StreamOptions

        return session.stream(state.language, True, state.hotwords, max_new_tokens=max_new_tokens,
                              stream_options=StreamOptions(max_new_tokens=max_new_tokens,
                                                           partial_max_new_tokens=min(200, max_new_tokens)),
                              decoder=decoder)

    async def worker() -> None:
        while True:
            frames = [await queue.get()]
            # audio that queued up while the last decode ran is fed in one piece, so that the stream
            # decodes one partial for the newest audio instead of one per stale frame (catches up)
            while not queue.empty():
                frames.append(queue.get_nowait())
            try:
                await process(b"".join(frames))
            except Exception as exc:  # an unexpected failure must not kill the worker (STOP waits on the queue)
                log.exception("realtime stream: %s", exc)
                await send({"event": "error", "error": f"internal error: {type(exc).__name__}: {exc}"})
            finally:
                for _ in frames:
                    queue.task_done()

    async def process(data: bytes) -> None:
        queued[0] -= len(data)
        stream = state.stream
        if stream is None or stream.closed:
            return
        try:
            events = await anyio.to_thread.run_sync(stream.feed, data)
        except (AudioError, ValueError, RuntimeError) as exc:
            await send({"event": "error", "error": str(exc)})
            return
        if events:
            await send(stream.response(is_final=False))
        if stream.duration_ms > limits.max_seconds * 1000:
            await send({"event": "error", "error": f"stream longer than {limits.max_seconds:g} s; stopping"})
            await finish()

    async def finish() -> None:
        stream, state.stream, state.active = state.stream, None, False
        if stream is not None and stream.total_samples + stream._pending.size > 0:
            try:
                await anyio.to_thread.run_sync(stream.close)
                await send(stream.response(is_final=True))
            except (AudioError, ValueError, RuntimeError) as exc:  # the last sentence could not be decoded
                await send({"event": "error", "error": str(exc)})
        elif stream is not None:  # START then STOP with no audio: still a final result (no sentences)
            await send(stream.response(is_final=True))
        await send({"event": "stopped"})

    def check(language: str | None, hotwords: list[str]) -> None:
        """ValueError/TypeError unless a stream with these options can be opened (the Session's limits)."""
        session.options(language, True, hotwords, max_new_tokens, 30.0)

    task = asyncio.create_task(worker())
    try:
        while True:
            try:
                msg = await asyncio.wait_for(ws.receive(), timeout=limits.idle_seconds)
            except asyncio.TimeoutError:
                await send({"event": "error", "error": f"idle for {limits.idle_seconds:g} s; closing"})
                break
            if msg.get("type") == "websocket.disconnect":
                break
            text, data = msg.get("text"), msg.get("bytes")
            if text is not None:
                if not await _command(text.strip(), state, session, send, new_stream, queue, finish, check):
                    break
            elif data is not None:
                if not state.active:
                    await send({"event": "error", "error": "audio before START: send the text message START first"})
                elif len(data) % 2:
                    await send({"event": "error", "error": f"binary frames must be 16 kHz mono int16 PCM (an even "
                                                           f"number of bytes), got {len(data)} bytes"})
                elif queued[0] + len(data) > limit_bytes:
                    await send({"event": "error", "error": f"input buffer full ({limits.buffer_seconds:g} s of "
                                                           "audio waiting): this frame was not accepted; send "
                                                           "at real time or slower"})
                else:
                    queued[0] += len(data)
                    await queue.put(data)
    except WebSocketDisconnect:
        pass
    finally:
        counter[0] -= 1
        task.cancel()
        with contextlib.suppress(BaseException):
            await task
        state.stream = None
        with contextlib.suppress(Exception):
            await ws.close()


async def _command(cmd: str, state: _State, session: Any, send: Any, new_stream: Any, queue: asyncio.Queue,
                   finish: Any, check: Any) -> bool:
    upper = cmd.upper()
    if upper == "START" and state.active:
        await send({"event": "error", "error": "START during a stream: send STOP first to end it (the stream "
                                               "started before goes on)"})
    elif upper == "START":
        await _drain(queue)
        try:
            stream = new_stream()
        except (ValueError, TypeError) as exc:  # options over the Session's limits
            await send({"event": "error", "error": _protocol_words(str(exc))})
            return True
        state.stream, state.active = stream, True
        await send({"event": "started"})
    elif upper == "STOP":
        await _drain(queue)
        await finish()
    elif upper.startswith("HOTWORDS:"):
        words = split_hotwords(cmd[len("HOTWORDS:"):])  # commas (FunASR) or line breaks
        try:
            check(state.language, words)  # the Session's hotword limits, before they reach a stream
        except (ValueError, TypeError) as exc:
            await send({"event": "error", "error": _protocol_words(str(exc))})
            return True
        state.hotwords = words
        if state.stream is not None:
            state.stream.opts = dataclasses.replace(state.stream.opts, hotwords=tuple(words))
        await send({"event": "hotwords_set", "hotwords": words})
    elif upper.startswith("LANGUAGE:"):
        lang = cmd[len("LANGUAGE:"):].strip()
        try:
            code = session.normalize_language(lang or None)
            check(code, state.hotwords)
        except (ValueError, TypeError) as exc:
            await send({"event": "error", "error": str(exc)})
            return True
        state.language = code
        if state.stream is not None:
            state.stream.opts = dataclasses.replace(state.stream.opts, language=code)
        await send({"event": "language_set", "language": lang})
    elif upper == "COMMIT":
        await send({"event": "error", "error": "COMMIT requires client endpoint mode; this server ends "
                                               "sentences itself (server endpoint mode)"})
    else:
        shown = cmd if len(cmd) <= 40 else cmd[:37] + "..."
        await send({"event": "error", "error": f"unknown command {shown!r}: accepted START, STOP, HOTWORDS:a,b, "
                                               "LANGUAGE:x, and binary 16 kHz int16 PCM frames"})
    return True


def _protocol_words(msg: str) -> str:
    """A Session limit in the protocol's words (``HOTWORDS:``), not the Python API's ``Limits`` fields."""
    if " (Session(limits=Limits(max_hotwords=...)))" in msg or (msg.startswith("hotword ") and "characters" in msg):
        msg = "HOTWORDS: " + msg.replace(" (Session(limits=Limits(max_hotwords=...)))", "")
    return msg


async def _drain(queue: asyncio.Queue) -> None:
    """Waits until the audio queued so far has been processed (commands apply after earlier audio)."""
    await queue.join()


__all__ = ["RealtimeLimits", "handle"]
