"""Limits (just under passes, just over gets the documented error) and the server's access control."""

from __future__ import annotations

import io
import json
import logging
import threading
import time
from pathlib import Path

import numpy as np
import pytest
import soundfile as sf

import fun_asr
from fun_asr.audio.decode import AudioError, Limits, decode_audio

pytestmark = pytest.mark.filterwarnings("ignore::fun_asr.notices.TruncatedOutputWarning")

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"


@pytest.fixture(scope="module")
def session(tiny_gguf) -> fun_asr.Session:  # noqa: ANN001
    return fun_asr.Session(tiny_gguf("q8_0"), device="cpu", vad=None,
                           limits=Limits(max_audio_seconds=2.0, max_hotwords=5, max_hotword_chars=8))


def test_audio_limits() -> None:
    lim = Limits(max_audio_seconds=2.0)
    decode_audio(np.zeros(32000, np.float32), 16000, limits=lim)
    with pytest.raises(AudioError, match="at most 2 s"):
        decode_audio(np.zeros(32001, np.float32), 16000, limits=lim)
    buf = io.BytesIO()
    sf.write(buf, np.zeros(48000, np.float32), 16000, format="WAV")
    with pytest.raises(AudioError, match="3.0 s of audio; at most 2 s"):  # refused from the header, before decoding
        decode_audio(buf.getvalue(), limits=lim)
    decode_audio(np.zeros(100, np.float32), 1000)
    with pytest.raises(AudioError, match="sample rate 999 Hz is outside the accepted 1000-384000 Hz"):
        decode_audio(np.zeros(100, np.float32), 999)
    with pytest.raises(AudioError, match="outside the accepted"):
        decode_audio(np.zeros(1000, np.float32), 384_001)
    decode_audio(np.zeros((1000, 32), np.float32), 16000)
    many = io.BytesIO()
    sf.write(many, np.zeros((1000, 33), np.float32), 16000, format="WAV", subtype="FLOAT")
    with pytest.raises(AudioError, match="33 channels; at most 32"):
        decode_audio(many.getvalue())
    decode_audio(many.getvalue(), limits=Limits(max_channels=33))


def test_hotword_and_token_limits(session: fun_asr.Session) -> None:
    session.options(hotwords=["a"] * 5)
    with pytest.raises(ValueError, match="6 hotwords; at most 5"):
        session.options(hotwords=["a"] * 6)
    session.options(hotwords=["x" * 8])
    with pytest.raises(ValueError, match="9 characters; at most 8"):
        session.options(hotwords=["x" * 9])
    ctx = session.context_length
    with pytest.raises(ValueError, match="over the decoder's context"):
        session.options(max_new_tokens=ctx)
    # a 100 kB hotword list never reaches the decoder
    free = fun_asr.Session(session.path, device="cpu", vad=None, limits=Limits(max_hotwords=100_000,
                                                                                max_hotword_chars=100_000))
    with pytest.raises(ValueError, match="hotwords.*over the decoder's context|over the decoder's context"):
        free.options(hotwords=[f"word{i}" for i in range(20_000)])
    big = Limits().max_new_tokens
    with pytest.raises(ValueError, match=f"at most {big}"):
        free.options(max_new_tokens=big + 1)


# --- server access ----------------------------------------------------------------------------------

@pytest.fixture()
def client(session: fun_asr.Session):  # noqa: ANN201
    from fastapi.testclient import TestClient

    from fun_asr.serve.app import create_app

    app = create_app(session, model_id="fun-asr-nano", max_new_tokens=4, api_key="s3cret", max_queue=1,
                     request_timeout=1.0)
    with TestClient(app) as c:
        yield c


def _wav(seconds: float = 1.0) -> bytes:
    x, rate = sf.read(EXAMPLES / "en_hello.wav", dtype="float32")
    buf = io.BytesIO()
    sf.write(buf, x[: int(seconds * rate)], rate, format="WAV")
    return buf.getvalue()


def test_api_key(client, caplog: pytest.LogCaptureFixture) -> None:  # noqa: ANN001
    from starlette.websockets import WebSocketDisconnect

    assert client.get("/health").status_code == 200  # open
    for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": "s3cret"}):
        r = client.get("/v1/models", headers=headers)
        assert r.status_code == 401 and r.json()["error"]["code"] == "invalid_api_key"
        r = client.post("/v1/audio/transcriptions", files={"file": ("a.wav", _wav())}, headers=headers)
        assert r.status_code == 401
    ok = {"Authorization": "Bearer s3cret"}
    assert client.get("/v1/models", headers=ok).status_code == 200
    with caplog.at_level(logging.INFO, logger="fun_asr.access"):
        r = client.post("/v1/audio/transcriptions", files={"file": ("a.wav", _wav())}, headers={**ok,
                        "X-Request-Id": "req-42"})
    assert r.status_code == 200 and r.headers["X-Request-Id"] == "req-42"
    line = json.loads([rec.getMessage() for rec in caplog.records if rec.name == "fun_asr.access"][-1])
    assert line["id"] == "req-42" and line["status"] == 200 and line["path"] == "/v1/audio/transcriptions"
    assert line["bytes_in"] > 0 and "audio" not in line and "text" not in line
    # WebSocket: the upgrade is refused without the key
    with pytest.raises(WebSocketDisconnect) as exc, client.websocket_connect("/"):
        pass
    assert exc.value.code == 1008
    with client.websocket_connect("/", headers=ok) as ws:  # no VAD in this session: an error event, then close
        assert "FSMN-VAD" in json.loads(ws.receive_text())["error"]


def test_busy_and_timeout(client, session: fun_asr.Session, monkeypatch: pytest.MonkeyPatch) -> None:  # noqa: ANN001
    from fun_asr.serve.core.errors import RETRY_AFTER_SECONDS

    gate = threading.Event()
    real = session.transcribe_batch

    def slow(*a, **k):  # noqa: ANN002, ANN003, ANN202
        gate.wait(10)
        return real(*a, **k)

    monkeypatch.setattr(session, "transcribe_batch", slow)
    ok = {"Authorization": "Bearer s3cret"}
    results: list[int] = []
    retry_after: list[str | None] = []

    def post() -> None:
        r = client.post("/v1/audio/transcriptions", files={"file": ("a.wav", _wav())}, headers=ok)
        results.append(r.status_code)
        if r.status_code == 429:
            retry_after.append(r.headers.get("Retry-After"))

    threads = [threading.Thread(target=post) for _ in range(4)]
    for t in threads:
        t.start()
        time.sleep(0.3)
    for t in threads:
        t.join(30)
    gate.set()
    # one request is decoding (and times out after 1 s: 504), one waits in the queue (504 too), the rest: 429
    assert sorted(results) == [429, 429, 504, 504], results
    assert retry_after == [str(RETRY_AFTER_SECONDS)] * 2  # when to try again, in whole seconds
    deadline = time.time() + 20  # the timed-out jobs leave the queue once the decoder gets to them
    while True:
        r = client.post("/v1/audio/transcriptions", files={"file": ("a.wav", _wav())}, headers=ok)
        if r.status_code != 429 or time.time() > deadline:
            break
        time.sleep(0.2)
    assert r.status_code == 200  # the server still answers
