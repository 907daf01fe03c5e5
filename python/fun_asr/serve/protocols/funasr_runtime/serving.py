"""FunASR runtime's protocol on one connection (:class:`_TwoPass`): a reader (messages in order into the
back-pressure queue) and a worker (settings, audio, the end of each utterance), each utterance's stream and its
online and offline passes turned into the protocol's messages; :data:`PROTOCOL` for the server's table of
WebSocket protocols. The messages themselves: :mod:`fun_asr.serve.protocols.funasr_runtime.protocol`."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import logging
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import anyio

from fun_asr.audio.decode import SAMPLE_RATE, AudioError, Limits, decode_audio
from fun_asr.errors import render
from fun_asr.serve.core.decoder import StreamDecoder
from fun_asr.serve.core.hotword_files import apply_postprocess_hotwords
from fun_asr.serve.core.limits import RealtimeLimits
from fun_asr.serve.core.requests import DecodeRequest
from fun_asr.serve.core.websocket import (
    Inbox,
    Slot,
    StreamServer,
    WebSocketProtocol,
    disconnected,
    idle_error,
    receive,
    stop_worker,
    work,
)
from fun_asr.serve.protocols.funasr_runtime.protocol import (
    FILE_FORMATS,
    KNOWN_FIELDS,
    MAX_NAMED,
    MAX_QUEUED_TEXTS,
    MAX_WAV_NAME,
    MISSING,
    MODES,
    NO_EFFECT,
    OUT_MODES,
    PER_UTTERANCE,
    RuntimeConfig,
    error_message,
    field_int,
    form_bool,
    parse_chunk_size,
    parse_hotwords,
    parse_wav_format,
    raise_field,
    recognises,
)
from fun_asr.serve.protocols.funasr_runtime.text import Online, char_times, separator, stamps
from fun_asr.serve.words import ClientWords

log = logging.getLogger("fun_asr.server")

NAME = "funasr-runtime"  # the access log's protocol

@dataclass
class _Utterance:
    cfg: RuntimeConfig
    stream: Any = None
    file: bytearray | None = None  # non-PCM input, decoded when the utterance ends
    carry: bytes = b""  # half a PCM sample split across frames
    got_audio: bool = False
    errors: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    online: Online = field(default_factory=Online)
    tail: str = ""  # the last character the client shows (sentence separators)
    records: deque = field(default_factory=deque)  # (text, Transcription) of each decode, in order
    refused: int = 0  # bytes not decoded because of an error
    fed: int = 0  # PCM bytes the stream took (--stream-max-seconds of them at most)


def _json_object(text: str) -> dict[str, Any] | None:
    """A text message as a JSON object; None when it is not one."""
    try:
        msg = json.loads(text)
    except json.JSONDecodeError as exc:
        msg = exc
    return msg if isinstance(msg, dict) else None


class _Fields:
    """One text message's fields as they are read: :meth:`take` gives each checked value; the fields it refuses
    are in ``problems``, what was changed on the way (a long wav_name cut) in ``notes``."""

    def __init__(self, msg: dict[str, Any], wav_name_now: str) -> None:
        self.msg = msg
        self.wav_name_now = wav_name_now  # the connection's wav_name before this message
        self.problems: list[str] = []
        self.notes: list[str] = []

    def take(self, key: str, fn: Callable[[Any], Any]) -> Any:
        """The checked value of ``key``; MISSING when absent or refused (the problem is reported)."""
        if key not in self.msg:
            return MISSING
        try:
            return fn(self.msg[key])
        except (ValueError, TypeError) as exc:
            self.problems.append(render(exc, "websocket"))
            return MISSING

    def wav_name(self, v: Any) -> str:
        if not isinstance(v, str):
            raise ValueError(f"wav_name must be a string, got {type(v).__name__}")
        if len(v) <= MAX_WAV_NAME:
            return v
        cut = v[:MAX_WAV_NAME]
        if cut != self.wav_name_now:  # (once per name: the clients repeat it in later messages)
            self.notes.append(f"wav_name of {len(v)} characters cut to its first {MAX_WAV_NAME}: {cut[:40]!r}...")
        return cut


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
        self.cfg = RuntimeConfig(language=limits.language)
        self.utt: _Utterance | None = None
        # bytes of audio and characters of text waiting, and text messages: past either bound reading waits
        self.inbox = Inbox(lambda box: box.queued > self._limit_bytes() or box.texts >= MAX_QUEUED_TEXTS)
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

    async def run(self) -> None:
        """Reads the connection (its first message too) until it ends or idles."""
        from starlette.websockets import WebSocketDisconnect

        if self.session.vad is None:
            await self.send(error_message("streaming needs the FSMN-VAD; start the server with --vad fsmn (or "
                                          "--vad-model)"))
            self.stats["status"] = 1011
            with contextlib.suppress(Exception):
                await self.ws.close(code=1011)
            return
        task = asyncio.create_task(self.worker())
        try:
            while not task.done():
                msg = await receive(self.ws, self.limits.idle_seconds)
                if msg is None:
                    if self.inbox.busy or self.inbox.items:
                        continue  # the client waits for results: not idle
                    open_ = self.utt is not None and self.utt.got_audio
                    await self.error(idle_error(self.limits, "; the open utterance gets its final result first"
                                                if open_ else ""))
                    if open_:
                        await self.finish(ack=False)  # (the worker is idle: nothing queued, nothing running)
                    break
                if disconnected(msg, self.stats):
                    break
                data, text = msg.get("bytes"), msg.get("text")
                if data is None and text is None:
                    continue
                if data is not None:
                    self.stats["bytes_in"] += len(data)
                # backpressure: the client's sends wait, nothing is dropped
                await self.inbox.wait_for_room(stop=task.done)
                if data is not None:
                    self.inbox.put("audio", data)
                else:
                    self.inbox.put("text", text)
        except WebSocketDisconnect as exc:
            self.stats["status"] = exc.code
        finally:
            try:
                await stop_worker(task, self.inbox)  # the audio it feeds now is finished: nothing runs on after it
            finally:
                self.utt = None
                with contextlib.suppress(Exception):
                    await self.ws.close()

    async def worker(self) -> None:
        # audio that queued while decoding goes to the stream in one piece
        await work(self.inbox, self._item, self._failed)

    async def _item(self, kind: str, payload: Any) -> None:
        if kind == "audio":
            await self.on_audio(payload)
        else:
            await self.on_text(payload)

    async def _failed(self, exc: Exception) -> None:  # an unexpected failure must not kill the worker
        log.exception("runtime websocket: %s", exc)
        await self.error(f"internal error: {type(exc).__name__}: {exc}")

    # -- messages ---------------------------------------------------------------------------------------

    async def on_text(self, text: str) -> None:
        msg = _json_object(text)
        if msg is None:
            shown = text if len(text) <= 40 else text[:37] + "..."
            await self.error(f"text messages must be JSON objects (this connection speaks FunASR's runtime "
                             f"protocol: {{\"mode\": ..., \"is_speaking\": ...}}), got {shown!r}")
            return
        fields = _Fields(msg, self.cfg.wav_name)
        changes = self._changes(fields)
        speaking = fields.take("is_speaking", lambda v: form_bool("is_speaking", v))
        finished = fields.take("is_finished", lambda v: form_bool("is_finished", v))
        is_end = fields.take("is_end", lambda v: form_bool("is_end", v))
        for key in NO_EFFECT:
            fields.take(key, lambda v, key=key: field_int(key, v, 1 if key == "chunk_interval" else 0))
        new = dataclasses.replace(self.cfg, **{k: v for k, v in changes.items() if v is not MISSING})
        new = self._within_prompt_limits(new, changes, fields.problems)
        unknown = self._new_unknown_fields(msg)
        if unknown:
            fields.notes.insert(0, f"ignored unknown fields: {', '.join(unknown)}")
        await self._say_moved_settings(new)
        self.cfg = new
        for p in fields.problems:
            if self.utt is None:
                self.utt = _Utterance(self.cfg)
            await self.error(p)  # the utterance fails: its audio is not decoded with settings it did not ask for
        if fields.notes:
            await self.send(self.message(OUT_MODES[self.cfg.mode][1], "", False, warning="; ".join(fields.notes)))
        if speaking is False or finished is True or is_end is True:
            await self.finish(ack=is_end is True)

    def _changes(self, fields: _Fields) -> dict[str, Any]:
        """The settings a message sets (``MISSING``: not set, or refused), by their ``RuntimeConfig`` names."""
        take = fields.take
        changes: dict[str, Any] = {
            "mode": take("mode", lambda v: v if isinstance(v, str) and v in MODES else raise_field(
                f"mode {v!r} is not supported: accepted {', '.join(MODES)}")),
            "chunk_size": take("chunk_size", parse_chunk_size),
            "wav_name": take("wav_name", fields.wav_name),
            "wav_format": take("wav_format", parse_wav_format),
            "audio_fs": take("audio_fs", lambda v: field_int("audio_fs", v, Limits.min_sample_rate,
                                                          Limits.max_sample_rate)),
            "hotwords": take("hotwords", lambda v: tuple(parse_hotwords(v))),
            "language": take("svs_lang", lambda v: self.session.normalize_language(v) if isinstance(v, str) else
                             raise_field("svs_lang must be a string ('auto', 'zh', 'en', ...), got "
                                         f"{type(v).__name__}")),
        }
        itn, svs_itn = take("itn", lambda v: form_bool("itn", v)), take("svs_itn", lambda v: form_bool("svs_itn", v))
        changes["itn"] = itn if "itn" in fields.msg else svs_itn
        return changes

    def _within_prompt_limits(self, new: RuntimeConfig, changes: dict[str, Any], problems: list[str]) -> RuntimeConfig:
        """``new``, or (when its hotwords or language break the Session's limits on the prompt, the problem
        added to ``problems``) ``new`` with the current hotwords and language."""
        if any(changes[k] is not MISSING for k in ("hotwords", "language", "itn")):
            try:  # the Session's limits on the prompt (hotwords, language, within the decoder's context)
                self.session.options(new.language, new.itn, list(self.words(new)), self.max_new, 30.0)
            except (ValueError, TypeError) as exc:
                problems.append(render(exc, "websocket"))
                new = dataclasses.replace(new, hotwords=self.cfg.hotwords, language=self.cfg.language)
        return new

    def _new_unknown_fields(self, msg: dict[str, Any]) -> list[str]:
        """The message's unknown fields not named before on this connection (up to ``MAX_NAMED`` in all), now
        remembered: each is named once per connection (as shown: a long name by its first 37 characters)."""
        unknown = sorted({k if len(k) <= 40 else k[:37] + "..." for k in set(msg) - KNOWN_FIELDS} - self.named)
        unknown = unknown[:max(0, MAX_NAMED - len(self.named))]
        self.named.update(unknown)
        return unknown

    async def _say_moved_settings(self, new: RuntimeConfig) -> None:
        """A warning when ``new`` changes a per-utterance setting while an utterance is getting audio."""
        running = self.utt is not None and self.utt.got_audio
        if running:
            assert self.utt is not None
            moved = [k for k in PER_UTTERANCE if getattr(new, k) != getattr(self.utt.cfg, k)]
            if moved:
                await self.error(f"{', '.join(moved)} changed during an utterance: the new value applies from the "
                                 "next utterance (after is_speaking false)", fatal_for_utterance=False)

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
                    await self.error(render(exc, "websocket"))
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

    def words(self, cfg: RuntimeConfig) -> tuple[str, ...]:
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

        # a closed sentence is the offline pass: it gets its CTC timestamps (recorded for its message); partials
        # are the online pass
        decoder = StreamDecoder(submit, session, DecodeRequest(cfg.language, cfg.itn, hotwords, word_timestamps=timed),
                                on_sentence=lambda result: utt.records.append((post(result.text), result)))
        stream = session.stream(cfg.language, cfg.itn, list(hotwords), max_new_tokens=max_new,
                                stream_options=sopts, decoder=decoder.decode)
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
                await self.error(render(exc, "websocket"))
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
            utt.errors.append(render(exc, "websocket"))
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
                utt.errors.append(render(exc, "websocket"))
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
                              f"mono at audio_fs, or a file of {FILE_FORMATS})")
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
            utt.errors.append(render(exc, "websocket"))
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
                    delta = (separator(utt.tail, delta) if first else "") + delta
                    if utt.cfg.mode == "online":
                        utt.tail = delta[-1]
                    out.append(self.message(online_mode, delta))
                continue
            if utt.cfg.mode == "online":
                rest, first = utt.online.final(ev.text)
                self._pop_record(utt, ev.text)
                if rest:
                    rest = (separator(utt.tail, rest) if first else "") + rest
                    utt.tail = rest[-1]
                    out.append(self.message(online_mode, rest))
                continue
            utt.online.reset()
            text = separator(utt.tail, ev.text) + ev.text
            utt.tail = text[-1]
            extra: dict[str, Any] = {}
            record = self._pop_record(utt, ev.text)
            aligner = getattr(self.session, "aligner", None)
            if record is not None and aligner is not None:
                times = char_times(record, aligner.tokenizer)
                if times:
                    extra = stamps(text, times, int(ev.start))
            if ev.confidence is not None:  # fun-asr's: exp(mean token log-probability) of the sentence
                extra["confidence"] = round(ev.confidence, 4)
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


async def serve(ws: Any, server: StreamServer, stats: dict[str, Any], slot: Slot) -> None:  # noqa: ARG001
    """An accepted connection the server's table of protocols gave this protocol (its first message, a JSON
    object, replayed by ``ws``); the slot is given back when the table's dispatch ends."""
    await _TwoPass(ws, server.session, server.batcher.submit, server.limits, server.max_new_tokens,
                   server.max_file_mb, stats, server.words).run()


PROTOCOL = WebSocketProtocol(NAME, recognises, serve, error_message)

__all__ = ["PROTOCOL", "serve"]
