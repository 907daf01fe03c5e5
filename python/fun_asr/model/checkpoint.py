"""Reads a Hugging Face checkpoint directory in the official Fun-ASR-Nano layout.

``config.json``, ``model.safetensors`` (or ``model-*.safetensors`` + ``model.safetensors.index.json``),
``tokenizer.json``, and when present ``tokenizer_config.json``, ``chat_template.jinja`` /
``chat_template.json``, ``preprocessor_config.json``, ``generation_config.json``.

Safetensors files are parsed here (header + memory map) rather than through the ``safetensors``
package because its numpy loader has no BF16, the official checkpoint's dtype; every header entry
is checked against the file size so that a truncated file is reported by tensor name.
"""

from __future__ import annotations

import json
import math
import re
import struct
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from fun_asr.model.hparams import HParams, parse_hparams


class CheckpointError(ValueError):
    """The directory is not a readable Fun-ASR-Nano checkpoint."""


_DTYPES = {"F32": (np.dtype("<f4"), 4), "F16": (np.dtype("<f2"), 2), "BF16": (np.dtype("<u2"), 2)}
_MAX_HEADER = 100 * 1024 * 1024


@dataclass(frozen=True)
class _TensorRef:
    file: Path
    dtype: str
    shape: tuple[int, ...]
    start: int  # absolute byte offset in the file
    end: int


def _read_safetensors_header(path: Path) -> dict[str, _TensorRef]:
    size = path.stat().st_size
    with path.open("rb") as f:
        head = f.read(8)
        if len(head) < 8:
            raise CheckpointError(f"{path}: not a safetensors file (only {len(head)} bytes)")
        (n,) = struct.unpack("<Q", head)
        if n == 0 or n > _MAX_HEADER or 8 + n > size:
            raise CheckpointError(f"{path}: not a safetensors file or truncated (header length {n}, file size {size})")
        try:
            header = json.loads(f.read(n))
        except (UnicodeDecodeError, json.JSONDecodeError) as exc:
            raise CheckpointError(f"{path}: safetensors header is not valid JSON ({exc})") from None
    if not isinstance(header, dict):
        raise CheckpointError(f"{path}: safetensors header is not a JSON object")
    base = 8 + n
    refs = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        def ints(v: Any) -> bool:  # a list of non-negative JSON integers
            return isinstance(v, list) and all(isinstance(x, int) and not isinstance(x, bool) and x >= 0 for x in v)

        if not (isinstance(info, dict) and ints(info.get("shape")) and ints(info.get("data_offsets"))
                and len(info["data_offsets"]) == 2):
            raise CheckpointError(f"{path}: malformed header entry for tensor {name!r} (needs dtype, shape and "
                                  "data_offsets, with non-negative integers)")
        dtype, shape, (begin, end) = info.get("dtype"), tuple(info["shape"]), info["data_offsets"]
        if not isinstance(dtype, str) or dtype not in _DTYPES:
            raise CheckpointError(
                f"{path}: tensor {name!r} has dtype {dtype!r}; accepted: {', '.join(_DTYPES)}"
            )
        expected = math.prod(shape) * _DTYPES[dtype][1]
        if end - begin != expected:
            raise CheckpointError(
                f"{path}: tensor {name!r} spans {end - begin} bytes but {dtype}{list(shape)} needs {expected}"
            )
        if base + end > size:
            raise CheckpointError(
                f"{path}: truncated: tensor {name!r} ends at byte {base + end} but the file has {size}"
            )
        refs[name] = _TensorRef(path, dtype, shape, base + begin, base + end)
    return refs


def _read_json(path: Path) -> Any:
    try:
        return json.loads(path.read_text("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise CheckpointError(f"{path}: not valid JSON ({exc})") from None


@dataclass
class CheckpointFiles:
    """What both checkpoint layouts (this Hugging Face one, and FunASR's: :mod:`fun_asr.model.funasr_checkpoint`)
    give the converter and the loader: configs, tokenizer text, where the model came from, and a tensor index
    (name -> a reference with the stored ``dtype`` and ``shape``) read through :meth:`raw`."""

    path: Path
    config: dict[str, Any]
    hparams: HParams
    tensors: dict[str, Any]
    tokenizer_json: str
    tokenizer_config: dict[str, Any] | None = None
    chat_template: str | None = None
    preprocessor_config: dict[str, Any] | None = None
    generation_config: dict[str, Any] | None = None
    repo_id: str | None = None
    revision: str | None = None

    def raw(self, name: str) -> np.ndarray:
        """The stored array (float32, float16, or BF16 as uint16)."""
        raise NotImplementedError

    def dtype(self, name: str) -> str:
        return self.tensors[name].dtype

    def float32(self, name: str) -> np.ndarray:
        """The tensor as a new C-contiguous float32 array (BF16/F16 widened exactly)."""
        return to_float32(self.raw(name), self.tensors[name].dtype == "BF16")

    def names(self) -> Iterator[str]:
        return iter(self.tensors)


@dataclass
class Checkpoint(CheckpointFiles):
    """An opened checkpoint directory: configs, tokenizer text and a lazy tensor index."""

    tensors: dict[str, _TensorRef]
    _maps: dict[Path, np.memmap] = field(default_factory=dict, repr=False)

    @classmethod
    def open(cls, path: str | Path) -> Checkpoint:
        root = Path(path)
        if not root.exists():
            raise CheckpointError(f"{root}: no such file or directory")
        if not root.is_dir():
            raise CheckpointError(
                f"{root}: not a checkpoint directory (expected a folder with config.json and "
                "model.safetensors)"
            )
        cfg_path = root / "config.json"
        if not cfg_path.is_file():
            raise CheckpointError(f"{root}: missing config.json — not a Hugging Face checkpoint directory")
        config = _read_json(cfg_path)
        hparams = parse_hparams(config)

        index = root / "model.safetensors.index.json"
        single = root / "model.safetensors"
        tensors: dict[str, _TensorRef] = {}
        if single.is_file():
            tensors = _read_safetensors_header(single)
        elif index.is_file():
            doc = _read_json(index)
            weight_map = doc.get("weight_map") if isinstance(doc, dict) else None
            if not isinstance(weight_map, dict) or not weight_map:
                raise CheckpointError(f"{index}: no weight_map")
            for shard in sorted(set(weight_map.values())):
                shard_path = root / shard
                if not shard_path.is_file():
                    raise CheckpointError(f"{index}: lists shard {shard} which is missing")
                for name, ref in _read_safetensors_header(shard_path).items():
                    if weight_map.get(name) != shard:
                        raise CheckpointError(
                            f"{shard_path}: tensor {name!r} is not mapped to this shard in {index.name}"
                        )
                    tensors[name] = ref
            missing = sorted(set(weight_map) - set(tensors))
            if missing:
                raise CheckpointError(f"{index}: tensors listed but absent from their shards: {', '.join(missing[:5])}")
        else:
            raise CheckpointError(
                f"{root}: no model.safetensors or model.safetensors.index.json (weights must be safetensors)"
            )

        tok = root / "tokenizer.json"
        if not tok.is_file():
            raise CheckpointError(f"{root}: missing tokenizer.json")
        chat_template = None
        if (root / "chat_template.jinja").is_file():
            chat_template = (root / "chat_template.jinja").read_text("utf-8")
        elif (root / "chat_template.json").is_file():
            doc = _read_json(root / "chat_template.json")
            chat_template = doc.get("chat_template") if isinstance(doc, dict) else None
            if not isinstance(chat_template, str | None):
                raise CheckpointError(f"{root / 'chat_template.json'}: chat_template must be a string")

        def optional(name: str) -> dict[str, Any] | None:
            p = root / name
            doc = _read_json(p) if p.is_file() else None
            if doc is not None and not isinstance(doc, dict):
                raise CheckpointError(f"{p}: must hold a JSON object, got {type(doc).__name__}")
            return doc

        tok_cfg = optional("tokenizer_config.json")
        if chat_template is None and tok_cfg and isinstance(tok_cfg.get("chat_template"), str):
            chat_template = tok_cfg["chat_template"]
        repo_id, revision = hub_origin(root)
        return cls(
            path=root,
            config=config,
            hparams=hparams,
            tensors=tensors,
            tokenizer_json=tok.read_text("utf-8"),
            tokenizer_config=tok_cfg,
            chat_template=chat_template,
            preprocessor_config=optional("preprocessor_config.json"),
            generation_config=optional("generation_config.json"),
            repo_id=repo_id,
            revision=revision,
        )

    def eos_token_ids(self) -> list[int]:
        """Stop ids: generation_config.json first, then the text config."""
        for source in (self.generation_config or {}, self.config.get("text_config", {}), self.config):
            ids = source.get("eos_token_id") if isinstance(source, dict) else None
            if ids is not None:
                if not isinstance(ids, int | list):
                    raise CheckpointError(f"{self.path}: eos_token_id must be an integer or a list, got {ids!r:.60}")
                return checked_eos_ids(ids, self.hparams.decoder.vocab, self.path)
        raise CheckpointError(
            f"{self.path}: no eos_token_id in generation_config.json or config.json; the decoder "
            "needs its stop tokens"
        )

    def raw(self, name: str) -> np.ndarray:
        """The stored array (float32, float16, or BF16 as uint16), memory-mapped, no copy."""
        ref = self.tensors[name]
        mm = self._maps.get(ref.file)
        if mm is None:
            mm = self._maps[ref.file] = np.memmap(ref.file, dtype=np.uint8, mode="r")
        dtype = _DTYPES[ref.dtype][0]
        return mm[ref.start : ref.end].view(dtype).reshape(ref.shape)

    def close(self) -> None:
        self._maps.clear()


def checked_eos_ids(ids: int | list[Any], vocab: int, where: object) -> list[int]:
    """eos_token_id (one id or a list) as a list, every id inside the vocabulary (CheckpointError naming ``where``
    otherwise)."""
    ids = [ids] if isinstance(ids, int) else list(ids)
    bad = [i for i in ids if not isinstance(i, int) or not 0 <= i < vocab]
    if bad:
        raise CheckpointError(f"{where}: eos_token_id {bad} outside the vocabulary")
    return ids


def to_float32(raw: np.ndarray, bf16: bool) -> np.ndarray:
    """A stored array as C-contiguous float32: BF16 (its bits held as uint16) widened exactly, F16/F32 cast."""
    if bf16:
        return (raw.astype(np.uint32) << 16).view(np.float32)
    return np.ascontiguousarray(raw, dtype=np.float32)


def hub_origin(root: Path) -> tuple[str | None, str | None]:
    """repo id and revision when the folder is a huggingface_hub cache snapshot."""
    parts = root.resolve().parts
    for i in range(len(parts) - 2):
        m = re.fullmatch(r"models--(.+)", parts[i])
        if m and parts[i + 1] == "snapshots":
            return m.group(1).replace("--", "/"), parts[i + 2]
    return None, None
