"""FunASR's realtime WebSocket protocol (1.4.16 ``funasr/bin/realtime_ws.py``, DESIGN §8) over ``Stream``.

Client -> server, text (commands are case-insensitive, as FunASR's):

- ``START`` opens a stream. ``STOP`` ends it: always one result with ``is_final: true`` (also when no
  audio came: then with no sentences), then ``{"event": "stopped"}``.
- ``HOTWORDS:a,b`` (commas or line breaks; replaces the server's ``--hotword-file`` words for this
  connection; ``HOTWORDS:`` clears them) -> ``{"event": "hotwords_set", "hotwords": [...]}``.
- ``LANGUAGE:x`` (empty: automatic; replaces the server's ``--language``) -> ``{"event": "language_set",
  "language": "x"}`` (as sent).
- ``POSTPROCESS_HOTWORDS:wrong=>right,...`` (``=>``, ``->`` or ``→``; a bare word maps to itself; lines
  starting with ``#`` are skipped) -> ``{"event": "postprocess_hotwords_set", "postprocess_hotwords":
  {wrong: right}}``: text replacements in each closed sentence (longest key first), never in partials, on
  top of the server's ``--postprocess-hotword-file``; they do not bias decoding.
- ``COMMIT`` (only with ``--endpoint-mode client``: no VAD runs and the client ends each utterance) ->
  one ``is_final`` result holding that utterance's sentence; the stream goes on. In that mode STOP's
  final result comes when audio arrived after the last COMMIT, or when the stream has had none yet. An
  utterance that reaches 30 s (the longest sentence, ``StreamOptions.max_sentence_s``) without COMMIT is
  committed there by the server: its final result, as COMMIT's, adds ``"notice"`` saying so (FunASR does not
  bound it: its buffer grows until COMMIT). Without the mode: ``{"event": "error", "error": "COMMIT requires
  --endpoint-mode client"}``.
- ``SPK:true`` / ``SPK:false`` turn the speakers of this connection's sentences on or off (``--enable-spk``
  turns them on for every connection, as FunASR's server) -> ``{"event": "spk_set", "spk": true}``. On, each
  locked sentence carries ``"spk"`` (0, 1, ...) as it closes (FunASR's ``HybridSpeakerTracker``: the sentence's
  CAM++ windows clustered with the last 128, ids kept stable by matching speaker centres), and the final result
  (STOP; COMMIT with client endpoints) is re-clustered over all of them, a sentence two speakers share being
  split. ``SPK:true`` on a server without a speaker model gets an error event naming ``--speaker-model``. It
  applies from the next sentence on.

Client -> server, binary (after START): 16 kHz mono little-endian int16 PCM, frames of any size up to the
server's upload limit (``--max-upload-mb``; larger frames close the connection with code 1009): a
recording may come as one frame or many. Server -> client: the events above, ``{"event": "error",
"error": ...}`` (the connection stays usable), and results ``{"sentences": [{"text", "start", "end"}],
"partial", "partial_start_ms", "duration_ms", "is_final"}`` (``sentences`` cumulative; with client
endpoints a result holds the current utterance's sentences only, as FunASR's).

No audio is refused or dropped. A frame is split into pieces of at most 1 s that wait in a queue of
``buffer_seconds`` of audio; while it is full the server stops reading the connection (TCP back-pressure:
the client's sends wait), so a stream that falls behind is transcribed completely, later. Only an explicit
limit ends a stream, with an error event naming it: ``max_seconds`` of audio (the audio past it is not
transcribed; the stream gets its final result) or ``idle_seconds`` without a message (the open stream gets
its final result, then the connection closes). Read ahead per connection: that queue, the frame being split
into it, and the next message in uvicorn (two with its legacy ``websockets`` implementation, whose
``ws_max_queue`` is 1 here, not 32: :func:`uvicorn_ws_options`).

A client that reads results slower than they come gets the newest: a non-final result not yet sent is
replaced by the next (results are cumulative; events and final results are never replaced). What waits to be
sent is bounded (``OUTBOX_MAX_EVENTS`` 256 events or ``OUTBOX_MAX_BYTES`` 1 MB): past it the server stops
reading the connection until the client reads (the same back-pressure), and when nothing could be sent for
``idle_seconds`` meanwhile the connection ends (close 1008, access-log reason ``client not reading``). Only
the first unknown command's error lists the accepted commands. Keepalive pings cannot be answered while
reading waits, so the server's ping timeout is off by default (FunASR's ``--ws-ping-timeout 0``) and
FunASR's clients connect with ``ping_interval=None``. Decoding goes through the server's shared batched
decoder, so concurrent streams share decoding passes. Every connection writes one JSON line to the
``fun_asr.access`` log.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import logging
import os
import time
import uuid
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import anyio
import numpy as np

from fun_asr.asr.prompt import split_hotwords
from fun_asr.audio.decode import SAMPLE_RATE, AudioError
from fun_asr.serve.words import SPEAKERS_REALTIME, ClientWords

log = logging.getLogger("fun_asr.server")
access_log = logging.getLogger("fun_asr.access")

PIECE_BYTES = SAMPLE_RATE * 2  # frames enter a stream's queue in pieces of at most 1 s of audio
DEFAULT_HOTWORD_FILE = "热词列表"  # FunASR's --hotword-file default: read when it exists in the working folder
ENDPOINT_MODES = ("server", "client")
_SPK_ON, _SPK_OFF = ("true", "1", "on", "yes"), ("false", "0", "off", "no")
_ARROWS = ("=>", "->", "→")  # FunASR's postprocess hotword separators, in the order it tries them
COMMANDS = ("START, STOP, HOTWORDS:a,b, LANGUAGE:x, POSTPROCESS_HOTWORDS:wrong=>right, COMMIT (--endpoint-mode "
            "client), SPK:true|false, and binary 16 kHz mono int16 PCM frames")
# events waiting to be sent per connection (the client reads slower than it sends): past either bound the server
# stops reading the connection until the client has read some (non-final results are replaced, never queued up)
OUTBOX_MAX_EVENTS = 256
OUTBOX_MAX_BYTES = 1 << 20


@dataclass(frozen=True)
class RealtimeLimits:
    """Per-connection limits and the server-wide stream defaults (FunASR's realtime-server flags);
    :func:`realtime_limits` builds one from the flags and checks it against the Session."""

    max_streams: int = 16  # concurrent connections; more are refused with an error event (close 1013)
    idle_seconds: float = 60.0  # no message for this long (while the server is reading) closes the connection
    max_seconds: float = 4 * 3600.0  # audio per stream
    buffer_seconds: float = 30.0  # audio read but not processed yet, per stream; past it reading waits
    language: str | None = None  # --language (a normalized code); LANGUAGE: replaces it per connection
    hotwords: tuple[str, ...] = ()  # --hotword-file; HOTWORDS: replaces them per connection
    postprocess_hotwords: tuple[tuple[str, str], ...] = ()  # --postprocess-hotword-file (wrong, right)
    endpoint_mode: str = "server"  # --endpoint-mode: "server" (the VAD ends sentences) or "client" (COMMIT)
    enable_spk: bool = False  # --enable-spk: every stream's sentences carry speakers (SPK:false turns them off)


# -- FunASR's files and the POSTPROCESS_HOTWORDS command ----------------------------------------------------

def read_hotword_file(path: str | os.PathLike[str]) -> list[str]:
    """FunASR's ``--hotword-file``: one hotword per line (each stripped; blank lines skipped; a comma is part
    of its hotword, as FunASR reads the file). UTF-8 (a byte-order mark is skipped)."""
    try:
        text = Path(path).read_text(encoding="utf-8-sig")
    except FileNotFoundError:
        raise ValueError(f"hotword file {str(path)!r} does not exist (FunASR's format: one hotword per line)") from None
    except UnicodeDecodeError as exc:
        raise ValueError(f"hotword file {str(path)!r} is not UTF-8 text ({exc.reason} at byte {exc.start})") from None
    return [line.strip() for line in text.splitlines() if line.strip()]


def _postprocess_line(line: str) -> tuple[str, str] | None:
    """One line of FunASR's postprocess hotwords: ``wrong=>right`` -> (wrong, right); a bare word -> (word,
    word) (FunASR's fuzzy target, which its realtime server does not match fuzzily); a blank line, a ``#``
    comment, or a pair with an empty side -> None."""
    s = line.strip()
    if not s or s.startswith("#"):
        return None
    for arrow in _ARROWS:
        if arrow in s:
            wrong, right = (x.strip() for x in s.split(arrow, 1))
            return (wrong, right) if wrong and right else None
    return s, s


def parse_postprocess_hotwords(payload: str) -> dict[str, str]:
    """The ``POSTPROCESS_HOTWORDS:`` command's text: pairs separated by commas or line breaks."""
    pairs = (_postprocess_line(line) for line in payload.replace(",", "\n").splitlines())
    return {w: r for w, r in (p for p in pairs if p is not None)}


def read_postprocess_hotword_file(path: str | os.PathLike[str]) -> dict[str, str]:
    """FunASR's ``--postprocess-hotword-file``: ``wrong=>right`` per line (a comma belongs to its line)."""
    try:
        text = Path(path).read_text(encoding="utf-8-sig")
    except FileNotFoundError:
        raise ValueError(f"postprocess hotword file {str(path)!r} does not exist (FunASR's format: one "
                         "'wrong=>right' pair per line)") from None
    except UnicodeDecodeError as exc:
        raise ValueError(f"postprocess hotword file {str(path)!r} is not UTF-8 text ({exc.reason} at byte "
                         f"{exc.start})") from None
    pairs = (_postprocess_line(line) for line in text.splitlines())
    return {w: r for w, r in (p for p in pairs if p is not None)}


def apply_postprocess_hotwords(text: str, pairs: dict[str, str]) -> str:
    """FunASR's exact replacements: longest ``wrong`` first, every occurrence, left to right, never inside
    a replacement just made."""
    for wrong in sorted(pairs, key=len, reverse=True):
        right, at = pairs[wrong], 0
        while (i := text.find(wrong, at)) >= 0:
            text = text[:i] + right + text[i + len(wrong):]
            at = i + len(right)
    return text


def realtime_limits(session: Any, *, max_new_tokens: int = 512, max_streams: int = 16, idle_seconds: float = 60.0,
                    max_seconds: float = 4 * 3600.0, buffer_seconds: float = 30.0, language: str | None = None,
                    hotword_file: str | os.PathLike[str] | None = None,
                    postprocess_hotword_file: str | os.PathLike[str] | None = None,
                    endpoint_mode: str = "server", enable_spk: bool = False) -> RealtimeLimits:
    """The realtime limits and server-wide defaults from FunASR's flags, checked against the Session
    (ValueError naming the flag). ``hotword_file`` None reads FunASR's default ``热词列表`` when it exists
    in the working folder (logged)."""
    if isinstance(max_streams, bool) or not isinstance(max_streams, int) or max_streams < 1:
        raise ValueError(f"--max-streams must be a positive integer, got {max_streams!r}")
    for name, value in (("--stream-idle-seconds", idle_seconds), ("--stream-max-seconds", max_seconds),
                        ("--stream-buffer-seconds", buffer_seconds)):
        if not value > 0:
            raise ValueError(f"{name} must be positive, got {value:g}")
    if endpoint_mode not in ENDPOINT_MODES:
        raise ValueError(f"--endpoint-mode must be 'server' (the VAD ends sentences) or 'client' (the client sends "
                         f"COMMIT), got {endpoint_mode!r}")
    words: list[str] = []
    if hotword_file is not None:
        words = read_hotword_file(hotword_file)
        log.info("loaded %d hotwords from %s", len(words), hotword_file)
    elif Path(DEFAULT_HOTWORD_FILE).is_file():  # FunASR's default, as FunASR reads it
        words = read_hotword_file(DEFAULT_HOTWORD_FILE)
        log.warning("read %d hotwords from ./%s (FunASR's default --hotword-file)", len(words), DEFAULT_HOTWORD_FILE)
    pairs = read_postprocess_hotword_file(postprocess_hotword_file) if postprocess_hotword_file is not None else {}
    try:
        code = session.normalize_language(language)
        session.options(code, True, words, max_new_tokens, 30.0)  # the Session's hotword and context limits
    except (ValueError, TypeError) as exc:
        if "max_new_tokens" in str(exc) and "hotword" not in str(exc):
            raise ValueError(str(exc)) from None  # (--max-new-tokens: named by the message itself)
        flag = "--hotword-file" if "hotword" in str(exc) else "--language"
        raise ValueError(f"{flag}: {exc}") from None
    if enable_spk:
        try:
            session.options(diarize=True)  # the speaker model: loaded now, or the reason there is none
        except (ValueError, OSError) as exc:
            raise ValueError(f"--enable-spk: {exc}") from None
    return RealtimeLimits(max_streams, float(idle_seconds), float(max_seconds), float(buffer_seconds), code,
                          tuple(words), tuple(pairs.items()), endpoint_mode, bool(enable_spk))


def uvicorn_ws_options(max_upload_mb: float, ping_interval: float = 20.0, ping_timeout: float = 0.0) -> dict[str, Any]:
    """uvicorn.Config's WebSocket settings: the largest message is the upload limit (a recording may come as
    one frame); uvicorn's legacy ``websockets`` implementation queues at most one received message for the
    handler (``ws_max_queue`` 1; its default, 32, would let one connection park 32 frames of up to the upload
    limit each before the server's back-pressure starts; the websockets-sansio implementation, uvicorn's
    default, and wsproto pause the socket after each message anyway); pings every ``ping_interval`` s; no
    ping timeout unless asked (``<= 0``: off, FunASR's default), since a stream that falls behind is not
    read (back-pressure) and cannot answer a ping."""
    return {"ws_max_size": max(1, int(max_upload_mb * 1024 * 1024)),
            "ws_max_queue": 1,
            "ws_ping_interval": ping_interval if ping_interval > 0 else None,
            "ws_ping_timeout": ping_timeout if ping_timeout > 0 else None}


# -- one connection -----------------------------------------------------------------------------------------

class _Outbox:
    """What the server sends, in order, from one task (the handler never waits on a slow reader). A
    non-final result not yet sent is replaced by a newer one (results are cumulative); the one being sent
    is out of the queue already, so a newer one queues after it. ``full`` past ``max_events`` events or
    ``max_bytes`` of JSON waiting: the connection's reader then stops reading (``room`` is clear). ``words``:
    the message fields (``error``, ``notice``, ...) as the client reads them (no server paths)."""

    def __init__(self, ws: Any, max_events: int = OUTBOX_MAX_EVENTS, max_bytes: int = OUTBOX_MAX_BYTES,
                 words: ClientWords | None = None) -> None:
        self.ws = ws
        self.words = words
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
        if self.words is not None:
            obj = self.words.fields(obj, speakers=SPEAKERS_REALTIME)
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
        self.out = _Outbox(ws, words=words or ClientWords(session))
        self.queue: asyncio.Queue[bytes] = asyncio.Queue()
        self.queued = 0  # bytes waiting in the queue
        self.limit_bytes = max(2, int(limits.buffer_seconds * SAMPLE_RATE) * 2)
        self.room = asyncio.Event()
        self.room.set()
        self.max_samples = int(limits.max_seconds * SAMPLE_RATE)

    # -- the reader: one message at a time, none while the queue is full ----------------------------------

    async def run(self) -> None:
        while True:
            await self._wait_for_room()
            if not await self._wait_for_outbox():
                with contextlib.suppress(Exception):
                    await asyncio.wait_for(self.ws.close(code=1008, reason="client not reading"), 5.0)
                return
            try:
                msg = await asyncio.wait_for(self.ws.receive(), timeout=self.limits.idle_seconds)
            except asyncio.TimeoutError:
                await self._idle()
                return
            if msg.get("type") == "websocket.disconnect":
                self.stats["status"] = int(msg.get("code") or 1005)
                return
            text, data = msg.get("text"), msg.get("bytes")
            if text is not None:
                self.told_inactive = False
                await self._command(text.strip())
            elif data is not None:
                self.stats["bytes_in"] += len(data)
                await self._audio(data)

    async def _wait_for_room(self) -> None:
        while self.queued >= self.limit_bytes:  # back-pressure: the client's sends wait in TCP
            self.room.clear()
            await self.room.wait()

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
            await self._wait_for_room()
            if not self.active:  # the stream ended at its length limit meanwhile (reported there)
                return
            piece = data[at : at + PIECE_BYTES]
            self.queued += len(piece)
            self.queue.put_nowait(piece)

    # -- the worker: the queued audio, in order -------------------------------------------------------------

    async def work(self) -> None:
        while True:
            pieces = [await self.queue.get()]
            # audio that queued up while the last feed ran is fed in one piece, so that the stream decodes
            # one partial for the newest audio instead of one per stale frame (it catches up)
            while not self.queue.empty():
                pieces.append(self.queue.get_nowait())
            data = b"".join(pieces)
            try:
                await self._feed(data)
            except Exception as exc:  # noqa: BLE001 - must not kill the worker (STOP waits on the queue)
                log.exception("realtime stream: %s", exc)
                self.out.put({"event": "error", "error": f"internal error: {type(exc).__name__}: {exc}"})
            finally:
                self.queued -= len(data)
                self.room.set()
                for _ in pieces:
                    self.queue.task_done()

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
                self.out.put({"event": "error", "error": str(exc)})
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
        await self.queue.join()

    # -- streams ------------------------------------------------------------------------------------------

    def _decoder(self, audio: np.ndarray, max_new: int, draft: list[int] | None = None,
                 partial: bool = False, speculative: bool = False) -> tuple[str, list[int]] | None:
        seconds = min(self.session.max_segment_seconds, max(30.0, audio.size / SAMPLE_RATE + 1.0))
        result = self.submit(audio, (self.language, True, tuple(self.hotwords), max_new, seconds, False, False),
                             "stream", draft, partial, speculative).result()
        if result is None:  # a partial the batcher skipped (busy with closed sentences): the stream asks again
            return None
        return result.text, [t for s in result.segments for t in s.tokens]

    def _postprocess(self, text: str) -> str:
        # FunASR: the command's pairs, then the file's (a file pair wins for the same wrong text)
        return apply_postprocess_hotwords(text, {**self.client_pairs, **self.server_pairs})

    def _new_stream(self) -> Any:
        from fun_asr.asr.stream import StreamOptions

        sopts = StreamOptions(max_new_tokens=self.max_new_tokens, partial_max_new_tokens=min(200, self.max_new_tokens),
                              endpoint=self.limits.endpoint_mode)
        stream = self.session.stream(self.language, True, self.hotwords, max_new_tokens=self.max_new_tokens,
                                     stream_options=sopts, decoder=self._decoder)
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
                self.out.put({"event": "error", "error": str(exc)})
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
        self.out.put({"event": "error", "error": f"idle for {self.limits.idle_seconds:g} s (the idle limit: fun-asr-"
                                                 f"serve --stream-idle-seconds): closing the connection{tail}"})
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
        self.session.options(language, True, hotwords, self.max_new_tokens, 30.0)

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
        if value.lower() not in _SPK_ON + _SPK_OFF:
            self.out.put({"event": "error", "error": f"SPK: takes true/1/on/yes or false/0/off/no, got {value[:40]!r}"})
            return
        on = value.lower() in _SPK_ON
        if on:
            try:
                await anyio.to_thread.run_sync(lambda: self.session.options(diarize=True))  # may load the model
            except (ValueError, OSError) as exc:
                self.out.put({"event": "error", "error": f"SPK:{value}: {exc}"})  # in its words: see _Outbox
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
            self.out.put({"event": "error", "error": _protocol_words(str(exc))})
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
            self.out.put({"event": "error", "error": str(exc)})
        self._auto_finals(stream)
        self.out.put(stream.response(is_final=True))
        self.finals += 1

    async def _hotwords(self, text: str) -> None:
        words = split_hotwords(text)  # commas (FunASR) or line breaks
        try:
            self._check(self.language, words)  # the Session's hotword limits, before they reach a stream
        except (ValueError, TypeError) as exc:
            self.out.put({"event": "error", "error": _protocol_words(str(exc))})
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
            self.out.put({"event": "error", "error": str(exc)})
            return
        await self._drain()
        self.language = code
        if self.stream is not None:
            self.stream.opts = dataclasses.replace(self.stream.opts, language=code)
        self.out.put({"event": "language_set", "language": lang})


async def handle(ws: Any, session: Any, submit: Callable[..., Any], limits: RealtimeLimits,
                 counter: list[int], max_new_tokens: int, stats: dict[str, Any] | None = None,
                 words: ClientWords | None = None) -> dict[str, Any]:
    """One accepted WebSocket connection (Starlette ``WebSocket``), FunASR's realtime protocol. ``counter``
    holds the connections open now; ``stats`` (filled in, also returned): ``status`` (the close code),
    ``audio_s`` (audio the streams took), ``bytes_in``, ``streams``; ``words``: the server's
    :class:`~fun_asr.serve.words.ClientWords` (None: one for ``session``)."""
    from starlette.websockets import WebSocketDisconnect

    stats = stats if stats is not None else {}
    for key, value in (("status", 1000), ("audio_s", 0.0), ("bytes_in", 0), ("streams", 0)):
        stats.setdefault(key, value)
    await ws.accept()
    if counter[0] >= limits.max_streams:
        await ws.send_text(json.dumps({"event": "error", "error": f"too many concurrent streams (limit "
                                       f"{limits.max_streams}: fun-asr-serve --max-streams); try again later"}))
        await ws.close(code=1013)
        stats["status"] = 1013
        return stats
    counter[0] += 1
    conn = _Connection(ws, session, submit, limits, max_new_tokens, stats, words)
    worker = asyncio.create_task(conn.work())
    sender = asyncio.create_task(conn.out.run())
    try:
        await conn.run()
    except WebSocketDisconnect as exc:
        stats["status"] = exc.code
    finally:
        counter[0] -= 1
        worker.cancel()
        with contextlib.suppress(BaseException):
            await worker
        conn.stream = None
        await conn.out.flush(5.0)
        sender.cancel()
        with contextlib.suppress(BaseException):
            await sender
        with contextlib.suppress(Exception):
            await asyncio.wait_for(ws.close(), 5.0)  # a client that reads nothing cannot take the close frame
    return stats


async def serve_websocket(ws: Any, session: Any, batcher: Any, limits: RealtimeLimits, counter: list[int],
                          max_new_tokens: int, *, authorized: bool, words: ClientWords | None = None) -> None:
    """The realtime route's whole body: refuses the upgrade without the API key (close 1008: HTTP 403),
    answers an error event when streams cannot run (no VAD in server endpoint mode: close 1011), else
    :func:`handle`; then one JSON access-log line (``fun_asr.access``): ts, id, method ``WEBSOCKET``, path
    (no query string), protocol ``funasr-realtime``, status (the close code; 403 for a refused upgrade), ms,
    audio_s, bytes_in, streams, client."""
    t0 = time.perf_counter()
    stats: dict[str, Any] = {"status": 1000, "audio_s": 0.0, "bytes_in": 0, "streams": 0}
    try:
        if not authorized:
            stats.update(status=403, reason="api key")
            await ws.close(code=1008)  # before accept: the upgrade is refused (HTTP 403)
            return
        if limits.endpoint_mode == "server" and session.vad is None:
            await ws.accept()
            await ws.send_text(json.dumps({"event": "error", "error": "streaming needs the FSMN-VAD; start the "
                                                                      "server with --vad fsmn (or --vad-model), or "
                                                                      "with --endpoint-mode client"}))
            await ws.close(code=1011)
            stats["status"] = 1011
            return
        if batcher is None:
            raise RuntimeError("the server's decoder is not running (the app's lifespan has not started)")
        await handle(ws, session, batcher.submit, limits, counter, max_new_tokens, stats, words)
    finally:
        line = {"ts": round(time.time(), 3), "id": ws.headers.get("x-request-id") or uuid.uuid4().hex[:16],
                "method": "WEBSOCKET", "path": ws.url.path, "protocol": "funasr-realtime", "status": stats["status"],
                "ms": round((time.perf_counter() - t0) * 1e3, 1), "audio_s": round(stats["audio_s"], 3),
                "bytes_in": stats["bytes_in"], "streams": stats["streams"],
                "client": ws.client.host if ws.client else None}
        if "reason" in stats:
            line["reason"] = stats["reason"]
        access_log.info("%s", json.dumps(line, ensure_ascii=False))


def _protocol_words(msg: str) -> str:
    """A Session limit in the protocol's words (``HOTWORDS:``), not the Python API's ``Limits`` fields."""
    if " (Session(limits=Limits(max_hotwords=...)))" in msg or (msg.startswith("hotword ") and "characters" in msg):
        msg = "HOTWORDS: " + msg.replace(" (Session(limits=Limits(max_hotwords=...)))", "")
    return msg


__all__ = ["RealtimeLimits", "apply_postprocess_hotwords", "handle", "parse_postprocess_hotwords",
           "read_hotword_file", "read_postprocess_hotword_file", "realtime_limits", "serve_websocket",
           "uvicorn_ws_options"]
