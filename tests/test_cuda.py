"""The model on a GPU (ggml's CUDA backend) gives the CPU's words and tokens, one by one and in batches.

Runs where the extension was built with CUDA (tools/build_cuda.sh) and a GPU is present
(tools/gpu_check.sh); skipped elsewhere. The numerical parity against Transformers on CUDA is
tests/test_model_parity.py's (its `device` parameter); batch invariance on CUDA is
tests/test_batch_invariance.py's. Here: the trained 20-word demo model, whose argmax margins are wide,
so the GPU must give exactly the CPU's tokens on all 60 held-out clips.
"""

from __future__ import annotations

import numpy as np
import pytest

import fun_asr
from gpu import GPU
from trained_model import heldout_audio

pytestmark = GPU


@pytest.fixture(scope="module")
def clips() -> list[np.ndarray]:
    return [x.astype(np.float32) / 32768.0 for x, _ in heldout_audio()]


_cpu_tokens: dict[str, list[list[list[int]]]] = {}


def cpu_tokens(package: str, clips: list[np.ndarray]) -> list[list[list[int]]]:
    if package not in _cpu_tokens:
        s = fun_asr.Session("demo", device="cpu", package_type=package, progress=False, vad=None)
        results = s.transcribe_batch(clips, sample_rate=16000)
        _cpu_tokens[package] = [[seg.tokens for seg in r.segments] for r in results]
    return _cpu_tokens[package]


@pytest.mark.parametrize("batch_size", [1, 8, 60])
@pytest.mark.parametrize("package", ["f16", "q8_0"])
def test_gpu_tokens_equal_cpu_tokens(package: str, batch_size: int, clips: list[np.ndarray]) -> None:
    """The same package on the GPU and on the CPU: the same tokens on every held-out clip, at any batch size."""
    s = fun_asr.Session("demo", device="cuda", package_type=package, progress=False, vad=None)
    assert s.model.info()["backend"].startswith("CUDA")
    results = s.transcribe_batch(clips, sample_rate=16000, batch_size=batch_size)
    gpu = [[seg.tokens for seg in r.segments] for r in results]
    differ = [i for i, (a, b) in enumerate(zip(gpu, cpu_tokens(package, clips), strict=True)) if a != b]
    assert differ == [], (f"{len(differ)}/60 clips decode differently on the GPU ({package}, batch {batch_size}): "
                          f"{differ[:10]}")


def test_gpu_words_are_the_references() -> None:
    """The shipped examples on the GPU: the words in examples/demo.txt."""
    from test_demo import EXAMPLES, _references

    s = fun_asr.Session("demo", device="cuda", progress=False)
    for stem, text in _references().items():
        assert s.transcribe(str(EXAMPLES / f"{stem}.wav")).text.lower().strip(" .") == text, stem


def test_gpu_device_index_and_info() -> None:
    s = fun_asr.Session("demo", device="cuda:0", progress=False, vad=None)
    info = s.model.info()
    assert info["backend"].startswith("CUDA") and info["weight_bytes"] > 0
    n_gpus = sum(d["type"] == "gpu" for d in fun_asr.system_info()["devices"])
    with pytest.raises(ValueError, match=f"only {n_gpus} GPU"):
        fun_asr.Session("demo", device=f"cuda:{n_gpus}", progress=False, vad=None)
