"""The FSMN-VAD in front of the recognizer (Session / CLI / hub): only speech reaches the LLM, segments
are timed by the VAD, and each segment's text is what transcribing that cut of the audio gives."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import soundfile as sf

import fun_asr
from fun_asr.audio.frontend import features
from fun_asr.vad import FsmnVad

pytestmark = pytest.mark.filterwarnings("ignore::fun_asr.notices.TruncatedOutputWarning")

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"
SR = 16000
MAX_NEW = 6


@pytest.fixture(scope="module")
def vad_gguf(vad_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("vadgguf") / "fsmn-vad.gguf"
    r = subprocess.run([sys.executable, "-m", "fun_asr.cli.convert", str(vad_dir), "-o", str(out)],
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    assert "fsmn_vad" in r.stdout and "FunASR FSMN-VAD" in r.stdout  # says which layout it read
    return out


@pytest.fixture(scope="module")
def sessions(tiny_gguf, vad_gguf: Path) -> dict[str, fun_asr.Session]:  # noqa: ANN001
    model = tiny_gguf("f32")
    return {"vad": fun_asr.Session(model, device="cpu", vad="fsmn", vad_model=vad_gguf),
            "none": fun_asr.Session(model, device="cpu", vad=None)}


def _speech() -> np.ndarray:
    x, rate = sf.read(EXAMPLES / "en_hello.wav", dtype="float32")
    assert rate == SR
    return x


@pytest.fixture(scope="module")
def silence_speech_silence() -> np.ndarray:
    rng = np.random.default_rng(0)
    quiet = lambda s: (1e-4 * rng.standard_normal(int(s * SR))).astype(np.float32)  # noqa: E731
    return np.concatenate([quiet(2.0), _speech(), quiet(1.5), _speech(), quiet(2.0)])


class _CountingModel:
    """Wraps the native model and records every generate_batch call (how much the LLM is asked)."""

    def __init__(self, model: fun_asr._core.Model) -> None:
        self._model, self.calls = model, []

    def generate_batch(self, embeddings, *a, **k):  # noqa: ANN001, ANN002, ANN003, ANN201
        self.calls.append([e.shape[0] for e in embeddings])
        return self._model.generate_batch(embeddings, *a, **k)

    def __getattr__(self, name: str):  # noqa: ANN204
        return getattr(self._model, name)


def test_llm_hears_only_speech(sessions: dict[str, fun_asr.Session], silence_speech_silence: np.ndarray) -> None:
    s = sessions["vad"]
    real = s.model
    s.model = counting = _CountingModel(real)
    try:
        r = s.transcribe(silence_speech_silence, sample_rate=SR, max_new_tokens=MAX_NEW)
        silent = s.transcribe(np.zeros(5 * SR, np.float32), sample_rate=SR)
        calls_after_silence = len(counting.calls)
    finally:
        s.model = real
    assert r.segmentation == "vad" and len(r.segments) == 2
    speech_s = len(_speech()) / SR
    (a0, b0), (a1, b1) = [(seg.start, seg.end) for seg in r.segments]
    assert 1.5 <= a0 <= 2.1 and 2.0 + speech_s - 0.5 <= b0 <= 2.0 + speech_s + 0.5  # around the first utterance
    assert b0 < a1 and a1 >= 2.0 + speech_s + 0.8 and b1 <= len(silence_speech_silence) / SR
    # one decoding pass, two sequences whose audio rows come from the speech segments only
    assert len(counting.calls) == 1 and len(counting.calls[0]) == 2
    assert r.timings["vad_ms"] > 0 and r.timings["vad_ms"] < r.timings["total_ms"]
    # silence only: no LLM call at all, an empty text that says why
    assert calls_after_silence == 1
    assert silent.text == "" and silent.segments == [] and silent.empty_reason == "no_speech"


def test_segments_are_the_vads_and_texts_those_of_the_cut_audio(sessions: dict[str, fun_asr.Session],
                                                               vad_gguf: Path,
                                                               silence_speech_silence: np.ndarray) -> None:
    x = silence_speech_silence
    vad = FsmnVad.load(vad_gguf)
    expected = vad.segments(x)
    r = sessions["vad"].transcribe(x, sample_rate=SR, max_new_tokens=MAX_NEW, repetition_guard=False)
    assert [[round(s.start * 1000), round(s.end * 1000)] for s in r.segments] == expected
    for seg, (a, b) in zip(r.segments, expected, strict=True):
        cut = x[a * 16 : b * 16]  # FunASR cuts the audio at ms * 16 and transcribes the piece
        alone = sessions["none"].transcribe(cut, sample_rate=SR, max_new_tokens=MAX_NEW, repetition_guard=False)
        assert len(alone.segments) == 1 and seg.tokens == alone.segments[0].tokens


def test_shared_fbank_gives_the_slices_features(sessions: dict[str, fun_asr.Session],
                                                silence_speech_silence: np.ndarray) -> None:
    s = sessions["vad"]
    from fun_asr.asr.cutting import CutItem, Cutter

    item = CutItem(0)
    cutter = Cutter(s.frontend, s.vad, item, s.options())  # the recording at once: every sample and frame kept
    item.spans = cutter.feed(np.asarray(silence_speech_silence, np.float32)) + cutter.finish()
    assert item.fbank is not None and len(item.spans) == 2
    for a, b in item.spans + [(160 * 7, 160 * 7 + 16000), (0, 401)]:
        np.testing.assert_array_equal(s.engine._features(item, a, b), features(item.samples[a:b], s.frontend))
    # a start off the 10 ms grid falls back to the slice's own frontend
    np.testing.assert_array_equal(s.engine._features(item, 17, 9000), features(item.samples[17:9000], s.frontend))


def test_batch_with_vad_keeps_order_and_equals_one_by_one(sessions: dict[str, fun_asr.Session],
                                                          silence_speech_silence: np.ndarray) -> None:
    s = sessions["vad"]
    clips = [silence_speech_silence, _speech(), np.zeros(SR, np.float32), silence_speech_silence[: 6 * SR]]
    batch = s.transcribe_batch(clips, sample_rate=SR, max_new_tokens=MAX_NEW, batch_size=8)
    single = [s.transcribe(c, sample_rate=SR, max_new_tokens=MAX_NEW) for c in clips]
    assert [[g.tokens for g in r.segments] for r in batch] == [[g.tokens for g in r.segments] for r in single]
    assert batch[2].empty_reason == "no_speech"


def _cli(*args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "fun_asr.cli.transcribe", *args], capture_output=True, text=True,
                          timeout=600, env={**os.environ, **(env or {})})


def test_cli_vad_options(tiny_gguf, vad_gguf: Path, silence_speech_silence: np.ndarray,  # noqa: ANN001
                         tmp_path: Path) -> None:
    clip = tmp_path / "clip.flac"
    sf.write(clip, silence_speech_silence, SR)
    model = str(tiny_gguf("f32"))
    r = _cli(str(clip), "-m", model, "--device", "cpu", "--max-new-tokens", "3", "--vad", "fsmn", "--vad-model",
             str(vad_gguf), "-f", "json", "--quiet")
    assert r.returncode == 0, r.stderr
    data = json.loads(r.stdout)
    assert data["segmentation"] == "vad" and len(data["segments"]) == 2 and data["timings"]["vad_ms"] > 0
    assert data["segments"][0]["start"] >= 1.5
    r = _cli(str(clip), "-m", model, "--device", "cpu", "--max-new-tokens", "3", "--vad", "none", "-f", "json",
             "--quiet")
    assert r.returncode == 0 and json.loads(r.stdout)["segmentation"] == "pauses"
    r = _cli(str(clip), "-m", model, "--vad", "none", "--vad-model", str(vad_gguf))
    assert r.returncode == 2 and "--vad-model with --vad none" in r.stderr
    r = _cli(str(clip), "-m", model, "--device", "cpu", "--vad", "fsmn", "--vad-model", str(tmp_path / "nope"))
    assert r.returncode == 2 and "no such VAD model" in r.stderr


HUB_VAD_SCRIPT = """
import sys, fun_asr
s = fun_asr.Session(sys.argv[1], device="cpu", vad=sys.argv[2], progress=False)
print(s.vad is not None)
"""


def test_hub_vad_resolved_and_converted_once(tiny_gguf, vad_dir: Path, tmp_path: Path) -> None:  # noqa: ANN001
    hub = tmp_path / "hub"
    env = {"HF_HUB_CACHE": str(hub), "HF_HUB_OFFLINE": "1", "FUN_ASR_CACHE_DIR": str(tmp_path / "c")}

    def run(mode: str) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-c", HUB_VAD_SCRIPT, str(tiny_gguf("f32")), mode], capture_output=True,
                              text=True, env={**os.environ, **env}, timeout=300)

    r = run("auto")  # nothing on this machine: auto falls back, and says so once
    assert r.returncode == 0 and r.stdout.split() == ["False"], r.stderr
    assert r.stderr.count("no FSMN-VAD in this model") == 1
    r = run("fsmn")  # required: says why it cannot have it
    assert r.returncode != 0 and "funasr/fsmn-vad" in r.stderr and "HF_HUB_OFFLINE" in r.stderr
    rev = "0123456789abcdef0123456789abcdef01234567"
    repo = hub / "models--funasr--fsmn-vad"
    snap = repo / "snapshots" / rev
    snap.mkdir(parents=True)
    for f in ("model.pt", "config.yaml", "am.mvn", "configuration.json"):
        shutil.copy(vad_dir / f, snap / f)
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text(rev)
    for mode in ("fsmn", "auto"):
        r = run(mode)
        assert r.returncode == 0 and r.stdout.split() == ["True"], r.stderr
    converted = list((tmp_path / "c" / "models").iterdir())
    assert [p.name for p in converted] == [f"funasr--fsmn-vad--{rev[:12]}-fsmn_vad.gguf"]
    mtime = converted[0].stat().st_mtime_ns
    shutil.rmtree(hub)  # the converted GGUF alone is enough afterwards
    r = run("auto")
    assert r.stdout.split() == ["True"] and converted[0].stat().st_mtime_ns == mtime
