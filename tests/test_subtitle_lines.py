"""Subtitle lines (``max_line_width`` characters per line, ``max_line_count`` lines per cue) in srt/vtt: the
splitting rules, and the option from every front end (Python, fun-asr-transcribe, the OpenAI form, fun-asr-batch)
as the one options table declares it."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

import fun_asr
from fun_asr.asr.formats import render, to_srt, to_vtt, wrap_lines
from fun_asr.asr.option_table import OPTIONS
from fun_asr.asr.results import Segment, Transcription

EN = "the quick brown fox jumps over the lazy dog and runs far away"


def _seg(text: str, start: float, end: float, words: list[tuple[str, float, float]] | None = None,
         speaker: int | None = None) -> Segment:
    w = None if words is None else [{"word": t, "start": a, "end": b} for t, a, b in words]
    return Segment(start, end, text, [], "eos", False, False, words=w, speaker=speaker)


def _t(*segments: Segment, **options: object) -> Transcription:
    return Transcription(" ".join(s.text for s in segments), list(segments), "en", 10.0, {}, dict(options))


def _cues(srt: str) -> list[tuple[str, str, list[str]]]:
    """(start, end, lines) of each srt cue."""
    out = []
    for block in srt.strip().split("\n\n"):
        lines = block.split("\n")
        a, b = lines[1].split(" --> ")
        out.append((a, b, lines[2:]))
    return out


# --- the rules ---------------------------------------------------------------------------------------------------

def test_lines_wrap_at_spaces_and_cjk_at_characters() -> None:
    assert wrap_lines(EN, 20) == ["the quick brown fox", "jumps over the lazy", "dog and runs far", "away"]
    assert all(len(line) <= 20 for line in wrap_lines(EN, 20))
    assert wrap_lines("supercalifragilistic is long", 8) == ["supercalifragilistic", "is long"]  # never mid-word
    # punctuation stays with the character before it (and counts toward the width)
    assert wrap_lines("今天天气很好，我们去公园散步吧。", 5) == ["今天天气很", "好，我们去", "公园散步", "吧。"]
    assert wrap_lines("我用 FunASR 识别", 6) == ["我用", "FunASR", "识别"]


def test_default_output_is_unchanged() -> None:
    t = _t(_seg(EN, 1.0, 5.0))
    assert to_srt(t) == "1\n00:00:01,000 --> 00:00:05,000\n" + EN + "\n"
    assert render(t, "srt", max_line_width=None) == to_srt(t)
    assert render(t, "vtt") == to_vtt(t) == f"WEBVTT\n\n00:00:01.000 --> 00:00:05.000\n{EN}\n"


def test_width_alone_wraps_one_cue_into_lines() -> None:
    cues = _cues(render(_t(_seg(EN, 1.0, 5.0)), "srt", max_line_width=20))
    assert cues == [("00:00:01,000", "00:00:05,000",
                     ["the quick brown fox", "jumps over the lazy", "dog and runs far", "away"])]


def test_count_splits_cues_in_proportion_to_characters() -> None:
    cues = _cues(render(_t(_seg(EN, 1.0, 5.0)), "srt", max_line_width=20, max_line_count=2))
    assert [c[2] for c in cues] == [["the quick brown fox", "jumps over the lazy"], ["dog and runs far", "away"]]
    n1 = len("thequickbrownfoxjumpsoverthelazy")
    n = len(EN.replace(" ", ""))
    split = 1.0 + 4.0 * n1 / n
    stamp = f"00:00:0{int(split)},{round((split % 1) * 1000):03d}"
    assert cues[0][:2] == ("00:00:01,000", stamp) and cues[1][:2] == (stamp, "00:00:05,000")


def test_count_splits_cues_at_word_times() -> None:
    words = [(w if i == 0 else " " + w, 1.0 + 0.3 * i, 1.2 + 0.3 * i) for i, w in enumerate(EN.split())]
    t = _t(_seg(EN, 1.0, 5.0, words))
    cues = _cues(to_srt(t, max_line_width=20, max_line_count=1))
    assert [c[2] for c in cues] == [["the quick brown fox"], ["jumps over the lazy"], ["dog and runs far"], ["away"]]
    # each cue from its first word's start to its last word's end
    assert [c[:2] for c in cues] == [("00:00:01,000", "00:00:02,100"), ("00:00:02,200", "00:00:03,300"),
                                     ("00:00:03,400", "00:00:04,500"), ("00:00:04,600", "00:00:04,800")]
    # word cues (words=True) give way to line cues when lines are asked for
    assert to_srt(t, True, max_line_width=20, max_line_count=1) == to_srt(t, max_line_width=20, max_line_count=1)


def test_cjk_word_times_and_speakers_and_vtt() -> None:
    text = "今天天气很好我们去公园"
    words = [(ch, 2.0 + 0.5 * i, 2.4 + 0.5 * i) for i, ch in enumerate(text)]
    t = _t(_seg(text, 2.0, 7.5, words, speaker=1))
    srt = to_srt(t, max_line_width=4, max_line_count=2)
    assert _cues(srt) == [("00:00:02,000", "00:00:05,900", ["[SPK1] 今天天气", "很好我们"]),
                          ("00:00:06,000", "00:00:07,400", ["[SPK1] 去公园"])]
    vtt = to_vtt(t, max_line_width=4, max_line_count=2)
    assert "00:00:02.000 --> 00:00:05.900\n<v SPK1>今天天气\n很好我们\n" in vtt
    assert "00:00:06.000 --> 00:00:07.400\n<v SPK1>去公园\n" in vtt


def test_result_options_and_checks() -> None:
    t = _t(_seg(EN, 0.0, 4.0), max_line_width=20, max_line_count=1)
    assert len(_cues(render(t, "srt"))) == 4  # the options the transcription was made with
    assert len(_cues(render(t, "srt", max_line_width=100))) == 1
    with pytest.raises(ValueError, match="max_line_width must be a whole number of at least 1, got 0"):
        render(_t(_seg(EN, 0, 1)), "srt", max_line_width=0)
    with pytest.raises(ValueError, match="max_line_count needs max_line_width"):
        render(_t(_seg(EN, 0, 1)), "vtt", max_line_count=2)
    assert render(_t(_seg(EN, 0, 1)), "txt", max_line_width=5) == EN + "\n"  # txt has no lines to wrap


def test_the_table_declares_the_option_for_every_front_end() -> None:
    from fun_asr.asr.options import OptionArgs

    assert list(OptionArgs.__annotations__) == list(OPTIONS)
    w = OPTIONS["max_line_width"]
    assert (w.name, w.type, w.default, w.cli, w.form, w.ws, w.job) == \
        ("max_line_width", int, None, "--max-line-width", "max_line_width", None, "max_line_width")
    assert OPTIONS["max_line_count"].cli == "--max-line-count"
    assert OPTIONS["max_new_tokens"].default == 512 and OPTIONS["segment_seconds"].default == 30.0


# --- the front ends (the demo model, the real VAD) ---------------------------------------------------------------

WIDTH, COUNT = 6, 1


def _want(result: Transcription, fmt: str = "srt") -> str:
    """The subtitles the result gives with the line limits (more cues than the plain ones)."""
    lined = render(result, fmt, max_line_width=WIDTH, max_line_count=COUNT)
    plain = render(result, fmt)
    assert lined.count(" --> ") > plain.count(" --> ") > 0
    return lined


def test_session_option_is_recorded_and_used(demo: fun_asr.Session, three: Path) -> None:
    plain = demo.transcribe(three)
    lined = demo.transcribe(three, max_line_width=WIDTH, max_line_count=COUNT)
    assert lined.options["max_line_width"] == WIDTH and "max_line_width" not in plain.options
    assert render(lined, "srt") == _want(plain)  # the Session option reaches the writer
    assert all(len(line) <= WIDTH or " " not in line for c in _cues(render(lined, "srt")) for line in c[2])
    with pytest.raises(ValueError, match="max_line_count needs max_line_width"):
        demo.options(max_line_count=2)
    with pytest.raises(TypeError, match="unexpected keyword argument 'max_line_widht'; .*max_line_width"):
        demo.transcribe(three, max_line_widht=3)


def test_cli_flags(demo: fun_asr.Session, three: Path, vad_dir: Path) -> None:
    base = [sys.executable, "-m", "fun_asr.cli.transcribe", "-m", "demo", "--vad-model", str(vad_dir), str(three)]
    r = subprocess.run([*base, "-f", "srt", "--max-line-width", str(WIDTH), "--max-line-count", str(COUNT)],
                       capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr
    assert r.stdout == _want(demo.transcribe(three))
    bad = subprocess.run([*base, "-f", "srt", "--max-line-count", "2"], capture_output=True, text=True, timeout=600)
    assert bad.returncode == 2 and "--max-line-count needs --max-line-width" in bad.stderr
    bad = subprocess.run([*base, "-f", "txt", "--max-line-width", "9"], capture_output=True, text=True, timeout=600)
    assert bad.returncode == 2 and "--max-line-width shape srt/vtt subtitles" in bad.stderr
    bad = subprocess.run([*base, "-f", "vtt", "--max-line-width", "0"], capture_output=True, text=True, timeout=600)
    assert bad.returncode == 2 and "--max-line-width must be a whole number of at least 1, got 0" in bad.stderr


def test_openai_form_field(demo: fun_asr.Session, three: Path) -> None:
    testclient = pytest.importorskip("fastapi.testclient")
    from fun_asr.serve.app import create_app

    want = demo.transcribe(three)
    with testclient.TestClient(create_app(demo, model_id="fun-asr-nano")) as client:
        def post(**data: str):  # noqa: ANN202
            return client.post("/v1/audio/transcriptions", files={"file": ("a.wav", three.read_bytes())}, data=data)

        for fmt in ("srt", "vtt"):
            r = post(response_format=fmt, max_line_width=str(WIDTH), max_line_count=str(COUNT))
            assert r.status_code == 200, r.text
            assert r.text == _want(want, fmt)
        assert post(response_format="srt").text == render(want, "srt")
        r = post(response_format="srt", max_line_width="wide")
        assert r.status_code == 400 and r.json()["error"]["param"] == "max_line_width"
        r = post(response_format="json", max_line_width="20")
        assert r.status_code == 400 and r.json()["error"]["param"] == "max_line_width"
        assert "srt or vtt" in r.json()["error"]["message"]


def test_batch_job_key(demo: fun_asr.Session, three: Path, tmp_path: Path, vad_dir: Path) -> None:
    from fun_asr.jobs import batch

    r = subprocess.run([sys.executable, "-m", "fun_asr.cli.batch", str(three), "-o", str(tmp_path / "cli"),
                        "-m", "demo", "--vad-model", str(vad_dir), "--max-line-width", str(WIDTH),
                        "--max-line-count", str(COUNT), "--quiet"], capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr
    rec = json.loads((tmp_path / "cli" / "shard-00000.jsonl").read_text().splitlines()[0])
    assert rec["options"]["max_line_count"] == COUNT and len(rec["cues"]) > len(rec["segments"])

    want = demo.transcribe(three, max_line_width=WIDTH, max_line_count=COUNT)
    batch.run([three], tmp_path / "out", session=demo, max_line_width=WIDTH, max_line_count=COUNT)
    rec = json.loads((tmp_path / "out" / "shard-00000.jsonl").read_text().splitlines()[0])
    assert rec["options"]["max_line_width"] == WIDTH
    assert [c["text"] for c in rec["cues"]] == [c[2][0] for c in _cues(render(want, "srt"))]
    assert all(re.fullmatch(r"\d+\.?\d*", str(c["start"])) for c in rec["cues"])
    batch.run([three], tmp_path / "plain", session=demo)
    assert "cues" not in json.loads((tmp_path / "plain" / "shard-00000.jsonl").read_text().splitlines()[0])
    with pytest.raises(batch.BatchError, match="max_line_width must be a whole number"):
        batch.run([three], tmp_path / "bad", session=demo, max_line_width=-1)
