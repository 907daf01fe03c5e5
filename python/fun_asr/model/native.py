"""Loading a model for inference: a GGUF file, or a checkpoint folder (HF or FunASR layout) without conversion."""

from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import Any

import numpy as np

from fun_asr import _core
from fun_asr.model.funasr_checkpoint import open_checkpoint
from fun_asr.model.metadata import ARCH, check_tensors, gguf_metadata
from fun_asr.model.tensor_names import tensor_table

_STORED = {"F32": "f32", "F16": "f16", "BF16": "bf16"}

log = logging.getLogger("fun_asr")
_said_fallback: set[str] = set()


def usable_device(device: str) -> str:
    """``device``, or ``"cpu"`` when it names a GPU backend that this build ships as a module but that gives no
    device here (no driver, or a broken one: the module did not load or found no GPU); that is logged once, in
    one line saying why. A device the build lacks altogether is left for ``check_device``'s error."""
    why = _core.device_fallback(device)
    if not why:
        return device
    if device not in _said_fallback:
        _said_fallback.add(device)
        log.warning("device %s is not usable here, running on the CPU: %s", device, why)
    return "cpu"


def load_model(path: str | os.PathLike[str], device: str = "cpu", threads: int = 0) -> _core.Model:
    """Loads a Fun-ASR-Nano model for inference.

    ``path`` is a GGUF file made by ``fun-asr-convert``, a Hugging Face checkpoint directory
    (config.json + model*.safetensors + tokenizer.json) or a FunASR/ModelScope folder (model.pt +
    config.yaml + Qwen3-0.6B/; its CTC head is loaded when complete: ``info()["ctc"]``).
    ``device``: ``cpu``, ``auto`` (the first GPU, else the CPU; never a software
    Vulkan driver such as Mesa's llvmpipe), ``gpu``/``gpu:N`` (any backend's), or a GPU
    backend's name with an optional index (``cuda``, ``cuda:N``, ``vulkan``, ``metal``: the CPU, with one logged
    line saying why, where the build ships that backend but the machine has no driver for it); ``threads``: CPU threads,
    0 = auto (up to all cores; fewer when timed decode steps say that is faster, e.g. beside a busy process).
    """
    p = Path(path)
    if not p.exists():
        raise FileNotFoundError(f"{p}: no such file or directory (expected a .gguf file or a checkpoint folder)")
    device = usable_device(device)
    if p.is_dir():
        return _load_checkpoint(p, device, threads)
    return _core.load_gguf(str(p), device=device, threads=threads)


def model_metadata(path: str | os.PathLike[str]) -> dict[str, Any]:
    """The GGUF-style metadata of a GGUF file or a checkpoint folder (HF or FunASR layout), as plain
    Python values: what a Session needs (tokenizer.huggingface.json, fun_asr_nano.prompt,
    fun_asr_nano.model_spec, fun_asr_nano.language_table, fun_asr_nano.ctc.*)."""
    p = Path(path)
    if p.is_dir():
        ckpt = open_checkpoint(p)
        try:
            return gguf_metadata(ckpt, ckpt.hparams)
        finally:
            ckpt.close()
    from fun_asr.model.gguf_file import metadata_fields, open_gguf

    return metadata_fields(open_gguf(p))


def _load_checkpoint(path: Path, device: str, threads: int) -> _core.Model:
    ckpt = open_checkpoint(path)
    hp = ckpt.hparams
    entries = tensor_table(hp)
    check_tensors(ckpt, entries)
    tensors = []
    for e in entries:
        stored = ckpt.dtype(e.hf)
        if e.kind in ("norm", "bias", "fsmn") and stored != "F32":
            data: np.ndarray = ckpt.float32(e.hf)  # the graph adds/multiplies these in F32
            type_name = "f32"
        else:
            data = ckpt.raw(e.hf)
            type_name = _STORED[stored]
        tensors.append((e.gguf, type_name, list(reversed(e.shape)), data))
    try:
        return _core.load_tensors(ARCH, gguf_metadata(ckpt, hp), tensors, device=device, threads=threads,
                                  origin=str(path))
    finally:
        del tensors
        ckpt.close()
