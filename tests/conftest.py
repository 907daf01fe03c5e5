"""Shared fixtures: tiny random Fun-ASR-Nano checkpoints made with Transformers."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tools"))

from make_random_checkpoint import make_checkpoint  # noqa: E402


@pytest.fixture(scope="session")
def tiny_f32(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Tiny random checkpoint, F32, one model.safetensors."""
    return make_checkpoint(tmp_path_factory.mktemp("ckpt") / "tiny-f32", "tiny", seed=0, dtype="f32")


@pytest.fixture(scope="session")
def tiny_bf16(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Tiny random checkpoint, BF16 (as the official one), sharded in two files + index."""
    return make_checkpoint(tmp_path_factory.mktemp("ckpt") / "tiny-bf16", "tiny", seed=1, dtype="bf16", shards=2)


@pytest.fixture(scope="session")
def tiny_gguf(tiny_f32: Path, tmp_path_factory: pytest.TempPathFactory):  # noqa: ANN201
    """Converts tiny_f32 once per package type: tiny_gguf("q8_0") -> path."""
    from fun_asr import convert

    cache: dict[str, Path] = {}
    root = tmp_path_factory.mktemp("gguf")

    def get(package: str) -> Path:
        if package not in cache:
            cache[package] = root / f"tiny-{package}.gguf"
            convert(tiny_f32, cache[package], package, progress=False)
        return cache[package]

    return get
