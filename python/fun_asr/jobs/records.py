"""A corpus job's result records: the JSONL shards of an output folder read back (torn last lines repaired)."""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Iterator
from pathlib import Path

log = logging.getLogger("fun_asr.batch")

SHARD_PREFIX = "shard-"
SUMMARY = "summary.json"
EVAL_TABLE = "eval.tsv"
SCHEMA_VERSION = 1
def shard_files(out: Path) -> list[Path]:
    return sorted(p for p in out.glob(f"{SHARD_PREFIX}*.jsonl") if p.is_file())


def scan_shard(path: Path, repair: bool) -> Iterator[dict]:
    """The records of one shard. A last line without its newline (a write cut by a crash) or that is
    not valid JSON is ignored and, with ``repair``, cut off the file."""
    data = path.read_bytes()
    end = len(data)
    if data and not data.endswith(b"\n"):
        end = data.rfind(b"\n") + 1
    lines = data[:end].split(b"\n")[:-1] if end else []
    good_end = end
    records = []
    for i, line in enumerate(lines):
        try:
            rec = json.loads(line)
            if not isinstance(rec, dict) or "id" not in rec:
                raise ValueError("no id")
        except ValueError:
            if i == len(lines) - 1:  # a torn last line
                good_end = end - len(line) - 1
                break
            log.warning("%s: line %d is not a result record; ignored", path, i + 1)
            continue
        records.append(rec)
    if repair and good_end < len(data):
        log.warning("%s: cut %d bytes of an unfinished last line (the job was stopped while writing it)", path,
                    len(data) - good_end)
        with open(path, "r+b") as f:
            f.truncate(good_end)
            f.flush()
            os.fsync(f.fileno())
    yield from records


def read_results(output_dir: str | os.PathLike[str], repair: bool = False) -> dict[str, dict]:
    """id -> record of every result in a fun-asr-batch output folder (the first record of an id wins)."""
    out = Path(output_dir)
    records: dict[str, dict] = {}
    for shard in shard_files(out):
        for rec in scan_shard(shard, repair):
            records.setdefault(str(rec["id"]), rec)
    return records
