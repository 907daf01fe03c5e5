"""CAM++ speaker embeddings on ggml: parity with FunASR 1.4.16's own ``CAMPPlus`` module
(torch, eval mode) and its ``extract_feature`` on random weights (tools/make_campplus_checkpoint.py), the
conversion (standalone GGUF, embedded in a package), and clear errors for bad files and bad audio."""

from __future__ import annotations

import contextlib
import io
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import fun_asr
from fun_asr import _core
from fun_asr.converter import inspect_gguf
from fun_asr.speakers.files import SpeakerModelError, read_campplus_folder
from fun_asr.speakers.frontend import fbank, speaker_features
from fun_asr.speakers.native import SpeakerModel

torch = pytest.importorskip("torch")
SR = 16000
# F32: every embedding within this cosine of FunASR's (measured: >= 0.9999999 on the tiny and full configs)
F32_COSINE = 0.9999
# F16 convolutions and matrices (activations rounded to F16 in every product): measured >= 0.99991 on the
# audio windows here (tiny and full configs), >= 0.99956 on random features (tools/bench_speaker.py --parity)
F16_COSINE = 0.999


def _funasr():  # noqa: ANN202 - (extract_feature, fbank module)
    with contextlib.redirect_stdout(io.StringIO()):  # funasr prints notices about optional packages
        from funasr.models.campplus.utils import extract_feature
        from funasr.utils import fbank as kaldi
    return extract_feature, kaldi


def _cos(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    return (a * b).sum(-1) / np.linalg.norm(a, axis=-1) / np.linalg.norm(b, axis=-1)


def _audio(n: int, seed: int) -> np.ndarray:
    """Speech-like test audio: a few harmonics with a moving pitch plus noise, in [-1, 1]."""
    rng = np.random.default_rng(seed)
    t = np.arange(n) / SR
    f0 = 120 + 40 * np.sin(2 * np.pi * 0.7 * t + seed)
    phase = 2 * np.pi * np.cumsum(f0) / SR
    x = sum(np.sin(k * phase) / k for k in range(1, 6)) * 0.2 + 0.02 * rng.standard_normal(n)
    return x.astype(np.float32)


@pytest.fixture(scope="module")
def campp(tmp_path_factory: pytest.TempPathFactory) -> dict[str, object]:
    """The tiny random CAM++ folder, FunASR's module with its weights, the native model, and GGUFs."""
    from make_campplus_checkpoint import load_reference, make_campplus_checkpoint

    root = tmp_path_factory.mktemp("campplus")
    folder = make_campplus_checkpoint(root / "speech_campplus_sv_zh-cn_16k-common", "tiny", seed=3)
    out: dict[str, object] = {"root": root, "folder": folder, "ref": load_reference(folder)}
    out["f32"] = root / "campplus-f32.gguf"
    out["f16"] = root / "campplus-f16.gguf"
    report = fun_asr.convert(folder, out["f32"], progress=False)  # the default type (q8_0) gives F32 for CAM++
    assert report.layout == "campplus" and report.package_type == "campplus, f32"
    fun_asr.convert(folder, out["f16"], "f16", progress=False)
    out["model"] = SpeakerModel.load(folder, threads=2)
    return out


def _reference(ref, feats: np.ndarray) -> np.ndarray:  # noqa: ANN001 - CAMPPlus
    with torch.no_grad():
        return ref(torch.from_numpy(np.ascontiguousarray(feats[None], np.float32))).numpy()[0]


# -- frontend --------------------------------------------------------------------------------------------------

def test_features_are_funasr_extract_feature() -> None:
    extract_feature, kaldi = _funasr()
    for n, seed in ((400, 0), (720, 1), (8000, 2), (24000, 3), (3 * SR + 77, 4)):
        x = _audio(n, seed)
        raw = kaldi.fbank(torch.from_numpy(x).unsqueeze(0), num_mel_bins=80).numpy()
        ours_raw = fbank(x)
        assert ours_raw.shape == raw.shape and np.abs(ours_raw - raw).max() <= 1e-5  # same library, same options
        want, lengths, _ = extract_feature([torch.from_numpy(x)])
        got = speaker_features(x)
        assert got.shape == (lengths[0], 80) == tuple(want.shape[1:])
        err = float(np.abs(got - want[0].numpy()).max())
        print(f"{n} samples: {got.shape[0]} frames, features max |diff| {err:.2e}")
        assert err <= 2e-5  # measured <= 3e-6: torch's and numpy's float32 means round differently


# -- network parity --------------------------------------------------------------------------------------------

@pytest.mark.parametrize("frames", [3, 60, 150, 201, 262, 421])
def test_embedding_matches_funasr_on_the_same_features(campp: dict, frames: int) -> None:
    """3 = the fewest frames (2 after the TDNN); 150 = a 1.5 s window (75 after the TDNN, one segment);
    201, 262, 421 = 101, 131, 211 frames after the TDNN: 2-3 segments of 100, the last partial (1, 31, 11
    frames) -- torch's avg_pool1d(ceil_mode) averages only its valid frames."""
    rng = np.random.default_rng(frames)
    feats = (rng.standard_normal((2, frames, 80)) * 3).astype(np.float32)
    feats -= feats.mean(axis=1, keepdims=True)
    got = campp["model"].embed_features(feats)
    want = np.stack([_reference(campp["ref"], f) for f in feats])
    cos = _cos(got, want)
    rel = float(np.abs(got - want).max() / np.abs(want).max())
    print(f"{frames} frames: cosine {cos.min():.8f}, max rel diff {rel:.2e}")
    assert cos.min() >= F32_COSINE and rel <= 1e-3


def test_embedding_matches_funasr_on_the_same_audio(campp: dict) -> None:
    """Audio -> FunASR's extract_feature + CAMPPlus.forward (one window at a time, as its diarization's
    equal-length windows) against SpeakerModel.embed on the same samples."""
    extract_feature, _ = _funasr()
    windows = [_audio(n, i) for i, n in enumerate((8000, 24000, 24000, 37000, 64000))]
    got = campp["model"].embed(windows)
    assert got.shape == (5, campp["model"].embedding_dim) and got.dtype == np.float32
    want = []
    for w in windows:
        feats, _, _ = extract_feature([torch.from_numpy(w)])
        with torch.no_grad():
            want.append(campp["ref"](feats.to(torch.float32)).numpy()[0])
    cos = _cos(got, np.stack(want))
    print("audio cosines:", np.array2string(cos, precision=8))
    assert cos.min() >= F32_COSINE


def test_batch_is_each_window_alone(campp: dict) -> None:
    m: SpeakerModel = campp["model"]
    windows = [_audio(24000, 10 + i) for i in range(6)] + [_audio(16000, 20), _audio(40000, 21)]
    together = m.embed(windows)
    alone = np.stack([m.embed([w])[0] for w in windows])
    assert np.allclose(together, alone, rtol=1e-5, atol=1e-5 * np.abs(alone).max())
    # an [N, samples] array is N windows
    assert np.allclose(m.embed(np.stack(windows[:6])), alone[:6], rtol=1e-5, atol=1e-5 * np.abs(alone).max())
    # a small memory budget runs the same windows in several graphs
    budget = m.native.memory_budget
    try:
        m.native.memory_budget = 1 << 20
        assert m.native.batch_for(150) == 1
        chunked = m.embed(windows[:6])
    finally:
        m.native.memory_budget = budget
    assert m.native.batch_for(150) > 1
    assert np.allclose(chunked, alone[:6], rtol=1e-5, atol=1e-5 * np.abs(alone).max())


def test_f16_file_stays_close(campp: dict) -> None:
    m16 = SpeakerModel.load(campp["f16"], threads=2)
    assert m16.info["weight_type"] == "f16" and m16.info["format"] == "gguf"
    windows = [_audio(24000, 30 + i) for i in range(4)] + [_audio(50000, 40)]
    cos = _cos(m16.embed(windows), campp["model"].embed(windows))
    print("F16 cosines:", np.array2string(cos, precision=6))
    assert cos.min() >= F16_COSINE


# -- conversion ------------------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def packages(campp: dict, tiny_f32: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("spk-packages")
    out = {"plain": root / "plain.gguf", "folder": root / "from-folder.gguf", "gguf": root / "from-gguf.gguf",
           "package": root / "from-package.gguf"}
    fun_asr.convert(tiny_f32, out["plain"], "f32", progress=False)
    report = fun_asr.convert(tiny_f32, out["folder"], "f32", progress=False, speaker_model=campp["folder"])
    assert report.speaker == str(Path(campp["folder"]).resolve())
    assert "CAM++ speaker model embedded" in report.summary()
    fun_asr.convert(tiny_f32, out["gguf"], "q8_0", progress=False, speaker_model=campp["f32"])
    fun_asr.convert(tiny_f32, out["package"], "f32", progress=False, speaker_model=out["folder"])
    out["f16"] = root / "from-f16-gguf.gguf"
    report = fun_asr.convert(tiny_f32, out["f16"], "f32", progress=False, speaker_model=campp["f16"])
    assert report.type_counts["f16"] == 224  # the CAM++ conv/matrix tensors, as stored in the F16 file
    return out


def test_gguf_gives_the_folders_embeddings(campp: dict) -> None:
    windows = [_audio(24000, 50), _audio(30000, 51)]
    want = campp["model"].embed(windows)
    from_file = SpeakerModel.load(campp["f32"], threads=2)
    assert np.array_equal(from_file.embed(windows), want)
    info = from_file.info
    assert info["license"] == "Apache License 2.0" and info["source"] == str(Path(campp["folder"]).resolve())
    assert info["embedding_dim"] == 32 and info["sample_rate"] == SR and info["block_layer_count"] == [12, 24, 16]
    insp = inspect_gguf(campp["f32"])
    assert insp["architecture"] == "campplus" and insp["tensor_types"] == {"F32": insp["tensor_count"]}


@pytest.mark.filterwarnings("ignore::fun_asr.notices.TruncatedOutputWarning")
def test_package_embeds_the_speaker_model(campp: dict, packages: dict[str, Path]) -> None:
    import gguf

    assert SpeakerModel.from_package(packages["plain"]) is None
    assert inspect_gguf(packages["plain"])["speaker"] is None
    windows = [_audio(24000, 60), _audio(20000, 61)]
    want = campp["model"].embed(windows)
    for key in ("folder", "gguf", "package"):
        m = SpeakerModel.from_package(packages[key], threads=2)
        assert m is not None and m.info["format"] == "embedded", key
        assert np.array_equal(m.embed(windows), want), key
        assert inspect_gguf(packages[key])["speaker"] == str(Path(campp["folder"]).resolve()), key

    m16 = SpeakerModel.from_package(packages["f16"])
    assert m16 is not None and m16.info["weight_type"] == "f16"
    assert np.array_equal(m16.embed(windows), SpeakerModel.load(campp["f16"]).embed(windows))

    def spk(path: Path) -> dict[str, np.ndarray]:
        return {t.name: np.array(t.data) for t in gguf.GGUFReader(path).tensors if t.name.startswith("spk.")}

    first = spk(packages["folder"])
    assert len(first) == 506 and all(np.array_equal(first[k], v) for k, v in spk(packages["package"]).items())
    # the recognizer's own tensors are untouched, and it still loads and runs from the package
    plain = {t.name: np.array(t.data) for t in gguf.GGUFReader(packages["plain"]).tensors}
    rest = {t.name: np.array(t.data) for t in gguf.GGUFReader(packages["folder"]).tensors
            if not t.name.startswith("spk.")}
    assert plain.keys() == rest.keys() and all(np.array_equal(plain[k], rest[k]) for k in plain)
    s = fun_asr.Session(packages["folder"], device="cpu", vad=None, progress=False)
    assert isinstance(s.transcribe(_audio(16000, 62), sample_rate=SR, max_new_tokens=4).text, str)


def test_cli_converts_a_folder_alone_and_embeds_one(campp: dict, tiny_f32: Path, tmp_path: Path) -> None:
    from fun_asr.cli.convert import main

    assert main([str(campp["folder"]), "-o", str(tmp_path / "spk.gguf"), "--quiet"]) == 0
    assert inspect_gguf(tmp_path / "spk.gguf")["architecture"] == "campplus"
    assert main([str(tiny_f32), "-t", "f32", "-o", str(tmp_path / "pkg.gguf"), "--quiet",
                 "--speaker-model", str(tmp_path / "spk.gguf")]) == 0
    assert SpeakerModel.from_package(tmp_path / "pkg.gguf") is not None
    # a speaker folder is not a recognizer to embed into
    assert main([str(campp["folder"]), "-o", str(tmp_path / "x.gguf"), "--speaker-model",
                 str(tmp_path / "spk.gguf")]) == 1


# -- errors ----------------------------------------------------------------------------------------------------

def _copy_folder(campp: dict, dst: Path) -> Path:
    shutil.copytree(campp["folder"], dst)
    return dst


def test_bad_folders_are_refused_clearly(campp: dict, tmp_path: Path) -> None:
    import yaml

    sd = torch.load(Path(campp["folder"]) / "campplus_cn_common.bin")
    missing = _copy_folder(campp, tmp_path / "missing")
    name = "xvector.block2.tdnnd3.cam_layer.linear_local.weight"
    torch.save({k: v for k, v in sd.items() if k != name}, missing / "campplus_cn_common.bin")
    with pytest.raises(SpeakerModelError, match=f"missing tensor '{name}'"):
        SpeakerModel.load(missing)

    extra = _copy_folder(campp, tmp_path / "extra")
    torch.save({**sd, "xvector.block4.tdnnd1.linear1.weight": sd["xvector.tdnn.linear.weight"]},
               extra / "campplus_cn_common.bin")
    with pytest.raises(SpeakerModelError, match="unexpected tensor 'xvector.block4"):
        read_campplus_folder(extra)

    shape = _copy_folder(campp, tmp_path / "shape")
    conf = yaml.safe_load((shape / "config.yaml").read_text())
    conf["model_conf"]["growth_rate"] = 16  # the weights are growth 8
    (shape / "config.yaml").write_text(yaml.safe_dump(conf))
    with pytest.raises(SpeakerModelError, match="expected .* from config.yaml"):
        fun_asr.convert(shape, tmp_path / "shape.gguf", progress=False)
    assert not (tmp_path / "shape.gguf").exists()

    for key, value in (("config_str", "batchnorm-prelu"), ("output_level", "frame")):
        bad = _copy_folder(campp, tmp_path / key)
        conf = yaml.safe_load((bad / "config.yaml").read_text())
        conf["model_conf"][key] = value
        (bad / "config.yaml").write_text(yaml.safe_dump(conf))
        with pytest.raises(SpeakerModelError, match=f"model_conf.{key} = '{value}' is not supported"):
            SpeakerModel.load(bad)

    nan = _copy_folder(campp, tmp_path / "nan")
    sd_nan = dict(sd)
    sd_nan["head.conv1.weight"] = sd["head.conv1.weight"].clone()
    sd_nan["head.conv1.weight"][0, 0, 0, 0] = float("nan")
    torch.save(sd_nan, nan / "campplus_cn_common.bin")
    with pytest.raises(SpeakerModelError, match="NaN"):
        SpeakerModel.load(nan)

    with pytest.raises(FileNotFoundError):
        SpeakerModel.load(tmp_path / "nowhere")


def _rewrite_gguf(src: Path, dst: Path, change) -> Path:  # noqa: ANN001 - change(name, array) -> array | None
    """A copy of a campplus GGUF with its tensors changed (None drops one)."""
    import gguf

    from fun_asr.converter.output import write_metadata

    reader = gguf.GGUFReader(src)
    meta = {k: f.contents() for k, f in reader.fields.items() if not k.startswith("GGUF.")}
    w = gguf.GGUFWriter(dst, "campplus")
    write_metadata(w, meta)
    for t in reader.tensors:
        arr = np.array(t.data).reshape([int(x) for x in reversed(t.shape)])
        arr = change(t.name, arr)
        if arr is not None:
            w.add_tensor(t.name, arr)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return dst


def test_bad_gguf_files_are_refused_clearly(campp: dict, packages: dict[str, Path], tmp_path: Path) -> None:
    good = Path(campp["f32"])
    name = "spk.blk.1.5.linear1.weight"
    dropped = _rewrite_gguf(good, tmp_path / "dropped.gguf", lambda n, a: None if n == name else a)
    with pytest.raises(SpeakerModelError, match=f"missing tensor '{name}'"):
        SpeakerModel.load(dropped)
    reshaped = _rewrite_gguf(good, tmp_path / "shape.gguf",
                             lambda n, a: np.ascontiguousarray(a[:, :-1]) if n == name else a)
    with pytest.raises(SpeakerModelError, match=f"tensor '{name}' has shape"):
        SpeakerModel.load(reshaped)
    retyped = _rewrite_gguf(good, tmp_path / "f16-bias.gguf",
                            lambda n, a: a.astype(np.float16) if n == "spk.tdnn.bias" else a)
    with pytest.raises(SpeakerModelError, match="spk.tdnn.bias' has unsupported type f16 for a bias"):
        SpeakerModel.load(retyped)
    renamed = _rewrite_gguf(good, tmp_path / "extra.gguf", lambda n, a: a)
    # a truncated file: header or data cut off
    data = good.read_bytes()
    for cut in (100, len(data) // 2, len(data) - 8):
        trunc = tmp_path / f"cut{cut}.gguf"
        trunc.write_bytes(data[:cut])
        with pytest.raises(SpeakerModelError):
            SpeakerModel.load(trunc)
    assert SpeakerModel.load(renamed).embedding_dim == 32
    with pytest.raises(SpeakerModelError, match="holds no CAM\\+\\+"):
        SpeakerModel.load(packages["plain"])


def test_native_loader_checks_shapes_itself(campp: dict) -> None:
    """The C++ side validates what it is given (no abort on bad input), whatever the Python side checked."""
    conf, meta, tensors = read_campplus_folder(campp["folder"])
    rows = [(n, "f32", list(reversed(a.shape)), a) for n, a in tensors]
    bad = [(n, t, ([ne[0] + 1] + ne[1:]) if n == "spk.dense.weight" else ne, a) for n, t, ne, a in rows]
    with pytest.raises(RuntimeError, match="spk.dense.weight' has shape"):
        _core.load_speaker_tensors(meta, bad)
    with pytest.raises(RuntimeError, match="missing tensor 'spk.fcm.conv1.bias'"):
        _core.load_speaker_tensors(meta, [r for r in rows if r[0] != "spk.fcm.conv1.bias"])
    with pytest.raises(RuntimeError, match="block.dilation must have the same length"):
        _core.load_speaker_tensors({**meta, "campplus.block.dilation": [1, 2]}, rows)
    with pytest.raises(RuntimeError, match="must be odd"):
        _core.load_speaker_tensors({**meta, "campplus.fcm.kernel_size": 4}, rows)
    m = _core.load_speaker_tensors(meta, rows)
    with pytest.raises(ValueError, match="too short"):
        m.embed(np.zeros((1, 2, 80), np.float32))
    with pytest.raises(ValueError, match="NaN"):
        m.embed(np.full((1, 10, 80), np.nan, np.float32))
    with pytest.raises(ValueError, match="80"):
        m.embed(np.zeros((1, 10, 40), np.float32))
    with pytest.raises(TypeError, match="float32"):
        m.embed(np.zeros((1, 10, 80), np.float64))


def test_bad_audio_is_a_value_error(campp: dict) -> None:
    m: SpeakerModel = campp["model"]
    assert m.min_samples == 720  # 3 frames: the TDNN leaves 2, the fewest the unbiased std takes
    ok = _audio(24000, 70)
    cases = {
        "empty": [np.zeros(0, np.float32)],
        "NaN": [ok, np.full(24000, np.nan, np.float32)],
        "infinite": [np.concatenate([ok[:-1], [np.inf]]).astype(np.float32)],
        "720": [ok[:719]],
        "1-D": [ok.reshape(2, -1)],
        "at least one": [],
    }
    for what, windows in cases.items():
        with pytest.raises(ValueError, match=what):
            m.embed(windows)
    with pytest.raises(ValueError, match="wrap a single window"):
        m.embed(ok)
    assert m.embed([ok[:720]]).shape == (1, 32)


# -- the released model's dimensions -----------------------------------------------------------------------------

def test_full_config_parity(tmp_path: Path) -> None:
    """The released dimensions (feat 80, embedding 192, growth 32, bn_size 4, init 128; 6.8 M parameters) on
    random weights: F32 and F16 files against FunASR's module on 1.5 s windows."""
    from make_campplus_checkpoint import load_reference, make_campplus_checkpoint

    folder = make_campplus_checkpoint(tmp_path / "full", "full", seed=5)
    ref = load_reference(folder)
    windows = [_audio(24000, 80 + i) for i in range(3)] + [_audio(40000, 90)]
    extract_feature, _ = _funasr()
    want = []
    for w in windows:
        feats, _, _ = extract_feature([torch.from_numpy(w)])
        with torch.no_grad():
            want.append(ref(feats).numpy()[0])
    want = np.stack(want)
    fun_asr.convert(folder, tmp_path / "f16.gguf", "f16", progress=False)
    cos32 = _cos(SpeakerModel.load(folder, threads=2).embed(windows), want)
    cos16 = _cos(SpeakerModel.load(tmp_path / "f16.gguf", threads=2).embed(windows), want)
    print("full config cosines F32:", np.array2string(cos32, precision=8), "F16:", np.array2string(cos16, precision=6))
    assert cos32.min() >= F32_COSINE and cos16.min() >= F16_COSINE


def test_bench_tool_smoke(tmp_path: Path) -> None:
    """tools/bench_speaker.py runs (tiny config, one repeat; no timing asserted)."""
    tool = Path(__file__).resolve().parents[1] / "tools" / "bench_speaker.py"
    r = subprocess.run([sys.executable, str(tool), "--smoke", "--no-torch", "--batches", "1,2", "--work",
                        str(tmp_path)], capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "native f16  batch   2:" in r.stdout and "10-minute recording" in r.stdout
