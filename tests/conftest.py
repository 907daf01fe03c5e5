"""Shared fixtures: tiny random Fun-ASR-Nano checkpoints made with Transformers."""

from __future__ import annotations

import atexit
import os
import shutil
import sys
import tempfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tools"))

from make_random_checkpoint import make_checkpoint  # noqa: E402

# Tests never see the user's caches or the network hub: the default vad="auto" then finds no VAD
# model (tests that want one pass it), and nothing is downloaded by accident. Subprocesses inherit this.
_ISOLATED = Path(tempfile.mkdtemp(prefix="fun-asr-tests-"))
atexit.register(shutil.rmtree, _ISOLATED, ignore_errors=True)
os.environ["FUN_ASR_CACHE_DIR"] = str(_ISOLATED / "fun-asr-cache")
os.environ["HF_HUB_CACHE"] = str(_ISOLATED / "hub")
os.environ["HF_HUB_OFFLINE"] = "1"


def pytest_configure(config: pytest.Config) -> None:
    import device_process
    from gpu import require_named_devices

    require_named_devices()
    device_process.register(config)


@pytest.fixture(scope="session")
def vad_dir() -> Path:
    """The real FSMN-VAD in FunASR's folder layout (tests/vad_fixture.py: fetched once, sha256-pinned)."""
    from vad_fixture import fsmn_vad_dir

    return fsmn_vad_dir()


@pytest.fixture(scope="session")
def tiny_f32(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Tiny random checkpoint, F32, one model.safetensors."""
    return make_checkpoint(tmp_path_factory.mktemp("ckpt") / "tiny-f32", "tiny", seed=0, dtype="f32")


@pytest.fixture(scope="session")
def tiny_bf16(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Tiny random checkpoint, BF16 (as the official one), sharded in two files + index."""
    return make_checkpoint(tmp_path_factory.mktemp("ckpt") / "tiny-bf16", "tiny", seed=1, dtype="bf16", shards=2)


@pytest.fixture(scope="session")
def gguf_converter(tmp_path_factory: pytest.TempPathFactory):  # noqa: ANN201
    """gguf_converter(checkpoint, stem) -> get(package): converts the checkpoint once per package type
    (get("q8_0") -> <stem>-q8_0.gguf in a session temp folder)."""
    from fun_asr import convert

    def make(src: Path, stem: str):  # noqa: ANN202
        cache: dict[str, Path] = {}
        root = tmp_path_factory.mktemp(stem)

        def get(package: str) -> Path:
            if package not in cache:
                cache[package] = root / f"{stem}-{package}.gguf"
                convert(src, cache[package], package, progress=False)
            return cache[package]

        return get

    return make


@pytest.fixture(scope="session")
def wide_gguf(tmp_path_factory: pytest.TempPathFactory, gguf_converter):  # noqa: ANN001, ANN201
    """The "wide" random checkpoint (the released decoder's widths and vocabulary, 2 layers: full-size
    product shapes), converted once per package type: wide_gguf("q4_k_m") -> path."""
    src = make_checkpoint(tmp_path_factory.mktemp("ckpt") / "wide-f32", "wide", seed=3, dtype="f32")
    return gguf_converter(src, "wide")


@pytest.fixture(scope="session")
def tiny_gguf(tiny_f32: Path, gguf_converter):  # noqa: ANN001, ANN201
    """Converts tiny_f32 once per package type: tiny_gguf("q8_0") -> path."""
    return gguf_converter(tiny_f32, "tiny")


@pytest.fixture(scope="session")
def nano(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """The FunASR-layout checkpoint, the same weights in the HF layout, and their F32 GGUFs."""
    from fun_asr import convert
    from make_funasr_checkpoint import make_funasr_checkpoint  # needs funasr 1.4.16 (test reference stack)

    root = tmp_path_factory.mktemp("funasr")
    ms = make_funasr_checkpoint(root / "Fun-ASR-Nano-2512", seed=0, hf_copy=root / "hf")
    out = {"ms": ms, "hf": root / "hf", "root": root}
    for name in ("ms", "hf"):
        out[f"{name}-f32"] = root / f"{name}-f32.gguf"
        convert(out[name], out[f"{name}-f32"], "f32", progress=False)
    return out


@pytest.fixture(scope="session")
def ctc_demo(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """The demo model with its trained CTC head (tests/trained_ctc.py), as F32 and Q4_K_M packages."""
    from trained_ctc import demo_with_ctc

    root = tmp_path_factory.mktemp("ctc_demo")
    return {t: demo_with_ctc(root / f"demo-ctc-{t}.gguf", t, work=root) for t in ("f32", "q4_k_m")}


@pytest.fixture(scope="module")
def demo(vad_dir: Path):  # noqa: ANN201 - fun_asr.Session
    """The 20-word demo model (-m demo) with the real FSMN-VAD: real words, one segment per utterance (as
    FunASR's VAD). One per test module (tests replace its methods for a while)."""
    import fun_asr

    return fun_asr.Session("demo", device="cpu", vad="fsmn", vad_model=vad_dir, progress=False)


@pytest.fixture(scope="module")
def three(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """tests/trained_model.py's three held-out utterances between silences, as one WAV."""
    from trained_model import three_utterances_clip

    clip, _ = three_utterances_clip(tmp_path_factory.mktemp("three"))
    return clip
