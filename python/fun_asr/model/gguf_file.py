"""GGUF files on the Python side, one place for every model family (ASR package, FSMN-VAD, CAM++): opening one
with gguf-py (a clear error naming the file when it cannot be read), its metadata as plain Python values, and
the ``general.*`` + ``<arch>.*`` keys a sub-model's GGUF carries. The native loader (``fun_asr._core``) reads
the tensors for inference; this module serves metadata, inspection and embedding."""

from __future__ import annotations

import json
import os
from collections.abc import Iterable
from pathlib import Path
from typing import Any

_UNSET = object()
_SKIP = object()


def open_gguf(path: str | os.PathLike[str], error: type[Exception] = ValueError) -> Any:
    """A ``gguf.GGUFReader`` on ``path``; a file gguf-py cannot parse raises ``error("PATH: not a readable GGUF
    file (why)")`` (gguf-py itself raises ValueError, struct.error, IndexError, ... on bad files)."""
    import gguf

    p = Path(path)
    try:
        return gguf.GGUFReader(p)
    except Exception as exc:  # noqa: BLE001 - see above
        raise error(f"{p}: not a readable GGUF file ({exc})") from None


def field_value(field: Any, default: Any = _UNSET) -> Any:
    """One metadata field's value as a Python value; a field type gguf-py cannot turn into one gives
    ``default`` (without a default: ``<its types>``, as ``fun-asr-convert --inspect`` shows it)."""
    try:
        return field.contents()
    except Exception:  # noqa: BLE001 - unusual field types
        return f"<{field.types}>" if default is _UNSET else default


def metadata_fields(reader: Any, prefixes: Iterable[str] | None = None) -> dict[str, Any]:
    """The reader's metadata as plain values: every key but gguf-py's own ``GGUF.*`` ones, or only the keys that
    start with one of ``prefixes``; fields of unusual types are left out."""
    keep = tuple(prefixes) if prefixes is not None else None
    out: dict[str, Any] = {}
    for key, f in reader.fields.items():
        if key.startswith("GGUF.") or (keep is not None and not key.startswith(keep)):
            continue
        value = field_value(f, default=_SKIP)
        if value is not _SKIP:
            out[key] = value
    return out


def source_name(path: str | os.PathLike[str]) -> str:
    """Where a sub-model came from as a GGUF records it (``<arch>.source``), machine-independent where it can be:
    a file or folder inside the fun_asr package -> ``fun_asr/<its path there>`` (the demo's FSMN-VAD:
    ``fun_asr/model/demo_model/fsmn-vad``, not where the package is installed), one inside a Hugging Face hub
    cache snapshot (``models--owner--name/snapshots/<commit>/``) -> the repo id ``owner/name``; any other path
    as it is, resolved (the user's own file, which only its path names)."""
    p = Path(path).resolve()
    package = Path(__file__).resolve().parents[1]  # the fun_asr package folder
    if p.is_relative_to(package):
        return (Path(package.name) / p.relative_to(package)).as_posix()
    parts = p.parts
    for folder, below in zip(parts, parts[1:], strict=False):
        if folder.startswith("models--") and below == "snapshots" and "--" in folder[len("models--"):]:
            return folder[len("models--"):].replace("--", "/", 1)
    return str(p)


def submodel_metadata(arch: str, conf: dict[str, Any], hp: dict[str, Any], repo_id: str | None = None,
                      revision: str | None = None) -> dict[str, Any]:
    """The metadata of a sub-model's own GGUF (FSMN-VAD, CAM++): ``general.*`` from its spec
    (python/fun_asr/specs), where it came from, its hyperparameters as ``<arch>.<name>``, its FunASR config
    (``<arch>.config_json``) and spec (``<arch>.model_spec``)."""
    from fun_asr.model.spec import load_spec, spec_text

    spec = load_spec(arch)
    meta: dict[str, Any] = {
        "general.architecture": arch,
        "general.type": "model",
        "general.name": spec["name"],
        "general.license": spec["license"]["name"],
        "general.license.link": spec["license"]["url"],
        "general.file_type": 0,
    }
    if repo_id:
        meta["general.source.huggingface.repository"] = repo_id
    if revision:
        meta["general.source.revision"] = revision
    for k, v in hp.items():
        meta[f"{arch}.{k}"] = v
    meta[f"{arch}.config_json"] = json.dumps(conf, ensure_ascii=False)
    meta[f"{arch}.model_spec"] = spec_text(arch)
    return meta
