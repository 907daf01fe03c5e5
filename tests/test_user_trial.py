"""A new user's trial. Never destroy a file, never return a silently wrong result, errors
people can read, and the pieces users expect (stdin, JSONL, progress). CLI behaviour is tested
through subprocesses, as a user runs it."""

from __future__ import annotations

import hashlib
import io
import json
import os
import signal
import socket
import stat
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import soundfile as sf

import fun_asr
from fun_asr.asr.formats import render
from fun_asr.audio.decode import AudioError, decode_audio, load_audio
from fun_asr.cli.transcribe import output_names
from fun_asr.converter.output import OutputError

# Short max_new_tokens keep these tests fast: those warnings are expected here.
pytestmark = pytest.mark.filterwarnings("ignore::fun_asr.notices.TruncatedOutputWarning")

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"
CLIP = EXAMPLES / "en_hello.wav"
CLI_TOKENS = ["--device", "cpu", "--max-new-tokens", "4", "--quiet"]


def _run(*args: str, module: str = "fun_asr.cli.transcribe", stdin: bytes | None = None, env: dict | None = None,
         timeout: float = 300) -> subprocess.CompletedProcess:
    r = subprocess.run([sys.executable, "-m", module, *args], capture_output=True, input=stdin, timeout=timeout,
                       env={**os.environ, **(env or {})})
    r.stdout_text = r.stdout.decode("utf-8")  # type: ignore[attr-defined]
    r.stderr_text = r.stderr.decode("utf-8")  # type: ignore[attr-defined]
    return r


def _sha(p: Path) -> str:
    return hashlib.sha256(p.read_bytes()).hexdigest()


@pytest.fixture(scope="module")
def session(tiny_gguf) -> fun_asr.Session:  # noqa: ANN001
    return fun_asr.Session(tiny_gguf("f32"), device="cpu")


@pytest.fixture(scope="module")
def model_path(tiny_gguf) -> str:  # noqa: ANN001
    return str(tiny_gguf("f32"))


# --- 1. convert never destroys a file ---------------------------------------------------------------

def test_convert_refuses_to_overwrite_its_input(tiny_f32: Path, tmp_path: Path) -> None:
    src = tmp_path / "ckpt"
    import shutil

    shutil.copytree(tiny_f32, src)
    weights = src / "model.safetensors"
    before = _sha(weights)
    r = _run(str(src), "-o", str(weights), "--type", "f16", "--quiet", module="fun_asr.cli.convert")
    assert r.returncode == 2 and "inside the checkpoint folder" in r.stderr_text, r.stderr_text
    r = _run(str(src), "-o", str(weights), "--force", "--quiet", module="fun_asr.cli.convert")
    assert r.returncode == 2 and "inside the checkpoint folder" in r.stderr_text
    assert _sha(weights) == before
    # a GGUF anywhere inside the folder being read
    with pytest.raises(OutputError, match="inside the checkpoint folder"):
        fun_asr.convert(src, src / "sub" / "model.gguf", "f16", progress=False)
    # the same file by inode, elsewhere (a hard link)
    link = tmp_path / "elsewhere.safetensors"
    os.link(weights, link)
    with pytest.raises(OutputError, match="same file as the input"):
        fun_asr.convert(src, link, "f16", progress=False, overwrite=True)
    assert _sha(weights) == before and not list(tmp_path.glob(".*partial"))


def test_convert_refuses_non_regular_and_existing_files(tiny_f32: Path, tmp_path: Path) -> None:
    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    for force in ([], ["--force"]):
        r = _run(str(tiny_f32), "-o", str(fifo), *force, "--quiet", module="fun_asr.cli.convert")
        assert r.returncode == 2 and "not a regular file" in r.stderr_text, r.stderr_text
        assert stat.S_ISFIFO(os.stat(fifo).st_mode)
    existing = tmp_path / "model.gguf"
    existing.write_bytes(b"keep me")
    r = _run(str(tiny_f32), "-o", str(existing), "--quiet", module="fun_asr.cli.convert")
    assert r.returncode == 2 and "already exists; pass --force" in r.stderr_text
    assert existing.read_bytes() == b"keep me"
    with pytest.raises(OutputError, match="already exists"):
        fun_asr.convert(tiny_f32, existing, "f16", progress=False)
    r = _run(str(tiny_f32), "-o", str(existing), "--force", "--type", "f16", "--quiet", module="fun_asr.cli.convert")
    assert r.returncode == 0, r.stderr_text
    assert existing.read_bytes()[:4] == b"GGUF"


def test_convert_output_gets_umask_permissions(tiny_f32: Path, tmp_path: Path) -> None:
    out = tmp_path / "perm.gguf"
    code = ("import os, sys; os.umask(0o027); from fun_asr.cli.convert import main; "
            f"sys.exit(main([{str(tiny_f32)!r}, '-o', {str(out)!r}, '--type', 'f16', '--quiet']))")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    assert stat.S_IMODE(out.stat().st_mode) == 0o640


# --- 2. transcribe -o never overwrites its own outputs ------------------------------------------------

def test_output_names_are_unique_and_predictable() -> None:
    assert output_names(["a/x.wav", "b/y.wav"]) == ["x", "y"]
    assert output_names(["x.wav", "x.flac"]) == ["x.wav", "x.flac"]
    names = output_names(["a/x.wav", "b/x.wav", "x.flac"])
    assert names[2] == "x.flac" and names[0].endswith("a__x.wav") and names[1].endswith("b__x.wav")
    assert output_names(["x.wav", "X.WAV"]) != ["x", "X"]  # case-insensitive disks
    twice = output_names(["x.wav", "x.wav"])
    assert len(set(twice)) == 2 and twice[1].endswith("-2")
    assert output_names(["-", "stdin.wav"])[0] != output_names(["-", "stdin.wav"])[1]


def test_cli_collisions_write_every_output(model_path: str, tmp_path: Path) -> None:
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    data, rate = sf.read(CLIP)
    inputs = [tmp_path / "a" / "x.wav", tmp_path / "b" / "x.wav", tmp_path / "x.flac"]
    for i, p in enumerate(inputs):
        sf.write(p, data[: len(data) - 1600 * i], rate)
    out = tmp_path / "out"
    r = _run(*map(str, inputs), "-m", model_path, "--device", "cpu", "--max-new-tokens", "4", "-f", "json",
             "-o", str(out))
    assert r.returncode == 0, r.stderr_text
    written = sorted(p.name for p in out.iterdir())
    assert len(written) == 3, written
    got = {json.loads((out / n).read_text())["input"] for n in written}
    assert got == {str(p) for p in inputs}
    for p in inputs:  # says what was written where
        assert f"{p} -> {out}" in r.stderr_text


@pytest.mark.parametrize("fmt", ["txt", "json", "srt", "vtt", "all"])
def test_an_output_that_is_an_input_is_refused_before_anything(fmt: str, model_path: str, tmp_path: Path) -> None:
    """`cp clip.wav same/clip.txt; fun-asr-transcribe same/clip.txt -o same` replaced the audio
    with its transcript. Every output that is an input (same path, a symlink, a hard link) is refused
    with exit 2 and one line, before the model loads, and nothing is written."""
    same = tmp_path / "same"
    same.mkdir()
    ext = "vtt" if fmt == "all" else fmt
    victim = same / f"clip.{ext}"
    victim.write_bytes(CLIP.read_bytes())
    before = _sha(victim)
    r = _run(str(victim), "-m", model_path, *CLI_TOKENS, "-f", fmt, "-o", str(same))
    assert r.returncode == 2 and r.stderr_text.count("\n") == 1, r.stderr_text
    assert f"would overwrite the input {victim}" in r.stderr_text and "choose another -o" in r.stderr_text
    assert _sha(victim) == before and sorted(p.name for p in same.iterdir()) == [victim.name]
    # the same file by other names: the input through a symlink, the output a symlink to it, a hard link
    missing_model = str(tmp_path / "no-model.gguf")  # refused before the model loads: it would fail otherwise
    (tmp_path / "clip.wav").symlink_to(victim)
    for d in ("by-symlink", "by-hard-link"):
        (tmp_path / d).mkdir()
    (tmp_path / "by-symlink" / victim.name).symlink_to(victim)
    os.link(victim, tmp_path / "by-hard-link" / victim.name)
    for src, out in ((tmp_path / "clip.wav", same), (victim, tmp_path / "by-symlink"),
                     (victim, tmp_path / "by-hard-link")):
        r = _run(str(src), "-m", missing_model, "-f", fmt, "-o", str(out))
        assert r.returncode == 2 and r.stderr_text.count("\n") == 1, (src, out, r.stderr_text)
        assert f"would overwrite the input {src}" in r.stderr_text and "cannot load model" not in r.stderr_text
    assert _sha(victim) == before


def test_an_input_of_a_later_batch_is_not_overwritten(model_path: str, tmp_path: Path) -> None:
    """The CLI works in groups of --batch-size; an output of the first group must not
    destroy an input of the next one (here through a symlink and a hard link in the -o folder)."""
    first, later, third = tmp_path / "talk.wav", tmp_path / "later.wav", tmp_path / "third.wav"
    for p in (first, later, third):
        p.write_bytes(CLIP.read_bytes())
    out = tmp_path / "out"
    out.mkdir()
    (out / "talk.txt").symlink_to(later)
    r = _run(str(first), str(later), "-m", model_path, *CLI_TOKENS, "--batch-size", "1", "-o", str(out))
    assert r.returncode == 2 and f"would overwrite the input {later}" in r.stderr_text, r.stderr_text
    assert later.read_bytes() == CLIP.read_bytes()
    (out / "talk.txt").unlink()
    os.link(third, out / "talk.json")
    r = _run(str(first), str(later), str(third), "-m", model_path, *CLI_TOKENS, "--batch-size", "1", "-f", "json",
             "-o", str(out))
    assert r.returncode == 2 and f"would overwrite the input {third} (the same file" in r.stderr_text, r.stderr_text
    assert third.read_bytes() == CLIP.read_bytes() and sorted(p.name for p in out.iterdir()) == ["talk.json"]


def test_the_same_input_twice_gets_a_numbered_name(model_path: str, tmp_path: Path) -> None:
    """`x.wav x.wav -o out` gives x.txt and x-2.txt (was a flattened absolute path)."""
    assert output_names(["x.wav", "x.wav"]) == ["x", "x-2"]
    assert output_names(["x.wav", "./x.wav", "x.flac"]) == ["x.wav", "x.wav-2", "x.flac"]
    assert output_names(["x.wav", "x.wav", "x-2.wav"]) == ["x", "x-3", "x-2"]
    clip = tmp_path / "x.wav"
    clip.write_bytes(CLIP.read_bytes())
    out = tmp_path / "out"
    r = _run(str(clip), str(clip), "-m", model_path, *CLI_TOKENS, "-o", str(out))
    assert r.returncode == 0, r.stderr_text
    assert sorted(p.name for p in out.iterdir()) == ["x-2.txt", "x.txt"]


# --- 3.-6. silently wrong results ---------------------------------------------------------------------

def test_channels_first_arrays(session: fun_asr.Session) -> None:
    data, rate = sf.read(CLIP, dtype="float32")
    stereo = np.stack([data, 0.5 * data], axis=1)  # (n, 2)
    a, info_a = decode_audio(stereo, rate)
    b, info_b = decode_audio(np.ascontiguousarray(stereo.T), rate)  # (2, n): librosa / torchaudio order
    np.testing.assert_array_equal(a, b)
    assert info_a.channels == info_b.channels == 2
    r1 = session.transcribe(stereo, sample_rate=rate, max_new_tokens=3)
    r2 = session.transcribe(stereo.T, sample_rate=rate, max_new_tokens=3)
    assert r1.segments[0].tokens == r2.segments[0].tokens and abs(r2.duration - len(data) / rate) < 1e-3
    for shape in [(4, 4), (40, 40), (2, 2, 100)]:
        with pytest.raises(AudioError, match="ambiguous|must be"):
            decode_audio(np.zeros(shape, np.float32), 16000)


def _truncated_wav(path: Path, seconds: float = 45.0, keep: int = 30_000) -> Path:
    x = (0.1 * np.random.default_rng(0).standard_normal(int(16000 * seconds))).astype(np.float32)
    buf = io.BytesIO()
    sf.write(buf, x, 16000, format="WAV", subtype="PCM_16")
    path.write_bytes(buf.getvalue()[:keep])
    return path


def test_truncated_wav_is_reported(session: fun_asr.Session, model_path: str, tmp_path: Path) -> None:
    bad = _truncated_wav(tmp_path / "cut.wav")
    with pytest.warns(fun_asr.InputWarning, match=r"truncated: only 0.94 s of the 45.00 s"):
        load_audio(bad)
    with pytest.warns(fun_asr.InputWarning, match="truncated"):
        result = session.transcribe(bad, max_new_tokens=3)
    assert result.input_truncated and any("truncated" in w for w in result.warnings)
    assert result.to_dict()["input_truncated"] is True
    r = _run(str(bad), "-m", model_path, "--device", "cpu", "--max-new-tokens", "3", "-f", "json")
    assert r.returncode == 0, r.stderr_text
    assert "warning:" in r.stderr_text and "truncated" in r.stderr_text
    assert json.loads(r.stdout_text)["input_truncated"] is True
    # a whole file is not reported; a truncated FLAC (decoder loses sync) is
    whole = tmp_path / "whole.wav"
    sf.write(whole, np.zeros(16000, np.float32), 16000)
    assert not decode_audio(whole)[1].truncated
    flac = tmp_path / "cut.flac"
    buf = io.BytesIO()
    sf.write(buf, (0.1 * np.random.default_rng(1).standard_normal(16000 * 20)).astype(np.float32), 16000,
             format="FLAC")
    flac.write_bytes(buf.getvalue()[: len(buf.getvalue()) // 3])
    samples, info = decode_audio(flac)
    assert info.truncated and 0 < len(samples) < 16000 * 20 and "20.00 s its header promises" in info.warnings[0]


def test_too_short_audio_is_marked_and_writes_no_empty_cue(session: fun_asr.Session, model_path: str,
                                                           tmp_path: Path) -> None:
    tiny = np.full(160, 0.1, np.float32)  # 10 ms
    with pytest.warns(fun_asr.InputWarning, match="shorter than one 25 ms analysis frame"):
        r = session.transcribe(tiny, sample_rate=16000)
    assert r.text == "" and r.segments == [] and r.empty_reason == "too_short" and r.warnings
    assert render(r, "srt") == "" and render(r, "vtt") == "WEBVTT\n"
    clip = tmp_path / "tick.wav"
    sf.write(clip, tiny, 16000)
    cli = _run(str(clip), "-m", model_path, "--device", "cpu", "-f", "srt")
    assert cli.returncode == 0 and cli.stdout_text == "" and "shorter than one" in cli.stderr_text
    # a segment without text is never a cue
    from fun_asr.asr.session import Segment, Transcription

    t = Transcription("hi", [Segment(0, 1, "", [], "eos", False, False), Segment(1, 2, "hi", [1], "eos", False, False)],
                      None, 2.0, {})
    assert render(t, "srt") == "1\n00:00:01,000 --> 00:00:02,000\nhi\n"


def test_batch_keeps_good_items_when_one_fails(session: fun_asr.Session, tmp_path: Path) -> None:
    bad = tmp_path / "bad.wav"
    bad.write_text("not audio")
    good = [CLIP, EXAMPLES / "zh_weather.wav"]
    one_by_one = [session.transcribe(g, max_new_tokens=5) for g in good]
    with pytest.warns(fun_asr.RecordingFailedWarning) as caught:
        results = session.transcribe_batch([good[0], bad, tmp_path / "missing.wav", good[1]], max_new_tokens=5)
    failed = [str(w.message) for w in caught if w.category is fun_asr.RecordingFailedWarning]
    assert len(failed) == 2 and "bad.wav: cannot decode audio" in failed[0]
    assert [r.ok for r in results] == [True, False, False, True]
    assert results[1].error.startswith(str(bad)) and "no such audio file" in results[2].error
    assert results[1].empty_reason == "error" and results[1].to_dict()["error"] == results[1].error
    assert [r.segments[0].tokens for r in (results[0], results[3])] == [r.segments[0].tokens for r in one_by_one]
    with pytest.raises(AudioError):  # transcribe() of one recording still raises
        session.transcribe(bad)


# --- 7.-9. errors people can read ---------------------------------------------------------------------

def test_output_dir_problems_are_reported_before_any_work(tmp_path: Path) -> None:
    missing_model = str(tmp_path / "no-model.gguf")  # proves nothing was loaded: that would fail differently
    afile = tmp_path / "afile"
    afile.write_text("x")
    r = _run(str(CLIP), "-m", missing_model, "-o", str(afile))
    assert r.returncode == 2 and r.stderr_text.count("\n") == 1
    assert "is an existing file; -o takes a directory" in r.stderr_text
    r = _run(str(CLIP), "-m", missing_model, "-o", "/proc/fun-asr/out")
    assert r.returncode == 2 and "cannot create the directory" in r.stderr_text and "Traceback" not in r.stderr_text
    if os.geteuid() != 0:
        ro = tmp_path / "ro"
        ro.mkdir()
        ro.chmod(0o555)
    else:  # root writes through permissions: use a read-only file system
        ro = Path("/sys/kernel")  # sysfs: no new files, whoever asks
        if not ro.is_dir():
            pytest.skip("no read-only directory to test with")
    r = _run(str(CLIP), "-m", missing_model, "-o", str(ro))
    assert r.returncode == 2 and "cannot write there" in r.stderr_text and r.stderr_text.count("\n") == 1


@pytest.mark.parametrize("args,message", [
    (["--language", "f\x01r"], "contains the control character U+0001"),
    (["--max-new-tokens", "0"], "--max-new-tokens must be 1 or more, got 0"),
    (["--segment-seconds", "0.5"], "--segment-seconds must be at least 1, got 0.5"),
    (["--batch-size", "0"], "--batch-size must be 1 or more, got 0"),
    (["-f", "srt"], "-f srt with 2 inputs needs -o DIR"),
])
def test_option_errors_once_before_the_model_loads(args: list[str], message: str, tmp_path: Path) -> None:
    r = _run(str(CLIP), str(EXAMPLES / "ja_hello.wav"), "-m", str(tmp_path / "no-model.gguf"), *args)
    assert r.returncode == 2, r.stderr_text
    assert r.stderr_text.count("error:") == 1 and message in r.stderr_text, r.stderr_text
    assert "None" not in r.stderr_text and "cannot load model" not in r.stderr_text


def test_segment_seconds_over_the_model_limit_is_reported_once(model_path: str) -> None:
    r = _run(str(CLIP), str(EXAMPLES / "ja_hello.wav"), "-m", model_path, "--device", "cpu", "--segment-seconds",
             "100000")
    assert r.returncode == 2 and r.stderr_text.count("error:") == 1 and "--segment-seconds must be" in r.stderr_text


def test_cli_messages_in_cli_words(model_path: str, tmp_path: Path) -> None:
    # a wrong input name is a usage error: reported before the model loads (exit 2), nothing transcribed
    missing = tmp_path / "nope.wav"
    r = _run(str(CLIP), str(missing), str(tmp_path), "-m", str(tmp_path / "no-model.gguf"), *CLI_TOKENS)
    assert r.returncode == 2 and r.stdout_text == "", r.stderr_text
    assert r.stderr_text.count(str(missing)) == 1  # the file name once, on its error line
    assert f"error: {missing}: no such audio file" in r.stderr_text
    assert f"error: {tmp_path}: is a directory" in r.stderr_text
    assert r.stderr_text.count("\n") == 2 and "cannot load model" not in r.stderr_text
    # limits in the command's words, not Session(limits=Limits(...)) fields
    r = _run(str(CLIP), "-m", model_path, *CLI_TOKENS, "--hotwords", ",".join(f"w{i}" for i in range(201)))
    assert r.returncode == 2 and "error: --hotwords: 201 hotwords; at most 200 are accepted" in r.stderr_text
    assert "Limits" not in r.stderr_text and "Session(" not in r.stderr_text, r.stderr_text
    r = _run(str(CLIP), "-m", model_path, "--device", "cpu", "--max-new-tokens", "1")
    assert "hit --max-new-tokens=1" in r.stderr_text and "(raise --max-new-tokens)" in r.stderr_text, r.stderr_text
    r = _run(str(CLIP), "-m", model_path, "--device", "cuda:7", "--quiet")
    assert r.returncode == 2 and "device=" not in r.stderr_text and "Traceback" not in r.stderr_text
    bad = tmp_path / "bad.gguf"
    bad.write_bytes(b"NOPE" * 100)
    r = _run(str(CLIP), "-m", str(bad), "--quiet")
    assert r.returncode == 2 and "not a valid GGUF" in r.stderr_text
    assert r.stderr_text.count("\n") == 1  # one line: ggml's own log lines do not leak


def test_limit_messages_are_translated_at_the_cli_boundary(session: fun_asr.Session) -> None:
    """The messages of audio/decode.py and the session's options name Limits fields for the Python API; each
    command names its flag instead (fun-asr-serve --max-audio-seconds), or nothing when it has none."""
    from fun_asr.audio.decode import Limits
    from fun_asr.errors import render

    with pytest.raises(AudioError) as exc:
        decode_audio(CLIP, limits=Limits(max_audio_seconds=1.0))
    msg = str(exc.value)
    assert "(Limits.max_audio_seconds)" in msg  # the Python API's words
    assert exc.value.code == "limit.audio_seconds" and exc.value.limit == "max_audio_seconds"
    cli = render(exc.value, "cli")
    assert "Limits" not in cli and cli.endswith("at most 1 s are accepted")
    assert render(exc.value, "server-console").endswith("are accepted (--max-audio-seconds)")
    with pytest.raises(ValueError) as exc2:
        session.options(hotwords=[f"w{i}" for i in range(201)])
    assert render(exc2.value, "cli") == "--hotwords: 201 hotwords; at most 200 are accepted"
    with pytest.raises(ValueError) as exc2:
        session.options(hotwords=["x" * 101])
    assert render(exc2.value, "cli").startswith("--hotwords: hotword 'xxxxxxxxxxxxxxxxxxxx'... has 101 characters")
    with pytest.raises(ValueError) as exc2:
        session.options(segment_seconds=0.5)
    assert render(exc2.value, "server-console").startswith("--max-segment-seconds must")


def test_inspect_names_truncation_and_file_type(tiny_gguf, tmp_path: Path) -> None:  # noqa: ANN001
    good = Path(tiny_gguf("q8_0"))
    r = _run("--inspect", str(good), module="fun_asr.cli.convert")
    assert r.returncode == 0 and "file type     q8_0 (7)" in r.stdout_text
    cut = tmp_path / "cut.gguf"
    cut.write_bytes(good.read_bytes()[: good.stat().st_size // 2])
    r = _run("--inspect", str(cut), module="fun_asr.cli.convert")
    assert r.returncode == 2 and "truncated" in r.stderr_text and "tensor" in r.stderr_text
    assert "reshape" not in r.stderr_text and "Traceback" not in r.stderr_text
    r = _run("--inspect", str(tmp_path), module="fun_asr.cli.convert")
    assert r.returncode == 2 and "is a directory" in r.stderr_text


def _default_sigint() -> None:
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})


def test_ctrl_c_exits_130_with_one_line(model_path: str) -> None:
    proc = subprocess.Popen([sys.executable, "-m", "fun_asr.cli.transcribe", "-", "-m", model_path, "--device", "cpu",
                             "--vad", "none"],  # no no_vad notice: the interrupt line is the only one
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            # a library in this pytest process may leave SIGINT ignored or blocked, which a child
                            # inherits (then no KeyboardInterrupt): a terminal's Ctrl-C reaches the CLI with the
                            # default disposition and an unblocked mask
                            preexec_fn=_default_sigint)
    deadline = time.time() + 120
    maps = Path(f"/proc/{proc.pid}/maps")
    while time.time() < deadline and model_path not in (maps.read_text() if maps.exists() else ""):
        time.sleep(0.1)  # wait until the model is mapped: the CLI then blocks reading stdin

    def reading_stdin() -> bool:  # the main thread blocked in read(0, ...) (x86-64 syscall 0), where Linux says so
        try:
            fields = Path(f"/proc/{proc.pid}/syscall").read_text().split()
        except OSError:
            return True  # no /proc/PID/syscall here: fall back to the pause below
        return len(fields) > 1 and fields[0] == "0" and int(fields[1], 16) == 0

    until = time.time() + 30
    while time.time() < until and not reading_stdin():
        time.sleep(0.05)
    time.sleep(0.5)
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 130, err
    text = err.decode()
    assert "interrupted" in text and "Traceback" not in text and text.strip().count("\n") == 0


def test_on_step_callback_and_interrupt(tiny_gguf) -> None:  # noqa: ANN001
    model = fun_asr.load_model(tiny_gguf("f32"))
    emb = np.ascontiguousarray(model.embed([151644, 8, 9, 10, 151645, 198]))
    calls: list[tuple[int, int]] = []
    out = model.generate_batch([emb, emb], 6, [], on_step=lambda produced, active: calls.append((produced, active)))
    assert calls[0] == (0, 2) and calls[-1] == (12, 0) and len(calls) == 7  # after the prefill and every step
    assert [c[0] for c in calls] == sorted(c[0] for c in calls)

    def stop(produced: int, active: int) -> None:
        if produced >= 4:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        model.generate_batch([emb], 50, [], on_step=stop)
    assert model.generate_batch([emb, emb], 6, []) == out  # still usable, same result


# --- 10. the Python API names what it accepts -----------------------------------------------------

def test_api_type_errors(session: fun_asr.Session, tmp_path: Path) -> None:
    with pytest.raises(TypeError, match="got NoneType"):
        session.transcribe(None)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="is a list.*transcribe_batch"):
        session.transcribe([0.0] * 16000, sample_rate=16000)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="takes a list of recordings, got one str"):
        session.transcribe_batch(str(CLIP))  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="takes a list of recordings, got NoneType"):
        session.transcribe_batch(None)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match=r"audios\[1\] must be"):
        session.transcribe_batch([CLIP, None])  # type: ignore[list-item]
    with open(CLIP) as text_mode, pytest.raises(TypeError, match="text mode.*'rb'"):
        session.transcribe(text_mode)
    with pytest.raises(TypeError, match="hotwords"):
        session.transcribe(CLIP, hotwords=5)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="max_new_tokens"):
        session.transcribe(CLIP, max_new_tokens=0)


# --- 11.-13. stdin, several inputs to stdout, progress ------------------------------------------------

def test_stdin_reads_any_format(model_path: str, session: fun_asr.Session, tmp_path: Path) -> None:
    flac = tmp_path / "hello.flac"
    data, rate = sf.read(CLIP)
    sf.write(flac, data, rate)
    want = session.transcribe(CLIP, max_new_tokens=4).text
    for payload in (flac.read_bytes(), CLIP.read_bytes()):
        r = _run("-", "-m", model_path, *CLI_TOKENS, stdin=payload)
        assert r.returncode == 0, r.stderr_text
        assert r.stdout_text == want + "\n"
    r = _run("-", "-", "-m", model_path, *CLI_TOKENS, stdin=b"")
    assert r.returncode == 2 and "can be given once" in r.stderr_text


def test_several_inputs_to_stdout_are_jsonl(model_path: str) -> None:
    clips = [str(CLIP), str(EXAMPLES / "zh_weather.wav"), str(EXAMPLES / "ja_hello.wav")]
    r = _run(*clips, "-m", model_path, *CLI_TOKENS, "-f", "json")
    assert r.returncode == 0, r.stderr_text
    lines = r.stdout_text.splitlines()
    assert len(lines) == 3 and [json.loads(x)["input"] for x in lines] == clips


def test_json_to_stdout_is_one_line_per_input_for_any_count(model_path: str, tmp_path: Path) -> None:
    """`*.wav -f json > all.jsonl` stays JSONL when the glob matches one file (was pretty
    JSON for one input); a failed input is a line too. Files under -o may be pretty."""
    r = _run(str(CLIP), "-m", model_path, *CLI_TOKENS, "-f", "json")
    assert r.returncode == 0, r.stderr_text
    assert r.stdout_text.count("\n") == 1 and json.loads(r.stdout_text)["input"] == str(CLIP), r.stdout_text
    broken = tmp_path / "broken.wav"
    broken.write_bytes(b"RIFF not audio at all")
    r = _run(str(broken), "-m", model_path, *CLI_TOKENS, "-f", "json")
    assert r.returncode == 1 and r.stdout_text.count("\n") == 1
    line = json.loads(r.stdout_text)
    assert line["input"] == str(broken) and "cannot decode audio" in line["error"]
    r = _run(str(CLIP), "-m", model_path, *CLI_TOKENS, "-f", "json", "-o", str(tmp_path / "out"))
    assert r.returncode == 0 and json.loads((tmp_path / "out" / "en_hello.json").read_text())["input"] == str(CLIP)


def test_progress_bars_move_per_segment_and_step(session: fun_asr.Session, capsys: pytest.CaptureFixture) -> None:
    rng = np.random.default_rng(3)
    audio = (0.1 * rng.standard_normal(16000 * 25)).astype(np.float32)
    session.transcribe(audio, sample_rate=16000, segment_seconds=10, max_new_tokens=3, progress=True)
    err = capsys.readouterr().err
    assert "encoding" in err and "/3" in err  # one tick per segment of the 25 s clip
    assert "decoding" in err and "tok" in err


# --- 14. server ------------------------------------------------------------------------------------

def test_serve_help_and_bind_error(tmp_path: Path) -> None:
    r = _run("--help", module="fun_asr.cli.serve")
    assert r.returncode == 0
    flat = " ".join(r.stdout_text.split())
    for flag in ("--host", "--port", "--device", "--threads", "--max-upload-mb", "--max-concurrency",
                 "--max-new-tokens", "--model-id", "--verbose", "--model"):
        assert flag in flat
    for default in ("(default: 127.0.0.1)", "(default: 8000)", "(default: 8)", "(default: 100.0)", "(default: 512)"):
        assert default in flat, default
    # each default once (never '(default funasr/fsmn-vad) (default: None)'), none for on/off flags
    import re

    blocks = re.split(r"\n  (?=-)", r.stdout_text)
    assert len(blocks) > 20
    for block in blocks:
        assert " ".join(block.split()).count("default") <= 1, block
    assert "(default: None)" not in flat and "(default: False)" not in flat
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen(1)
        port = busy.getsockname()[1]
        r = _run("-m", str(tmp_path / "model.gguf"), "--port", str(port), module="fun_asr.cli.serve")
    assert r.returncode == 2 and "cannot listen on 127.0.0.1" in r.stderr_text
    assert "listening" not in r.stderr_text and "cannot load model" not in r.stderr_text


# --- 15. hub: one line, fast, when the hub is unreachable ----------------------------------------------

def test_unreachable_hub_fails_fast_with_one_line(tmp_path: Path) -> None:
    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = {"HF_ENDPOINT": f"http://127.0.0.1:{port}", "HF_HUB_CACHE": str(tmp_path / "hub"),
           "HF_HUB_OFFLINE": "0", "FUN_ASR_CACHE_DIR": str(tmp_path / "c")}
    t0 = time.time()
    r = _run(str(CLIP), "-m", "someone/some-model", env=env)
    assert time.time() - t0 < 20
    assert r.returncode == 2 and r.stderr_text.count("\n") == 1, r.stderr_text
    assert "unreachable" in r.stderr_text and "HF_HUB_OFFLINE=1" in r.stderr_text
    assert "-m demo" in r.stderr_text and r.stdout == b""  # suggested, never used unless asked for
    r = _run(str(CLIP), "-m", "someone/some-model", env={**env, "HF_HUB_OFFLINE": "1"})
    assert r.returncode == 2 and r.stderr_text.count("\n") == 1 and "not in the local hub cache" in r.stderr_text
    assert "-m demo" in r.stderr_text


def test_readme_defaults_match_the_code() -> None:
    import re

    from fun_asr.cli.serve import build_parser as serve_parser
    from fun_asr.cli.transcribe import build_parser as transcribe_parser

    readme = (Path(__file__).resolve().parents[1] / "README.md").read_text("utf-8")
    checked = 0
    for parser in (serve_parser(), transcribe_parser()):
        for action in parser._actions:
            flag = next((o for o in action.option_strings if o.startswith("--")), None)
            if flag is None:
                continue
            default = action.default
            if default is None:  # resolved after parsing (it depends on another flag): the help states it
                stated = re.search(r"\(default (\d+(?:\.\d+)?)", action.help or "")
                default = stated and stated.group(1)
            for m in re.finditer(re.escape(f"`{flag}`") + r"[^`]{0,60}?default (\d+(?:\.\d+)?)", readme):
                assert default is not None and float(m.group(1)) == float(default), \
                    f"README says {flag} default {m.group(1)}"
                checked += 1
    assert checked >= 4
