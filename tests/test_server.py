"""fun-asr-serve: the official openai client against a server started on 127.0.0.1."""

from __future__ import annotations

import concurrent.futures
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import requests
import soundfile as sf

import fun_asr
from fun_asr.asr.formats import render

# These tests decode a few tokens on purpose: the max_new_tokens warnings are expected.
pytestmark = pytest.mark.filterwarnings("ignore::fun_asr.notices.TruncatedOutputWarning")


openai = pytest.importorskip("openai")
EXAMPLES = Path(__file__).resolve().parents[1] / "examples"
MAX_NEW = 12


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def server(tiny_gguf, tmp_path_factory: pytest.TempPathFactory):  # noqa: ANN001, ANN201
    port = _free_port()
    model = tiny_gguf("q8_0")
    log_path = tmp_path_factory.mktemp("srvlog") / "server.log"
    log = log_path.open("w")
    proc = subprocess.Popen(
        [sys.executable, "-m", "fun_asr.cli.serve", "-m", str(model), "--port", str(port), "--device", "cpu",
         "--max-upload-mb", "1", "--max-new-tokens", str(MAX_NEW), "--max-concurrency", "2"],
        stdout=log, stderr=subprocess.STDOUT, text=True)
    base = f"http://127.0.0.1:{port}"
    deadline = time.time() + 120
    while True:
        try:
            if requests.get(base + "/health", timeout=1).status_code == 200:
                break
        except requests.RequestException:
            pass
        if proc.poll() is not None or time.time() > deadline:
            out = log_path.read_text()
            proc.kill()
            pytest.fail(f"server did not start: {out}")
        time.sleep(0.3)
    yield {"base": base, "model": model, "log": log_path}
    # Graceful shutdown: a request in flight when SIGTERM arrives still gets its answer.
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        wav = (EXAMPLES / "zh_weather.wav").read_bytes()
        pending = pool.submit(requests.post, base + "/v1/audio/transcriptions", files={"file": ("a.wav", wav)},
                              timeout=120)
        time.sleep(0.2)
        proc.terminate()
        assert pending.result().status_code == 200
    # SIGTERM ends the server's normal life: exit code 0 (README "Exit codes")
    assert proc.wait(timeout=60) == 0
    log.close()


@pytest.fixture(scope="module")
def session(tiny_gguf):  # noqa: ANN001, ANN201
    return fun_asr.Session(tiny_gguf("q8_0"), device="cpu")


@pytest.fixture(scope="module")
def clips(tmp_path_factory: pytest.TempPathFactory) -> list[Path]:
    d = tmp_path_factory.mktemp("srv")
    out = [EXAMPLES / "en_hello.wav", EXAMPLES / "zh_weather.wav", EXAMPLES / "ja_hello.wav"]
    rng = np.random.default_rng(0)
    for i in range(3):
        p = d / f"noise{i}.flac"
        sf.write(p, (0.2 * rng.standard_normal(16000 + 4000 * i)).astype(np.float32), 16000)
        out.append(p)
    return out


def _client(server: dict) -> openai.OpenAI:
    return openai.OpenAI(base_url=server["base"] + "/v1", api_key="unused", max_retries=0, timeout=300)


@pytest.mark.parametrize("fmt", ["json", "text", "srt", "vtt", "verbose_json"])
def test_openai_client_every_format(fmt: str, server: dict, session: fun_asr.Session, clips: list[Path]) -> None:
    client = _client(server)
    clip = clips[0]
    want = session.transcribe(clip, language="en", hotwords=["fun", "asr"], max_new_tokens=MAX_NEW)
    with clip.open("rb") as f:
        got = client.audio.transcriptions.create(model="fun-asr-nano", file=f, response_format=fmt, language="en",
                                                 prompt="fun, asr", temperature=0)
    if fmt == "json":
        assert got.text == want.text
    elif fmt == "verbose_json":
        assert got.text == want.text and got.language == "english" and abs(got.duration - want.duration) < 1e-3
        assert [s.tokens for s in got.segments] == [s.tokens for s in want.segments]
    else:
        assert got == render(want, "txt" if fmt == "text" else fmt)


def test_models_and_health(server: dict) -> None:
    models = _client(server).models.list()
    assert [m.id for m in models.data] == ["fun-asr-nano"]
    assert requests.get(server["base"] + "/health", timeout=10).json()["status"] == "ok"


def test_32_concurrent_requests(server: dict, session: fun_asr.Session, clips: list[Path]) -> None:
    expected = {c: session.transcribe(c, max_new_tokens=MAX_NEW).text for c in clips}
    assert len(set(expected.values())) == len(clips), "clips must give distinct texts to detect mix-ups"
    client = _client(server)
    jobs = [clips[i % len(clips)] for i in range(32)]

    def one(c: Path) -> tuple[Path, str]:
        with c.open("rb") as f:
            return c, client.audio.transcriptions.create(model="fun-asr-nano", file=f).text

    with concurrent.futures.ThreadPoolExecutor(32) as pool:
        results = list(pool.map(one, jobs))
    assert len(results) == 32
    for c, text in results:
        assert text == expected[c], f"response for {c.name} does not match its own transcription"


def _post(server: dict, files: dict | None = None, data: dict | None = None) -> requests.Response:
    return requests.post(server["base"] + "/v1/audio/transcriptions", files=files, data=data, timeout=120)


def _assert_error(r: requests.Response, status: int, param: str | None) -> None:
    assert r.status_code == status, r.text
    err = r.json()["error"]
    assert set(err) == {"message", "type", "param", "code"} and err["message"]
    assert err["param"] == param


def test_bad_uploads(server: dict, clips: list[Path]) -> None:
    wav = clips[0].read_bytes()
    _assert_error(_post(server, files={"file": ("empty.wav", b"")}), 400, "file")
    _assert_error(_post(server, files={"file": ("notes.wav", b"this is not audio at all")}), 400, "file")
    _assert_error(_post(server, files={"file": ("big.wav", b"\0" * (1024 * 1024 + 10))}), 413, "file")
    _assert_error(_post(server, data={"model": "fun-asr-nano"}), 400, "file")
    _assert_error(_post(server, files={"file": ("a.wav", wav)}, data={"temperature": "0.7"}), 400, "temperature")
    _assert_error(_post(server, files={"file": ("a.wav", wav)}, data={"response_format": "xml"}), 400,
                  "response_format")
    _assert_error(_post(server, files={"file": ("a.wav", wav)}, data={"language": "f\nr"}), 400, "language")
    _assert_error(_post(server, files={"file": ("a.wav", wav)}, data={"model": "gpt-9"}), 400, "model")
    _assert_error(_post(server, files={"file": ("a.wav", wav)}, data={"itn": "maybe"}), 400, "itn")
    with pytest.raises(openai.BadRequestError):
        _client(server).audio.transcriptions.create(model="fun-asr-nano", file=("x.wav", b"garbage"))
    # still answering
    r = _post(server, files={"file": ("a.wav", wav)}, data={"model": "whisper-1", "itn": "false"})
    assert r.status_code == 200 and "text" in r.json()


def test_missing_server_extra_message() -> None:
    env = {**os.environ, "PYTHONPATH": ""}
    code = ("import sys, builtins; real = builtins.__import__\n"
            "def fake(name, *a, **k):\n"
            "    if name == 'uvicorn': raise ImportError('no uvicorn', name='uvicorn')\n"
            "    return real(name, *a, **k)\n"
            "builtins.__import__ = fake\n"
            "from fun_asr.cli.serve import main; sys.exit(main(['-m', 'x.gguf']))")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env)
    assert r.returncode == 2 and "pip install 'fun-asr[server]'" in r.stderr


def test_truncation_flags_language_and_logged_warnings(server: dict, clips: list[Path]) -> None:
    wav = clips[0].read_bytes()
    r = _post(server, files={"file": ("first.wav", wav)}, data={"response_format": "json"})
    assert r.status_code == 200 and r.json()["truncated"] is True and r.json()["input_truncated"] is False
    # verbose_json: the requested language by name; without one, inferred from the text, never "auto"
    v = _post(server, files={"file": ("a.wav", wav)}, data={"response_format": "verbose_json", "language": "ja"})
    assert v.json()["language"] == "japanese" and v.json()["truncated"] is True
    v = _post(server, files={"file": ("a.wav", wav)}, data={"response_format": "verbose_json"}).json()
    assert v["language"] != "auto" and v["language"] == (
        {"zh": "chinese", "en": "english", "ja": "japanese", "ko": "korean"}.get(
            fun_asr.asr.session.guess_language(v["text"]) or "", "unknown"))
    # a truncated upload is flagged
    cut = wav[: len(wav) // 2]
    r = _post(server, files={"file": ("cut.wav", cut)})
    assert r.status_code == 200 and r.json()["input_truncated"] is True
    # each warning reaches the log once, through logging (not Python's warnings module)
    time.sleep(0.5)
    text = server["log"].read_text()
    assert text.count("first.wav: segment") == 1, text
    assert text.count("cut.wav: file is truncated") == 1 and "UserWarning" not in text


def test_unknown_routes_answer_in_openai_shape(server: dict) -> None:
    r = requests.get(server["base"] + "/v1/nothing", timeout=10)
    _assert_error(r, 404, None)
    assert "/v1/audio/transcriptions" in r.json()["error"]["message"]
    _assert_error(requests.get(server["base"] + "/v1/audio/transcriptions", timeout=10), 405, None)
