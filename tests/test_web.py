"""The web page at ``/`` of fun-asr-serve, in a real browser: Debian's chromium driven by playwright (the pip
package, launched with the system chromium as ``executable_path``), against the app under uvicorn with the
20-word demo model behind the real FSMN-VAD.

File tab: a demo clip uploaded -> its words with times; a file that is not audio, and speakers on a server
without a speaker model -> the server's error on the page. Live tab: chromium's fake microphone plays a WAV of
two demo clips -> the locked sentences hold their words; a refused language and SPK:true without a speaker model
-> both error events on the page. Speaker labels in answers of the server's shapes (playwright's routes standing
in for a server with a speaker model) -> badges and downloads. A server with an API key: the page loads without
it, fails visibly without it and works with it; over TLS the microphone goes over wss://...?api_key=. The
worklet's resampling of 48 and 44.1 kHz tones. The page at 360 px has no horizontal scroll, every control has a
label, the tabs work from the keyboard. Screenshots of
both tabs go to docs/ (docs/web.md shows them) when missing there or with FUN_ASR_UPDATE_DOCS=1.

Skipped, saying why, where chromium or playwright is missing (scripts/test.sh installs both)."""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import socket
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import soundfile as sf

import fun_asr

uvicorn = pytest.importorskip("uvicorn")

ROOT = Path(__file__).resolve().parents[1]
EXAMPLES = ROOT / "examples"
DOCS = ROOT / "docs"
SR = 16000
KEY = "sesame-web-test"


def _chromium() -> str:
    for name in ("chromium", "chromium-browser"):
        path = shutil.which(name)
        if path:
            return path
    pytest.skip("the browser tests need Debian's chromium (apt-get install -y chromium); it is not installed here")


def _texts() -> dict[str, str]:
    rows = (line.split(maxsplit=1) for line in (EXAMPLES / "demo.txt").read_text("utf-8").splitlines() if line)
    return {k: v for k, v in rows}


@pytest.fixture(scope="module")
def session(vad_dir: Path) -> fun_asr.Session:
    return fun_asr.Session("demo", device="cpu", vad="fsmn", vad_model=vad_dir, progress=False)


@contextlib.contextmanager
def _server(session: fun_asr.Session, api_key: str | None = None,
            cert: tuple[Path, Path] | None = None) -> Iterator[str]:
    """fun-asr-serve's app under uvicorn in a thread (the CLI's WebSocket settings; TLS with ``cert``); yields
    http(s)://host:port."""
    from fun_asr.serve.app import create_app
    from fun_asr.serve.protocols.funasr_realtime import RealtimeLimits, uvicorn_ws_options

    app = create_app(session, model_id="demo", max_new_tokens=64, max_concurrency=2, realtime=RealtimeLimits(),
                     api_key=api_key)
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen(16)
    port = sock.getsockname()[1]
    tls = {"ssl_certfile": str(cert[0]), "ssl_keyfile": str(cert[1])} if cert else {}
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning", **tls, **uvicorn_ws_options(100.0)))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    deadline = time.time() + 60
    while not server.started:
        assert thread.is_alive() and time.time() < deadline, "server did not start"
        time.sleep(0.05)
    try:
        yield f"http{'s' if cert else ''}://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(60)
        sock.close()


@pytest.fixture(scope="module")
def base(session: fun_asr.Session) -> Iterator[str]:
    with _server(session) as url:
        yield url


@pytest.fixture(scope="module")
def mic_clip(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, list[str]]:
    """What the fake microphone plays (in a loop): 0.5 s of silence, demo_1, 1.2 s, demo_3, 2.5 s (16-bit WAV);
    and the two transcripts. (Not demo_2: the demo model's one weakness is a repeated word, and through the
    browser's resampling its "seven seven" can come out as one "seven": docs/trained_model.md.)"""
    texts = _texts()
    gap = lambda s: np.zeros(int(s * SR), np.float32)  # noqa: E731
    clips = [sf.read(EXAMPLES / f"{c}.wav", dtype="float32")[0] for c in ("demo_1", "demo_3")]
    x = np.concatenate([gap(0.5), clips[0], gap(1.2), clips[1], gap(2.5)])
    path = tmp_path_factory.mktemp("mic") / "mic.wav"
    sf.write(path, x, SR, subtype="PCM_16")
    return path, [texts["demo_1"], texts["demo_3"]]


@pytest.fixture(scope="module")
def browser(mic_clip: tuple[Path, list[str]]) -> Iterator[Any]:
    exe = _chromium()
    sync_api = pytest.importorskip("playwright.sync_api", reason="the browser tests need the playwright pip "
                                                                   "package (pip install playwright)")
    with sync_api.sync_playwright() as p:
        try:
            b = p.chromium.launch(executable_path=exe, headless=True, args=[
                "--no-sandbox",  # CI runs as root
                "--use-fake-ui-for-media-stream", "--use-fake-device-for-media-stream",
                f"--use-file-for-fake-audio-capture={mic_clip[0]}", "--autoplay-policy=no-user-gesture-required",
                "--mute-audio"])
        except Exception as exc:  # noqa: BLE001 - an unusable chromium: say why, as a skip
            pytest.skip(f"chromium ({exe}) does not start under playwright: {str(exc).splitlines()[0]}")
        try:
            yield b
        finally:
            b.close()


@pytest.fixture
def page(browser: Any) -> Iterator[Any]:
    context = browser.new_context(viewport={"width": 900, "height": 900})
    pg = context.new_page()
    pg.set_default_timeout(20000)
    errors: list[str] = []
    pg.on("pageerror", lambda exc: errors.append(str(exc)))
    pg.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
    pg.errors = errors
    try:
        yield pg
    finally:
        context.close()


def _shot(name: str, tmp_path: Path) -> str:
    """Where a screenshot goes: docs/ when it is missing there or FUN_ASR_UPDATE_DOCS=1 (docs/web.md shows them),
    else the test's folder (a test run does not rewrite the committed pictures)."""
    target = DOCS / name
    return str(target if os.environ.get("FUN_ASR_UPDATE_DOCS") == "1" or not target.exists() else tmp_path / name)


def _words(text: str) -> list[str]:
    return re.sub(r"[^\w\s]", " ", text.lower()).split()


def _no_script_errors(pg: Any, allowed: tuple[str, ...] = ()) -> None:
    bad = [e for e in pg.errors if not any(a in e for a in allowed)]
    assert not bad, bad


def test_page_is_served_without_a_key_and_the_api_still_needs_one(session: fun_asr.Session) -> None:
    import requests

    with _server(session, api_key=KEY) as url:
        r = requests.get(url + "/", timeout=10)
        assert r.status_code == 200 and r.headers["content-type"].startswith("text/html")
        assert "default-src 'self'" in r.headers["content-security-policy"]
        for name in ("app.js", "app.css", "worklet.js", "favicon.svg"):
            assert requests.get(f"{url}/web/{name}", timeout=10).status_code == 200, name
        assert requests.get(url + "/web/index.html", timeout=10).status_code == 401  # only the listed files
        assert requests.post(url + "/", timeout=10).status_code == 401
        assert requests.get(url + "/v1/models", timeout=10).status_code == 401
        ok = requests.get(url + "/v1/models", headers={"Authorization": f"Bearer {KEY}"}, timeout=10)
        assert ok.status_code == 200
        missing = requests.get(f"{url}/web/nothing.js", headers={"Authorization": f"Bearer {KEY}"}, timeout=10)
        assert missing.status_code == 404 and "GET /" in missing.json()["error"]["message"]
        # every file the page references is one the server serves
        html = r.text
        for ref in re.findall(r'(?:src|href)="(/[^"]*)"', html):
            assert requests.get(url + ref, timeout=10).status_code == 200, ref


def test_page_says_the_model_is_the_20_word_demo(page: Any, base: str) -> None:
    """The server runs the demo (-m demo): a visible note under the status line says so, with its words."""
    page.goto(base + "/")
    page.wait_for_selector("#model-note:has-text('20-word demo model')")
    assert page.is_visible("#model-note") and "seven" in page.inner_text("#model-note")
    _no_script_errors(page)


def test_file_upload_shows_the_words_with_times(page: Any, base: str, tmp_path: Path) -> None:
    page.goto(base + "/")
    page.wait_for_selector("#server-status:has-text('model demo')")
    page.set_input_files("#file-input", str(EXAMPLES / "demo_1.wav"))
    page.wait_for_selector("#wave-note:has-text('Click the waveform')", state="attached")  # the browser decoded it
    # the progress label as it changes, with the upload slowed to 50 kB/s (the 75 kB clip takes 1.5 s)
    cdp = page.context.new_cdp_session(page)
    cdp.send("Network.enable")
    cdp.send("Network.emulateNetworkConditions", {"offline": False, "latency": 0, "downloadThroughput": -1,
                                                  "uploadThroughput": 50000})
    page.evaluate("""() => { window.labels = []; const l = document.getElementById('file-progress-label');
        new MutationObserver(() => window.labels.push(l.textContent))
          .observe(l, {childList: true, subtree: true}); }""")
    page.click("#file-go")
    page.wait_for_selector("#segments .seg", timeout=60000)
    want = _texts()["demo_1"]
    assert _words(page.inner_text("#file-text")) == _words(want)
    labels = page.evaluate("window.labels")
    uploading = [int(m[1]) for m in (re.match(r"Uploading… (\d+)% of 75 kB", t) for t in labels) if m]
    assert len(uploading) >= 3 and uploading == sorted(uploading) and uploading[-1] == 100, labels
    assert re.fullmatch(r"Transcribing 0:02\.39 of audio… \d+\.\d s", labels[-1]), labels  # after the upload
    cdp.send("Network.emulateNetworkConditions", {"offline": False, "latency": 0, "downloadThroughput": -1,
                                                  "uploadThroughput": -1})
    seg = page.inner_text("#segments .seg")
    times = re.findall(r"(\d+):(\d\d\.\d\d)", seg)
    assert len(times) == 2, seg
    start, end = (int(m) * 60 + float(s) for m, s in times)
    assert 0 <= start < end <= 2.5, seg  # demo_1.wav is 2.39 s long
    assert _words(page.inner_text("#segments .seg .seg-text")) == _words(want)
    assert "english" in page.inner_text("#file-summary")
    # the waveform canvas was drawn (not one flat colour)
    spread = page.evaluate("""() => { const c = document.getElementById('wave');
        const d = c.getContext('2d').getImageData(0, 0, c.width, c.height).data; const seen = new Set();
        for (let i = 0; i < d.length; i += 4 * 97) seen.add(d[i] + ',' + d[i + 1] + ',' + d[i + 2]);
        return seen.size; }""")
    assert spread >= 3
    # the downloads are what the segments say
    with page.expect_download() as dl:
        page.click(".dl[data-fmt='srt'][data-src='file']")
    srt = Path(dl.value.path()).read_text("utf-8")
    assert re.match(r"1\n00:00:\d\d,\d{3} --> 00:00:\d\d,\d{3}\n", srt), srt
    assert _words(srt.split("\n", 2)[2]) == _words(want)
    with page.expect_download() as dl:
        page.click(".dl[data-fmt='vtt'][data-src='file']")
    assert Path(dl.value.path()).read_text("utf-8").startswith("WEBVTT\n\n00:00:")
    # each word with the recognizer's probability; the slider marks exactly those under its value
    with page.expect_download() as dl:
        page.click(".dl[data-fmt='json'][data-src='file']")
    probs = [w["probability"] for s in json.loads(Path(dl.value.path()).read_text("utf-8"))["segments"]
             for w in s["token_words"]]
    assert len(probs) == len(_words(want)) and all(0 < p <= 1 for p in probs)

    def marked(value: float) -> list[bool]:
        page.evaluate("""(v) => { const el = document.getElementById('conf-threshold'); el.value = String(v);
            el.dispatchEvent(new Event('input')); }""", value)
        assert page.inner_text("#conf-value") == f"{value:.2f}"
        return page.eval_on_selector_all("#segments .word", "els => els.map((e) => e.classList.contains('low'))")

    # a value some words are under and some not (the closest to half of them): the screenshot shows the marking
    cut = min((c / 100 for c in range(1, 100)), key=lambda c: abs(sum(p < c for p in probs) - len(probs) / 2))
    assert marked(0) == [False] * len(probs) and marked(1) == [p < 1 for p in probs]
    assert marked(cut) == [p < cut for p in probs]
    assert _words(page.inner_text("#segments .seg .seg-text")) == _words(want)  # marking keeps the text
    page.click("#segments .seg")  # plays the span (muted): the segment becomes the current one
    page.wait_for_selector(".seg[aria-current]")
    page.screenshot(path=_shot("web-file.png", tmp_path), full_page=True)
    _no_script_errors(page)


def test_bad_file_and_refused_speakers_show_the_servers_error(page: Any, base: str, tmp_path: Path) -> None:
    bad = tmp_path / "notes.wav"
    bad.write_bytes(b"this is not audio at all\n" * 20)
    page.goto(base + "/")
    page.set_input_files("#file-input", str(bad))
    page.wait_for_selector("#wave-note:has-text('cannot decode')", state="attached")
    page.click("#file-go")
    page.wait_for_selector("#file-error:visible")
    err = page.inner_text("#file-error")
    assert "HTTP 400" in err and "notes.wav: cannot decode audio" in err, err
    assert page.is_hidden("#file-result") and page.is_hidden("#file-progress")
    # speakers on a server without a speaker model: the server's 400 naming --speaker-model, on the page
    page.set_input_files("#file-input", str(EXAMPLES / "demo_2.wav"))
    page.check("#file-spk")
    page.click("#file-go")
    page.wait_for_selector("#file-error:has-text('spk=true')")
    assert "--speaker-model" in page.inner_text("#file-error")
    _no_script_errors(page, ("400 (Bad Request)",))


def test_live_microphone_locks_the_sentences(page: Any, base: str, mic_clip: tuple[Path, list[str]],
                                            tmp_path: Path) -> None:
    _, texts = mic_clip
    page.goto(base + "/#live")
    page.click("#live-start")
    # both clips locked as sentences while the microphone still runs (the VAD closes them)
    loudest, deadline = 0.0, time.time() + 30
    while not page.query_selector("#live-sentences li:nth-child(2)"):  # the level meter follows the voice
        assert time.time() < deadline, page.inner_text("#live-status")
        loudest = max(loudest, float(page.eval_on_selector("#live-level", "m => m.value")))
        page.wait_for_timeout(100)
    assert loudest > 0.3, loudest  # the clips peak near -10 dBFS: 0.83 on the meter's -60..0 dB scale
    page.set_viewport_size({"width": 900, "height": 760})
    page.screenshot(path=_shot("web-live.png", tmp_path))
    page.click("#live-stop")
    page.wait_for_selector("#live-status:has-text('Not recording')", timeout=30000)
    sentences = page.eval_on_selector_all("#live-sentences li .seg-text", "els => els.map(e => e.textContent)")
    assert [_words(s) for s in sentences[:2]] == [_words(t) for t in texts], sentences
    times = page.eval_on_selector_all("#live-sentences li .time", "els => els.map(e => e.textContent)")
    spans = [[int(m) * 60 + float(s) for m, s in re.findall(r"(\d+):(\d\d\.\d\d)", t)] for t in times[:2]]
    assert spans[0][0] < spans[0][1] <= spans[1][0] < spans[1][1], times
    events = page.text_content("#live-events")
    assert "started" in events and "stopped" in events, events
    assert page.inner_text("#live-errors") == ""
    _no_script_errors(page)


def test_speakers_are_shown_when_the_answer_has_them(page: Any, base: str) -> None:
    """The display of ``speaker`` (HTTP) and ``spk`` (WebSocket) fields, from answers in the server's shapes
    (playwright routes stand in for a server with a speaker model)."""
    import json

    sent: list[str] = []
    answer = {"task": "transcribe", "language": "english", "duration": 2.393, "text": "five two five eight",
              "segments": [{"id": 0, "start": 0.17, "end": 1.2, "text": "five two", "speaker": "SPK0"},
                           {"id": 1, "start": 1.3, "end": 2.37, "text": "five eight", "speaker": "SPK1"}],
              "num_speakers": 2, "warnings": []}

    def transcriptions(route: Any) -> None:
        sent.append(route.request.post_data_buffer.decode("latin-1"))
        route.fulfill(status=200, content_type="application/json", body=json.dumps(answer))

    page.route("**/v1/audio/transcriptions", transcriptions)
    page.goto(base + "/")
    page.set_input_files("#file-input", str(EXAMPLES / "demo_1.wav"))
    page.check("#file-spk")
    page.click("#file-go")
    page.wait_for_selector("#segments li:nth-child(2) .spk")
    assert re.search(r'name="spk"\r\n\r\ntrue\r\n', sent[0]) and 'name="response_format"\r\n\r\nverbose_json' in sent[0]
    badges = page.eval_on_selector_all("#segments .spk", "els => els.map(e => [e.textContent, e.style.background])")
    assert [b[0] for b in badges] == ["SPK0", "SPK1"] and badges[0][1] != badges[1][1], badges
    assert "2 speakers" in page.inner_text("#file-summary")
    with page.expect_download() as dl:
        page.click(".dl[data-fmt='txt'][data-src='file']")
    assert Path(dl.value.path()).read_text("utf-8") == "[SPK0] five two\n[SPK1] five eight\n"
    with page.expect_download() as dl:
        page.click(".dl[data-fmt='vtt'][data-src='file']")
    assert "<v SPK1>five eight" in Path(dl.value.path()).read_text("utf-8")

    # live: the realtime protocol's answers with "spk", from a stand-in WebSocket server
    got: list[str] = []

    def realtime(ws: Any) -> None:
        def on_message(message: str | bytes) -> None:
            if isinstance(message, bytes):
                return
            got.append(message)
            if message == "SPK:true":
                ws.send(json.dumps({"event": "spk_set", "spk": True}))
            elif message == "START":
                ws.send(json.dumps({"event": "started"}))
                ws.send(json.dumps({"sentences": [{"text": "go down", "start": 500, "end": 1500, "spk": 0},
                                                  {"text": "seven seven", "start": 1600, "end": 2900, "spk": 1}],
                                    "partial": "four ni", "partial_start_ms": 3000, "duration_ms": 3500,
                                    "is_final": False}))
            elif message == "STOP":
                ws.send(json.dumps({"sentences": [{"text": "go down", "start": 500, "end": 1500, "spk": 0},
                                                  {"text": "seven seven", "start": 1600, "end": 2900, "spk": 1}],
                                    "partial": "", "is_final": True}))
                ws.send(json.dumps({"event": "stopped"}))

        ws.on_message(on_message)

    page.route_web_socket(re.compile(r"^ws://127\.0\.0\.1:\d+/$"), realtime)
    page.click("#tab-live")
    page.check("#live-spk")
    page.click("#live-start")
    page.wait_for_selector("#live-sentences li:nth-child(2) .spk")
    assert page.inner_text("#live-partial") == "four ni"
    assert page.eval_on_selector_all("#live-sentences .spk", "els => els.map(e => e.textContent)") == ["SPK0", "SPK1"]
    assert page.inner_text("#live-sentences li:nth-child(2) .time") == "0:01.60 – 0:02.90"
    page.click("#live-stop")
    page.wait_for_selector("#live-status:has-text('Not recording')")
    assert got == ["SPK:true", "START", "STOP"], got
    with page.expect_download() as dl:
        page.click(".dl[data-fmt='srt'][data-src='live']")
    assert "00:00:01,600 --> 00:00:02,900\n[SPK1] seven seven" in Path(dl.value.path()).read_text("utf-8")
    _no_script_errors(page)


def test_live_shows_every_error_event(page: Any, base: str) -> None:
    page.goto(base + "/#live")
    page.fill("#live-language", "x" * 70)  # over the 64 characters a language name may have: refused
    page.check("#live-spk")  # the demo server has no speaker model: refused
    page.click("#live-start")
    page.wait_for_selector("#live-errors li:nth-child(2)")
    errors = page.eval_on_selector_all("#live-errors li", "els => els.map(e => e.textContent)")
    assert any("language" in e and "70 characters" in e for e in errors), errors
    assert any(e.startswith("SPK:true") and "--speaker-model" in e for e in errors), errors
    page.click("#live-stop")
    page.wait_for_selector("#live-status:has-text('Not recording')", timeout=30000)
    _no_script_errors(page)


def test_api_key_server(page: Any, session: fun_asr.Session) -> None:
    with _server(session, api_key=KEY) as url:
        page.goto(url + "/")
        page.wait_for_selector("#server-status:has-text('needs an API key')")
        page.set_input_files("#file-input", str(EXAMPLES / "demo_3.wav"))
        page.click("#file-go")
        page.wait_for_selector("#file-error:has-text('HTTP 401')")
        assert "API key" in page.inner_text("#file-error")
        # the live tab fails visibly too (the server's message, before the WebSocket is even tried)
        page.click("#tab-live")
        page.click("#live-start")
        page.wait_for_selector("#live-errors li")
        assert "API key" in page.inner_text("#live-errors")
        page.click("#tab-file")
        page.fill("#api-key", KEY)
        page.wait_for_selector("#server-status:has-text('model demo')")
        assert page.evaluate("sessionStorage.getItem('fun-asr-api-key')") == KEY
        page.click("#file-go")
        page.wait_for_selector("#segments .seg", timeout=60000)
        assert page.is_hidden("#file-error")
        assert _words(page.inner_text("#file-text")) == _words(_texts()["demo_3"])
    _no_script_errors(page, ("401 (Unauthorized)",))


def test_behind_tls_with_a_key_the_microphone_goes_over_wss(browser: Any, session: fun_asr.Session,
                                                            tmp_path: Path) -> None:
    crt, key = tmp_path / "server.crt", tmp_path / "server.key"
    r = subprocess.run(["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1",
                        "-nodes", "-days", "2", "-subj", "/CN=localhost", "-addext",
                        "subjectAltName=DNS:localhost,IP:127.0.0.1", "-keyout", str(key), "-out", str(crt)],
                       capture_output=True, text=True)
    if r.returncode:
        pytest.skip(f"openssl could not make a test certificate: {r.stderr.strip()[:200]}")
    context = browser.new_context(ignore_https_errors=True)  # the self-signed certificate
    try:
        page = context.new_page()
        page.set_default_timeout(20000)
        sockets: list[str] = []
        page.on("websocket", lambda ws: sockets.append(ws.url))
        with _server(session, api_key=KEY, cert=(crt, key)) as url:
            assert url.startswith("https://")
            page.goto(url + "/#live")
            page.fill("#api-key", KEY)
            page.wait_for_selector("#server-status:has-text('model demo')")
            page.click("#live-start")
            page.wait_for_selector("#live-sentences li", timeout=30000)  # demo_1 from the fake microphone
            page.click("#live-stop")
            page.wait_for_selector("#live-events li:has-text('stopped')", state="attached", timeout=30000)
            assert page.inner_text("#live-errors") == ""
            assert _words(page.inner_text("#live-sentences li .seg-text")) == _words(_texts()["demo_1"])
        assert sockets == [f"wss://{url[len('https://'):]}/?api_key={KEY}"], sockets
    finally:
        context.close()


def test_urls_layout_and_labels(page: Any, base: str) -> None:
    page.goto(base + "/")
    assert page.evaluate("FunAsrWeb.wsUrl({protocol: 'https:', host: 'asr.example:8443'}, 'a b')") == \
        "wss://asr.example:8443/?api_key=a%20b"
    assert page.evaluate("FunAsrWeb.wsUrl({protocol: 'http:', host: '127.0.0.1:8000'}, '')") == "ws://127.0.0.1:8000/"
    assert page.evaluate("FunAsrWeb.stamp(3723.0456, ',')") == "01:02:03,046"
    # every control has an accessible name (a label, aria-label, or its own text)
    unnamed = page.evaluate("""() => [...document.querySelectorAll('input, button, select, textarea, meter')]
        .filter(e => !(e.labels && e.labels.length) && !e.getAttribute('aria-label') && !e.textContent.trim())
        .map(e => e.id || e.outerHTML.slice(0, 60))""")
    assert unnamed == []
    # the tabs work from the keyboard
    page.focus("#tab-file")
    page.keyboard.press("ArrowRight")
    assert page.evaluate("document.activeElement.id") == "tab-live" and page.is_visible("#live-start")
    page.keyboard.press("ArrowLeft")
    assert page.is_visible("#file-go")
    # readable at 360 px: nothing wider than the screen
    page.set_viewport_size({"width": 360, "height": 740})
    for tab in ("#tab-file", "#tab-live"):
        page.click(tab)
        assert page.evaluate("document.documentElement.scrollWidth") <= 360, tab
    _no_script_errors(page)


# what the microphone's AudioWorklet (worklet.js) makes of a tone at a context rate: 1 s rendered offline
_WORKLET_TONE = """async ([rate, freq]) => {
  const ctx = new OfflineAudioContext(1, rate, rate);
  await ctx.audioWorklet.addModule('/web/worklet.js');
  const node = new AudioWorkletNode(ctx, 'pcm16k', {processorOptions: {chunk: 1600}});
  const chunks = [];
  let flushed;
  const done = new Promise(r => flushed = r);
  node.port.onmessage = (m) => { if (m.data.flushed) flushed(); else chunks.push(new Int16Array(m.data.pcm)); };
  const osc = new OscillatorNode(ctx, {frequency: freq});
  osc.connect(new GainNode(ctx, {gain: 0.5})).connect(node).connect(ctx.destination);
  osc.start();
  await ctx.startRendering();
  node.port.postMessage('flush');
  await done;
  const x = [];
  for (const c of chunks) for (const v of c) x.push(v / 32768);
  const mid = x.slice(2000, x.length - 2000);
  let sq = 0, crossings = 0;
  for (let i = 0; i < mid.length; i++) {
    sq += mid[i] * mid[i];
    if (i && (mid[i - 1] < 0) !== (mid[i] < 0)) crossings++;
  }
  return {n: x.length, rms: Math.sqrt(sq / mid.length), hz: crossings / 2 / (mid.length / 16000)};
}"""


@pytest.mark.parametrize("rate", [48000, 44100])
def test_worklet_resamples_to_16k_int16(page: Any, base: str, rate: int) -> None:
    page.goto(base + "/")
    tone = page.evaluate(_WORKLET_TONE, [rate, 1000])
    assert abs(tone["n"] - 16000) <= 32, tone  # 1 s at 16 kHz, less the filter's delay
    assert abs(tone["rms"] - 0.5 / 2 ** 0.5) < 0.005 and abs(tone["hz"] - 1000) < 2, tone  # passed unchanged
    alias = page.evaluate(_WORKLET_TONE, [rate, 9000])  # above 8 kHz: it would fold back to 7 kHz
    assert alias["rms"] < 0.5 / 2 ** 0.5 / 100, alias  # at least 40 dB down
    _no_script_errors(page)
