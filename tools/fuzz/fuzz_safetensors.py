#!/usr/bin/env python3
"""Fuzz a checkpoint folder's config.json + safetensors header -> ``fun_asr.model.checkpoint.Checkpoint.open``, the
converter's checks (tensor table, placement, GGUF metadata) and ``fun_asr.load_model`` on the folder.

Input: u32 length of config.json, config.json, then ``model.safetensors`` up to the end of its JSON header;
the harness extends the file (sparse, zeros) to the size the header claims (at most 64 MiB). Seeds: the micro
checkpoint written by ``tools/make_random_checkpoint.py`` (its header as is, reordered, with a tensor missing,
untied embeddings). Documented errors: CheckpointError, ConfigError (both ValueError subclasses), RuntimeError
(the native loader). A bare ValueError/TypeError/KeyError/... or a crash is a finding.

    python tools/fuzz/fuzz_safetensors.py [-max_total_time=S] [-atheris_runs=N] | --replay FILES...
"""

from __future__ import annotations

import json
import os
import shutil
import struct
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import _fuzzlib  # noqa: E402

MODULES = ["fun_asr", "fun_asr.model.checkpoint", "fun_asr.model.hparams", "fun_asr.converter.writer",
           "fun_asr.converter.plan", "fun_asr.model.native"]
MAX_DATA = 64 << 20
_dir: Path | None = None


def seeds(out: Path) -> None:
    import _seeds

    for name, data in _seeds.checkpoint_inputs().items():
        (out / name).write_bytes(data)


def setup() -> None:
    global _dir
    import _seeds

    shm = Path("/dev/shm")
    _dir = Path(tempfile.mkdtemp(prefix="fun-asr-fuzz-st-", dir=shm if shm.is_dir() else None))
    src = _seeds.micro_checkpoint()
    shutil.copyfile(src / "generation_config.json", _dir / "generation_config.json")
    (_dir / "tokenizer.json").write_text("{}")  # read as text only; nothing here parses it


def _claimed_size(head: bytes) -> int:
    """The file size the header's data_offsets imply (0 when it cannot be told)."""
    try:
        (n,) = struct.unpack("<Q", head[:8])
        header = json.loads(head[8 : 8 + n])
        ends = [int(v["data_offsets"][1]) for k, v in header.items() if k != "__metadata__"]
        return 8 + n + max(ends, default=0)
    except Exception:  # noqa: BLE001 - whatever it is, the reader under test will say
        return 0


def custom_mutator(data: bytes, max_size: int, seed: int) -> bytes:
    """Half of the time libFuzzer's byte mutations; otherwise one JSON-aware mutation of config.json or of the
    safetensors header (values replaced by huge/negative/infinite numbers, other types, deep nesting ...)."""
    import random

    import _seeds
    import atheris

    rng = random.Random(seed)
    if rng.random() < 0.5:
        return atheris.Mutate(data, max_size)
    config, head = _seeds.unpack_checkpoint(data)
    try:
        if rng.random() < 0.5:
            config = json.dumps(_fuzzlib.mutate_json(json.loads(config), rng)).encode()
        else:
            (n,) = struct.unpack("<Q", head[:8])
            header = _fuzzlib.mutate_json(json.loads(head[8 : 8 + n]), rng)
            head = _seeds._st_header(header) if isinstance(header, dict) else head
    except Exception:  # noqa: BLE001 - not JSON any more: byte mutations only
        return atheris.Mutate(data, max_size)
    out = _seeds.pack_checkpoint(config, head)
    return out if len(out) <= max_size else atheris.Mutate(data, max_size)


def one_input(data: bytes) -> None:
    import _seeds

    from fun_asr.converter.plan import place
    from fun_asr.model.checkpoint import Checkpoint, CheckpointError
    from fun_asr.model.hparams import ConfigError
    from fun_asr.model.metadata import check_tensors, gguf_metadata
    from fun_asr.model.native import load_model
    from fun_asr.model.tensor_names import tensor_table

    allowed = (CheckpointError, ConfigError, RuntimeError)
    assert _dir is not None
    config, head = _seeds.unpack_checkpoint(data)
    (_dir / "config.json").write_bytes(config)
    st = _dir / "model.safetensors"
    with open(st, "wb") as f:
        f.write(head)
        size = _claimed_size(head)
        if len(head) < size <= MAX_DATA:
            f.truncate(size)
    try:
        ckpt = Checkpoint.open(_dir)
        try:
            hp = ckpt.hparams
            entries = tensor_table(hp)
            check_tensors(ckpt, entries)
            for package in ("q8_0", "q4_k_m"):
                [place(e, package, hp) for e in entries]
            gguf_metadata(ckpt, hp, "q8_0")
        finally:
            ckpt.close()
        load_model(_dir, device="cpu", threads=1)
    except allowed as exc:
        _fuzzlib.feedback(exc)


if __name__ == "__main__":
    _fuzzlib.main("safetensors", sys.modules[__name__])
