#!/usr/bin/env python3
"""Fuzz GGUF bytes -> ``fun_asr._core.check_gguf`` / ``fun_asr.load_model`` / ``fun_asr.vad.files.load_native``.

Seeds: the micro Fun-ASR-Nano model converted by ``fun_asr.convert`` (f32, f16, q8_0, vocabulary cut to 64
tokens), FunASR's real FSMN-VAD converted by ``convert_vad`` and a micro version of it, plus a GGUF without
tensors. A file the loader accepts is also run: a few encoder frames and decoding steps (the ASR model), one
forward pass (the VAD). Documented errors: RuntimeError (the native loader), ValueError (VadModelError,
invalid arguments), FileNotFoundError. Anything else, or a crash of the process, is a finding.

    python tools/fuzz/fuzz_gguf.py [-max_total_time=S] [-atheris_runs=N] | --replay FILES...
"""

from __future__ import annotations

import os
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import _fuzzlib  # noqa: E402

MODULES = ["fun_asr", "fun_asr.model.native", "fun_asr.converter.vad", "fun_asr.vad"]
ALLOWED = (RuntimeError, ValueError, FileNotFoundError)
_path: Path | None = None


def seeds(out: Path) -> None:
    import _seeds

    for package in ("f32", "f16", "q8_0"):
        (out / f"micro-v64-{package}.gguf").write_bytes(_seeds.small_vocab_gguf(package).read_bytes())
    (out / "fsmn-vad-micro.gguf").write_bytes(_seeds.micro_vad_gguf().read_bytes())
    (out / "fsmn-vad.gguf").write_bytes(_seeds.vad_gguf().read_bytes())
    head = _seeds.small_vocab_gguf("q8_0").read_bytes()
    # the header alone: magic, version, tensor count 0, the same metadata count (truncated kv section)
    (out / "header-only.gguf").write_bytes(head[:4096])


def setup() -> None:
    global _path
    shm = Path("/dev/shm")
    d = tempfile.mkdtemp(prefix="fun-asr-fuzz-gguf-", dir=shm if shm.is_dir() else None)
    _path = Path(d) / "input.gguf"


_speech = None


def _clip():  # noqa: ANN202 - 0.6 s of speech
    global _speech
    if _speech is None:
        import _seeds

        _speech = _seeds.speech(0.6)
    return _speech


def _run_model(m: object) -> None:
    import numpy as np

    info = m.info()  # type: ignore[attr-defined]
    enc, dec = info["encoder"], info["decoder"]
    frames = max(1, min(7, enc["max_frames"]))
    emb = m.encode(np.full((frames, enc["input_size"]), 0.5, np.float32))  # type: ignore[attr-defined]
    m.generate(emb, 2, list(dec["eos_token_ids"])[:1])  # type: ignore[attr-defined]


def _run_vad(v: object) -> None:
    import numpy as np

    info = v.info()  # type: ignore[attr-defined]
    cache = np.zeros((info["n_layers"], info["lorder"] - 1, info["proj_dim"]), np.float32)
    v.forward(np.full((3, info["input_dim"]), 0.25, np.float32), cache, -1)  # type: ignore[attr-defined]


# -- a structure-aware mutator: parse the GGUF, change one field, write it back -------------------------------

_FIXED = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?", 10: "<Q", 11: "<q", 12: "<d"}
_INTS = [0, 1, 2, 3, 5, 7, 16, 31, 32, 33, 63, 64, 65, 255, 256, 4095, 4096, 4097, 65535, 65536, 2**24, 2**24 + 1,
         2**31 - 1, 2**31, 2**32 - 1, 2**32, 2**62, 2**63 - 1, 2**63, 2**64 - 1]


def _parse(data: bytes):  # noqa: ANN202 - (version, kvs, tensors, data section) or None
    import struct

    pos = 0

    def take(fmt: str):  # noqa: ANN202
        nonlocal pos
        v = struct.unpack_from(fmt, data, pos)[0]
        pos += struct.calcsize(fmt)
        return v

    def text() -> bytes:
        nonlocal pos
        n = take("<Q")
        if n > len(data) - pos:
            raise ValueError("string")
        pos += n
        return data[pos - n : pos]

    def value(t: int) -> bytes:  # raw bytes of one value of type t
        start = pos
        if t == 8:
            text()
        elif t == 9:
            sub, n = take("<I"), take("<Q")
            if n > len(data):
                raise ValueError("array")
            for _ in range(n):
                value(sub)
        else:
            take(_FIXED[t])
        return data[start:pos]

    if data[:4] != b"GGUF":
        return None
    pos = 4
    version, n_t, n_kv = take("<I"), take("<Q"), take("<Q")
    if n_t > 4096 or n_kv > 4096:
        return None
    kvs = []
    for _ in range(n_kv):
        key = text()
        t = take("<I")
        kvs.append([key, t, value(t)])
    tensors = []
    for _ in range(n_t):
        name = text()
        nd = take("<I")
        if nd > 8:
            return None
        dims = [take("<Q") for _ in range(nd)]
        tensors.append([name, dims, take("<I"), take("<Q")])
    align = 32
    return version, kvs, tensors, data[(pos + align - 1) // align * align :]


def _serialize(version: int, kvs: list, tensors: list, blob: bytes) -> bytes:
    import struct

    out = [b"GGUF", struct.pack("<IQQ", version, len(tensors), len(kvs))]
    for key, t, raw in kvs:
        out += [struct.pack("<Q", len(key)), key, struct.pack("<I", t), raw]
    for name, dims, t, off in tensors:
        out += [struct.pack("<Q", len(name)), name, struct.pack("<I", len(dims))]
        out += [struct.pack("<Q", d & (2**64 - 1)) for d in dims]
        out.append(struct.pack("<IQ", t & 0xFFFFFFFF, off & (2**64 - 1)))
    head = b"".join(out)
    return head + b"\0" * (-len(head) % 32) + blob


def custom_mutator(data: bytes, max_size: int, seed: int) -> bytes:
    """Half of the time libFuzzer's byte mutations; otherwise one GGUF-aware change: a metadata value (an integer
    set to 0/huge/2**k+-1, another type, an array's length), a tensor's dimensions, type id or data offset, the data
    section cut or grown, a key or tensor record dropped or duplicated."""
    import json
    import random
    import struct

    import atheris

    rng = random.Random(seed)
    if rng.random() < 0.5:
        return atheris.Mutate(data, max_size)
    try:
        parsed = _parse(data)
    except Exception:  # noqa: BLE001
        parsed = None
    if parsed is None:
        return atheris.Mutate(data, max_size)
    version, kvs, tensors, blob = parsed
    op = rng.random()
    conf = [kv for kv in kvs if kv[0] == b"fsmn_vad.config_json" and kv[1] == 8]
    if conf and op < 0.15:  # the VAD's config.yaml (as JSON): a structure-aware change to one of its values
        try:
            doc = _fuzzlib.mutate_json(json.loads(conf[0][2][8:]), rng)
            raw = json.dumps(doc).encode()
            conf[0][2] = struct.pack("<Q", len(raw)) + raw
        except Exception:  # noqa: BLE001
            return atheris.Mutate(data, max_size)
    elif op < 0.4 and kvs:
        kv = rng.choice(kvs)
        t = kv[1]
        if t in (6, 12) and rng.random() < 0.8:  # a float: zero, negative, tiny, huge, inf, nan
            v = rng.choice([0.0, -1.0, 1e-45, 1e-10, 0.5, 1e10, 3e38, float("inf"), float("-inf"), float("nan")])
            kv[2] = struct.pack(_FIXED[t], v)
        elif t in _FIXED and t not in (6, 7, 12) and rng.random() < 0.8:
            fmt = _FIXED[t]
            bits = struct.calcsize(fmt) * 8
            v = rng.choice(_INTS + [struct.unpack(fmt, kv[2])[0] + rng.choice([-1, 1, 2])])
            kv[2] = struct.pack(fmt.upper() if fmt[1].islower() else fmt, v % (2**bits)) if fmt[1] != "?" else kv[2]
            if fmt[1].islower():
                kv[2] = struct.pack(fmt, (v % (2**bits)) - (2**bits if v % (2**bits) >= 2 ** (bits - 1) else 0))
        elif t == 9 and len(kv[2]) >= 12:  # an array: lie about its length, or change its element type
            sub, n = struct.unpack_from("<IQ", kv[2])
            if rng.random() < 0.5:
                n = rng.choice([0, 1, n + 1, 2**20, 2**40])
            else:
                sub = rng.choice([0, 4, 5, 8, 9, 10, 13])
            kv[2] = struct.pack("<IQ", sub, n) + kv[2][12:]
        else:  # another type with a plausible value
            kv[1] = rng.choice([4, 5, 6, 7, 8, 10, 11])
            kv[2] = {8: struct.pack("<Q", 3) + b"abc", 6: struct.pack("<f", 1e30), 7: b"\x01"}.get(
                kv[1], struct.pack(_FIXED.get(kv[1], "<I"), 1))
    elif op < 0.8 and tensors:
        tr = rng.choice(tensors)
        which = rng.random()
        if which < 0.4 and tr[1]:
            i = rng.randrange(len(tr[1]))
            tr[1][i] = rng.choice([0, 1, tr[1][i] * 2, tr[1][i] + 1, 2**31, 2**62, 2**64 - 1, 2**63])
        elif which < 0.55:
            tr[1] = tr[1] + [1] if rng.random() < 0.5 else tr[1][:-1]
        elif which < 0.75:
            tr[2] = rng.choice([0, 1, 2, 3, 4, 8, 12, 14, 15, 30, 31, 39, 40, 2**31])
        else:
            tr[3] = rng.choice([0, tr[3] + 32, tr[3] - 32, len(blob), len(blob) + 32, 2**62, 2**64 - 32])
    elif op < 0.9:
        blob = blob[: rng.randrange(len(blob) + 1)] if rng.random() < 0.7 else blob + b"\0" * rng.choice([1, 32, 4096])
    elif kvs or tensors:
        seq = kvs if (rng.random() < 0.5 and kvs) or not tensors else tensors
        i = rng.randrange(len(seq))
        if rng.random() < 0.5:
            del seq[i]
        else:
            seq.insert(i, [x[:] if isinstance(x, list) else x for x in seq[i]])
    out = _serialize(version, kvs, tensors, blob)
    return out if len(out) <= max_size else atheris.Mutate(data, max_size)


def one_input(data: bytes) -> None:
    from fun_asr import _core, load_model
    from fun_asr.vad import FsmnVad
    from fun_asr.vad.files import load_native

    assert _path is not None
    _path.write_bytes(data)
    try:
        arch, _n = _core.check_gguf(str(_path))
    except ALLOWED as exc:
        _fuzzlib.feedback(exc)
        return
    if arch == "fsmn_vad":
        try:
            vad, _conf = load_native(_path, threads=1)
        except ALLOWED as exc:
            _fuzzlib.feedback(exc)
            return
        try:
            _run_vad(vad)
        except ALLOWED as exc:
            _fuzzlib.feedback(exc)
        try:  # what a Session does with it: the config checked, then segments of a short clip
            FsmnVad.load(_path, threads=1).segments(_clip())
        except ALLOWED as exc:
            _fuzzlib.feedback(exc)
        return
    try:
        model = load_model(_path, device="cpu", threads=1)
    except ALLOWED as exc:
        _fuzzlib.feedback(exc)
        return
    try:
        _run_model(model)
    except ALLOWED as exc:
        _fuzzlib.feedback(exc)


if __name__ == "__main__":
    _fuzzlib.main("gguf", sys.modules[__name__])
