"""fun_asr.Session / fun-asr-transcribe against an independent Transformers-based reference."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import soundfile as sf
import soxr

import fun_asr
from fun_asr.asr.formats import to_json
from fun_asr.audio.decode import AudioError
from fun_asr.audio.frontend import FrontendConfig, fbank, features, lfr
from fun_asr.converter.hub import DEFAULT_REPO, DEFAULT_REVISION
from reference import (
    kaldi_fbank_numpy,
    lfr_numpy,
    load_reference,
    reference_transcribe_tokens,
)

# These tests decode a few tokens on purpose: the max_new_tokens warnings are expected.
pytestmark = pytest.mark.filterwarnings("ignore::fun_asr.notices.TruncatedOutputWarning")


EXAMPLES = Path(__file__).resolve().parents[1] / "examples"
STOP = [151645, 151643]
MAX_NEW = 20


def speechlike(seconds: float, seed: int, rate: int = 16000) -> np.ndarray:
    """Noise shaped by a syllable-rate envelope (never silent), in [-1, 1]."""
    rng = np.random.default_rng(seed)
    n = int(seconds * rate)
    t = np.arange(n) / rate
    env = 0.2 + 0.8 * np.clip(np.sin(2 * np.pi * 3.0 * t + rng.uniform(0, 6)), 0, None) ** 2
    return (0.3 * env * rng.standard_normal(n)).astype(np.float32)


@pytest.fixture(scope="module")
def clips(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    d = tmp_path_factory.mktemp("clips")
    out = {}
    short = speechlike(0.7, 1)
    sf.write(d / "short.wav", short, 16000)
    out["short"] = d / "short.wav"
    stereo = np.stack([speechlike(2.5, 2, 44100), speechlike(2.5, 3, 44100)], axis=1)
    sf.write(d / "stereo44k.flac", stereo, 44100)
    out["stereo44k"] = d / "stereo44k.flac"
    mixed = np.concatenate([np.zeros(8000, np.float32), speechlike(3.0, 4), np.zeros(4000, np.float32)])
    sf.write(d / "silence_speech.ogg", mixed, 16000)
    out["silence_speech"] = d / "silence_speech.ogg"
    out["example_en"] = EXAMPLES / "en_hello.wav"
    return out


def reference_16k(path: Path) -> np.ndarray:
    data, rate = sf.read(path, dtype="float32", always_2d=True)
    mono = data.mean(axis=1)
    return mono if rate == 16000 else soxr.resample(mono, rate, 16000, quality="HQ").astype(np.float32)


@pytest.fixture(scope="module")
def ref_model(tiny_f32: Path):  # noqa: ANN201
    return load_reference(tiny_f32)


@pytest.fixture(scope="module")
def sessions(tiny_f32: Path, tiny_gguf) -> dict[str, fun_asr.Session]:  # noqa: ANN001
    return {"hf": fun_asr.Session(tiny_f32, device="cpu"), "gguf": fun_asr.Session(tiny_gguf("f32"), device="cpu")}


def test_frontend_matches_numpy_kaldi(clips: dict[str, Path]) -> None:
    cfg = FrontendConfig()
    for name, path in clips.items():
        x = reference_16k(path)
        ours = fbank(x, cfg)
        ref = kaldi_fbank_numpy(x.astype(np.float64) * 32768.0)
        assert ours.shape == ref.shape, name
        np.testing.assert_allclose(ours, ref, atol=2e-3, rtol=1e-4, err_msg=name)
        np.testing.assert_array_equal(lfr(ours, 7, 6), lfr_numpy(ours))
        assert features(x, cfg).shape == (-(-ours.shape[0] // 6), 560)


@pytest.mark.parametrize("variant", [
    {"language": None, "itn": True, "hotwords": None},
    {"language": "en", "itn": True, "hotwords": None},
    {"language": "中文", "itn": False, "hotwords": None},
    {"language": "japanese", "itn": True, "hotwords": ["FunASR", "ggml"]},
])
@pytest.mark.parametrize("source", ["hf", "gguf"])
def test_tokens_match_reference(source: str, variant: dict, clips: dict[str, Path], sessions, ref_model,  # noqa: ANN001
                                tiny_f32: Path) -> None:
    session = sessions[source]
    lang = session.normalize_language(variant["language"])
    tokenizer_json = (tiny_f32 / "tokenizer.json").read_text("utf-8")
    for name, path in clips.items():
        got = session.transcribe(path, language=variant["language"], itn=variant["itn"],
                                 hotwords=variant["hotwords"], max_new_tokens=MAX_NEW, repetition_guard=False)
        want = reference_transcribe_tokens(ref_model, tokenizer_json, reference_16k(path), lang, variant["itn"],
                                           variant["hotwords"] or [], MAX_NEW, STOP)
        assert len(got.segments) == 1
        assert got.segments[0].tokens == want, f"{source} {name} {variant}"
        assert got.language == lang


def test_array_and_bytes_inputs(clips: dict[str, Path], sessions) -> None:  # noqa: ANN001
    s = sessions["gguf"]
    path = clips["stereo44k"]
    by_path = s.transcribe(path, max_new_tokens=8, repetition_guard=False)
    data, rate = sf.read(path, dtype="float32")
    by_array = s.transcribe(data, sample_rate=rate, max_new_tokens=8, repetition_guard=False)
    by_bytes = s.transcribe(path.read_bytes(), max_new_tokens=8, repetition_guard=False)
    with path.open("rb") as f:
        by_file = s.transcribe(f, max_new_tokens=8, repetition_guard=False)
    assert by_path.segments[0].tokens == by_array.segments[0].tokens == by_bytes.segments[0].tokens
    assert by_file.segments[0].tokens == by_path.segments[0].tokens
    assert abs(by_path.duration - 2.5) < 1e-3
    t = by_path.timings
    for key in ("frontend_ms", "encode_ms", "prefill_ms", "decode_ms", "tokens_per_s", "real_time_factor"):
        assert key in t and t[key] >= 0


def test_truncation_and_repetition_flags(clips: dict[str, Path], sessions) -> None:  # noqa: ANN001
    s = sessions["gguf"]
    with pytest.warns(UserWarning, match="max_new_tokens=3"):
        r = s.transcribe(clips["short"], max_new_tokens=3, repetition_guard=False)
    seg = r.segments[0]
    assert seg.truncated and seg.stop_reason == "max_new_tokens" and len(seg.tokens) == 3
    assert json.loads(to_json(r))["segments"][0]["truncated"] is True


def _is_loop(tokens: list[int]) -> bool:
    for n in range(1, 9):
        reps = max(4, -(-16 // n))
        tail = tokens[-n * reps:]
        if len(tail) == n * reps and all(tail[i] == tail[i - n] for i in range(n, len(tail))):
            return True
    return False


def test_repetition_guard(tmp_path_factory: pytest.TempPathFactory, clips: dict[str, Path]) -> None:
    from make_random_checkpoint import make_checkpoint

    # Unscaled random decoder weights give near-constant greedy tokens: a loop to stop.
    flat = make_checkpoint(tmp_path_factory.mktemp("flat") / "tiny-flat", "tiny", seed=5, lm_scale=1.0)
    s = fun_asr.Session(flat, device="cpu")
    free = s.transcribe(clips["short"], max_new_tokens=120, repetition_guard=False).segments[0]
    with pytest.warns(UserWarning, match="repetition guard"):
        guarded = s.transcribe(clips["short"], max_new_tokens=120).segments[0]
    assert guarded.repetition and guarded.stop_reason == "repetition" and not guarded.truncated
    assert guarded.tokens == free.tokens[: len(guarded.tokens)]
    assert _is_loop(guarded.tokens) and not _is_loop(guarded.tokens[:-1])


def test_long_audio_splits_at_quiet_points(sessions) -> None:  # noqa: ANN001
    rate = 16000
    parts, quiet = [], []
    t = 0.0
    for i, (speech, gap) in enumerate([(26.0, 1.0), (27.0, 1.0), (26.5, 1.0), (13.0, 0.0)]):
        parts.append(speechlike(speech, 10 + i))
        t += speech
        if gap:
            parts.append(np.zeros(int(gap * rate), np.float32))
            quiet.append((t, t + gap))
            t += gap
    audio = np.concatenate(parts)
    assert len(audio) / rate >= 95
    r = sessions["gguf"].transcribe(audio, sample_rate=rate, max_new_tokens=2, repetition_guard=False)
    segs = r.segments
    assert len(segs) == 4
    assert segs[0].start == 0.0 and abs(segs[-1].end - len(audio) / rate) < 1e-9
    for a, b in zip(segs, segs[1:], strict=False):
        assert a.end == b.start  # no gaps, no overlap
        assert any(lo <= a.end <= hi for lo, hi in quiet), f"cut at {a.end:.2f}s is not in a pause"
    assert all(s.end - s.start <= 30.0 + 1e-9 for s in segs)


def test_bad_inputs(sessions, tmp_path: Path) -> None:  # noqa: ANN001
    s = sessions["gguf"]
    empty = tmp_path / "empty.wav"
    sf.write(empty, np.zeros(0, np.float32), 16000)
    with pytest.raises(AudioError, match="empty"):
        s.transcribe(empty)
    junk = tmp_path / "notes.wav"
    junk.write_text("this is not audio")
    with pytest.raises(AudioError, match="cannot decode audio"):
        s.transcribe(junk)
    with pytest.raises(FileNotFoundError, match="no such audio file"):
        s.transcribe(tmp_path / "missing.wav")
    with pytest.raises(AudioError, match="NaN"):
        s.transcribe(np.array([0.1, np.nan, 0.2] * 1000, np.float32), sample_rate=16000)
    with pytest.raises(AudioError, match="sample_rate"):
        s.transcribe(np.zeros(1600, np.float32))
    with pytest.raises(ValueError, match=r"language 'f\\nr' contains the control character U\+000A; a language is a "
                       r"name such as zh \(chinese"):  # an unknown name is used as written (as FunASR)
        s.transcribe(EXAMPLES / "en_hello.wav", language="f\nr")
    with pytest.raises(ValueError, match="max_new_tokens"):
        s.transcribe(EXAMPLES / "en_hello.wav", max_new_tokens=0)


def _cli(*args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "fun_asr.cli.transcribe", *args], capture_output=True, text=True,
                          env={**os.environ, **(env or {})}, timeout=600)


def test_cli_every_format(tiny_gguf, tmp_path: Path) -> None:  # noqa: ANN001
    model = str(tiny_gguf("q8_0"))
    clip = str(EXAMPLES / "en_hello.wav")
    r = _cli(clip, "-m", model, "--device", "cpu", "--max-new-tokens", "6", "--no-repetition-guard")
    assert r.returncode == 0, r.stderr
    txt = r.stdout
    r = _cli(clip, "-m", model, "--device", "cpu", "--max-new-tokens", "6", "--no-repetition-guard",
             "-f", "all", "-o", str(tmp_path), "--language", "en", "--hotwords", "fun,asr", "--no-itn")
    assert r.returncode == 0, r.stderr
    data = json.loads((tmp_path / "en_hello.json").read_text())
    assert set(data) == {"schema_version", "input", "source", "text", "language", "detected_language", "duration",
                         "truncated", "input_truncated", "empty_reason", "error", "segmentation", "warnings",
                         "warning_codes", "segments", "timings", "options"}
    assert data["truncated"] and data["warnings"] and not data["input_truncated"] and data["error"] is None
    assert set(data["segments"][0]) == {"start", "end", "text", "tokens", "stop_reason", "truncated", "repetition",
                                        "words", "token_logprobs", "avg_logprob", "compression_ratio",
                                        "no_speech_prob", "token_words"}
    assert len(data["segments"][0]["token_logprobs"]) == 6 and data["segments"][0]["no_speech_prob"] is None
    assert data["options"] == {"language": "en", "itn": False, "hotwords": ["fun", "asr"], "max_new_tokens": 6,
                               "segment_seconds": 30.0, "repetition_guard": False}
    assert len(data["segments"][0]["tokens"]) == 6 and data["segments"][0]["truncated"]
    srt = (tmp_path / "en_hello.srt").read_text()
    assert re.fullmatch(r"1\n00:00:00,000 --> 00:00:04,646\n.*\n", srt, re.S), srt
    vtt = (tmp_path / "en_hello.vtt").read_text()
    assert vtt.startswith("WEBVTT\n\n00:00:00.000 --> 00:00:04.646\n")
    assert (tmp_path / "en_hello.txt").read_text() == data["text"] + "\n"
    assert txt.strip() != "" or data["text"] == ""


def test_cli_bad_file_does_not_stop_the_rest(tiny_gguf, tmp_path: Path) -> None:  # noqa: ANN001
    bad = tmp_path / "bad.wav"
    bad.write_text("nope")
    r = _cli(str(bad), str(EXAMPLES / "en_hello.wav"), "-m", str(tiny_gguf("q8_0")), "--device", "cpu",
             "--max-new-tokens", "4", "-f", "json", "-o", str(tmp_path))
    assert r.returncode == 1
    assert "bad.wav: " in r.stderr and "Traceback" not in r.stderr and "1 of 2 file(s) failed" in r.stderr
    assert (tmp_path / "en_hello.json").is_file()
    r = _cli(str(EXAMPLES / "en_hello.wav"), "-m", str(tiny_gguf("q8_0")), "--language", "klingon", "--max-new-tokens",
             "4")  # a language the model lacks reaches the prompt as written (as FunASR), with a notice
    assert r.returncode == 0 and "'klingon' is not one of this model's languages" in r.stderr
    assert "Traceback" not in r.stderr


HUB_SCRIPT = """
import sys, fun_asr
s = fun_asr.Session(*sys.argv[1:], device="cpu", progress=False)
print(s.path)
print(s.model.info()["tensor_types"]["blk.0.attn_q.weight"])
"""


def test_hub_cache_found_and_converted_once(tiny_f32: Path, tmp_path: Path) -> None:
    # huggingface_hub reads HF_HUB_CACHE / HF_HUB_OFFLINE at import: run the session in a fresh process.
    hub = tmp_path / "hub"
    repo = hub / f"models--{DEFAULT_REPO.replace('/', '--')}"
    shutil.copytree(tiny_f32, repo / "snapshots" / DEFAULT_REVISION)
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text(DEFAULT_REVISION)
    env = {**os.environ, "HF_HUB_CACHE": str(hub), "HF_HUB_OFFLINE": "1", "FUN_ASR_CACHE_DIR": str(tmp_path / "c")}

    def session(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-c", HUB_SCRIPT, *args], capture_output=True, text=True, env=env,
                              timeout=600)

    r = session()  # the default model
    assert r.returncode == 0, r.stderr
    expected = tmp_path / "c" / "models" / f"FunAudioLLM--Fun-ASR-Nano-2512-hf--{DEFAULT_REVISION[:12]}-q8_0.gguf"
    assert r.stdout.split() == [str(expected), "q8_0"]
    assert [p.name for p in (tmp_path / "c" / "models").iterdir()] == [expected.name]
    mtime = expected.stat().st_mtime_ns
    r = session(DEFAULT_REPO)
    assert r.returncode == 0, r.stderr
    assert r.stdout.split()[0] == str(expected) and expected.stat().st_mtime_ns == mtime  # converted once
    r = session("someone/not-cached")
    assert r.returncode != 0 and "HF_HUB_OFFLINE" in r.stderr
    with pytest.raises(FileNotFoundError, match="not a Hugging Face repo id"):
        fun_asr.Session(str(tmp_path / "nothing.gguf"), device="cpu")


def test_a_dropped_session_is_freed_at_once() -> None:
    """No reference cycle holds a Session: dropping the last reference frees it (and its native model) right
    away, without waiting for the garbage collector."""
    import gc
    import weakref

    was_enabled = gc.isenabled()
    gc.disable()
    try:
        s = fun_asr.Session("demo", device="cpu", progress=False)
        s.transcribe(str(Path(__file__).resolve().parents[1] / "examples" / "demo_1.wav"))
        ref = weakref.ref(s)
        del s
        assert ref() is None
    finally:
        if was_enabled:
            gc.enable()
