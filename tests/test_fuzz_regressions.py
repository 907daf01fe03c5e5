"""Fuzz findings stay fixed, and the native loader refuses every malformed GGUF header field with a clear error.

``tests/data/fuzz/<harness>/`` holds each input a harness of ``tools/fuzz/`` found (and a few written by hand
from review); every one is replayed through its harness in a subprocess (a crash there fails the test instead
of killing pytest). The GGUF tests below build small files field by field.
"""

from __future__ import annotations

import io
import json
import os
import struct
import subprocess
import sys
import zipfile
from pathlib import Path

import numpy as np
import pytest

import fun_asr
from fun_asr import _core

ROOT = Path(__file__).resolve().parents[1]
DATA = ROOT / "tests" / "data" / "fuzz"
FUZZ = ROOT / "tools" / "fuzz"
sys.path.insert(0, str(FUZZ))

HARNESSES = sorted(p.name for p in DATA.iterdir() if p.is_dir()) if DATA.is_dir() else []


@pytest.mark.parametrize("harness", HARNESSES)
def test_replay_findings(harness: str) -> None:
    pytest.importorskip("torch")  # the seeds' models come from tools/make_random_checkpoint.py
    env = {**os.environ, "FUN_ASR_GGML_LOG": ""}
    proc = subprocess.run([sys.executable, str(FUZZ / f"fuzz_{harness}.py"), "--replay", str(DATA / harness)],
                          capture_output=True, text=True, env=env, timeout=900)
    assert proc.returncode == 0, f"{harness}: replay failed (rc {proc.returncode}):\n{proc.stdout[-4000:]}\n" \
                                 f"{proc.stderr[-4000:]}"
    assert " 0 findings" in proc.stdout


# -- GGUF header fields, one by one (no torch needed) ---------------------------------------------------

def _gguf(tmp_path: Path, name: str = "m.gguf", *, kvs: dict | None = None, tensors=None) -> bytes:  # noqa: ANN001
    import gguf

    path = tmp_path / name
    w = gguf.GGUFWriter(path, "fun_asr_nano")
    for k, v in (kvs or {"fun_asr_nano.decoder.vocab_size": 64}).items():
        w.add_uint32(k, v)
    for tname, arr in tensors or [("a.weight", np.ones((4, 32), np.float32)), ("b.bias", np.ones(32, np.float32))]:
        w.add_tensor(tname, arr)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path.read_bytes()


def _check(tmp_path: Path, data: bytes, match: str) -> None:
    path = tmp_path / "bad.gguf"
    path.write_bytes(data)
    with pytest.raises(RuntimeError, match=match):
        _core.check_gguf(str(path))
    with pytest.raises(RuntimeError, match=match):
        fun_asr.load_model(path, device="cpu")


def _edit(data: bytes, fn) -> bytes:  # noqa: ANN001 - fn(kvs, tensors, blob) edits in place
    from fuzz_gguf import _parse, _serialize

    version, kvs, tensors, blob = _parse(data)
    blob = fn(kvs, tensors, blob) or blob
    return _serialize(version, kvs, tensors, blob)


def test_valid_synthetic_gguf_passes(tmp_path: Path) -> None:
    path = tmp_path / "ok.gguf"
    path.write_bytes(_gguf(tmp_path))
    assert _core.check_gguf(str(path)) == ("fun_asr_nano", 2)


def test_tensor_data_past_the_end_is_refused(tmp_path: Path) -> None:
    data = _gguf(tmp_path)
    _check(tmp_path, data[:-64], r"past the end|truncated")  # the last tensor's data cut off


def test_tensor_size_that_wraps_the_offset_arithmetic_is_refused(tmp_path: Path) -> None:
    # 2**62 - 1 F32 values = 2**64 - 4 bytes: data_offset + offset + nbytes wraps around 2**64
    def huge(kvs, tensors, blob):  # noqa: ANN001, ANN202
        tensors[:] = [[b"w", [2**62 - 1], 0, 0]]
    _check(tmp_path, _edit(_gguf(tmp_path), huge), r"past the end|truncated|size")


@pytest.mark.parametrize("dims,match", [([0, 4], "must be > 0"), ([-3 % 2**64, 4], "must be > 0"),
                                        ([2**40, 2**40], "64 bits|past the end|size"),
                                        ([1, 1, 1, 1, 1], "dimensions"), ([], "dimensions")])
def test_bad_tensor_dimensions_are_refused(tmp_path: Path, dims: list[int], match: str) -> None:
    def edit(kvs, tensors, blob):  # noqa: ANN001, ANN202
        tensors[0][1] = dims
    _check(tmp_path, _edit(_gguf(tmp_path), edit), match)


@pytest.mark.parametrize("type_id", [4, 5, 99, 2**31])
def test_unknown_tensor_type_is_refused(tmp_path: Path, type_id: int) -> None:
    def edit(kvs, tensors, blob):  # noqa: ANN001, ANN202
        tensors[0][2] = type_id
    _check(tmp_path, _edit(_gguf(tmp_path), edit), "type")


@pytest.mark.parametrize("value,match", [(struct.pack("<I", 8) + struct.pack("<Q", 2) + b"32", "uint32"),
                                         (struct.pack("<I", 5) + struct.pack("<i", 32), "uint32"),
                                         (struct.pack("<I", 4) + struct.pack("<I", 0), "power of 2"),
                                         (struct.pack("<I", 4) + struct.pack("<I", 48), "power of 2")])
def test_bad_alignment_is_refused(tmp_path: Path, value: bytes, match: str) -> None:
    def edit(kvs, tensors, blob):  # noqa: ANN001, ANN202
        t = struct.unpack_from("<I", value)[0]
        kvs.append([b"general.alignment", t, value[4:]])
    _check(tmp_path, _edit(_gguf(tmp_path), edit), match)


def test_empty_key_is_refused(tmp_path: Path) -> None:
    def edit(kvs, tensors, blob):  # noqa: ANN001, ANN202
        kvs.append([b"", 4, struct.pack("<I", 1)])
    _check(tmp_path, _edit(_gguf(tmp_path), edit), "empty")


@pytest.mark.parametrize("count", [2**20, 2**40, 2**63])
def test_huge_metadata_array_is_refused(tmp_path: Path, count: int) -> None:
    def edit(kvs, tensors, blob):  # noqa: ANN001, ANN202
        kvs.append([b"x.array", 9, struct.pack("<IQ", 5, count) + b"\0" * 16])
    _check(tmp_path, _edit(_gguf(tmp_path), edit), "past the end")


def test_string_past_the_end_and_huge_counts_are_refused(tmp_path: Path) -> None:
    data = _gguf(tmp_path)
    def edit(kvs, tensors, blob):  # noqa: ANN001, ANN202
        kvs.append([b"x.text", 8, struct.pack("<Q", 2**63) + b"abc"])
    _check(tmp_path, _edit(data, edit), "past the end")
    counts = bytearray(data)
    counts[8:16] = struct.pack("<Q", 2**62)  # tensor count
    _check(tmp_path, bytes(counts), "more than a file")
    _check(tmp_path, b"GGUF" + struct.pack("<I", 3), "truncated")
    _check(tmp_path, b"GGUX" + b"\0" * 64, "magic")


def test_large_int_metadata_array_is_not_materialized(tmp_path: Path) -> None:
    # a long (valid) int array is read as "<array>" rather than copied into the hyperparameters
    import gguf

    path = tmp_path / "arr.gguf"
    w = gguf.GGUFWriter(path, "fsmn_vad")
    w.add_array("fsmn_vad.big", list(range(70000)))
    w.add_tensor("t", np.ones(32, np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    assert _core.check_gguf(str(path)) == ("fsmn_vad", 1)


# -- with the micro model (needs torch for tools/make_random_checkpoint.py) ---------------------------

@pytest.fixture(scope="module")
def micro() -> Path:
    pytest.importorskip("torch")
    import _seeds

    return _seeds.small_vocab_gguf("q8_0")


def test_real_model_with_tensor_offsets_past_the_end_is_refused(micro: Path, tmp_path: Path) -> None:
    data = micro.read_bytes()
    assert fun_asr.load_model(micro, device="cpu", threads=1).info()["decoder"]["vocab"] == 64
    _check(tmp_path, data[: len(data) - 100], r"past the end|truncated")

    def shift(kvs, tensors, blob):  # noqa: ANN001, ANN202 - the last tensor's offset moved one alignment step on
        tensors[-1][3] += 32
    _check(tmp_path, _edit(data, shift), "offset|past the end")


@pytest.mark.parametrize("key,value,match", [
    ("fun_asr_nano.encoder.block_count", 2**20, "implausibly large|at most"),
    ("fun_asr_nano.decoder.block_count", 5000, "implausible"),
    ("fun_asr_nano.decoder.vocab_size", 2**31, "implausibly large"),
])
def test_implausible_hyperparameters_are_refused(micro: Path, tmp_path: Path, key: str, value: int,
                                                  match: str) -> None:
    def edit(kvs, tensors, blob):  # noqa: ANN001, ANN202
        for kv in kvs:
            if kv[0] == key.encode():
                kv[2] = struct.pack("<I", value)
    path = tmp_path / "hp.gguf"
    path.write_bytes(_edit(micro.read_bytes(), edit))
    assert _core.check_gguf(str(path))[0] == "fun_asr_nano"  # the header is fine; the values are not
    with pytest.raises(RuntimeError, match=match):
        fun_asr.load_model(path, device="cpu")


# -- checkpoint folders and model.pt (review findings next to the fuzzers') ------------------------------

def _folder(tmp_path: Path, files: dict[str, object]) -> Path:
    root = tmp_path / "ckpt"
    root.mkdir(parents=True)
    for name, content in files.items():
        (root / name).write_text(content if isinstance(content, str) else json.dumps(content))
    return root


def test_checkpoint_json_files_of_the_wrong_shape_are_checkpoint_errors(tmp_path: Path) -> None:
    from fun_asr.model.checkpoint import Checkpoint, CheckpointError
    from fun_asr.model.hparams import ConfigError, parse_hparams

    cfg = _tiny_config()
    cfg["text_config"]["rope_parameters"] = 5
    with pytest.raises(ConfigError, match="rope_parameters"):
        parse_hparams(cfg)
    cfg = _tiny_config()
    cfg["text_config"]["num_attention_heads"] = float("inf")
    with pytest.raises(ConfigError, match="must be an integer"):
        parse_hparams(cfg)
    cfg = _tiny_config()
    cfg["audio_config"]["num_hidden_layers"] = 10**9
    with pytest.raises(ConfigError, match="implausibly large"):
        parse_hparams(cfg)
    with pytest.raises(CheckpointError, match="no weight_map"):
        Checkpoint.open(_folder(tmp_path / "b", {"config.json": _tiny_config(), "model.safetensors.index.json": [1]}))


def _tiny_config() -> dict:
    sys.path.insert(0, str(ROOT / "tools"))
    from make_random_checkpoint import tiny_config

    return tiny_config()


@pytest.mark.parametrize("header", [
    {"w": {"dtype": "F32", "shape": [1e999], "data_offsets": [0, 4]}},
    {"w": {"dtype": ["F32"], "shape": [1], "data_offsets": [0, 4]}},
    {"w": {"dtype": "F32", "shape": [-1, -4], "data_offsets": [0, 16]}},
    {"w": {"dtype": "F32", "shape": [1], "data_offsets": {"a": 0, "b": 4}}},
    {"w": {"dtype": "F32", "shape": [2**32, 2**32], "data_offsets": [0, 0]}},
    {"w": [1, 2, 3]},
])
def test_malformed_safetensors_header_entries_are_checkpoint_errors(tmp_path: Path, header: dict) -> None:
    from fun_asr.model.checkpoint import CheckpointError, _read_safetensors_header

    raw = json.dumps(header).encode()
    path = tmp_path / "model.safetensors"
    path.write_bytes(struct.pack("<Q", len(raw)) + raw + b"\0" * 64)
    with pytest.raises(CheckpointError):
        _read_safetensors_header(path)


def test_model_pt_reference_cycle_and_huge_memo_are_model_file_errors(tmp_path: Path) -> None:
    from fun_asr.model.torch_pickle import ModelFileError, load_state_dict

    for name, pkl, match in [
        ("cycle.pt", b"\x80\x02}q\x00X\x01\x00\x00\x00aq\x01]q\x02h\x02as.", "deeper|cycle"),
        ("memo.pt", b"\x80\x02}r\xff\xff\xff\x7fs.", "memo entry"),
    ]:
        buf = io.BytesIO()
        with zipfile.ZipFile(buf, "w") as z:
            z.writestr("archive/data.pkl", pkl)
            z.writestr("archive/byteorder", "little")
        (tmp_path / name).write_bytes(buf.getvalue())
        with pytest.raises(ModelFileError, match=match):
            load_state_dict(tmp_path / name)
