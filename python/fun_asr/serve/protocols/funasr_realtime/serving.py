"""FunASR's realtime protocol on one connection: the reader (commands at once, audio into the back-pressure
queue), the worker (the queued audio into the stream), the commands, and the connection's whole life
(:func:`handle`, :func:`serve_websocket`; :data:`PROTOCOL` for the server's table of WebSocket protocols). The
protocol itself: :mod:`fun_asr.serve.protocols.funasr_realtime.protocol`."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import time
from collections.abc import Callable
from typing import Any

import anyio

from fun_asr.asr.prompt import split_hotwords
from fun_asr.audio.decode import SAMPLE_RATE, AudioError
from fun_asr.errors import render
from fun_asr.serve.core.decoder import StreamDecoder
from fun_asr.serve.core.hotword_files import apply_postprocess_hotwords, parse_postprocess_hotwords
from fun_asr.serve.core.limits import RealtimeLimits
from fun_asr.serve.core.requests import DecodeRequest
from fun_asr.serve.core.websocket import (
    Inbox,
    Outbox,
    Slot,
    StreamServer,
    WebSocketProtocol,
    disconnected,
    idle_error,
    log_access,
    new_stats,
    receive,
    refuse_over_limit,
    refused,
    stop_worker,
    too_many_streams,
    work,
)
from fun_asr.serve.protocols.funasr_realtime.protocol import (
    COMMANDS,
    PIECE_BYTES,
    SPK_OFF,
    SPK_ON,
    error_event,
    recognises,
)
from fun_asr.serve.words import REALTIME_NAMES, ClientWords

log = logging.getLogger("fun_asr.server")

NAME = "funasr-realtime"  # the access log's protocol


class _Connection:
    def __init__(self, ws: Any, session: Any, submit: Callable[..., Any], limits: RealtimeLimits,
                 max_new_tokens: int, stats: dict[str, Any], words: ClientWords | None = None) -> None:
        self.ws, self.session, self.submit, self.limits = ws, session, submit, limits
        self.max_new_tokens, self.stats = max_new_tokens, stats
        self.language: str | None = limits.language
        self.hotwords: list[str] = list(limits.hotwords)
        self.client_pairs: dict[str, str] = {}
        self.server_pairs: dict[str, str] = dict(limits.postprocess_hotwords)
        self.stream: Any = None
        self.spk = limits.enable_spk  # this connection's sentences carry speakers (SPK:true|false)
        self.active = False
        self.fed = 0  # samples this stream took
        self.finals = 0  # final results this stream sent
        self.ended_by_limit = False
        self.told_inactive = False  # a run of frames outside a stream gets one error event
        self.told_commands = False  # the first unknown command's error lists the accepted ones, later ones do not
        words = words or ClientWords(session)
        self.out = Outbox(ws, fields=lambda obj: words.fields(obj, names=REALTIME_NAMES))
        # the audio read and not processed yet (the piece being fed counts until it is fed)
        limit_bytes = max(2, int(limits.buffer_seconds * SAMPLE_RATE) * 2)
        self.inbox = Inbox(lambda box: box.queued >= limit_bytes, hold_until_done=True)
        self.max_samples = int(limits.max_seconds * SAMPLE_RATE)
        self.decoder = StreamDecoder(submit, session, lambda: DecodeRequest(self.language, True, tuple(self.hotwords)))

    # -- the reader: one message at a time, none while the queue is full ----------------------------------

    async def run(self) -> None:
        while True:
            await self.inbox.wait_for_room()  # back-pressure: the client's sends wait in TCP
            if not await self._wait_for_outbox():
                with contextlib.suppress(Exception):
                    await asyncio.wait_for(self.ws.close(code=1008, reason="client not reading"), 5.0)
                return
            msg = await receive(self.ws, self.limits.idle_seconds)
            if msg is None:
                await self._idle()
                return
            if disconnected(msg, self.stats):
                return
            text, data = msg.get("text"), msg.get("bytes")
            if text is not None:
                self.told_inactive = False
                await self._command(text.strip())
            elif data is not None:
                self.stats["bytes_in"] += len(data)
                await self._audio(data)

    async def _wait_for_outbox(self) -> bool:
        """Back-pressure for what the server sends: while the send queue is full, no message is read. False
        (the connection is to end) when nothing could be sent for ``idle_seconds``: the client reads nothing."""
        while self.out.full:
            sent = self.out.sent
            try:
                await asyncio.wait_for(self.out.room.wait(), timeout=self.limits.idle_seconds)
            except asyncio.TimeoutError:
                if self.out.sent == sent:
                    log.warning("realtime stream: the client read no result for %g s (%d waiting): closing",
                                self.limits.idle_seconds, len(self.out.items))
                    self.stats.update(status=1008, reason="client not reading")
                    return False
        return True

    async def _audio(self, data: bytes) -> None:
        if not self.active:
            if not self.told_inactive:
                self.told_inactive = True
                if self.ended_by_limit:
                    msg = (f"the stream ended at its length limit ({self._max_words()}): this audio is not "
                           "transcribed, nor any before the next START")
                else:
                    msg = "audio before START is not transcribed: send the text message START first"
                self.out.put({"event": "error", "error": msg})
            return
        if len(data) % 2:
            self.out.put({"event": "error", "error": f"binary frames must be 16 kHz mono int16 PCM (an even number "
                                                     f"of bytes), got {len(data)} bytes: this frame is not "
                                                     "transcribed"})
            return
        for at in range(0, len(data), PIECE_BYTES):  # a big frame enters the queue piece by piece
            await self.inbox.wait_for_room()
            if not self.active:  # the stream ended at its length limit meanwhile (reported there)
                return
            self.inbox.put("audio", data[at : at + PIECE_BYTES])

    # -- the worker: the queued audio, in order -------------------------------------------------------------

    async def work(self) -> None:
        # audio that queued up while the last feed ran is fed in one piece, so that the stream decodes one
        # partial for the newest audio instead of one per stale frame (it catches up)
        await work(self.inbox, lambda _kind, data: self._feed(data), self._failed)

    async def _failed(self, exc: Exception) -> None:
        log.exception("realtime stream: %s", exc)
        self.out.put({"event": "error", "error": f"internal error: {type(exc).__name__}: {exc}"})

    async def _feed(self, data: bytes) -> None:
        stream = self.stream
        if stream is None or stream.closed or not self.active:
            return  # the stream ended at a limit, which was reported
        room = self.max_samples - self.fed
        over = len(data) // 2 > room
        if over:
            data = data[: room * 2]
        if data:
            try:
                events = await anyio.to_thread.run_sync(stream.feed, data)
            except (AudioError, ValueError, RuntimeError) as exc:
                self.out.put({"event": "error", "error": render(exc, "websocket", REALTIME_NAMES)})
                return
            self.fed += len(data) // 2
            self.stats["audio_s"] += len(data) / 2 / SAMPLE_RATE
            self._auto_finals(stream)
            if events:
                self.out.put(stream.response(is_final=False), replaceable=True)
        if over:
            self.out.put({"event": "error", "error": f"stream length limit reached ({self._max_words()}): the audio "
                                                     f"after {self.limits.max_seconds:g} s is not transcribed; this "
                                                     "stream ends here (send START for a new one)"})
            self.ended_by_limit = True
            await self._finish()

    def _auto_finals(self, stream: Any) -> None:
        """Client endpoints: the final results of utterances the stream committed itself (no COMMIT for its
        longest sentence, 30 s), each with its ``notice``."""
        for final in stream.take_auto_commits():
            self.out.put(final)
            self.finals += 1

    def _max_words(self) -> str:
        return f"{self.limits.max_seconds:g} s of audio per stream: fun-asr-serve --stream-max-seconds"

    async def _drain(self) -> None:
        """Waits until the audio queued so far has been processed (commands apply after earlier audio)."""
        await self.inbox.join()

    # -- streams ------------------------------------------------------------------------------------------

    def _postprocess(self, text: str) -> str:
        # FunASR: the command's pairs, then the file's (a file pair wins for the same wrong text)
        return apply_postprocess_hotwords(text, {**self.client_pairs, **self.server_pairs})

    def _new_stream(self) -> Any:
        from fun_asr.asr.stream import StreamOptions

        sopts = StreamOptions(max_new_tokens=self.max_new_tokens, partial_max_new_tokens=min(200, self.max_new_tokens),
                              endpoint=self.limits.endpoint_mode)
        stream = self.session.stream(self.language, True, self.hotwords, max_new_tokens=self.max_new_tokens,
                                     stream_options=sopts, decoder=self.decoder.decode)
        stream.postprocess = self._postprocess
        if self.spk:
            stream.speakers = self._tracker()
        return stream

    def _tracker(self) -> Any:
        from fun_asr.speakers.tracker import SpeakerTracker

        return SpeakerTracker(self.session.embed_speakers)

    async def _final(self, stream: Any, close: bool) -> None:
        """The stream's final result (also after a failure: the sentences so far), after any error event."""
        if close:
            try:
                await anyio.to_thread.run_sync(stream.close)
            except (AudioError, ValueError, RuntimeError) as exc:  # the last sentence could not be decoded
                self.out.put({"event": "error", "error": render(exc, "websocket", REALTIME_NAMES)})
            except Exception as exc:  # noqa: BLE001
                log.exception("realtime stream: %s", exc)
                self.out.put({"event": "error", "error": f"internal error: {type(exc).__name__}: {exc}"})
            if self.limits.endpoint_mode == "client":
                self._auto_finals(stream)
        self.out.put(stream.response(is_final=True))
        self.finals += 1

    async def _finish(self) -> None:
        stream, self.stream, self.active = self.stream, None, False
        if stream is not None:
            if self.limits.endpoint_mode == "client":
                # FunASR: a final when audio came after the last COMMIT; here also when the stream had none
                if stream.uncommitted_samples > 0 or self.finals == 0:
                    await self._final(stream, close=True)
            else:
                await self._final(stream, close=stream.total_samples + stream._pending.size > 0)
        self.out.put({"event": "stopped"})

    async def _idle(self) -> None:
        tail = "; the open stream gets its final result first" if self.active else ""
        self.out.put(error_event(idle_error(self.limits, tail)))
        if self.active:
            await self._drain()
            await self._finish()
        self.stats["status"] = 1000
        await self.out.flush(10.0)
        with contextlib.suppress(Exception):
            await asyncio.wait_for(self.ws.close(code=1000, reason="idle"), 5.0)

    # -- commands -----------------------------------------------------------------------------------------

    def _check(self, language: str | None, hotwords: list[str]) -> None:
        """ValueError/TypeError unless a stream with these options can be opened (the Session's limits)."""
        self.session.options(language, hotwords=hotwords, max_new_tokens=self.max_new_tokens)

    async def _command(self, cmd: str) -> None:
        upper = cmd.upper()
        if upper == "START":
            await self._start()
        elif upper == "STOP":
            await self._drain()
            await self._finish()
        elif upper == "COMMIT":
            await self._commit()
        elif upper.startswith("HOTWORDS:"):
            await self._hotwords(cmd[len("HOTWORDS:"):])
        elif upper.startswith("POSTPROCESS_HOTWORDS:"):
            pairs = parse_postprocess_hotwords(cmd.split(":", 1)[1])
            await self._drain()  # later sentences use them
            self.client_pairs = pairs
            self.out.put({"event": "postprocess_hotwords_set", "postprocess_hotwords": pairs})
        elif upper.startswith("LANGUAGE:"):
            await self._language(cmd[len("LANGUAGE:"):].strip())
        elif upper.startswith("SPK:"):
            await self._spk(cmd[len("SPK:"):].strip())
        else:
            shown = cmd if len(cmd) <= 40 else cmd[:37] + "..."
            if self.told_commands:  # short: a client sending junk fast gets no long answer to each frame
                self.out.put({"event": "error", "error": f"unknown command {shown!r} (the first one's error lists "
                                                         "the accepted ones)"})
            else:
                self.told_commands = True
                self.out.put({"event": "error", "error": f"unknown command {shown!r}: accepted {COMMANDS}"})

    async def _spk(self, value: str) -> None:
        if value.lower() not in SPK_ON + SPK_OFF:
            self.out.put({"event": "error", "error": f"SPK: takes true/1/on/yes or false/0/off/no, got {value[:40]!r}"})
            return
        on = value.lower() in SPK_ON
        if on:
            try:
                await anyio.to_thread.run_sync(lambda: self.session.options(diarize=True))  # may load the model
            except (ValueError, OSError) as exc:
                said = render(exc, "websocket", REALTIME_NAMES)
                self.out.put({"event": "error", "error": f"SPK:{value}: {said}"})  # without server paths: see _Outbox
                return
        await self._drain()  # the audio sent before the command is processed as it was
        self.spk = on
        if self.stream is not None and not self.stream.closed:
            self.stream.speakers = (self.stream.speakers or self._tracker()) if on else None
        self.out.put({"event": "spk_set", "spk": on})

    async def _start(self) -> None:
        if self.active:
            self.out.put({"event": "error", "error": "START during a stream: send STOP first to end it (the stream "
                                                     "started before goes on)"})
            return
        await self._drain()
        try:
            stream = self._new_stream()
        except (ValueError, TypeError) as exc:  # options over the Session's limits
            self.out.put({"event": "error", "error": render(exc, "websocket", REALTIME_NAMES)})
            return
        self.stream, self.active = stream, True
        self.fed, self.finals, self.ended_by_limit = 0, 0, False
        self.stats["streams"] += 1
        self.out.put({"event": "started"})

    async def _commit(self) -> None:
        if self.limits.endpoint_mode != "client":
            self.out.put({"event": "error", "error": "COMMIT requires --endpoint-mode client"})
            return
        if not self.active:
            self.out.put({"event": "error", "error": "Session is not active; send START first"})
            return
        await self._drain()
        stream = self.stream
        if stream is None or not self.active:  # it ended at its length limit while the queue drained
            self.out.put({"event": "error", "error": "Session is not active; send START first"})
            return
        try:
            await anyio.to_thread.run_sync(stream.commit)
        except (AudioError, ValueError, RuntimeError) as exc:
            self.out.put({"event": "error", "error": render(exc, "websocket", REALTIME_NAMES)})
        self._auto_finals(stream)
        self.out.put(stream.response(is_final=True))
        self.finals += 1

    async def _hotwords(self, text: str) -> None:
        words = split_hotwords(text)  # commas (FunASR) or line breaks
        try:
            self._check(self.language, words)  # the Session's hotword limits, before they reach a stream
        except (ValueError, TypeError) as exc:
            self.out.put({"event": "error", "error": render(exc, "websocket", REALTIME_NAMES)})
            return
        await self._drain()  # audio sent before the command was taken with the words before it
        self.hotwords = words
        if self.stream is not None:
            self.stream.opts = dataclasses.replace(self.stream.opts, hotwords=tuple(words))
        self.out.put({"event": "hotwords_set", "hotwords": words})

    async def _language(self, lang: str) -> None:
        try:
            code = self.session.normalize_language(lang or None)
            self._check(code, self.hotwords)
        except (ValueError, TypeError) as exc:
            self.out.put({"event": "error", "error": render(exc, "websocket", REALTIME_NAMES)})
            return
        await self._drain()
        self.language = code
        if self.stream is not None:
            self.stream.opts = dataclasses.replace(self.stream.opts, language=code)
        self.out.put({"event": "language_set", "language": lang})


async def _run(ws: Any, session: Any, submit: Callable[..., Any], limits: RealtimeLimits, max_new_tokens: int,
               stats: dict[str, Any], words: ClientWords | None, release: Callable[[], None]) -> None:
    """One accepted, counted connection: the reader until it ends, then the worker stopped (the audio it is
    feeding now is finished, the rest dropped: nothing of the connection runs on after it), ``release`` (the
    --max-streams slot), what waits to be sent flushed (5 s at most) and the socket closed."""
    from starlette.websockets import WebSocketDisconnect

    conn = _Connection(ws, session, submit, limits, max_new_tokens, stats, words)
    worker = asyncio.create_task(conn.work())
    sender = asyncio.create_task(conn.out.run())
    try:
        await conn.run()
    except WebSocketDisconnect as exc:
        stats["status"] = exc.code
    finally:
        try:
            await stop_worker(worker, conn.inbox)
        finally:
            release()
        conn.stream = None
        await conn.out.flush(5.0)
        sender.cancel()
        with contextlib.suppress(BaseException):
            await sender
        with contextlib.suppress(Exception):
            await asyncio.wait_for(ws.close(), 5.0)  # a client that reads nothing cannot take the close frame


async def handle(ws: Any, session: Any, submit: Callable[..., Any], limits: RealtimeLimits,
                 counter: list[int], max_new_tokens: int, stats: dict[str, Any] | None = None,
                 words: ClientWords | None = None) -> dict[str, Any]:
    """One accepted WebSocket connection (Starlette ``WebSocket``), FunASR's realtime protocol. ``counter``
    holds the connections open now; ``stats`` (filled in, also returned): ``status`` (the close code),
    ``audio_s`` (audio the streams took), ``bytes_in``, ``streams``; ``words``: the server's
    :class:`~fun_asr.serve.words.ClientWords` (None: one for ``session``)."""
    stats = stats if stats is not None else {}
    for key, value in new_stats().items():
        stats.setdefault(key, value)
    await ws.accept()
    if await refuse_over_limit(ws, limits, counter, stats, error_event(too_many_streams(limits))):
        return stats
    await _run(ws, session, submit, limits, max_new_tokens, stats, words, Slot(counter).release)
    return stats


async def serve_websocket(ws: Any, session: Any, batcher: Any, limits: RealtimeLimits, counter: list[int],
                          max_new_tokens: int, *, authorized: bool, words: ClientWords | None = None) -> None:
    """The realtime protocol alone as a route's whole body: refuses the upgrade without the API key (close
    1008: HTTP 403), answers an error event when streams cannot run (no VAD in server endpoint mode: close
    1011), else :func:`handle`; then one JSON access-log line (``fun_asr.access``): ts, id, method
    ``WEBSOCKET``, path (no query string), protocol ``funasr-realtime``, status (the close code; 403 for a
    refused upgrade), ms, audio_s, bytes_in, streams, client."""
    t0 = time.perf_counter()
    stats = new_stats()
    try:
        if await refused(ws, StreamServer(session, batcher, limits, counter, max_new_tokens, words=words),
                         authorized, stats):
            return
        await handle(ws, session, batcher.submit, limits, counter, max_new_tokens, stats, words)
    finally:
        log_access(ws, t0, stats, NAME)


async def serve(ws: Any, server: StreamServer, stats: dict[str, Any], slot: Slot) -> None:
    """An accepted connection the server's table of protocols gave this protocol (counted in ``slot``)."""
    await _run(ws, server.session, server.batcher.submit, server.limits, server.max_new_tokens, stats,
               server.words, slot.release)


PROTOCOL = WebSocketProtocol(NAME, recognises, serve, error_event)

__all__ = ["PROTOCOL", "handle", "serve", "serve_websocket"]
