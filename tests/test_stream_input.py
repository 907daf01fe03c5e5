"""fun-asr-transcribe --stream's input: WAV/FLAC/OGG/MP3 recognized by their headers on standard input and decoded
as they arrive (a live pipe gives sentences before it ends), raw PCM only with --raw-pcm RATE, anything else one
error line (exit 1), --raw-pcm misused a usage error (exit 2)."""

from __future__ import annotations

import json
import os
import queue
import struct
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pytest
import soundfile as sf
import soxr

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"
CLI = [sys.executable, "-m", "fun_asr.cli.transcribe"]
PROG = "fun-asr-transcribe"


@pytest.fixture(scope="module")
def base(vad_dir: Path) -> list[str]:
    """The CLI on the 20-word demo model with the real FSMN-VAD (streaming needs a VAD)."""
    return [*CLI, "-m", "demo", "--vad-model", str(vad_dir), "--device", "cpu", "--quiet"]


def _run(args: list[str], stdin: bytes | None = None, timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run(args, input=stdin if stdin is not None else b"", capture_output=True, timeout=timeout)


def _sentences(stdout: bytes) -> list[str]:
    """The sentence texts of --stream -f json's events (checking the last line is the final result)."""
    events = [json.loads(line) for line in stdout.decode("utf-8").splitlines() if line.strip()]
    assert events and events[-1]["type"] == "final", events
    texts = [e["text"] for e in events if e["type"] == "sentence"]
    assert texts == [s["text"] for s in events[-1]["sentences"]]
    return texts


def _int16(x: np.ndarray) -> np.ndarray:
    return np.clip(np.round(x * 32768.0), -32768, 32767).astype("<i2")


def _wav_header(rate: int, channels: int, riff_size: int, data_size: int) -> bytes:
    """A 16-bit PCM RIFF/WAVE header with the given size fields (what a recorder writing to a pipe leaves)."""
    fmt = struct.pack("<HHIIHH", 1, channels, rate, rate * channels * 2, channels * 2, 16)
    return (b"RIFF" + struct.pack("<I", riff_size) + b"WAVE" + b"fmt " + struct.pack("<I", len(fmt)) + fmt
            + b"data" + struct.pack("<I", data_size))


@pytest.fixture(scope="module")
def clips(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """examples/demo_1.wav as a stereo 44.1 kHz WAV, FLAC, OGG and (when libsndfile writes it) MP3, plus 16 kHz and
    8 kHz raw PCM, and an 8 kHz WAV of the same samples."""
    d = tmp_path_factory.mktemp("stream_input")
    x, rate = sf.read(EXAMPLES / "demo_1.wav", dtype="float32")
    assert rate == 16000
    y = soxr.resample(x, 16000, 44100)
    stereo = np.stack([y, 0.8 * y], axis=1)
    out = {}
    formats = ["wav", "flac", "ogg"] + (["mp3"] if "MP3" in sf.available_formats() else [])
    for ext in formats:
        out[ext] = d / f"stereo44k.{ext}"
        sf.write(out[ext], stereo, 44100, subtype="PCM_16" if ext in ("wav", "flac") else None)
    out["raw16k"] = d / "demo16k.raw"
    out["raw16k"].write_bytes(_int16(x).tobytes())
    x8 = _int16(soxr.resample(x, 16000, 8000))
    out["raw8k"] = d / "demo8k.raw"
    out["raw8k"].write_bytes(x8.tobytes())
    out["wav8k"] = d / "demo8k.wav"
    sf.write(out["wav8k"], x8, 8000, subtype="PCM_16")
    return out


@pytest.fixture(scope="module")
def plain(base: list[str], clips: dict[str, Path]) -> dict[str, str]:
    """The plain (file) transcription of each clip with a header, in one run."""
    names = [k for k in clips if not k.startswith("raw") and k != "wav8k"]
    r = _run([*base, "-f", "json", *(str(clips[k]) for k in names)])
    assert r.returncode == 0, r.stderr.decode()
    texts = [json.loads(line)["text"] for line in r.stdout.decode().splitlines() if line.strip()]
    assert len(texts) == len(names)
    return dict(zip(names, texts, strict=True))


def test_stereo_44k_wav_piped_matches_the_file(base: list[str], clips: dict[str, Path], plain: dict[str, str]) -> None:
    """The user's report: a stereo 44.1 kHz WAV piped to --stream - was read as raw 16 kHz PCM (wrong words, a 50 s
    recording). Now its header is read: the same sentence as --stream FILE and as the plain transcription."""
    assert plain["wav"] == "five two five eight"  # the demo model hears it (examples/demo.txt)
    piped = _run([*base, "--stream", "-f", "json", "-"], clips["wav"].read_bytes())
    assert piped.returncode == 0, piped.stderr.decode()
    events = [json.loads(line) for line in piped.stdout.decode().splitlines()]
    assert events[-1]["duration_ms"] < 3000  # 2.4 s of audio, not 50 s of header-and-stereo "PCM"
    from_file = _run([*base, "--stream", "-f", "json", str(clips["wav"])])
    assert from_file.returncode == 0, from_file.stderr.decode()
    assert _sentences(piped.stdout) == _sentences(from_file.stdout) == [plain["wav"]]


@pytest.mark.parametrize("fmt", ["flac", "ogg", "mp3"])
def test_compressed_formats_piped(base: list[str], clips: dict[str, Path], plain: dict[str, str], fmt: str) -> None:
    if fmt not in clips:
        pytest.skip(f"this libsndfile ({sf.__libsndfile_version__}) does not write {fmt.upper()}")
    r = _run([*base, "--stream", "-f", "json", "-"], clips[fmt].read_bytes())
    assert r.returncode == 0, r.stderr.decode()
    assert _sentences(r.stdout) == [plain[fmt]]
    assert plain[fmt]


@pytest.mark.parametrize(("riff_size", "data_size", "rate", "channels"),
                         [(0xFFFFFFFF, 0xFFFFFFFF, 16000, 1), (0, 0, 48000, 2)])
def test_live_wav_with_unknown_sizes_gives_events_before_it_ends(base: list[str], riff_size: int, data_size: int,
                                                                 rate: int, channels: int, tmp_path: Path) -> None:
    """A recorder's WAV on a pipe (arecord -t wav: sizes unknown): events come while the audio still arrives, and
    the sentences are those of --stream FILE on the same samples."""
    x1, _ = sf.read(EXAMPLES / "demo_1.wav", dtype="float32")
    x2, _ = sf.read(EXAMPLES / "demo_2.wav", dtype="float32")
    pause = np.zeros(int(3.0 * 16000), np.float32)
    first, rest = np.concatenate([x1, pause]), np.concatenate([x2, pause[:8000]])

    def pcm(x: np.ndarray) -> bytes:
        y = soxr.resample(x, 16000, rate) if rate != 16000 else x
        return _int16(np.repeat(y[:, None], channels, axis=1)).tobytes()

    proc = subprocess.Popen([*base, "--stream", "-f", "json", "-"], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE)
    lines: queue.Queue = queue.Queue()

    def pump() -> None:
        for line in proc.stdout:  # type: ignore[union-attr]
            lines.put(line)
        lines.put(None)

    threading.Thread(target=pump, daemon=True).start()
    try:
        proc.stdin.write(_wav_header(rate, channels, riff_size, data_size) + pcm(first))  # type: ignore[union-attr]
        proc.stdin.flush()  # type: ignore[union-attr]
        early = lines.get(timeout=60)  # the input is still open: nothing would come if the CLI waited for its end
        assert early is not None, proc.stderr.read().decode()  # type: ignore[union-attr]
        assert json.loads(early)["type"] in ("partial", "sentence")
        proc.stdin.write(pcm(rest))  # type: ignore[union-attr]
        proc.stdin.close()  # type: ignore[union-attr]
        assert proc.wait(timeout=60) == 0, proc.stderr.read().decode()  # type: ignore[union-attr]
    finally:
        if proc.poll() is None:
            proc.kill()
    out = [early]
    while (line := lines.get(timeout=10)) is not None:
        out.append(line)
    same = tmp_path / "same.wav"
    sf.write(same, np.frombuffer(pcm(first) + pcm(rest), "<i2").reshape(-1, channels), rate, subtype="PCM_16")
    from_file = _run([*base, "--stream", "-f", "json", str(same)])
    assert from_file.returncode == 0, from_file.stderr.decode()
    texts = _sentences(b"".join(out))
    assert texts == _sentences(from_file.stdout)
    assert len(texts) == 2 and texts[0] == "five two five eight"


def test_raw_pcm_16k_and_8k(base: list[str], clips: dict[str, Path]) -> None:
    """--raw-pcm RATE: 16-bit mono at RATE, the same sentence as --stream on a WAV file holding those samples (the
    demo model hears 8 kHz audio less well: the words are compared, not the transcript)."""
    r16 = _run([*base, "--stream", "--raw-pcm", "16000", "-f", "json", "-"], clips["raw16k"].read_bytes())
    assert r16.returncode == 0, r16.stderr.decode()
    assert _sentences(r16.stdout) == ["five two five eight"]
    r8 = _run([*base, "--stream", "--raw-pcm", "8000", "-f", "json", "-"], clips["raw8k"].read_bytes())
    assert r8.returncode == 0, r8.stderr.decode()
    wav8 = _run([*base, "--stream", "-f", "json", str(clips["wav8k"])])  # the 8 kHz samples in a WAV file
    assert wav8.returncode == 0, wav8.stderr.decode()
    assert _sentences(r8.stdout) == _sentences(wav8.stdout)
    assert len(_sentences(r8.stdout)) == 1


def test_raw_pcm_file_at_real_time(base: list[str], clips: dict[str, Path]) -> None:
    """--stream --raw-pcm FILE --realtime: the file's samples paced at their rate (2.4 s of audio)."""
    t0 = time.perf_counter()
    r = _run([*base, "--stream", "--raw-pcm", "8000", "--realtime", str(clips["raw8k"])])
    took = time.perf_counter() - t0
    assert r.returncode == 0, r.stderr.decode()
    assert took >= 2.2
    assert len(r.stdout.decode().splitlines()) == 1 and "-->" in r.stdout.decode()


@pytest.mark.parametrize(("data", "expected"), [
    (b"\x8f\x13\x00\x7f" * 500, "standard input: not WAV, FLAC, OGG or MP3 (starts with 0x8f13007f8f13007f); raw "
                                "PCM needs --raw-pcm RATE"),
    (b"", "standard input: no data (0 bytes)"),
    (b"RIFF\x10\x00", "standard input: the WAV header is cut short"),
    (_wav_header(16000, 1, 36, 0)[:36], "standard input: the WAV header ends before its data chunk"),
])
def test_unusable_input_is_one_error_line(base: list[str], data: bytes, expected: str) -> None:
    r = _run([*base, "--stream", "-"], data)
    assert r.returncode == 1
    assert r.stdout == b""
    err = r.stderr.decode().splitlines()
    assert len(err) == 1, err
    assert err[0].startswith(f"{PROG}: error: {expected}"), err


def test_raw_pcm_misused_is_a_usage_error(base: list[str], clips: dict[str, Path], tmp_path: Path) -> None:
    """Before the model loads (a model that does not exist is never reached), exit 2 naming the flags."""
    no_model = [*CLI, "-m", str(tmp_path / "missing.gguf"), "--device", "cpu", "--quiet"]
    r = _run([*no_model, "--raw-pcm", "16000", "-"], clips["raw16k"].read_bytes())
    assert r.returncode == 2 and r.stdout == b""
    assert r.stderr.decode().startswith(f"{PROG}: error: --raw-pcm RATE is for --stream"), r.stderr.decode()
    r = _run([*no_model, "--stream", "--raw-pcm", "16000", str(clips["wav"])])
    assert r.returncode == 2 and r.stdout == b""
    assert f"--raw-pcm with {clips['wav']}: the file starts with a WAV header" in r.stderr.decode()
    r = _run([*no_model, "--stream", "--raw-pcm", "10", "-"], b"")
    assert r.returncode == 2 and "--raw-pcm RATE must be a sample rate" in r.stderr.decode()
    # on standard input the header is seen once the model is loaded: still a usage error, nothing transcribed
    r = _run([*base, "--stream", "--raw-pcm", "16000", "-"], clips["flac"].read_bytes())
    assert r.returncode == 2 and r.stdout == b""
    assert r.stderr.decode().strip() == (f"{PROG}: error: standard input starts with a FLAC header, not raw PCM: drop "
                                         "--raw-pcm (WAV, FLAC, OGG or MP3 are recognized by their headers)")


def test_fifo_file_is_read_as_it_arrives(base: list[str], clips: dict[str, Path], tmp_path: Path) -> None:
    """--stream FILE where FILE is a named pipe (not a regular file): read like standard input."""
    fifo = tmp_path / "live.flac"
    os.mkfifo(fifo)
    data = clips["flac"].read_bytes()

    def writer() -> None:
        with open(fifo, "wb") as f:
            f.write(data)

    t = threading.Thread(target=writer, daemon=True)
    t.start()
    r = _run([*base, "--stream", "-f", "json", str(fifo)])
    t.join(timeout=10)
    assert r.returncode == 0, r.stderr.decode()
    assert _sentences(r.stdout) == ["five two five eight"]


@pytest.mark.parametrize("fmt", ["flac", "ogg", "mp3", "wav"])
def test_formats_decode_incrementally_on_a_pipe(tmp_path: Path, fmt: str) -> None:
    """PipedAudio gives the first block while two thirds of a 10 s recording have not been written to the pipe yet,
    and all of it (the same samples as the file read whole) once the pipe ends."""
    from fun_asr.audio.piped import PipedAudio

    if fmt.upper() not in sf.available_formats():
        pytest.skip(f"this libsndfile ({sf.__libsndfile_version__}) does not write {fmt.upper()}")
    x = np.concatenate([sf.read(EXAMPLES / f"demo_{i}.wav", dtype="float32")[0] for i in (1, 2, 3, 1)])
    y = soxr.resample(x, 16000, 44100)
    path = tmp_path / f"long.{fmt}"
    sf.write(path, np.stack([y, 0.5 * y], axis=1), 44100)
    data = path.read_bytes()
    first_block = threading.Event()
    held_back = []
    r, w = os.pipe()

    def writer() -> None:
        os.write(w, data[: len(data) // 3])
        held_back.append(not first_block.wait(timeout=30))  # True: the reader needed more than a third
        os.write(w, data[len(data) // 3 :])
        os.close(w)

    t = threading.Thread(target=writer, daemon=True)
    t.start()
    try:
        audio = PipedAudio(r, "standard input")
        assert (audio.kind, audio.rate, audio.channels) == (fmt, 44100, 2)
        blocks = []
        for block in audio.blocks():
            blocks.append(block)
            first_block.set()
        t.join(timeout=10)
    finally:
        first_block.set()
        os.close(r)
    assert held_back == [False]
    ref, _ = sf.read(path, dtype="float32")
    got = np.concatenate(blocks)
    assert got.size == len(ref)
    np.testing.assert_allclose(got, ref.mean(axis=1), atol=1e-6)
