"""Writing a user's files safely: what exists is refused unless the user asked to replace it, and a file is
written whole or not at all (a temporary file beside it, then one rename)."""

from __future__ import annotations

import os
import tempfile
from collections.abc import Callable, Iterable
from pathlib import Path


class ExistingOutputError(FileExistsError):
    """Outputs that already exist, and the flag that allows replacing them."""

    def __init__(self, paths: list[Path], flag: str) -> None:
        self.paths = paths
        self.flag = flag
        super().__init__(existing_message(paths, flag))


def existing_message(paths: list[Path], flag: str, shown: int = 3, *, note: str = "") -> str:
    """One line: the output that exists (or how many, and the first few), and the flag that replaces it or them.
    ``note`` follows "already exist(s)" (", not written by fun-asr-batch")."""
    names = ", ".join(str(p) for p in paths[:shown])
    more = f" and {len(paths) - shown} more" if len(paths) > shown else ""
    if len(paths) == 1:
        return f"{names} already exists{note}; add {flag} to replace it, or write elsewhere"
    return f"{len(paths)} outputs already exist{note}: {names}{more}; add {flag} to replace them, or write elsewhere"


def existing_outputs(paths: Iterable[str | os.PathLike[str]]) -> list[Path]:
    """The paths (in order, once each) that already exist: a file, a link (even a broken one), anything."""
    out: list[Path] = []
    seen: set[str] = set()
    for p in paths:
        key = os.path.abspath(p)
        if key not in seen and os.path.lexists(p):
            seen.add(key)
            out.append(Path(p))
    return out


def check_new_outputs(paths: Iterable[str | os.PathLike[str]], overwrite: bool, flag: str = "--overwrite") -> None:
    """ExistingOutputError naming the outputs that exist, unless ``overwrite``."""
    if overwrite:
        return
    found = existing_outputs(paths)
    if found:
        raise ExistingOutputError(found, flag)


def _umask() -> int:
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def move_into_place(tmp: Path, path: Path, *, overwrite: bool, exists: Callable[[], Exception]) -> None:
    """A finished temporary file beside ``path`` moved to ``path`` with the usual permissions (umask): with
    ``overwrite`` by one rename (a reader sees the old file or the new one); without it never over a file that
    appeared meanwhile (a hard link fails on an existing name), raising ``exists()`` and leaving ``tmp`` for the
    caller to remove."""
    os.chmod(tmp, 0o666 & ~_umask())  # mkstemp made it 0600
    if overwrite:
        os.replace(tmp, path)
        return
    try:
        os.link(tmp, path)  # fails if path exists: never replaces what appeared meanwhile
    except FileExistsError:
        raise exists() from None
    except OSError:  # a file system without hard links: check, then rename
        if os.path.lexists(path):
            raise exists() from None
        os.replace(tmp, path)
    else:
        os.unlink(tmp)


def write_atomic(path: str | os.PathLike[str], data: str | bytes, *, overwrite: bool,
                 flag: str = "--overwrite") -> None:
    """Writes ``data`` (text as UTF-8) to ``path`` whole or not at all: a temporary file in the same folder,
    flushed to disk, then moved into place with the usual permissions (umask). Without ``overwrite`` an existing
    ``path`` is never replaced, even one that appeared after the run's checks (ExistingOutputError); with it, a
    reader sees the old file or the new one, never a part. A regular file only: a directory, device or pipe at
    ``path`` is refused."""
    path = Path(path)
    if os.path.lexists(path) and overwrite and (path.is_dir() or (path.exists() and not path.is_file())):
        raise IsADirectoryError(f"{path}: exists and is not a regular file; refusing to replace it")
    payload = data.encode("utf-8") if isinstance(data, str) else bytes(data)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".part")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(payload)
            f.flush()
            os.fsync(f.fileno())
        move_into_place(Path(tmp), path, overwrite=overwrite, exists=lambda: ExistingOutputError([path], flag))
    finally:
        if os.path.lexists(tmp):
            os.unlink(tmp)


__all__ = ["ExistingOutputError", "check_new_outputs", "existing_message", "existing_outputs", "move_into_place",
           "write_atomic"]
