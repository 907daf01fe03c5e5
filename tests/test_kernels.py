"""fun-asr's own CPU kernels against ggml's mul_mat on the same quantized weights.

The decode kernels (csrc/kernels/matvec) compute every column the same way whatever the column count
(batch invariance: a sequence's step gives the same bits alone or in a batch). Q8_0 gives bit for bit
the AMX / int8 GEMMs' numbers (int32 block dots, one FMA per block in order: checked against an exact
emulation), ggml's to rounding; Q6_K bit for bit what ggml_mul_mat gives; F32 and F16 what it gives for
two or more columns (llamafile's tinyBLAS; one column takes ggml's vec_dot, which rounds differently);
repacked Q4_K ggml's numbers to rounding, the same bits on AVX2 and AVX-512.
tests/test_batch_invariance.py checks whole models.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import fun_asr
from fun_asr import _core

needs_kernel = pytest.mark.skipif(_core.matvec_isa() == "", reason="no x86 AVX2 CPU: the kernel is not used here")
# AVX-VNNI (VEX) on this CPU: the "avxvnni" copies can be forced here (FUN_ASR_MATVEC / FUN_ASR_GEMM=avxvnni)
HAS_AVX_VNNI = _core.system_info()["cpu_features"].get("AVX_VNNI") == "1"
# the narrower copies this CPU can be held to: AVX2 always, AVX-VNNI where it has it
NARROWER_ISAS = ["avx2"] + (["avxvnni"] if HAS_AVX_VNNI and _core.matvec_isa() != "avxvnni" else [])


def q8_0_exact_case(rng: np.random.Generator, rows: int, k: int, cols: int) -> tuple[np.ndarray, ...]:
    """Weights [rows, k] and activations [cols, k] that Q8_0 represents exactly (per block an fp16 scale d
    and integer quants with one at +-127, so ggml's quantizers give back d and the quants whatever their
    rounding), and y [cols, rows] as the kernels compute it: per block the int32 dot product, then
    acc = fma(float(dot), d_w * d_x, acc) in float32, blocks in order (the fma emulated in float64: the
    product is exact there, one rounding of the sum). One activation block is all zeros (scale 0)."""
    nb = k // 32

    def make(n: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        q = rng.integers(-127, 128, size=(n, nb, 32))
        q[:, :, 0] = np.where(rng.random((n, nb)) < 0.5, 127, -127)
        d = rng.uniform(0.002, 0.2, size=(n, nb)).astype(np.float16).astype(np.float32)
        return (q * d[:, :, None]).astype(np.float32).reshape(n, k), q, d

    w, wq, dw = make(rows)
    x, xq, dx = make(cols)
    x[0, :32], xq[0, 0], dx[0, 0] = 0.0, 0, 0.0
    acc = np.zeros((cols, rows), np.float32)
    for b in range(nb):
        dot = (xq[:, b].astype(np.int64) @ wq[:, b].T.astype(np.int64)).astype(np.float64)
        s = (dx[:, b][:, None] * dw[:, b][None, :]).astype(np.float32)  # float32 product, one rounding
        acc = (dot * s.astype(np.float64) + acc.astype(np.float64)).astype(np.float32)
    return w, x, acc


@needs_kernel
@pytest.mark.parametrize(
    ("rows", "k", "cols"),
    [
        (64, 1024, 1),  # decoder-like
        (67, 256, 3),  # rows not a multiple of the 8-row group
        (5, 800, 8),  # fewer rows than a group; 4 columns at a time; 8: AMX in a decode step
        (130, 96, 1),  # 3 blocks
        (9, 3072, 2),
        (3, 32, 1),  # one block, fewer rows than a group
        (40, 768, 11),  # 4 + 4 + 1 + 1 + 1 columns
    ],
)
@pytest.mark.parametrize("threads", [1, 2, 3])
def test_q8_0_matvec_is_the_gemms_arithmetic(rows: int, k: int, cols: int, threads: int) -> None:
    """Exactly the emulated arithmetic, bit for bit; the same bits as the encoder's GEMM (AMX or the int8
    GEMM: what a decode step of 8+ columns takes on AMX, and a prefill); ggml's numbers to rounding."""
    rng = np.random.default_rng(rows * 7 + k + cols)
    w, x, want = q8_0_exact_case(rng, rows, k, cols)
    ours = _core.eval_matmul("q8_0", w, x, threads=threads, path="decode")
    assert ours.shape == (cols, rows)
    np.testing.assert_array_equal(ours, want)
    w = rng.standard_normal((rows, k)).astype(np.float32)
    x = rng.standard_normal((cols, k)).astype(np.float32)
    ours = _core.eval_matmul("q8_0", w, x, threads=threads, path="decode")
    gemm = _core.eval_matmul("q8_0", w, x, threads=threads, path="encoder")
    np.testing.assert_array_equal(ours, gemm)
    ggml = _core.eval_matmul("q8_0", w, x, threads=threads, path="ggml")
    assert np.abs(ours - ggml).max() <= 1e-6 * max(np.abs(ggml).max(), 1.0)


@needs_kernel
@pytest.mark.parametrize(
    ("rows", "k", "cols"),
    [(64, 1024, 1), (67, 256, 3), (5, 768, 8), (9, 3072, 2), (1, 256, 1)],
)
@pytest.mark.parametrize("threads", [1, 2, 3])
def test_q6_k_matvec_is_bitwise_ggml(rows: int, k: int, cols: int, threads: int) -> None:
    _bitwise("q6_k", rows, k, cols, threads)


def _bitwise(wtype: str, rows: int, k: int, cols: int, threads: int) -> None:
    rng = np.random.default_rng(rows * 7 + k + cols)
    w = rng.standard_normal((rows, k)).astype(np.float32)
    x = rng.standard_normal((cols, k)).astype(np.float32)
    x[0, :32] = 0.0  # an all-zero activation block (scale 0)
    ours = _core.eval_matmul(wtype, w, x, threads=threads, path="decode")
    ggml = _core.eval_matmul(wtype, w, x, threads=threads, path="ggml")
    assert ours.shape == (cols, rows)
    np.testing.assert_array_equal(ours, ggml)
    exact = x.astype(np.float64) @ w.T.astype(np.float64)
    assert np.abs(ours - exact).max() <= 0.05 * np.abs(exact).max()  # quantized weights and activations


@needs_kernel
def test_more_columns_than_the_kernel_takes_still_match() -> None:
    rng = np.random.default_rng(1)
    w = rng.standard_normal((40, 256)).astype(np.float32)
    x = rng.standard_normal((9, 256)).astype(np.float32)  # 9 > 8: ggml's path, same numbers
    one_by_one = np.stack([_core.eval_matmul("q8_0", w, x[i : i + 1], path="decode")[0] for i in range(9)])
    np.testing.assert_array_equal(_core.eval_matmul("q8_0", w, x, path="decode"), one_by_one)


_MANY_COLUMNS = (
    "import sys, numpy as np; from fun_asr import _core\n"
    "sys.path.insert(0, sys.argv[1]); from test_kernels import q8_0_exact_case\n"
    "rng = np.random.default_rng(12); bad = []\n"
    "for wt, rows, k in [('q8_0', 72, 512), ('q8_0', 37, 96), ('q6_k', 40, 512)]:\n"
    "    w = rng.standard_normal((rows, k)).astype(np.float32)\n"
    "    for cols in (9, 64, 65, 167):\n"
    "        x = rng.standard_normal((cols, k)).astype(np.float32)\n"
    "        if wt == 'q8_0':\n"
    "            w, x, want = q8_0_exact_case(rng, rows, k, cols)\n"
    "        for t in (1, 2):\n"
    "            ref = _core.eval_matmul(wt, w, x, threads=t, path='ggml')\n"
    "            for p in ('decode', 'frames'):\n"
    "                got = _core.eval_matmul(wt, w, x, threads=t, path=p)\n"
    "                # Q8_0: the decode kernels' arithmetic (exact emulation), ggml's where ggml's GEMM runs\n"
    "                mine = wt == 'q8_0' and (p == 'decode' or not np.array_equal(got, ref))\n"
    "                if not np.array_equal(got, want if mine else ref):\n"
    "                    bad.append((wt, rows, k, cols, t, p))\n"
    "print(_core.matvec_isa(), bad)\n"
)


@needs_kernel
@pytest.mark.parametrize("matvec", ["", "avx2"], ids=["default", "avx2"])
def test_many_columns_are_bitwise_ggml(matvec: str) -> None:
    """Encoder frames and prefills (mul_mat_frames) take these kernels where they beat ggml's GEMM on the
    build (VNNI kernels: Q8_0 without VNNI in ggml, Q6_K): for any column count, split by rows (few columns) or by
    columns (32+ per thread: 64 columns on 2 threads, and an uneven 65), the bits are ggml_mul_mat's for Q6_K
    and, for Q8_0, the decode kernels' own (their exact emulation) or ggml's where ggml's GEMM runs. (With the
    int8 GEMM and AMX off: they take Q8_0 first, of any row count, see test_int8_gemm_* and test_amx_*.)"""
    env = {**os.environ, "FUN_ASR_GEMM": "0", "FUN_ASR_AMX": "0"}
    if matvec:
        env["FUN_ASR_MATVEC"] = matvec
    out = subprocess.run([sys.executable, "-c", _MANY_COLUMNS, os.path.dirname(__file__)], env=env,
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip().splitlines()[-1].endswith(" []"), out.stdout


@needs_kernel
def test_encoder_takes_the_kernels_where_ggml_has_no_fast_gemm(tiny_gguf) -> None:  # noqa: ANN001
    """The routing itself: a Q8_0 encoder's products show as GEMM_AMX where the CPU has AMX, else as
    GEMM_INT8 where the int8 GEMM runs (AVX2), else as MATVEC exactly when the kernels are the AVX-512 VNNI
    ones and ggml's CPU backend was built without VNNI dot products."""
    model = _core.load_gguf(str(tiny_gguf("q8_0")), device="cpu", threads=2)
    model.profiling = True
    model.encode(np.random.default_rng(0).standard_normal((40, model.info()["encoder"]["input_size"]))
                 .astype(np.float32))
    keys = [k for k in model.profile() if k.startswith("encode/")]
    feats = _core.system_info()["cpu_features"]
    ggml_vnni = feats.get("AVX512_VNNI") == "1" or feats.get("AVX_VNNI") == "1"
    routed = any(k.startswith("encode/MATVEC/enc.") for k in keys)
    int8 = any(k.startswith("encode/GEMM_INT8/enc.") for k in keys)
    if not _core.amx_available():  # (with AMX, matrices whose rows are not whole 16s may take the int8 GEMM)
        assert int8 == (_core.int8_gemm_isa() != ""), keys
    if _core.amx_available() or _core.int8_gemm_isa() or _core.matvec_isa() != "avx512vnni":
        assert not routed, keys
    else:
        assert routed == (not ggml_vnni), keys


def test_kernel_isa_is_reported() -> None:
    assert _core.matvec_isa() in {"", "avx2", "avxvnni", "avx512vnni"}
    assert _core.int8_gemm_isa() in {"", "avx2", "avxvnni", "avx512vnni"}


def test_eval_matmul_rejects_bad_shapes() -> None:
    with pytest.raises(ValueError, match="w must be"):
        _core.eval_matmul("q8_0", np.zeros((4, 64), np.float32), np.zeros((1, 32), np.float32))
    with pytest.raises(ValueError, match="multiple of 32"):
        _core.eval_matmul("q8_0", np.zeros((4, 48), np.float32), np.zeros((1, 48), np.float32))


@needs_kernel
@pytest.mark.parametrize("isa", [*NARROWER_ISAS, ""])
def test_each_code_path_is_exact_too(isa: str) -> None:
    """Each copy of the kernels this CPU runs, forced in a subprocess (avx2: what AVX2-only CPUs run;
    avxvnni: Intel's client cores; "": this CPU's own): Q8_0 decode products the exact emulation of their
    arithmetic at every column count (AMX off; from 3 columns VNNI CPUs take the int8 GEMM), Q6_K ggml's bits."""
    code = (
        "import sys, numpy as np; from fun_asr import _core\n"
        "sys.path.insert(0, sys.argv[1]); from test_kernels import q8_0_exact_case\n"
        "assert sys.argv[2] == '' or _core.matvec_isa() == sys.argv[2], _core.matvec_isa()\n"
        "rng = np.random.default_rng(5)\n"
        "for wt, rows, k, cols in [('q8_0', 67, 256, 3), ('q8_0', 5, 800, 8), ('q8_0', 130, 96, 1),\n"
        "                          ('q8_0', 19, 512, 9), ('q6_k', 67, 256, 3), ('q6_k', 5, 768, 8)]:\n"
        "    w = rng.standard_normal((rows, k)).astype(np.float32)\n"
        "    x = rng.standard_normal((cols, k)).astype(np.float32)\n"
        "    if wt == 'q8_0':\n"
        "        w, x, want = q8_0_exact_case(rng, rows, k, cols)\n"
        "    for t in (1, 2):\n"
        "        a = _core.eval_matmul(wt, w, x, threads=t, path='decode')\n"
        "        b = want if wt == 'q8_0' else _core.eval_matmul(wt, w, x, threads=t, path='ggml')\n"
        "        assert np.array_equal(a, b), (wt, rows, k, cols, t, np.abs(a - b).max())\n"
        "print('ok')\n"
    )
    env = {k: v for k, v in os.environ.items() if k not in ("FUN_ASR_MATVEC", "FUN_ASR_GEMM")}
    env["FUN_ASR_AMX"] = "0"
    if isa:
        env["FUN_ASR_MATVEC"] = isa
    out = subprocess.run([sys.executable, "-c", code, os.path.dirname(__file__), isa], env=env, capture_output=True,
                         text=True, timeout=120)
    assert out.returncode == 0 and out.stdout.strip() == "ok", out.stderr


def test_kernel_can_be_turned_off() -> None:
    code = "from fun_asr import _core; print(repr(_core.matvec_isa()))"
    env = {**os.environ, "FUN_ASR_MATVEC": "0"}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60)
    assert out.stdout.strip() == "''", out.stderr


@needs_kernel
@pytest.mark.parametrize(("rows", "k", "cols"),
                         [(64, 1024, 1), (72, 256, 3), (8, 2048, 2), (16, 3072, 1), (24, 512, 8), (8, 256, 11)])
@pytest.mark.parametrize("threads", [1, 2, 3])
def test_q4_k_repacked_matvec_matches_ggml(rows: int, k: int, cols: int, threads: int) -> None:
    """Q4_K in ggml's repacked layout: the same integer sums as ggml's GEMV, the float steps in another
    order, so equal to rounding (relative 1e-6 of the largest output)."""
    rng = np.random.default_rng(rows + k + cols)
    w = rng.standard_normal((rows, k)).astype(np.float32)
    x = rng.standard_normal((cols, k)).astype(np.float32)
    ours = _core.eval_matmul("q4_k", w, x, threads=threads, path="decode")
    ggml = _core.eval_matmul("q4_k", w, x, threads=threads, path="ggml")
    assert np.abs(ours - ggml).max() <= 1e-6 * np.abs(ggml).max()
    assert not np.array_equal(ours, _core.eval_matmul("q4_k", w, x * 1.01, threads=threads, path="decode"))


@needs_kernel
@pytest.mark.parametrize(("rows", "k", "cols"),
                         [(64, 1024, 2), (68, 256, 5), (16, 3072, 8), (32, 512, 13), (20, 2048, 3), (4, 16, 2)])
@pytest.mark.parametrize("wtype", ["f32", "f16"])
@pytest.mark.parametrize("threads", [1, 2, 3])
def test_fp_matvec_is_bitwise_ggml_from_two_columns(wtype: str, rows: int, k: int, cols: int, threads: int) -> None:
    """F32/F16 weights: ggml's tinyBLAS result for 2+ columns (F16 activations rounded to F16 as ggml does)."""
    rng = np.random.default_rng(rows + k + cols)
    w = rng.standard_normal((rows, k)).astype(np.float32)
    x = rng.standard_normal((cols, k)).astype(np.float32)
    ours = _core.eval_matmul(wtype, w, x, threads=threads, path="decode")
    np.testing.assert_array_equal(ours, _core.eval_matmul(wtype, w, x, threads=threads, path="ggml"))
    exact = x.astype(np.float64) @ w.T.astype(np.float64)
    assert np.abs(ours - exact).max() <= (1e-5 if wtype == "f32" else 2e-2) * np.abs(exact).max()


_INVARIANCE_CASES = [("f32", 64, 1024), ("f16", 36, 2048), ("f16", 7, 96), ("q8_0", 67, 256), ("q6_k", 40, 512),
                     ("q4_k", 72, 1024)]


def _columns_alone_and_together(path: str) -> list[str]:
    """Which weight types give a column different numbers alone and among 1..12 others (decode path)."""
    rng = np.random.default_rng(3)
    bad = []
    for wtype, rows, k in _INVARIANCE_CASES:
        w = rng.standard_normal((rows, k)).astype(np.float32)
        x = rng.standard_normal((12, k)).astype(np.float32)
        alone = np.stack([_core.eval_matmul(wtype, w, x[i : i + 1], threads=2, path=path)[0] for i in range(12)])
        for cols in (2, 3, 4, 5, 8, 12):
            if not np.array_equal(_core.eval_matmul(wtype, w, x[:cols], threads=2, path=path), alone[:cols]):
                bad.append(f"{wtype} x {cols}")
    return bad


@needs_kernel
def test_decode_columns_do_not_depend_on_their_neighbours() -> None:
    assert _columns_alone_and_together("decode") == []


_SUBPROCESS_INVARIANCE = (
    "import sys; sys.path.insert(0, {tests!r}); import test_kernels as t\n"
    "from fun_asr import _core\n"
    "assert _core.matvec_isa() == {isa!r}, _core.matvec_isa()\n"
    "print(t._columns_alone_and_together('decode'), t._columns_alone_and_together('ggml'))\n"
)


@pytest.mark.parametrize("matvec", ["0", "avx2"])
def test_decode_columns_are_invariant_on_every_path(matvec: str) -> None:
    """FUN_ASR_MATVEC=0 (ggml only: each column through ggml's one-column arithmetic) and the AVX2 kernels;
    plain ggml_mul_mat is not invariant (the reason for the decode path)."""
    if matvec == "avx2" and _core.matvec_isa() == "":
        pytest.skip("no AVX2 kernels on this CPU")
    code = _SUBPROCESS_INVARIANCE.format(tests=str(os.path.dirname(__file__)), isa="" if matvec == "0" else "avx2")
    env = {**os.environ, "FUN_ASR_MATVEC": matvec}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    decode, ggml = out.stdout.strip().splitlines()[-1].split("] [")
    assert decode == "[", decode
    assert "f16" in ggml and "f32" in ggml and "q4_k x 4" in ggml, ggml


@needs_kernel
def test_avx2_and_avx512_kernels_give_the_same_bits() -> None:
    code = (
        "import numpy as np, sys; from fun_asr import _core\n"
        "rng = np.random.default_rng(8); out = {}\n"
        "for wt in ['f32', 'f16', 'q8_0', 'q6_k', 'q4_k']:\n"
        "    w = rng.standard_normal((72, 1024)).astype(np.float32)\n"
        "    x = rng.standard_normal((7, 1024)).astype(np.float32)\n"
        "    out[wt] = _core.eval_matmul(wt, w, x, threads=2, path='decode')\n"
        "np.savez(sys.argv[1], **out)\n"
    )
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        runs = []
        for matvec in ("", *NARROWER_ISAS):
            env = {k: v for k, v in os.environ.items() if k not in ("FUN_ASR_MATVEC", "FUN_ASR_GEMM")}
            if matvec:
                env["FUN_ASR_MATVEC"] = matvec
            path = os.path.join(tmp, f"run{len(runs)}.npz")
            out = subprocess.run([sys.executable, "-c", code, path], env=env, capture_output=True, text=True,
                                 timeout=120)
            assert out.returncode == 0, out.stderr
            runs.append(dict(np.load(path)))
        for run in runs[1:]:
            for wt in runs[0]:
                np.testing.assert_array_equal(runs[0][wt], run[wt], err_msg=wt)


needs_amx = pytest.mark.skipif(not _core.amx_available(), reason="no Intel AMX on this CPU/OS")


@needs_amx
@pytest.mark.parametrize(("rows", "k", "cols"),
                         [(64, 1024, 16), (32, 512, 167), (16, 2048, 17), (2048, 512, 40), (48, 256, 1), (16, 96, 5)])
@pytest.mark.parametrize("threads", [1, 2, 3])
def test_amx_gemm_matches_ggml(rows: int, k: int, cols: int, threads: int) -> None:
    """The encoder's AMX Q8_0 GEMM: ggml's integer terms and scales, summed in another order."""
    rng = np.random.default_rng(rows + k + cols)
    w = rng.standard_normal((rows, k)).astype(np.float32)
    x = rng.standard_normal((cols, k)).astype(np.float32)
    x[min(3, cols - 1), :64] = 0.0
    ours = _core.eval_matmul("q8_0", w, x, threads=threads, path="frames")
    ggml = _core.eval_matmul("q8_0", w, x, threads=threads, path="ggml")
    assert ours.shape == (cols, rows)
    assert np.abs(ours - ggml).max() <= 1e-6 * np.abs(ggml).max()
    assert not np.array_equal(ours, ggml) or rows * cols < 400  # really another path (sums differ in the last bits)


@needs_amx
def test_amx_columns_do_not_depend_on_their_neighbours() -> None:
    """A prefill's numbers must be the same alone or in a batch: each column of the AMX GEMM is
    computed the same way whatever the other columns and their count."""
    rng = np.random.default_rng(4)
    w = rng.standard_normal((64, 512)).astype(np.float32)
    x = rng.standard_normal((37, 512)).astype(np.float32)
    together = _core.eval_matmul("q8_0", w, x, threads=2, path="frames")
    for lo, hi in [(0, 1), (5, 9), (16, 37), (30, 37)]:
        np.testing.assert_array_equal(_core.eval_matmul("q8_0", w, x[lo:hi], threads=2, path="frames"), together[lo:hi])


needs_int8_gemm = pytest.mark.skipif(_core.int8_gemm_isa() == "", reason="no AVX2: the int8 GEMM does not run here")


_ROW_TAILS_CHILD = (
    "import sys, numpy as np\n"
    "from fun_asr import _core\n"
    "wtype, rows, threads = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])\n"
    "rng = np.random.default_rng(rows)\n"
    "w = rng.standard_normal((48, 256)).astype(np.float32)\n"
    "x = rng.standard_normal((20, 256)).astype(np.float32)\n"
    "ours = _core.eval_matmul(wtype, w[:rows], x, threads=threads, path='encoder')\n"
    "whole = _core.eval_matmul(wtype, w, x, threads=threads, path='encoder')\n"
    "ggml = _core.eval_matmul(wtype, w[:rows], x, threads=threads, path='ggml')\n"
    "rel = float(np.abs(ours - ggml).max() / np.abs(ggml).max())\n"
    "print(int(np.array_equal(ours, whole[:, :rows])), int(np.array_equal(ours, ggml)), rel, _core.amx_available())\n"
)


@needs_int8_gemm
@pytest.mark.parametrize("amx", ["1", "0"])
@pytest.mark.parametrize(("wtype", "rows"), [("q8_0", 3), ("q8_0", 13), ("q8_0", 36), ("q8_0", 45), ("q6_k", 5),
                                             ("q6_k", 45)])
def test_gemm_rows_past_the_last_whole_tile(amx: str, wtype: str, rows: int) -> None:
    """Row counts that are not whole 16-row tiles (AMX) or 8-row groups (the int8 GEMM) -- the CTC head's
    60,515-label output -- stay on the GEMMs: the last partial tile is zero-padded and each of its rows gets the
    numbers it gets inside a whole tile, bit for bit (1 to 3 threads; AMX on and off)."""
    for threads in (1, 2, 3):
        out = subprocess.run([sys.executable, "-c", _ROW_TAILS_CHILD, wtype, str(rows), str(threads)],
                             env={**os.environ, "FUN_ASR_AMX": amx}, capture_output=True, text=True, check=True)
        same_as_whole, same_as_ggml, rel, _ = out.stdout.split()
        assert same_as_whole == "1", (wtype, rows, threads, out.stdout)
        assert same_as_ggml == "0"  # really the GEMM, not ggml's path
        assert float(rel) <= (1e-6 if wtype == "q8_0" else 3e-2), out.stdout



def _dequantized(wtype: str, w: np.ndarray) -> np.ndarray:
    """ggml's dequantized weights [n, k] (float64): w times the identity on ggml's path. A one-hot column
    quantizes to the quant 127 (Q8_K for K-quant weights: -127) times a scale of 1/127, fp16 in Q8_0 (the
    product 127 * fp16(1/127) is taken off) and float32 in Q8_K: the dequantization to ~1e-7."""
    eye = np.eye(w.shape[1], dtype=np.float32)
    one = 127.0 * float(np.float16(np.float32(1) / np.float32(127))) if wtype == "q8_0" else 1.0
    return _core.eval_matmul(wtype, w, eye, path="ggml").T.astype(np.float64) / one


def _q8_0(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """ggml's Q8_0 quantization of rows x [m, k]: quants [m, k] and the fp16 scale of each 32-block [m, k/32]."""
    blocks = x.reshape(x.shape[0], -1, 32).astype(np.float32)
    d = np.abs(blocks).max(axis=2) / np.float32(127)
    inv = np.where(d > 0, np.float32(1) / np.where(d > 0, d, 1), 0).astype(np.float32)
    q = np.rint(blocks * inv[:, :, None])
    return q.reshape(x.shape), d.astype(np.float16).astype(np.float64)


@needs_int8_gemm
@pytest.mark.parametrize("wtype", ["q8_0", "q4_k", "q6_k"])
@pytest.mark.parametrize(("rows", "k", "cols"), [(24, 256, 7), (40, 512, 13), (16, 256, 1), (64, 1024, 167)])
@pytest.mark.parametrize("threads", [1, 2, 3])
def test_int8_gemm_is_the_sum_of_its_integer_terms(wtype: str, rows: int, k: int, cols: int, threads: int) -> None:
    """The int8 GEMM (csrc/kernels/gemm_avx2: encoder, adaptor, prefill) computes, per 32-block, ggml's
    dequantized weights times the Q8_0-quantized activation: checked against that sum in float64 (rows of odd
    and even 8-row group counts, column tails of 1-3, 1 to 3 threads). For Q8_0 it is ggml's GEMM to rounding;
    Q4_K and Q6_K have ggml's weights but finer activation scales than ggml's Q8_K (per 32, not per 256)."""
    rng = np.random.default_rng(rows * 7 + k + cols)
    w = rng.standard_normal((rows, k)).astype(np.float32)
    x = rng.standard_normal((cols, k)).astype(np.float32)
    x[min(3, cols - 1), :64] = 0.0  # all-zero activation blocks (scale 0)
    ours = _core.eval_matmul(wtype, w, x, threads=threads, path="encoder").astype(np.float64)
    q, d = _q8_0(x)
    wd = _dequantized(wtype, w).reshape(rows, -1, 32)
    ref = np.einsum("mbi,nbi,mb->mn", q.reshape(cols, -1, 32), wd, d)
    assert np.abs(ours - ref).max() <= 2e-5 * np.abs(ref).max(), np.abs(ours - ref).max() / np.abs(ref).max()
    ggml = _core.eval_matmul(wtype, w, x, threads=threads, path="ggml")
    if wtype == "q8_0":
        assert np.abs(ours - ggml).max() <= 1e-6 * np.abs(ggml).max()
    else:  # ggml's Q8_K activations: the same weights, coarser activation rounding
        assert np.abs(ours - ggml).max() <= 3e-2 * np.abs(ggml).max()
    assert not np.array_equal(ours, ggml)  # really another path


@needs_int8_gemm
@pytest.mark.parametrize("wtype", ["q4_k", "q6_k"])
@pytest.mark.parametrize("sign", [1.0, -1.0])
def test_int8_gemm_k_quant_extreme_sums_are_exact(wtype: str, sign: float) -> None:
    """On plain AVX2 the K-quants' u8 x s8 products (vpmaddubsw) are added in int16: exact only while
    Q4_K's 16 * 15 * 127 = 30480 and Q6_K's 4 * 63 * 127 = 32004 stay under 2^15. Quants at the top of
    their range everywhere against activations quantized to +-127 (a constant column) come as close to that
    bound as the data can: the sum must still be the exact one."""
    rng = np.random.default_rng(3)
    rows, k = 16, 512
    w = rng.uniform(0.9, 1.0, (rows, k)).astype(np.float32)
    w[:, ::32] = 0.0  # Q4_K: each block's minimum 0, the other quants at 14-15 (Q6_K: 60-63)
    x = np.full((3, k), sign, dtype=np.float32)
    x[1, ::2] *= 0.5  # some quants at +-64 too
    ours = _core.eval_matmul(wtype, w, x, threads=1, path="encoder").astype(np.float64)
    q, d = _q8_0(x)
    wd = _dequantized(wtype, w).reshape(rows, -1, 32)
    ref = np.einsum("mbi,nbi,mb->mn", q.reshape(3, -1, 32), wd, d)
    assert np.abs(q).max() == 127
    assert np.abs(ours - ref).max() <= 2e-5 * np.abs(ref).max(), np.abs(ours - ref).max() / np.abs(ref).max()


@needs_int8_gemm
@pytest.mark.parametrize("wtype", ["q8_0", "q4_k", "q6_k"])
def test_int8_gemm_columns_do_not_depend_on_their_neighbours(wtype: str) -> None:
    """A prefill's numbers are the same alone or in a batch: each column of the int8 GEMM is computed the
    same way whatever the other columns, their count, and the tile a column falls in."""
    rng = np.random.default_rng(5)
    w = rng.standard_normal((48, 512)).astype(np.float32)
    x = rng.standard_normal((37, 512)).astype(np.float32)
    together = _core.eval_matmul(wtype, w, x, threads=2, path="encoder")
    for lo, hi in [(0, 1), (5, 9), (16, 37), (30, 37), (1, 3)]:
        np.testing.assert_array_equal(_core.eval_matmul(wtype, w, x[lo:hi], threads=2, path="encoder"), together[lo:hi])


_INT8_BITS = (
    "import sys, numpy as np; from fun_asr import _core\n"
    "rng = np.random.default_rng(9); out = {}\n"
    "for wt in ('q8_0', 'q4_k', 'q6_k'):\n"
    "    w = rng.standard_normal((40, 768)).astype(np.float32)\n"
    "    x = rng.standard_normal((11, 768)).astype(np.float32)\n"
    "    out[wt] = _core.eval_matmul(wt, w, x, threads=2, path='encoder')\n"
    "np.savez(sys.argv[1], isa=_core.int8_gemm_isa(), **out)\n"
)


@needs_int8_gemm
def test_int8_gemm_avx2_and_vnni_give_the_same_bits(tmp_path) -> None:  # noqa: ANN001
    """The plain AVX2 copy (vpmaddwd / vpmaddubsw + adds; FUN_ASR_GEMM=avx2) and the VNNI one (vpdpwssd /
    vpdpbusd; AVX-512's or AVX-VNNI's encodings, FUN_ASR_GEMM=avxvnni where the CPU has it) sum the same integers:
    the same bits. FUN_ASR_GEMM=0 turns the kernel off (ggml's GEMM, bit for bit)."""
    runs = {}
    for gemm in ("", *NARROWER_ISAS, "0"):
        path = tmp_path / f"{gemm or 'auto'}.npz"
        env = {**os.environ, "FUN_ASR_GEMM": gemm, "FUN_ASR_AMX": "0"}  # AMX takes Q8_0 of any row count
        env.pop("FUN_ASR_MATVEC", None)
        out = subprocess.run([sys.executable, "-c", _INT8_BITS, str(path)], env=env, capture_output=True, text=True,
                             timeout=120)
        assert out.returncode == 0, out.stderr
        runs[gemm] = dict(np.load(path))
    assert str(runs["avx2"]["isa"]) == "avx2" and str(runs["0"]["isa"]) == ""
    assert "avxvnni" not in runs or str(runs["avxvnni"]["isa"]) == "avxvnni"
    for wt in ("q8_0", "q4_k", "q6_k"):
        for isa in NARROWER_ISAS:
            np.testing.assert_array_equal(runs[""][wt], runs[isa][wt], err_msg=f"{wt} {isa}")
        assert not np.array_equal(runs[""][wt], runs["0"][wt]), wt
    rng = np.random.default_rng(9)
    w = rng.standard_normal((40, 768)).astype(np.float32)
    x = rng.standard_normal((11, 768)).astype(np.float32)
    if _core.amx_available():
        return  # this process's Q8_0 products are AMX's
    np.testing.assert_array_equal(runs["0"]["q8_0"], _core.eval_matmul("q8_0", w, x, threads=2, path="ggml"))


_WIDE_BITS = (
    "import json, sys, numpy as np; from fun_asr import _core\n"
    "rng = np.random.default_rng(13); out = {'bits': _core.int8_gemm_vector_bits()}\n"
    "for wt, path in (('q8_0', 'encoder'), ('q8_0', 'frames'), ('q8_0', 'decode'), ('q4_k', 'encoder'),\n"
    "                 ('q6_k', 'encoder')):\n"
    "    for rows in (8, 16, 24, 40, 48, 96):\n"
    "        w = rng.standard_normal((rows, 256)).astype(np.float32)\n"
    "        for cols in (1, 2, 3, 4, 5, 7, 9, 11, 13):\n"
    "            x = rng.standard_normal((cols, 256)).astype(np.float32)\n"
    "            for threads in (1, 2, 3):\n"
    "                y = _core.eval_matmul(wt, w, x, threads=threads, path=path)\n"
    "                out[f'{wt} {path} {rows} {cols} {threads}'] = y.tobytes().hex()\n"
    "print(json.dumps(out))\n"
)


@pytest.mark.skipif(_core.int8_gemm_vector_bits() != 512 or _core.amx_available(),
                    reason="the 512-bit Q8_0 tiles run on AVX-512 VNNI CPUs without AMX")
def test_int8_gemm_512_bit_tiles_give_the_256_bit_bits(wide_gguf, tmp_path) -> None:  # noqa: ANN001
    """On AVX-512 the Q8_0, Q4_K and Q6_K tiles take 16 rows per vector (Q8_0's quads layout in 16-row groups)
    with each lane's integer and float steps unchanged: bit for bit the 256-bit tiles (FUN_ASR_ZMM=0), for plain
    matrices (the encoder path, unpacked per product; rows of odd 8-row group counts end on a 256-bit group),
    ggml's repacked Q4_K, Q8_0 matrices kept in the layout (prefill and decode paths), column tails of every
    size, 1 to 3 threads; and a whole model's encoder output, prefill and decode logits (the encoder's,
    adaptor's and decoder's matrices kept in the layout, the tied embedding's rows looked up in it; the encoder's
    attention in 512-bit vectors too, 1-8 query rows per task, key pairs with a tail)."""
    def child(code: str, *args: str, zmm: str | None) -> dict:
        env = {k: v for k, v in os.environ.items() if k not in ("FUN_ASR_ZMM", "FUN_ASR_GEMM", "FUN_ASR_MATVEC")}
        env["FUN_ASR_AMX"] = "0"
        if zmm is not None:
            env["FUN_ASR_ZMM"] = zmm
        out = subprocess.run([sys.executable, "-c", code, *args], env=env, capture_output=True, text=True, timeout=300)
        assert out.returncode == 0, out.stderr
        return json.loads(out.stdout.strip().splitlines()[-1])

    wide, narrow = child(_WIDE_BITS, zmm=None), child(_WIDE_BITS, zmm="0")
    assert wide.pop("bits") == 512 and narrow.pop("bits") == 256
    assert wide.keys() == narrow.keys()
    for key in wide:
        assert wide[key] == narrow[key], key
    path = str(wide_gguf("q8_0"))
    model_wide, model_narrow = child(_MODEL_BITS, path, zmm=None), child(_MODEL_BITS, path, zmm="0")
    assert model_wide == model_narrow
    # the encoder's and adaptor's matrices are kept in the layout too, not only the decoder's
    assert model_wide["quads"] > model_wide["decoder_matrices"]


_HUGE_PAGES = (
    "import json, sys, fun_asr\n"
    "def huge():\n"
    "    return sum(int(l.split()[1]) for l in open('/proc/self/smaps_rollup') if l.startswith('AnonHugePages:'))\n"
    "before = huge()\n"
    "m = fun_asr.load_model(sys.argv[1], threads=1)\n"
    "info = m.info()\n"
    "print(json.dumps({'kib': huge() - before, 'held': info['q8_0_quads_tensors'] + info['repacked_tensors']}))\n"
)


def _thp_mode(name: str) -> str | None:
    try:
        text = Path(f"/sys/kernel/mm/transparent_hugepage/{name}").read_text()
    except OSError:
        return None
    return text.split("[", 1)[1].split("]", 1)[0] if "[" in text else None


@pytest.mark.skipif(_thp_mode("enabled") not in ("madvise", "always") or _thp_mode("defrag") == "never",
                    reason="transparent huge pages off (or never defragmented) on this machine")
def test_weights_the_process_holds_sit_in_huge_pages(wide_gguf) -> None:  # noqa: ANN001
    """The matrices copied into this process's memory at load (Q8_0 re-laid out for the int8 GEMM, ggml's
    repacked Q4_K) are madvised for transparent huge pages before they are written: the decode step streams
    them whole, and with 4 KiB pages every page is a TLB miss. FUN_ASR_THP=0 leaves the pages alone."""
    def child(path: str, thp: str | None) -> dict:
        env = {k: v for k, v in os.environ.items() if k != "FUN_ASR_THP"}
        if thp is not None:
            env["FUN_ASR_THP"] = thp
        out = subprocess.run([sys.executable, "-c", _HUGE_PAGES, path], env=env, capture_output=True, text=True,
                             timeout=300)
        assert out.returncode == 0, out.stderr
        return json.loads(out.stdout.strip().splitlines()[-1])

    # Q8_0 where the quads layout is kept (the int8 GEMM runs, no AMX), else Q4_K_M's repacked Q4_K
    for package in ("q8_0", "q4_k_m"):
        on = child(str(wide_gguf(package)), None)
        if on["held"]:
            break
    else:
        pytest.skip("this CPU keeps no re-laid-out copy of the weights")
    assert on["kib"] >= 2048, on  # at least one 2 MiB page
    if _thp_mode("enabled") == "madvise":  # "always" gives huge pages to every large mapping anyway
        off = child(str(wide_gguf(package)), "0")
        assert off["kib"] == 0, off


_MODEL_BITS = (
    "import hashlib, json, sys, numpy as np, fun_asr\n"
    "m = fun_asr.load_model(sys.argv[1], threads=2)\n"
    "m.logit_digests = True\n"
    "rng = np.random.default_rng(17)\n"
    "info = m.info()\n"
    "out = {'quads': info['q8_0_quads_tensors'], 'decoder_matrices': 7 * info['decoder']['n_layers'] + 2}\n"
    "for T in (1, 7, 13, 40):\n"
    "    feats = rng.standard_normal((T, info['encoder']['input_size'])).astype(np.float32)\n"
    "    out[f'enc {T}'] = hashlib.sha256(np.asarray(m.encode(feats)).tobytes()).hexdigest()\n"
    "emb = [np.ascontiguousarray(m.embed(rng.integers(0, 1000, n).tolist())) for n in (9, 23, 40)]\n"
    "for name, batch in (('one', emb[:1]), ('three', emb)):\n"
    "    gens = m.generate_batch(batch, 6, [])\n"
    "    out[name] = [[list(t) for t, _ in gens], m.last_logit_digests()]\n"
    "print(json.dumps(out))\n"
)


def test_amx_can_be_turned_off() -> None:
    code = "from fun_asr import _core; print(_core.amx_available())"
    env = {**os.environ, "FUN_ASR_AMX": "0"}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60)
    assert out.stdout.strip() == "False", out.stderr


def test_bench_matvec_chunks_runs_and_checks_arguments() -> None:
    assert _core.bench_matvec_chunks("q8_0", 256, 64, 64, threads=1, repeats=1) > 0
    assert _core.bench_matvec_chunks("q6_k", 256, 256, 128, threads=2, repeats=1, path="ggml") > 0
    with pytest.raises(ValueError, match="multiple of chunk_rows"):
        _core.bench_matvec_chunks("q8_0", 100, 64, 64)
    with pytest.raises(ValueError, match="path must be"):
        _core.bench_matvec_chunks("q8_0", 128, 64, 64, path="fast")


_ENCODE_CODE = (
    "import sys, numpy as np\n"
    "from fun_asr import _core\n"
    "m = _core.load_gguf(sys.argv[1], device='cpu', threads=2)\n"
    "m.profiling = True\n"
    "outs = [m.encode(np.random.default_rng(T).standard_normal((T, 560)).astype(np.float32))\n"
    "        for T in map(int, sys.argv[3:])]\n"
    "p = m.profile()\n"
    "np.savez(sys.argv[2], *outs, kinds=np.array(sorted(p)), counts=np.array([p[k]['count'] for k in sorted(p)]))\n"
)


def _encode_in_child(path: str, out, lengths: list[str], env_set: dict[str, str | None]) -> dict:  # noqa: ANN001
    env = {k: v for k, v in os.environ.items() if k not in ("FUN_ASR_FSMN", "FUN_ASR_FUSE", "FUN_ASR_ATTN")}
    env.update({k: v for k, v in env_set.items() if v is not None})
    r = subprocess.run([sys.executable, "-c", _ENCODE_CODE, path, str(out), *lengths], env=env, capture_output=True,
                       text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    return dict(np.load(out))


@pytest.mark.parametrize("package", ["f32", "q8_0", "q4_k_m"])
def test_fused_bias_and_residual_tails_are_bitwise_the_plain_graph(package: str, wide_gguf, tmp_path) -> None:  # noqa: ANN001
    """The encoder's and adaptor's fused tails (kernels/fused_add: relu(y + b), x + (y + b), a LayerNorm with its
    y * w + b;
    the FSMN op with the output projection's bias and the residual) give the plain graph's bits (FUN_ASR_FUSE=0),
    and run."""
    lengths = ["1", "41", "167"]
    path = str(wide_gguf(package))
    fused = _encode_in_child(path, tmp_path / "fused.npz", lengths, {})
    plain = _encode_in_child(path, tmp_path / "plain.npz", lengths, {"FUN_ASR_FUSE": "0"})
    def count(run: dict, kind: str) -> int:
        return int(sum(c for k, c in zip(run["kinds"], run["counts"], strict=True) if k == kind))

    amx = any(str(k).startswith("encode/GEMM_AMX/") for k in fused["kinds"])
    if amx and not any(str(k).startswith("encode/GEMM_INT8/") for k in fused["kinds"]):
        # the AMX GEMM adds the bias itself (kernels/amx): the ReLU after it stays a ggml node in both graphs
        # (with some products on the int8 GEMM - Q4_K_M's short inputs and Q6_K layers - those ReLUs are fused)
        assert count(plain, "encode/RELU") == count(fused, "encode/RELU") > 0
    else:
        assert count(plain, "encode/RELU") > count(fused, "encode/RELU")  # the ReLUs went into the fused ops
    assert count(plain, "encode/ADD") > count(fused, "encode/ADD")
    assert count(plain, "encode/MUL") > count(fused, "encode/MUL")  # the LayerNorms' scale and shift
    assert count(plain, "encode/NORM") > count(fused, "encode/NORM")  # and the LayerNorms themselves
    for i in range(len(lengths)):
        assert fused[f"arr_{i}"].tobytes() == plain[f"arr_{i}"].tobytes(), f"T={lengths[i]}"


@pytest.mark.parametrize("threads", [1, 2, 3])
def test_fused_layer_norm_is_ggml_norm_bit_for_bit(threads: int) -> None:
    """The fused LayerNorm node (kernels/fused_add: each row's double sum in element order, 8 rows at once a row per
    double lane, ggml's own centred variance, the scale, then y * w + b) gives ggml_norm -> ggml_mul -> ggml_add's
    bits: rows of every count around the 8-row groups, widths with and without a 4-element tail, values over 60
    binary orders of magnitude, rows whose large values cancel with small ones between them (where the order of
    a double sum shows) and constant rows (variance 0)."""
    rng = np.random.default_rng(21)
    for n in (1, 3, 4, 5, 17, 64, 512, 515):
        for T in (1, 7, 8, 9, 16, 17, 33):
            x = rng.standard_normal((T, n)).astype(np.float32)
            x *= np.exp2(rng.integers(-30, 30, (T, n))).astype(np.float32)
            x[0] = 0.25  # a constant row
            if T > 1:  # big values that cancel with small ones between them: the order of the adds shows
                x[-1] = np.resize(np.array([2.0**60, 1.0, -(2.0**60), 3.0, 0.5], np.float32), n)
            w = rng.standard_normal(n).astype(np.float32)
            # (a zero shift too: a shift of ~1 would hide the small outputs, where a different mean shows)
            for b, eps in ((rng.standard_normal(n).astype(np.float32), 1e-5), (np.zeros(n, np.float32), 1e-12)):
                fused = _core.eval_layer_norm(x, w, b, eps=eps, threads=threads, fused=True)
                plain = _core.eval_layer_norm(x, w, b, eps=eps, threads=threads, fused=False)
                assert fused.tobytes() == plain.tobytes(), (n, T, eps)
    with pytest.raises(ValueError, match="x must be"):
        _core.eval_layer_norm(np.zeros((2, 3), np.float32), np.zeros(4, np.float32), np.zeros(3, np.float32))


def _encoder_vs_ggml_to_rounding(gguf: str, tmp_path, lengths: list[str], switch: str, node: str,  # noqa: ANN001
                                 what: str) -> list[tuple[np.ndarray, np.ndarray]]:
    """Encoder outputs for each length with our op (``switch`` unset) and with ggml's graph (``switch=ggml``):
    ggml's run has ``node``, ours has none (the op really ran), and each output is equal to rounding (< 1e-5
    relative). Returns the (ours, ggml's) pairs."""
    ours = _encode_in_child(gguf, tmp_path / "ours.npz", lengths, {switch: None})
    ggml = _encode_in_child(gguf, tmp_path / "ggml.npz", lengths, {switch: "ggml"})
    assert node in set(ggml["kinds"]) and node not in set(ours["kinds"])
    pairs = []
    for i, T in enumerate(lengths):
        a, b = ours[f"arr_{i}"], ggml[f"arr_{i}"]
        assert a.shape == b.shape == (int(T), a.shape[1]) and np.isfinite(a).all()
        err = float(np.abs(a - b).max() / np.abs(b).max())
        assert err < 1e-5, f"T={T}: {what} differs from ggml's by {err:.2e} (relative)"
        pairs.append((a, b))
    return pairs


def test_fused_fsmn_memory_equals_the_plain_graph_to_rounding(wide_gguf, tmp_path) -> None:  # noqa: ANN001
    """The SAN-M layers' FSMN memory (depthwise conv over time + v + the attention output) as one fused op
    against ggml's transpose, pad, ssm_conv and adds (FUN_ASR_FSMN=ggml): equal to rounding for sequences
    shorter than the kernel, odd and longer ones (every tap's padding edge), and the fused op really ran."""
    _encoder_vs_ggml_to_rounding(str(wide_gguf("f32")), tmp_path, ["1", "4", "41", "167"], "FUN_ASR_FSMN",
                                 "encode/SSM_CONV", "the fused FSMN memory")


@pytest.mark.skipif(_core.matvec_isa() == "", reason="no AVX2: the attention kernel does not run here")
def test_encoder_attention_equals_flash_attention_to_rounding(wide_gguf, tmp_path) -> None:  # noqa: ANN001
    """The encoder's unmasked attention (kernels/attention: scores 4 keys at a time, two-pass softmax with a
    polynomial exp, P V in 2 x 32 tiles) against ggml's flash attention (FUN_ASR_ATTN=ggml): equal to rounding
    for one frame, fewer than 4 keys, odd counts (the single-row and key tails) and a 10 s clip's 167, and the
    kernel really ran (no FLASH_ATTN_EXT node in the encoder)."""
    lengths = ["1", "3", "6", "41", "167"]
    pairs = _encoder_vs_ggml_to_rounding(str(wide_gguf("f32")), tmp_path, lengths, "FUN_ASR_ATTN",
                                         "encode/FLASH_ATTN_EXT", "the attention kernel")
    for T, (a, b) in zip(lengths, pairs, strict=True):
        assert T == "1" or not np.array_equal(a, b)  # really another path



_DECODE_CODE = (
    "import sys, numpy as np, fun_asr\n"
    "m = fun_asr.load_model(sys.argv[1], threads=2)\n"
    "m.profiling = True\n"
    "rng = np.random.default_rng(0)\n"
    "outs = []\n"
    "for n, steps in ((1, 3), (40, 20), (530, 3)):\n"
    "    outs.append(np.asarray(m.prefill(np.ascontiguousarray(m.embed(rng.integers(0, 1000, n).tolist())))))\n"
    "    outs += [np.asarray(m.step(int(t))) for t in rng.integers(0, 1000, steps)]\n"
    "p = m.profile()\n"
    "np.savez(sys.argv[2], np.stack(outs), kinds=np.array(sorted(p)))\n"
)


@pytest.mark.skipif(_core.matvec_isa() == "", reason="no AVX2: the attention kernel does not run here")
def test_decoder_attention_equals_flash_attention_to_rounding(wide_gguf, tmp_path) -> None:  # noqa: ANN001
    """The decoder's attention over its KV cache (kernels/attention, cached_attention: each GQA pair of query
    heads against the keys its mask leaves visible) against ggml's flash attention (FUN_ASR_ATTN=ggml): the
    logits of prefills of 1, 40 and 530 positions (ggml splits a lone row's keys over its threads from 512)
    and of the decode steps after them equal to rounding, and the op really ran in both stages."""
    path = str(wide_gguf("f32"))
    runs = {}
    for name, attn in (("ours", None), ("ggml", "ggml")):
        env = {k: v for k, v in os.environ.items() if k != "FUN_ASR_ATTN"}
        if attn:
            env["FUN_ASR_ATTN"] = attn
        out = tmp_path / f"{name}.npz"
        r = subprocess.run([sys.executable, "-c", _DECODE_CODE, path, str(out)], env=env, capture_output=True,
                           text=True, timeout=300)
        assert r.returncode == 0, r.stderr
        runs[name] = dict(np.load(out))
    ours, ggml = runs["ours"], runs["ggml"]
    for stage in ("prefill", "decode"):
        assert f"{stage}/ATTN" in set(ours["kinds"]) and f"{stage}/FLASH_ATTN_EXT" not in set(ours["kinds"])
        assert f"{stage}/FLASH_ATTN_EXT" in set(ggml["kinds"]) and f"{stage}/ATTN" not in set(ggml["kinds"])
    a, b = ours["arr_0"], ggml["arr_0"]
    assert a.shape == b.shape == (29, a.shape[1]) and np.isfinite(a).all()
    for i in range(len(a)):
        err = float(np.abs(a[i] - b[i]).max() / np.abs(b[i]).max())
        assert err < 1e-5, f"logits row {i}: the attention op differs from ggml's by {err:.2e} (relative)"
    assert not np.array_equal(a, b)  # really another path


@needs_kernel
@pytest.mark.parametrize("package", ["q8_0", "q4_k_m"])
def test_prefill_output_projection_takes_the_decode_step_path(package: str, wide_gguf) -> None:  # noqa: ANN001
    """A prefill needs the logits of each sequence's last position only: the (vocabulary-sized) output
    projection of those few columns runs as a decode step (mat-vec kernels, at read bandwidth), not through
    the many-column GEMMs the prefill's other products take; alone and in a batch alike. (A Q8_0 output
    matrix kept in the int8 GEMM's quads layout takes that kernel for any column count.)"""
    m = fun_asr.load_model(wide_gguf(package), threads=2)
    step_kernel = "prefill/GEMM_INT8/" if m.info()["q8_0_quads_tensors"] else "prefill/MATVEC/"
    rng = np.random.default_rng(0)
    prompts = [np.ascontiguousarray(m.embed(rng.integers(0, 1000, n).tolist())) for n in (40, 33)]
    m.profiling = True
    for batch in ([prompts[0]], prompts):
        m.reset_profile()
        m.generate_batch(batch, 1, [])
        keys = [k for k in m.profile() if k.startswith("prefill/")]
        out = [k for k in keys if k.endswith(("/token_embd", "/output"))]
        assert out and all(k.startswith(step_kernel) for k in out), keys
        assert any(k.startswith(("prefill/GEMM_", "prefill/MUL_MAT/")) for k in keys), keys  # the others do not


@needs_int8_gemm
def test_prefill_k_quants_take_the_int8_gemm_without_amx(wide_gguf) -> None:  # noqa: ANN001
    """The routing of a Q4_K_M prefill's Q4_K / Q6_K products: the int8 GEMM where it runs without AMX
    (AVX2 or VNNI: about twice ggml's K-quant GEMM on AVX2 from ~12 columns, 1.3x / 2.3x ggml's AVX-512
    paths at 40 on Zen 4), ggml's own paths on AMX CPUs; the same for any prompt length (never chosen by
    column count), alone and in a batch."""
    m = fun_asr.load_model(wide_gguf("q4_k_m"), threads=2)
    rng = np.random.default_rng(0)
    no_amx = _core.int8_gemm_isa() != "" and not _core.amx_available()
    m.profiling = True
    for lengths in ([40], [3], [40, 5]):
        prompts = [np.ascontiguousarray(m.embed(rng.integers(0, 1000, n).tolist())) for n in lengths]
        m.reset_profile()
        m.generate_batch(prompts, 1, [])
        keys = [k for k in m.profile() if k.startswith("prefill/") and k.endswith(("/ffn_gate", "/attn_q"))]
        assert keys, m.profile().keys()
        if no_amx:
            assert all(k.startswith("prefill/GEMM_INT8/") for k in keys), keys
        else:
            assert not any(k.startswith("prefill/GEMM_INT8/") for k in keys), keys


_Q4K_ENCODER_BITS = (
    "import sys, numpy as np; from fun_asr import _core\n"
    "rng = np.random.default_rng(11); out = {'amx': _core.amx_available()}\n"
    "for i, (n, k, m) in enumerate([(64, 1024, 37), (32, 512, 167), (16, 256, 1), (48, 768, 17)]):\n"
    "    w = rng.standard_normal((n, k)).astype(np.float32)\n"
    "    x = rng.standard_normal((m, k)).astype(np.float32)\n"
    "    x[0, :64] = 0.0\n"
    "    for t in (1, 2, 3):\n"
    "        out[f'{i}-{t}'] = _core.eval_matmul('q4_k', w, x, threads=t, path='encoder')\n"
    "np.savez(sys.argv[1], **out)\n"
)


@needs_amx
@needs_int8_gemm
def test_amx_q4_k_encoder_gemm_gives_the_int8_gemms_bits(tmp_path) -> None:  # noqa: ANN001
    """The encoder's Q4_K products on AMX (quants 0..15 x int8 activations, tdpbusd) compute each element as the
    int8 GEMM does (the same integer dot per block, the same float steps in the same order: d * scale, the
    offset dmin * min times d_x * the quant sum), so a Q4_K_M encoder gives the same bits with AMX on or off
    (FUN_ASR_AMX=0), for 1 to 3 threads, 16-row tiles 1 to 4, column tails and a zero block."""
    runs = {}
    for amx in ("1", "0"):
        path = tmp_path / f"amx{amx}.npz"
        env = {**os.environ, "FUN_ASR_AMX": amx}
        out = subprocess.run([sys.executable, "-c", _Q4K_ENCODER_BITS, str(path)], env=env, capture_output=True,
                             text=True, timeout=120)
        assert out.returncode == 0, out.stderr
        runs[amx] = dict(np.load(path))
    assert bool(runs["1"]["amx"]) and not bool(runs["0"]["amx"])
    keys = [k for k in runs["1"] if k != "amx"]
    assert len(keys) == 12
    for key in keys:
        np.testing.assert_array_equal(runs["1"][key], runs["0"][key], err_msg=key)


@needs_amx
def test_q4_k_m_encoder_takes_amx_for_q4_k_and_the_int8_gemm_for_q6_k(wide_gguf) -> None:  # noqa: ANN001
    """The routing: a Q4_K_M encoder's Q4_K products show as GEMM_AMX, its Q6_K ones (part of attn_v and
    ffn_down) as GEMM_INT8; the decoder's Q4_K prefill products keep ggml's path (an unpack per product does not
    pay over a prefill's few positions)."""
    m = fun_asr.load_model(wide_gguf("q4_k_m"), threads=2)
    m.profiling = True
    m.encode(np.random.default_rng(0).standard_normal((120, m.info()["encoder"]["input_size"])).astype(np.float32))
    keys = [k for k in m.profile() if k.startswith("encode/")]
    assert any(k.startswith("encode/GEMM_AMX/enc.ffn_up") for k in keys), keys
    assert any(k.startswith("encode/GEMM_INT8/enc.ffn_down") for k in keys), keys  # its Q6_K layers
    assert not any(k.startswith("encode/GEMM_INT8/enc.ffn_up") for k in keys), keys  # all Q4_K
    m.reset_profile()
    prompt = np.ascontiguousarray(m.embed(np.random.default_rng(1).integers(0, 1000, 40).tolist()))
    m.generate_batch([prompt], 1, [])
    assert not any(k.startswith("prefill/GEMM_AMX/") and "ffn" in k for k in m.profile()), sorted(m.profile())


def _q8_0_steps_alone_and_in_a_batch(path: str, seed: int, node: str) -> tuple[bool, bool, object]:
    """Nine prompts of different lengths decoded as one batch and then one by one: each sequence's tokens
    and logits digests must be its one-by-one run's. Returns whether the profile had `node` in the batch
    and in the one-by-one runs, and the model."""
    model = _core.load_gguf(path, device="cpu", threads=2)
    model.logit_digests = True
    d = model.info()["decoder"]["d_model"]
    rng = np.random.default_rng(seed)
    prompts = [np.ascontiguousarray(rng.standard_normal((5 + i, d)).astype(np.float32)) for i in range(9)]
    model.profiling = True
    together = [t for t, _ in model.generate_batch(prompts, 5, [])]
    digests = model.last_logit_digests()
    in_batch = any(k.startswith(node) for k in model.profile())
    model.reset_profile()
    for i, p in enumerate(prompts):
        (alone, _), = model.generate_batch([p], 5, [])
        assert alone == together[i]
        assert model.last_logit_digests()[0] == digests[i]
    return in_batch, any(k.startswith(node) for k in model.profile()), (model, prompts)


@needs_amx
def test_q8_0_batch_steps_take_amx_with_the_same_bits(tiny_gguf) -> None:  # noqa: ANN001
    """A Q8_0 decode step of 8+ sequences goes through the AMX GEMM (the profile's decode/GEMM_AMX nodes),
    fewer through the mat-vec kernel; each sequence's tokens and logits are its one-by-one run's."""
    in_batch, alone, _ = _q8_0_steps_alone_and_in_a_batch(str(tiny_gguf("q8_0")), 3, "decode/GEMM_AMX/")
    assert in_batch and not alone


@needs_int8_gemm
def test_q8_0_batch_steps_take_the_vnni_gemm_with_the_same_bits(tiny_gguf) -> None:  # noqa: ANN001
    """Without AMX, the decoder's Q8_0 matrices are kept in the int8 GEMM's quads layout (FUN_ASR_Q8_QUADS), on
    VNNI and plain AVX2 alike, and every decode step reads them there (the profile's decode/GEMM_INT8 nodes);
    with the plain layout (FUN_ASR_Q8_QUADS=0) a step of 3+ sequences still goes through the int8 GEMM where it
    runs VNNI (vpdpbusd, AVX-512 or AVX-VNNI), fewer sequences and plain AVX2 through the mat-vec kernel. Each
    sequence's tokens and logits are its one-by-one run's."""
    if _core.amx_available():
        pytest.skip("AMX takes these steps on this CPU")
    in_batch, alone, (model, prompts) = _q8_0_steps_alone_and_in_a_batch(str(tiny_gguf("q8_0")), 4,
                                                                          "decode/GEMM_INT8/")
    quads = model.info()["q8_0_quads_tensors"] > 0
    assert quads == (os.environ.get("FUN_ASR_Q8_QUADS") != "0" and os.environ.get("FUN_ASR_MATVEC") != "0")
    vnni = _core.int8_gemm_isa() in ("avx512vnni", "avxvnni")
    assert in_batch == (quads or vnni), sorted(model.profile())
    assert alone == quads
    model.reset_profile()
    model.generate_batch(prompts[:2], 5, [])  # two sequences: the mat-vec kernel (plain layout)
    assert any(k.startswith("decode/GEMM_INT8/") for k in model.profile()) == quads
