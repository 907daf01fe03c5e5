"""The 20-word demo model shipped with the package (``-m demo``): a tiny Fun-ASR-Nano trained here by
``tools/train_tiny.py`` on espeak-ng speech of 20 English words, stored compactly in ``demo_model/``.

It knows only ``zero`` … ``nine``, ``yes no up down left right stop go on off`` and is meant to show the
pipeline working where the real model cannot be downloaded; it is never used unless asked for. FunASR's FSMN-VAD
(the real trained weights) ships beside it (:func:`vad_dir`) and is embedded in its GGUF.
:func:`build_checkpoint` rebuilds its full Hugging Face layout checkpoint: the stored non-embedding weights
(matrices as F16, written back as F32), the trained rows of the token embedding, and the untrained rows
regenerated from a fixed seed (numpy + safetensors only).
"""

from __future__ import annotations

import hashlib
import json
import shutil
from importlib import resources
from pathlib import Path

import numpy as np

NAME = "demo"
WORDS = ("zero one two three four five six seven eight nine "
         "yes no up down left right stop go on off").split()
# How fun-asr-serve names it (GET /v1/models, the web page) unless --model-id says otherwise, and what it is.
SERVED_ID = "fun-asr-demo-20-words"
SUMMARY = (f"the 20-word demo model (-m demo), a tiny model trained on synthetic speech: it knows only "
           f"{' '.join(WORDS[:10])}, {' '.join(WORDS[10:])}; not a model for real speech")
# What the checkpoint folder holds besides model.safetensors and tokenizer.json (copied as they are).
PLAIN_FILES = ("config.json", "generation_config.json", "tokenizer_config.json", "chat_template.jinja",
               "preprocessor_config.json")
VAD_FOLDER = "fsmn-vad"
VAD_FILES = ("model.pt", "config.yaml", "am.mvn")  # what the converter reads
QWEN_FIRST_SPECIAL_ID = 151643
# Raised when what the demo's GGUF records changes, so that a GGUF cached by an older fun-asr is built again
# (2: its FSMN-VAD's source is the package-relative fun_asr/model/demo_model/fsmn-vad, not an install path).
GGUF_RECIPE = 2
EMBEDDING_KEY = "model.language_model.embed_tokens.weight"


def artifact_dir() -> Path:
    """The folder of the stored demo model inside the installed package."""
    return Path(str(resources.files("fun_asr").joinpath("model", "demo_model")))


def manifest(artifact: Path | None = None) -> dict:
    return json.loads(((artifact or artifact_dir()) / "manifest.json").read_text("utf-8"))


def vad_dir(artifact: Path | None = None) -> Path:
    """FunASR's FSMN-VAD (its trained weights, Apache-2.0: THIRD_PARTY_NOTICES.md) in FunASR's folder layout
    (``model.pt``, ``config.yaml``, ``am.mvn``), shipped with the demo so that ``-m demo`` runs FunASR's whole
    pipeline offline: speech-only segments, streaming, the realtime WebSocket."""
    return (artifact or artifact_dir()) / VAD_FOLDER


def fingerprint(artifact: Path | None = None) -> str:
    """A short hash of the stored files and of :data:`GGUF_RECIPE`: the cache key of the demo's converted GGUF."""
    art = artifact or artifact_dir()
    h = hashlib.sha256(f"recipe {GGUF_RECIPE}\0".encode())
    names = [*PLAIN_FILES, "tokenizer.base.json", "manifest.json", "weights.safetensors"]
    names += [f"{VAD_FOLDER}/{name}" for name in VAD_FILES]
    for name in names:
        h.update(name.encode() + b"\0" + (art / name).read_bytes())
    return h.hexdigest()[:16]


def embedding_base(vocab: int, dim: int, seed: int, std: float) -> np.ndarray:
    """The token embedding before training: N(0, std^2) float32 from numpy's PCG64 with ``seed``.
    Training only changes the rows of the tokens it uses; the others stay exactly these values."""
    rng = np.random.default_rng(seed)
    return rng.standard_normal((vocab, dim), dtype=np.float32) * np.float32(std)


def full_tokenizer_json(base_json: str) -> str:
    """tokenizer.base.json -> tokenizer.json: the vocabulary padded with unreachable filler entries up
    to Qwen's first special id, so the added special tokens keep Qwen's ids (151643 ...)."""
    data = json.loads(base_json)
    vocab = data["model"]["vocab"]
    for i in range(len(vocab), QWEN_FIRST_SPECIAL_ID):
        vocab[f"\u2400filler{i}"] = i
    return json.dumps(data, ensure_ascii=False)


def build_checkpoint(dest: Path, artifact: Path | None = None) -> Path:
    """Writes the demo checkpoint (HF layout, F32 safetensors) into ``dest`` and returns ``dest``."""
    from safetensors.numpy import load_file, save_file

    art = artifact or artifact_dir()
    dest = Path(dest)
    dest.mkdir(parents=True, exist_ok=True)
    man = manifest(art)
    stored = load_file(str(art / "weights.safetensors"))
    emb = man["embedding"]
    table = embedding_base(emb["vocab"], emb["dim"], emb["seed"], emb["std"])
    ids = stored.pop("trained_rows.ids").astype(np.int64)
    table[ids] = stored.pop("trained_rows.weight").astype(np.float32)
    tensors = {name: np.ascontiguousarray(t.astype(np.float32)) for name, t in stored.items()}
    tensors[EMBEDDING_KEY] = table
    save_file(tensors, str(dest / "model.safetensors"), metadata={"format": "pt"})
    for name in PLAIN_FILES:
        shutil.copyfile(art / name, dest / name)
    (dest / "tokenizer.json").write_text(full_tokenizer_json((art / "tokenizer.base.json").read_text("utf-8")),
                                         "utf-8")
    return dest
