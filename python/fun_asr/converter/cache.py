"""Where fun-asr keeps what it converts: ``$FUN_ASR_CACHE_DIR``, else ``$XDG_CACHE_HOME/fun-asr``, else
``~/.cache/fun-asr`` (GGUFs under ``models/``)."""

from __future__ import annotations

import os
from pathlib import Path


def cache_dir() -> Path:
    root = os.environ.get("FUN_ASR_CACHE_DIR")
    if root:
        return Path(root)
    xdg = os.environ.get("XDG_CACHE_HOME")
    return (Path(xdg) if xdg else Path.home() / ".cache") / "fun-asr"
