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
