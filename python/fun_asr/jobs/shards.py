"""A corpus job's output folder: shards appended and fsynced, the lock, and the refusal to write over an
input (results are read back by :mod:`fun_asr.jobs.records`)."""

from __future__ import annotations

import contextlib
import json
import os
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

from fun_asr.jobs.inputs import BatchError, Item, detect_format, has_magic, is_url, url_dirname
from fun_asr.jobs.records import EVAL_TABLE, SHARD_PREFIX, SUMMARY, scan_shard, shard_files


def drop_failed(out: Path) -> int:
    """Removes the failed records from the shards (each rewritten atomically); returns how many."""
    dropped = 0
    for shard in shard_files(out):
        recs = list(scan_shard(shard, repair=True))
        keep = [r for r in recs if not r.get("error")]
        if len(keep) == len(recs):
            continue
        dropped += len(recs) - len(keep)
        tmp = shard.with_suffix(".jsonl.tmp")
        with open(tmp, "wb") as f:
            f.write("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in keep).encode("utf-8"))
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, shard)
    return dropped


class ShardWriter:
    """Appends finished batches to ``shard-NNNNN.jsonl``: each batch in one write, flushed and
    fsynced before ``write`` returns. A run never appends to an older run's shard; a new shard
    starts after ``shard_size`` records."""

    def __init__(self, out: Path, shard_size: int = 1000) -> None:
        self.out = out
        self.shard_size = shard_size
        existing = [int(p.stem[len(SHARD_PREFIX):]) for p in shard_files(out) if p.stem[len(SHARD_PREFIX):].isdigit()]
        self.next_index = max(existing, default=-1) + 1
        self.f: Any = None
        self.count = 0
        self.written = 0
        self.paths: list[Path] = []

    def write(self, records: Sequence[dict]) -> None:
        """Appends the records; a shard never holds more than ``shard_size`` (a batch may span two)."""
        records = list(records)
        while records:
            if self.f is None or self.count >= self.shard_size:
                self.close()
                path = self.out / f"{SHARD_PREFIX}{self.next_index:05d}.jsonl"
                self.next_index += 1
                try:
                    self.f = open(path, "ab")  # noqa: SIM115 - kept open across batches
                except OSError as exc:
                    raise write_error(path, exc) from None
                self.paths.append(path)
                self.count = 0
            part, records = records[: self.shard_size - self.count], records[self.shard_size - self.count:]
            data = "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in part).encode("utf-8")
            try:
                self.f.write(data)
                self.f.flush()
                os.fsync(self.f.fileno())
            except OSError as exc:
                raise write_error(self.paths[-1], exc) from None
            self.count += len(part)
            self.written += len(part)

    def close(self) -> None:
        if self.f is not None:
            f, self.f = self.f, None
            with contextlib.suppress(OSError):  # a failed write was reported already
                f.close()


class OutputWriteError(OSError):
    """The job could not write to its output folder (a full disk, a read-only file system, permissions);
    what was written before is kept, so the same command resumes once the cause is fixed."""


def write_error(path: Path, exc: OSError) -> OutputWriteError:
    why = exc.strerror or str(exc)
    err = OutputWriteError(f"cannot write {path} ({why}); the results written so far are kept: fix that (free "
                           "space, permissions) or choose another output folder (-o), then rerun the same command "
                           "to resume")
    err.errno = exc.errno  # str(err) stays the sentence above (no "[Errno 28]")
    return err


OUTPUT_NAMES = (SUMMARY, f"{SUMMARY}.tmp", EVAL_TABLE, f"{EVAL_TABLE}.tmp", ".lock")


def _output_files(out: Path) -> list[Path]:
    """The files of ``out`` that a job writes, replaces or cuts (shards: a torn last line, --retry-failed)."""
    if not out.is_dir():
        return []
    files = [out / n for n in OUTPUT_NAMES] + shard_files(out) + sorted(out.glob(f"{SHARD_PREFIX}*.jsonl.tmp"))
    return [p for p in files if p.exists()]


def check_outputs_are_not_inputs(out: Path, inputs: Sequence[str], items: Sequence[Item],
                                 reference: str | None = None, input_format: str = "auto") -> None:
    """BatchError when a file the job writes under ``out`` is one of its inputs (a manifest, list,
    wav.scp or its text, the references, an audio file): the same file by path, symlink or hard link."""
    outputs: dict[tuple[int, int], Path] = {}
    for p in _output_files(out):
        with contextlib.suppress(OSError):
            st = p.stat()
            outputs.setdefault((st.st_dev, st.st_ino), p)
    if not outputs:  # a new folder: nothing there to overwrite
        return
    files: list[str] = []
    for spec in [*inputs, *([reference] if reference is not None else [])]:
        if not is_url(spec) and not has_magic(spec) and not os.path.isdir(spec):
            files.append(spec)
            if (detect_format(spec) if input_format == "auto" else input_format) == "scp":
                files.append(os.path.join(url_dirname(spec), "text"))
    files += [it.audio for it in items if it.error is None and not is_url(it.audio)]
    for f in files:
        try:
            st = os.stat(f)
        except OSError:
            continue
        hit = outputs.get((st.st_dev, st.st_ino))
        if hit is not None:
            how = "" if os.path.realpath(f) == os.path.realpath(hit) else " (the same file under another name: a link)"
            raise BatchError(f"{hit} is the input {f}{how}: fun-asr-batch writes that file, so nothing was done; "
                             "choose another output folder (-o) or move the input out of it")


@contextlib.contextmanager
def shard_lock(out: Path) -> Iterator[None]:
    """One job per output folder at a time."""
    try:
        import fcntl
    except ImportError:  # Windows: no advisory lock
        yield
        return
    try:
        f = open(out / ".lock", "a")  # noqa: SIM115
    except OSError as exc:
        raise BatchError(f"output folder {out}: cannot write there ({exc.strerror or exc}); choose a writable "
                         "folder (-o)") from None
    try:
        try:
            fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            raise BatchError(f"{out}: another fun-asr-batch job is writing to this folder") from None
        yield
    finally:
        f.close()


