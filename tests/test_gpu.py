"""The model on a GPU gives the CPU's words and tokens, one by one and in batches: ggml's CUDA backend where the
extension was built with it (tools/build_cuda.sh) and a GPU is present (tools/gpu_check.sh), ggml's Vulkan backend
where the build ships it and a driver is present (CI: Mesa's lavapipe); skipped elsewhere (tests/gpu.py).

The numerical parity against Transformers on each device is tests/test_model_parity.py's (its `device`
parameter); batch invariance on CUDA is tests/test_batch_invariance.py's. Here: the trained 20-word demo model,
whose argmax margins are wide, so the GPU must give exactly the CPU's tokens on all 60 held-out clips.
"""

from __future__ import annotations

import numpy as np
import pytest

import fun_asr
from gpu import GPU_DEVICES, backend_gpus
from trained_model import heldout_audio

BACKEND = {"cuda": "CUDA", "vulkan": "Vulkan"}  # the backend name info() gives for each device


@pytest.fixture(scope="module")
def clips() -> list[np.ndarray]:
    return [x.astype(np.float32) / 32768.0 for x, _ in heldout_audio()]


_cpu_tokens: dict[str, list[list[list[int]]]] = {}
_cpu_logprobs: dict[str, list[float]] = {}


def cpu_tokens(package: str, clips: list[np.ndarray]) -> list[list[list[int]]]:
    if package not in _cpu_tokens:
        s = fun_asr.Session("demo", device="cpu", package_type=package, progress=False, vad=None)
        results = s.transcribe_batch(clips, sample_rate=16000)
        _cpu_tokens[package] = [[seg.tokens for seg in r.segments] for r in results]
        _cpu_logprobs[package] = [lp for r in results for seg in r.segments for lp in seg.token_logprobs]
    return _cpu_tokens[package]


@pytest.mark.parametrize("device", GPU_DEVICES)
@pytest.mark.parametrize("batch_size", [1, 8, 60])
@pytest.mark.parametrize("package", ["f16", "q8_0"])
def test_gpu_tokens_equal_cpu_tokens(device: str, package: str, batch_size: int, clips: list[np.ndarray]) -> None:
    """The same package on the GPU and on the CPU: the same tokens on every held-out clip, at any batch size."""
    s = fun_asr.Session("demo", device=device, package_type=package, progress=False, vad=None)
    assert s.model.info()["backend"].startswith(BACKEND[device])
    results = s.transcribe_batch(clips, sample_rate=16000, batch_size=batch_size)
    gpu = [[seg.tokens for seg in r.segments] for r in results]
    differ = [i for i, (a, b) in enumerate(zip(gpu, cpu_tokens(package, clips), strict=True)) if a != b]
    assert differ == [], (f"{len(differ)}/60 clips decode differently on {device} ({package}, batch {batch_size}): "
                          f"{differ[:10]}")
    # each token's log-probability, computed on the device beside the choice (ggml's softmax at the argmax): the
    # CPU's within the GPU's rounding of the logits (its products dequantize the weights; the CPU's quantize the
    # activations too: on lavapipe, Q8_0, a token at -2.83 came out -2.77, one at -0.52 -0.50; the median 5e-5)
    assert s.model.info()["caps"]["logprob_in_graph"]
    got = np.array([lp for r in results for seg in r.segments for lp in seg.token_logprobs])
    want = np.array(_cpu_logprobs[package])
    assert got.shape == want.shape and bool(np.all(np.abs(got - want) <= 0.05 * np.abs(want) + 0.005))
    assert float(np.median(np.abs(got - want))) < 1e-3


@pytest.mark.parametrize("device", GPU_DEVICES)
def test_gpu_words_are_the_references(device: str) -> None:
    """The shipped examples on the GPU: the words in examples/demo.txt."""
    from test_demo import EXAMPLES, _references

    s = fun_asr.Session("demo", device=device, progress=False)
    for stem, text in _references().items():
        assert s.transcribe(str(EXAMPLES / f"{stem}.wav")).text.lower().strip(" .") == text, stem


@pytest.mark.parametrize("device", GPU_DEVICES)
def test_gpu_device_index_and_info(device: str) -> None:
    s = fun_asr.Session("demo", device=f"{device}:0", progress=False, vad=None)
    info = s.model.info()
    assert info["backend"].startswith(BACKEND[device]) and info["weight_bytes"] > 0
    n_gpus = len(backend_gpus(device))
    with pytest.raises(ValueError, match=f"only {n_gpus} GPU"):
        fun_asr.Session("demo", device=f"{device}:{n_gpus}", progress=False, vad=None)
