"""Long recordings stream through the Session (read -> 16 kHz -> fbank -> VAD -> features -> encoder):
memory does not grow with the recording, the results are those of the whole-recording algorithms, progress
is shown, and an empty file says so."""

from __future__ import annotations

import io
import sys
import tracemalloc
import warnings
from pathlib import Path

import numpy as np
import pytest
import soundfile as sf

import fun_asr
import fun_asr.asr.pipeline as pipeline_mod
from fun_asr.audio.decode import AudioError, AudioReader, decode_audio
from fun_asr.audio.frontend import FbankStream, FrontendConfig, fbank
from fun_asr.audio.pauses import PauseSplitter, split_points
from fun_asr.notices import RecordingFailedWarning
from fun_asr.vad import FsmnVad, detect_segments, frame_decibels

pytestmark = pytest.mark.filterwarnings("ignore::fun_asr.notices.TruncatedOutputWarning")

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"
SR = 16000


@pytest.fixture(scope="module")
def vad() -> FsmnVad:
    from vad_fixture import fsmn_vad_dir

    return FsmnVad.load(fsmn_vad_dir())


@pytest.fixture(scope="module")
def session(tiny_gguf) -> fun_asr.Session:  # noqa: ANN001
    from vad_fixture import fsmn_vad_dir

    return fun_asr.Session(tiny_gguf("f32"), device="cpu", vad="fsmn", vad_model=fsmn_vad_dir())


def _speech() -> np.ndarray:
    x, rate = sf.read(EXAMPLES / "en_hello.wav", dtype="float32")
    assert rate == SR
    return x


def _islands(seconds: float, at: list[float], seed: int = 0) -> np.ndarray:
    """Quiet noise with the example utterance at the given times (s): speech on both sides of the
    VAD's 60 s chunk boundaries and of its 6000-frame network calls."""
    rng = np.random.default_rng(seed)
    x = (1e-4 * rng.standard_normal(int(seconds * SR))).astype(np.float32)
    speech = _speech()
    for t in at:
        a = int(t * SR)
        x[a : a + len(speech)] += speech[: len(x) - a]
    return x


def _whole_clip_segments(vad: FsmnVad, x: np.ndarray, cfg) -> list[list[int]]:  # noqa: ANN001
    """FunASR's offline algorithm on the whole clip at once (today's reference path, no streaming)."""
    fb = fbank(x, FrontendConfig())
    probs = vad.clip_silence_probs(fb, cfg)
    return detect_segments(probs, frame_decibels(x, fe=cfg.frontend), x.size, cfg)


def test_offline_vad_in_pieces_equals_the_whole_clip(vad: FsmnVad) -> None:
    x = _islands(185.0, [3.0, 58.5, 59.9, 61.0, 119.0, 150.0, 179.9])
    for segment_ms in (30000, 5000):  # 5 s: forced cuts inside the speech
        cfg = vad.cfg.__class__(**{**vad.cfg.__dict__, "max_single_segment_ms": segment_ms})
        whole = _whole_clip_segments(vad, x, cfg)
        assert len(whole) >= 5
        assert vad.segments(x, cfg) == whole
        rng = np.random.default_rng(segment_ms)
        for pieces in (rng.integers(1, 40000, 400), [16000 * 60], [7, 960000, 1, 17, 50000]):
            off = vad.offline(cfg)
            got: list[list[int]] = []
            a = 0
            sizes = list(pieces)
            while a < x.size:
                n = int(sizes.pop(0)) if sizes else 65536
                got += off.feed(x[a : a + n])
                a += n
            got += off.close()
            assert got == whole


def test_pause_splitter_in_pieces_equals_split_points() -> None:
    rng = np.random.default_rng(3)
    x = (rng.standard_normal(SR * 200) * np.repeat(rng.random(200 * 10), SR // 10)).astype(np.float32)
    for seconds in (30.0, 7.3, 1.0):
        whole = split_points(x, seconds)
        sp = PauseSplitter(seconds)
        got, a = [], 0
        while a < x.size:
            n = int(rng.integers(1, 3 * SR))
            a = min(a + n, x.size)
            got += sp.cuts(x[sp.start : a], sp.start)
        got += sp.cuts(x[sp.start :], sp.start, final=True)
        assert got == whole


def test_fbank_stream_equals_fbank() -> None:
    cfg = FrontendConfig()
    x = _islands(7.0, [1.0])
    st = FbankStream(cfg)
    parts, a = [], 0
    for n in (1, 399, 1, 160, 4000, 123457):
        parts.append(st.accept(x[a : a + n]))
        a += n
    np.testing.assert_array_equal(np.concatenate(parts), fbank(x, cfg))


@pytest.mark.parametrize("rate, channels", [(8000, 1), (44100, 2), (22050, 3), (16000, 2)])
def test_blocks_are_the_whole_conversion(tmp_path: Path, rate: int, channels: int) -> None:
    import soxr

    rng = np.random.default_rng(rate)
    x = (0.1 * rng.standard_normal((rate * 21 + 13, channels))).astype(np.float32)
    path = tmp_path / "x.flac"
    sf.write(path, x, rate)
    raw, _ = sf.read(path, dtype="float32", always_2d=True)
    mono = raw.mean(axis=1) if channels > 1 else raw[:, 0]
    whole = mono if rate == SR else soxr.resample(mono, rate, SR, quality="HQ")
    blocks = list(AudioReader(path).blocks())
    assert len(blocks) > 3
    np.testing.assert_array_equal(np.concatenate(blocks), whole)
    np.testing.assert_array_equal(decode_audio(path)[0], whole)


def test_session_streams_to_the_whole_clip_results(session: fun_asr.Session, vad: FsmnVad, tmp_path: Path,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    x = _islands(130.0, [2.0, 59.5, 61.0, 100.0, 125.0])
    path = tmp_path / "islands.wav"
    sf.write(path, x, SR, subtype="FLOAT")
    cfg = vad.cfg.__class__(**{**session.vad.cfg.__dict__, "max_single_segment_ms": 30000})
    r = session.transcribe(path, max_new_tokens=4)
    assert r.segmentation == "vad" and r.duration == x.size / SR
    assert [[round(s.start * 1000), round(s.end * 1000)] for s in r.segments] == _whole_clip_segments(vad, x, cfg)
    # the in-memory array, and decoding after every segment (waves), give the same tokens
    monkeypatch.setattr(pipeline_mod, "_WAVE_BYTES", 1)
    again = session.transcribe(x, sample_rate=SR, max_new_tokens=4)
    assert [s.tokens for s in again.segments] == [s.tokens for s in r.segments]
    nv = session.transcribe(path, vad=False, segment_seconds=20, max_new_tokens=4)
    spans = split_points(x, 20)
    assert [(round(s.start * SR), round(s.end * SR)) for s in nv.segments] == spans


def test_long_recording_is_never_held_whole(session: fun_asr.Session, tmp_path: Path) -> None:
    """20 minutes (77 MB as 16 kHz float32, another 38 MB as fbank frames) need no more memory than 3
    minutes: the Python-side peak (numpy arrays are traced by tracemalloc, deterministically) grows by
    far less than the audio, with the VAD and with the pause splitter."""
    peaks: dict[tuple[int, bool], int] = {}
    for minutes in (3, 20):
        x = _islands(minutes * 60.0, [100.0, 150.0] if minutes < 10 else [100.0, 700.0])
        path = tmp_path / f"long{minutes}.wav"
        sf.write(path, x, SR, subtype="PCM_16")
        del x
        for vad in (True, False):
            tracemalloc.start()
            try:
                r = session.transcribe(path, vad=vad, max_new_tokens=2)
                peaks[minutes, vad] = tracemalloc.get_traced_memory()[1]
            finally:
                tracemalloc.stop()
            assert r.duration == minutes * 60
            assert r.segments  # something was heard (the VAD) or cut (pauses)
    more_audio = 17 * 60 * SR * 4  # bytes of float32 samples the long file has on top
    for vad in (True, False):
        growth = peaks[20, vad] - peaks[3, vad]
        assert growth < more_audio / 10, (f"vad={vad}: peak {peaks[3, vad] / 1e6:.1f} MB for 3 min, "
                                          f"{peaks[20, vad] / 1e6:.1f} MB for 20 min")


class _FakeTqdm:
    bars: list[_FakeTqdm] = []

    def __init__(self, total: float | None = None, desc: str = "", unit: str = "", **kw: object) -> None:
        self.total, self.desc, self.unit, self.kw, self.n, self.closed = total, desc, unit, kw, 0, False
        self.bars.append(self)

    def update(self, n: float = 1) -> None:
        self.n += n

    def refresh(self) -> None:
        pass

    def close(self) -> None:
        self.closed = True


def test_progress_bars(session: fun_asr.Session, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import tqdm

    monkeypatch.setattr(tqdm, "tqdm", _FakeTqdm)
    x = _islands(75.0, [5.0, 40.0])
    path = tmp_path / "p.wav"
    sf.write(path, x, SR)
    _FakeTqdm.bars = []
    session.transcribe(path, max_new_tokens=3, progress=False)
    assert _FakeTqdm.bars == []
    r = session.transcribe(path, max_new_tokens=3, progress=True)
    audio = [b for b in _FakeTqdm.bars if b.desc == "audio"]
    assert len(audio) == 1 and audio[0].unit == "s" and audio[0].total == 75 and audio[0].n == 75
    assert audio[0].kw.get("delay", 0) > 0  # a short file shows no bar at all
    encoding = [b for b in _FakeTqdm.bars if b.desc == "encoding"]  # segments, counted as they are decided
    assert len(encoding) == 1 and encoding[0].total == encoding[0].n == len(r.segments) >= 2
    assert [b.desc for b in _FakeTqdm.bars] == ["audio", "encoding", "decoding"]
    assert all(b.closed for b in _FakeTqdm.bars)
    _FakeTqdm.bars = []
    session.transcribe_batch([path, path], max_new_tokens=3, progress=True)
    assert [b.desc for b in _FakeTqdm.bars] == ["audio 1/2", "encoding", "audio 2/2", "decoding"]


def test_cli_progress_only_on_a_terminal(tiny_gguf, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,  # noqa: ANN001
                                         capsys: pytest.CaptureFixture[str]) -> None:
    import tqdm

    from fun_asr.cli import transcribe as cli

    monkeypatch.setattr(tqdm, "tqdm", _FakeTqdm)
    monkeypatch.setattr(warnings, "formatwarning", warnings.formatwarning)  # the CLI sets its own
    path = tmp_path / "p.wav"
    sf.write(path, _islands(12.0, [2.0]), SR)

    class Tty(io.StringIO):
        def isatty(self) -> bool:
            return True

    args = [str(path), "-m", str(tiny_gguf("f32")), "--device", "cpu", "--vad", "none", "--max-new-tokens", "2"]
    for extra, tty, shown in (([], True, True), (["--quiet"], True, False), ([], False, False)):
        _FakeTqdm.bars = []
        monkeypatch.setattr(sys, "stderr", Tty() if tty else io.StringIO())
        assert cli.main(args + extra) == 0
        assert any(b.desc == "audio" for b in _FakeTqdm.bars) == shown, (extra, tty)
    capsys.readouterr()


def test_empty_file_says_it_is_empty(session: fun_asr.Session, tmp_path: Path) -> None:
    empty = tmp_path / "empty.wav"
    empty.write_bytes(b"")
    for audio in (empty, str(empty)):
        with pytest.raises(AudioError, match=r"empty\.wav: file is empty \(0 bytes\)"):
            decode_audio(audio)
        with pytest.raises(AudioError, match=r"file is empty \(0 bytes\)"):
            session.transcribe(audio)
    with pytest.raises(AudioError, match=r"0 bytes"):
        decode_audio(b"")
    with pytest.warns(RecordingFailedWarning, match=r"file is empty \(0 bytes\)"):
        (r,) = session.transcribe_batch([empty])
    assert not r.ok and "file is empty (0 bytes)" in r.error
