"""Which devices the tests run on: the CPU always, a CUDA GPU where this build has ggml's CUDA backend and the
machine has a GPU (tools/gpu_check.sh runs the suite's GPU cases there; elsewhere they are skipped)."""

from __future__ import annotations

import pytest

import fun_asr


def gpu_available() -> bool:
    """This build has ggml's CUDA backend and the machine a GPU it can use."""
    info = fun_asr.system_info()
    return "CUDA" in info["compiled_backends"] and any(d["type"] == "gpu" for d in info["devices"])


GPU = pytest.mark.skipif(not gpu_available(), reason="no CUDA build or no GPU")

# Parametrize a test over devices: @pytest.mark.parametrize("device", DEVICES)
DEVICES = ["cpu", pytest.param("cuda", marks=GPU)]

# ggml's CUDA backend (0.15.3) runs F32 products on TF32 tensor cores (its own mma kernels up to 16 columns,
# cuBLAS in TF32 mode beyond), and a product of one column through another kernel than several: F32 on a
# GPU meets the F16 package's bound, not the CPU's 1e-4. Measured on an H200 (2026-12-04): stages up to
# 6.5e-4, prefill 8.6e-4, step vs full recompute 1.4e-3 (docs/benchmarks.md).
CUDA_BOUND = 2e-3
