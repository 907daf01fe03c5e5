"""What fun-asr-serve shows: no server path in anything a client reads (HTTP bodies, error bodies, every
WebSocket protocol's messages), no port it does not serve (FunASR's realtime port only with WebSockets), and
messages in fun-asr-serve's own words (its flags, the request fields), never the Python API's spellings."""

from __future__ import annotations

import asyncio
import contextlib
import errno
import json
import os
import re
import signal
import socket
import subprocess
import sys
import tempfile
import time
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import fun_asr
from fun_asr.asr.pipeline import no_vad_notice
from fun_asr.asr.speakers import no_speaker_model
from fun_asr.errors import Message, render
from fun_asr.notices import Notice

fastapi = pytest.importorskip("fastapi")
requests = pytest.importorskip("requests")
websockets = pytest.importorskip("websockets")
from fastapi.testclient import TestClient  # noqa: E402

from fun_asr.serve.words import HIDDEN, REQUEST_FIELDS, ClientWords  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
EXAMPLES = ROOT / "examples"
MODEL_ID = "fun-asr-nano"
MAX_NEW = 8

# The Python API's spellings, which a fun-asr-serve user cannot type: keyword arguments (``vad_model=``,
# ``diarize=True``; request fields such as spk= and api_key= are the server's own), constructors, module names.
PYTHON_SPELLING = re.compile(rf"(?<![\w-])(?!(?:{'|'.join(REQUEST_FIELDS)})=\w)[a-z_]+=(?!>)|"
                             r"\bSession\(|StreamOptions|\bLimits\b|"
                             r"fun_asr\.|\bdiarize\b|speaker_model|vad_model|max_new_tokens|segment_seconds|"
                             r"system_info|=(?:True|False|None)\b")
FLAG = re.compile(r"(?<![\w-])--[a-z][a-z0-9-]*")


def _serve_flags() -> set[str]:
    from fun_asr.cli.serve import build_parser

    return {opt for action in build_parser()._actions for opt in action.option_strings}


def _foreign_words(text: str) -> list[str]:
    """The Python spellings and the flags fun-asr-serve does not have, in ``text`` (a segment's ``stop_reason``
    is a code: "max_new_tokens" when its text passed the server's --max-new-tokens)."""
    text = text.replace('"stop_reason":"max_new_tokens"', '"stop_reason":""')
    flags = _serve_flags()
    return [m.group(0) for m in PYTHON_SPELLING.finditer(text)] + [f for f in FLAG.findall(text) if f not in flags]


def _server_paths(text: str, extra: list[str]) -> list[str]:
    """Paths on this machine in ``text``: the given strings, the home, the temp and cache folders, and any
    ``/x/...`` whose first part is one of this machine's top-level folders (``/v1/...`` or ``/asr`` are routes)."""
    from fun_asr.converter.hub import cache_dir

    found = [s for s in {*extra, str(Path.home()), tempfile.gettempdir() + os.sep, str(cache_dir())}
             if len(s) > 1 and s in text]
    roots = set(os.listdir("/"))
    found += [m.group(0) for m in re.finditer(r"(?<![\w/.:~-])/([\w.-]+)/[^\s'\"]*", text) if m.group(1) in roots]
    found += re.findall(r"(?<![\w/])~/\S*", text)
    return found


def _pcm(seconds: float = 1.0) -> bytes:
    t = np.arange(int(16000 * seconds)) / 16000
    return (np.sin(2 * np.pi * 220 * t) * 3000).astype(np.int16).tobytes()


# -- the translation itself -------------------------------------------------------------------------------

def test_client_words_hide_paths_and_python_names(tmp_path: Path) -> None:
    model = tmp_path / "cache" / "models" / "demo--0123-q8_0.gguf"

    class FakeSession:  # what ClientWords reads of a Session
        path = model
        _model_arg = "demo"
        vad_source = str(tmp_path / "vad" / "fsmn.gguf")
        speaker_source = None

    words = ClientWords(FakeSession(), MODEL_ID)
    got = words(no_vad_notice(model))
    assert got.startswith(f"{MODEL_ID}: no FSMN-VAD") and "vad_model=" not in got and "vad=None" not in got
    assert "--vad-model" in got and "--vad none" in got
    got = words(no_speaker_model(model))
    assert got.startswith(f"{MODEL_ID}: speaker labels (spk=true) need") and "fun-asr-serve --speaker-model" in got
    assert words(no_speaker_model(model), front="websocket").count("(SPK:true)") == 1
    assert words(words(no_speaker_model(model))) == words(no_speaker_model(model))
    home = str(Path.home())
    for msg, want in [
        (f"[Errno 2] No such file or directory: '{tempfile.gettempdir()}/tmpab12 x.wav'",
         f"[Errno 2] No such file or directory: '{HIDDEN}'"),
        (f"{FakeSession.vad_source}: holds no FSMN-VAD", "holds no FSMN-VAD"),
        (f"cannot read {home}/models/x.gguf: bad", f"cannot read {HIDDEN}: bad"),
        ("see ~/.cache/fun-asr/models/demo.gguf.", f"see {HIDDEN}."),
        ("unknown route GET /v1/nothing: this server has POST /v1/audio/transcriptions, POST /asr, GET /",
         "unknown route GET /v1/nothing: this server has POST /v1/audio/transcriptions, POST /asr, GET /"),
        ("ws://127.0.0.1:10095/ and http://host:8000/v1", "ws://127.0.0.1:10095/ and http://host:8000/v1"),
        ("wrong=>right, 16 kHz mono int16 PCM, wav/flac", "wrong=>right, 16 kHz mono int16 PCM, wav/flac"),
    ]:
        assert words(msg) == want, msg
    assert not _server_paths(words(f"internal error: {model} and {tmp_path}/a b/c"), [str(tmp_path)])
    # the console keeps paths, in the server's flags
    from fun_asr.audio.decode import too_long
    from fun_asr.model.native import _unusable

    said = render(_unusable("cuda", "no GPU is available"), "server-console")
    assert not _foreign_words(said) and "--device cpu" in said
    said = render(no_speaker_model(model), "server-console")
    assert str(model) in said and "(--enable-spk / spk=true)" in said and not _foreign_words(said)
    said = render(too_long("a.wav", 9.0, 5), "server-console")
    assert said.endswith("(--max-audio-seconds)")
    from fun_asr.converter.hub import MODEL_HINT, SPEAKER_HINT, VAD_HINT

    for hint in (MODEL_HINT, VAD_HINT, SPEAKER_HINT):
        said = Message(hint)
        assert not _foreign_words(render(said, "server-console")) and not _foreign_words(words(said)), hint
    # a request field keeps its spelling, as a client sends it
    from fun_asr.asr.options import check_vad_options

    with pytest.raises(ValueError) as exc:
        check_vad_options([(10000, 2000)], False)
    assert words(exc.value) == ("silence_schedule is only used by the dynamic end-silence schedule, which is off here "
                                "(dynamic_silence=false); pass dynamic_silence=true to use the schedule, or leave "
                                "silence_schedule out")


# -- item 1: no server path reaches a client (in-process, with paths forced into every message) ---------------

def test_no_server_path_in_any_response(demo: fun_asr.Session, vad_dir: Path, tmp_path: Path,
                                        monkeypatch: pytest.MonkeyPatch) -> None:
    """Warnings, error bodies (400, 500, the web page's), and the realtime and 2pass WebSocket messages, with
    the model file, the VAD folder, the cache, the home and a temporary file forced into them."""
    from fun_asr.asr.pipeline import Arrivals
    from fun_asr.audio.decode import AudioError
    from fun_asr.converter.hub import cache_dir
    from fun_asr.serve.app import create_app
    from fun_asr.serve.protocols.funasr_runtime import serving as ws_2pass
    from fun_asr.serve.protocols.web import routes as web

    temp = os.path.join(tempfile.gettempdir(), "fun-asr-upload-1234.wav")
    secret = [str(demo.path), str(Path(demo.path).parent), str(vad_dir), str(cache_dir()), temp, str(tmp_path)]
    real = demo.transcribe_batch
    mode = {"fail": None}

    def add_notices(r: Any) -> None:
        r.warnings += [no_vad_notice(demo.path),
                       Notice("input_truncated", f"{temp}: file is truncated"),
                       Notice("word_timestamps_failed", f"alignment failed under {Path.home()}/x and {vad_dir}")]

    def noisy(*a: Any, **k: Any) -> Any:
        if mode["fail"] is not None:
            raise mode["fail"]
        arrivals = k.get("arrivals")
        if arrivals is not None:  # the server's batcher: each result is delivered as soon as it is ready
            k["arrivals"] = Arrivals(arrivals.take, lambda i, r: (add_notices(r), arrivals.deliver(i, r)))
            return real(*a, **k)
        results = real(*a, **k)
        for r in results:
            add_notices(r)
        return results

    monkeypatch.setattr(demo, "transcribe_batch", noisy)
    real_options = demo.options

    def options(*a: Any, **k: Any) -> Any:
        if k.get("diarize"):
            raise no_speaker_model(demo.path)
        return real_options(*a, **k)

    monkeypatch.setattr(demo, "options", options)
    wav = (EXAMPLES / "en_hello.wav").read_bytes()
    bodies: list[str] = []
    app = create_app(demo, model_id=MODEL_ID, max_new_tokens=MAX_NEW)
    with TestClient(app, raise_server_exceptions=False) as client:

        def post(path: str, **data: str) -> Any:
            r = client.post(path, files={"file": ("a.wav", wav, "audio/wav")}, data=data)
            bodies.append(r.text)
            return r

        r = post("/asr")
        assert r.status_code == 200 and "no_vad" in r.json()["warning_codes"]
        assert any(w.startswith(f"{MODEL_ID}: no FSMN-VAD") for w in r.json()["warnings"])
        for fmt in ("json", "verbose_json", "text", "srt", "vtt"):
            assert post("/v1/audio/transcriptions", response_format=fmt).status_code == 200
        assert post("/v1/audio/transcriptions", stream="true").status_code == 200
        v = post("/v1/audio/transcriptions", response_format="verbose_json").json()
        assert v["warning_codes"][-3:] == ["no_vad", "input_truncated", "word_timestamps_failed"]
        r = post("/asr", silence_schedule="10000:2000,inf:100", dynamic_silence="false")
        assert r.status_code == 400 and "dynamic_silence=false" in r.json()["detail"]
        assert post("/asr", spk="true").status_code == 400
        assert post("/v1/audio/transcriptions", spk="true").status_code == 400
        mode["fail"] = ValueError(f"{demo.path}: a.wav: cannot decode {temp}")
        assert post("/asr").status_code == 400 and post("/v1/audio/transcriptions").status_code == 400
        mode["fail"] = OSError(errno.ENOENT, "No such file or directory", temp)
        assert post("/v1/audio/transcriptions").status_code == 500 and post("/asr").status_code == 500
        mode["fail"] = None
        bad = client.post("/asr", files={"file": ("b.wav", b"garbage" * 50, "audio/wav")})
        bodies.append(bad.text)
        assert bad.status_code == 400
        bodies.append(client.get("/nothing/here").text)
        monkeypatch.setattr(web, "STATIC", tmp_path / "gone")
        page = client.get("/")
        bodies.append(page.text)
        assert page.status_code == 500 and "reinstall" in page.text
        for r in (client.get("/health"), client.get("/v1/models")):
            bodies.append(r.text)
        # the realtime protocol: SPK:true's error names the model file
        with client.websocket_connect("/") as ws:
            ws.send_text("SPK:true")
            msg = ws.receive_text()
            bodies.append(msg)
            assert "speaker" in json.loads(msg)["error"] and "(SPK:true)" in msg
        # the 2pass protocol: a file that cannot be decoded, with a decoder error naming a temporary file

        def undecodable(data: bytes, name: str = "") -> Any:
            raise AudioError(f"{name}: cannot decode audio (Error opening '{temp}': Format not recognised)")

        monkeypatch.setattr(ws_2pass, "decode_audio", undecodable)
        with client.websocket_connect("/") as ws:
            ws.send_text(json.dumps({"mode": "offline", "wav_format": "mp3", "wav_name": "w", "is_speaking": True}))
            ws.send_bytes(b"\x00" * 1000)
            ws.send_text(json.dumps({"is_speaking": False, "is_end": True}))
            while True:
                msg = ws.receive_text()
                bodies.append(msg)
                if json.loads(msg).get("is_end"):
                    break
            assert "cannot decode" in msg
    text = "\n".join(bodies)
    assert not _server_paths(text, secret), _server_paths(text, secret)
    assert ".gguf" not in text.replace("a .gguf,", "")  # (the speaker-model hint names the file type)
    # (a segment's stop_reason is a code, "max_new_tokens" when the demo's text passes MAX_NEW tokens)
    assert not _foreign_words(text), _foreign_words(text)


# -- fun-asr-serve itself ---------------------------------------------------------------------------------

def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _wait_healthy(proc: subprocess.Popen, base: str, log: Path) -> None:
    """Until the server at ``base`` answers /health (its log in the failure when it dies or takes 180 s)."""
    deadline = time.time() + 180
    while True:
        try:
            if requests.get(base + "/health", timeout=1).status_code == 200:
                return
        except requests.RequestException:
            pass
        assert proc.poll() is None and time.time() < deadline, log.read_text()
        time.sleep(0.3)


@contextlib.contextmanager
def _serve(args: list[str], log: Path, env: dict[str, str] | None = None) -> Iterator[str]:
    """fun-asr-serve -m demo ARGS on a free port until /health answers; yields its base URL."""
    port = _free_port()
    with log.open("w") as out:
        proc = subprocess.Popen([sys.executable, "-m", "fun_asr.cli.serve", "-m", "demo", "--device", "cpu",
                                 "--port", str(port), "--max-new-tokens", str(MAX_NEW), *args],
                                stdout=out, stderr=subprocess.STDOUT, env={**os.environ, **(env or {})})
        base = f"http://127.0.0.1:{port}"
        try:
            _wait_healthy(proc, base, log)
            yield base
        finally:
            proc.terminate()
            proc.wait(timeout=60)


def test_sigterm_is_a_clean_stop_with_exit_code_0(tmp_path: Path) -> None:
    """README "Exit codes": SIGTERM ends a server's normal life, so fun-asr-serve exits with 0 (uvicorn's graceful
    shutdown, then no death by the signal it caught: that was exit code 143)."""
    port = _free_port()
    log = tmp_path / "server.log"
    with log.open("w") as out:
        proc = subprocess.Popen([sys.executable, "-m", "fun_asr.cli.serve", "-m", "demo", "--device", "cpu",
                                 "--port", str(port), "--ws-port", "0"], stdout=out, stderr=subprocess.STDOUT)
        try:
            _wait_healthy(proc, f"http://127.0.0.1:{port}", log)
            proc.send_signal(signal.SIGTERM)
            assert proc.wait(timeout=60) == 0, log.read_text()
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    assert "Traceback" not in log.read_text()


def _bind_fails(port: int) -> bool:
    """Whether port is held (bound) by someone else."""
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError as exc:
            assert exc.errno == errno.EADDRINUSE
            return True
    return False


def test_served_responses_name_no_server_path(tmp_path: Path) -> None:
    """The real server on a model converted into a cache under a temporary folder, with its home there too: no
    response of POST /asr, /v1/audio/transcriptions (json, verbose_json, text), the errors, or the WebSocket
    protocols names any of them (whether or not the model has a VAD: without one, every result carries the
    no_vad warning, which names the model file in the Python API)."""
    cache, home = tmp_path / "cache", tmp_path / "home"
    home.mkdir()
    log = tmp_path / "server.log"
    wav = (EXAMPLES / "en_hello.wav").read_bytes()
    bodies: list[str] = []
    with _serve(["--ws-port", "0"], log, {"FUN_ASR_CACHE_DIR": str(cache), "HOME": str(home)}) as base:
        models = list((cache / "models").glob("*.gguf"))
        assert models, "the demo model was not converted into the cache"

        def post(path: str, files: Any = None, **data: str) -> Any:
            r = requests.post(base + path, files=files or {"file": ("a.wav", wav)}, data=data, timeout=120)
            bodies.append(r.text)
            return r

        r = post("/asr")
        assert r.status_code == 200
        no_vad = "no_vad" in r.json()["warning_codes"]
        if no_vad:
            assert any(w.startswith(f"{MODEL_ID}: no FSMN-VAD") for w in r.json()["warnings"])
        for fmt in ("json", "verbose_json", "text"):
            assert post("/v1/audio/transcriptions", response_format=fmt).status_code == 200
        post("/asr", spk="true")
        post("/v1/audio/transcriptions", spk="true", response_format="verbose_json")
        junk = {"file": ("junk.wav", b"not audio" * 100)}
        assert post("/asr", files=junk).status_code == 400
        assert post("/v1/audio/transcriptions", files=junk).status_code == 400
        bodies.append(requests.get(base + "/nothing", timeout=10).text)
        bodies.append(requests.get(base + "/v1/models", timeout=10).text)

        async def ws_talk(first: str | bytes, *rest: str | bytes) -> list[str]:
            url = base.replace("http", "ws") + "/"
            got: list[str] = []
            async with websockets.connect(url, ping_interval=None) as ws:
                # (without a VAD the server answers one error event and closes: what it sent is read all the same)
                with contextlib.suppress(asyncio.TimeoutError, websockets.ConnectionClosed):
                    for m in (first, *rest):
                        await ws.send(m)
                    while True:
                        got.append(await asyncio.wait_for(ws.recv(), 5))
                        if '"stopped"' in got[-1] or '"is_end": true' in got[-1]:
                            break
            return got

        bodies += asyncio.run(ws_talk("SPK:true", "START", _pcm(), "STOP"))
        bodies += asyncio.run(ws_talk(json.dumps({"mode": "offline", "wav_format": "wav", "is_speaking": True}),
                                      b"junk" * 100, json.dumps({"is_speaking": False, "is_end": True})))
    text = "\n".join(bodies)
    secret = [str(tmp_path), str(cache), str(home), *map(str, models), os.environ.get("FUN_ASR_CACHE_DIR", "")]
    assert not _server_paths(text, secret), _server_paths(text, secret)
    assert not _foreign_words(text), _foreign_words(text)
    # the server's own log may name the paths, in its own words
    said = log.read_text()
    assert not _foreign_words(said), said
    assert not no_vad or "no FSMN-VAD" in said


# -- item 2: FunASR's realtime port only where WebSockets are served ------------------------------------------

def test_realtime_port_is_opened_only_with_websockets(tmp_path: Path) -> None:
    """Without a VAD (and server endpoints) nothing streams: --ws-port stays free for a server that does, and
    the startup line says so; with client endpoints (COMMIT, no VAD needed) the port is bound and serves."""
    ws_port = _free_port()
    with _serve(["--vad", "none", "--ws-port", str(ws_port)], tmp_path / "a.log"):
        assert not _bind_fails(ws_port)  # free: another server can take it
        said = (tmp_path / "a.log").read_text()
        assert "no WebSockets" in said and f"port {ws_port} (--ws-port) is not opened" in said, said
        assert f":{ws_port}/" not in said.replace(f"port {ws_port} ", "")
    ws_port = _free_port()
    with _serve(["--vad", "none", "--endpoint-mode", "client", "--ws-port", str(ws_port)], tmp_path / "b.log"):
        assert _bind_fails(ws_port)
        said = (tmp_path / "b.log").read_text()
        assert f"ws://127.0.0.1:{ws_port}/" in said and "not opened" not in said, said

        async def start() -> dict:
            async with websockets.connect(f"ws://127.0.0.1:{ws_port}/", ping_interval=None) as ws:
                await ws.send("START")
                return json.loads(await ws.recv())

        assert asyncio.run(start()) == {"event": "started"}
    for name in ("a.log", "b.log"):
        assert not _foreign_words((tmp_path / name).read_text())


# -- item 3: startup errors in fun-asr-serve's words ---------------------------------------------------------

def _has_gpu() -> bool:
    return any(d["type"] in ("gpu", "igpu") for d in fun_asr.system_info()["devices"])


def test_startup_errors_name_fun_asr_serve_flags(tmp_path: Path, capsys: pytest.CaptureFixture,
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    """Bad flag combinations and load failures: every message names fun-asr-serve's flags (or the request
    fields), never a Python spelling (``vad_model=``, ``diarize=True``, ``Session(``, ``fun_asr.``...) nor
    another command's flag (``--diarize``)."""
    import uvicorn

    from fun_asr.cli.serve import main

    # a case that unexpectedly starts (a model that brings what was missing) returns at once
    monkeypatch.setattr(uvicorn.Server, "run", lambda self, sockets=None: [s.close() for s in sockets or []])
    monkeypatch.setattr(warnings, "formatwarning", warnings.formatwarning)  # main() sets its own: restored
    many = tmp_path / "hotwords.txt"
    many.write_text("\n".join(f"w{i}" for i in range(300)), encoding="utf-8")
    cases: list[tuple[list[str], int | None, str]] = [
        (["--enable-spk", "--vad", "none"], None, "--enable-spk"),  # 2 unless the model embeds a speaker model
        (["--endpoint-mode", "client", "--vad", "none", "--enable-spk"], None, ""),
        (["--device", "tpu"], 2, "tpu"),
        (["--max-segment-seconds", "1000"], 2, "--max-segment-seconds"),
        (["--max-new-tokens", "100000"], 2, "--max-new-tokens"),
        (["--hotword-file", str(tmp_path / "missing.txt")], 2, "hotword file"),
        (["--hotword-file", str(many)], 2, "--hotword-file"),
        (["--speaker-model", str(tmp_path / "none.gguf")], 2, "speaker model"),
        (["--vad-model", str(tmp_path / "none")], 2, "VAD"),
        (["--vad", "fsmn"], None, ""),  # fails offline unless the model embeds its VAD
        (["--max-audio-seconds", "0"], 2, "--max-audio-seconds"),
        (["--ssl-keyfile", str(tmp_path / "k.pem")], 2, "--ssl-certfile"),
        (["--ws-port", "-1"], 2, "--ws-port"),
        (["-m", str(tmp_path / "missing.gguf")], 2, "missing.gguf"),
    ]
    if not _has_gpu():
        cases.append((["--device", "cuda"], 2, "--device cpu"))
    for args, rc, needle in cases:
        got = main(["-m", "demo", "--device", "cpu", "--port", "0", "--ws-port", "0", "--no-access-log", *args]
                   if "--device" not in args else
                   ["-m", "demo", "--port", "0", "--ws-port", "0", "--no-access-log", *args])
        err = capsys.readouterr().err
        assert rc is None or got == rc, (args, got, err)
        assert needle in err, (args, err)
        assert not _foreign_words(err), (args, _foreign_words(err), err)


def test_demo_serves_funasrs_realtime_websocket(tmp_path: Path) -> None:
    """-m demo carries FunASR's FSMN-VAD: with no VAD flag at all the server streams on FunASR's realtime
    protocol (port --ws-port), and the demo clips said with pauses come back as sentences with their words."""
    import soundfile as sf

    examples = Path(__file__).resolve().parents[1] / "examples"
    refs = dict(line.split(maxsplit=1) for line in (examples / "demo.txt").read_text("utf-8").splitlines() if line)
    gap = np.zeros(32000, np.int16)
    parts = [gap]
    for stem in refs:
        x, _ = sf.read(str(examples / f"{stem}.wav"), dtype="int16")
        parts += [x, gap]
    pcm = np.concatenate(parts).tobytes()
    ws_port = _free_port()
    with _serve(["--ws-port", str(ws_port), "--max-new-tokens", "64"], tmp_path / "s.log"):
        said = (tmp_path / "s.log").read_text()
        assert f"ws://127.0.0.1:{ws_port}/" in said and "no WebSockets" not in said, said

        async def talk() -> dict:
            async with websockets.connect(f"ws://127.0.0.1:{ws_port}/", ping_interval=None) as ws:
                await ws.send("START")
                assert json.loads(await ws.recv()) == {"event": "started"}
                for i in range(0, len(pcm), 3200):
                    await ws.send(pcm[i : i + 3200])
                await ws.send("STOP")
                while True:
                    msg = json.loads(await ws.recv())
                    if msg.get("is_final"):
                        return msg

        final = asyncio.run(talk())
    sentences = [s["text"].lower().strip(" .") for s in final["sentences"]]
    assert sentences == list(refs.values()), final
