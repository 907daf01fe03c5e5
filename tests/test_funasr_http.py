"""FunASR's offline HTTP service (POST /asr), FunASR's languages, the API key in URLs and verbose_json's
per-segment words: checked against FunASR's own code (its prompt builders, its route's declared fields) and
the clients of FunASR's guide (requests' multipart upload)."""

from __future__ import annotations

import json
import logging
import threading
import time
from pathlib import Path
from typing import Annotated, Any

import pytest

import fun_asr
from fun_asr.asr.assemble import join_text
from fun_asr.asr.language import (
    FUNASR_PROMPT_ALIASES,
    language_notice,
    language_prompt_name,
    normalize_language,
)
from fun_asr.asr.prompt import instruction
from fun_asr.asr.results import Segment
from fun_asr.notices import CODES

fastapi = pytest.importorskip("fastapi")
from fastapi import FastAPI, File, Form, UploadFile  # noqa: E402
from fastapi.testclient import TestClient  # noqa: E402

from fun_asr.serve.app import api_key_ok, create_app, redact_api_key  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
EXAMPLES = ROOT / "examples"
MAX_NEW = 8
KEY = "s3cret-key"

# These tests decode a few tokens on purpose, and pass languages the model lacks on purpose.
pytestmark = pytest.mark.filterwarnings("ignore::fun_asr.notices.TruncatedOutputWarning")


@pytest.fixture(scope="module")
def client(demo: fun_asr.Session):  # noqa: ANN201
    app = create_app(demo, model_id="fun-asr-nano", max_new_tokens=MAX_NEW, max_upload_mb=1, max_concurrency=8)
    with TestClient(app) as c:
        yield c


def _asr(client: TestClient, clip: Path, **data: str) -> Any:
    return client.post("/asr", files={"file": (clip.name, clip.read_bytes(), "audio/wav")}, data=data)


# -- POST /asr: FunASR's answer ------------------------------------------------------------------------------

def test_asr_answers_as_funasr(client: TestClient, demo: fun_asr.Session, three: Path) -> None:
    r = _asr(client, three)
    assert r.status_code == 200 and r.headers["content-type"] == "application/json"
    got = r.json()
    assert set(got) == {"text", "segments", "duration", "processing_time", "rtf", "warnings", "warning_codes"}
    want = demo.transcribe(three, max_new_tokens=MAX_NEW)
    assert got["text"] == want.text and got["text"].split() and len(got["segments"]) == 3
    for seg, w in zip(got["segments"], want.segments, strict=True):
        # no words: this model has no CTC head; no speaker; fun-asr's confidence fields (FunASR's clients read
        # named keys only)
        assert set(seg) == {"text", "start", "end", "avg_logprob", "compression_ratio", "no_speech_prob"}
        assert seg["text"] == w.text and seg["start"] == round(w.start, 3) and seg["end"] == round(w.end, 3)
        assert seg["avg_logprob"] == w.avg_logprob < 0 and seg["compression_ratio"] == w.compression_ratio > 0
        assert 0 <= seg["no_speech_prob"] == w.no_speech_prob < 0.5  # the VAD heard speech there
        assert isinstance(seg["start"], float) and isinstance(seg["end"], float)
    assert isinstance(got["duration"], float) and got["duration"] == want.duration
    assert isinstance(got["processing_time"], float) and isinstance(got["rtf"], float)
    # FunASR: rtf = round(processing_time / duration, 4), from the unrounded time
    assert abs(got["rtf"] - got["processing_time"] / got["duration"]) < 1e-3 / got["duration"] + 1e-4
    # no word times on this model and none asked for explicitly: no words, and no notice about it
    assert got["warning_codes"] == [] and got["warnings"] == []


def test_guide_clients_requests_multipart(client: TestClient, demo: fun_asr.Session, three: Path) -> None:
    """The guide's Python client: files={"file": open(...)}, data={"language": "中文", "spk": "false"};
    hotwords comma-separated as FunASR splits them (stripped, empty ones dropped)."""
    calls: list[dict] = []
    real = demo.transcribe_batch

    def spy(audios, **kw):  # noqa: ANN001, ANN003, ANN202
        calls.append(kw)
        return real(audios, **kw)

    demo.transcribe_batch = spy  # type: ignore[method-assign]
    try:
        with three.open("rb") as f:
            r = client.post("/asr", files={"file": f}, data={"language": "中文", "spk": "false",
                                                              "hotwords": " yes , no,, stop "})
    finally:
        del demo.transcribe_batch
    assert r.status_code == 200, r.text
    assert calls[-1]["language"] == "中文" and calls[-1]["hotwords"] == ["yes", "no", "stop"]
    want = demo.transcribe(three, language="中文", hotwords=["yes", "no", "stop"], max_new_tokens=MAX_NEW)
    assert r.json()["text"] == want.text


def _funasr_signature_app() -> FastAPI:
    """FunASR serve_vllm.py's /asr fields as it declares them (file, language, hotwords, spk, timestamp): what
    FastAPI answers for them is what FunASR's server answers."""
    ref = FastAPI()

    @ref.post("/asr")
    async def asr(file: Annotated[UploadFile, File()], language: Annotated[str | None, Form()] = None,
                  hotwords: Annotated[str, Form()] = "", spk: Annotated[bool, Form()] = False,
                  timestamp: Annotated[bool, Form()] = True) -> dict:
        return {"spk": spk, "timestamp": timestamp, "language": language, "hotwords": hotwords}

    return ref


@pytest.mark.parametrize("case", ["no file", "spk maybe", "timestamp perhaps", "file as text", "empty form"])
def test_asr_validation_errors_are_funasrs(case: str, client: TestClient) -> None:
    wav = (EXAMPLES / "en_hello.wav").read_bytes()
    files: dict | None = {"file": ("a.wav", wav)}
    data: dict = {}
    if case == "no file":
        files, data = None, {"language": "en"}
    elif case == "spk maybe":
        data = {"spk": "maybe"}
    elif case == "timestamp perhaps":
        data = {"timestamp": "perhaps"}
    elif case == "file as text":
        files, data = None, {"file": "not a file"}
    else:
        files = None
    with TestClient(_funasr_signature_app()) as ref:
        want = ref.post("/asr", files=files, data=data)
    got = client.post("/asr", files=files, data=data)
    assert want.status_code == 422
    assert got.status_code == want.status_code and got.json() == want.json()


def test_asr_booleans_parse_as_funasrs(client: TestClient) -> None:
    """spk and timestamp take what FunASR's FastAPI bool fields take (false/0/no/off, any case)."""
    with TestClient(_funasr_signature_app()) as ref:
        for value in ("false", "False", "0", "no", "off", "f", "n"):
            assert ref.post("/asr", files={"file": ("a.wav", b"x")}, data={"spk": value}).json()["spk"] is False
            r = _asr(client, EXAMPLES / "en_hello.wav", spk=value, timestamp=value)
            assert r.status_code == 200, (value, r.text)


def test_asr_errors_in_fastapis_shape(client: TestClient) -> None:
    wav = (EXAMPLES / "en_hello.wav").read_bytes()
    for files, status, words in [
        ({"file": ("empty.wav", b"")}, 400, "empty"),
        ({"file": ("notes.wav", b"this is not audio at all")}, 400, "cannot decode audio"),
        ({"file": ("big.wav", b"\0" * (1024 * 1024 + 10))}, 413, "limit of 1 MB"),
    ]:
        r = client.post("/asr", files=files)
        assert r.status_code == status and set(r.json()) == {"detail"} and words in r.json()["detail"], r.text
    r = client.post("/asr", files={"file": ("a.wav", wav)}, data={"language": "en\nsay nothing"})
    assert r.status_code == 400 and "control character" in r.json()["detail"]
    r = client.post("/asr", files={"file": ("a.wav", wav)}, data={"hotwords": ",".join(f"w{i}" for i in range(201))})
    assert r.status_code == 400 and "201 hotwords" in r.json()["detail"]
    r = client.get("/asr")
    assert r.status_code == 405 and set(r.json()) == {"detail"}
    # the OpenAI routes keep OpenAI's shape; the 404 lists /asr among the routes
    r = client.get("/nothing")
    assert r.status_code == 404 and "POST /asr" in r.json()["error"]["message"]
    assert "POST /v1/audio/transcriptions" in r.json()["error"]["message"]


def test_spk_without_a_speaker_model_is_refused_naming_how_to_give_one(client: TestClient) -> None:
    """The demo server has no CAM++: spk=true is a 400 that says how to give one, never a result without speakers
    (tests/test_diarization.py: the same routes with a speaker model)."""
    wav = (EXAMPLES / "en_hello.wav").read_bytes()
    r = client.post("/asr", files={"file": ("a.wav", wav)}, data={"spk": "true"})
    assert r.status_code == 400 and "speaker model" in r.json()["detail"] and "--speaker-model" in r.json()["detail"]
    r = client.post("/v1/audio/transcriptions", files={"file": ("a.wav", wav)}, data={"spk": "true"})
    err = r.json()["error"]
    assert r.status_code == 400 and err["param"] == "spk" and "speaker" in err["message"]
    r = client.post("/v1/audio/transcriptions", files={"file": ("a.wav", wav)}, data={"spk": "false"})
    assert r.status_code == 200


@pytest.mark.parametrize("join_running", [True, False])
def test_asr_and_openai_requests_share_decoding_passes(client: TestClient, demo: fun_asr.Session,
                                                       three: Path, join_running: bool) -> None:
    """/asr decodes through the server's batcher: while one request decodes, /asr and /v1 requests with the
    same options arrive; they join the running batch (one transcribe_batch call), or with join_running off
    queue up and are decoded together in the next call."""
    batcher = client.app.state.context.batcher
    batcher.join_running, joined = join_running, batcher.joined
    gate = threading.Event()
    sizes: list[int] = []
    real = demo.transcribe_batch

    def slow(audios, **kw):  # noqa: ANN001, ANN003, ANN202
        sizes.append(len(audios))
        gate.wait(30)
        return real(audios, **kw)

    demo.transcribe_batch = slow  # type: ignore[method-assign]
    results: dict[str, Any] = {}

    def post(name: str, path: str) -> None:
        results[name] = client.post(path, files={"file": ("a.wav", three.read_bytes())})

    try:
        first = threading.Thread(target=post, args=("first", "/asr"))
        first.start()
        deadline = time.time() + 30
        while not sizes and time.time() < deadline:  # the first request is in the decoder
            time.sleep(0.02)
        others = [threading.Thread(target=post, args=(f"{p}{i}", p)) for i in range(2)
                  for p in ("/asr", "/v1/audio/transcriptions")]
        for t in others:
            t.start()
        while client.app.state.context.batcher.jobs.qsize() < 4 and time.time() < deadline:
            time.sleep(0.02)  # the other four wait in the queue
        gate.set()
        for t in [first, *others]:
            t.join(60)
    finally:
        gate.set()
        del demo.transcribe_batch
        batcher.join_running = True
    assert sizes == ([1] if join_running else [1, 4]), sizes
    assert batcher.joined - joined == (4 if join_running else 0)
    texts = {name: (r.json()["text"]) for name, r in results.items()}
    assert all(r.status_code == 200 for r in results.values())
    assert len(set(texts.values())) == 1  # the same audio: the same text on both routes


def test_upload_over_the_limit_names_the_flag_on_every_route(client: TestClient) -> None:
    """Over --max-upload-mb (1 here): 413 naming the flag, in each route's error shape, whether the declared
    Content-Length already says so (refused before the form is read) or only the file's own size does."""
    for size, declared in ((1024 * 1024 + 10, False), (1024 * 1024 + 128 * 1024, True)):
        files = {"file": ("big.wav", b"\0" * size)}
        r = client.post("/v1/audio/transcriptions", files=files)
        err = r.json()["error"]
        assert r.status_code == 413 and set(err) == {"message", "type", "param", "code"}, r.text
        assert err["param"] == "file" and err["code"] == "file_too_large" and err["type"] == "invalid_request_error"
        assert "limit of 1 MB (fun-asr-serve --max-upload-mb)" in err["message"], err
        assert ("bytes exceeds" in err["message"]) == declared, err  # which check refused it
        r = client.post("/asr", files=files)
        assert r.status_code == 413 and set(r.json()) == {"detail"}, r.text
        assert "limit of 1 MB (fun-asr-serve --max-upload-mb)" in r.json()["detail"]


def test_busy_server_answers_429_with_retry_after_on_every_route(client: TestClient, demo: fun_asr.Session,
                                                                 three: Path) -> None:
    """Past --max-queue waiting requests (1 here: one decodes, one waits) every route answers 429 in its own
    error shape with ``Retry-After`` (whole seconds); once the decoder is free, requests pass again."""
    from fun_asr.serve.core.errors import RETRY_AFTER_SECONDS

    ctx = client.app.state.context
    gate, decoding = threading.Event(), threading.Event()
    real = demo.transcribe_batch

    def slow(audios, **kw):  # noqa: ANN001, ANN003, ANN202
        decoding.set()
        gate.wait(30)
        return real(audios, **kw)

    def post(path: str, **data: str) -> Any:
        return client.post(path, files={"file": ("a.wav", three.read_bytes())}, data=data)

    demo.transcribe_batch = slow  # type: ignore[method-assign]
    saved, ctx.max_queue = ctx.max_queue, 1
    waiting = [threading.Thread(target=post, args=("/v1/audio/transcriptions",)) for _ in range(2)]
    try:
        waiting[0].start()
        assert decoding.wait(30)  # the first request is in the decoder (held there)
        waiting[1].start()
        deadline = time.time() + 30
        while ctx.batcher.jobs.qsize() < 1 and time.time() < deadline:  # the second waits in the queue
            time.sleep(0.02)
        busy = [post("/v1/audio/transcriptions"), post("/v1/audio/transcriptions", stream="true"),
                post("/v1/audio/transcriptions", response_format="srt"), post("/asr")]
    finally:
        gate.set()
        for t in waiting:
            t.join(60)
        del demo.transcribe_batch
        ctx.max_queue = saved
    for r in busy:
        assert r.status_code == 429, r.text
        assert r.headers["Retry-After"] == str(RETRY_AFTER_SECONDS) and int(r.headers["Retry-After"]) >= 1
    assert all(r.json()["error"]["code"] == "rate_limit_exceeded" for r in busy[:3])
    assert set(busy[3].json()) == {"detail"} and "server busy" in busy[3].json()["detail"]
    r = post("/v1/audio/transcriptions")
    assert r.status_code == 200 and "Retry-After" not in r.headers


def test_every_openai_format_carries_the_notices(client: TestClient, three: Path) -> None:
    """language_unknown (and every other notice) in every /v1 answer: warnings/warning_codes in json (OpenAI's
    {"text"} plus extra keys), verbose_json and the stream's done event; the X-Warning-Codes header in every
    format, the plain-text ones (text, srt, vtt) included."""
    def post(**data: str) -> Any:
        r = client.post("/v1/audio/transcriptions", files={"file": ("a.wav", three.read_bytes())}, data=data)
        assert r.status_code == 200, r.text
        return r

    for fmt in ("json", "verbose_json", "text", "srt", "vtt"):
        r = post(language="fr", response_format=fmt)
        codes = r.headers["X-Warning-Codes"].split(",")
        assert "language_unknown" in codes, (fmt, codes)
        if fmt.endswith("json"):
            body = r.json()
            assert body["warning_codes"] == codes and len(body["warnings"]) == len(codes)
            assert any("'fr'" in w for w in body["warnings"])
    events = [json.loads(line[6:]) for line in post(language="fr", stream="true").text.splitlines()
              if line.startswith("data: {")]
    done = events[-1]
    assert done["type"] == "transcript.text.done" and "language_unknown" in done["warning_codes"]
    assert len(done["warnings"]) == len(done["warning_codes"])
    known = post(language="en")
    assert "language_unknown" not in known.json()["warning_codes"]
    assert known.headers["X-Warning-Codes"] == ",".join(known.json()["warning_codes"])


# -- word times (a checkpoint with a CTC head) -----------------------------------------------------------------

def test_asr_words_and_verbose_json_segment_words(nano: dict[str, Path]) -> None:
    session = fun_asr.Session(nano["ms-f32"], device="cpu", vad=None)
    clip = EXAMPLES / "zh_weather.wav"
    want = session.transcribe(clip, max_new_tokens=16, word_timestamps=True)
    assert any(s.words for s in want.segments)
    with TestClient(create_app(session, model_id="fun-asr-nano", max_new_tokens=16)) as c:
        files = {"file": ("a.wav", clip.read_bytes())}
        got = c.post("/asr", files=files).json()  # timestamp defaults to true, as FunASR's
        for seg, w in zip(got["segments"], want.segments, strict=True):
            assert seg["words"] == [{"word": x["word"], "start": x["start"], "end": x["end"],
                                     "probability": x["probability"]} for x in w.words]
            assert all(0 < x["probability"] <= 1 for x in seg["words"])  # the decoder's, of the tokens spelling it
        assert c.post("/asr", files=files, data={"timestamp": "false"}).json()["segments"][0].keys() == {
            "text", "start", "end", "avg_logprob", "compression_ratio", "no_speech_prob"}
        v = c.post("/v1/audio/transcriptions", files=files,
                   data={"response_format": "verbose_json", "timestamp_granularities[]": "word"}).json()
        assert v["words"] and [x for s in v["segments"] for x in s["words"]] == v["words"]  # FunASR + OpenAI
        assert v["segments"][0]["words"] == got["segments"][0]["words"]
        v = c.post("/v1/audio/transcriptions", files=files, data={"response_format": "verbose_json"}).json()
        assert "words" not in v and all(s["words"] == [] for s in v["segments"])


def test_asr_timestamp_true_without_ctc_head_says_so(client: TestClient) -> None:
    r = _asr(client, EXAMPLES / "en_hello.wav", timestamp="true")
    assert r.status_code == 200 and "word_timestamps_unavailable" in r.json()["warning_codes"]
    assert all("words" not in s for s in r.json()["segments"])


# -- languages as FunASR takes them ------------------------------------------------------------------------------

def _funasr_prompts() -> tuple[Any, Any]:
    pytest.importorskip("torch")
    from funasr.models.fun_asr_nano.inference_vllm import FunASRNanoVLLM
    from funasr.models.fun_asr_nano.model import FunASRNano

    return FunASRNanoVLLM._build_prompt_text, FunASRNano.get_prompt


# what FunASR's clients and docs send: the guide's 中文, client_mic.html's options, codes, other names
FUNASR_INPUTS = ["中文", "zh", "ZH", "en", "ja", "ko", "KO", "日文", "英文", "韩文", "日本語", "日语", "粤语",
                 "英语", "普通话", "한국어", "Deutsch", "Français", "Español", "Русский", "العربية", "sv", "瑞典语"]
# names of the model card's three languages that fun-asr maps to their prompt name (as it always has), where
# FunASR would put the name itself into the prompt
KEPT_AS_BEFORE = {"chinese": "中文", "mandarin": "中文", "english": "英文", "English": "英文", "japanese": "日文"}


@pytest.mark.parametrize("hotwords", [[], ["开放时间", "FunASR"]])
@pytest.mark.parametrize("itn", [True, False])
def test_prompt_language_as_funasrs_engine(demo: fun_asr.Session, itn: bool, hotwords: list[str]) -> None:
    vllm_prompt, model_prompt = _funasr_prompts()
    spec = demo.spec
    for text in FUNASR_INPUTS:
        ours = instruction(demo.prompt, language_prompt_name(spec, normalize_language(spec, text)), itn, hotwords)
        assert ours == vllm_prompt(None, hotwords, text, itn), text
        if text.lower() not in FUNASR_PROMPT_ALIASES:  # FunASR's AutoModel path has no aliases: the same there
            assert ours == model_prompt(None, hotwords, text, itn), text
    assert instruction(demo.prompt, None, itn, hotwords) == vllm_prompt(None, hotwords, None, itn)
    for text, name in KEPT_AS_BEFORE.items():
        ours = instruction(demo.prompt, language_prompt_name(spec, normalize_language(spec, text)), itn, hotwords)
        assert ours == vllm_prompt(None, hotwords, name, itn)


def test_language_names_of_the_model_card_unchanged(demo: fun_asr.Session) -> None:
    spec = demo.spec
    for code, names in {"zh": ["zh", "chinese", "mandarin", "中文", "Chinese"], "en": ["en", "english", "英文"],
                        "ja": ["ja", "japanese", "日文"]}.items():
        assert {normalize_language(spec, n) for n in names} == {code}
        assert language_notice(spec, code) is None
    assert [normalize_language(spec, x) for x in (None, "", "  ", "auto", "AUTO")] == [None] * 5
    # FunASR's own alias codes are codes; everything else is kept as written (stripped)
    assert normalize_language(spec, "KO") == "ko" and language_prompt_name(spec, "ko") == FUNASR_PROMPT_ALIASES["ko"]
    assert normalize_language(spec, " 日本語 ") == "日本語" and language_prompt_name(spec, "日本語") == "日本語"
    with pytest.raises(ValueError, match="at most 64"):
        normalize_language(spec, "x" * 65)
    with pytest.raises(TypeError):
        normalize_language(spec, 3)  # type: ignore[arg-type]
    assert "language_unknown" in CODES


def test_unknown_language_reaches_the_prompt_with_a_notice(demo: fun_asr.Session, three: Path,
                                                            caplog: pytest.LogCaptureFixture) -> None:
    before, _ = demo.prompt_ids(demo.options(language="日本語"))
    assert "语音转写成日本語：" in demo.tokenizer.decode(before)
    with caplog.at_level(logging.WARNING, logger="fun_asr"):
        r = demo.transcribe(three, language="Deutsch", max_new_tokens=MAX_NEW)
        r2 = demo.transcribe(three, language="Deutsch", max_new_tokens=MAX_NEW)
    assert r.language == "Deutsch" and r.ok
    for res in (r, r2):
        assert res.warning_codes.count("language_unknown") == 1
        note = res.warnings[res.warning_codes.index("language_unknown")]
        assert "'Deutsch'" in note and "zh (chinese" in note
    assert sum("'Deutsch' is not one of" in rec.getMessage() for rec in caplog.records) == 1  # logged once
    known = demo.transcribe(three, language="en", max_new_tokens=MAX_NEW)
    assert "language_unknown" not in known.warning_codes and len(known.segments) == 3
    assert r.text == " ".join(s.text for s in r.segments if s.text)
    # a language the spec lacks joins its segments as automatic does: no space between CJK characters
    segs = [Segment(0.0, 1.0, "你好", [], "eos", False, False), Segment(1.0, 2.0, "世界", [], "eos", False, False),
            Segment(2.0, 3.0, "OK", [], "eos", False, False)]
    assert join_text(segs, "日本語", demo.spec) == join_text(segs, None, demo.spec) == "你好世界 OK"
    assert join_text(segs, "en", demo.spec) == "你好 世界 OK"


def test_server_takes_unknown_languages(client: TestClient, three: Path) -> None:
    r = _asr(client, three, language="日本語")
    assert r.status_code == 200 and "language_unknown" in r.json()["warning_codes"]
    v = client.post("/v1/audio/transcriptions", files={"file": ("a.wav", three.read_bytes())},
                    data={"language": "fr", "response_format": "verbose_json"}).json()
    assert v["language"] == "fr" and "language_unknown" in v["warning_codes"]
    v = client.post("/v1/audio/transcriptions", files={"file": ("a.wav", three.read_bytes())},
                    data={"language": "ko", "response_format": "verbose_json"}).json()
    assert v["language"] == "korean"


# -- the API key in a URL ---------------------------------------------------------------------------------------

def test_api_key_helper() -> None:
    from starlette.datastructures import Headers, QueryParams

    none, q = Headers({}), QueryParams
    assert api_key_ok(None, none) and api_key_ok("", none, q("api_key=x"))
    assert api_key_ok(KEY, Headers({"authorization": f"Bearer {KEY}"}))
    assert api_key_ok(KEY, none, q(f"api_key={KEY}"))
    assert api_key_ok(KEY, Headers({"authorization": "Bearer wrong"}), q(f"api_key={KEY}"))
    for headers, query in [(none, None), (none, q("api_key=")), (none, q("api_key=wrong")),
                           (none, q(f"key={KEY}")), (Headers({"authorization": KEY}), None)]:
        assert not api_key_ok(KEY, headers, query)
    assert redact_api_key(f"/v1/models?x=1&api_key={KEY}&y=2") == "/v1/models?x=1&api_key=***&y=2"
    assert redact_api_key(f'"WebSocket /?api_key={KEY}" 403') == '"WebSocket /?api_key=***" 403'
    # every spelling Starlette decodes to api_key (it authenticates, so it must not be logged either)
    for name in ("%61pi_key", "api%5Fkey", "API_KEY", "%41PI%5FKEY"):
        assert redact_api_key(f"GET /?{name}={KEY} HTTP/1.1") == f"GET /?{name}=*** HTTP/1.1", name
    assert redact_api_key("/?not_api_key=keep&a=api_key=x") == "/?not_api_key=keep&a=api_key=x"
    assert redact_api_key(f"/?API_KEY={KEY}&api%5Fkey={KEY}") == "/?API_KEY=***&api%5Fkey=***"
    assert redact_api_key("/?my_api_key=public&x=api_key=") == "/?my_api_key=public&x=api_key="


def test_api_key_in_the_url_and_the_access_log(demo: fun_asr.Session, caplog: pytest.LogCaptureFixture) -> None:
    wav = (EXAMPLES / "en_hello.wav").read_bytes()
    with TestClient(create_app(demo, model_id="fun-asr-nano", max_new_tokens=4, api_key=KEY)) as c, \
            caplog.at_level(logging.INFO, logger="fun_asr.access"):
        assert c.get("/v1/models").status_code == 401
        r = c.post("/asr", files={"file": ("a.wav", wav)})
        assert r.status_code == 401 and "api_key" in r.json()["detail"]  # FunASR's route: FastAPI's shape
        assert c.get("/v1/models", params={"api_key": "wrong"}).status_code == 401
        assert c.get("/v1/models", params={"api_key": KEY}).status_code == 200
        assert c.post(f"/asr?api_key={KEY}", files={"file": ("a.wav", wav)}).status_code == 200
        assert c.post("/v1/audio/transcriptions", params={"api_key": KEY},
                      files={"file": ("a.wav", wav)}).status_code == 200
        assert c.get("/v1/models", headers={"Authorization": f"Bearer {KEY}"}).status_code == 200
    lines = [json.loads(rec.getMessage()) for rec in caplog.records if rec.name == "fun_asr.access"]
    assert len(lines) == 7 and {ln["path"] for ln in lines} == {"/v1/models", "/asr", "/v1/audio/transcriptions"}
    assert not [rec for rec in caplog.records if KEY in rec.getMessage()]
