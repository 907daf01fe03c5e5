"""FunASR's runtime WebSocket protocol (serve/protocols/funasr_runtime): the message sequences of FunASR's own clients
(runtime/python/websocket/funasr_wss_client.py and the runtime/html5 page), replayed exactly, against a real
uvicorn server (plain and TLS), the dispatch to the realtime protocol, and the wss flags of fun-asr-serve."""

from __future__ import annotations

import asyncio
import contextlib
import json
import re
import socket
import ssl
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import soundfile as sf

import fun_asr
from fun_asr.asr.stream import StreamOptions
from fun_asr.serve.app import serve_websocket
from fun_asr.serve.core import websocket as ws_core
from fun_asr.serve.protocols.funasr_runtime import parse_hotwords, stamps
from fun_asr.serve.protocols.funasr_runtime import text as ws_2pass_text

websockets = pytest.importorskip("websockets")
uvicorn = pytest.importorskip("uvicorn")
fastapi = pytest.importorskip("fastapi")
WebSocket = fastapi.WebSocket  # (a module name: the route's annotation is resolved from here)

pytestmark = pytest.mark.filterwarnings("ignore::fun_asr.notices.TruncatedOutputWarning")

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"
MAX_NEW = 12
OUT_MODES = {"online": {"online"}, "offline": {"offline"}, "2pass": {"2pass-online", "2pass-offline"}}


# -- servers ----------------------------------------------------------------------------------------------

def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextlib.contextmanager
def _serve(session: fun_asr.Session, max_new: int, certfile: Path | None = None,
           keyfile: Path | None = None, **limits: Any) -> Iterator[int]:
    """uvicorn in a thread over the app the server builds around serve_websocket: the shared batcher, every
    path. Yields the port."""
    import contextlib as cl

    from fastapi import FastAPI

    from fun_asr.serve.core.batcher import Batcher
    from fun_asr.serve.protocols.funasr_realtime import RealtimeLimits

    box: dict[str, Batcher] = {}
    live = [0]
    rl = RealtimeLimits(**limits)

    @cl.asynccontextmanager
    async def lifespan(_app: FastAPI):  # noqa: ANN202
        box["b"] = Batcher(session, 4, max_new)
        yield
        box["b"].close()

    app = FastAPI(lifespan=lifespan)

    @app.websocket("/{path:path}")
    async def route(ws: WebSocket, path: str) -> None:  # noqa: ARG001
        # as app.py's route: its API key check gives `authorized` (here: any key but "wrong")
        await serve_websocket(ws, session, box["b"], rl, live, max_new,
                              authorized=ws.headers.get("authorization") != "Bearer wrong")

    port = _free_port()
    config = uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning", ws_ping_interval=None,
                            ssl_certfile=str(certfile) if certfile else None,
                            ssl_keyfile=str(keyfile) if keyfile else None)
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.time() + 60
    while not server.started:
        assert thread.is_alive() and time.time() < deadline, "uvicorn did not start"
        time.sleep(0.05)
    try:
        yield port
    finally:
        server.should_exit = True
        thread.join(timeout=30)


@pytest.fixture(scope="module")
def tiny(tiny_gguf, vad_dir):  # noqa: ANN001, ANN201
    return fun_asr.Session(tiny_gguf("q8_0"), device="cpu", vad="fsmn", vad_model=vad_dir)


@pytest.fixture(scope="module")
def server(tiny: fun_asr.Session) -> Iterator[str]:
    with _serve(tiny, MAX_NEW) as port:
        yield f"ws://127.0.0.1:{port}/"


def _pcm(path: Path, rate: int = 16000) -> bytes:
    x, sr = sf.read(path, dtype="float32")
    if sr != rate:
        import soxr

        x = soxr.resample(x, sr, rate)
    return (np.clip(x, -1, 1) * 32767).astype("<i2").tobytes()


# -- FunASR's clients, replayed -----------------------------------------------------------------------------

def funasr_wss_client(uri: str, audio: bytes, mode: str, *, fs: int = 16000, chunk_size: tuple = (5, 10, 5),
                      chunk_interval: int = 10, wav_name: str = "demo", wav_format: str = "pcm",
                      hotwords: str = "", itn: bool = True, pace: float = 0.001, end: dict | None = None,
                      until: str = "ack", ssl_ctx: ssl.SSLContext | None = None, first: dict | None = None,
                      extra: list[Any] | None = None, middle: list[Any] | None = None) -> list[dict[str, Any]]:
    """record_from_scp + message() of funasr_wss_client.py: the first message with its keys in its order,
    frames of 60*chunk_size[1]/chunk_interval ms, ``{"is_speaking": false, "is_end": true}``, then waits for
    the acknowledgement (``until="final"``: the first is_final message, as the older clients wait)."""

    async def run() -> list[dict[str, Any]]:
        msgs: list[dict[str, Any]] = []
        async with websockets.connect(uri, subprotocols=["binary"], ping_interval=None, ssl=ssl_ctx) as ws:
            assert ws.subprotocol == "binary"

            async def receive() -> None:
                async for raw in ws:
                    assert isinstance(raw, str)
                    m = json.loads(raw)
                    msgs.append(m)
                    if (until == "ack" and m.get("is_end")) or (until == "final" and m.get("is_final")):
                        return

            task = asyncio.create_task(receive())
            await ws.send(json.dumps(first if first is not None else {
                "mode": mode, "chunk_size": list(chunk_size), "chunk_interval": chunk_interval,
                "encoder_chunk_look_back": 4, "decoder_chunk_look_back": 0, "audio_fs": fs, "wav_name": wav_name,
                "wav_format": wav_format, "is_speaking": True, "hotwords": hotwords, "itn": itn},
                ensure_ascii=False))
            for item in extra or []:
                await ws.send(item)
            stride = int(60 * chunk_size[1] / chunk_interval / 1000 * fs * 2)
            n = (len(audio) - 1) // stride + 1 if audio else 0
            for i in range(n):
                await ws.send(audio[i * stride:(i + 1) * stride])
                await asyncio.sleep(pace)
                if i == n // 2:
                    for item in middle or []:  # (not FunASR's: a test's message in the middle of the audio)
                        await ws.send(item)
            if end == {}:  # (not FunASR's: the client goes quiet)
                await asyncio.wait_for(task, 300)
                return msgs
            await ws.send(json.dumps(end if end is not None else {"is_speaking": False, "is_end": True}))
            await asyncio.wait_for(task, 300)
        return msgs

    return asyncio.run(run())


def html5(uri: str, audio: bytes, mode: str, *, file_ext: str | None = None, sample_rate: int = 16000,
          hotwords: str | None = None, itn: bool = False) -> list[dict[str, Any]]:
    """wsconnecter.js + main.js: onOpen's request (file mode: wav_format from the file's extension, "PCM"
    and the header's rate for .wav), frames of 960 int16 samples (mic) or 960 bytes of the file (file mode),
    stop()'s request; the page waits for is_final (file mode stops there)."""

    async def run() -> list[dict[str, Any]]:
        msgs: list[dict[str, Any]] = []
        async with websockets.connect(uri, ping_interval=None) as ws:  # the page offers no subprotocol
            request: dict[str, Any] = {"chunk_size": [5, 10, 5], "wav_name": "h5", "is_speaking": True,
                                       "chunk_interval": 10, "itn": itn, "mode": mode}
            step = 1920
            if file_ext is not None:
                request["wav_format"] = file_ext
                if file_ext == "wav":
                    request["wav_format"] = "PCM"
                    request["audio_fs"] = sample_rate
                step = 960
            if hotwords is not None:
                request["hotwords"] = hotwords
            await ws.send(json.dumps(request))
            for i in range(0, len(audio), step):
                await ws.send(audio[i:i + step])
            await ws.send(json.dumps({"chunk_size": [5, 10, 5], "wav_name": "h5", "is_speaking": False,
                                      "chunk_interval": 10, "mode": mode}))
            async for raw in ws:
                msgs.append(json.loads(raw))
                if msgs[-1].get("is_final") is True:
                    break
        return msgs

    return asyncio.run(run())


# -- what the clients read ----------------------------------------------------------------------------------

def _html5_timestamps(text: str, timestamp: str) -> list[float]:
    """main.js handleWithTimestamp: the text split at 。？，、?. and spaces (and commas), one timestamp per
    word of ASCII letters, one per UTF-16 unit otherwise; an index past the list is a TypeError there."""
    jsontime = json.loads(timestamp)
    out, k = [], 0
    for word in re.sub(r"。|？|，|、|\?|\.| ", ",", text).split(","):
        if not word:
            continue
        if k >= len(jsontime):
            raise AssertionError(f"html5 would index timestamp {k} of {len(jsontime)} for {word!r} in {text!r}")
        out.append(jsontime[k][0] / 1000)
        k += 1 if re.fullmatch(r"[a-zA-Z]+", word) else len(word.encode("utf-16-le")) // 2
    assert k == len(jsontime), (text, timestamp)
    return out


def check_fields(msgs: list[dict[str, Any]], mode: str, ack: bool = True) -> None:
    """Every field the Python client and the html5 page read, with its type; is_final on the last result only;
    the acknowledgement last."""
    assert msgs, "no messages"
    results = msgs[:-1] if ack else msgs
    for m in results:
        assert m["mode"] in OUT_MODES[mode], m
        assert isinstance(m["text"], str) and isinstance(m["wav_name"], str) and isinstance(m["is_final"], bool)
        assert "is_end" not in m
        if "timestamp" in m:
            assert isinstance(m["timestamp"], str)
            pairs = json.loads(m["timestamp"])
            assert all(isinstance(p, list) and len(p) == 2 and all(isinstance(t, int) for t in p) for p in pairs)
            assert all(0 <= a <= b for a, b in pairs)
            _html5_timestamps(m["text"], m["timestamp"])
            for s in m["stamp_sents"]:
                assert set(s) == {"text_seg", "punc", "start", "end", "ts_list"}
                assert isinstance(s["text_seg"], str) and isinstance(s["punc"], str)
                assert isinstance(s["start"], int) and isinstance(s["end"], int)
                assert len(s["ts_list"]) == len(s["text_seg"].split(" "))
    assert [m["is_final"] for m in results] == [False] * (len(results) - 1) + [True]
    if ack:
        assert msgs[-1]["is_end"] is True and msgs[-1]["mode"] == mode and msgs[-1]["text"] == ""


def client_view(msgs: list[dict[str, Any]]) -> str:
    """What funasr_wss_client.py prints last (its single-connection display logic)."""
    shown = online = offline = ""
    for m in msgs:
        if "mode" not in m:
            continue
        if m["mode"] == "online":
            shown += m["text"]
        elif m["mode"] == "offline":
            shown += m["text"]
        elif m["mode"] == "2pass-online":
            online += m["text"]
            shown = offline + online
        else:
            online = ""
            shown = offline + m["text"]
            offline += m["text"]
    return shown


def local_sentences(session: fun_asr.Session, audio: bytes | np.ndarray, rate: int = 16000,
                    hotwords: list[str] | None = None, itn: bool = True) -> list[str]:
    """The sentences a Session's own stream finds in the audio (its full decode of each VAD sentence)."""
    stream = session.stream(None, itn, hotwords, max_new_tokens=MAX_NEW,
                            stream_options=StreamOptions(max_new_tokens=MAX_NEW, partial_max_new_tokens=MAX_NEW,
                                                         first_partial_ms=10**9, partial_interval_ms=10**9))
    x = np.frombuffer(audio, "<i2").astype(np.float32) / 32768.0 if isinstance(audio, bytes) else audio
    events = stream.feed(x, sample_rate=rate)
    events += stream.close()
    return [e.text for e in events if e.type == "sentence"]


def _texts(msgs: list[dict[str, Any]], mode: str) -> list[str]:
    return [m["text"].strip() for m in msgs if m.get("mode") == mode and m["text"].strip()]


# -- the pure pieces ----------------------------------------------------------------------------------------

def test_hotwords_in_every_form_the_clients_send() -> None:
    assert parse_hotwords('{"阿里巴巴": 20, "通义实验室": 30}') == ["阿里巴巴", "通义实验室"]  # html5 / file
    assert parse_hotwords("阿里巴巴,通义实验室") == ["阿里巴巴", "通义实验室"]  # newest client: commas
    assert parse_hotwords("fun asr\nhello") == ["fun asr", "hello"]
    assert parse_hotwords("") == [] and parse_hotwords("{}") == [] and parse_hotwords(None) == []
    assert parse_hotwords('["a", " b "]') == ["a", "b"] and parse_hotwords({"x": 1}) == ["x"]
    assert parse_hotwords("{not json, b") == ["{not json", "b"]
    with pytest.raises(ValueError, match="weight of 'a'"):
        parse_hotwords('{"a": "high"}')
    with pytest.raises(ValueError, match="hotwords must be a string"):
        parse_hotwords(20)


def test_stamps_fit_the_html5_page_and_funasr_runtime_shape() -> None:
    text = " Hello world, 今天好。ok"
    times = [(c, 100 * i, 100 * i + 90) for i, c in enumerate(c for c in text if not c.isspace())]
    got = stamps(text, times, 1000)
    pairs = json.loads(got["timestamp"])
    # Hello | world | 今 天 好 | ok: 1 + 1 + 3 + 1 units; a word spans its characters
    assert pairs == [[1000, 1490], [1500, 1990], [2100, 2190], [2200, 2290], [2300, 2390], [2500, 2690]]
    assert got["timestamp"] == json.dumps(pairs, separators=(",", ":"))
    assert _html5_timestamps(text, got["timestamp"]) == [1.0, 1.5, 2.1, 2.5]  # one line per word there
    assert got["stamp_sents"] == [
        {"text_seg": "Hello world", "punc": ",", "start": 1000, "end": 1990, "ts_list": [[1000, 1490], [1500, 1990]]},
        {"text_seg": "今 天 好", "punc": "。", "start": 2100, "end": 2390,
         "ts_list": [[2100, 2190], [2200, 2290], [2300, 2390]]},
        {"text_seg": "ok", "punc": "", "start": 2500, "end": 2690, "ts_list": [[2500, 2690]]}]
    # a word with a digit or apostrophe counts per character on the page
    t2 = "don't 2"
    got2 = stamps(t2, [(c, 10 * i, 10 * i + 5) for i, c in enumerate(c for c in t2 if c != " ")], 0)
    assert len(json.loads(got2["timestamp"])) == 6 and _html5_timestamps(t2, got2["timestamp"])
    assert stamps("ab", [("a", 0, 1)], 0) == {}  # times that do not fit the text: none rather than wrong ones


def test_online_pass_sends_what_two_partials_agree_on() -> None:
    o = ws_2pass_text.Online()
    assert o.partial("I went", 0) == ("", False)
    assert o.partial("I want to", 0) == ("I", True)
    assert o.partial("I want to the", 0) == (" want to", False)
    assert o.partial("I want to the store", 0) == (" the", False)
    assert o.final("I want to the store now") == (" store now", False)
    assert o.partial("今天", 5) == ("", False) and o.partial("今天天气", 5) == ("今天", True)


# -- the protocol over a real server ------------------------------------------------------------------------

def test_2pass_as_funasr_wss_client_sends_it(server: str, tiny: fun_asr.Session) -> None:
    audio = _pcm(EXAMPLES / "zh_weather.wav")
    msgs = funasr_wss_client(server, audio, "2pass", pace=0.01)
    check_fields(msgs, "2pass")
    assert msgs[-1]["is_final"] is True and "error" not in msgs[-1]
    # the offline pass is Fun-ASR-Nano's full decode of each VAD sentence, as the Session's own stream has it
    want = local_sentences(tiny, audio)
    assert want and _texts(msgs, "2pass-offline") == [t.strip() for t in want]
    # fun-asr's confidence on each sentence's offline pass (a top-level key FunASR's clients do not read)
    assert all(0 < m["confidence"] <= 1 for m in msgs if m.get("mode") == "2pass-offline" and m["text"])
    assert client_view(msgs) == "".join(m["text"] for m in msgs if m.get("mode") == "2pass-offline")
    assert all(m["wav_name"] == "demo" for m in msgs)


def test_online_and_offline_modes(server: str, tiny: fun_asr.Session) -> None:
    audio = _pcm(EXAMPLES / "en_hello.wav")
    online = funasr_wss_client(server, audio, "online", pace=0.01)
    check_fields(online, "online")
    assert {m["mode"] for m in online[:-1]} == {"online"} and "".join(m["text"] for m in online).strip()
    offline = funasr_wss_client(server, audio, "offline")
    check_fields(offline, "offline")
    assert _texts(offline, "offline") == [t.strip() for t in local_sentences(tiny, audio)]
    assert all("timestamp" not in m for m in offline)  # no CTC head: no timestamps, never made-up ones


def test_older_clients_end_without_is_end(server: str) -> None:
    """Before is_end the client sent {"is_speaking": false} and waited for is_final (offline mode)."""
    msgs = funasr_wss_client(server, _pcm(EXAMPLES / "en_hello.wav"), "offline", end={"is_speaking": False},
                             until="final")
    check_fields(msgs, "offline", ack=False)
    # no audio at all: still one final (empty) result, then the acknowledgement
    empty = funasr_wss_client(server, b"", "2pass")
    assert [(m["mode"], m["text"], m["is_final"]) for m in empty[:-1]] == [("2pass-offline", "", True)]
    assert empty[-1]["is_end"] is True and empty[-1]["is_final"] is True


def test_8k_and_odd_frames_are_resampled(server: str, tiny: fun_asr.Session) -> None:
    """audio_fs 8000 and 11025 (frames of 1323 bytes: samples split across frames) go through soxr."""
    for rate in (8000, 11025):
        audio = _pcm(EXAMPLES / "zh_weather.wav", rate)
        msgs = funasr_wss_client(server, audio, "offline", fs=rate)
        check_fields(msgs, "offline")
        assert "error" not in msgs[-1] and "warning" not in msgs[-2]
        assert _texts(msgs, "offline") == [t.strip() for t in local_sentences(tiny, audio, rate)]


def test_hotwords_reach_the_decoder(server: str, tiny: fun_asr.Session) -> None:
    audio = _pcm(EXAMPLES / "zh_weather.wav")
    plain = local_sentences(tiny, audio)
    for sent in ('{"阿里巴巴": 20, "通义实验室": 30}', "阿里巴巴,通义实验室"):
        msgs = funasr_wss_client(server, audio, "offline", hotwords=sent)
        check_fields(msgs, "offline")
        want = local_sentences(tiny, audio, hotwords=["阿里巴巴", "通义实验室"])
        assert want != plain, "the tiny model must hear the hotwords for this test to mean anything"
        assert _texts(msgs, "offline") == [t.strip() for t in want]


def test_html5_mic_and_file_modes(server: str, tiny: fun_asr.Session, tmp_path: Path) -> None:
    audio = _pcm(EXAMPLES / "zh_weather.wav")
    mic = html5(server, audio, "2pass", hotwords='{"天气": 20}')
    check_fields(mic, "2pass", ack=False)
    assert all(m["wav_name"] == "h5" for m in mic)
    # file mode: a 44.1 kHz stereo WAV sent whole, header included, as "PCM" with the header's rate
    x, _ = sf.read(EXAMPLES / "zh_weather.wav", dtype="float32")
    import soxr

    y = soxr.resample(x, 16000, 44100)
    path = tmp_path / "stereo.wav"
    sf.write(path, np.stack([y, y], axis=1), 44100, subtype="PCM_16")
    msgs = html5(server, path.read_bytes(), "offline", file_ext="wav", sample_rate=44100)
    check_fields(msgs, "offline", ack=False)
    assert "error" not in msgs[-1] and _texts(msgs, "offline")
    # an mp3 / flac goes by its extension and is decoded when it ends
    flac = tmp_path / "a.flac"
    sf.write(flac, x, 16000)
    got = html5(server, flac.read_bytes(), "offline", file_ext="flac")
    check_fields(got, "offline", ack=False)
    from fun_asr.audio.decode import decode_audio

    want = local_sentences(tiny, decode_audio(flac.read_bytes())[0], itn=False)  # the page sends itn false
    assert want and _texts(got, "offline") == [t.strip() for t in want]


def test_refused_settings_are_reported(server: str) -> None:
    audio = _pcm(EXAMPLES / "en_hello.wav")[:32000]
    for first, words in ((dict(mode="3pass"), "mode '3pass' is not supported"),
                         (dict(chunk_size=[5, 0, 5]), "chunk_size must be three integers"),
                         (dict(wav_format="m4a"), "wav_format 'm4a' cannot be decoded"),
                         (dict(hotwords='{"a": "x"}'), "weight of 'a'"),
                         (dict(audio_fs=100), "audio_fs must be an integer of at least 1000")):
        request = {"mode": "2pass", "chunk_size": [5, 10, 5], "wav_name": "w", "is_speaking": True, **first}
        msgs = funasr_wss_client(server, audio, "2pass", first=request)
        errors = [m for m in msgs if "error" in m]
        assert errors and words in errors[0]["error"], msgs
        ack = msgs[-1]
        assert ack["is_end"] is True and ack["is_final"] is False and words in ack["error"], ack
        assert "bytes of audio were not transcribed" in ack["error"]  # the audio was refused, not dropped silently
    # a text message that is not JSON, and an undecodable file, are reported too
    msgs = funasr_wss_client(server, audio, "2pass", extra=["START"])
    assert any("must be JSON objects" in m.get("error", "") for m in msgs) and msgs[-1]["is_final"] is True
    msgs = funasr_wss_client(server, b"not audio at all" * 10, "offline", wav_format="mp3")
    assert msgs[-1]["is_final"] is False and "accepted pcm" in msgs[-1]["error"]
    msgs = funasr_wss_client(server, audio, "2pass", first={"mode": "online", "bogus": 1, "chunk_size": [5, 10, 5]})
    assert any(m.get("warning") == "ignored unknown fields: bogus" for m in msgs) and msgs[-1]["is_final"] is True


def test_changes_mid_utterance_apply_to_the_next(server: str) -> None:
    audio = _pcm(EXAMPLES / "en_hello.wav")
    msgs = funasr_wss_client(server, audio, "2pass", middle=[json.dumps({"mode": "offline", "wav_name": "next"})])
    notes = [m for m in msgs if "changed during an utterance" in m.get("error", "")]
    assert notes and notes[0]["error"].startswith("mode changed")
    check_fields([m for m in msgs if m not in notes], "2pass")  # the utterance goes on in 2pass
    assert msgs[-1]["is_final"] is True and msgs[-1]["wav_name"] == "next"  # wav_name applies at once


def test_idle_connection_gets_its_final_result_then_closes(tiny: fun_asr.Session) -> None:
    with _serve(tiny, MAX_NEW, idle_seconds=1.0) as port:
        msgs = funasr_wss_client(f"ws://127.0.0.1:{port}/", _pcm(EXAMPLES / "en_hello.wav")[:64000], "2pass",
                                 end={}, until="final")
    assert any("idle for 1 s" in m.get("error", "") for m in msgs)
    assert msgs[-1]["is_final"] is True and msgs[-1]["mode"] == "2pass-offline"


def test_stream_max_seconds_over_a_real_server(tiny: fun_asr.Session) -> None:
    """funasr_wss_client.py against a 1 s limit: the error naming it, the utterance's final message and the
    failed acknowledgement arrive (the connection is not closed under the client)."""
    audio = _pcm(EXAMPLES / "en_hello.wav")
    assert len(audio) > 3 * 32000
    with _serve(tiny, MAX_NEW, max_seconds=1.0) as port:
        msgs = funasr_wss_client(f"ws://127.0.0.1:{port}/", audio, "2pass")
    errors = [m["error"] for m in msgs if "error" in m]
    assert "--stream-max-seconds" in errors[0]
    check_fields([m for m in msgs if "--stream-max-seconds" not in m.get("error", "") or m.get("is_final")
                  or m.get("is_end")], "2pass")
    assert msgs[-1]["is_end"] is True and msgs[-1]["is_final"] is False
    assert "bytes of audio were not transcribed" in msgs[-1]["error"]


def test_realtime_protocol_still_served_on_the_same_route(server: str) -> None:
    """A first message that is not a JSON object goes to the realtime protocol (funasr_realtime.handle), replayed
    (its accept is a no-op)."""
    audio = _pcm(EXAMPLES / "en_hello.wav")

    async def run() -> list[dict]:
        got = []
        async with websockets.connect(server, ping_interval=None) as ws:
            for cmd in ("LANGUAGE:en", "START"):
                await ws.send(cmd)
                got.append(json.loads(await ws.recv()))
            for i in range(0, len(audio), 1920):
                await ws.send(audio[i:i + 1920])
            await ws.send("STOP")
            async for raw in ws:
                got.append(json.loads(raw))
                if got[-1].get("event") == "stopped":
                    break
        async with websockets.connect(server, ping_interval=None) as ws:  # audio first: realtime's own error
            await ws.send(audio[:1920])
            got.append(json.loads(await ws.recv()))
        return got

    async def refused() -> int:
        try:
            async with websockets.connect(server, additional_headers={"Authorization": "Bearer wrong"}):
                return 101
        except websockets.exceptions.InvalidStatus as exc:
            return exc.response.status_code

    got = asyncio.run(run())
    assert got[0] == {"event": "language_set", "language": "en"} and got[1] == {"event": "started"}
    assert any(m.get("is_final") is True and "sentences" in m for m in got) and got[-2] == {"event": "stopped"}
    assert got[-1]["event"] == "error" and "START" in got[-1]["error"]
    assert asyncio.run(refused()) == 403  # a refused key: the upgrade is refused before any protocol


# -- TLS ------------------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def cert(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """A self-signed certificate for 127.0.0.1/localhost (cryptography if installed, else openssl)."""
    d = tmp_path_factory.mktemp("tls")
    crt, key = d / "server.crt", d / "server.key"
    try:
        import datetime

        from cryptography import x509
        from cryptography.hazmat.primitives import hashes, serialization
        from cryptography.hazmat.primitives.asymmetric import ec
        from cryptography.x509.oid import NameOID
    except ImportError:
        r = subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2", "-subj",
                            "/CN=localhost", "-addext", "subjectAltName=DNS:localhost,IP:127.0.0.1",
                            "-keyout", str(key), "-out", str(crt)], capture_output=True, text=True)
        if r.returncode:
            pytest.skip(f"no cryptography package and openssl failed: {r.stderr}")
        return crt, key
    import ipaddress

    k = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "localhost")])
    now = datetime.datetime.now(datetime.timezone.utc)
    c = (x509.CertificateBuilder().subject_name(name).issuer_name(name).public_key(k.public_key())
         .serial_number(x509.random_serial_number()).not_valid_before(now - datetime.timedelta(minutes=5))
         .not_valid_after(now + datetime.timedelta(days=2))
         .add_extension(x509.SubjectAlternativeName([x509.DNSName("localhost"),
                                                     x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]), False)
         .sign(k, hashes.SHA256()))
    crt.write_bytes(c.public_bytes(serialization.Encoding.PEM))
    key.write_bytes(k.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.TraditionalOpenSSL,
                                    serialization.NoEncryption()))
    return crt, key


def test_2pass_over_tls(tiny: fun_asr.Session, cert: tuple[Path, Path]) -> None:
    crt, key = cert
    audio = _pcm(EXAMPLES / "zh_weather.wav")
    verified = ssl.create_default_context(cafile=str(crt))
    funasr_like = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)  # what funasr_wss_client.py --ssl 1 builds
    funasr_like.check_hostname = False
    funasr_like.verify_mode = ssl.CERT_NONE
    with _serve(tiny, MAX_NEW, crt, key) as port:
        for ctx in (verified, funasr_like):
            msgs = funasr_wss_client(f"wss://127.0.0.1:{port}/", audio, "2pass", pace=0.01, ssl_ctx=ctx)
            check_fields(msgs, "2pass")
            assert _texts(msgs, "2pass-offline") == [t.strip() for t in local_sentences(tiny, audio)]
        with pytest.raises(Exception):  # noqa: B017, PT011 - plain ws to a TLS port fails
            funasr_wss_client(f"ws://127.0.0.1:{port}/", audio[:1920], "2pass")


def test_serve_cli_wss_on_both_ports(tiny_gguf, vad_dir, cert: tuple[Path, Path], tmp_path: Path) -> None:  # noqa: ANN001
    """fun-asr-serve --ssl-certfile/--ssl-keyfile: https and wss on the main port and on FunASR's ws port."""
    import requests

    crt, key = cert
    port, ws_port = _free_port(), _free_port()
    bad = subprocess.run([sys.executable, "-m", "fun_asr.cli.serve", "-m", "nothing.gguf", "--ssl-keyfile", str(key)],
                         capture_output=True, text=True)
    assert bad.returncode == 2 and "--ssl-keyfile needs --ssl-certfile" in bad.stderr
    bad = subprocess.run([sys.executable, "-m", "fun_asr.cli.serve", "-m", "nothing.gguf", "--ssl-certfile",
                          str(tmp_path / "missing.crt")], capture_output=True, text=True)
    assert bad.returncode == 2 and "cannot load the TLS certificate" in bad.stderr
    log = (tmp_path / "log").open("w")
    proc = subprocess.Popen([sys.executable, "-m", "fun_asr.cli.serve", "-m", str(tiny_gguf("q8_0")), "--device",
                             "cpu", "--port", str(port), "--ws-port", str(ws_port), "--vad-model", str(vad_dir),
                             "--max-new-tokens", str(MAX_NEW), "--ssl-certfile", str(crt), "--ssl-keyfile", str(key)],
                            stdout=log, stderr=subprocess.STDOUT, text=True)
    try:
        deadline = time.time() + 120
        while True:
            try:
                if requests.get(f"https://127.0.0.1:{port}/health", timeout=2, verify=str(crt)).ok:
                    break
            except requests.RequestException:
                pass
            assert proc.poll() is None and time.time() < deadline, (tmp_path / "log").read_text()
            time.sleep(0.3)
        assert f"wss://127.0.0.1:{ws_port}/" in (tmp_path / "log").read_text()
        ctx = ssl.create_default_context(cafile=str(crt))

        async def start(p: int) -> dict:
            async with websockets.connect(f"wss://127.0.0.1:{p}/", ssl=ctx, ping_interval=None) as ws:
                await ws.send("START")
                return json.loads(await ws.recv())

        assert asyncio.run(start(port)) == {"event": "started"}
        assert asyncio.run(start(ws_port)) == {"event": "started"}
    finally:
        proc.terminate()
        proc.wait(timeout=60)
        log.close()


# -- real words: the trained demo model -----------------------------------------------------------------------

def test_real_words_arrive_in_2pass_and_online(demo: fun_asr.Session, tmp_path: Path) -> None:
    import trained_model

    clip, words = trained_model.three_utterances_clip(tmp_path, silences=(1.0, 1.6, 1.8, 3.0))
    audio = _pcm(clip)
    with _serve(demo, 64) as port:
        uri = f"ws://127.0.0.1:{port}/"
        msgs = funasr_wss_client(uri, audio, "2pass", pace=0.02)
        check_fields(msgs, "2pass")
        offline = " ".join(_texts(msgs, "2pass-offline"))
        assert trained_model.normalize_text(offline) == words, offline
        assert trained_model.normalize_text(client_view(msgs)) == words
        online_words = trained_model.normalize_text(" ".join(_texts(msgs, "2pass-online")))
        assert online_words and set(online_words) <= set(words), online_words
        got = funasr_wss_client(uri, audio, "online", pace=0.02)
        check_fields(got, "online")
        assert trained_model.normalize_text("".join(m["text"] for m in got)) == words


# -- timestamps: a checkpoint with its CTC head ---------------------------------------------------------------

def test_offline_pass_timestamps_with_a_ctc_head(nano: dict[str, Path], vad_dir: Path) -> None:  # noqa: ANN001
    """The ModelScope layout carries the CTC head: offline-pass messages get ``timestamp`` (a JSON string the
    html5 page can index) and ``stamp_sents`` (funasr-runtime's shape), on the stream's clock; the online pass
    never has them."""
    from funasr_nano_ref import nano_reference_available

    if not nano_reference_available():
        pytest.skip("funasr 1.4.16 (+ six, tiktoken) not installed: no FunASR-layout test checkpoint")
    session = fun_asr.Session(nano["ms-f32"], device="cpu", vad="fsmn", vad_model=vad_dir)
    audio = _pcm(EXAMPLES / "zh_weather.wav")
    duration_ms = len(audio) // 32
    with _serve(session, 16) as port:
        for mode in ("2pass", "offline"):
            msgs = funasr_wss_client(f"ws://127.0.0.1:{port}/", audio, mode, pace=0.005)
            check_fields(msgs, mode)
            timed = [m for m in msgs if "timestamp" in m]
            assert timed and all(m["mode"] in ("2pass-offline", "offline") for m in timed), msgs
            for m in timed:
                pairs = json.loads(m["timestamp"])
                assert pairs and all(0 <= a <= b <= duration_ms + 60 for a, b in pairs)
                assert [p for s in m["stamp_sents"] for p in s["ts_list"]] == pairs  # BMP text: one per unit
                assert pairs == sorted(pairs)


# -- the connection's plumbing, over a stand-in socket (fast: no model, no server) ------------------------------

class _Socket:
    """A Starlette WebSocket stand-in: ``inbox`` holds what the client sends (``receive`` waits on it; with
    ``endless`` it returns that message whenever the inbox is empty), ``sent`` what the server sent;
    ``stalled``: the client reads nothing, so every send waits (until ``unstalled`` is set)."""

    def __init__(self, *, endless: dict[str, Any] | None = None, stalled: bool = False) -> None:
        from types import SimpleNamespace

        self.inbox: asyncio.Queue[dict[str, Any]] = asyncio.Queue()
        self.endless = endless
        self.unstalled = asyncio.Event()
        if not stalled:
            self.unstalled.set()
        self.sent: list[dict[str, Any]] = []
        self.received = 0
        self.close_code: int | None = None
        self.changed = asyncio.Event()
        self.scope: dict[str, Any] = {"subprotocols": ["binary"]}
        self.headers: dict[str, str] = {}
        self.query_params: dict[str, str] = {}
        self.url = SimpleNamespace(path="/")
        self.client = None

    def text(self, obj: Any) -> None:
        self.inbox.put_nowait({"type": "websocket.receive", "text": obj if isinstance(obj, str) else json.dumps(obj)})

    def audio(self, data: bytes) -> None:
        self.inbox.put_nowait({"type": "websocket.receive", "bytes": data})

    def hang_up(self) -> None:
        self.inbox.put_nowait({"type": "websocket.disconnect", "code": 1000})

    async def accept(self, subprotocol: str | None = None) -> None:
        pass

    async def receive(self) -> dict[str, Any]:
        self.received += 1
        if self.endless is not None and self.inbox.empty():
            return self.endless
        return await self.inbox.get()

    async def send_text(self, text: str) -> None:
        await self.unstalled.wait()
        self.sent.append(json.loads(text))
        self.changed.set()

    async def close(self, code: int = 1000, reason: str | None = None) -> None:
        if self.close_code is None:
            self.close_code = code

    async def until(self, pred: Any, timeout: float = 60.0) -> None:
        async def wait() -> None:
            while not pred():
                self.changed.clear()
                await self.changed.wait()
        await asyncio.wait_for(wait(), timeout)  # (a safety net: nothing here is timed)

    def acks(self) -> list[dict[str, Any]]:
        return [m for m in self.sent if m.get("is_end")]


class _FakeStream:
    def __init__(self) -> None:
        self.fed = 0
        self.closed = False
        self.postprocess = None

    def feed(self, pcm: bytes, rate: int) -> list[Any]:
        self.fed += len(pcm)
        return []

    def close(self) -> list[Any]:
        self.closed = True
        return []


class _FakeSession:
    """What the 2pass connection asks of a Session, with streams that count the bytes they take."""

    max_segment_seconds = 30.0

    def __init__(self) -> None:
        self.vad = object()
        self.streams: list[_FakeStream] = []

    def stream(self, *args: Any, **kwargs: Any) -> _FakeStream:
        self.streams.append(_FakeStream())
        return self.streams[-1]

    def options(self, *args: Any, **kwargs: Any) -> None:
        return None

    def normalize_language(self, value: Any) -> Any:
        return None if value in (None, "", "auto") else value


def _limits(**kw: Any) -> Any:
    from fun_asr.serve.protocols.funasr_realtime import RealtimeLimits

    return RealtimeLimits(**kw)


def _start(ws: _Socket, session: Any, limits: Any, counter: list[int]) -> asyncio.Task:
    from types import SimpleNamespace

    return asyncio.create_task(serve_websocket(ws, session, SimpleNamespace(submit=None), limits, counter, MAX_NEW,
                                               authorized=True))


def test_text_messages_are_bounded_by_back_pressure_too() -> None:
    """A client that reads nothing (the worker waits on its send) and floods small JSON messages: the reader
    stops reading after MAX_QUEUED_TEXTS of them, as it stops for audio, instead of queueing without end."""

    async def run() -> tuple[int, int]:
        ws = _Socket(endless={"type": "websocket.receive", "text": '{"x": 1}'}, stalled=True)
        ws.text({"mode": "2pass", "x": 1})  # the worker answers it with a warning: stuck in that send
        task = _start(ws, _FakeSession(), _limits(), [0])
        for _ in range(20000):  # the event loop's turns, not time: unbounded, the reader takes ~1 a turn
            await asyncio.sleep(0)
        got, sent = ws.received, len(ws.sent)
        ws.endless = None  # the client reads again, stops flooding and hangs up: all ends
        ws.unstalled.set()
        ws.hang_up()
        await asyncio.wait_for(task, 60)
        return got, sent

    received, sent = asyncio.run(run())
    assert sent == 0  # (the client read nothing)
    assert received <= 64 + 3, received  # the runtime protocol's MAX_QUEUED_TEXTS, the first message, one in hand


def test_stream_max_seconds_ends_the_utterance_as_the_realtime_protocol_does() -> None:
    """Past --stream-max-seconds: an error naming the limit first, the stream gets exactly the limit's audio
    and is closed, the rest of the utterance is refused (counted in its final message), nothing later opens a
    fresh stream for it, and the connection stays open for the next utterance."""

    async def run() -> tuple[_Socket, _FakeSession, list[int]]:
        ws, session, counter = _Socket(), _FakeSession(), [0]
        ws.text({"mode": "2pass", "wav_name": "w", "wav_format": "pcm", "audio_fs": 16000, "is_speaking": True})
        for _ in range(5):
            ws.audio(b"\x01\x00" * 8000)  # 0.5 s each: 2.5 s in all, the limit is 1 s
        ws.text({"is_speaking": False, "is_end": True})
        ws.audio(b"\x01\x00" * 8000)  # the next utterance, under the limit
        ws.text({"is_speaking": False, "is_end": True})
        task = _start(ws, session, _limits(max_seconds=1.0), counter)
        await ws.until(lambda: len(ws.acks()) == 2)
        assert ws.close_code is None  # still open
        ws.hang_up()
        await asyncio.wait_for(task, 60)
        return ws, session, counter

    ws, session, counter = asyncio.run(run())
    assert [s.fed for s in session.streams] == [32000, 16000] and all(s.closed for s in session.streams)
    first_ack = ws.sent.index(ws.acks()[0])
    errors = [m for m in ws.sent[:first_ack] if "error" in m]
    assert "--stream-max-seconds" in errors[0]["error"] and "after 1 s is not transcribed" in errors[0]["error"]
    final = ws.sent[first_ack - 1]
    assert final["is_final"] is True and "48000 bytes of audio were not transcribed" in final["error"]
    assert all(not m["is_final"] for m in ws.sent[:first_ack - 1])  # is_final on the utterance's last only
    assert ws.acks()[0]["is_final"] is False and "--stream-max-seconds" in ws.acks()[0]["error"]
    assert ws.acks()[1]["is_final"] is True and "error" not in ws.acks()[1]
    assert ws.close_code == 1000 and counter == [0]


def test_long_wav_name_is_cut_and_logged_safely(caplog: pytest.LogCaptureFixture) -> None:
    name = "evil\nINFO forged log line " * 40  # 1000 characters with line breaks
    assert len(name) > 256

    async def run() -> _Socket:
        ws = _Socket()
        ws.text({"mode": "2pass", "wav_name": name, "is_speaking": True})
        ws.text({"mode": "3pass", "wav_name": name})  # an error, which is logged with the name
        ws.text({"wav_name": name, "is_speaking": False, "is_end": True})  # (html5 repeats the name)
        task = _start(ws, _FakeSession(), _limits(), [0])
        await ws.until(lambda: len(ws.acks()) == 1)
        ws.hang_up()
        await asyncio.wait_for(task, 60)
        return ws

    with caplog.at_level("INFO", logger="fun_asr.server"):
        ws = asyncio.run(run())
    assert all(m["wav_name"] == name[:256] for m in ws.sent)
    cut = [m["warning"] for m in ws.sent if "wav_name of" in m.get("warning", "")]
    assert cut == [f"wav_name of {len(name)} characters cut to its first 256: {name[:40]!r}..."]
    lines = [r.getMessage() for r in caplog.records if r.name == "fun_asr.server" and "3pass" in r.getMessage()]
    assert lines and all("\n" not in line for line in lines)


def test_unknown_fields_are_named_once_per_connection() -> None:
    async def run() -> _Socket:
        ws = _Socket()
        ws.text({"mode": "2pass", "bogus": 1, "is_speaking": True})
        ws.text({"bogus": 2, "other": 3})
        ws.text({"bogus": 3, "other": 4, "is_speaking": False, "is_end": True})
        task = _start(ws, _FakeSession(), _limits(), [0])
        await ws.until(lambda: len(ws.acks()) == 1)
        ws.hang_up()
        await asyncio.wait_for(task, 60)
        return ws

    ws = asyncio.run(run())
    assert [m["warning"] for m in ws.sent if "warning" in m] == ["ignored unknown fields: bogus",
                                                                   "ignored unknown fields: other"]


def test_replay_reads_only_through_receive() -> None:
    """The realtime protocol reads with receive only; any other reader would skip the replayed first message, so the
    replaying socket has none (and forwards no socket's own)."""

    async def run() -> list[Any]:
        ws = _Socket()
        ws.text("START")
        replay = ws_core.Replay(ws, {"type": "websocket.receive", "text": "LANGUAGE:en"})
        got = [await replay.receive(), await replay.receive()]
        for name in ("receive_text", "receive_bytes", "receive_json", "iter_text"):
            with pytest.raises(AttributeError):
                getattr(replay, name)
        return got

    assert [m["text"] for m in asyncio.run(run())] == ["LANGUAGE:en", "START"]


def test_a_connection_awaiting_its_first_message_holds_a_stream() -> None:
    """--max-streams counts a connection from its accept: while one waits for its first message (max 1), the
    next is refused at once (close 1013) with a message both protocols' clients read; the waiting one is then
    served by either protocol without being refused itself."""

    async def run() -> tuple[_Socket, _Socket, _Socket, list[int]]:
        limits, counter, session = _limits(max_streams=1), [0], _FakeSession()
        quiet = _Socket()
        first = _start(quiet, session, limits, counter)
        for _ in range(10):
            await asyncio.sleep(0)
        assert counter == [1]
        late = _Socket()
        await asyncio.wait_for(_start(late, session, limits, counter), 10)
        quiet.text("LANGUAGE:")  # the realtime protocol, in the slot it held
        await quiet.until(lambda: bool(quiet.sent))
        quiet.hang_up()
        await asyncio.wait_for(first, 60)
        again = _Socket()  # the slot is free again: a 2pass connection
        again.text({"mode": "offline", "is_speaking": False, "is_end": True})
        task = _start(again, session, limits, counter)
        await again.until(lambda: bool(again.acks()))
        again.hang_up()
        await asyncio.wait_for(task, 60)
        return quiet, late, again, counter

    quiet, late, again, counter = asyncio.run(run())
    assert late.close_code == 1013 and len(late.sent) == 1
    refusal = late.sent[0]
    assert refusal["event"] == "error" and "--max-streams" in refusal["error"]  # the realtime clients' event
    assert refusal["is_end"] is True and refusal["is_final"] is False and refusal["mode"] == "2pass"  # and 2pass'
    assert quiet.sent[0] == {"event": "language_set", "language": ""}
    assert again.acks()[0]["is_final"] is True
    assert counter == [0]


def test_app_gives_the_websocket_its_upload_limit(monkeypatch: pytest.MonkeyPatch) -> None:
    """fun-asr-serve --max-upload-mb is the 2pass protocol's limit on a non-PCM upload too."""
    from fastapi.routing import APIWebSocketRoute

    from fun_asr.serve import app as app_mod

    seen: dict[str, Any] = {}

    async def recorder(*args: Any, **kwargs: Any) -> None:
        seen.update(kwargs)

    monkeypatch.setattr(app_mod, "serve_websocket", recorder)
    app = app_mod.create_app(_FakeSession(), model_id="m", max_upload_mb=3.5)  # type: ignore[arg-type]
    route = next(r for r in app.routes if isinstance(r, APIWebSocketRoute))
    asyncio.run(route.endpoint(_Socket(), ""))
    assert seen["max_file_mb"] == 3.5


def test_file_upload_limit_is_max_file_mb() -> None:
    """A non-PCM upload over max_file_mb is refused (reported), not held."""

    async def run() -> _Socket:
        from types import SimpleNamespace

        ws = _Socket()
        ws.text({"mode": "offline", "wav_format": "mp3", "is_speaking": True})
        ws.audio(b"\x00" * 600_000)
        ws.text({"is_speaking": False, "is_end": True})
        task = asyncio.create_task(serve_websocket(ws, _FakeSession(), SimpleNamespace(submit=None), _limits(), [0],
                                                   MAX_NEW, authorized=True, max_file_mb=0.5))
        await ws.until(lambda: bool(ws.acks()))
        ws.hang_up()
        await asyncio.wait_for(task, 60)
        return ws

    ack = asyncio.run(run()).acks()[0]
    assert ack["is_final"] is False and "file input over 0.5 MB" in ack["error"]
