"""FunASR's runtime WebSocket protocol (funasr-runtime's 2pass server: online, offline, 2pass) over ``Stream``.

``serve_websocket`` accepts a connection and tells the protocols apart by its first message: a JSON object
is this protocol; anything else (``START``, ``LANGUAGE:x``, ``HOTWORDS:a,b``, binary audio ...) goes to the
realtime protocol (:func:`fun_asr.serve.ws_realtime.handle`) with that first message replayed.

Client -> server (as ``runtime/python/websocket/funasr_wss_client.py`` and ``runtime/html5`` send it):

- a JSON object with any of ``mode`` (``online`` | ``offline`` | ``2pass``, default 2pass), ``chunk_size``
  (``[5, 10, 5]``: 60 ms units; the middle one sets how often the online pass decodes), ``chunk_interval``,
  ``encoder_chunk_look_back``, ``decoder_chunk_look_back`` (streaming-Paraformer settings: checked, no
  effect here), ``wav_name``, ``wav_format`` (``pcm``, any case: raw 16-bit little-endian mono at
  ``audio_fs``; anything else, or PCM that starts with a RIFF/WAVE header, is a file decoded when it ends),
  ``audio_fs`` (PCM rate, resampled to 16 kHz with soxr), ``is_speaking``, ``hotwords`` (a JSON string of
  ``{word: weight}``, a JSON list, or a plain comma/line separated string; weights have no effect on
  Fun-ASR-Nano's prompt hotwords), ``itn``, ``svs_itn`` (used when ``itn`` is absent), ``svs_lang``
  (``auto`` or a language);
- binary frames of audio (PCM may split samples across frames);
- ``{"is_speaking": false}`` (or ``"is_finished": true``) ends the utterance; with ``"is_end": true`` (the
  newest client) the server also acknowledges it once everything is sent:
  ``{"mode", "wav_name", "text": "", "is_final": <no error>, "is_end": true[, "error"]}``. The connection
  stays open for another utterance with the same settings.

Server -> client: ``{"mode", "text", "wav_name", "is_final"}`` with ``mode`` ``2pass-online`` (the online
pass: new text of the open sentence, appended to what was sent, as the clients concatenate it),
``2pass-offline`` (the offline pass: the whole sentence, decoded in full by Fun-ASR-Nano once the VAD closes
it, replacing its online text), or ``online`` / ``offline`` in those modes. ``is_final`` is true on the last
message of an utterance only (after ``is_speaking: false``; an empty ``text`` when nothing was left). With a
CTC head (the ModelScope checkpoint) offline-pass messages also carry ``timestamp``, a JSON *string*
``"[[start_ms,end_ms],...]"`` with one pair per unit the html5 page counts (a word of ASCII letters, else a
character), and ``stamp_sents``, ``[{"text_seg", "punc", "start", "end", "ts_list"}]``. Problems give
``"error"`` (and ``"warning"``) fields in these messages; nothing is dropped silently.

Limits are the realtime protocol's (docs/funasr_compat.md): ``--max-streams`` counts a connection from its
accept, ``--stream-max-seconds`` ends an utterance as ws_realtime ends a stream (the connection stays open),
and the read-ahead is bounded by ``--stream-buffer-seconds`` of audio and ``MAX_QUEUED_TEXTS`` text messages.
"""

from __future__ import annotations

import asyncio
import bisect
import contextlib
import dataclasses
import json
import logging
import re
import time
import uuid
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import anyio
import numpy as np

from fun_asr.asr.ctc import funasr_text
from fun_asr.asr.prompt import split_hotwords
from fun_asr.audio.decode import SAMPLE_RATE, AudioError, Limits, decode_audio
from fun_asr.serve.words import ClientWords
from fun_asr.serve.ws_realtime import RealtimeLimits, apply_postprocess_hotwords
from fun_asr.serve.ws_realtime import serve_websocket as realtime_serve

log = logging.getLogger("fun_asr.server")
access_log = logging.getLogger("fun_asr.access")

MODES = ("online", "offline", "2pass")
OUT_MODES = {"online": ("online", "online"), "offline": ("offline", "offline"),
             "2pass": ("2pass-online", "2pass-offline")}  # (online pass, offline pass)
DEFAULT_WAV_NAME = "wav-default-id"  # funasr-runtime's default
MAX_FILE_MB = 100.0  # a non-PCM upload is held in memory until it ends (the server's --max-upload-mb default)
MAX_QUEUED_TEXTS = 64  # text messages read ahead of the worker; past it (or the audio bound) reading waits
MAX_WAV_NAME = 256  # characters of wav_name kept (it is echoed in every reply): a longer one is cut, with a warning
MAX_NAMED = 64  # unknown field names remembered per connection (each is named in one warning)
# known FunASR fields that have nothing to do here (accepted as FunASR's servers accept them)
_NO_EFFECT = ("chunk_interval", "encoder_chunk_look_back", "decoder_chunk_look_back")
_KNOWN = {"mode", "chunk_size", "wav_name", "wav_format", "audio_fs", "is_speaking", "is_finished", "is_end",
          "hotwords", "itn", "svs_itn", "svs_lang", *_NO_EFFECT}
# containers soundfile cannot read: refused when announced, instead of after the whole upload
_UNREADABLE = {"m4a", "mp4", "aac", "amr", "wma", "webm", "mkv", "mov", "avi", "3gp", "mpeg", "ts"}
_FILE_FORMATS = "wav, flac, ogg (vorbis/opus), mp3, aiff, or 'others' for any of these"


# -- settings -----------------------------------------------------------------------------------------

@dataclass(frozen=True)
class _Config:
    mode: str = "2pass"
    chunk_size: tuple[int, int, int] = (5, 10, 5)
    wav_name: str = DEFAULT_WAV_NAME
    wav_format: str = "pcm"
    audio_fs: int = SAMPLE_RATE
    hotwords: tuple[str, ...] = ()
    itn: bool = True
    language: str | None = None

    @property
    def pcm(self) -> bool:
        return self.wav_format.lower() == "pcm"

    @property
    def online_ms(self) -> int:
        """How often the online pass decodes the open sentence: the streaming model's chunk (chunk_size[1] x
        60 ms, 600 ms for [5, 10, 5])."""
        return max(60, self.chunk_size[1] * 60)


# fields that shape a running utterance: a change mid-utterance applies from the next one
_PER_UTTERANCE = ("mode", "chunk_size", "wav_format", "audio_fs", "hotwords", "itn", "language")


def _bool(name: str, value: Any) -> bool:
    if isinstance(value, bool):
        return value
    if isinstance(value, int) and value in (0, 1):
        return bool(value)
    raise ValueError(f"{name} must be true or false, got {value!r}")


def _int(name: str, value: Any, low: int, high: int | None = None) -> int:
    if isinstance(value, str) and value.strip().isdigit():
        value = int(value.strip())
    if isinstance(value, bool) or not isinstance(value, int) or value < low or (high is not None and value > high):
        top = f" and at most {high}" if high is not None else ""
        raise ValueError(f"{name} must be an integer of at least {low}{top}, got {value!r}")
    return value


def _chunk_size(value: Any) -> tuple[int, int, int]:
    parts = value.split(",") if isinstance(value, str) else value
    try:
        if not isinstance(parts, list | tuple) or len(parts) != 3:
            raise ValueError
        nums = tuple(_int("chunk_size", p.strip() if isinstance(p, str) else p, 0) for p in parts)
    except ValueError:
        nums = ()
    if len(nums) != 3 or nums[1] < 1:
        raise ValueError(f"chunk_size must be three integers [look-back, chunk, look-ahead] in 60 ms units with a "
                         f"chunk of at least 1 (e.g. [5, 10, 5]), got {value!r}")
    return nums  # type: ignore[return-value]


def _weighted(d: dict) -> list[str]:
    words = []
    for word, weight in d.items():
        if isinstance(weight, bool) or not isinstance(weight, int | float):
            raise ValueError(f"hotwords: the weight of {str(word)[:20]!r} must be a number ({{\"word\": 20}}), "
                             f"got {weight!r}")
        words.append(str(word))
    return words


def parse_hotwords(value: Any) -> list[str]:
    """The words of FunASR's ``hotwords`` field: a JSON string of ``{word: weight}`` (html5, the client with a
    hotword file), a JSON list of words, a plain string separated by commas or line breaks (the newest client
    joins its file's words with commas), or the same as a JSON value; empty or null -> none."""
    if value is None:
        return []
    if isinstance(value, dict):
        return _weighted(value)
    if isinstance(value, list):
        if not all(isinstance(w, str) for w in value):
            raise ValueError("hotwords: a list must hold strings")
        return [w.strip() for w in value if w.strip()]
    if not isinstance(value, str):
        raise ValueError(f"hotwords must be a string ('{{\"word\": 20}}' or 'a,b'), got {type(value).__name__}")
    text = value.strip()
    if text[:1] in ("{", "["):
        try:
            parsed = json.loads(text)
        except json.JSONDecodeError:
            parsed = None  # a plain string that starts with a bracket (funasr-runtime: its "nn" hotwords)
        if isinstance(parsed, dict | list):
            return parse_hotwords(parsed)
    return split_hotwords(text)


def _limit_words(msg: str) -> str:
    """A Session limit in the protocol's words, without the Python API's ``Limits`` hint."""
    return msg.replace(" (Session(limits=Limits(max_hotwords=...)))", "")


# -- text: units, the online pass, separators -----------------------------------------------------------

_CJK = "\u2e80-\u9fff\uac00-\ud7af\uf900-\ufaff\uff00-\uffef"
_UNIT = re.compile(rf"\s*(?:[{_CJK}]|[^\s{_CJK}]+)")
_CJK_CHAR = re.compile(rf"[{_CJK}]")


def _units(text: str) -> list[str]:
    """Words (with the space before them) and single CJK characters: what the online pass commits."""
    return _UNIT.findall(text)


def _sep(tail: str, text: str) -> str:
    """The space between two sentences when both sides are not CJK (the clients concatenate texts)."""
    if not tail or not text or tail.isspace() or text[0].isspace():
        return ""
    return "" if _CJK_CHAR.match(tail) or _CJK_CHAR.match(text[0]) else " "


class _Online:
    """The online pass of one open sentence: partial decodes re-decode the whole sentence so far, and the
    clients append each message's text, so only what two consecutive partials agree on is sent (units,
    never retracted)."""

    def __init__(self) -> None:
        self.reset()

    def reset(self) -> None:
        self.sent: list[str] = []
        self.prev: list[str] | None = None
        self.start: int | None = None

    def partial(self, text: str, start: int) -> tuple[str, bool]:
        """(new text to send, whether it is the sentence's first)."""
        units = _units(text)
        self.start = start
        if self.prev is None:
            self.prev = units
            return "", False
        agreed: list[str] = []
        for a, b in zip(self.prev, units, strict=False):
            if a != b:
                break
            agreed.append(a)
        self.prev = units
        n = len(self.sent)
        if len(agreed) <= n or agreed[:n] != self.sent:
            return "", False
        self.sent = agreed
        return "".join(agreed[n:]), n == 0

    def final(self, text: str) -> tuple[str, bool]:
        """The rest of the closed sentence's text after what was sent (online mode: append-only)."""
        units = _units(text)
        n = len(self.sent)
        self.reset()
        return "".join(units[n:]), n == 0


# -- timestamps -----------------------------------------------------------------------------------------

_HTML5_SPLIT = set("。？，、?., ")  # html5 handleWithTimestamp splits the text at these (and ',')
_PIECE_END = _HTML5_SPLIT - {" "}  # they close a stamp_sents piece (funasr-runtime: ，。？、,? ; we add '.')
_LETTERS = re.compile(r"[A-Za-z]+")


def _char_times(result: Any, tokenizer: Any) -> list[tuple[str, int, int]] | None:
    """(char, start_ms, end_ms) for every non-space character of a decode's text, from its CTC token times
    (relative to the decoded audio); None when there are none or they cannot be matched to the text."""
    out: list[tuple[str, int, int]] = []
    for seg in result.segments:
        if not seg.text.strip():
            continue
        words = seg.words or []
        if not words:
            return None
        for variant in (funasr_text(v) for v in (seg.text, " " + seg.text, seg.text + " ", " " + seg.text + " ")):
            ids = tokenizer.encode(variant)
            if len(ids) == len(words) and all(tokenizer.decode([i]) == w["word"] for i, w in zip(ids, words,
                                                                                                  strict=True)):
                break
        else:
            return None
        ends = np.cumsum([len(tokenizer.decoder.get(int(i), b"")) for i in ids]).tolist()  # byte end per token
        pos = 0
        for ch in variant:
            n = len(ch.encode("utf-8"))
            first = bisect.bisect_right(ends, pos)
            last = bisect.bisect_right(ends, pos + n - 1)
            pos += n
            if ch.isspace():
                continue
            if last >= len(words):
                return None
            out.append((ch, int(round(words[first]["start"] * 1000)), int(round(words[last]["end"] * 1000))))
    return out or None


def stamps(text: str, times: list[tuple[str, int, int]], offset_ms: int) -> dict[str, Any]:
    """``timestamp`` (a JSON string, one [start, end] per unit the html5 page counts: a word of ASCII letters,
    else each UTF-16 code unit of a word) and ``stamp_sents`` for ``text``, from per-character times; {}
    when the times do not fit the text."""
    chars = [c for c in text if not c.isspace()]
    if [c for c, _, _ in times] != chars or any(c.isspace() and c != " " for c in text):
        return {}  # (the page splits at plain spaces only)
    it = iter(times)
    pairs: list[list[int]] = []
    pieces: list[dict[str, Any]] = []
    seg_units: list[str] = []
    seg_ts: list[list[int]] = []
    word: list[tuple[str, int, int]] = []

    def flush_word() -> None:
        if not word:
            return
        w = "".join(c for c, _, _ in word)
        if _LETTERS.fullmatch(w):
            ts = [offset_ms + min(a for _, a, _ in word), offset_ms + max(b for _, _, b in word)]
            pairs.append(ts)
            seg_units.append(w)
            seg_ts.append(ts)
        else:
            for c, a, b in word:
                ts = [offset_ms + a, offset_ms + b]
                pairs.extend([ts] * (len(c.encode("utf-16-le")) // 2))
                seg_units.append(c)
                seg_ts.append(ts)
        word.clear()

    def close_piece(punc: str) -> None:
        if seg_ts:
            pieces.append({"text_seg": " ".join(seg_units), "punc": punc, "start": seg_ts[0][0],
                           "end": seg_ts[-1][1], "ts_list": [list(t) for t in seg_ts]})
        seg_units.clear()
        seg_ts.clear()

    for c in text:
        timed = None if c.isspace() else next(it)
        if c in _HTML5_SPLIT or c.isspace():
            flush_word()
            if c in _PIECE_END:
                close_piece(c)
        else:
            assert timed is not None
            word.append(timed)
    flush_word()
    close_piece("")
    if not pairs:
        return {}
    return {"timestamp": json.dumps(pairs, separators=(",", ":")), "stamp_sents": pieces}


# -- one utterance --------------------------------------------------------------------------------------

@dataclass
class _Utterance:
    cfg: _Config
    stream: Any = None
    file: bytearray | None = None  # non-PCM input, decoded when the utterance ends
    carry: bytes = b""  # half a PCM sample split across frames
    got_audio: bool = False
    errors: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    online: _Online = field(default_factory=_Online)
    tail: str = ""  # the last character the client shows (sentence separators)
    records: deque = field(default_factory=deque)  # (text, Transcription) of each decode, in order
    refused: int = 0  # bytes not decoded because of an error
    fed: int = 0  # PCM bytes the stream took (--stream-max-seconds of them at most)


class _Replay:
    """The Starlette WebSocket for ``ws_realtime``: already accepted (a second accept does nothing), its first
    ``receive`` returns the message read to tell the protocols apart; everything else (``send_text``,
    ``close``, ``headers``, ...) is the socket's. ws_realtime reads with ``receive`` only: the socket's other
    readers (``receive_text``, ``iter_json``, ...) would skip the replayed message, so there are none."""

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


def _too_many(limits: RealtimeLimits) -> str:
    return (f"too many concurrent streams (limit {limits.max_streams}: fun-asr-serve --max-streams); try again "
            "later")


async def serve_websocket(ws: Any, session: Any, batcher: Any, limits: RealtimeLimits, counter: list[int],
                          max_new_tokens: int, *, authorized: bool, max_file_mb: float = MAX_FILE_MB,
                          words: ClientWords | None = None) -> None:
    """The WebSocket route's whole body, in place of :func:`fun_asr.serve.ws_realtime.serve_websocket` (same
    arguments, and ``max_file_mb``: the largest non-PCM upload, the server's --max-upload-mb): a refused API
    key, a server without its decoder or without the VAD go to it at once (it refuses before accepting, or
    answers one error event); otherwise the connection is accepted (with the ``binary`` subprotocol when the
    client offers it, as FunASR's servers do) and counted in ``counter`` (--max-streams) from then on, also
    while its first message is awaited: past the limit it is refused at once (close 1013) with one message
    both protocols' clients read (realtime's error event and the runtime protocol's failed acknowledgement in
    one). Its first message decides: a JSON object is FunASR's runtime protocol (one ``fun_asr.access`` line
    per connection, as the realtime protocol writes), anything else the realtime protocol, with that message
    replayed. ``words``: the server's :class:`~fun_asr.serve.words.ClientWords` (messages without server paths;
    None: one for ``session``)."""
    if not authorized or batcher is None or (limits.endpoint_mode == "server" and session.vad is None):
        # refused before accepting / an error event; both protocols need the VAD to close sentences
        await realtime_serve(ws, session, batcher, limits, counter, max_new_tokens, authorized=authorized,
                             words=words)
        return
    words = words or ClientWords(session)
    offered = ws.scope.get("subprotocols") or []
    await ws.accept(subprotocol="binary" if "binary" in offered else None)
    t0 = time.perf_counter()
    stats: dict[str, Any] = {"status": 1000, "audio_s": 0.0, "bytes_in": 0, "streams": 0}
    if counter[0] >= limits.max_streams:
        with contextlib.suppress(Exception):
            await ws.send_text(json.dumps({"event": "error", "error": _too_many(limits), "mode": "2pass", "text": "",
                                           "wav_name": DEFAULT_WAV_NAME, "is_final": False, "is_end": True}))
            await ws.close(code=1013)
        stats["status"] = 1013
        _access(ws, t0, stats, "none")
        return
    counter[0] += 1  # held from the accept (as ws_realtime counts), so idle sockets cannot pile up
    held = True
    try:
        try:
            first = await asyncio.wait_for(ws.receive(), timeout=limits.idle_seconds)
        except asyncio.TimeoutError:
            with contextlib.suppress(Exception):
                await ws.send_text(json.dumps({"event": "error", "error": f"idle for {limits.idle_seconds:g} s (the "
                                               "idle limit: fun-asr-serve --stream-idle-seconds): closing the "
                                               "connection"}))
                await ws.close(code=1000, reason="idle")
            _access(ws, t0, stats, "none")
            return
        if first.get("type") == "websocket.disconnect":
            stats["status"] = int(first.get("code") or 1005)
            _access(ws, t0, stats, "none")
            return
        text = first.get("text")
        if text is None or not text.lstrip().startswith("{"):
            # ws_realtime.handle counts the connection itself: the slot passes to it with no await in between
            # (its accept here is a no-op that does not suspend), so no other connection can take it meanwhile
            counter[0] -= 1
            held = False
            await realtime_serve(_Replay(ws, first), session, batcher, limits, counter, max_new_tokens,
                                 authorized=True, words=words)
            return
        try:
            await _TwoPass(ws, session, batcher.submit, limits, max_new_tokens, max_file_mb, stats,
                           words).run(text)
        finally:
            _access(ws, t0, stats, "funasr-runtime")
    finally:
        if held:
            counter[0] -= 1


def _access(ws: Any, t0: float, stats: dict[str, Any], protocol: str) -> None:
    """One JSON access-log line per connection (``fun_asr.access``), the realtime protocol's fields + protocol."""
    line = {"ts": round(time.time(), 3), "id": ws.headers.get("x-request-id") or uuid.uuid4().hex[:16],
            "method": "WEBSOCKET", "path": ws.url.path, "protocol": protocol, "status": stats["status"],
            "ms": round((time.perf_counter() - t0) * 1e3, 1), "audio_s": round(stats["audio_s"], 3),
            "bytes_in": stats["bytes_in"], "streams": stats["streams"],
            "client": ws.client.host if ws.client else None}
    access_log.info("%s", json.dumps(line, ensure_ascii=False))


class _TwoPass:
    """One connection of the runtime protocol: a reader (messages in order into a queue, bounded by the audio
    and text waiting, and by the number of text messages: past either the reader stops reading, so the
    client's sends wait) and a worker."""

    def __init__(self, ws: Any, session: Any, submit: Callable[..., Any],
                 limits: RealtimeLimits, max_new_tokens: int, max_file_mb: float, stats: dict[str, Any],
                 words: ClientWords | None = None) -> None:
        self.ws, self.session, self.submit, self.limits = ws, session, submit, limits
        self.client_words = words or ClientWords(session)  # error/warning fields as the client reads them
        self.max_new, self.stats = max_new_tokens, stats
        self.max_file_bytes = int(max_file_mb * 1024 * 1024)
        # the server's --language and --hotword-file are the defaults (funasr-runtime adds its hotword file's
        # words to the client's); its --postprocess-hotword-file applies to every closed sentence
        self.server_words = tuple(limits.hotwords)
        self.pairs = dict(limits.postprocess_hotwords)
        self.cfg = _Config(language=limits.language)
        self.utt: _Utterance | None = None
        self.items: deque[tuple[str, Any]] = deque()
        self.queued = 0  # bytes of audio and characters of text waiting
        self.texts = 0  # text messages waiting
        self.has_items = asyncio.Event()
        self.space = asyncio.Event()
        self.busy = False
        self.named: set[str] = set()  # unknown fields already named in a warning (each once per connection)

    # -- plumbing ---------------------------------------------------------------------------------------

    async def send(self, obj: dict[str, Any]) -> None:
        obj = self.client_words.fields(obj)  # (every message passes here: none carries a server path)
        with contextlib.suppress(Exception):
            await self.ws.send_text(json.dumps(obj, ensure_ascii=False))

    def message(self, mode: str, text: str, is_final: bool = False, **extra: Any) -> dict[str, Any]:
        return {"mode": mode, "text": text, "wav_name": self.cfg.wav_name, "is_final": is_final, **extra}

    async def error(self, msg: str, fatal_for_utterance: bool = True) -> None:
        """An ``error`` message now (in the shape of a result, with empty text, so that every client shows it
        harmlessly); ``fatal_for_utterance``: the utterance's acknowledgement reports it too."""
        log.info("runtime websocket %r: %s", self.cfg.wav_name, msg)
        if fatal_for_utterance and self.utt is not None:
            self.utt.errors.append(msg)
        await self.send(self.message(OUT_MODES[self.cfg.mode][1], "", False, error=msg))

    def _limit_bytes(self) -> int:
        return max(64 * 1024, int(self.limits.buffer_seconds * self.cfg.audio_fs) * 2)

    def _full(self) -> bool:
        return self.queued > self._limit_bytes() or self.texts >= MAX_QUEUED_TEXTS

    async def run(self, first: str) -> None:
        from starlette.websockets import WebSocketDisconnect

        if self.session.vad is None:
            await self.send({"mode": "2pass", "text": "", "wav_name": DEFAULT_WAV_NAME, "is_final": False,
                             "is_end": True, "error": "streaming needs the FSMN-VAD; start the server with --vad "
                                                      "fsmn (or --vad-model)"})
            self.stats["status"] = 1011
            with contextlib.suppress(Exception):
                await self.ws.close(code=1011)
            return
        task = asyncio.create_task(self.worker())
        try:
            self.push("text", first)
            while not task.done():
                try:
                    msg = await asyncio.wait_for(self.ws.receive(), timeout=self.limits.idle_seconds)
                except asyncio.TimeoutError:
                    if self.busy or self.items:
                        continue  # the client waits for results: not idle
                    open_ = self.utt is not None and self.utt.got_audio
                    await self.error(f"idle for {self.limits.idle_seconds:g} s (the idle limit: fun-asr-serve "
                                     "--stream-idle-seconds): closing the connection"
                                     + ("; the open utterance gets its final result first" if open_ else ""))
                    if open_:
                        await self.finish(ack=False)  # (the worker is idle: nothing queued, nothing running)
                    break
                if msg.get("type") == "websocket.disconnect":
                    self.stats["status"] = int(msg.get("code") or 1005)
                    break
                data, text = msg.get("bytes"), msg.get("text")
                if data is None and text is None:
                    continue
                if data is not None:
                    self.stats["bytes_in"] += len(data)
                while self._full() and not task.done():
                    self.space.clear()
                    await self.space.wait()  # backpressure: the client's sends wait, nothing is dropped
                if data is not None:
                    self.push("audio", data)
                else:
                    self.push("text", text)
        except WebSocketDisconnect as exc:
            self.stats["status"] = exc.code
        finally:
            task.cancel()
            with contextlib.suppress(BaseException):
                await task
            self.utt = None
            with contextlib.suppress(Exception):
                await self.ws.close()

    def push(self, kind: str, payload: bytes | str) -> None:
        self.items.append((kind, payload))
        self.queued += len(payload)
        self.texts += kind == "text"
        self.has_items.set()

    def _taken(self, kind: str, payload: bytes | str) -> None:
        self.queued -= len(payload)
        self.texts -= kind == "text"
        self.space.set()

    async def worker(self) -> None:
        while True:
            if not self.items:
                self.has_items.clear()
                await self.has_items.wait()
                continue
            kind, payload = self.items.popleft()
            self._taken(kind, payload)
            self.busy = True
            try:
                if kind == "audio":
                    parts = [payload]
                    while self.items and self.items[0][0] == "audio":  # what queued while decoding: in one piece
                        parts.append(self.items.popleft()[1])
                        self._taken("audio", parts[-1])
                    await self.on_audio(b"".join(parts))
                else:
                    await self.on_text(payload)
            except Exception as exc:  # an unexpected failure must not kill the worker
                log.exception("runtime websocket: %s", exc)
                await self.error(f"internal error: {type(exc).__name__}: {exc}")
            finally:
                self.busy = False

    # -- messages ---------------------------------------------------------------------------------------

    async def on_text(self, text: str) -> None:
        try:
            msg = json.loads(text)
        except json.JSONDecodeError as exc:
            msg = exc
        if not isinstance(msg, dict):
            shown = text if len(text) <= 40 else text[:37] + "..."
            await self.error(f"text messages must be JSON objects (this connection speaks FunASR's runtime "
                             f"protocol: {{\"mode\": ..., \"is_speaking\": ...}}), got {shown!r}")
            return
        problems: list[str] = []
        notes: list[str] = []

        def wav_name(v: Any) -> str:
            if not isinstance(v, str):
                raise ValueError(f"wav_name must be a string, got {type(v).__name__}")
            if len(v) <= MAX_WAV_NAME:
                return v
            cut = v[:MAX_WAV_NAME]
            if cut != self.cfg.wav_name:  # (once per name: the clients repeat it in later messages)
                notes.append(f"wav_name of {len(v)} characters cut to its first {MAX_WAV_NAME}: {cut[:40]!r}...")
            return cut

        def take(key: str, fn: Callable[[Any], Any]) -> Any:
            """The checked value of ``key``; _MISSING when absent or refused (the problem is reported)."""
            if key not in msg:
                return _MISSING
            try:
                return fn(msg[key])
            except (ValueError, TypeError) as exc:
                problems.append(str(exc))
                return _MISSING

        changes: dict[str, Any] = {
            "mode": take("mode", lambda v: v if isinstance(v, str) and v in MODES else _raise(
                f"mode {v!r} is not supported: accepted {', '.join(MODES)}")),
            "chunk_size": take("chunk_size", _chunk_size),
            "wav_name": take("wav_name", wav_name),
            "wav_format": take("wav_format", _wav_format),
            "audio_fs": take("audio_fs", lambda v: _int("audio_fs", v, Limits.min_sample_rate,
                                                          Limits.max_sample_rate)),
            "hotwords": take("hotwords", lambda v: tuple(parse_hotwords(v))),
            "language": take("svs_lang", lambda v: self.session.normalize_language(v) if isinstance(v, str) else
                             _raise(f"svs_lang must be a string ('auto', 'zh', 'en', ...), got {type(v).__name__}")),
        }
        itn, svs_itn = take("itn", lambda v: _bool("itn", v)), take("svs_itn", lambda v: _bool("svs_itn", v))
        changes["itn"] = itn if "itn" in msg else svs_itn
        speaking = take("is_speaking", lambda v: _bool("is_speaking", v))
        finished = take("is_finished", lambda v: _bool("is_finished", v))
        is_end = take("is_end", lambda v: _bool("is_end", v))
        for key in _NO_EFFECT:
            take(key, lambda v, key=key: _int(key, v, 1 if key == "chunk_interval" else 0))
        new = dataclasses.replace(self.cfg, **{k: v for k, v in changes.items() if v is not _MISSING})
        if any(changes[k] is not _MISSING for k in ("hotwords", "language", "itn")):
            try:  # the Session's limits on the prompt (hotwords, language, within the decoder's context)
                self.session.options(new.language, new.itn, list(self.words(new)), self.max_new, 30.0)
            except (ValueError, TypeError) as exc:
                problems.append(_limit_words(str(exc)))
                new = dataclasses.replace(new, hotwords=self.cfg.hotwords, language=self.cfg.language)
        # each unknown field is named once per connection (as shown: a long name by its first 37 characters)
        unknown = sorted({k if len(k) <= 40 else k[:37] + "..." for k in set(msg) - _KNOWN} - self.named)
        unknown = unknown[:max(0, MAX_NAMED - len(self.named))]
        self.named.update(unknown)
        if unknown:
            notes.insert(0, f"ignored unknown fields: {', '.join(unknown)}")
        running = self.utt is not None and self.utt.got_audio
        if running:
            assert self.utt is not None
            moved = [k for k in _PER_UTTERANCE if getattr(new, k) != getattr(self.utt.cfg, k)]
            if moved:
                await self.error(f"{', '.join(moved)} changed during an utterance: the new value applies from the "
                                 "next utterance (after is_speaking false)", fatal_for_utterance=False)
        self.cfg = new
        for p in problems:
            if self.utt is None:
                self.utt = _Utterance(self.cfg)
            await self.error(p)  # the utterance fails: its audio is not decoded with settings it did not ask for
        if notes:
            await self.send(self.message(OUT_MODES[self.cfg.mode][1], "", False, warning="; ".join(notes)))
        if speaking is False or finished is True or is_end is True:
            await self.finish(ack=is_end is True)

    async def on_audio(self, data: bytes) -> None:
        if self.utt is None:
            self.utt = _Utterance(self.cfg)
        utt = self.utt
        if utt.errors and not utt.got_audio:  # the settings were refused: nothing to decode with
            utt.refused += len(data)
            return
        if not utt.got_audio:
            utt.got_audio = True
            if not utt.cfg.pcm or (data[:4] == b"RIFF" and data[8:12] == b"WAVE"):
                utt.file = bytearray()
            else:
                try:
                    utt.stream = self.new_stream(utt)
                except (ValueError, TypeError) as exc:
                    await self.error(_limit_words(str(exc)))
                    return
        if utt.file is not None:
            if len(utt.file) + len(data) > self.max_file_bytes:
                utt.refused += len(data)
                if not utt.errors:
                    await self.error(f"file input over {self.max_file_bytes / 2**20:g} MB; it will not be "
                                     "transcribed (send raw PCM, wav_format pcm, to stream longer audio)")
                return
            utt.file += data
            return
        if utt.stream is None:
            utt.refused += len(data)
            return
        data = utt.carry + data
        cut = len(data) - len(data) % 2
        utt.carry = data[cut:]
        if cut:
            await self.feed(utt, data[:cut])

    def words(self, cfg: _Config) -> tuple[str, ...]:
        """The hotwords a stream decodes with: the client's, then the server's --hotword-file words."""
        return tuple(dict.fromkeys((*cfg.hotwords, *self.server_words)))

    def postprocess(self, text: str) -> str:
        return apply_postprocess_hotwords(text, self.pairs) if self.pairs else text

    def new_stream(self, utt: _Utterance) -> Any:
        from fun_asr.asr.stream import StreamOptions

        cfg, session, submit, max_new, post = utt.cfg, self.session, self.submit, self.max_new, self.postprocess
        hotwords = self.words(cfg)
        timed = cfg.mode != "online" and getattr(session, "aligner", None) is not None
        online = cfg.online_ms if cfg.mode != "offline" else 10**9  # offline: no partial decodes
        # partials re-decode the whole open sentence (the VAD cuts it at max_sentence_s): the online pass sends
        # what consecutive partials agree on, which needs the same start every time
        # no speculative closing decodes: the offline pass decodes each closed sentence itself (with timestamps,
        # recorded for its 2pass-offline message), and mode offline has no partials at all
        sopts = StreamOptions(first_partial_ms=online, partial_interval_ms=online, max_new_tokens=max_new,
                              partial_max_new_tokens=min(200, max_new),
                              partial_window_s=StreamOptions().max_sentence_s + 5.0, speculate_silence_ms=0)

        def decoder(audio: np.ndarray, max_new_tokens: int, draft: list[int] | None = None,
                    partial: bool = False) -> tuple[str, list[int]] | None:
            seconds = min(session.max_segment_seconds, max(30.0, audio.size / SAMPLE_RATE + 1.0))
            # a closed sentence is the offline pass: it gets its CTC timestamps; partials are the online pass
            sentence = not partial
            result = submit(audio, (cfg.language, cfg.itn, hotwords, max_new_tokens, seconds, False,
                                    timed and sentence), "stream", draft, partial).result()
            if result is None:  # an online partial the batcher skipped (busy with closed sentences)
                return None
            if sentence:
                utt.records.append((post(result.text), result))
            return result.text, [t for s in result.segments for t in s.tokens]

        stream = session.stream(cfg.language, cfg.itn, list(hotwords), max_new_tokens=max_new,
                                stream_options=sopts, decoder=decoder)
        stream.postprocess = post if self.pairs else None
        self.stats["streams"] += 1
        return stream

    async def feed(self, utt: _Utterance, pcm: bytes) -> None:
        """PCM into the utterance's stream, up to --stream-max-seconds of it (see :meth:`at_limit`)."""
        rate = utt.cfg.audio_fs
        room = int(self.limits.max_seconds * rate) * 2 - utt.fed
        over = len(pcm) > room
        if over:
            utt.refused += len(pcm) - room
            pcm = pcm[:room]
        if pcm:
            try:
                events = await anyio.to_thread.run_sync(utt.stream.feed, pcm, rate)
            except (AudioError, ValueError, RuntimeError) as exc:
                await self.error(str(exc))
                events = None
            if events is not None:
                utt.fed += len(pcm)
                self.stats["audio_s"] += len(pcm) / 2 / rate
                for m in self.translate(utt, events):
                    await self.send(m)
        if over:
            await self.at_limit(utt)

    async def at_limit(self, utt: _Utterance) -> None:
        """The utterance reached --stream-max-seconds, as the realtime protocol ends a stream there: an error
        naming the limit, then the offline pass of what is left; the rest of its audio (until is_speaking
        false) is not transcribed (counted in the final message's error), and the connection stays open for
        the next utterance."""
        limit = self.limits.max_seconds
        await self.error(f"utterance length limit reached ({limit:g} s of audio per utterance: fun-asr-serve "
                         f"--stream-max-seconds): the audio after {limit:g} s is not transcribed; this utterance "
                         "ends here (send is_speaking false, then the next utterance)")
        utt.refused += len(utt.carry)
        stream, utt.stream, utt.carry = utt.stream, None, b""
        try:
            events = await anyio.to_thread.run_sync(stream.close)
        except (AudioError, ValueError, RuntimeError) as exc:
            utt.errors.append(str(exc))
            return
        for m in self.translate(utt, events, closing=True):
            await self.send(m)

    async def finish(self, ack: bool) -> None:
        """End of the utterance: the offline pass of what is left, the last message (``is_final``), the
        acknowledgement when asked for."""
        utt, self.utt = self.utt, None
        if utt is None:
            utt = _Utterance(self.cfg)
        out: list[dict[str, Any]] = []
        if utt.file is not None and not utt.refused:
            out += await self.decode_file(utt)
        elif utt.stream is not None:
            try:
                events = await anyio.to_thread.run_sync(utt.stream.close)
                out += self.translate(utt, events, closing=True)
            except (AudioError, ValueError, RuntimeError) as exc:
                utt.errors.append(str(exc))
        if utt.carry:
            utt.warnings.append("the PCM audio ended with half a sample (an odd number of bytes); that last byte "
                                "was not used")
        if utt.refused:
            utt.errors.append(f"{utt.refused} bytes of audio were not transcribed (see the errors before)")
        final_mode = OUT_MODES[utt.cfg.mode][1]
        if not out:
            out.append(self.message(final_mode, "", False))
        out[-1]["is_final"] = True
        if utt.errors:
            out[-1]["error"] = "; ".join(dict.fromkeys(utt.errors))
        if utt.warnings:
            out[-1]["warning"] = "; ".join(utt.warnings)
        for m in out:
            await self.send(m)
        if ack:
            done: dict[str, Any] = {"mode": utt.cfg.mode, "wav_name": self.cfg.wav_name, "text": "",
                                    "is_final": not utt.errors, "is_end": True}
            if utt.errors:
                done["error"] = "; ".join(dict.fromkeys(utt.errors))
            await self.send(done)

    async def decode_file(self, utt: _Utterance) -> list[dict[str, Any]]:
        assert utt.file is not None
        data = bytes(utt.file)
        utt.file = None
        name = utt.cfg.wav_name
        try:
            samples, info = await anyio.to_thread.run_sync(lambda: decode_audio(data, name=name))
        except (AudioError, ValueError) as exc:
            utt.errors.append(f"{exc} (wav_format {utt.cfg.wav_format!r}: accepted pcm, raw 16-bit little-endian "
                              f"mono at audio_fs, or a file of {_FILE_FORMATS})")
            return []
        utt.warnings += list(info.warnings)
        if samples.size / SAMPLE_RATE > self.limits.max_seconds:
            utt.errors.append(f"file of {samples.size / SAMPLE_RATE:.0f} s, over the {self.limits.max_seconds:g} s "
                              "limit per utterance")
            return []
        try:
            utt.stream = self.new_stream(utt)
            events = await anyio.to_thread.run_sync(utt.stream.feed, samples, SAMPLE_RATE)
            self.stats["audio_s"] += samples.size / SAMPLE_RATE
            out = self.translate(utt, events)
            events = await anyio.to_thread.run_sync(utt.stream.close)
            return out + self.translate(utt, events, closing=True)
        except (AudioError, ValueError, RuntimeError, TypeError) as exc:
            utt.errors.append(_limit_words(str(exc)))
            return []

    # -- results ----------------------------------------------------------------------------------------

    def translate(self, utt: _Utterance, events: list[Any], closing: bool = False) -> list[dict[str, Any]]:
        """Stream events -> protocol messages (``is_final`` false; ``finish`` marks the last one)."""
        online_mode, offline_mode = OUT_MODES[utt.cfg.mode]
        out: list[dict[str, Any]] = []
        for ev in events:
            if ev.type == "partial":
                if utt.cfg.mode == "offline":
                    continue
                if utt.online.start is not None and ev.start != utt.online.start:
                    # the sentence closed without text (nothing decoded): a new one began
                    if utt.cfg.mode == "2pass" and utt.online.sent:
                        out.append(self.message(offline_mode, ""))  # the clients drop its online text
                    utt.online.reset()
                delta, first = utt.online.partial(ev.text, ev.start)
                if delta:
                    delta = (_sep(utt.tail, delta) if first else "") + delta
                    if utt.cfg.mode == "online":
                        utt.tail = delta[-1]
                    out.append(self.message(online_mode, delta))
                continue
            if utt.cfg.mode == "online":
                rest, first = utt.online.final(ev.text)
                self._pop_record(utt, ev.text)
                if rest:
                    rest = (_sep(utt.tail, rest) if first else "") + rest
                    utt.tail = rest[-1]
                    out.append(self.message(online_mode, rest))
                continue
            utt.online.reset()
            text = _sep(utt.tail, ev.text) + ev.text
            utt.tail = text[-1]
            extra: dict[str, Any] = {}
            record = self._pop_record(utt, ev.text)
            aligner = getattr(self.session, "aligner", None)
            if record is not None and aligner is not None:
                times = _char_times(record, aligner.tokenizer)
                if times:
                    extra = stamps(text, times, int(ev.start))
            out.append(self.message(offline_mode, text, **extra))
        if closing and utt.cfg.mode == "2pass" and utt.online.sent:
            utt.online.reset()  # (the last message, an offline one, clears it at the client)
        return out

    @staticmethod
    def _pop_record(utt: _Utterance, text: str) -> Any:
        while utt.records:
            got, result = utt.records.popleft()
            if got == text:
                return result
        return None


_MISSING = object()


def _raise(msg: str) -> Any:
    raise ValueError(msg)


def _wav_format(value: Any) -> str:
    if not isinstance(value, str) or not value.strip():
        raise ValueError(f"wav_format must be a string (pcm, or a file type such as wav or mp3), got {value!r}")
    fmt = value.strip()
    if fmt.lower().lstrip(".") in _UNREADABLE:
        raise ValueError(f"wav_format {fmt!r} cannot be decoded here: send pcm (raw 16-bit little-endian mono "
                         f"at audio_fs) or a file of {_FILE_FORMATS}")
    return fmt


__all__ = ["MODES", "parse_hotwords", "serve_websocket", "stamps"]
