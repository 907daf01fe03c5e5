"""What every command promises a user: nothing they have is overwritten without --overwrite (and then replaced
whole), options are judged before any model is fetched, converted or loaded, messages name the command's own
flags, and one table of exit codes (0 done, 1 some inputs failed, 2 nothing done, 130/143 interrupted). Run as a
user runs them: subprocesses."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from fun_asr.outputs import ExistingOutputError, write_atomic

ROOT = Path(__file__).resolve().parents[1]
EXAMPLES = ROOT / "examples"
DEMO_CLIP = EXAMPLES / "demo_1.wav"
# A Python API spelling in a command's message: a keyword argument (`vad_model=`, `vad=None`, `overwrite=True`;
# not `--flag=`, not an upper-case environment variable), a class or function call, a module path.
PYTHON_SPELLING = re.compile(r"(?<![-\w])[a-z][a-z_]*=|\b(?:Session|StreamOptions|Limits)\(|\bfun_asr\.\w|"
                             r"system_info\(\)")


def _run(module: str, *args: str, env: dict | None = None, stdin: bytes | None = None,
         timeout: float = 300) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", module, *args], capture_output=True, text=stdin is None,
                          input=stdin, timeout=timeout, env={**os.environ, **(env or {})})


def _transcribe(*args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    return _run("fun_asr.cli.transcribe", *args, env=env)


@pytest.fixture()
def cache(tmp_path: Path) -> dict:
    """A fresh fun-asr cache: what a run builds there shows whether it got as far as the model."""
    return {"FUN_ASR_CACHE_DIR": str(tmp_path / "cache"), "HF_ENDPOINT": "http://127.0.0.1:9"}


@pytest.fixture(scope="module")
def demo_env(tmp_path_factory: pytest.TempPathFactory) -> dict:
    """A cache holding the built demo model (built once for the module)."""
    env = {"FUN_ASR_CACHE_DIR": str(tmp_path_factory.mktemp("demo-cache")), "HF_ENDPOINT": "http://127.0.0.1:9"}
    r = _transcribe("-m", "demo", "--device", "cpu", str(DEMO_CLIP), env=env)
    assert r.returncode == 0, r.stderr
    return env


def _models(env: dict) -> list[str]:
    folder = Path(env["FUN_ASR_CACHE_DIR"]) / "models"
    return sorted(p.name for p in folder.iterdir()) if folder.is_dir() else []


# --- nothing overwritten -----------------------------------------------------------------------------

def test_existing_output_is_refused_before_anything_then_replaced_with_overwrite(demo_env: dict,
                                                                                  tmp_path: Path) -> None:
    col = tmp_path / "col"
    col.mkdir()
    clip = col / "a.wav"
    clip.write_bytes(DEMO_CLIP.read_bytes())
    notes = col / "a.txt"
    notes.write_text("MY NOTES\n")
    r = _transcribe("-m", "demo", "--device", "cpu", str(clip), "-o", str(col), env=demo_env)
    assert r.returncode == 2, r.stderr
    assert notes.read_text() == "MY NOTES\n"
    assert r.stderr == (f"fun-asr-transcribe: error: {notes} already exists; add --overwrite to replace it, or "
                        "write elsewhere (nothing was done)\n"), r.stderr
    assert "->" not in r.stderr  # nothing was transcribed or written
    # several: the first few and a count
    for fmt in ("json", "srt", "vtt"):
        (col / f"a.{fmt}").write_text(f"MINE {fmt}\n")
    r = _transcribe("-m", "demo", "--device", "cpu", str(clip), "-o", str(col), "-f", "all", env=demo_env)
    assert r.returncode == 2 and r.stderr.count("\n") == 1, r.stderr
    assert f"4 outputs already exist: {notes}, " in r.stderr, r.stderr
    assert " and 1 more; add --overwrite to replace them, or write elsewhere (nothing was done)" in r.stderr
    r = _transcribe("-m", "demo", "--device", "cpu", str(clip), "-o", str(col), "--overwrite", env=demo_env)
    assert r.returncode == 0, r.stderr
    assert notes.read_text().strip() == "five two five eight"
    assert (col / "a.json").read_text() == "MINE json\n"  # only what this run writes is replaced
    assert sorted(p.name for p in col.iterdir() if p.name.startswith(".")) == []  # no temporary file left
    r = _transcribe("-m", "demo", "--device", "cpu", str(clip), "--overwrite", env=demo_env)
    assert r.returncode == 2 and "--overwrite is for -o DIR" in r.stderr


def test_write_atomic_never_leaves_a_half_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "out.txt"
    path.write_text("old")
    with pytest.raises(ExistingOutputError):
        write_atomic(path, "new", overwrite=False)
    assert path.read_text() == "old"

    def broken_replace(src: str, dst: str) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "replace", broken_replace)
    with pytest.raises(OSError):
        write_atomic(path, "new" * 1000, overwrite=True)
    assert path.read_text() == "old" and [p.name for p in tmp_path.iterdir()] == ["out.txt"]
    monkeypatch.undo()
    write_atomic(path, "new", overwrite=True)
    assert path.read_text() == "new" and oct(path.stat().st_mode & 0o777) == oct(0o666 & ~_umask())
    fresh = tmp_path / "fresh.txt"
    write_atomic(fresh, "x", overwrite=False)
    assert fresh.read_text() == "x"


def _umask() -> int:
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def test_eval_table_is_not_overwritten(tmp_path: Path) -> None:
    hyp = tmp_path / "hyp.txt"
    ref = tmp_path / "ref.txt"
    hyp.write_text("a one two\n")
    ref.write_text("a one three\n")
    table = tmp_path / "table.tsv"
    table.write_text("MINE\n")
    r = _run("fun_asr.cli.evaluate", str(hyp), str(ref), "--table", str(table))
    assert r.returncode == 2 and table.read_text() == "MINE\n", r.stderr
    assert r.stderr == f"fun-asr-eval: error: {table} already exists; add --overwrite to replace it, or write " \
                       "elsewhere (nothing was done)\n"
    r = _run("fun_asr.cli.evaluate", str(hyp), str(ref), "--table", str(table), "--overwrite")
    assert r.returncode == 0 and table.read_text().startswith("id\twer"), r.stderr
    other = tmp_path / "other.txt"
    other.write_text("b one\n")
    r = _run("fun_asr.cli.evaluate", str(hyp), str(other))
    assert r.returncode == 2 and "no id is in both" in r.stderr


def test_batch_refuses_a_folder_it_did_not_write(demo_env: dict, tmp_path: Path) -> None:
    out = tmp_path / "out"
    out.mkdir()
    (out / "summary.json").write_text('{"my": "data"}\n')
    r = _run("fun_asr.cli.batch", str(DEMO_CLIP), "-o", str(out), "-m", "demo", "--device", "cpu", "--quiet",
             env=demo_env)
    assert r.returncode == 2, r.stderr
    assert r.stderr == (f"fun-asr-batch: error: {out / 'summary.json'} already exists, not written by fun-asr-batch; "
                        "add --overwrite to replace it, or write elsewhere (nothing was done)\n"), r.stderr
    assert (out / "summary.json").read_text() == '{"my": "data"}\n' and not list(out.glob("shard-*"))
    r = _run("fun_asr.cli.batch", str(DEMO_CLIP), "-o", str(out), "-m", "demo", "--device", "cpu", "--quiet",
             "--overwrite", env=demo_env)
    assert r.returncode == 0, r.stderr
    assert json.loads((out / "summary.json").read_text())["results"] == 1
    # its own records: a rerun resumes without --overwrite
    r = _run("fun_asr.cli.batch", str(DEMO_CLIP), "-o", str(out), "-m", "demo", "--device", "cpu", "--quiet",
             env=demo_env)
    assert r.returncode == 0, r.stderr


def test_batch_exits_1_when_a_recording_failed(demo_env: dict, tmp_path: Path) -> None:
    broken = tmp_path / "broken.wav"
    broken.write_bytes(b"RIFF" + b"\0" * 40)
    out = tmp_path / "out"
    r = _run("fun_asr.cli.batch", str(DEMO_CLIP), str(broken), "-o", str(out), "-m", "demo", "--device", "cpu",
             env=demo_env)
    assert r.returncode == 1, r.stderr
    assert "1 recording(s) failed" in r.stderr and "--retry-failed" in r.stderr
    assert json.loads((out / "summary.json").read_text())["ok"] == 1


# --- fail fast -----------------------------------------------------------------------------------------

@pytest.mark.parametrize("args,message", [
    (["--device", "cuda"], "--device cuda: "),
    (["--device", "metal"], "--device metal: this build has no Metal backend; it has: "),
    (["--device", "tpu"], "--device tpu: unknown device 'tpu'"),
    (["--diarize", "--num-speakers", "0"],
     "--num-speakers must be a positive integer, got 0 (omit --num-speakers to have the speakers counted)"),
    (["--diarize", "--max-speakers", "-2"], "--max-speakers must be a positive integer, got -2 (omit --max-speakers"),
    (["--hotwords", "a\tb"], "--hotwords"),
    (["--hotwords", ",".join(f"w{i}" for i in range(300))], "--hotwords: 300 hotwords; at most 200 are accepted"),
    (["--max-new-tokens", "100000"], "--max-new-tokens must be at most"),
])
def test_options_fail_before_the_model_is_built_or_loaded(args: list[str], message: str, cache: dict) -> None:
    from fun_asr import _core

    if args[0] == "--device" and args[1] == "cuda" and any(d["type"] == "gpu" for d in
                                                            _core.system_info()["devices"]):
        pytest.skip("this build has a GPU")
    t0 = time.time()
    r = _transcribe("-m", "demo", str(DEMO_CLIP), *args, env=cache)
    assert r.returncode == 2 and r.stderr.count("error:") == 1 and message in r.stderr, r.stderr
    assert "None" not in r.stderr and not PYTHON_SPELLING.findall(r.stderr), r.stderr  # the command's words
    if args[:2] in (["--device", "cuda"], ["--device", "metal"]):  # one this machine or build lacks: what to use
        assert r.stderr.rstrip().endswith("; use --device cpu or --device auto"), r.stderr
    assert _models(cache) == []  # nothing converted into the cache
    assert "cannot load model" not in r.stderr and "demo model" not in r.stderr  # the model was never opened
    assert time.time() - t0 < 60


def test_session_checks_the_device_before_converting(cache: dict, monkeypatch: pytest.MonkeyPatch) -> None:
    import fun_asr
    from fun_asr import _core

    if any(d["type"] == "gpu" for d in _core.system_info()["devices"]):
        pytest.skip("this build has a GPU")
    for k, v in cache.items():
        monkeypatch.setenv(k, v)
    with pytest.raises(ValueError, match="this build has no CUDA backend|device 'cuda' is not usable here"):
        fun_asr.Session("demo", device="cuda")
    assert _models(cache) == []


@pytest.mark.parametrize("built,why,said", [
    (False, "", "--device vulkan: this build has no Vulkan backend; it has: CPU; use --device cpu or --device auto"),
    (True, "libggml-vulkan.so loaded but found no device",
     "--device vulkan: device 'vulkan' is not usable here: libggml-vulkan.so loaded but found no device; use "
     "--device cpu or --device auto"),
])
def test_a_named_device_that_is_not_usable_is_an_error_naming_why(built: bool, why: str, said: str, cache: dict,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    """`--device vulkan` (as `--device cuda`) where it gives no device is an error, never the CPU in its place: on a
    build without the backend the message blames the build and names its backends; where the build ships it but
    ggml found no device, it gives ggml's reason (system_info()["unavailable_backends"]). The Python API raises
    the same before anything is converted; `auto` still takes the CPU."""
    import argparse

    import fun_asr
    from fun_asr import _core
    from fun_asr.cli.common import UsageError, check_model_free_options

    for k, v in cache.items():
        monkeypatch.setenv(k, v)
    monkeypatch.setattr(_core, "device_fallback", lambda device: why if device.startswith("vulkan") else "")
    monkeypatch.setattr(_core, "system_info", lambda: {"registered_backends": ["Vulkan", "CPU"] if built else ["CPU"],
                                                       "unavailable_backends": {"vulkan": why} if built else {}})
    args = argparse.Namespace(device="vulkan", hotwords=None, max_new_tokens=None)
    with pytest.raises(UsageError) as exc:
        check_model_free_options(args)
    assert str(exc.value) == said
    with pytest.raises(ValueError) as exc2:
        fun_asr.Session("demo", device="vulkan")
    assert str(exc2.value) == said.removeprefix("--device vulkan: ").replace("--device cpu or --device auto",
                                                                              "the cpu or auto device")
    assert _models(cache) == []
    check_model_free_options(argparse.Namespace(device="auto", hotwords=None, max_new_tokens=None))


# --- messages in the command's words -----------------------------------------------------------------

def test_cli_messages_have_no_python_spellings(tiny_gguf, tiny_f32: Path, demo_env: dict,  # noqa: ANN001
                                               tmp_path: Path) -> None:
    novad = str(tiny_gguf("f32"))  # a model with no VAD: the no-VAD notice and the stream's need of one
    env = {**demo_env, "FUN_ASR_VAD_MODEL": ""}
    clip = str(DEMO_CLIP)
    existing = tmp_path / "exists.gguf"
    existing.write_bytes(b"x")
    runs = {
        "no-VAD notice": _transcribe("-m", novad, "--device", "cpu", "--max-new-tokens", "2", clip, env=env),
        "stream without VAD": _transcribe("-m", novad, "--device", "cpu", "--stream", clip, env=env),
        "stream with --vad none": _transcribe("-m", novad, "--stream", "--vad", "none", clip, env=env),
        "no GPU": _transcribe("-m", "demo", "--device", "cuda:3", clip, env=env),
        "unreachable hub": _transcribe("-m", "someone/some-model", clip, env=env),
        "vad options without VAD": _transcribe("-m", novad, "--device", "cpu", "--max-end-silence-time", "500",
                                               clip, env=env),
        "speakers without model": _transcribe("-m", novad, "--device", "cpu", "--diarize", clip, env=env),
        "batch no GPU": _run("fun_asr.cli.batch", clip, "-o", str(tmp_path / "b"), "-m", "demo", "--device",
                             "cuda", env=env),
        "convert existing": _run("fun_asr.cli.convert", str(tiny_f32), "-o", str(existing), env=env),
        "convert missing": _run("fun_asr.cli.convert", str(tmp_path / "missing"), env=env),
    }
    for what, r in runs.items():
        text = r.stderr
        assert "Traceback" not in text, (what, text)
        found = PYTHON_SPELLING.findall(text)
        assert not found, (what, found, text)
    assert runs["no-VAD notice"].returncode == 0 and "--vad-model" in runs["no-VAD notice"].stderr
    assert "--stream-mode chunked" in runs["stream without VAD"].stderr
    assert runs["stream without VAD"].returncode == 2
    assert runs["no GPU"].returncode == 2 and "--device cpu" in runs["no GPU"].stderr
    assert runs["unreachable hub"].returncode == 2 and "-m demo" in runs["unreachable hub"].stderr
    assert runs["convert existing"].returncode == 2 and "--force" in runs["convert existing"].stderr
    assert runs["convert missing"].returncode == 2
    assert runs["batch no GPU"].returncode == 2


def test_diarize_without_a_speaker_model_is_one_clean_line(demo_env: dict) -> None:
    """`--diarize -m demo` (the demo has no CAM++): one error line, the reason said once, the model as the user
    named it (not the cache file it was built into), exit code 2 before anything is transcribed."""
    env = {**demo_env, "FUN_ASR_SPEAKER_MODEL": ""}
    r = _transcribe("--diarize", "-m", "demo", "--device", "cpu", str(DEMO_CLIP), env=env)
    assert r.returncode == 2 and r.stdout == "", r.stderr
    errors = [line for line in r.stderr.splitlines() if "error:" in line]
    assert len(errors) == 1, r.stderr
    assert errors[0].startswith("fun-asr-transcribe: error: demo: speaker labels (--diarize) need"), errors
    assert errors[0].count("CAM++ speaker model") == 1 and "could not be had" not in errors[0], errors
    assert env["FUN_ASR_CACHE_DIR"] not in r.stderr and ".gguf:" not in r.stderr, r.stderr
    assert "--speaker-model" in errors[0] and not PYTHON_SPELLING.findall(errors[0]), errors


def test_no_speech_says_why_the_text_is_empty(demo_env: dict, tmp_path: Path) -> None:
    """3 minutes of silence: stdout keeps its format (an empty line, an empty file), stderr says why there is no
    text (the code is the JSON's empty_reason), and the run succeeded (exit code 0); --quiet keeps stderr quiet."""
    import numpy as np
    import soundfile as sf

    clip = tmp_path / "silence.wav"
    sf.write(clip, np.zeros(180 * 16000, np.float32), 16000)
    r = _transcribe("-m", "demo", "--device", "cpu", str(clip), env=demo_env)
    assert r.returncode == 0 and r.stdout == "\n", r.stderr
    assert f"fun-asr-transcribe: {clip}: no speech found (no_speech)\n" in r.stderr, r.stderr
    r = _transcribe("-m", "demo", "--device", "cpu", str(clip), "-f", "json", env=demo_env)
    assert r.returncode == 0 and json.loads(r.stdout)["empty_reason"] == "no_speech", r.stdout
    assert "no speech found (no_speech)" in r.stderr
    r = _transcribe("-m", "demo", "--device", "cpu", str(clip), "--quiet", env=demo_env)
    assert r.returncode == 0 and r.stdout == "\n" and r.stderr == "", r.stderr


# --- exit codes ----------------------------------------------------------------------------------------

def test_exit_codes_are_one_table(demo_env: dict, tmp_path: Path) -> None:
    missing = str(tmp_path / "missing.wav")
    broken = tmp_path / "broken.wav"
    broken.write_bytes(b"RIFF" + b"\0" * 40)
    assert _transcribe("-m", "demo", "--device", "cpu", str(DEMO_CLIP), env=demo_env).returncode == 0
    assert _transcribe("-m", "demo", "--device", "cpu", str(DEMO_CLIP), str(broken), env=demo_env).returncode == 1
    assert _transcribe("-m", "demo", missing, env=demo_env).returncode == 2
    assert _run("fun_asr.cli.batch", missing, "-o", str(tmp_path / "o"), "-m", "demo", env=demo_env).returncode == 2
    assert _run("fun_asr.cli.convert", missing).returncode == 2
    assert _run("fun_asr.cli.evaluate", missing, missing).returncode == 2
    readme = (ROOT / "README.md").read_text("utf-8")
    section = readme[readme.index("## Exit codes"):]
    for code in ("`0`", "`1`", "`2`", "`130`", "`143`"):
        assert code in section


def test_sigterm_exits_143_and_leaves_no_partial_output(demo_env: dict, tmp_path: Path) -> None:
    proc = subprocess.Popen([sys.executable, "-m", "fun_asr.cli.transcribe", "-", "-m", "demo", "--device", "cpu",
                             "-o", str(tmp_path)], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, env={**os.environ, **demo_env},
                            preexec_fn=lambda: signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGTERM}))
    time.sleep(3)  # the model loads, then the command waits for standard input
    proc.send_signal(signal.SIGTERM)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 143, err
    assert b"terminated" in err and b"Traceback" not in err
    assert list(tmp_path.iterdir()) == []


# --- extras without a rebuild ------------------------------------------------------------------------------

def test_readme_adds_extras_by_name_which_builds_nothing() -> None:
    """The README adds extras as `pip install 'fun-asr[extra]'`: pip takes the extra's requirements from the
    installed fun-asr's metadata (no build). The source-folder form `.[extra]` rebuilds the C++ core."""
    import importlib.metadata as md

    readme = (ROOT / "README.md").read_text("utf-8")
    commands = re.findall(r"^pip install (.+?)(?:\s+#.*)?$", readme, re.M)
    source_form = [c for c in commands if re.search(r"""['"]?\.\[(?!test\])""", c)]
    assert source_form == [], source_form  # only the development install (".[test]") builds from the folder
    for extra in ("speakers", "server", "ray", "modelscope"):
        assert f"pip install 'fun-asr[{extra}]'" in readme or extra not in md.metadata("fun-asr").get_all(
            "Provides-Extra"), extra
    # what pip does with that form here: every requirement satisfied from the installed metadata, nothing built
    r = subprocess.run([sys.executable, "-m", "pip", "install", "--dry-run", "--no-index", "--no-deps",
                        "fun-asr[speakers]"], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert "Requirement already satisfied: fun-asr" in r.stdout and "Building" not in r.stdout + r.stderr


def test_demo_streams_on_the_command_line(demo_env: dict) -> None:
    """-m demo brings its FSMN-VAD: --stream works with no VAD flag (it used to be refused)."""
    r = _transcribe("-m", "demo", "--device", "cpu", "--stream", str(DEMO_CLIP), "-f", "json", env=demo_env)
    assert r.returncode == 0, r.stderr
    events = [json.loads(line) for line in r.stdout.splitlines()]
    sentences = [e["text"].lower().strip(" .") for e in events if e.get("type") == "sentence"]
    assert sentences == ["five two five eight"], events


def test_a_command_run_in_process_leaves_the_sigterm_handler_as_it_was(tmp_path: Path) -> None:
    """A command's main() turns SIGTERM into exits.Terminated only while it runs: called inside another program
    (a test runner), the handler that program had is back afterwards, so a SIGTERM still stops it."""
    from fun_asr.cli import convert, exits, transcribe

    def mine(signum: int, frame: object) -> None:
        raise AssertionError("not called")

    before = signal.signal(signal.SIGTERM, mine)
    try:
        assert transcribe.main([str(tmp_path / "missing.wav")]) == exits.NOTHING_DONE
        assert signal.getsignal(signal.SIGTERM) is mine
        assert convert.main(["--inspect", str(tmp_path / "missing.gguf")]) == exits.NOTHING_DONE
        assert signal.getsignal(signal.SIGTERM) is mine
        with exits.terminate_on_sigterm():
            with pytest.raises(exits.Terminated):
                signal.raise_signal(signal.SIGTERM)
        assert signal.getsignal(signal.SIGTERM) is mine
    finally:
        signal.signal(signal.SIGTERM, before)
