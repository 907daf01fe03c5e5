"""fun_asr._core: build facts, and quantization checked against gguf-py's independent decoder."""

from __future__ import annotations

import gguf
import numpy as np
import pytest
from gguf.quants import dequantize as gguf_dequantize

from fun_asr import _core

GGUF_TYPES = {
    "f32": gguf.GGMLQuantizationType.F32,
    "f16": gguf.GGMLQuantizationType.F16,
    "bf16": gguf.GGMLQuantizationType.BF16,
    "q8_0": gguf.GGMLQuantizationType.Q8_0,
    "q4_k": gguf.GGMLQuantizationType.Q4_K,
    "q6_k": gguf.GGMLQuantizationType.Q6_K,
}

# Relative RMS round-trip error on standard-normal data (error RMS / data RMS). f16 and bf16 follow
# from their mantissas (11 and 8 bits: 2^-11/sqrt(3) ~ 2.8e-4, 2^-8/sqrt(3) ~ 2.3e-3); the block
# formats from their step sizes. Measured here: f16 2.1e-4, bf16 1.7e-3, q8_0 5.4e-3,
# q6_k 1.8e-2, q4_k 7.1e-2.
REL_RMS_BOUND = {
    "f32": 0.0,
    "f16": 3e-4,
    "bf16": 2.5e-3,
    "q8_0": 7e-3,
    "q6_k": 2.5e-2,
    "q4_k": 8.5e-2,
}


def test_system_info_names_ggml_and_cpu() -> None:
    info = _core.system_info()
    assert info["ggml_version"] == "0.15.3"
    assert "CPU" in info["compiled_backends"]
    assert "CPU" in info["registered_backends"]
    assert any(d["type"] == "cpu" for d in info["devices"])
    assert isinstance(info["cpu_features"], dict)
    assert set(info["tensor_types"]) == set(GGUF_TYPES)


def test_devices_are_named_over_the_registered_backends() -> None:
    """cpu and auto always; gpu[:N] any backend's GPUs; a GPU backend's name (cuda, vulkan, metal, ...) its own;
    a name this build lacks says so and lists the backends it has; anything else is unknown."""
    info = _core.system_info()
    gpus = [d for d in info["devices"] if d["type"] in ("gpu", "igpu")]
    # "auto" never takes a software Vulkan driver (Mesa's llvmpipe, what CI's Vulkan tests run on)
    hardware = [d for d in gpus if not any(s in d["description"].lower() for s in ("llvmpipe", "lavapipe",
                                                                                  "swiftshader"))]
    assert _core.check_device("cpu") == next(d["name"] for d in info["devices"] if d["type"] == "cpu")
    assert _core.check_device("auto") == (hardware[0]["name"] if hardware else _core.check_device("cpu"))
    backends = ", ".join(info["registered_backends"])
    for name in ("vulkan", "metal", "cuda:0", "gpu"):
        if name.split(":")[0].upper() not in {b.upper() for b in info["registered_backends"]} and not gpus:
            with pytest.raises(ValueError, match=rf"device '{name}' requested but no GPU is available \(this build's "
                                                 rf"backends: {backends}\)"):
                _core.check_device(name)
    for name in ("tpu", "cpu:0", "gpu:x", "cuda:-1"):
        with pytest.raises(ValueError, match=rf"unknown device '{name}': accepted values are auto, cpu, gpu, gpu:N"):
            _core.check_device(name)


@pytest.mark.parametrize("type_name", sorted(GGUF_TYPES))
def test_quantize_matches_gguf_py_and_bounds(type_name: str) -> None:
    rng = np.random.default_rng(1234)
    x = rng.standard_normal((48, 768)).astype(np.float32)
    packed = _core.quantize(x, type_name)
    ours = _core.dequantize(packed, type_name, x.shape)
    assert ours.shape == x.shape and ours.dtype == np.float32

    raw = np.frombuffer(packed, dtype=np.uint8).reshape(x.shape[0], -1)
    if type_name in ("f32", "f16"):  # gguf-py takes these as typed arrays, the rest as bytes
        raw = raw.view({"f32": np.float32, "f16": np.float16}[type_name])
    theirs = gguf_dequantize(raw, GGUF_TYPES[type_name]).astype(np.float32)
    np.testing.assert_array_equal(ours, theirs.reshape(x.shape))

    err = np.sqrt(np.mean((ours - x) ** 2)) / np.sqrt(np.mean(x**2))
    assert err <= REL_RMS_BOUND[type_name], f"{type_name}: relative RMS {err:.3e}"
    assert err > 0 or type_name == "f32"


def test_q8_0_per_block_bound() -> None:
    # Q8_0 stores d = amax/127 (as f16) per 32 values: every value is off by at most d/2, plus up to
    # 127 times the f16 rounding of d (2^-11 relative): d/2 * (1 + 254 * 2^-11) < d/2 * 1.125.
    rng = np.random.default_rng(7)
    x = (rng.standard_normal((16, 256)) * rng.uniform(0.01, 10, (16, 1))).astype(np.float32)
    y = _core.dequantize(_core.quantize(x, "q8_0"), "q8_0", x.shape)
    blocks_x = x.reshape(-1, 32)
    blocks_err = np.abs(y - x).reshape(-1, 32).max(axis=1)
    amax = np.abs(blocks_x).max(axis=1)
    assert np.all(blocks_err <= amax / 254 * 1.125)


def test_quantize_bytes_size_and_threads_agree() -> None:
    rng = np.random.default_rng(3)
    x = rng.standard_normal((300, 512)).astype(np.float32)
    one = _core.quantize(x, "q4_k", threads=1)
    many = _core.quantize(x, "q4_k", threads=4)
    assert one == many
    assert len(one) == 300 * (512 // 256) * 144


def test_type_names_case_insensitive() -> None:
    x = np.ones((2, 32), np.float32)
    assert _core.quantize(x, "Q8_0") == _core.quantize(x, "q8_0")


def test_unknown_type() -> None:
    with pytest.raises(ValueError, match="accepted types are f32, f16, bf16, q8_0, q4_k, q6_k"):
        _core.quantize(np.zeros((2, 32), np.float32), "q3_k")
    with pytest.raises(ValueError, match="unknown tensor type"):
        _core.dequantize(b"\0" * 8, "int8", (2, 4))


def test_row_length_not_multiple_of_block() -> None:
    with pytest.raises(ValueError, match="560 is not a multiple of the q4_K block size 256"):
        _core.quantize(np.zeros((4, 560), np.float32), "q4_k")
    with pytest.raises(ValueError, match="not a multiple"):
        _core.dequantize(b"\0" * 34, "q8_0", (1, 30))


def test_wrong_dtype_shape_layout() -> None:
    with pytest.raises(TypeError, match="float32"):
        _core.quantize(np.zeros((2, 32), np.float64), "q8_0")
    with pytest.raises(ValueError, match="2 dimensions"):
        _core.quantize(np.zeros(64, np.float32), "q8_0")
    with pytest.raises(ValueError, match="C-contiguous"):
        _core.quantize(np.zeros((64, 64), np.float32).T, "q8_0")
    with pytest.raises(ValueError, match="C-contiguous"):
        _core.quantize(np.zeros((4, 64), np.float32)[:, ::2], "q8_0")
    with pytest.raises(TypeError):
        _core.quantize([[1.0] * 32], "q8_0")


def test_dequantize_checks_sizes() -> None:
    with pytest.raises(ValueError, match="needs 68"):
        _core.dequantize(b"\0" * 34, "q8_0", (2, 32))
    with pytest.raises(ValueError, match="positive"):
        _core.dequantize(b"", "f32", (0, 4))
    with pytest.raises(ValueError, match="at least one dimension"):
        _core.dequantize(b"", "f32", ())
    with pytest.raises(ValueError, match="C-contiguous"):
        _core.dequantize(np.zeros((4, 8), np.float32)[:, ::2], "f32", (4, 4))


def test_empty_rows_and_buffer_inputs() -> None:
    assert _core.quantize(np.zeros((0, 32), np.float32), "q8_0") == b""
    x = np.arange(64, dtype=np.float32).reshape(2, 32)
    y = _core.dequantize(bytearray(x.tobytes()), "f32", [2, 32])
    np.testing.assert_array_equal(x, y)
    y = _core.dequantize(np.frombuffer(_core.quantize(x, "f16"), np.uint8), "f16", (2, 32))
    np.testing.assert_array_equal(x, y)


def test_float32_arrays_from_any_dtype_object_are_accepted(tiny_gguf) -> None:  # noqa: ANN001
    """An unpickled float32 array carries its own dtype object (not numpy's canonical one): still float32, accepted;
    big-endian float32 is not this machine's float32 and is refused with the conversion to use."""
    import pickle

    import fun_asr

    model = fun_asr.load_model(tiny_gguf("f32"))
    x = np.random.default_rng(0).standard_normal((7, 560)).astype(np.float32)
    y = pickle.loads(pickle.dumps(x))
    assert y.dtype is not np.dtype(np.float32)  # (the case: another dtype object)
    np.testing.assert_array_equal(model.encode(y), model.encode(x))
    with pytest.raises(TypeError, match=r"float32 array, got dtype >f4 \(convert with numpy.asarray"):
        model.encode(x.astype(">f4"))
