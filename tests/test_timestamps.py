"""Word timestamps through the product (Session, json/srt/vtt, CLI, server verbose_json) and the
ModelScope hub source, on a tiny FunASR-layout checkpoint with its CTC head (funasr 1.4.16 reference)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import soundfile as sf

from funasr_nano_ref import nano_reference_available

pytestmark = [
    pytest.mark.skipif(not nano_reference_available(), reason="funasr 1.4.16 (+ six, tiktoken) not installed"),
    pytest.mark.filterwarnings("ignore::fun_asr.notices.TruncatedOutputWarning"),
]

ROOT = Path(__file__).resolve().parents[1]
CLIP = ROOT / "examples" / "zh_weather.wav"
MAX_NEW = 16


@pytest.fixture(scope="module")
def ms_session(nano: dict[str, Path]):  # noqa: ANN201
    import fun_asr

    return fun_asr.Session(nano["ms-f32"], device="cpu", vad=None)


def test_session_words_equal_the_aligner(ms_session, nano: dict[str, Path]) -> None:  # noqa: ANN001
    """Session(word_timestamps=True) gives what the CTC aligner gives on the segment (whose equality with
    FunASR 1.4.16's timestamps test_funasr_layout.py checks), shifted by the segment start."""
    from fun_asr.audio.frontend import features

    x, _ = sf.read(CLIP, dtype="float32")
    r = ms_session.transcribe(x, sample_rate=16000, max_new_tokens=MAX_NEW, repetition_guard=False,
                              word_timestamps=True)
    assert r.options["word_timestamps"] is True and r.words
    seg = r.segments[0]
    raw = ms_session.tokenizer.decode([t for t in seg.tokens if t not in ms_session.stop_ids])
    want = ms_session.aligner.words(ms_session.model, features(x, ms_session.frontend), raw)
    assert [(w["word"], w["start"], w["end"], w["score"]) for w in r.words] == \
        [(t.text, t.start, t.end, t.score) for t in want]
    assert all(0 <= w["start"] <= w["end"] <= r.duration + 0.06 for w in r.words)
    d = r.to_dict()
    assert d["segments"][0]["words"] == r.words
    from fun_asr.asr.formats import render

    srt = render(r, "srt", words=True)
    cues = [w for w in r.words if w["word"].strip()]
    assert srt.count(" --> ") == len(cues) and render(r, "srt").count(" --> ") == 1
    assert render(r, "vtt", words=True).count(" --> ") == len(cues)
    # without word_timestamps nothing is computed
    assert ms_session.transcribe(x, sample_rate=16000, max_new_tokens=4).words is None


def test_hf_checkpoint_says_once_and_gives_segment_times(nano: dict[str, Path], caplog) -> None:  # noqa: ANN001
    import fun_asr

    s = fun_asr.Session(nano["hf-f32"], device="cpu", vad=None)
    assert s.aligner is None and "no CTC head" in s.ctc_reason
    with caplog.at_level("WARNING", logger="fun_asr"):
        a = s.transcribe(CLIP, max_new_tokens=3, word_timestamps=True)
        b = s.transcribe(CLIP, max_new_tokens=3, word_timestamps=True)
    assert a.words is None and b.words is None and a.segments[0].end > 0
    assert str(a.options["word_timestamps"]).startswith("unavailable: ")
    assert sum("word timestamps unavailable" in r.getMessage() for r in caplog.records) == 1


def test_cli_and_server_carry_words(nano: dict[str, Path], tmp_path: Path) -> None:
    base = [sys.executable, "-m", "fun_asr.cli.transcribe", str(CLIP), "-m", str(nano["ms-f32"]), "--device", "cpu",
            "--vad", "none", "--max-new-tokens", str(MAX_NEW), "--no-repetition-guard", "--quiet"]
    r = subprocess.run([*base, "--word-timestamps", "-f", "json"], capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr
    data = json.loads(r.stdout)
    words = data["segments"][0]["words"]
    assert words and all(set(w) == {"word", "start", "end", "score", "probability"} for w in words)
    r = subprocess.run([*base, "--word-timestamps", "-f", "srt"], capture_output=True, text=True, timeout=600)
    assert r.returncode == 0 and r.stdout.count(" --> ") == len([w for w in words if w["word"].strip()])

    from fastapi.testclient import TestClient

    import fun_asr
    from fun_asr.serve.app import create_app

    session = fun_asr.Session(nano["ms-f32"], device="cpu", vad=None)
    with TestClient(create_app(session, model_id="fun-asr-nano", max_new_tokens=MAX_NEW)) as client:
        files = {"file": ("a.wav", CLIP.read_bytes())}
        got = client.post("/v1/audio/transcriptions", files=files,
                          data={"response_format": "verbose_json", "timestamp_granularities[]": "word"}).json()
        assert [w["word"] for w in got["words"]] == [w["word"] for w in words]
        got = client.post("/v1/audio/transcriptions", files=files, data={"response_format": "verbose_json"}).json()
        assert "words" not in got
        bad = client.post("/v1/audio/transcriptions", files=files, data={"timestamp_granularities[]": "phoneme"})
        assert bad.status_code == 400 and bad.json()["error"]["param"] == "timestamp_granularities"


STUB = textwrap.dedent('''
    """A stand-in for the `modelscope` client: its snapshot_download returns a prepared local folder."""
    import os
    CALLS = []
    def snapshot_download(model_id, revision=None, allow_patterns=None, **kw):
        CALLS.append(model_id)
        with open(os.environ["MS_STUB_LOG"], "a") as f:
            f.write(model_id + "\\n")
        return os.environ["MS_STUB_ROOT"] + "/" + model_id.replace("/", "__")
''')

SCRIPT = """
import sys, fun_asr
s = fun_asr.Session("modelscope:FunAudioLLM/Fun-ASR-Nano-2512", device="cpu", vad="auto", progress=False)
print(s.path.name, s.aligner is not None, s.vad is not None)
"""


def test_modelscope_source_converts_once(nano: dict[str, Path], tmp_path: Path) -> None:
    from vad_fixture import fsmn_vad_dir

    root = tmp_path / "ms"
    root.mkdir()
    import shutil

    shutil.copytree(nano["ms"], root / "FunAudioLLM__Fun-ASR-Nano-2512")
    shutil.copytree(fsmn_vad_dir(), root / "iic__speech_fsmn_vad_zh-cn-16k-common-pytorch")
    stub = tmp_path / "stub" / "modelscope"
    stub.mkdir(parents=True)
    (stub / "__init__.py").write_text(STUB)
    env = {**os.environ, "PYTHONPATH": str(tmp_path / "stub"), "MS_STUB_ROOT": str(root),
           "MS_STUB_LOG": str(tmp_path / "calls.log"), "FUN_ASR_CACHE_DIR": str(tmp_path / "cache")}
    for _ in range(2):
        r = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True, env=env, timeout=600)
        assert r.returncode == 0, r.stderr
        name, ctc, vad = r.stdout.split()
        assert name.startswith("modelscope--FunAudioLLM--Fun-ASR-Nano-2512--") and name.endswith("-q8_0.gguf")
        assert ctc == "True" and vad == "True"  # the ModelScope release brings timestamps and ModelScope's VAD
    assert sorted(p.name.split("--")[1] for p in (tmp_path / "cache" / "models").iterdir()) == ["FunAudioLLM", "iic"]
    calls = (tmp_path / "calls.log").read_text().split()
    assert calls.count("FunAudioLLM/Fun-ASR-Nano-2512") == 2  # the client's own cache answers; converted once
    # without the client: one clear line
    r = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True, timeout=300,
                       env={**os.environ, "FUN_ASR_CACHE_DIR": str(tmp_path / "c2")})
    assert r.returncode != 0 and "pip install 'fun-asr[modelscope]'" in r.stderr


def test_mlt_languages_are_accepted(nano: dict[str, Path], tmp_path: Path) -> None:
    import shutil

    import fun_asr

    mlt = tmp_path / "Fun-ASR-MLT-Nano-2512"  # the checkpoint's name picks the 31-language table
    shutil.copytree(nano["ms"], mlt)
    s = fun_asr.Session(mlt, device="cpu", vad=None)
    assert s.language_table == "mlt_nano" and s.normalize_language("swedish") == "sv"
    before, _ = s.prompt_ids(s.options(language="sv"))
    assert "瑞典语" in s.tokenizer.decode(before)  # the prompt string comes from the table (data)
    nano_session = fun_asr.Session(nano["ms-f32"], device="cpu", vad=None)
    assert nano_session.language_table == "nano"
    assert nano_session.normalize_language("swedish") == "swedish"  # not Nano's: kept as written (as FunASR)
    r = subprocess.run([sys.executable, "-m", "fun_asr.cli.transcribe", str(CLIP), "-m", str(mlt), "--device", "cpu",
                        "--vad", "none", "--language", "swedish", "--max-new-tokens", "2", "--quiet"],
                       capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr
