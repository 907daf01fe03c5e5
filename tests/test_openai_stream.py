"""OpenAI's streamed transcription (stream=true: transcript.text.delta events, then transcript.text.done) through
the official openai SDK against a real uvicorn server; and what uvicorn's own log lines show of a URL's API key."""

from __future__ import annotations

import logging
import socket
import threading
import time
import warnings
from pathlib import Path

import pytest

import fun_asr

openai = pytest.importorskip("openai")
uvicorn = pytest.importorskip("uvicorn")
requests = pytest.importorskip("requests")

from fun_asr.serve.app import create_app  # noqa: E402

MAX_NEW = 8
KEY = "stream-s3cret"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def server(demo: fun_asr.Session):  # noqa: ANN201
    """uvicorn on a free port, in a thread of this process, with its default access log on (log level info)."""
    port = _free_port()
    app = create_app(demo, model_id="fun-asr-nano", max_new_tokens=MAX_NEW, api_key=KEY)
    config = uvicorn.Config(app, host="127.0.0.1", port=port, log_level="info", log_config=None)
    srv = uvicorn.Server(config)
    thread = threading.Thread(target=srv.run, daemon=True)
    thread.start()
    deadline = time.time() + 60
    while not srv.started:
        if not thread.is_alive() or time.time() > deadline:
            pytest.fail("uvicorn did not start")
        time.sleep(0.05)
    yield f"http://127.0.0.1:{port}"
    srv.should_exit = True
    thread.join(30)


def _client(base: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=base + "/v1", api_key=KEY, max_retries=0, timeout=120)


def test_sdk_stream_deltas_then_done(server: str, demo: fun_asr.Session, three: Path) -> None:
    want = demo.transcribe(three, max_new_tokens=MAX_NEW)
    spoken = [s.text for s in want.segments if s.text]
    assert len(spoken) == 3, "the clip must decode to several segments to check the deltas"
    with three.open("rb") as f:
        stream = _client(server).audio.transcriptions.create(model="fun-asr-nano", file=f, stream=True)
        events = list(stream)
    types = [type(e).__name__ for e in events]
    assert types == ["TranscriptionTextDeltaEvent"] * 3 + ["TranscriptionTextDoneEvent"], types
    deltas = [e.delta for e in events[:-1]]
    assert [e.type for e in events] == ["transcript.text.delta"] * 3 + ["transcript.text.done"]
    assert deltas == [spoken[0], " " + spoken[1], " " + spoken[2]]  # one per segment, the separator in front
    assert "".join(deltas) == events[-1].text == want.text
    with three.open("rb") as f:  # the same text as the json answer
        assert _client(server).audio.transcriptions.create(model="fun-asr-nano", file=f).text == want.text


def test_sdk_keeps_the_notices_of_every_format(server: str, three: Path) -> None:
    """The official SDK keeps fun-asr's extra keys: json's warning_codes (model_extra), the done event's; the
    plain-text formats' codes are in the X-Warning-Codes header of the raw response."""
    client = _client(server)
    got = client.audio.transcriptions.create(model="fun-asr-nano", file=("a.wav", three.read_bytes()), language="fr")
    assert "language_unknown" in got.model_extra["warning_codes"] and got.text
    events = list(client.audio.transcriptions.create(model="fun-asr-nano", file=("a.wav", three.read_bytes()),
                                                     language="fr", stream=True))
    assert events[-1].type == "transcript.text.done" and "language_unknown" in events[-1].warning_codes
    raw = client.audio.transcriptions.with_raw_response.create(
        model="fun-asr-nano", file=("a.wav", three.read_bytes()), language="fr", response_format="vtt")
    assert "language_unknown" in raw.headers["x-warning-codes"].split(",") and raw.parse().startswith("WEBVTT")


def test_stream_wire_format(server: str, three: Path) -> None:
    r = requests.post(server + "/v1/audio/transcriptions", files={"file": ("a.wav", three.read_bytes())},
                      data={"stream": "true", "response_format": "text"}, headers={"Authorization": f"Bearer {KEY}"},
                      timeout=120)
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
    blocks = r.text.split("\n\n")
    assert blocks[-1] == "" and blocks[-2] == "data: [DONE]"
    assert all(b.startswith("data: {") for b in blocks[:-2])
    assert '"type":"transcript.text.done"' in blocks[-3]


def test_stream_refusals(server: str, three: Path) -> None:
    client = _client(server)
    for fmt in ("verbose_json", "srt", "vtt"):
        with pytest.raises(openai.BadRequestError, match="stream=true"):
            client.audio.transcriptions.create(model="fun-asr-nano", file=("a.wav", three.read_bytes()),
                                               stream=True, response_format=fmt)
    with pytest.raises(openai.BadRequestError, match="audio"):  # an error before any event: a plain 400
        list(client.audio.transcriptions.create(model="fun-asr-nano", file=("a.wav", b"not audio"), stream=True))
    with pytest.raises(openai.AuthenticationError):
        openai.OpenAI(base_url=server + "/v1", api_key="wrong", max_retries=0).audio.transcriptions.create(
            model="fun-asr-nano", file=("a.wav", three.read_bytes()), stream=True)


def test_uvicorn_logs_never_show_the_url_key(server: str, caplog: pytest.LogCaptureFixture) -> None:
    websockets = pytest.importorskip("websockets.sync.client")
    with caplog.at_level(logging.INFO, logger="uvicorn"):
        assert requests.get(server + f"/v1/models?api_key={KEY}", timeout=30).status_code == 200
        assert requests.get(server + "/v1/models?api_key=wrong-one", timeout=30).status_code == 401
        ws_url = server.replace("http", "ws") + f"/?api_key={KEY}"
        try:  # accepted or refused (the WebSocket route's own check): either way uvicorn logs the path
            with websockets.connect(ws_url, open_timeout=10) as ws:
                ws.close()
        except Exception:  # noqa: BLE001, S110 - a refused upgrade raises; the log lines are what is checked
            pass
        time.sleep(0.3)
    lines = [rec.getMessage() for rec in caplog.records if rec.name.startswith("uvicorn")]
    assert any("/v1/models?api_key=***" in line for line in lines), lines
    assert any("WebSocket /?api_key=***" in line for line in lines), lines
    assert not [line for line in lines if KEY in line or "wrong-one" in line]


def test_asr_through_requests_as_the_guide(server: str, demo: fun_asr.Session, three: Path) -> None:
    """FunASR's guide, Python example: requests.post(url + "/asr", files={"file": open(...)}, data={...}),
    over a real socket; then the answer's fields as the guide reads them (``result["text"]``, each segment's
    text/start/end)."""
    import requests

    with three.open("rb") as f:
        r = requests.post(f"{server}/asr?api_key={KEY}", files={"file": f},
                          data={"language": "英文", "hotwords": "yes,no", "spk": "false", "timestamp": "true"},
                          timeout=120)
    assert r.status_code == 200, r.text
    result = r.json()
    want = demo.transcribe(three, language="英文", hotwords=["yes", "no"], max_new_tokens=MAX_NEW)
    assert result["text"] == want.text and result["text"]
    assert isinstance(result["duration"], float) and isinstance(result["processing_time"], float)
    assert isinstance(result["rtf"], float)
    assert [(s["text"], s["start"], s["end"]) for s in result["segments"]] == \
        [(s.text, s.start, s.end) for s in want.segments]
    r = requests.post(f"{server}/asr", files={"file": three.open("rb")}, timeout=60)  # no key
    assert r.status_code == 401 and "detail" in r.json()


def test_asr_takes_funasrs_vad_kwargs(server: str, demo: fun_asr.Session, three: Path) -> None:
    """generate()'s VAD kwargs per request (an extension of /asr): a fixed 3 s end silence joins the three
    utterances (their pauses are 1.6-1.8 s), as the Session does with the same kwargs; a bad schedule is a 400
    naming it."""
    import requests

    def post(**data: str) -> requests.Response:
        with three.open("rb") as f:
            return requests.post(f"{server}/asr?api_key={KEY}", files={"file": f}, data=data, timeout=120)

    plain = post().json()["segments"]
    joined = post(dynamic_silence="false", max_end_silence_time="3000").json()["segments"]
    with warnings.catch_warnings():  # the joined segment's text may pass MAX_NEW tokens: only its times count here
        warnings.simplefilter("ignore", fun_asr.TruncatedOutputWarning)
        want = demo.transcribe(three, max_new_tokens=MAX_NEW, dynamic_silence=False, max_end_silence_time=3000)
    assert len(plain) == 3 and len(joined) < len(plain)
    assert [(s["start"], s["end"]) for s in joined] == [(s.start, s.end) for s in want.segments]
    r = post(silence_schedule="10000:2000,5000:100")
    assert r.status_code == 400 and "silence" in r.json()["detail"]
    for bad in ({"dynamic_silence": "maybe"}, {"max_end_silence_time": "abc"}, {"max_end_silence_time": "-5"}):
        r = post(**bad)
        assert r.status_code == 400 and next(iter(bad)) in r.json()["detail"], (bad, r.text)


@pytest.mark.parametrize("language", [None, "zh", "en", "klingon"])
def test_stream_deltas_add_up_for_any_mix_of_scripts(language: str | None) -> None:
    """The deltas of many segments (CJK next to Latin, empty ones between) add up to join_text's transcript
    exactly, for each language's join rule; each delta is computed from its neighbour only."""
    from fun_asr.asr.assemble import join_text
    from fun_asr.asr.results import Segment, Transcription
    from fun_asr.model.spec import load_spec
    from fun_asr.serve.protocols.openai import stream_events

    spec = load_spec()
    pieces = ["你好", "世界", "hello", "", "world", "。好的", "ok", "天气"] * 300
    segs = [Segment(i, i + 1.0, p, [], "eos", False, False) for i, p in enumerate(pieces)]
    t = Transcription(join_text(segs, language, spec), segs, language, float(len(segs)), {})
    events = stream_events(t, spec)
    deltas = [e["delta"] for e in events if e["type"] == "transcript.text.delta"]
    assert len(deltas) == sum(1 for p in pieces if p) and "".join(deltas) == t.text
    assert events[-1] == {"type": "transcript.text.done", "text": t.text, "truncated": False,
                          "input_truncated": False, "warnings": [], "warning_codes": []}


def test_sdk_confidence_fields_and_logprobs(server: str, demo: fun_asr.Session, three: Path) -> None:
    """Through the official SDK: verbose_json segments' avg_logprob (<= 0), compression_ratio (> 0) and
    no_speech_prob (in [0, 1]) as floats; include=["logprobs"] gives OpenAI's {token, logprob, bytes} list for json,
    verbose_json and the stream's events, token for token the transcript's."""
    want = demo.transcribe(three, max_new_tokens=MAX_NEW)
    client = _client(server)
    with three.open("rb") as f:
        v = client.audio.transcriptions.create(model="fun-asr-nano", file=f, response_format="verbose_json")
    assert len(v.segments) == len(want.segments) == 3
    for seg, w in zip(v.segments, want.segments, strict=True):
        assert isinstance(seg.avg_logprob, float) and seg.avg_logprob <= 0 and seg.avg_logprob == w.avg_logprob
        assert isinstance(seg.compression_ratio, float) and seg.compression_ratio > 0
        assert isinstance(seg.no_speech_prob, float) and 0 <= seg.no_speech_prob <= 1
    with three.open("rb") as f:
        j = client.audio.transcriptions.create(model="fun-asr-nano", file=f, include=["logprobs"])
    tokens = [t for s in want.segments for t in s.tokens if t not in demo.stop_ids]
    lps = [lp for s in want.segments for t, lp in zip(s.tokens, s.token_logprobs, strict=True)
           if t not in demo.stop_ids]
    assert j.text == want.text and j.logprobs is not None and len(j.logprobs) == len(tokens)
    assert [e.logprob for e in j.logprobs] == lps and all(e.logprob <= 0 for e in j.logprobs)
    # (the SDK declares the json answer's bytes as floats)
    assert [bytes(int(b) for b in e.bytes) for e in j.logprobs] == [demo.tokenizer.token_bytes(t) for t in tokens]
    assert "".join(e.token for e in j.logprobs).replace(" ", "") == want.text.replace(" ", "")
    with three.open("rb") as f:
        vj = client.audio.transcriptions.create(model="fun-asr-nano", file=f, response_format="verbose_json",
                                                include=["logprobs"])
    assert [e["logprob"] for e in vj.model_extra["logprobs"]] == lps
    with three.open("rb") as f:
        events = list(client.audio.transcriptions.create(model="fun-asr-nano", file=f, stream=True,
                                                         include=["logprobs"]))
    per_delta = [[e.logprob for e in ev.logprobs] for ev in events[:-1]]
    assert sum(per_delta, []) == [e.logprob for e in events[-1].logprobs] == lps
    with three.open("rb") as f, pytest.raises(openai.BadRequestError, match="include"):
        client.audio.transcriptions.create(model="fun-asr-nano", file=f, response_format="srt", include=["logprobs"])
