"""``-m demo`` says what it is wherever it shows: fun-asr-serve lists it under its own id with a description
(``GET /v1/models``, in OpenAI's list shape), the web page reads that entry and shows a note, the ``-m/--model``
help of every command that takes one names ``demo``, the hotword help says the demo was not trained with hotwords,
and the demo's GGUF records nothing of the machine it was built on (``fsmn_vad.source`` is package-relative)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import fun_asr
from fun_asr.model import demo
from fun_asr.model.gguf_file import metadata_fields, open_gguf, source_name
from fun_asr.serve.protocols.openai.protocol import model_entry

ROOT = Path(__file__).resolve().parents[1]
OPENAI_MODEL_KEYS = {"id", "object", "created", "owned_by"}


@pytest.fixture(scope="module")
def cache(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """A fresh fun-asr cache for this module: the demo's GGUF is built into it here."""
    root = tmp_path_factory.mktemp("demo-cache")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("FUN_ASR_CACHE_DIR", str(root))
        mp.setenv("HF_ENDPOINT", "http://127.0.0.1:9")  # the demo needs no network
        yield root


@pytest.fixture(scope="module")
def session(cache: Path) -> fun_asr.Session:
    return fun_asr.Session("demo", device="cpu", progress=False)


def _help(module: str) -> str:
    r = subprocess.run([sys.executable, "-m", module, "--help"], capture_output=True, text=True, timeout=120,
                       env={**os.environ, "COLUMNS": "100"})
    assert r.returncode == 0, r.stderr
    return r.stdout


def _option_help(text: str, flag: str) -> str:
    """The help of one option (its block in argparse's --help), whitespace flattened."""
    for block in re.split(r"\n  (?=-)", text):
        if re.match(rf"{re.escape(flag)}\b", block.strip()):
            return " ".join(block.split())
    raise AssertionError(f"{flag} not in the help:\n{text}")


@pytest.mark.parametrize("module", ["fun_asr.cli.transcribe", "fun_asr.cli.serve", "fun_asr.cli.batch"])
def test_model_help_names_the_demo(module: str) -> None:
    text = _help(module)
    model = _option_help(text, "-m")
    assert "'demo'" in model and "20-word demo model" in model, model
    assert "zero one two" in model and "go on off" in model and "not for real speech" in model, model
    hotwords = _option_help(text, "--hotword-file" if module.endswith("serve") else "--hotwords")
    assert "demo model was not trained with hotwords" in hotwords, hotwords


def test_models_entry_keeps_openais_shape() -> None:
    plain = model_entry("fun-asr-nano", 1700000000)
    assert plain == {"id": "fun-asr-nano", "object": "model", "created": 1700000000, "owned_by": "fun-asr"}
    marked = model_entry(demo.SERVED_ID, 1700000000, demo=True)
    assert OPENAI_MODEL_KEYS <= set(marked) and marked["demo"] is True
    assert "demo" in marked["id"] and "20-word demo model" in marked["description"]
    assert all(word in marked["description"] for word in demo.WORDS)


def _served_app(argv: list[str], monkeypatch: pytest.MonkeyPatch) -> Any:
    """fun-asr-serve's main() with ``argv``, up to the point where uvicorn would serve: the app it built."""
    import uvicorn

    from fun_asr.cli.serve import main

    apps: list[Any] = []

    def run(self: Any, sockets: Any = None) -> None:
        apps.append(self.config.app)
        for sock in sockets or []:
            sock.close()

    monkeypatch.setattr(uvicorn.Server, "run", run)
    monkeypatch.setattr(warnings, "formatwarning", warnings.formatwarning)  # main() sets its own: restored
    assert main(["-m", "demo", "--device", "cpu", "--port", "0", "--ws-port", "0", "--no-access-log", *argv]) == 0
    return apps[0]


def test_serve_lists_the_demo_as_the_demo(session: fun_asr.Session, monkeypatch: pytest.MonkeyPatch,
                                          capsys: pytest.CaptureFixture[str]) -> None:
    """fun-asr-serve -m demo: /v1/models lists the demo under its own id (OpenAI's list, as the openai client
    reads it) with ``demo: true`` and what it knows; the page the server serves has the note that shows it."""
    from fastapi.testclient import TestClient

    assert session.demo
    app = _served_app([], monkeypatch)
    assert f"{demo.SERVED_ID} (" in capsys.readouterr().err  # the startup line names it so too
    with TestClient(app) as client:
        body = client.get("/v1/models").json()
        assert body["object"] == "list" and len(body["data"]) == 1
        entry = body["data"][0]
        assert entry["id"] == demo.SERVED_ID and entry["object"] == "model" and entry["owned_by"] == "fun-asr"
        assert isinstance(entry["created"], int) and entry["demo"] is True
        assert "20-word demo model" in entry["description"] and "seven" in entry["description"]
        assert client.get("/health").json()["model"] == demo.SERVED_ID
        # the page: a note element, filled from the entry's demo flag and description
        html = client.get("/").text
        assert re.search(r'<p id="model-note"[^>]*\bhidden\b', html), html[:2000]
        script = client.get("/web/app.js").text
        assert '$("model-note")' in script and "model.demo" in script and "model.description" in script
        # a request naming the demo, or the aliases clients already send, is served
        wav = (ROOT / "examples" / "demo_1.wav").read_bytes()
        for name in (demo.SERVED_ID, "fun-asr-nano", "whisper-1"):
            r = client.post("/v1/audio/transcriptions", files={"file": ("a.wav", wav)}, data={"model": name})
            assert r.status_code == 200 and r.json()["text"].lower().strip(" .") == "five two five eight", r.text
    app = _served_app(["--model-id", "mine"], monkeypatch)  # an id given: kept, still marked as the demo
    with TestClient(app) as client:
        entry = client.get("/v1/models").json()["data"][0]
        assert entry["id"] == "mine" and entry["demo"] is True


def test_the_demo_gguf_records_no_path_of_this_machine(session: fun_asr.Session, cache: Path) -> None:
    assert session.path.is_relative_to(cache) and demo.fingerprint() in session.path.name
    meta = metadata_fields(open_gguf(session.path))
    assert meta["fsmn_vad.source"] == "fun_asr/model/demo_model/fsmn-vad"
    package = Path(fun_asr.__file__).resolve().parent
    here = [str(cache), str(package), str(package.parent), str(ROOT), str(Path.home()), os.path.realpath(cache)]
    roots = set(os.listdir("/"))
    for key, value in meta.items():
        if not isinstance(value, str):
            continue
        assert not [s for s in here if s in value], key
        found = [m.group(0) for m in re.finditer(r"(?<![\w/.:~-])/([\w.-]+)/[^\s'\"]*", value) if m.group(1) in roots]
        assert not found, (key, found[:3])


def test_source_names(tmp_path: Path) -> None:
    """What a GGUF records as a sub-model's source: package-relative inside fun_asr, the repo id for a hub cache
    snapshot, the path itself (the user's own folder) otherwise."""
    assert source_name(demo.vad_dir()) == "fun_asr/model/demo_model/fsmn-vad"
    snapshot = tmp_path / "hub" / "models--funasr--fsmn-vad" / "snapshots" / "0123abcd"
    snapshot.mkdir(parents=True)
    assert source_name(snapshot) == "funasr/fsmn-vad"
    assert source_name(snapshot / "model.gguf") == "funasr/fsmn-vad"
    own = tmp_path / "my-vad"
    own.mkdir()
    assert source_name(own) == str(own.resolve())
