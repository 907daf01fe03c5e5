"""What a conversion writes and refuses: the report, GGUF metadata writing, output-path safety."""

from __future__ import annotations

import os
import stat
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import gguf

from fun_asr.errors import FunAsrError
from fun_asr.outputs import move_into_place


@dataclass
class ConversionReport:
    path: Path
    package_type: str
    tensor_count: int
    file_bytes: int
    seconds: float
    type_counts: dict[str, int] = field(default_factory=dict)
    fallbacks: list[tuple[str, str, str]] = field(default_factory=list)  # (tensor, wanted, used)
    layout: str = "hf"  # hf | funasr | fsmn_vad | campplus: the layout that was read
    ctc: bool = False  # the CTC head (timestamps) was stored
    ctc_unavailable: str | None = None  # why not, when it was not
    vad: str | None = None  # the FSMN-VAD embedded in the package (where it came from), if any
    speaker: str | None = None  # the CAM++ speaker model embedded in the package (where it came from), if any

    def summary(self) -> str:
        counts = ", ".join(f"{k}: {v}" for k, v in sorted(self.type_counts.items()))
        lines = [
            f"wrote {self.path} ({self.file_bytes / 1e6:.1f} MB, {self.tensor_count} tensors, "
            f"{self.package_type}) in {self.seconds:.1f} s — {counts}"
        ]
        if self.layout not in ("fsmn_vad", "campplus"):
            lines.append("  CTC head stored: word timestamps available" if self.ctc
                         else f"  no CTC head: {self.ctc_unavailable}")
            lines.append(f"  FSMN-VAD embedded: {self.vad}" if self.vad else
                         "  no FSMN-VAD embedded: long audio is cut at pauses unless a VAD is given at run time "
                         "(--vad-model); re-convert with --vad-model to embed one")
            if self.speaker:
                lines.append(f"  CAM++ speaker model embedded: {self.speaker}")
        for name, wanted, used in self.fallbacks:
            lines.append(f"  fallback: {name} {wanted} -> {used} (row length not a multiple of the {wanted} block)")
        return "\n".join(lines)


def write_metadata(w: gguf.GGUFWriter, meta: dict[str, Any]) -> None:
    for key, value in meta.items():
        if key == "general.architecture":
            continue  # GGUFWriter writes it from its arch argument
        if isinstance(value, bool):
            w.add_bool(key, value)
        elif isinstance(value, int):
            w.add_uint32(key, value)
        elif isinstance(value, float):
            w.add_float32(key, value)
        elif isinstance(value, str):
            w.add_string(key, value)
        else:
            w.add_array(key, list(value))


def write_gguf(out: str | os.PathLike[str], arch: str, meta: dict[str, Any],
               tensors: list[tuple[str, Any, Any]]) -> None:
    """A small GGUF written in one go (test fixtures, derived packages): `meta` as write_metadata writes it,
    then `tensors` as (name, array, raw ggml type or None for a plain array), in order."""
    w = gguf.GGUFWriter(out, arch)
    write_metadata(w, meta)
    for name, data, raw_dtype in tensors:
        w.add_tensor(name, data, raw_dtype=raw_dtype)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


class OutputError(ValueError):
    """The output path would destroy something: an input, a non-regular file, or (without
    overwrite) an existing file."""


class ExistingOutput(FunAsrError, OutputError):
    """The output exists and ``overwrite`` is False (code ``output.exists``)."""


def _exists(out: Path, what: str) -> ExistingOutput:
    return ExistingOutput("output.exists", "{out}: " + what + "; pass {h[force]} to replace it", option="overwrite",
                          out=out)


def check_output(out: Path, src: Path, overwrite: bool) -> None:
    """Refuses an output that is (or is inside) the checkpoint being read, that exists and is not a
    regular file (a device, a directory, ...), or that exists at all unless ``overwrite``."""
    src = src.resolve()
    target = out.expanduser().absolute()
    try:
        parent = target.parent.resolve()
    except OSError:
        parent = target.parent
    if parent == src or src in parent.parents:
        raise OutputError(f"{out}: is inside the checkpoint folder being read ({src}); write the GGUF elsewhere "
                          "(default: beside the folder, SRC-TYPE.gguf)")
    if os.path.lexists(target):
        try:
            st = target.stat()
        except OSError as exc:  # a dangling symlink
            raise OutputError(f"{out}: exists and cannot be examined ({exc.strerror}); remove it first") from None
        if target.is_dir():
            raise OutputError(f"{out}: is a directory; give the output .gguf file path")
        if not stat.S_ISREG(st.st_mode):
            raise OutputError(f"{out}: exists and is not a regular file (a device, pipe or socket); refusing to "
                              "replace it")
        inputs = [p for p in src.iterdir() if p.is_file()] if src.is_dir() else [src]
        for p in inputs:
            try:
                same = os.path.samefile(p, target)
            except OSError:
                same = False
            if same:
                raise OutputError(f"{out}: is the same file as the input {p}; write the GGUF elsewhere")
        if not overwrite:
            raise _exists(out, "already exists")


@contextmanager
def atomic_output(out: Path, src: Path, overwrite: bool) -> Iterator[Path]:
    """A temporary file beside ``out`` to write the GGUF into, moved into place when the block ends: without
    ``overwrite`` never over a file that appeared meanwhile (a hard link fails on an existing name), and the
    output rules (check_output) checked again just before the move. A failure leaves no partial file."""
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp_name = tempfile.mkstemp(prefix=f".{out.name}.", suffix=".partial", dir=out.parent)
    except OSError as exc:
        raise OutputError(f"{out}: cannot write there ({exc.strerror or exc})") from None
    os.close(fd)
    tmp = Path(tmp_name)
    try:
        yield tmp
        check_output(out, src, overwrite)  # again: the path may have appeared meanwhile
        move_into_place(tmp, out, overwrite=overwrite, exists=lambda: _exists(out, "appeared while converting"))
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def write_gguf_file(out: Path, src: Path, arch: str, meta: dict[str, Any], tensors: list[tuple[str, Any]],
                    overwrite: bool) -> None:
    """A small GGUF (metadata + whole numpy tensors: the VAD, the speaker model) written whole
    (:func:`atomic_output`)."""
    with atomic_output(out, src, overwrite) as tmp:
        w = gguf.GGUFWriter(tmp, arch)
        write_metadata(w, meta)
        for name, arr in tensors:
            w.add_tensor(name, arr)
        w.write_header_to_file()
        w.write_kv_data_to_file()
        w.write_tensors_to_file()
        w.close()
