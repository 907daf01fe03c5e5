"""Which devices the tests run on: the CPU always; a CUDA GPU where this build has ggml's CUDA backend and the
machine a GPU (tools/gpu_check.sh runs the suite's GPU cases there); a Vulkan device where this build ships ggml's
Vulkan backend and the machine has a Vulkan driver: in CI, Mesa's lavapipe, a CPU driver that ggml lists only
because scripts/test.sh sets GGML_VK_VISIBLE_DEVICES=0 (before pytest starts: pytest imports fun_asr, and ggml reads
it then; fun-asr's "auto" device never takes a software driver, only "vulkan" does). Elsewhere those cases are
skipped, except where FUN_ASR_TEST_REQUIRE names the device (``vulkan``; .ci/run sets it): then a missing device
stops the run before any test."""

from __future__ import annotations

import os

import pytest

import fun_asr
from fun_asr.model.vulkan_driver import known_bad

REQUIRED = {x.strip() for x in os.environ.get("FUN_ASR_TEST_REQUIRE", "").split(",") if x.strip()}


def backend_gpus(backend: str) -> list[dict]:
    """system_info()'s GPU devices of one backend ("cuda", "vulkan"), in ggml's order."""
    return [d for d in fun_asr.system_info()["devices"]
            if d["type"] in ("gpu", "igpu") and d["name"].lower().startswith(backend)]


def gpu_available() -> bool:
    """This build has ggml's CUDA backend and the machine a GPU it can use."""
    return "CUDA" in fun_asr.system_info()["compiled_backends"] and bool(backend_gpus("cuda"))


def vulkan_available() -> bool:
    """This build ships ggml's Vulkan backend and it found a device (a GPU, or lavapipe where
    GGML_VK_VISIBLE_DEVICES names it) whose driver is not kept out (``vulkan_refused``)."""
    return bool(backend_gpus("vulkan")) and not vulkan_refused()


def vulkan_refused() -> str:
    """Why ``--device vulkan`` refuses this machine's first Vulkan device (a driver known to corrupt memory, such as
    Debian 12's lavapipe: fun_asr.model.vulkan_driver), or ''."""
    gpus = backend_gpus("vulkan")
    return known_bad(gpus[0]["description"]) if gpus else ""


def require_named_devices() -> None:
    """pytest.UsageError where FUN_ASR_TEST_REQUIRE names a device this build or machine lacks (conftest.py)."""
    have = {"cuda": gpu_available(), "vulkan": vulkan_available()}
    unknown = REQUIRED - set(have) - {"wheel", "qemu"}  # (those two: tests/test_wheel.py)
    if unknown:
        raise pytest.UsageError(f"FUN_ASR_TEST_REQUIRE: unknown name(s) {sorted(unknown)}; accepted: cuda, vulkan, "
                                "wheel, qemu")
    missing = sorted(name for name in REQUIRED & set(have) if not have[name])
    if missing:
        info = fun_asr.system_info()
        refused = f"; the Vulkan device is kept out: {vulkan_refused()}" if vulkan_refused() else ""
        raise pytest.UsageError(
            f"FUN_ASR_TEST_REQUIRE names {missing} but this build or machine has no such device (unavailable "
            f"backends: {info['unavailable_backends']}; devices: {[d['name'] for d in info['devices']]}){refused}")


GPU = pytest.mark.skipif(not gpu_available(), reason="no CUDA build or no GPU")
VULKAN = pytest.mark.skipif(not vulkan_available(), reason=f"the Vulkan device is kept out: {vulkan_refused()}"
                            if vulkan_refused() else "no Vulkan backend in this build or no Vulkan device")

# Parametrize a test over devices: @pytest.mark.parametrize("device", DEVICES)
DEVICES = ["cpu", pytest.param("cuda", marks=GPU), pytest.param("vulkan", marks=VULKAN)]
GPU_DEVICES = [pytest.param("cuda", marks=GPU), pytest.param("vulkan", marks=VULKAN)]

# ggml's CUDA backend (0.15.3) runs F32 products on TF32 tensor cores (its own mma kernels up to 16 columns,
# cuBLAS in TF32 mode beyond), and a product of one column through another kernel than several: F32 on a
# GPU meets the F16 package's bound, not the CPU's 1e-4. Measured on an H200 (2026-12-04): stages up to
# 6.5e-4, prefill 8.6e-4, step vs full recompute 1.4e-3 (docs/benchmarks.md).
CUDA_BOUND = 2e-3

# The bound an F32 comparison takes on each device (the CPU's own bounds are the tests' own).
GPU_BOUNDS = {"cuda": CUDA_BOUND, "vulkan": CUDA_BOUND}


def bound_on(device: str, cpu_bound: float) -> float:
    """The relative max-abs bound of a comparison on ``device``: the CPU's, or the GPU's where that is looser."""
    return max(cpu_bound, GPU_BOUNDS[device]) if device in GPU_BOUNDS else cpu_bound
