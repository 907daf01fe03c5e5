"""Real-time streaming: Session.stream(), FunASR's realtime WebSocket protocol, fun-asr-transcribe --stream."""

from __future__ import annotations

import asyncio
import json
import os
import re
import socket
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import soundfile as sf

import fun_asr
import funasr_ref
from fun_asr.asr.stream import StreamOptions, plain_decoder
from fun_asr.audio.decode import AudioError

pytestmark = pytest.mark.filterwarnings("ignore::fun_asr.notices.TruncatedOutputWarning")

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"
SR = 16000
MAX_NEW = 5
OPTS = StreamOptions(max_new_tokens=MAX_NEW, partial_max_new_tokens=3)


def _load(name: str) -> np.ndarray:
    x, rate = sf.read(EXAMPLES / name, dtype="float32")
    assert rate == SR
    return x


@pytest.fixture(scope="module")
def conversation() -> np.ndarray:
    """Silence, three utterances with 2.6-3 s pauses (the realtime server closes a short sentence after
    2 s of silence), silence."""
    rng = np.random.default_rng(5)
    quiet = lambda s: (2e-4 * rng.standard_normal(int(s * SR))).astype(np.float32)  # noqa: E731
    return np.concatenate([quiet(1.0), _load("en_hello.wav"), quiet(2.6), _load("zh_weather.wav"), quiet(3.0),
                           _load("ja_hello.wav"), quiet(1.2)])


@pytest.fixture(scope="module")
def vad_gguf(vad_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    from fun_asr.converter.vad import convert_vad

    out = tmp_path_factory.mktemp("svad") / "vad.gguf"
    convert_vad(vad_dir, out)
    return out


@pytest.fixture(scope="module")
def session(tiny_gguf, vad_gguf: Path) -> fun_asr.Session:  # noqa: ANN001
    return fun_asr.Session(tiny_gguf("f32"), device="cpu", vad="fsmn", vad_model=vad_gguf)


def _run(session: fun_asr.Session, x: np.ndarray, chunk: int, **kw) -> tuple[list, object]:  # noqa: ANN003
    st = session.stream(stream_options=OPTS, max_new_tokens=MAX_NEW, **kw)
    events = []
    for i in range(0, x.size, chunk):
        events += st.feed(x[i : i + chunk])
    events += st.close()
    return events, st


def _sentences(events: list) -> list[tuple]:
    return [(e.text, e.start, e.end, tuple(e.tokens)) for e in events if e.type == "sentence"]


@pytest.fixture(scope="module")
def reference_run(session: fun_asr.Session, conversation: np.ndarray) -> tuple[list, object]:
    return _run(session, conversation, 960)


def test_sentences_do_not_depend_on_chunking(session: fun_asr.Session, conversation: np.ndarray,
                                             reference_run: tuple) -> None:
    events, st = reference_run
    want = _sentences(events)
    assert len(want) == 3, want
    for chunk in (160, SR, conversation.size):  # 10 ms, 1 s, all at once
        got, _ = _run(session, conversation, chunk)
        assert _sentences(got) == want, chunk
    final = st.response(is_final=True)
    assert final["is_final"] and final["partial"] == "" and final["duration_ms"] == conversation.size * 1000 // SR
    assert [(s["start"], s["end"]) for s in final["sentences"]] == [(w[1], w[2]) for w in want]


def test_speculative_closing_decodes_give_the_same_sentences(session: fun_asr.Session, conversation: np.ndarray,
                                                             reference_run: tuple) -> None:
    """In the VAD's end silence the partial decodes the sentence as the VAD would close it if the silence went
    on; the VAD then closes it there and that decode is the sentence's, with no decode at the close. The
    sentences are exactly those of a stream without speculation (which decodes every one when it closes)."""
    events, st = reference_run
    closing: dict[str, list[int]] = {"on": [], "off": []}
    runs = {}
    for mode, silence in (("on", OPTS.speculate_silence_ms), ("off", 0)):
        opts = StreamOptions(max_new_tokens=MAX_NEW, partial_max_new_tokens=3, speculate_silence_ms=silence)
        stream = session.stream(stream_options=opts, max_new_tokens=MAX_NEW)
        real = stream._decode_local

        def decoder(audio: np.ndarray, n: int, *, draft: list[int] | None = None, partial: bool = False,
                    speculative: bool = False, mode: str = mode, real: object = real) -> tuple[str, list[int]]:
            if not partial:
                closing[mode].append(audio.size)
            return real(audio, n)  # type: ignore[operator]

        stream._decode_fn = decoder
        got = []
        for i in range(0, conversation.size, 960):
            got += stream.feed(conversation[i : i + 960])
        got += stream.close()
        runs[mode] = (_sentences(got), stream)
    assert runs["on"][0] == runs["off"][0] == _sentences(events) and len(runs["off"][0]) == 3
    on, off = runs["on"][1], runs["off"][1]
    assert off.sentences_speculated == 0 and len(closing["off"]) == 3
    # the first two close after 2 s of silence (the last one at close(), with no end silence)
    assert on.sentences_speculated >= 2 and len(closing["on"]) == 3 - on.sentences_speculated
    assert st.sentences_speculated == on.sentences_speculated
    # options changed after the speculative decode (a server's HOTWORDS: mid-sentence): that decode is not the
    # sentence's any more (the pause goes on, so it is speculated again with the new options)
    import dataclasses

    stream = session.stream(stream_options=OPTS, max_new_tokens=MAX_NEW)
    changed = False
    got = []
    for i in range(0, conversation.size, 960):
        got += stream.feed(conversation[i : i + 960])
        if stream._spec is not None and not changed:
            stream.opts, changed = dataclasses.replace(stream.opts, hotwords=("zebra",)), True
    got += stream.close()
    first = _sentences(got)[0]
    cut = conversation[first[1] * 16 : first[2] * 16]
    r = session.transcribe(cut, sample_rate=SR, max_new_tokens=MAX_NEW, vad=False, hotwords=["zebra"])
    assert first[3] == tuple(t for seg in r.segments for t in seg.tokens)
    assert first[3] != _sentences(events)[0][3]  # (the hotword changes this sentence: the check can fail)


def test_stale_partials_are_skipped_when_audio_arrives_in_bulk(session: fun_asr.Session,
                                                               conversation: np.ndarray) -> None:
    """A feed that carries many 60 ms steps (a client ahead of real time, or audio that queued up while a
    decode ran) decodes at most one partial, for its newest audio; sentences are unchanged."""
    st = session.stream(stream_options=OPTS, max_new_tokens=MAX_NEW)
    calls = []
    real = st._decode_fn
    st._decode_fn = plain_decoder(lambda audio, n: (calls.append(n), real(audio, n))[1])
    per_feed = []
    for i in range(0, conversation.size, 2 * SR):  # 2 s per feed: two partials due in each
        before = len(calls)
        events = st.feed(conversation[i : i + 2 * SR])
        partial_decodes = sum(1 for n in calls[before:] if n == OPTS.partial_max_new_tokens)
        per_feed.append(partial_decodes)
        assert sum(e.type == "partial" for e in events) <= 1
    st.close()
    assert max(per_feed) == 1 and sum(per_feed) >= 2, per_feed
    lat = st.latency()
    assert lat["sentence_close"]["count"] == len(st.sentences) == 3


def test_skipped_partials_are_asked_again_and_leave_the_sentences_alone(session: fun_asr.Session,
                                                                        conversation: np.ndarray,
                                                                        reference_run: tuple) -> None:
    """A decoder that takes ``partial=`` may skip a partial (the server's batcher, busy with closed sentences):
    the stream asks again one 60 ms step later, and its sentences are those of a plain stream."""
    events, plain = reference_run
    want = _sentences(events)
    assert len(want) == 3 and plain.partials_decoded >= 3
    calls: list[tuple[int, bool]] = []

    def skipping(audio: np.ndarray, n: int, *, draft: list[int] | None = None, partial: bool = False,
                 speculative: bool = False) -> tuple[str, list[int]] | None:
        calls.append((audio.size, partial))
        if partial and sum(1 for _, p in calls if p) % 2 == 1:  # every other partial skipped
            return None
        return plain._decode_local(audio, n)

    got, st = _run(session, conversation, 960, decoder=skipping)
    assert _sentences(got) == want
    assert st.partials_skipped >= 2 and st.partials_decoded >= 2
    # the closed sentences: decoded with partial=False, or taken from their speculative partial decode
    assert sum(1 for _, p in calls if not p) + st.sentences_speculated == 3
    retried = [b - a for (a, pa), (b, pb) in zip(calls, calls[1:], strict=False) if pa and pb]
    assert any(0 < d <= 960 for d in retried), retried  # one 60 ms step later, not 960 ms


def test_each_sentence_is_what_transcribe_gives_for_its_segment(session: fun_asr.Session, conversation: np.ndarray,
                                                                reference_run: tuple) -> None:
    events, _ = reference_run
    for text, start, end, tokens in _sentences(events):
        cut = conversation[start * 16 : end * 16]
        r = session.transcribe(cut, sample_rate=SR, max_new_tokens=MAX_NEW, vad=False)
        assert r.text == text and [t for s in r.segments for t in s.tokens] == list(tokens)
    for ev in (e for e in events if e.type == "sentence"):  # its confidence: the same decode's token numbers
        cut = conversation[ev.start * 16 : ev.end * 16]
        r = session.transcribe(cut, sample_rate=SR, max_new_tokens=MAX_NEW, vad=False)
        lps = [lp for s in r.segments for lp in s.token_logprobs]
        assert ev.avg_logprob == pytest.approx(sum(lps) / len(lps), abs=1e-12) and 0 < ev.confidence <= 1


def test_partials_come_first_and_on_schedule(session: fun_asr.Session, conversation: np.ndarray) -> None:
    """FunASR's partial schedule, exactly, with speculation off (on, one more partial comes in a pause:
    test_speculative_closing_decodes_give_the_same_sentences)."""
    st = session.stream(stream_options=StreamOptions(max_new_tokens=MAX_NEW, partial_max_new_tokens=3,
                                                     speculate_silence_ms=0), max_new_tokens=MAX_NEW)
    events = []
    for i in range(0, conversation.size, 960):
        events += st.feed(conversation[i : i + 960])
    events += st.close()
    sentences = [e for e in events if e.type == "sentence"]
    for s in sentences:
        before = [e for e in events[: events.index(s)] if e.type == "partial" and e.start >= s.start]
        assert before, "every sentence was preceded by partials of it"
        first = before[0]
        assert first.end - s.start >= 480  # at least 480 ms of the sentence had arrived
        assert all(e.end - e.start <= 8000 for e in before)  # at most the last 8 s
        ends = [e.end for e in before]
        assert all(b - a >= 960 for a, b in zip(ends, ends[1:], strict=False))  # then every 960 ms
    lat = st.latency()
    assert lat["sentence_final"]["count"] == len(sentences) and "p95" in lat["sentence_final"]
    assert lat["first_partial"]["count"] == len(sentences)


def test_input_forms_and_errors(session: fun_asr.Session, conversation: np.ndarray, reference_run: tuple) -> None:
    pcm16 = (np.clip(conversation, -1, 1) * 32767).astype(np.int16)
    want = _sentences(_run(session, pcm16.astype(np.float32) / 32768, 960)[0])  # the same samples, as floats
    st = session.stream(stream_options=OPTS, max_new_tokens=MAX_NEW)
    ev = []
    for i in range(0, pcm16.size, 1600):
        ev += st.feed(pcm16[i : i + 1600].tobytes())  # raw int16 bytes, as the WebSocket gets them
    ev += st.close()
    assert _sentences(ev) == want
    import soxr

    x8k = soxr.resample(conversation, SR, 8000).astype(np.float32)
    st = session.stream(stream_options=OPTS, max_new_tokens=MAX_NEW)
    ev = []
    for i in range(0, x8k.size, 800):
        ev += st.feed(x8k[i : i + 800], sample_rate=8000)
    ev += st.close()
    assert len(_sentences(ev)) == 3
    st = session.stream(stream_options=OPTS)
    with pytest.raises(AudioError, match="even byte count"):
        st.feed(b"\x00\x01\x02")
    with pytest.raises(AudioError, match="NaN"):
        st.feed(np.array([0.0, np.nan], np.float32))
    with pytest.raises(AudioError, match="ambiguous"):  # either layout: transcribe refuses it too
        st.feed(np.zeros((20, 2), np.float32))
    with pytest.raises(AudioError, match="unsupported sample dtype int64"):
        st.feed(np.zeros(100, np.int64))
    st.feed(np.zeros(1600, np.float32))
    with pytest.raises(AudioError, match="sample_rate changed"):
        st.feed(np.zeros(1600, np.float32), sample_rate=8000)
    st.close()
    with pytest.raises(RuntimeError, match="closed"):
        st.feed(np.zeros(10, np.float32))
    with pytest.raises(ValueError, match="needs the FSMN-VAD"):
        fun_asr.Session(session.path, device="cpu", vad=None).stream()


def _pieces(n: int, size: int, tail: int = 20) -> list[slice]:
    """Slices of ``size`` frames, the last one ``tail`` frames (32 or fewer: a 2-D piece that short could be
    either layout by its shape alone)."""
    bounds = [*range(0, n - tail, size), n - tail, n]
    return [slice(a, b) for a, b in zip(bounds, bounds[1:], strict=False) if b > a]


def _stream_sentences(session: fun_asr.Session, audio: np.ndarray, channels_first: bool = False) -> list[tuple]:
    st = session.stream(max_new_tokens=MAX_NEW)
    events = []
    for piece in _pieces(audio.shape[-1] if channels_first else audio.shape[0], 1600):
        events += st.feed(audio[:, piece] if channels_first else audio[piece], sample_rate=SR)
    events += st.close()
    return _sentences(events)


def test_feed_takes_stereo_as_transcribe_does(demo: fun_asr.Session, three: Path) -> None:
    """feed() takes the arrays transcribe() takes: [samples, channels] float and [channels, samples] int16 PCM,
    fed in pieces (the last one 20 frames, read with the layout of the pieces before it), give the sentences of
    their mono mix; each piece is downmixed exactly as transcribe's reader downmixes it."""
    from fun_asr.audio.decode import decode_audio
    from fun_asr.audio.live import LiveAudio

    x, rate = sf.read(three, dtype="float32")
    assert rate == SR
    stereo = np.stack([x, 0.5 * np.roll(x, 40)], axis=1)  # two channels that differ
    pcm = np.ascontiguousarray((np.clip(stereo, -1, 1) * 32767).astype(np.int16).T)  # [channels, samples]
    for a in (stereo, pcm, stereo[:4000].astype(np.float64)):
        assert np.array_equal(LiveAudio().to_16k(a), decode_audio(a, SR)[0])
    want = _stream_sentences(demo, stereo.mean(axis=1))
    assert want and all(text for text, *_ in want), want
    assert _stream_sentences(demo, stereo) == want
    mix16 = (pcm.T.astype(np.float32) / 32768.0).mean(axis=1)
    assert _stream_sentences(demo, pcm, channels_first=True) == _stream_sentences(demo, mix16)
    chunked = demo.stream(mode="chunked")  # the chunked mode's feed reads arrays the same way
    chunked.feed(stereo[:16000], sample_rate=SR)
    assert chunked.received == 16000
    with pytest.raises(AudioError, match="ambiguous"):  # a first 2-D piece that short: no layout to go by
        demo.stream().feed(stereo[:20])


def _readme_stream_example() -> str:
    readme = (Path(__file__).resolve().parents[1] / "README.md").read_text("utf-8")
    blocks = re.findall(r"```python\n(.*?)```", readme, re.S)
    found = [b for b in blocks if "session.stream(" in b and "stream.feed(" in b]
    assert len(found) == 1, "the README's Session.stream() example"
    return found[0]


def test_readme_stream_example_prints_every_sentence(demo: fun_asr.Session, three: Path) -> None:
    """The README's Session.stream() example, run as written: it prints the events feed() returns and those
    close() returns (the last sentence, closed by the end of the audio), so every sentence of the stream."""
    x, _ = sf.read(three, dtype="float32")
    chunks = [x[i : i + 1600] for i in range(0, x.size, 1600)]
    ref = demo.stream(language="en")
    fed = [e for c in chunks for e in ref.feed(c, sample_rate=SR)]
    closing = ref.close()
    assert any(e.type == "sentence" for e in closing), "the clip's last sentence must be closed by close()"
    printed: list[tuple] = []
    exec(_readme_stream_example(), {"session": demo, "chunks": chunks,  # the README's own code
                                    "print": lambda *args: printed.append(args)})
    final, _latency = printed.pop()
    assert printed == [(e.type, e.start, e.end, e.text) for e in fed + closing]
    assert [s["text"] for s in final["sentences"]] == [e.text for e in fed + closing if e.type == "sentence"]


@pytest.mark.skipif(not funasr_ref.funasr_available(), reason="funasr 1.4.16 not importable")
def test_streaming_vad_matches_funasr_realtime_server(session: fun_asr.Session, vad_dir: Path,
                                                      conversation: np.ndarray, reference_run: tuple) -> None:
    ref = funasr_ref.server_vad_segments(vad_dir, conversation, 60, max_single_segment_time=30000)
    ours = [(a, b) for _, a, b, _ in _sentences(reference_run[0])]
    assert len(ours) == len(ref), (ours, ref)
    assert max(max(abs(a - c), abs(b - d)) for (a, b), (c, d) in zip(ours, ref, strict=True)) <= 10, (ours, ref)


# --- WebSocket ----------------------------------------------------------------------------------------

websockets = pytest.importorskip("websockets")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def ws_server(tiny_gguf, vad_gguf: Path, tmp_path_factory: pytest.TempPathFactory):  # noqa: ANN001, ANN201
    import requests

    port = _free_port()
    log = (tmp_path_factory.mktemp("wslog") / "server.log").open("w")
    proc = subprocess.Popen(
        [sys.executable, "-m", "fun_asr.cli.serve", "-m", str(tiny_gguf("f32")), "--port", str(port), "--device",
         "cpu", "--vad", "fsmn", "--vad-model", str(vad_gguf), "--max-new-tokens", str(MAX_NEW), "--ws-port", "0",
         "--max-concurrency", "8"], stdout=log, stderr=subprocess.STDOUT)
    deadline = time.time() + 120
    while True:
        try:
            if requests.get(f"http://127.0.0.1:{port}/health", timeout=1).status_code == 200:
                break
        except requests.RequestException:
            pass
        assert proc.poll() is None and time.time() < deadline, "server did not start"
        time.sleep(0.3)
    yield f"ws://127.0.0.1:{port}/"
    proc.terminate()
    proc.wait(timeout=60)
    log.close()


async def _client(url: str, audio: np.ndarray, extra: list | None = None) -> list[dict]:
    pcm = (np.clip(audio, -1, 1) * 32767).astype(np.int16).tobytes()
    got: list[dict] = []
    async with websockets.connect(url, max_size=None) as ws:
        for cmd in extra or []:
            await ws.send(cmd)
            got.append(json.loads(await ws.recv()))
        await ws.send("START")
        got.append(json.loads(await ws.recv()))

        async def reader() -> None:
            async for msg in ws:
                got.append(json.loads(msg))
                if got[-1].get("event") == "stopped":
                    return

        task = asyncio.create_task(reader())
        for i in range(0, len(pcm), 1920 * 4):  # 240 ms frames
            await ws.send(pcm[i : i + 1920 * 4])
        await ws.send("STOP")
        await asyncio.wait_for(task, 300)
    return got


def _as_pcm16(x: np.ndarray) -> np.ndarray:
    return (np.clip(x, -1, 1) * 32767).astype(np.int16).astype(np.float32) / 32768


def test_websocket_protocol(ws_server: str, session: fun_asr.Session, conversation: np.ndarray) -> None:
    want = [(t, a, b) for t, a, b, _ in _sentences(_run(session, _as_pcm16(conversation), 960)[0])]
    got = asyncio.run(_client(ws_server, conversation, ["LANGUAGE:", "HOTWORDS:"]))
    assert got[0] == {"event": "language_set", "language": ""} and got[1] == {"event": "hotwords_set", "hotwords": []}
    assert got[2] == {"event": "started"} and got[-1] == {"event": "stopped"}
    results = [g for g in got if "sentences" in g]
    final = results[-1]
    assert final["is_final"] and final["partial"] == "" and not any(r["is_final"] for r in results[:-1])
    assert [(s["text"], s["start"], s["end"]) for s in final["sentences"]] == want
    assert all(0 < s["confidence"] <= 1 for s in final["sentences"])  # fun-asr's extra key
    assert any(r["partial"] for r in results[:-1])  # partials reached the client
    durations = [r["duration_ms"] for r in results]
    assert durations == sorted(durations)


async def _errors(url: str) -> list[dict]:
    out = []
    async with websockets.connect(url) as ws:
        await ws.send(b"\x00\x00")  # audio before START
        out.append(json.loads(await ws.recv()))
        await ws.send("DANCE")
        out.append(json.loads(await ws.recv()))
        await ws.send("LANGUAGE:kling\x01on")  # any language name passes (as FunASR); a control character not
        out.append(json.loads(await ws.recv()))
        await ws.send("START")
        out.append(json.loads(await ws.recv()))
        await ws.send(b"\x00\x01\x02")  # not 16-bit PCM
        out.append(json.loads(await ws.recv()))
        await ws.send(np.zeros(SR, np.int16).tobytes())  # still usable
        await ws.send("STOP")
        while True:
            out.append(json.loads(await ws.recv()))
            if out[-1].get("event") == "stopped":
                break
    return out


def test_websocket_errors_keep_the_connection(ws_server: str) -> None:
    got = asyncio.run(_errors(ws_server + "any/path/works"))
    assert got[0]["event"] == "error" and "START" in got[0]["error"]
    assert got[1]["event"] == "error" and "unknown command 'DANCE'" in got[1]["error"]
    assert got[2]["event"] == "error" and "control character" in got[2]["error"]
    assert got[3] == {"event": "started"}
    assert got[4]["event"] == "error" and "int16 PCM" in got[4]["error"]
    assert got[-2]["is_final"] and got[-2]["duration_ms"] == 1000 and got[-1] == {"event": "stopped"}


async def _edge_cases(url: str) -> list[list[dict]]:
    out: list[list[dict]] = []
    async with websockets.connect(url) as ws:

        async def until_stopped() -> list[dict]:
            got = []
            while not got or got[-1].get("event") != "stopped":
                got.append(json.loads(await asyncio.wait_for(ws.recv(), 60)))
            return got

        await ws.send("START")
        await ws.send("STOP")  # no audio at all
        out.append(await until_stopped())
        await ws.send("START")
        await ws.send(np.zeros(SR // 2, np.int16).tobytes())
        await ws.send("START")  # a second START during the stream
        await ws.send(np.zeros(SR // 2, np.int16).tobytes())
        await ws.send("STOP")
        out.append(await until_stopped())
        await ws.send("HOTWORDS:" + ",".join(f"w{i}" for i in range(201)))
        out.append([json.loads(await asyncio.wait_for(ws.recv(), 60))])
    return out


def test_websocket_stop_without_audio_and_a_second_start(ws_server: str) -> None:
    """START then STOP with no audio gets a final result (is_final, no sentences) before
    `stopped`; a START during a stream gets an error event and the stream goes on; a limit names the
    protocol's command, not the Python API's Limits field."""
    empty, twice, hotwords = asyncio.run(_edge_cases(ws_server))
    assert empty[0] == {"event": "started"} and empty[-1] == {"event": "stopped"} and len(empty) == 3
    assert empty[1] == {"sentences": [], "partial": "", "partial_start_ms": 0, "duration_ms": 0, "is_final": True}
    assert twice[0] == {"event": "started"} and twice[-1] == {"event": "stopped"}
    errors = [m for m in twice if m.get("event") == "error"]
    assert len(errors) == 1 and "START during a stream: send STOP first" in errors[0]["error"]
    assert [m for m in twice if m.get("event") == "started"] == [twice[0]]
    final = [m for m in twice if m.get("is_final")]
    assert len(final) == 1 and final[0]["duration_ms"] == 1000  # both halves: the stream went on
    assert hotwords[0]["event"] == "error" and "Limits" not in hotwords[0]["error"]
    assert hotwords[0]["error"].startswith("HOTWORDS: 201 hotwords; at most 200 are accepted"), hotwords


def test_eight_concurrent_streams_unmixed(ws_server: str, session: fun_asr.Session, conversation: np.ndarray) -> None:
    rng = np.random.default_rng(9)
    clips = []
    for k in range(8):
        parts = [_load(n) for n in ("en_hello.wav", "zh_weather.wav", "ja_hello.wav")]
        a, b = parts[k % 3], parts[(k + 1) % 3]
        q = lambda s: (2e-4 * rng.standard_normal(int(s * SR))).astype(np.float32)  # noqa: E731
        clips.append(np.concatenate([q(0.5 + 0.1 * k), a * (0.5 + 0.05 * k), q(2.8), b, q(1.0)]))
    expected = []
    for c in clips:
        ev, _ = _run(session, _as_pcm16(c), 960)
        expected.append([(t, a, b) for t, a, b, _ in _sentences(ev)])

    async def many() -> list[list[dict]]:
        return await asyncio.gather(*[_client(ws_server, c) for c in clips])

    results = asyncio.run(many())
    for got, want in zip(results, expected, strict=True):
        final = [g for g in got if g.get("is_final")][-1]
        assert [(s["text"], s["start"], s["end"]) for s in final["sentences"]] == want


# --- CLI ----------------------------------------------------------------------------------------------

def test_cli_stream_from_stdin_and_file(tiny_gguf, vad_gguf: Path, conversation: np.ndarray,  # noqa: ANN001
                                        session: fun_asr.Session, tmp_path: Path) -> None:
    want = [(t, a, b) for t, a, b, _ in _sentences(_run(session, _as_pcm16(conversation), 960)[0])]
    pcm = (np.clip(conversation, -1, 1) * 32767).astype(np.int16).tobytes()
    base = [sys.executable, "-m", "fun_asr.cli.transcribe", "--stream", "-m", str(tiny_gguf("f32")), "--device", "cpu",
            "--vad-model", str(vad_gguf), "--max-new-tokens", str(MAX_NEW), "--quiet"]
    r = subprocess.run([*base, "--raw-pcm", "16000", "-", "-f", "json"], input=pcm, capture_output=True, timeout=600)
    assert r.returncode == 0, r.stderr.decode()
    lines = [json.loads(x) for x in r.stdout.decode().splitlines()]
    assert lines[-1]["type"] == "final" and lines[-1]["is_final"] and "latency_ms" in lines[-1]
    sentences = [x for x in lines if x["type"] == "sentence"]
    assert [(s["text"], s["start"], s["end"]) for s in sentences] == [(t, a, b) for t, a, b in want]
    clip = tmp_path / "talk.flac"
    sf.write(clip, conversation, SR)
    r = subprocess.run([*base, str(clip)], capture_output=True, timeout=600, env={**os.environ})
    assert r.returncode == 0, r.stderr.decode()
    out = r.stdout.decode().splitlines()
    assert len(out) == 3 and out[0].startswith("[00:0") and " --> " in out[0]  # not a terminal: final lines only
    r = subprocess.run([*base, "-", str(clip)], capture_output=True, timeout=60)
    assert r.returncode == 2 and b"--stream takes one input" in r.stderr


class _BrokenStream:
    """A stream whose feed fails with an error the handler does not expect."""

    closed = False
    total_samples = 0

    def __init__(self) -> None:
        self._pending = np.zeros(0, np.float32)

    def feed(self, data: bytes) -> list:
        raise KeyError("boom")

    def response(self, is_final: bool = False) -> dict:
        return {"sentences": [], "partial": "", "partial_start_ms": 0, "duration_ms": 0, "is_final": is_final}


class _FakeSession:
    def stream(self, *args: object, **kwargs: object) -> _BrokenStream:
        return _BrokenStream()

    def options(self, *args: object) -> None:
        return None


class _FakeWebSocket:
    def __init__(self, messages: list[dict]) -> None:
        self.incoming = list(messages)
        self.sent: list[dict] = []

    async def accept(self) -> None:
        return None

    async def receive(self) -> dict:
        await asyncio.sleep(0.05)  # let the worker run between messages
        return self.incoming.pop(0) if self.incoming else {"type": "websocket.disconnect", "code": 1000}

    async def send_text(self, data: str) -> None:
        self.sent.append(json.loads(data))

    async def close(self, code: int = 1000) -> None:
        return None


def test_unexpected_stream_failure_is_reported_and_stop_still_answers() -> None:
    from fun_asr.serve.protocols.funasr_realtime import RealtimeLimits, handle

    ws = _FakeWebSocket([{"type": "websocket.receive", "text": "START"},
                         {"type": "websocket.receive", "bytes": b"\x00\x00" * 160},
                         {"type": "websocket.receive", "bytes": b"\x00\x00" * 160},
                         {"type": "websocket.receive", "text": "STOP"}])
    counter = [0]
    asyncio.run(asyncio.wait_for(handle(ws, _FakeSession(), lambda *a: None, RealtimeLimits(), counter, 8), 30))
    events = [m.get("event") for m in ws.sent]
    assert events[0] == "started" and events[-1] == "stopped", ws.sent
    errors = [m["error"] for m in ws.sent if m.get("event") == "error"]
    assert len(errors) == 2 and all("internal error: KeyError" in e for e in errors)
    assert counter == [0]


def test_vad_predicts_the_end_of_a_sentence_before_it_closes(session: fun_asr.Session,
                                                             conversation: np.ndarray) -> None:
    """VadStream.predicted_end: during the end silence, the end the VAD gives when it closes the sentence
    (1.3 s or more later here), from a copy of its state run over silent frames; asking leaves the VAD's
    own events unchanged."""
    assert session.vad is not None

    def run(ask: bool) -> tuple[list, dict[int, int]]:
        vad = session.vad.stream(60, schedule="server")
        events, predicted = [], {}
        for i in range(0, conversation.size, 960):
            now = (i + 960) * 1000 // SR
            events += [(b, e, now) for b, e in vad.feed(conversation[i : i + 960])]
            if ask:
                end = vad.predicted_end(200)
                if end is not None:
                    predicted.setdefault(end, now)
                elif i < SR // 2:
                    assert not predicted  # silence before any speech: nothing to predict
        return events, predicted

    plain, _ = run(False)
    events, predicted = run(True)
    assert events == plain
    ends = [(e, now) for _, e, now in events if e >= 0]
    assert len(ends) == 2  # (the third closes on the stream's end, without its silence)
    for end, closed_at in ends:
        assert end in predicted and closed_at - predicted[end] >= 1000, (end, closed_at, predicted)
