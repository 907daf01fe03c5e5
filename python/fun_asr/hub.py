"""Resolving a model argument: a GGUF file, a checkpoint folder, or a Hugging Face repo id.

A repo id is downloaded once with huggingface_hub (into its usual cache; HF_HUB_OFFLINE=1 uses the
cache only) and converted once into fun-asr's cache (~/.cache/fun-asr/models, or
$FUN_ASR_CACHE_DIR/models), so later sessions start from the GGUF.
"""

from __future__ import annotations

import logging
import os
import re
from pathlib import Path

from fun_asr.spec import load_spec

log = logging.getLogger("fun_asr")

_SPEC = load_spec()
DEFAULT_REPO = _SPEC["upstream"]["repo_id"]
DEFAULT_REVISION = _SPEC["upstream"]["revision"]
CHECKPOINT_FILES = [
    "config.json", "model.safetensors", "model-*.safetensors", "model.safetensors.index.json", "tokenizer.json",
    "tokenizer_config.json", "chat_template.jinja", "chat_template.json", "preprocessor_config.json",
    "generation_config.json",
]
_REPO_ID = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+$")


def cache_dir() -> Path:
    root = os.environ.get("FUN_ASR_CACHE_DIR")
    if root:
        return Path(root)
    xdg = os.environ.get("XDG_CACHE_HOME")
    return (Path(xdg) if xdg else Path.home() / ".cache") / "fun-asr"


def resolve_model(model: str | os.PathLike[str], package_type: str, revision: str | None = None,
                  progress: bool = True) -> Path:
    """Local path for `model`: itself if it exists, else the converted GGUF of a hub repo id."""
    path = Path(model).expanduser()
    if path.exists():
        return path
    name = str(model)
    if not _REPO_ID.match(name):
        raise FileNotFoundError(
            f"{name}: not a file, not a folder, and not a Hugging Face repo id (owner/name); give a .gguf file, "
            f"a checkpoint folder, or e.g. {DEFAULT_REPO}"
        )
    if revision is None and name == DEFAULT_REPO:
        revision = DEFAULT_REVISION
    from huggingface_hub import snapshot_download

    try:
        snapshot = Path(snapshot_download(name, revision=revision, allow_patterns=CHECKPOINT_FILES)).resolve()
    except Exception as exc:  # huggingface_hub raises many types (offline, 404, auth, network)
        offline = os.environ.get("HF_HUB_OFFLINE", "") not in ("", "0")
        hint = " (HF_HUB_OFFLINE is set and the model is not in the local hub cache)" if offline else ""
        raise FileNotFoundError(f"cannot fetch {name}@{revision or 'main'}{hint}: {exc}") from exc
    commit = snapshot.name
    out = cache_dir() / "models" / f"{name.replace('/', '--')}--{commit[:12]}-{package_type}.gguf"
    if not out.is_file():
        from fun_asr.converter import convert

        log.info("converting %s@%s to %s (%s), once", name, commit[:12], out, package_type)
        report = convert(snapshot, out, package_type, progress=progress, repo_id=name, revision=commit)
        log.info("%s", report.summary())
    return out
