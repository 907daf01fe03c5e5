"""Tells the checkpoint folders fun-asr reads apart: a Hugging Face Fun-ASR-Nano folder (``"hf"``), FunASR's own
ModelScope layout (``"funasr"``), a FunASR FSMN-VAD folder (``"fsmn_vad"``) and a FunASR CAM++ speaker-model
folder (``"campplus"``). Only the files' names and config.yaml's ``model:`` line are read here."""

from __future__ import annotations

import os
import re
from pathlib import Path

from fun_asr.model.checkpoint import CheckpointError

LAYOUTS = ("hf", "funasr", "fsmn_vad", "campplus")

VAD_FILES = ("model.pt", "config.yaml", "am.mvn")  # a FunASR FSMN-VAD folder
REQUIRED_FILES = VAD_FILES


def _config_yaml_text(root: Path) -> str | None:
    """config.yaml's text (undecodable bytes replaced), or None when it cannot be read."""
    try:
        return (root / "config.yaml").read_text("utf-8", errors="replace")
    except OSError:
        return None


def is_vad_folder(path: str | os.PathLike[str]) -> bool:
    """A FunASR FSMN-VAD folder: model.pt + config.yaml naming an FSMN VAD + am.mvn."""
    p = Path(path)
    if not (p.is_dir() and all((p / f).is_file() for f in VAD_FILES)):
        return False
    text = _config_yaml_text(p)
    return text is not None and ("FsmnVAD" in text or "encoder: FSMN" in text)


def is_campplus_folder(path: str | os.PathLike[str]) -> bool:
    """A FunASR/ModelScope CAM++ speaker-model folder: config.yaml naming ``model: CAMPPlus`` (the weights file,
    configuration.json and the rest are checked by fun_asr.speakers.files)."""
    p = Path(path)
    if not (p.is_dir() and (p / "config.yaml").is_file()):
        return False
    text = _config_yaml_text(p)
    return text is not None and re.search(r"(?m)^model:\s*['\"]?CAMPPlus['\"]?\s*$", text) is not None


def is_funasr_nano(root: Path) -> bool:
    """A FunASR Fun-ASR-Nano folder: model.pt + config.yaml naming ``model: FunASRNano``."""
    if not ((root / "config.yaml").is_file() and (root / "model.pt").is_file()):
        return False
    text = _config_yaml_text(root)
    return text is not None and re.search(r"(?m)^model:\s*['\"]?FunASRNano\b", text) is not None


def detect_layout(path: str | os.PathLike[str]) -> str:
    """Which checkpoint layout a folder holds: ``"hf"`` (config.json + model*.safetensors, the
    Transformers port), ``"funasr"`` (model.pt + config.yaml naming FunASRNano + the LLM folder, as
    ModelScope ships it), ``"fsmn_vad"`` (FunASR's VAD: model.pt, config.yaml, am.mvn) or ``"campplus"`` (FunASR's
    CAM++ speaker model: config.yaml naming CAMPPlus + campplus_cn_common.bin).
    Raises :class:`CheckpointError` (a ValueError) naming what is accepted otherwise."""

    root = Path(path)
    if not root.exists():
        raise CheckpointError(f"{root}: no such file or directory")
    if not root.is_dir():
        raise CheckpointError(f"{root}: not a checkpoint directory (expected a folder: Hugging Face config.json + "
                              "model.safetensors, or FunASR model.pt + config.yaml; a .gguf file is loaded as is)")
    if is_vad_folder(root):
        return "fsmn_vad"
    if is_campplus_folder(root):
        return "campplus"
    if is_funasr_nano(root):
        return "funasr"
    if (root / "config.json").is_file() or any(root.glob("*.safetensors")) or (
            root / "model.safetensors.index.json").is_file():
        return "hf"  # possibly incomplete: the HF reader says precisely what is missing
    present = sorted(p.name for p in root.iterdir())[:12]
    raise CheckpointError(
        f"{root}: not a checkpoint folder fun-asr reads (found: {', '.join(present) or 'nothing'}). Accepted: "
        "a Hugging Face Fun-ASR-Nano folder (config.json + model.safetensors + tokenizer.json), a FunASR / "
        "ModelScope Fun-ASR-Nano folder (model.pt + config.yaml with 'model: FunASRNano' + the Qwen3-0.6B "
        "folder), a FunASR FSMN-VAD folder (model.pt + config.yaml + am.mvn), or a FunASR CAM++ folder (config.yaml "
        "with 'model: CAMPPlus' + campplus_cn_common.bin)")


def layout_description(layout: str) -> str:
    """One line for the converter to print: which layout it read."""
    return {
        "hf": "Hugging Face Fun-ASR-Nano checkpoint (config.json, safetensors, tokenizer.json)",
        "funasr": "FunASR/ModelScope Fun-ASR-Nano checkpoint (model.pt, config.yaml, LLM folder)",
        "fsmn_vad": "FunASR FSMN-VAD folder (model.pt, config.yaml, am.mvn)",
        "campplus": "FunASR CAM++ speaker-model folder (config.yaml, campplus_cn_common.bin)",
    }[layout]
