"""Corpus jobs (fun-asr-batch). The local engine and the Ray engine (in-process and a
`ray start` cluster joined by address) give Session.transcribe's output token for token, broken
files are recorded, a job killed with SIGKILL resumes with every id exactly once, and every input
format (directory, glob, list, JSONL/CSV manifest, Kaldi wav.scp + text, fsspec URLs) is read."""

from __future__ import annotations

import json
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import warnings
from pathlib import Path

import numpy as np
import pytest
import soundfile as sf

import fun_asr
from fun_asr.jobs import batch

# Four tokens per segment keep these tests fast: the max_new_tokens warnings are expected.
pytestmark = pytest.mark.filterwarnings("ignore::fun_asr.notices.TruncatedOutputWarning")

TOKENS = 4
FORMATS = [("wav", 8000, "PCM_16"), ("flac", 16000, "PCM_16"), ("ogg", 44100, "VORBIS"), ("wav", 44100, "FLOAT"),
           ("flac", 8000, "PCM_24"), ("ogg", 16000, "VORBIS")]
BROKEN = ("broken/header.wav", "broken/empty.flac")


def _signal(rng: np.random.Generator, seconds: float, rate: int) -> np.ndarray:
    t = np.arange(int(seconds * rate)) / rate
    f0 = rng.uniform(120, 400)
    x = 0.3 * np.sin(2 * np.pi * f0 * t * (1 + 0.2 * np.sin(2 * np.pi * 0.7 * t)))
    x += 0.05 * rng.standard_normal(len(t))
    x *= (0.6 + 0.4 * np.sin(2 * np.pi * rng.uniform(1, 4) * t)) ** 2  # syllable-like loudness
    return x.astype(np.float32)


@pytest.fixture(scope="module")
def corpus(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """24 recordings: 22 of 0.5-8 s in wav/flac/ogg at 8/16/44.1 kHz (some in a sub-folder, one
    stereo), and 2 broken files."""
    root = tmp_path_factory.mktemp("corpus")
    rng = np.random.default_rng(15)
    lengths = np.concatenate([[0.5, 8.0], rng.uniform(0.5, 4.0, 20)])
    for i, seconds in enumerate(lengths):
        ext, rate, subtype = FORMATS[i % len(FORMATS)]
        path = root / ("sub" if i % 4 == 3 else "") / f"utt{i:02d}.{ext}"
        path.parent.mkdir(exist_ok=True)
        x = _signal(rng, float(seconds), rate)
        if i == 5:
            x = np.stack([x, 0.5 * x], axis=1)
        sf.write(path, x, rate, subtype=subtype)
    (root / "broken").mkdir()
    (root / BROKEN[0]).write_bytes(b"RIFF\x24\x00\x00\x00WAVEfmt this is not audio" * 3)
    (root / BROKEN[1]).write_bytes(b"")
    return root


@pytest.fixture(scope="module")
def model(tiny_gguf) -> Path:  # noqa: ANN001
    return tiny_gguf("q8_0")


@pytest.fixture(scope="module")
def session(model: Path) -> fun_asr.Session:
    return fun_asr.Session(model, device="cpu", vad=None)


def _good_files(corpus: Path) -> dict[str, Path]:
    return {str(p.relative_to(corpus).with_suffix("").as_posix()): p for p in sorted(corpus.rglob("*.*"))
            if "broken" not in p.parts}


@pytest.fixture(scope="module")
def expected(corpus: Path, session: fun_asr.Session) -> dict[str, tuple[str, list[list[int]]]]:
    """Session.transcribe, one file at a time: id -> (text, token ids per segment)."""
    out = {}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for key, path in _good_files(corpus).items():
            r = session.transcribe(path, max_new_tokens=TOKENS)
            out[key] = (r.text, [s.tokens for s in r.segments])
    assert len(out) == 22
    return out


def _lines(out: Path) -> list[dict]:
    return [json.loads(line) for shard in sorted(out.glob("shard-*.jsonl")) for line in shard.read_text().splitlines()]


def _check(out: Path, expected: dict, broken: int = 2) -> list[dict]:
    """Every id exactly once; the good ones equal to Session.transcribe; the broken ones with an error."""
    recs = _lines(out)
    ids = [r["id"] for r in recs]
    assert len(ids) == len(set(ids)), "an id was written twice"
    by_id = {r["id"]: r for r in recs}
    assert set(by_id) == set(expected) | {b.rsplit(".", 1)[0] for b in BROKEN[:broken]}
    for key, (text, tokens) in expected.items():
        rec = by_id[key]
        assert rec["error"] is None, rec["error"]
        assert rec["text"] == text, key
        assert [s["tokens"] for s in rec["segments"]] == tokens, key
    for b in BROKEN[:broken]:
        rec = by_id[b.rsplit(".", 1)[0]]
        assert rec["error"] and b in rec["error"] and rec["text"] == "" and rec["empty_reason"] == "error"
    return recs


# --- local engine ------------------------------------------------------------------------------

def test_local_engine_matches_transcribe(corpus: Path, session: fun_asr.Session, expected: dict,
                                         tmp_path: Path) -> None:
    out = tmp_path / "out"
    summary = batch.run([corpus], out, session=session, max_new_tokens=TOKENS, batch_size=4, shard_size=10, workers=2)
    recs = _check(out, expected)
    assert [len(p.read_text().splitlines()) for p in sorted(out.glob("shard-*.jsonl"))] == [10, 10, 4]
    rec = next(r for r in recs if r["id"] == "utt00")
    assert rec["audio"] == str(corpus / "utt00.wav") and rec["duration"] == 0.5
    assert {"text", "segments", "duration", "timings", "error", "warnings", "options"} <= rec.keys()
    assert rec["timings"]["load_ms"] > 0 and rec["options"]["max_new_tokens"] == TOKENS
    assert summary["results"] == 24 and summary["failed"] == 2 and summary["ok"] == 22 and summary["pending"] == 0
    assert summary["last_run"]["processed"] == 24 and summary["last_run"]["engine"] == "local"
    assert abs(summary["audio_seconds"] - sum(r["duration"] for r in recs)) < 1e-2
    assert json.loads((out / "summary.json").read_text()) == summary
    # a rerun has nothing left to do and writes nothing
    again = batch.run([corpus], out, session=session, max_new_tokens=TOKENS, batch_size=4)
    assert again["last_run"]["processed"] == 0 and again["last_run"]["skipped"] == 24
    assert len(_lines(out)) == 24
    # --retry-failed transcribes the failed ones again (still failing), each id still once
    again = batch.run([corpus], out, session=session, max_new_tokens=TOKENS, retry_failed=True)
    assert again["last_run"]["processed"] == 2
    _check(out, expected)


def _cli(*args: str, timeout: float = 300, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "fun_asr.cli.batch", *args], capture_output=True, text=True,
                          timeout=timeout, env=env)


def test_sigkill_midway_then_resume(corpus: Path, model: Path, expected: dict, tmp_path: Path) -> None:
    out = tmp_path / "out"
    args = [str(corpus), "-o", str(out), "-m", str(model), "--device", "cpu", "--vad", "none",
            "--max-new-tokens", str(TOKENS), "--batch-size", "2", "--quiet"]
    proc = subprocess.Popen([sys.executable, "-m", "fun_asr.cli.batch", *args], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE)
    deadline = time.monotonic() + 120
    try:
        while time.monotonic() < deadline and proc.poll() is None:
            shards = list(out.glob("shard-*.jsonl"))
            if shards and shards[0].read_bytes().count(b"\n") >= 1:  # the first batch is on disk
                break
            time.sleep(0.005)
        assert proc.poll() is None, f"the job ended before it could be killed: {proc.communicate()}"
        os.kill(proc.pid, signal.SIGKILL)
    finally:
        proc.wait(30)
    assert proc.returncode == -signal.SIGKILL
    assert not (out / "summary.json").exists()
    first = _lines(out)
    assert 2 <= len(first) < 24
    # a write torn by the crash: the last record cut in the middle of its line
    shard = sorted(out.glob("shard-*.jsonl"))[-1]
    data = shard.read_bytes()
    lines = data.splitlines(keepends=True)
    torn_id = json.loads(lines[-1])["id"]
    shard.write_bytes(b"".join(lines[:-1]) + lines[-1][: len(lines[-1]) // 2])
    r = _cli(*args)
    assert r.returncode == 1, r.stderr
    recs = _check(out, expected)
    assert torn_id in {x["id"] for x in recs}
    summary = json.loads((out / "summary.json").read_text())
    assert summary["results"] == 24 and summary["last_run"]["skipped"] == len(first) - 1
    assert summary["last_run"]["processed"] == 24 - len(first) + 1
    # the finished job: a rerun reports everything done
    r = _cli(*args[:-1])
    assert r.returncode == 1 and "0 transcribed (0 failed), 24 already done" in r.stderr, r.stderr


def test_shard_size_is_the_most_records_a_shard_holds(corpus: Path, session: fun_asr.Session,
                                                     tmp_path: Path) -> None:
    """--shard-size 3 with batches of 4 gave shards of 4 (a batch never split)."""
    out = tmp_path / "out"
    batch.run([corpus], out, session=session, max_new_tokens=TOKENS, batch_size=4, shard_size=3)
    sizes = [len(p.read_text().splitlines()) for p in sorted(out.glob("shard-*.jsonl"))]
    assert sizes == [3] * 8, sizes


def test_output_folder_problems_are_one_clear_line(corpus: Path, model: Path, session: fun_asr.Session,
                                                   tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                   capsys: pytest.CaptureFixture) -> None:
    """A folder that cannot be written printed a raw `[Errno 30] Read-only file system: ...`;
    now one line naming the path and what to do, before the model loads; a write failing mid-job
    (a full disk) names the shard and says that rerunning resumes."""
    if os.geteuid() != 0:
        ro = tmp_path / "ro"
        ro.mkdir()
        ro.chmod(0o555)
    else:  # root writes through permissions: a read-only file system
        ro = Path("/sys/kernel")
        if not ro.is_dir():
            pytest.skip("no read-only directory to test with")
    for out in (ro, ro / "new"):
        r = _cli(str(corpus), "-o", str(out), "-m", str(tmp_path / "no-model.gguf"))
        assert r.returncode == 2 and r.stderr.count("\n") == 1, r.stderr
        assert "[Errno" not in r.stderr and f"output folder {out}: cannot" in r.stderr
        assert "choose a writable folder (-o)" in r.stderr

    import errno

    from fun_asr.cli import batch as cli

    calls = [0]
    real_fsync = os.fsync

    def full(fd: int) -> None:
        calls[0] += 1
        if calls[0] > 1:
            raise OSError(errno.ENOSPC, "No space left on device")
        real_fsync(fd)

    monkeypatch.setattr(batch.os, "fsync", full)
    out = tmp_path / "full"
    code = cli.main([str(corpus), "-o", str(out), "-m", str(model), "--device", "cpu", "--vad", "none",
                     "--max-new-tokens", str(TOKENS), "--batch-size", "4", "--quiet"])
    err = capsys.readouterr().err
    assert code == 1 and err.count("\n") == 1 and "[Errno" not in err, err
    assert f"cannot write {out / 'shard-00000.jsonl'} (No space left on device)" in err
    assert "rerun the same command to resume" in err
    monkeypatch.undo()
    assert len(_lines(out)) >= 4  # the first batch is kept (the second was written, its fsync failed)


def test_outputs_that_are_inputs_are_refused(corpus: Path, session: fun_asr.Session, tmp_path: Path) -> None:
    """fun-asr-batch: nothing the job writes under -o (shards, summary.json, eval.tsv) may
    be one of its inputs (a manifest, the references, an audio file), by path, symlink or hard link;
    refused before the model loads, nothing changed."""
    files = sorted(_good_files(corpus).values())[:3]
    out = tmp_path / "out"
    manifest = tmp_path / "m.jsonl"
    manifest.write_text("".join(json.dumps({"id": f.stem, "audio": str(f), "text": "a b"}) + "\n" for f in files))
    batch.run([manifest], out, session=session, max_new_tokens=TOKENS)
    shard, summary = out / "shard-00000.jsonl", out / "summary.json"
    before = {p: p.read_bytes() for p in (shard, summary, out / "eval.tsv")}
    (tmp_path / "link.jsonl").symlink_to(shard)
    os.link(shard, tmp_path / "hard.jsonl")
    cases = [([shard], {}), ([tmp_path / "link.jsonl"], {}), ([tmp_path / "hard.jsonl"], {}),
             ([manifest], {"reference": out / "eval.tsv"}), ([str(out / "*")], {"input_format": "glob"})]
    for inputs, kw in cases:
        with pytest.raises(batch.BatchError, match=r"is the input .*fun-asr-batch writes that file"):
            batch.run(inputs, out, session=session, max_new_tokens=TOKENS, retry_failed=True, **kw)
    assert {p: p.read_bytes() for p in before} == before
    r = _cli(str(shard), "-o", str(out), "-m", str(tmp_path / "no-model.gguf"), "--retry-failed")
    assert r.returncode == 2 and r.stderr.count("\n") == 1 and "is the input" in r.stderr, r.stderr
    assert {p: p.read_bytes() for p in before} == before


def test_sigterm_writes_the_batch_in_flight_and_resumes(corpus: Path, model: Path, expected: dict,
                                                        tmp_path: Path) -> None:
    """SIGTERM (a scheduler, `kill`) is handled like Ctrl-C: the batch in flight is written,
    summary.json says interrupted, the message says how to resume, exit code 143."""
    out = tmp_path / "out"
    args = [str(corpus), "-o", str(out), "-m", str(model), "--device", "cpu", "--vad", "none",
            "--max-new-tokens", str(TOKENS), "--batch-size", "2", "--quiet"]
    proc = subprocess.Popen([sys.executable, "-m", "fun_asr.cli.batch", *args], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and proc.poll() is None:
        shards = list(out.glob("shard-*.jsonl"))
        if shards and shards[0].read_bytes().count(b"\n") >= 1:
            break
        time.sleep(0.005)
    assert proc.poll() is None, f"the job ended before the signal: {proc.communicate()}"
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 143, err
    assert "stopping after the batch in flight" in err and "rerun the same command to resume" in err
    assert "Traceback" not in err
    summary = json.loads((out / "summary.json").read_text())
    recs = _lines(out)
    assert summary["last_run"]["interrupted"] is True and summary["last_run"]["processed"] == len(recs)
    assert 2 <= len(recs) < 24 and len(recs) % 2 == 0  # whole batches only
    r = _cli(*args)
    assert r.returncode == 1, r.stderr
    _check(out, expected)


def test_progress_lines_when_stderr_is_not_a_terminal(corpus: Path, model: Path, tmp_path: Path) -> None:
    """Off a terminal, one line every FUN_ASR_PROGRESS_INTERVAL seconds (10 by default):
    done/total, audio hours, speed, ETA; --quiet prints nothing."""
    import re

    args = [str(corpus), "-m", str(model), "--device", "cpu", "--vad", "none", "--max-new-tokens", str(TOKENS),
            "--batch-size", "2"]
    env = {**os.environ, "FUN_ASR_PROGRESS_INTERVAL": "0.05"}
    r = _cli(*args, "-o", str(tmp_path / "a"), env=env)
    assert r.returncode == 1, r.stderr
    assert "fun-asr-batch: 24 to transcribe" in r.stderr
    lines = re.findall(r"fun-asr-batch: (\d+)/24 recordings \(\d+%\)(?:, \d+ failed)?, \d+\.\d{3} h of audio, "
                       r"(?:\d+\.\d+x real time, ETA \d+:\d\d:\d\d|speed n/a, ETA n/a.*)$", r.stderr, re.M)
    assert lines and [int(x) for x in lines] == sorted(int(x) for x in lines), r.stderr
    assert "\r" not in r.stderr and "it/s" not in r.stderr  # no tqdm bar in a log
    r = _cli(*args, "-o", str(tmp_path / "b"), "--quiet", env=env)
    assert r.returncode == 1 and r.stderr == "", r.stderr


# --- inputs ------------------------------------------------------------------------------------

def test_manifests_with_per_item_options(corpus: Path, session: fun_asr.Session, tmp_path: Path) -> None:
    files = sorted(_good_files(corpus).values())[:6]
    per_item = [{"language": "en"}, {"hotwords": ["FunASR", "ggml"]}, {}, {"language": "zh"}, {"language": "en"},
                {"hotwords": "Ray"}]
    rows = []
    for i, (path, extra) in enumerate(zip(files, per_item, strict=True)):
        rows.append({"id": f"item{i}", "audio": os.path.relpath(path, tmp_path), "text": f"reference {i}", **extra})
    rows.append({"id": "bad-language", "audio": str(files[0]), "language": "kling\non"})
    manifest = tmp_path / "manifest.jsonl"
    manifest.write_text("".join(json.dumps(r) + "\n" for r in rows))
    calls: list[tuple] = []
    real = session.transcribe_batch

    def spy(audios: list, **kw: object) -> list:
        calls.append((len(audios), kw["language"], tuple(kw["hotwords"])))
        return real(audios, **kw)

    session.transcribe_batch = spy  # type: ignore[method-assign]
    try:
        summary = batch.run([manifest], tmp_path / "out", session=session, max_new_tokens=TOKENS, batch_size=8,
                            language="ja", hotwords="base")
    finally:
        del session.transcribe_batch
    # one call per option set, never mixed: en x2, zh, (ja, base) default, and two hotword sets
    assert sorted(calls, key=str) == sorted([(2, "en", ("base",)), (1, "zh", ("base",)), (1, "ja", ("base",)),
                                            (1, "ja", ("FunASR", "ggml")), (1, "ja", ("Ray",))], key=str)
    recs = {r["id"]: r for r in _lines(tmp_path / "out")}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for i, (path, extra) in enumerate(zip(files, per_item, strict=True)):
            want = session.transcribe(path, max_new_tokens=TOKENS, language=extra.get("language", "ja"),
                                      hotwords=extra.get("hotwords", "base"))
            rec = recs[f"item{i}"]
            assert rec["text"] == want.text and [s["tokens"] for s in rec["segments"]] == [s.tokens for s in
                                                                                           want.segments]
            assert rec["options"]["language"] == extra.get("language", "ja")
            assert rec["reference"] == f"reference {i}" and rec["wer"] is not None and "cer" in rec
    assert "language 'kling\\non' contains the control character" in recs["bad-language"]["error"]
    assert summary["failed"] == 1 and summary["evaluation"]["items"] == 6
    table = (tmp_path / "out" / "eval.tsv").read_text().splitlines()
    assert table[0].startswith("id\twer\tcer") and len(table) == 7


def test_truncated_input_and_a_failing_batch(corpus: Path, session: fun_asr.Session, tmp_path: Path,
                                             monkeypatch: pytest.MonkeyPatch) -> None:
    """What the reader found (a truncated file) reaches the record as with Session.transcribe; a batch
    that fails as a whole is retried one recording at a time, and only the bad one is recorded failed."""
    files = sorted(_good_files(corpus).values())[:3]
    data = (corpus / "utt00.wav").read_bytes()
    cut = tmp_path / "in" / "cut.wav"
    cut.parent.mkdir()
    cut.write_bytes(data[: len(data) * 2 // 3])  # the header promises more than the file holds
    for f in files:
        shutil.copy(f, cut.parent / f.name)
    real = session.transcribe_batch

    def flaky(audios: list, **kw: object) -> list:
        if len(audios) > 1 or kw["names"] == [str(cut.parent / files[1].name)]:
            raise RuntimeError("simulated failure")
        return real(audios, **kw)

    monkeypatch.setattr(session, "transcribe_batch", flaky)
    summary = batch.run([cut.parent], tmp_path / "out", session=session, max_new_tokens=TOKENS)
    monkeypatch.undo()
    recs = batch.read_results(tmp_path / "out")
    assert summary["failed"] == 1 and recs[files[1].stem]["error"].endswith("simulated failure")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        want = session.transcribe(cut, max_new_tokens=TOKENS)
    rec = recs["cut"]
    assert rec["input_truncated"] and want.input_truncated
    assert rec["warnings"] == want.warnings and "file is truncated" in rec["warnings"][0]
    assert rec["text"] == want.text and [s["tokens"] for s in rec["segments"]] == [s.tokens for s in want.segments]
    assert recs[files[0].stem]["error"] is None and recs[files[2].stem]["error"] is None


def test_input_formats(corpus: Path, session: fun_asr.Session, expected: dict, tmp_path: Path) -> None:
    files = _good_files(corpus)
    keys = sorted(files)[:4]

    by_name = {p.name: k for k, p in files.items()}

    def run(*inputs: str | Path, name: str, **kw: object) -> dict[str, dict]:
        out = tmp_path / name
        batch.run(list(inputs), out, session=session, max_new_tokens=TOKENS, **kw)
        recs = batch.read_results(out)
        for rec in recs.values():  # every transcribed file as Session.transcribe gives it
            key = by_name.get(rec["audio"].rsplit("/", 1)[-1])
            if rec["error"] is None and key is not None and rec["options"]["language"] is None:
                assert rec["text"] == expected[key][0] and [s["tokens"] for s in rec["segments"]] == expected[key][1]
        return recs

    # a Kaldi wav.scp (+ the text beside it), with a piped entry
    kaldi = tmp_path / "kaldi"
    kaldi.mkdir()
    kid = [f"spk1-{k.replace('/', '-')}" for k in keys]
    (kaldi / "wav.scp").write_text("".join(f"{i} {files[k]}\n" for i, k in zip(kid, keys, strict=True))
                                   + "spk1-pipe sox a.wav -t wav - |\n")
    (kaldi / "text").write_text(f"{kid[0]} 你好，世界！\n{kid[1]} Hello World\n")
    recs = run(kaldi / "wav.scp", name="scp")
    assert len(recs) == 5 and "piped wav.scp entries" in recs["spk1-pipe"]["error"]
    assert recs[kid[0]]["reference"] == "你好，世界！" and "reference" not in recs[kid[2]]
    summary = json.loads((tmp_path / "scp" / "summary.json").read_text())
    assert summary["evaluation"]["items"] == 2 and summary["evaluation"]["ref_words"] == 4 + 2
    # a CSV manifest, ids from the file names where the id column is empty; a --reference file
    csv = tmp_path / "m.csv"
    csv.write_text("id,audio,language\n" + f"a,{files[keys[0]]},en\n" + f",{files[keys[1]]},\n")
    ref = tmp_path / "ref.txt"
    ref.write_text("a hello\n")
    recs = run(csv, name="csv", reference=ref)
    assert set(recs) == {"a", Path(keys[1]).name} and recs["a"]["reference"] == "hello"
    # a list of paths (relative to the list's folder) and a glob
    lst = corpus / "list.txt"
    lst.write_text("# two files\n" + "".join(f"{files[k].relative_to(corpus)}\n" for k in keys[:2]))
    try:
        recs = run(lst, str(corpus / "sub" / "*.ogg"), name="list")
    finally:
        lst.unlink()
    assert set(recs) == {Path(k).name for k in keys[:2]} | {p.stem for p in (corpus / "sub").glob("*.ogg")}
    # an fsspec URL: file:// and memory:// folders (read through fsspec)
    import fsspec

    mem = fsspec.filesystem("memory")
    for k in keys:
        mem.pipe(f"/fun-asr-test/{k}{files[k].suffix}", files[k].read_bytes())
    recs = run(f"file://{corpus / 'sub'}", "memory://fun-asr-test", name="urls", input_format="auto")
    assert {r["audio"].split("://")[0] for r in recs.values()} == {"file", "memory"}
    assert all(r["error"] is None for r in recs.values())
    # duplicate ids are refused before any work; so is a busy output folder
    with pytest.raises(batch.BatchError, match="appears twice"):
        batch.collect_items([files[keys[0]], files[keys[0]]])
    with pytest.raises(batch.BatchError, match="no such file"):
        batch.collect_items([tmp_path / "missing.jsonl"])


def test_cli_usage_errors(tmp_path: Path) -> None:
    r = _cli(str(tmp_path), "-o", str(tmp_path / "o"), "--actors", "2")
    assert r.returncode == 2 and "--actors and --threads-per-actor are for the Ray engine" in r.stderr
    r = _cli(str(tmp_path), "-o", str(tmp_path / "o"), "--language", "x\x01x")
    assert r.returncode == 2 and "--language" in r.stderr and "control character" in r.stderr
    r = _cli(str(tmp_path / "nothing.jsonl"), "-o", str(tmp_path / "o"), "-m", "x")
    assert r.returncode == 2 and "no such file" in r.stderr
    # an audio file given on the command line that is not there: before the model loads
    r = _cli(str(tmp_path / "nope.wav"), "-o", str(tmp_path / "o"), "-m", str(tmp_path / "no-model.gguf"))
    assert r.returncode == 2 and r.stderr.count("\n") == 1 and f"{tmp_path / 'nope.wav'}: no such file" in r.stderr


def test_cli_limit_messages_name_flags(corpus: Path, model: Path, tmp_path: Path) -> None:
    r = _cli(str(corpus), "-o", str(tmp_path / "o"), "-m", str(model), "--device", "cpu", "--vad", "none",
             "--hotwords", ",".join(f"w{i}" for i in range(201)))
    assert r.returncode == 2 and "error: --hotwords: 201 hotwords; at most 200 are accepted" in r.stderr, r.stderr
    assert "Limits" not in r.stderr and "Session(" not in r.stderr


# --- Ray engine --------------------------------------------------------------------------------

def _short_tmp() -> str:
    return tempfile.mkdtemp(prefix="fa-ray-", dir="/tmp")  # Ray's socket paths must stay short


def _ray_env() -> dict[str, str]:
    """Keeps a test cluster on the loopback interface (Ray otherwise swaps 127.0.0.1 for the machine's
    address: RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0 is its own switch for single-machine use) and gives
    it a token of its own (Ray's token authentication; nothing read from or written to ~/.ray)."""
    return {"RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0", "RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN": secrets.token_hex(32),
            "RAY_USAGE_STATS_ENABLED": "0"}


def test_ray_in_process(corpus: Path, model: Path, expected: dict, tmp_path: Path,
                        monkeypatch: pytest.MonkeyPatch) -> None:
    for k, v in _ray_env().items():
        monkeypatch.setenv(k, v)
    ray = pytest.importorskip("ray")
    from ray._private import ray_constants

    monkeypatch.setattr(ray_constants, "ENABLE_RAY_CLUSTER", False)  # read when Ray was imported: set it here too
    temp = _short_tmp()
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, _temp_dir=temp, _node_ip_address="127.0.0.1")
    assert ray.util.get_node_ip_address() == "127.0.0.1"
    try:
        out = tmp_path / "ray"
        summary = batch.run([corpus], out, model=model, device="cpu", vad=None, max_new_tokens=TOKENS, batch_size=4,
                            ray=True, actors=1, threads_per_actor=1)
        _check(out, expected)
        assert summary["last_run"]["engine"] == "ray" and summary["last_run"]["actors"] == 1
        # resume on Ray from a folder half written by the local engine: same format, each id once
        half = tmp_path / "half"
        half.mkdir()
        lines = (out / "shard-00000.jsonl").read_text().splitlines(keepends=True)
        (half / "shard-00000.jsonl").write_text("".join(lines[:10]))
        summary = batch.run([corpus], half, model=model, device="cpu", vad=None, max_new_tokens=TOKENS, batch_size=4,
                            ray=True, actors=1, threads_per_actor=1)
        assert summary["last_run"]["skipped"] == 10 and summary["last_run"]["processed"] == 14
        _check(half, expected)
    finally:
        ray.shutdown()
        shutil.rmtree(temp, ignore_errors=True)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _descendants(pid: int) -> list[int]:
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                ppid = int(Path(f"/proc/{entry}/stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            children.setdefault(ppid, []).append(int(entry))
    out, todo = [], [pid]
    while todo:
        for c in children.get(todo.pop(), []):
            out.append(c)
            todo.append(c)
    return out


def test_ray_cluster_by_address(corpus: Path, model: Path, expected: dict, tmp_path: Path) -> None:
    pytest.importorskip("ray")
    port = _free_port()
    temp = _short_tmp()
    ray_bin = str(Path(sys.executable).with_name("ray"))
    env = {**os.environ, **_ray_env()}
    head = subprocess.Popen([ray_bin, "start", "--head", "--block", "--node-ip-address", "127.0.0.1",
                             "--port", str(port), "--num-cpus", "2", "--include-dashboard", "false",
                             "--temp-dir", temp, "--disable-usage-stats"],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True, env=env)
    try:
        deadline = time.monotonic() + 90
        while time.monotonic() < deadline:  # the GCS answers on its port
            assert head.poll() is None, head.communicate()[0].decode(errors="replace")
            with socket.socket() as s:
                if s.connect_ex(("127.0.0.1", port)) == 0:
                    break
            time.sleep(0.2)
        out = tmp_path / "cluster"
        r = _cli(str(corpus), "-o", str(out), "-m", str(model), "--device", "cpu", "--vad", "none",
                 "--max-new-tokens", str(TOKENS), "--batch-size", "4", "--ray", f"127.0.0.1:{port}",
                 "--actors", "1", "--threads-per-actor", "1", env=env)
        assert r.returncode == 1, r.stderr
        assert "Connecting to existing Ray cluster at address: 127.0.0.1:" in r.stderr
        _check(out, expected)
        summary = json.loads((out / "summary.json").read_text())
        assert summary["last_run"]["engine"] == "ray" and summary["last_run"]["address"] == f"127.0.0.1:{port}"
        assert summary["last_run"]["nodes"] == 1
    finally:
        procs = [head.pid, *_descendants(head.pid)]
        try:
            os.killpg(head.pid, signal.SIGTERM)  # the group this test started: `ray start --block` and its daemons
        except ProcessLookupError:
            pass
        try:
            head.wait(30)
        except subprocess.TimeoutExpired:
            os.killpg(head.pid, signal.SIGKILL)
            head.wait(10)
        for pid in procs:  # anything of ours that left the group
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        shutil.rmtree(temp, ignore_errors=True)
