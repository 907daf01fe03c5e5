#!/usr/bin/env python3
"""Fuzz ``model.pt`` bytes -> ``fun_asr.model.torch_pickle`` (read_pickle, iter_tensors, load_state_dict).

Seeds: small ``torch.save`` checkpoints (every dtype, strided views, shared storages, Parameters, nested and
wrapped state_dicts), or FunASR's real FSMN-VAD ``model.pt`` when torch is not importable. The mutator works
inside the zip half of the time (mutates ``data.pkl``, a storage, or an entry's name, then re-zips), so the
pickle reader itself is exercised, not only the zip checks. Documented error: ModelFileError (a ValueError);
anything else, or a crash, is a finding.

    python tools/fuzz/fuzz_torch_pickle.py [-max_total_time=S] [-atheris_runs=N] | --replay FILES...
"""

from __future__ import annotations

import io
import os
import sys
import tempfile
import zipfile
from pathlib import Path

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import _fuzzlib  # noqa: E402

MODULES = ["fun_asr.model.torch_pickle"]
_path: Path | None = None


def seeds(out: Path) -> None:
    import _seeds

    for name, data in _seeds.model_pt_files().items():
        (out / name).write_bytes(data)


def setup() -> None:
    global _path
    shm = Path("/dev/shm")
    _path = Path(tempfile.mkdtemp(prefix="fun-asr-fuzz-pt-", dir=shm if shm.is_dir() else None)) / "model.pt"


def custom_mutator(data: bytes, max_size: int, seed: int) -> bytes:
    import random

    import atheris

    rng = random.Random(seed)
    if rng.random() < 0.4:
        return atheris.Mutate(data, max_size)
    try:
        with zipfile.ZipFile(io.BytesIO(data)) as z:
            entries = [(i.filename, z.read(i)) for i in z.infolist()]
    except Exception:  # noqa: BLE001 - not a readable zip: bytes only
        return atheris.Mutate(data, max_size)
    if not entries:
        return atheris.Mutate(data, max_size)
    pkl = [i for i, (n, _) in enumerate(entries) if n.endswith("data.pkl")]
    i = pkl[0] if pkl and rng.random() < 0.6 else rng.randrange(len(entries))
    name, body = entries[i]
    op = rng.random()
    if op < 0.75:
        body = atheris.Mutate(body, max(len(body) * 2, 64))
    elif op < 0.85:
        name = name.replace("data/", rng.choice(["data/../", "data/x", "Data/", "data//"]), 1)
    elif op < 0.92:
        del entries[i]
        name = None  # type: ignore[assignment]
    else:
        entries.append((rng.choice(["archive/data.pkl", "other/data.pkl", "archive/byteorder"]), b"big"))
    if name is not None:
        entries[i] = (name, body)
    out = io.BytesIO()
    with zipfile.ZipFile(out, "w", zipfile.ZIP_STORED) as z:
        for n, b in entries:
            z.writestr(n, b)
    result = out.getvalue()
    return result if len(result) <= max_size else atheris.Mutate(data, max_size)


def one_input(data: bytes) -> None:
    from fun_asr.model.torch_pickle import ModelFileError, iter_tensors, load_state_dict, read_pickle

    assert _path is not None
    _path.write_bytes(data)
    try:
        tree = read_pickle(_path)
        for _name, t in iter_tensors(tree):
            t.numpy()
        load_state_dict(_path)
    except ModelFileError as exc:
        _fuzzlib.feedback(exc)


if __name__ == "__main__":
    _fuzzlib.main("torch_pickle", sys.modules[__name__])
