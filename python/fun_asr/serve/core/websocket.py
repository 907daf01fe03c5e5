"""The WebSocket connection layer every WebSocket protocol of the server shares: the refusals before a connection
is accepted (the API key, a server that cannot stream), the count of open connections (``--max-streams``, held
from the accept), the wait for the first message that tells the protocols apart (:func:`dispatch`, which hands
the connection to the protocol that recognises it, with that message replayed: :class:`Replay`), reading with
the idle limit (``--stream-idle-seconds``), the back-pressure queue between a connection's reader and its worker
(:class:`Inbox`, :func:`work`), the send queue of a protocol whose client may read slowly (:class:`Outbox`), and
one JSON line per connection in the ``fun_asr.access`` log (:func:`log_access`).

A protocol is one :class:`WebSocketProtocol` record: its name (the access log's ``protocol``), how its first
message looks, the coroutine that serves an accepted connection, and its error message's shape. ``serve/app.py``
holds the table of them; the last one is the fallback that recognises any first message."""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
import uuid
from collections import deque
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any

from fun_asr.serve.core.limits import RealtimeLimits
from fun_asr.serve.words import ClientWords

log = logging.getLogger("fun_asr.server")
access_log = logging.getLogger("fun_asr.access")

MAX_FILE_MB = 100.0  # a non-PCM upload is held in memory until it ends (the server's --max-upload-mb default)
# events waiting to be sent per connection (the client reads slower than it sends): past either bound the server
# stops reading the connection until the client has read some (non-final results are replaced, never queued up)
OUTBOX_MAX_EVENTS = 256
OUTBOX_MAX_BYTES = 1 << 20


# -- what a protocol gets, and the table's records -----------------------------------------------------------

@dataclass
class StreamServer:
    """What a WebSocket protocol's connection shares with the server: the Session, the batcher (None until the
    app has started), the limits, the count of open connections, ``--max-new-tokens``, the largest non-PCM
    upload (``--max-upload-mb``) and the messages' words (no server paths)."""

    session: Any
    batcher: Any
    limits: RealtimeLimits
    counter: list[int]
    max_new_tokens: int
    max_file_mb: float = MAX_FILE_MB
    words: ClientWords | None = None

    def __post_init__(self) -> None:
        if self.words is None:
            self.words = ClientWords(self.session)


class Slot:
    """One connection counted in ``--max-streams`` (``counter[0]``): taken when created, given back once
    (:meth:`release`; again: nothing)."""

    def __init__(self, counter: list[int]) -> None:
        self.counter = counter
        self.held = True
        counter[0] += 1

    def release(self) -> None:
        if self.held:
            self.held = False
            self.counter[0] -= 1


@dataclass(frozen=True)
class WebSocketProtocol:
    """One WebSocket protocol of the server: ``name`` (the access log's ``protocol``), ``recognises`` (whether
    a connection's first message, a Starlette ``websocket.receive`` message, is this protocol's), ``serve``
    (the accepted connection: a socket whose first ``receive`` returns that first message again, the
    :class:`StreamServer`, the connection's stats to fill in, and its :class:`Slot`, which the protocol may give
    back as soon as its connection has ended) and ``error`` (an error message in its clients' shape: the
    refusals before the first message put every protocol's fields in one message)."""

    name: str
    recognises: Callable[[dict[str, Any]], bool]
    serve: Callable[[Any, StreamServer, dict[str, Any], Slot], Awaitable[None]]
    error: Callable[[str], dict[str, Any]]


# -- messages and the access log ----------------------------------------------------------------------------

def new_stats() -> dict[str, Any]:
    """A connection's stats, as the access log writes them: the close code, audio taken, bytes in, streams."""
    return {"status": 1000, "audio_s": 0.0, "bytes_in": 0, "streams": 0}


def too_many_streams(limits: RealtimeLimits) -> str:
    return (f"too many concurrent streams (limit {limits.max_streams}: fun-asr-serve --max-streams); try again "
            "later")


def idle_error(limits: RealtimeLimits, tail: str = "") -> str:
    return (f"idle for {limits.idle_seconds:g} s (the idle limit: fun-asr-serve --stream-idle-seconds): closing the "
            f"connection{tail}")


def log_access(ws: Any, t0: float, stats: dict[str, Any], protocol: str) -> None:
    """One JSON access-log line per connection (``fun_asr.access``): ts, id, method ``WEBSOCKET``, path (no query
    string), protocol, status (the close code; 403 for a refused upgrade), ms, audio_s, bytes_in, streams,
    client, and the reason when a limit ended it."""
    line = {"ts": round(time.time(), 3), "id": ws.headers.get("x-request-id") or uuid.uuid4().hex[:16],
            "method": "WEBSOCKET", "path": ws.url.path, "protocol": protocol, "status": stats["status"],
            "ms": round((time.perf_counter() - t0) * 1e3, 1), "audio_s": round(stats["audio_s"], 3),
            "bytes_in": stats["bytes_in"], "streams": stats["streams"],
            "client": ws.client.host if ws.client else None}
    if "reason" in stats:
        line["reason"] = stats["reason"]
    access_log.info("%s", json.dumps(line, ensure_ascii=False))


# -- accepting ----------------------------------------------------------------------------------------------

async def refused(ws: Any, server: StreamServer, authorized: bool, stats: dict[str, Any]) -> bool:
    """Whether the connection was refused before any protocol runs: without the API key the upgrade is refused
    (close 1008 before accepting: HTTP 403); without the FSMN-VAD in server endpoint mode it gets one error
    event (close 1011). RuntimeError when the server's decoder is not running."""
    if not authorized:
        stats.update(status=403, reason="api key")
        await ws.close(code=1008)  # before accept: the upgrade is refused (HTTP 403)
        return True
    if server.limits.endpoint_mode == "server" and server.session.vad is None:
        await ws.accept()
        await ws.send_text(json.dumps({"event": "error", "error": "streaming needs the FSMN-VAD; start the "
                                                                  "server with --vad fsmn (or --vad-model), or "
                                                                  "with --endpoint-mode client"}))
        await ws.close(code=1011)
        stats["status"] = 1011
        return True
    if server.batcher is None:
        raise RuntimeError("the server's decoder is not running (the app's lifespan has not started)")
    return False


async def refuse_over_limit(ws: Any, limits: RealtimeLimits, counter: list[int], stats: dict[str, Any],
                            message: dict[str, Any]) -> bool:
    """Past ``--max-streams`` connections open: ``message`` (JSON), close 1013, True."""
    if counter[0] < limits.max_streams:
        return False
    with contextlib.suppress(Exception):
        await ws.send_text(json.dumps(message))
        await ws.close(code=1013)
    stats["status"] = 1013
    return True


async def receive(ws: Any, idle_seconds: float) -> dict[str, Any] | None:
    """The next message, or None after ``idle_seconds`` without one."""
    try:
        return await asyncio.wait_for(ws.receive(), timeout=idle_seconds)
    except asyncio.TimeoutError:
        return None


def disconnected(msg: dict[str, Any], stats: dict[str, Any]) -> bool:
    """Whether ``msg`` is the client's close (its code goes to the stats)."""
    if msg.get("type") != "websocket.disconnect":
        return False
    stats["status"] = int(msg.get("code") or 1005)
    return True


class Replay:
    """An accepted Starlette WebSocket whose first ``receive`` returns the message read to tell the protocols
    apart; a second accept does nothing; everything else (``send_text``, ``close``, ``headers``, ...) is the
    socket's. The protocols read with ``receive`` only: the socket's other readers (``receive_text``,
    ``iter_json``, ...) would skip the replayed message, so there are none."""

    def __init__(self, ws: Any, first: dict[str, Any]) -> None:
        self._ws = ws
        self._first: dict[str, Any] | None = first

    async def accept(self, *args: Any, **kwargs: Any) -> None:
        return None

    async def receive(self) -> dict[str, Any]:
        if self._first is not None:
            msg, self._first = self._first, None
            return msg
        return await self._ws.receive()

    def __getattr__(self, name: str) -> Any:
        if name.startswith(("receive", "iter_")):
            raise AttributeError(f"{name}: read the replaying socket with receive()")
        return getattr(self._ws, name)


async def dispatch(ws: Any, server: StreamServer, protocols: Sequence[WebSocketProtocol], *,
                   authorized: bool) -> None:
    """The WebSocket route's whole body over a table of protocols (the last one the fallback): a refused API
    key, a server without its decoder or without the VAD are refused before any protocol runs
    (:func:`refused`); otherwise the connection is accepted (with the ``binary`` subprotocol when the client
    offers it, as FunASR's servers do) and counted in ``server.counter`` (--max-streams) from then on, also
    while its first message is awaited: past the limit it is refused at once (close 1013) with one message every
    protocol's clients read (each protocol's error fields in one). Its first message decides: the first
    protocol that recognises it serves the connection, with that message replayed. One ``fun_asr.access`` line
    per connection (protocol ``none`` when no protocol was chosen)."""
    fallback = protocols[-1]
    limits, counter = server.limits, server.counter
    t0 = time.perf_counter()
    stats = new_stats()
    name = fallback.name  # refusals before the accept are the fallback's
    try:
        if await refused(ws, server, authorized, stats):
            return
        name = "none"
        offered = ws.scope.get("subprotocols") or []
        await ws.accept(subprotocol="binary" if "binary" in offered else None)
        t0 = time.perf_counter()
        refusal: dict[str, Any] = {}
        for protocol in reversed(protocols):
            refusal.update(protocol.error(too_many_streams(limits)))
        if await refuse_over_limit(ws, limits, counter, stats, refusal):
            return
        slot = Slot(counter)  # held from the accept, so idle sockets cannot pile up
        try:
            first = await receive(ws, limits.idle_seconds)
            if first is None:
                with contextlib.suppress(Exception):
                    await ws.send_text(json.dumps(fallback.error(idle_error(limits))))
                    await ws.close(code=1000, reason="idle")
                return
            if disconnected(first, stats):
                return
            chosen = next(p for p in protocols if p.recognises(first) or p is fallback)
            name = chosen.name
            await chosen.serve(Replay(ws, first), server, stats, slot)
        finally:
            slot.release()
    finally:
        log_access(ws, t0, stats, name)


# -- reading ahead: the reader, the worker, back-pressure ---------------------------------------------------

class Inbox:
    """What a connection's reader has read and its worker has not taken (or, with ``hold_until_done``, not
    finished) yet, in order: ``("audio", bytes)`` and ``("text", str)`` items. ``full(inbox)`` says when the
    reader must wait (:meth:`wait_for_room`): it stops reading the connection, so the client's sends wait in TCP
    (back-pressure) and nothing is dropped. The worker takes audio that queued up behind audio in one piece."""

    def __init__(self, full: Callable[[Inbox], bool], hold_until_done: bool = False) -> None:
        self.full = full
        self.hold_until_done = hold_until_done
        self.items: deque[tuple[str, Any]] = deque()
        self.queued = 0  # bytes of audio and characters of text counted against the bound
        self.texts = 0  # text messages counted against the bound
        self.unfinished = 0  # items put and not done
        self.busy = False  # the worker is on an item
        self.has_items = asyncio.Event()
        self.room = asyncio.Event()
        self.room.set()
        self.finished = asyncio.Event()
        self.finished.set()

    async def wait_for_room(self, stop: Callable[[], bool] | None = None) -> None:
        """Until the inbox is not full (or ``stop()``)."""
        while self.full(self) and not (stop is not None and stop()):
            self.room.clear()
            await self.room.wait()

    def put(self, kind: str, payload: bytes | str) -> None:
        self.items.append((kind, payload))
        self.queued += len(payload)
        self.texts += kind == "text"
        self.unfinished += 1
        self.finished.clear()
        self.has_items.set()

    def _release(self, kind: str, payload: bytes | str) -> None:
        self.queued -= len(payload)
        self.texts -= kind == "text"
        self.room.set()

    async def take(self) -> tuple[str, Any, int]:
        """The next item (audio queued right behind audio joined to it) and how many items it holds."""
        while not self.items:
            self.has_items.clear()
            await self.has_items.wait()
        kind, payload = self.items.popleft()
        parts = [payload]
        while kind == "audio" and self.items and self.items[0][0] == "audio":
            parts.append(self.items.popleft()[1])
        if not self.hold_until_done:
            for part in parts:
                self._release(kind, part)
        return kind, (b"".join(parts) if kind == "audio" else payload), len(parts)

    def done(self, kind: str, payload: bytes | str, count: int) -> None:
        if self.hold_until_done:
            self._release(kind, payload)
        self.unfinished -= count
        if self.unfinished == 0:
            self.finished.set()

    async def join(self) -> None:
        """Until everything put so far is done."""
        await self.finished.wait()

    def drop(self) -> None:
        """Forgets the items not taken yet (the connection has ended: nobody waits for their results); the one
        the worker is on stays counted until it is done."""
        while self.items:
            kind, payload = self.items.popleft()
            self._release(kind, payload)
            self.unfinished -= 1
        if self.unfinished == 0:
            self.finished.set()


async def work(inbox: Inbox, handle: Callable[[str, Any], Awaitable[None]],
               failed: Callable[[Exception], Awaitable[None]]) -> None:
    """A connection's worker: the inbox's items in order through ``handle``; a failure goes to ``failed`` and
    the worker goes on (a command waiting for the queue to drain must not wait forever)."""
    while True:
        kind, payload, count = await inbox.take()
        inbox.busy = True
        try:
            await handle(kind, payload)
        except Exception as exc:  # noqa: BLE001 - must not kill the worker
            await failed(exc)
        finally:
            inbox.busy = False
            inbox.done(kind, payload, count)


async def stop_worker(worker: asyncio.Task[Any], inbox: Inbox) -> None:
    """Ends a connection's worker (:func:`work`) once its connection has ended: what waits in ``inbox`` is
    dropped, and the item the worker is on is finished first. Cancelling the worker alone would not stop that
    item: its stream's feed or close runs in a thread (``anyio.to_thread.run_sync``), which goes on decoding for a
    client that is gone, after its ``--max-streams`` slot was given back and after the handler returned (a process
    that exits meanwhile crashes in ggml's teardown). Cancelled while it waits, the worker is cancelled at once."""
    inbox.drop()
    try:
        await inbox.join()
    finally:
        worker.cancel()
        with contextlib.suppress(BaseException):
            await worker


# -- sending to a client that may read slowly -----------------------------------------------------------------

class Outbox:
    """What the server sends, in order, from one task (the handler never waits on a slow reader). A
    non-final result not yet sent is replaced by a newer one (results are cumulative); the one being sent
    is out of the queue already, so a newer one queues after it. ``full`` past ``max_events`` events or
    ``max_bytes`` of JSON waiting: the connection's reader then stops reading (``room`` is clear). ``fields``:
    the message as the client reads it (its ``error``, ``notice``, ... fields without server paths)."""

    def __init__(self, ws: Any, max_events: int = OUTBOX_MAX_EVENTS, max_bytes: int = OUTBOX_MAX_BYTES,
                 fields: Callable[[dict[str, Any]], dict[str, Any]] | None = None) -> None:
        self.ws = ws
        self.fields = fields
        self.max_events, self.max_bytes = max_events, max_bytes
        self.items: deque[tuple[bool, str, int]] = deque()  # (replaceable, JSON, its UTF-8 size), not sent yet
        self.bytes = 0  # UTF-8 bytes in items
        self.sent = 0  # events sent so far
        self.ready = asyncio.Event()
        self.empty = asyncio.Event()
        self.empty.set()
        self.room = asyncio.Event()  # set while not full
        self.room.set()
        self.broken = False

    @property
    def full(self) -> bool:
        return len(self.items) >= self.max_events or self.bytes >= self.max_bytes

    def put(self, obj: dict[str, Any], replaceable: bool = False) -> None:
        if self.broken:
            return
        if self.fields is not None:
            obj = self.fields(obj)
        text = json.dumps(obj, ensure_ascii=False)
        size = len(text.encode("utf-8"))
        if replaceable and self.items and self.items[-1][0]:
            self.bytes -= self.items[-1][2]
            self.items[-1] = (True, text, size)
        else:
            self.items.append((replaceable, text, size))
        self.bytes += size
        if self.full:
            self.room.clear()
        self.empty.clear()
        self.ready.set()

    async def run(self) -> None:
        while True:
            await self.ready.wait()
            self.ready.clear()
            while self.items:
                _, text, size = self.items.popleft()  # out of the queue before it is sent (never replaced then)
                self.bytes -= size
                if not self.full:
                    self.room.set()
                try:
                    await self.ws.send_text(text)
                except Exception:  # noqa: BLE001 - the client is gone: nothing more can be sent
                    self.broken = True
                    self.items.clear()
                    self.bytes = 0
                    self.room.set()
                    break
                self.sent += 1
            if not self.items:
                self.empty.set()

    async def flush(self, timeout: float) -> None:
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(self.empty.wait(), timeout)


__all__ = ["MAX_FILE_MB", "OUTBOX_MAX_BYTES", "OUTBOX_MAX_EVENTS", "Inbox", "Outbox", "Replay", "Slot", "StreamServer",
           "WebSocketProtocol", "dispatch", "disconnected", "idle_error", "log_access", "new_stats", "receive",
           "refuse_over_limit", "refused", "stop_worker", "too_many_streams", "work"]
