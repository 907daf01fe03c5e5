"""Loading a model for inference: a GGUF file, or a checkpoint folder (HF or FunASR layout) without conversion."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import numpy as np

from fun_asr import _core
from fun_asr.errors import SetupError
from fun_asr.model import vulkan_driver
from fun_asr.model.funasr_checkpoint import open_checkpoint
from fun_asr.model.metadata import ARCH, check_tensors, gguf_metadata
from fun_asr.model.tensor_names import tensor_table

_STORED = {"F32": "f32", "F16": "f16", "BF16": "bf16"}

# ggml's GPU backends by the name a device takes (``cuda``, ``vulkan:1``), as users write them in words
_BACKEND_NAMES = {"cuda": "CUDA", "vulkan": "Vulkan", "metal": "Metal", "sycl": "SYCL", "opencl": "OpenCL",
                  "cann": "CANN", "musa": "MUSA", "rocm": "ROCm", "hip": "HIP"}


def usable_device(device: str) -> str:
    """``device`` when it selects a device of this build on this machine (``auto`` and ``cpu`` always do: ``auto``
    takes the CPU where there is no GPU); ValueError in one line saying why otherwise, checked before any model is
    read or converted. A device named explicitly is never replaced by the CPU: where this build ships its backend
    as a module that gives no device here (no driver, or a broken one), the error gives ggml's reason
    (``system_info()["unavailable_backends"]``); where the build has no such backend at all, it says so and names
    the backends it has."""
    if device in ("auto", "cpu"):
        _core.check_device(device)
        return device
    why = _core.device_fallback(device)
    if why:
        raise _unusable(device, why)
    _check_backend_built(device)
    name = _core.check_device(device)  # an unknown name, an index past the devices: its own message
    _check_driver(device, name)
    return device


def _check_driver(device: str, name: str) -> None:
    """ValueError where the device ``device`` selects (ggml's ``name``) runs on a Vulkan driver known to corrupt
    memory (fun_asr.model.vulkan_driver)."""
    described = [d["description"] for d in _core.system_info()["devices"] if d["name"] == name]
    why = vulkan_driver.known_bad(described[0]) if described and name.lower().startswith("vulkan") else ""
    if why:
        raise _unusable(device, why)


def _check_backend_built(device: str) -> None:
    """ValueError when ``device`` names a GPU backend this build does not have (neither linked in nor shipped as a
    module), naming the ones it has."""
    kind = device.split(":", 1)[0]
    if kind not in _BACKEND_NAMES:
        return
    info = _core.system_info()
    idle = {str(b).lower() for b in info["unavailable_backends"]}  # shipped, but no device here
    has = list(dict.fromkeys([*map(str, info["registered_backends"]), *(_BACKEND_NAMES.get(b, b) for b in idle)]))
    if kind in {b.lower() for b in has}:
        return
    said = [f"{b} (no device here)" if b.lower() in idle else b for b in has]
    raise SetupError("device.unsupported", "this build has no {backend} backend; it has: {has}; {h[use_cpu]}",
                     option="device", device=device, backend=_BACKEND_NAMES[kind], has=", ".join(said) or "none")


def _unusable(device: str, why: str) -> SetupError:
    return SetupError("device.unusable", "device '{device}' is not usable here: {why}; {h[use_cpu]}", option="device",
                      device=device, why=why)


def load_model(path: str | os.PathLike[str], device: str = "cpu", threads: int = 0) -> _core.Model:
    """Loads a Fun-ASR-Nano model for inference.

    ``path`` is a GGUF file made by ``fun-asr-convert``, a Hugging Face checkpoint directory
    (config.json + model*.safetensors + tokenizer.json) or a FunASR/ModelScope folder (model.pt +
    config.yaml + Qwen3-0.6B/; its CTC head is loaded when complete: ``info()["ctc"]``).
    ``device``: ``cpu``, ``auto`` (the first GPU, else the CPU; never a software
    Vulkan driver such as Mesa's llvmpipe), ``gpu``/``gpu:N`` (any backend's), or a GPU
    backend's name with an optional index (``cuda``, ``cuda:N``, ``vulkan``, ``metal``: ValueError saying why where
    this build or this machine has no such device, :func:`usable_device`); ``threads``: CPU threads,
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
