"""`fun-asr-convert --inspect FILE.gguf`: what a GGUF package holds."""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Any

import gguf

from fun_asr.model.gguf_file import field_value, open_gguf


def inspect_gguf(path: str | Path) -> dict[str, Any]:
    """Architecture, per-type tensor counts and bytes, metadata keys and tensor count."""
    p = Path(path)
    if p.is_dir():
        raise ValueError(f"{p}: is a directory; --inspect takes a .gguf file")
    if not p.is_file():
        raise FileNotFoundError(f"{p}: no such file")
    from fun_asr import _core

    try:
        _core.check_gguf(str(p))  # header + every tensor inside the file: names truncation precisely
    except RuntimeError as exc:
        raise ValueError(str(exc)) from None
    reader = open_gguf(p)
    types: Counter[str] = Counter()
    type_bytes: Counter[str] = Counter()
    for t in reader.tensors:
        types[t.tensor_type.name] += 1
        type_bytes[t.tensor_type.name] += int(t.n_bytes)
    meta = {k: field_value(f) for k, f in reader.fields.items() if not k.startswith("GGUF.")}
    return {
        "path": str(p),
        "file_bytes": p.stat().st_size,
        "architecture": meta.get("general.architecture"),
        "file_type": meta.get("general.file_type"),
        "file_type_name": file_type_name(meta.get("general.file_type")),
        "tensor_count": len(reader.tensors),
        "tensor_types": dict(types),
        "tensor_type_bytes": dict(type_bytes),
        "metadata_keys": sorted(meta),
        "metadata": meta,
        "layout": meta.get("fun_asr_nano.source.layout"),
        "ctc": "fun_asr_nano.ctc.block_count" in meta,
        "ctc_unavailable": meta.get("fun_asr_nano.ctc.unavailable"),
        "vad": meta.get("fsmn_vad.source", "yes") if "fsmn_vad.block_count" in meta else None,
        "speaker": meta.get("campplus.source", "yes") if "campplus.embedding_length" in meta else None,
    }


def file_type_name(file_type: int | None) -> str:
    """general.file_type as the package type name fun-asr-convert uses (q8_0, ...), with the number."""
    from fun_asr.converter.plan import FILE_TYPE

    names = {v: k for k, v in FILE_TYPE.items()}
    if file_type is None:
        return "not recorded"
    if file_type in names:
        return f"{names[file_type]} ({file_type})"
    try:
        return f"{gguf.LlamaFileType(file_type).name.removeprefix('MOSTLY_').lower()} ({file_type})"
    except ValueError:
        return f"unknown ({file_type})"


def format_inspection(info: dict[str, Any]) -> str:
    lines = [
        f"file          {info['path']} ({info['file_bytes'] / 1e6:.1f} MB)",
        f"architecture  {info['architecture']}",
        f"file type     {file_type_name(info['file_type'])}",
        f"tensors       {info['tensor_count']}",
    ]
    for name, count in sorted(info["tensor_types"].items()):
        lines.append(f"  {name:<6} {count:5d} tensors  {info['tensor_type_bytes'][name] / 1e6:10.1f} MB")
    if info.get("layout"):
        lines.append(f"source layout {info['layout']}")
    if info.get("architecture") == "fun_asr_nano":
        lines.append("CTC head      " + ("yes (token timestamps)" if info.get("ctc")
                                         else f"no: {info.get('ctc_unavailable') or 'not recorded'}"))
        lines.append("FSMN-VAD      " + (f"embedded ({info['vad']})" if info.get("vad")
                                         else "none (re-convert with --vad-model to embed one)"))
        lines.append("CAM++ speaker " + (f"embedded ({info['speaker']})" if info.get("speaker")
                                         else "none (re-convert with --speaker-model to embed one)"))
    lines.append(f"metadata keys ({len(info['metadata_keys'])}):")
    for key in info["metadata_keys"]:
        v = info["metadata"][key]
        if isinstance(v, str):
            shown = repr(v if len(v) <= 60 else v[:57] + "...") + (f" ({len(v)} chars)" if len(v) > 60 else "")
        elif isinstance(v, list):
            shown = f"[{', '.join(map(str, v[:8]))}{', ...' if len(v) > 8 else ''}] ({len(v)} items)"
        else:
            shown = repr(v)
        lines.append(f"  {key} = {shown}")
    return "\n".join(lines)
