"""``-m demo``: the 20-word demo model shipped in the package transcribes the clips in examples/, is built into
the cache once, never touches the network, and says what it is."""

from __future__ import annotations

import logging
import os
import subprocess
import sys
from pathlib import Path

import pytest

import fun_asr
from fun_asr.model import demo

ROOT = Path(__file__).resolve().parents[1]
EXAMPLES = ROOT / "examples"


def _references() -> dict[str, str]:
    rows = (line.split(maxsplit=1) for line in (EXAMPLES / "demo.txt").read_text("utf-8").splitlines() if line)
    return {k: v for k, v in rows}


def test_package_data_is_small_and_complete() -> None:
    files = {p.name: p.stat().st_size for p in demo.artifact_dir().iterdir() if p.is_file()}
    assert {*demo.PLAIN_FILES, "tokenizer.base.json", "manifest.json", "weights.safetensors"} <= set(files)
    assert sum(files.values()) <= 10_000_000, files


def test_demo_transcribes_the_examples(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                       caplog: pytest.LogCaptureFixture) -> None:
    monkeypatch.setenv("FUN_ASR_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setenv("HF_ENDPOINT", "http://127.0.0.1:9")  # any network use would fail (and be logged)
    monkeypatch.delenv("FUN_ASR_VAD_MODEL", raising=False)
    with caplog.at_level(logging.INFO, logger="fun_asr"):
        s = fun_asr.Session("demo", device="cpu", progress=False)
    assert "20-word demo model" in caplog.text and "zero, one" in caplog.text
    assert "FSMN-VAD unavailable" not in caplog.text  # no VAD download attempted for the local demo
    built = list((tmp_path / "cache" / "models").glob("demo--*.gguf"))
    assert [p.name for p in built] == [s.path.name] and demo.fingerprint() in s.path.name
    refs = _references()
    assert len(refs) >= 3
    for stem, text in refs.items():
        r = s.transcribe(str(EXAMPLES / f"{stem}.wav"))
        assert r.text.lower().strip(" .") == text, (stem, r.text)
        assert set(r.text.lower().strip(" .").split()) <= set(demo.WORDS)
    mtime = s.path.stat().st_mtime_ns
    again = fun_asr.Session("demo", device="cpu", progress=False)
    assert again.path == s.path and s.path.stat().st_mtime_ns == mtime  # converted once


def test_demo_on_the_command_line(tmp_path: Path) -> None:
    env = {**os.environ, "FUN_ASR_CACHE_DIR": str(tmp_path / "cache")}
    refs = _references()
    clips = [str(EXAMPLES / f"{k}.wav") for k in refs]
    r = subprocess.run([sys.executable, "-m", "fun_asr.cli.transcribe", "-m", "demo", "--device", "cpu", *clips],
                       capture_output=True, text=True, env=env, timeout=600)
    assert r.returncode == 0, r.stderr
    lines = r.stdout.strip().splitlines()
    assert [line.split(": ", 1)[1].lower().strip(" .") for line in lines] == list(refs.values())
    assert "20-word demo model" in r.stderr
