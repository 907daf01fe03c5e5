"""Corpus jobs: many recordings -> a folder of JSONL shards, resumable, on one machine or on Ray.

``run(inputs, output_dir, ...)`` (and the ``fun-asr-batch`` command) transcribes every recording
that the inputs name and writes one JSON object per recording (``id``, ``audio``, ``text``,
``segments``, ``duration``, ``timings``, ``error``, ... and ``reference``/``wer``/``cer`` when a
reference text is known) to ``shard-NNNNN.jsonl`` files in ``output_dir``, plus ``summary.json``
(and ``eval.tsv`` when there are references).

Inputs (each a local path or an fsspec URL such as ``s3://bucket/corpus``):
- a directory (searched recursively for audio files) or a glob (``data/**/*.flac``);
- a text list of audio paths, one per line (``.txt``, ``.lst``, ``.list``);
- a JSONL (``.jsonl``) or CSV/TSV (``.csv``, ``.tsv``) manifest: ``id``, ``audio``, optional ``text``
  (reference), ``language`` and ``hotwords`` (a list, or one comma-separated string) per item;
- a Kaldi ``wav.scp`` (``<id> <path>`` per line; a Kaldi ``text`` file beside it is read as the references);
- an audio file.
Relative paths in a list or manifest are taken relative to the manifest's folder when the file is
there, else to the current directory.

Resuming: the ids already in the shards are skipped, so rerunning the same command finishes a job
that was stopped. Each finished batch is appended to the current shard and flushed to disk (fsync)
before the next one starts; a crash loses at most the batch in flight, and a torn last line (a
write cut by the crash) is cut off when the job restarts. A recording that cannot be read or
transcribed is recorded with ``error`` set; it never stops the job (``retry_failed=True`` /
``--retry-failed`` transcribes those again).

Engines: ``local`` (default): a pool of reader threads fetches and decodes the audio (libsndfile and
soxr run without the GIL) ahead of one Session, which decodes ``batch_size`` segments at a time.
``ray``: Ray Data reads and decodes the audio in CPU tasks and maps batches over a pool of actors
that each hold one Session (``pip install 'fun-asr[ray]'``); the model path must exist on every node.
"""

from __future__ import annotations

import contextlib
import csv
import dataclasses
import glob as globlib
import io
import json
import logging
import math
import os
import posixpath
import sys
import threading
import time
import warnings
from collections import deque
from collections.abc import Callable, Iterable, Iterator, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from fun_asr.hub import DEFAULT_REPO

log = logging.getLogger("fun_asr.batch")

AUDIO_EXTENSIONS = frozenset({".wav", ".wave", ".flac", ".ogg", ".oga", ".opus", ".mp3", ".aif", ".aiff", ".aifc",
                              ".au", ".snd", ".w64", ".rf64", ".caf", ".sph", ".nist", ".wv", ".voc"})
INPUT_FORMATS = ("auto", "dir", "glob", "list", "jsonl", "csv", "scp", "audio")
SHARD_PREFIX = "shard-"
SUMMARY = "summary.json"
EVAL_TABLE = "eval.tsv"
SCHEMA_VERSION = 1
_READ_TASK_MEMORY = 256 * 2**20  # bytes a Ray reading task reserves (decoded audio of one batch)
_ID_KEYS = ("id", "key", "utt", "utt_id", "uttid")
_AUDIO_KEYS = ("audio", "path", "audio_filepath", "wav", "file", "source")
_TEXT_KEYS = ("text", "reference", "transcript", "sentence")


class BatchError(ValueError):
    """A problem with the job as a whole (an unreadable manifest, duplicate ids, a busy output
    folder): reported before any work. Problems with one recording are recorded, never raised."""


# -- inputs ----------------------------------------------------------------------------------------

@dataclass
class Item:
    """One recording of the job. ``language``/``hotwords`` override the job's options when not None."""

    id: str
    audio: str
    reference: str | None = None
    language: str | None = None
    hotwords: tuple[str, ...] | None = None
    error: str | None = None  # known before reading (e.g. a piped wav.scp entry)


def _is_url(s: str) -> bool:
    return "://" in s


def _has_magic(s: str) -> bool:
    return any(c in s for c in "*?[")


def _ext(s: str) -> str:
    return posixpath.splitext(s.rstrip("/"))[1].lower()


def _read_text(path: str) -> str:
    try:
        if _is_url(path):
            import fsspec

            with fsspec.open(path, "rb") as f:
                data = f.read()
        else:
            data = Path(path).read_bytes()
    except FileNotFoundError:
        raise BatchError(f"{path}: no such file") from None
    except OSError as exc:
        raise BatchError(f"{path}: cannot read ({exc})") from None
    try:
        return data.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        raise BatchError(f"{path}: not UTF-8 text ({exc.reason})") from None


def _dirname(path: str) -> str:
    return posixpath.dirname(path) if _is_url(path) else os.path.dirname(os.path.abspath(path))


def _resolve(entry: str, base: str) -> str:
    """A path from a list or manifest: URLs and absolute paths as they are; a relative path is taken
    relative to the manifest's folder when it exists there, else relative to the current directory."""
    entry = entry.strip()
    if _is_url(entry) or os.path.isabs(entry):
        return entry
    if _is_url(base):
        return posixpath.join(base, entry)
    candidate = os.path.join(base, entry)
    return candidate if os.path.exists(candidate) else entry


def _exists(path: str) -> bool:
    if _is_url(path):
        import fsspec

        fs, p = fsspec.core.url_to_fs(path)
        return fs.exists(p)
    return os.path.exists(path)


def _is_dir(path: str) -> bool:
    if _is_url(path):
        import fsspec

        fs, p = fsspec.core.url_to_fs(path)
        return fs.isdir(p)
    return os.path.isdir(path)


def _list_files(spec: str, kind: str) -> list[tuple[str, str]]:
    """(path or URL, path relative to the root) of the audio files of a directory or glob."""
    if _is_url(spec):
        import fsspec

        fs, p = fsspec.core.url_to_fs(spec)
        if kind == "dir":
            root = p.rstrip("/")
            found = [f for f in fs.find(root) if _ext(f) in AUDIO_EXTENSIONS]
        else:
            root = _glob_root(p)
            found = [f for f in fs.glob(p) if not fs.isdir(f)]
        return [(fs.unstrip_protocol(f), posixpath.relpath(f, root or "/")) for f in sorted(found)]
    if kind == "dir":
        root = spec
        found = []
        for dirpath, dirnames, files in os.walk(spec, followlinks=True):
            dirnames.sort()
            found += [os.path.join(dirpath, f) for f in sorted(files) if _ext(f) in AUDIO_EXTENSIONS]
    else:
        root = _glob_root(spec) or "."
        found = sorted(f for f in globlib.glob(spec, recursive=True) if os.path.isfile(f))
    return [(f, Path(os.path.relpath(f, root)).as_posix()) for f in found]


def _glob_root(pattern: str) -> str:
    """The folder part of a glob before its first wildcard."""
    parts = pattern.replace("\\", "/").split("/")
    static = []
    for part in parts[:-1]:
        if _has_magic(part):
            break
        static.append(part)
    return "/".join(static)


def _unique_ids(rel: list[str]) -> list[str]:
    """Ids for files: the relative path without its extension, or with it where two files differ
    only by the extension (talk.wav, talk.flac)."""
    stems = [posixpath.splitext(r)[0] for r in rel]
    counts: dict[str, int] = {}
    for s in stems:
        counts[s] = counts.get(s, 0) + 1
    return [s if counts[s] == 1 else r for s, r in zip(stems, rel, strict=True)]


def _path_list_ids(paths: list[str]) -> list[str]:
    """Ids for a list of paths: the file stem, with as many parent folders as it takes to be unique."""
    split = [[p for p in path.replace("\\", "/").rstrip("/").split("/") if p] for path in paths]
    levels = [1] * len(paths)

    def name(i: int) -> str:
        parts = split[i][-levels[i]:]
        parts[-1] = posixpath.splitext(parts[-1])[0] or parts[-1]
        return "/".join(parts)

    while True:
        ids = [name(i) for i in range(len(paths))]
        groups: dict[str, list[int]] = {}
        for i, n in enumerate(ids):
            groups.setdefault(n, []).append(i)
        progressed = False
        for idx in groups.values():
            if len(idx) > 1:
                for i in idx:
                    if levels[i] < len(split[i]):
                        levels[i] += 1
                        progressed = True
        if not progressed:
            return ids


def _hotwords(value: object) -> tuple[str, ...] | None:
    if value is None:
        return None
    if isinstance(value, str):
        if not value.strip():
            return None
        value = value.split(",")
    if isinstance(value, list | tuple):
        return tuple(str(h).strip() for h in value if str(h).strip())
    raise BatchError(f"hotwords must be a list or a comma-separated string, got {type(value).__name__}")


def _first(row: dict, keys: Sequence[str]) -> Any:
    for k in keys:
        if k in row and row[k] is not None and row[k] != "":
            return row[k]
    return None


def _manifest_items(rows: Iterable[tuple[int, dict]], name: str, base: str) -> list[Item]:
    items = []
    for n, row in rows:
        audio = _first(row, _AUDIO_KEYS)
        if audio is None:
            raise BatchError(f"{name}:{n}: no audio path (a column/key named one of {', '.join(_AUDIO_KEYS)})")
        audio = _resolve(str(audio), base)
        key = _first(row, _ID_KEYS)
        ref = _first(row, _TEXT_KEYS)
        lang = _first(row, ("language", "lang"))
        try:
            hw = _hotwords(row.get("hotwords"))
        except BatchError as exc:
            raise BatchError(f"{name}:{n}: {exc}") from None
        items.append(Item(str(key) if key is not None else "", audio, None if ref is None else str(ref),
                          None if lang is None else str(lang), hw))
    missing = [i for i, it in enumerate(items) if not it.id]
    if missing:
        ids = _path_list_ids([items[i].audio for i in missing])
        for i, key in zip(missing, ids, strict=True):
            items[i].id = key
    return items


def _read_jsonl(path: str) -> list[Item]:
    rows = []
    for n, line in enumerate(_read_text(path).splitlines(), 1):
        if not line.strip():
            continue
        try:
            obj = json.loads(line)
        except json.JSONDecodeError as exc:
            raise BatchError(f"{path}:{n}: not JSON ({exc.msg}); a JSONL manifest has one object per line with "
                             "'id', 'audio' and optional 'text', 'language', 'hotwords'") from None
        if not isinstance(obj, dict):
            raise BatchError(f"{path}:{n}: expected a JSON object, got {type(obj).__name__}")
        rows.append((n, obj))
    return _manifest_items(rows, path, _dirname(path))


def _read_csv(path: str) -> list[Item]:
    text = _read_text(path)
    delimiter = "\t" if _ext(path) == ".tsv" else ","
    reader = csv.DictReader(io.StringIO(text), delimiter=delimiter)
    if not reader.fieldnames:
        raise BatchError(f"{path}: empty CSV manifest (a header row with 'id' and 'audio' is expected)")
    rows = [(n + 2, {(k or "").strip().lower(): v for k, v in row.items()}) for n, row in enumerate(reader)]
    return _manifest_items(rows, path, _dirname(path))


def _read_list(path: str) -> list[Item]:
    base = _dirname(path)
    paths = [_resolve(line, base) for line in _read_text(path).splitlines()
             if line.strip() and not line.lstrip().startswith("#")]
    return [Item(key, p) for key, p in zip(_path_list_ids(paths), paths, strict=True)]


def _read_scp(path: str) -> list[Item]:
    base = _dirname(path)
    items = []
    for n, line in enumerate(_read_text(path).splitlines(), 1):
        line = line.strip()
        if not line:
            continue
        parts = line.split(maxsplit=1)
        if len(parts) < 2:
            raise BatchError(f"{path}:{n}: a wav.scp line is '<id> <path>', got {line!r}")
        key, entry = parts
        item = Item(key, entry.strip())
        if entry.rstrip().endswith("|"):
            item.error = (f"{key}: piped wav.scp entries (commands) are not run; give a path or URL to an audio "
                          "file")
        elif re_ark(entry):
            item.error = f"{key}: Kaldi ark offsets are not supported; give a path or URL to an audio file"
        else:
            item.audio = _resolve(entry, base)
        items.append(item)
    text = posixpath.join(base, "text") if _is_url(path) else os.path.join(base, "text")
    if _exists(text):
        from fun_asr.evaluate import parse_kaldi_text

        refs = parse_kaldi_text(_read_text(text))
        for it in items:
            if it.id in refs:
                it.reference = refs[it.id]
    return items


def re_ark(entry: str) -> bool:
    """``foo.ark:1234``: a Kaldi archive with a byte offset."""
    head, _, tail = entry.rpartition(":")
    return bool(head) and tail.isdigit() and head.lower().endswith(".ark")


def detect_format(spec: str) -> str:
    """What an input names: dir, glob, list, jsonl, csv, scp or audio (BatchError when unclear)."""
    if _has_magic(spec) and not _exists(spec):
        return "glob"
    if _is_dir(spec):
        return "dir"
    name = posixpath.basename(spec.rstrip("/")).lower()
    ext = _ext(spec)
    if ext in (".jsonl", ".ndjson", ".json"):
        return "jsonl"
    if ext in (".csv", ".tsv"):
        return "csv"
    if name == "wav.scp" or ext == ".scp":
        return "scp"
    if ext in (".txt", ".lst", ".list"):
        return "list"
    if ext in AUDIO_EXTENSIONS:
        return "audio"
    if not _exists(spec):
        raise BatchError(f"{spec}: no such file or directory")
    raise BatchError(f"{spec}: cannot tell what this input is from its name; accepted: a directory, a glob, a list "
                     "(.txt/.lst), a manifest (.jsonl/.csv/.tsv), a Kaldi wav.scp or an audio file — or say it with "
                     "--input-format")


def collect_items(inputs: Sequence[str | os.PathLike[str]], input_format: str = "auto",
                  reference: str | os.PathLike[str] | None = None) -> list[Item]:
    """The job's recordings, in input order, with unique ids. ``reference``: a Kaldi ``text`` file
    (``<id> <text>``) or a JSONL file (``id``, ``text``) whose texts become the references."""
    if input_format not in INPUT_FORMATS:
        raise BatchError(f"input format {input_format!r}: accepted {', '.join(INPUT_FORMATS)}")
    if isinstance(inputs, str | os.PathLike):
        inputs = [inputs]
    items: list[Item] = []
    origin: dict[str, str] = {}
    for raw in inputs:
        spec = os.fspath(raw)
        kind = detect_format(spec) if input_format == "auto" else input_format
        if kind in ("dir", "glob"):
            if kind == "dir" and not _is_dir(spec):
                raise BatchError(f"{spec}: not a directory")
            files = _list_files(spec, kind)
            if not files:
                what = "audio files" if kind == "dir" else "files"
                raise BatchError(f"{spec}: no {what} found (audio extensions: {', '.join(sorted(AUDIO_EXTENSIONS))})")
            new = [Item(key, path) for key, (path, _) in zip(_unique_ids([r for _, r in files]), files, strict=True)]
        elif kind == "list":
            new = _read_list(spec)
        elif kind == "jsonl":
            new = _read_jsonl(spec)
        elif kind == "csv":
            new = _read_csv(spec)
        elif kind == "scp":
            new = _read_scp(spec)
        else:
            if not _is_url(spec) and not os.path.exists(spec):
                raise BatchError(f"{spec}: no such file" + (" (a broken symbolic link)" if os.path.islink(spec)
                                                             else ""))
            if not _is_url(spec) and os.path.isdir(spec):
                raise BatchError(f"{spec}: is a directory; give it as a directory input (--input-format dir)")
            new = [Item(_path_list_ids([spec])[0], spec)]
        for it in new:
            if it.id in origin:
                raise BatchError(f"id {it.id!r} appears twice ({origin[it.id]} and {spec}); ids must be unique — "
                                 "give a manifest with explicit ids")
            origin[it.id] = spec
        items += new
    if reference is not None:
        refs = read_references(reference)
        for it in items:
            if it.id in refs:
                it.reference = refs[it.id]
    return items


def read_references(path: str | os.PathLike[str]) -> dict[str, str]:
    """id -> reference text from a Kaldi ``text`` file or a JSONL file (``id``, ``text``)."""
    from fun_asr.evaluate import TextSourceError, load_texts

    try:
        texts, _ = load_texts(path)
    except TextSourceError as exc:
        raise BatchError(str(exc)) from None
    return texts


# -- output folder ---------------------------------------------------------------------------------

def _shards(out: Path) -> list[Path]:
    return sorted(p for p in out.glob(f"{SHARD_PREFIX}*.jsonl") if p.is_file())


def _scan_shard(path: Path, repair: bool) -> Iterator[dict]:
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
    for shard in _shards(out):
        for rec in _scan_shard(shard, repair):
            records.setdefault(str(rec["id"]), rec)
    return records


def _drop_failed(out: Path) -> int:
    """Removes the failed records from the shards (each rewritten atomically); returns how many."""
    dropped = 0
    for shard in _shards(out):
        recs = list(_scan_shard(shard, repair=True))
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
        existing = [int(p.stem[len(SHARD_PREFIX):]) for p in _shards(out) if p.stem[len(SHARD_PREFIX):].isdigit()]
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
                    raise _write_error(path, exc) from None
                self.paths.append(path)
                self.count = 0
            part, records = records[: self.shard_size - self.count], records[self.shard_size - self.count:]
            data = "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in part).encode("utf-8")
            try:
                self.f.write(data)
                self.f.flush()
                os.fsync(self.f.fileno())
            except OSError as exc:
                raise _write_error(self.paths[-1], exc) from None
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


def _write_error(path: Path, exc: OSError) -> OutputWriteError:
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
    files = [out / n for n in OUTPUT_NAMES] + _shards(out) + sorted(out.glob(f"{SHARD_PREFIX}*.jsonl.tmp"))
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
        if not _is_url(spec) and not _has_magic(spec) and not os.path.isdir(spec):
            files.append(spec)
            if (detect_format(spec) if input_format == "auto" else input_format) == "scp":
                files.append(os.path.join(_dirname(spec), "text"))
    files += [it.audio for it in items if it.error is None and not _is_url(it.audio)]
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
def _lock(out: Path) -> Iterator[None]:
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


# -- the work of one batch (shared by both engines) -------------------------------------------------

@dataclass
class JobOptions:
    """The job's transcription options (per-item language/hotwords override the first two)."""

    language: str | None = None
    hotwords: tuple[str, ...] = ()
    itn: bool = True
    max_new_tokens: int = 512
    segment_seconds: float = 30.0
    repetition_guard: bool = True
    batch_size: int = 8

    def for_item(self, item: Item) -> tuple[str | None, tuple[str, ...]]:
        return (self.language if item.language is None else item.language,
                self.hotwords if item.hotwords is None else item.hotwords)


@dataclass
class Loaded:
    """One recording read and decoded to 16 kHz mono float32 (or why it could not be)."""

    item: Item
    samples: np.ndarray | None = None
    warnings: list[str] = field(default_factory=list)
    truncated: bool = False
    load_ms: float = 0.0
    error: str | None = None


def _message(audio: str, exc: BaseException) -> str:
    msg = str(exc) or type(exc).__name__
    return msg if audio in msg else f"{audio}: {msg}"


def load(item: Item) -> Loaded:
    """Reads and decodes one recording (a local path directly, a URL through fsspec); never raises."""
    from fun_asr.audio import decode_audio

    if item.error is not None:
        return Loaded(item, error=item.error)
    t0 = time.perf_counter()
    try:
        if _is_url(item.audio):
            import fsspec

            with fsspec.open(item.audio, "rb") as f:
                source: Any = f.read()
        else:
            source = item.audio
        samples, info = decode_audio(source, None, item.audio)
    except Exception as exc:  # noqa: BLE001 - any reader/filesystem failure is this item's error
        return Loaded(item, error=_message(item.audio, exc), load_ms=(time.perf_counter() - t0) * 1e3)
    return Loaded(item, samples, list(info.warnings), info.truncated, (time.perf_counter() - t0) * 1e3)


def _failed_record(item: Item, error: str, options: dict, load_ms: float = 0.0) -> dict:
    from fun_asr.session import Transcription

    t = Transcription("", [], options.get("language"), 0.0, {"load_ms": round(load_ms, 3)}, dict(options), item.audio,
                      [error], False, "error", error)
    return _record(item, t.to_dict())


def _record(item: Item, d: dict) -> dict:
    d.pop("source", None)
    rec = {"id": item.id, "audio": item.audio, **d}
    if item.reference is not None:
        from fun_asr.evaluate import score

        s = score(item.reference, rec.get("text") or "")
        rec["reference"] = item.reference
        rec.update(s.to_dict())
    return rec


def _call(session: Any, loaded: list[Loaded], language: str | None, hotwords: tuple[str, ...],
          opts: JobOptions) -> list[Any]:
    from fun_asr.notices import FunAsrWarning

    with warnings.catch_warnings():  # everything is in the records: no stream of warnings
        warnings.simplefilter("ignore", FunAsrWarning)
        return session.transcribe_batch(
            [ld.samples for ld in loaded], sample_rate=16000, language=language, itn=opts.itn, hotwords=list(hotwords),
            max_new_tokens=opts.max_new_tokens, segment_seconds=opts.segment_seconds,
            repetition_guard=opts.repetition_guard, batch_size=opts.batch_size, names=[ld.item.audio for ld in loaded])


def transcribe_loaded(session: Any, loaded: Sequence[Loaded], opts: JobOptions) -> list[dict]:
    """Records for a batch of decoded recordings, in order: one ``transcribe_batch`` call per group of
    equal options (language, hotwords); a group whose options are invalid fails as a whole."""
    records: list[dict | None] = [None] * len(loaded)
    groups: dict[tuple, list[int]] = {}
    for i, ld in enumerate(loaded):
        groups.setdefault(opts.for_item(ld.item), []).append(i)
    for (language, hotwords), idx in groups.items():
        base_options = {"language": language, "itn": opts.itn, "hotwords": list(hotwords),
                        "max_new_tokens": opts.max_new_tokens, "segment_seconds": opts.segment_seconds,
                        "repetition_guard": opts.repetition_guard}
        ok = [i for i in idx if loaded[i].error is None]
        for i in idx:
            if loaded[i].error is not None:
                records[i] = _failed_record(loaded[i].item, loaded[i].error or "", base_options, loaded[i].load_ms)
        if not ok:
            continue
        try:
            session.options(language, opts.itn, list(hotwords), opts.max_new_tokens, opts.segment_seconds,
                            opts.repetition_guard)
        except (ValueError, TypeError) as exc:
            for i in ok:
                records[i] = _failed_record(loaded[i].item, _message(loaded[i].item.audio, exc), base_options,
                                            loaded[i].load_ms)
            continue
        try:
            results: list[Any] = _call(session, [loaded[i] for i in ok], language, hotwords, opts)
        except Exception:  # noqa: BLE001 - transcribe_batch isolates bad recordings; this is a last resort
            log.warning("a batch failed as a whole; transcribing its recordings one by one", exc_info=True)
            results = []
            for i in ok:
                try:
                    results += _call(session, [loaded[i]], language, hotwords, opts)
                except Exception as exc:  # noqa: BLE001 - recorded as this item's error
                    results.append(exc)
        for i, result in zip(ok, results, strict=True):
            ld = loaded[i]
            if isinstance(result, Exception):
                records[i] = _failed_record(ld.item, _message(ld.item.audio, result), base_options, ld.load_ms)
                continue
            result.warnings = ld.warnings + list(result.warnings)
            result.input_truncated = result.input_truncated or ld.truncated
            t = result.timings
            t["load_ms"] = round(t.get("load_ms", 0.0) + ld.load_ms, 3)
            if "total_ms" in t:
                t["total_ms"] = round(t["total_ms"] + ld.load_ms, 3)
                if result.duration > 0:
                    t["real_time_factor"] = round(t["total_ms"] / 1e3 / result.duration, 3)
            records[i] = _record(ld.item, result.to_dict())
    return [r for r in records if r is not None]


# -- progress ---------------------------------------------------------------------------------------

class _Progress:
    """Counts what the job did; shows it as a tqdm bar (``"bar"``, a terminal) or as one line on stderr
    every ``interval`` seconds (``"lines"``: logs, CI, a scheduler's output file)."""

    def __init__(self, mode: str | None, total: int, initial_note: str = "", interval: float = 10.0) -> None:
        self.t0 = time.perf_counter()
        self.t_work = self.t0
        self.total = total
        self.audio = 0.0
        self.items = 0
        self.failed = 0
        self.bar = None
        self.interval = max(0.01, float(interval))
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        if mode == "bar":
            from tqdm import tqdm

            self.bar = tqdm(total=total, desc="fun-asr-batch", unit="file", dynamic_ncols=True, smoothing=0.1)
            if initial_note:
                self.bar.write(initial_note)
        elif mode == "lines":
            self._print((f"{initial_note}; " if initial_note else "fun-asr-batch: ") + f"{total} to transcribe")
            self._thread = threading.Thread(target=self._lines, name="fun-asr-progress", daemon=True)

    def begin(self) -> None:
        """The engine starts (the model is loaded): speed and ETA are measured from here."""
        self.t_work = time.perf_counter()
        if self._thread is not None and not self._thread.is_alive():
            self._thread.start()

    def update(self, records: Sequence[dict]) -> None:
        self.items += len(records)
        self.failed += sum(1 for r in records if r.get("error"))
        self.audio += sum(float(r.get("duration") or 0.0) for r in records)
        if self.bar is not None:
            wall = time.perf_counter() - self.t0
            rtfx = self.audio / wall if wall > 0 else 0.0
            note = f"{self.audio / 3600:.3f} h audio, RTFx {rtfx:.1f}"
            if self.failed:
                note += f", {self.failed} failed"
            self.bar.set_postfix_str(note, refresh=False)
            self.bar.update(len(records))

    def line(self) -> str:
        """``fun-asr-batch: 120/1000 recordings (12%), 0.333 h of audio, 45.2x real time, ETA 0:12:34``."""
        items, audio = self.items, self.audio
        wall = time.perf_counter() - self.t_work
        pct = f" ({100 * items / self.total:.0f}%)" if self.total else ""
        failed = f", {self.failed} failed" if self.failed else ""
        speed = f"{audio / wall:.1f}x real time" if wall > 0 and items else "speed n/a"
        if items:
            left = (self.total - items) * wall / items
            eta = f"ETA {int(left // 3600)}:{int(left % 3600 // 60):02d}:{int(left % 60):02d}"
        else:
            eta = "ETA n/a (no recording finished yet)"
        return (f"fun-asr-batch: {items}/{self.total} recordings{pct}{failed}, {audio / 3600:.3f} h of audio, "
                f"{speed}, {eta}")

    def _lines(self) -> None:
        while not self._stop.wait(self.interval):
            self._print(self.line())

    @staticmethod
    def _print(text: str) -> None:
        with contextlib.suppress(OSError, ValueError):  # stderr closed: no progress, the job goes on
            print(text, file=sys.stderr, flush=True)

    def close(self) -> None:
        self._stop.set()
        if self._thread is not None and self._thread.is_alive():
            self._thread.join(timeout=5)
        if self.bar is not None:
            self.bar.close()

    @property
    def wall(self) -> float:
        return time.perf_counter() - self.t0


# -- engines ----------------------------------------------------------------------------------------

def _local_engine(todo: list[Item], session: Any, opts: JobOptions, emit: Callable[[list[dict]], None],
                  workers: int, stop: threading.Event | None = None) -> None:
    """Reader threads decode the next batch while the Session transcribes the current one (so about
    two batches of decoded audio are in memory). ``stop`` set: no batch after the one in flight."""
    ahead = max(opts.batch_size, workers)
    with ThreadPoolExecutor(max_workers=workers, thread_name_prefix="fun-asr-read") as pool:
        window: deque[Future[Loaded]] = deque()
        pending = iter(todo)

        def fill() -> None:
            while len(window) < ahead + opts.batch_size:
                item = next(pending, None)
                if item is None:
                    return
                window.append(pool.submit(load, item))

        fill()
        try:
            while window and not (stop is not None and stop.is_set()):
                batch = [window.popleft() for _ in range(min(opts.batch_size, len(window)))]
                fill()
                emit(transcribe_loaded(session, [f.result() for f in batch], opts))
        finally:
            for f in window:
                f.cancel()


def _ray_read(batch: Any) -> Any:
    """Ray Data CPU task: reads and decodes a block of recordings."""
    import pyarrow as pa

    out: dict[str, list] = {"item": [], "samples": [], "warnings": [], "truncated": [], "load_ms": [], "error": []}
    for row in batch.to_pylist():
        ld = load(Item(**json.loads(row["item"])))
        out["item"].append(row["item"])
        out["samples"].append(ld.samples.tobytes() if ld.samples is not None else b"")
        out["warnings"].append(json.dumps(ld.warnings, ensure_ascii=False))
        out["truncated"].append(ld.truncated)
        out["load_ms"].append(ld.load_ms)
        out["error"].append(ld.error)
    return pa.table({"item": pa.array(out["item"], pa.string()), "samples": pa.array(out["samples"], pa.large_binary()),
                     "warnings": pa.array(out["warnings"], pa.string()), "truncated": pa.array(out["truncated"]),
                     "load_ms": pa.array(out["load_ms"], pa.float64()), "error": pa.array(out["error"], pa.string())})


def _item_json(item: Item) -> str:
    d = {"id": item.id, "audio": item.audio, "reference": item.reference, "language": item.language,
         "hotwords": None if item.hotwords is None else list(item.hotwords), "error": item.error}
    return json.dumps(d, ensure_ascii=False)


class RayTranscriber:
    """A Ray actor holding one Session; maps blocks of decoded audio to result records."""

    def __init__(self, model: str, device: str, threads: int, vad: str | None, vad_model: str | None,
                 options: dict) -> None:
        from fun_asr.session import Session

        self.opts = JobOptions(**{**options, "hotwords": tuple(options["hotwords"])})
        self.session = Session(model, device=device, threads=threads, progress=False, vad=vad, vad_model=vad_model)
        o = self.opts  # the job's own options must be valid: fail the job, not every item
        self.session.options(o.language, o.itn, list(o.hotwords), o.max_new_tokens, o.segment_seconds,
                             o.repetition_guard)

    def __call__(self, batch: Any) -> Any:
        import pyarrow as pa

        loaded = []
        for row in batch.to_pylist():
            d = json.loads(row["item"])
            if d["hotwords"] is not None:
                d["hotwords"] = tuple(d["hotwords"])
            samples = np.frombuffer(row["samples"], np.float32) if row["error"] is None else None
            loaded.append(Loaded(Item(**d), samples, json.loads(row["warnings"]), bool(row["truncated"]),
                                 float(row["load_ms"]), row["error"]))
        records = transcribe_loaded(self.session, loaded, self.opts)
        return pa.table({"id": pa.array([r["id"] for r in records], pa.string()),
                         "record": pa.array([json.dumps(r, ensure_ascii=False) for r in records], pa.string())})


@dataclass
class RaySettings:
    address: str | None = None  # None: ray.init() (RAY_ADDRESS, else a local cluster); "auto"; "host:port"
    actors: int | None = None  # default: what the cluster's CPUs (or GPUs) allow
    threads_per_actor: int | None = None  # default 1 on a 2-CPU machine, up to 4
    read_cpus: float = 1.0  # CPUs reserved per reading task
    gpus_per_actor: float | None = None  # default 1 with a CUDA device


def _ray_engine(todo: list[Item], model: str, device: str, vad: str | None, vad_model: str | None,
                opts: JobOptions, emit: Callable[[list[dict]], None], settings: RaySettings, progress: bool,
                stop: threading.Event | None = None) -> dict:
    try:
        import ray
        import ray.data
    except ImportError:
        raise BatchError("the Ray engine needs Ray Data: pip install 'fun-asr[ray]'") from None
    started = False
    if not ray.is_initialized():
        kwargs: dict[str, Any] = {"include_dashboard": False, "log_to_driver": False}
        if settings.address:
            kwargs["address"] = settings.address
        ray.init(**kwargs)
        started = True
    try:
        ctx = ray.data.DataContext.get_current()
        ctx.enable_progress_bars = False
        ctx.execution_options.verbose_progress = False
        if not log.isEnabledFor(logging.INFO):  # Ray Data's own start-up lines only with --verbose
            logging.getLogger("ray.data").setLevel(logging.ERROR)
        total = ray.cluster_resources()
        cpus = float(total.get("CPU", 1.0))
        node_cpus = max([float(n["Resources"].get("CPU", 0.0)) for n in ray.nodes() if n.get("Alive")] or [cpus])
        gpu = device.startswith(("cuda", "gpu"))
        tpa = settings.threads_per_actor or max(1, min(4, int(node_cpus) - 1))
        gpus_per_actor = (settings.gpus_per_actor if settings.gpus_per_actor is not None else 1.0) if gpu else 0.0
        read_cpus = settings.read_cpus
        # Reserve at most what a node can give beside one reading task, or the pipeline would stall.
        actor_cpus = float(min(tpa, max(0.5, node_cpus - read_cpus)))
        actors = settings.actors
        if actors is None:
            if gpu:
                actors = max(1, int(float(total.get("GPU", 0.0)) // (gpus_per_actor or 1.0)))
            else:
                actors = max(1, int((cpus - read_cpus) // actor_cpus))
        info = {"address": settings.address, "actors": actors, "threads_per_actor": tpa, "actor_cpus": actor_cpus,
                "gpus_per_actor": gpus_per_actor, "read_cpus": read_cpus, "cluster_cpus": cpus,
                "cluster_gpus": float(total.get("GPU", 0.0)), "nodes": sum(1 for n in ray.nodes() if n.get("Alive"))}
        log.info("ray: %s", info)
        rows = [{"item": _item_json(it)} for it in todo]
        blocks = max(1, min(math.ceil(len(rows) / opts.batch_size), 4096))
        ds = ray.data.from_items(rows, override_num_blocks=blocks)
        # A reading task reserves some memory for the decoded audio; its resources differing from the
        # actors' also keeps Ray Data from fusing the reading into the actors: CPU tasks decode while
        # the actors transcribe.
        ds = ds.map_batches(_ray_read, batch_size=opts.batch_size, batch_format="pyarrow", num_cpus=read_cpus,
                            memory=_READ_TASK_MEMORY)
        options = {"language": opts.language, "hotwords": list(opts.hotwords), "itn": opts.itn,
                   "max_new_tokens": opts.max_new_tokens, "segment_seconds": opts.segment_seconds,
                   "repetition_guard": opts.repetition_guard, "batch_size": opts.batch_size}
        remote: dict[str, Any] = {"num_cpus": actor_cpus}
        if gpus_per_actor:
            remote["num_gpus"] = gpus_per_actor
        ds = ds.map_batches(
            RayTranscriber, batch_size=opts.batch_size, batch_format="pyarrow",
            compute=ray.data.ActorPoolStrategy(size=actors),
            fn_constructor_kwargs={"model": model, "device": device, "threads": tpa, "vad": vad,
                                   "vad_model": vad_model, "options": options}, **remote)
        for block in ds.iter_batches(batch_size=None, batch_format="pyarrow"):
            emit([json.loads(s) for s in block.column("record").to_pylist()])
            if stop is not None and stop.is_set():  # what is still in the pipeline is redone on resume
                break
        return info
    finally:
        if started:
            ray.shutdown()


# -- the job ----------------------------------------------------------------------------------------

def _model_arg(model: str | os.PathLike[str]) -> str:
    """A local model as an absolute path (Ray workers have their own working directory); a hub id as is."""
    p = Path(model).expanduser()
    return str(p.resolve()) if p.exists() else os.fspath(model)


def run(inputs: Sequence[str | os.PathLike[str]] | str | os.PathLike[str], output_dir: str | os.PathLike[str], *,
        model: str | os.PathLike[str] = DEFAULT_REPO, device: str = "auto", threads: int = 0,
        vad: str | None = "auto", vad_model: str | os.PathLike[str] | None = None,
        language: str | None = None, itn: bool = True, hotwords: list[str] | str | None = None,
        max_new_tokens: int = 512, segment_seconds: float = 30.0, repetition_guard: bool = True,
        batch_size: int = 8, reference: str | os.PathLike[str] | None = None, input_format: str = "auto",
        workers: int | None = None, shard_size: int = 1000, retry_failed: bool = False,
        ray: bool | str | RaySettings | None = None, actors: int | None = None,
        threads_per_actor: int | None = None, progress: bool | str = False, session: Any = None,
        stop: threading.Event | None = None, progress_interval: float = 10.0) -> dict:
    """Transcribes a corpus into ``output_dir`` (see the module doc) and returns the summary (also
    written to ``output_dir/summary.json``).

    ``ray``: None/False = the local engine; True = Ray (``ray.init()``: ``RAY_ADDRESS`` or a local
    cluster; an already initialised Ray is used as it is); a string = the cluster address (``auto``,
    ``host:port``, ``ray://host:10001``). ``actors`` / ``threads_per_actor``: the Ray actor pool.
    ``workers``: reader threads of the local engine (default min(4, CPUs)). ``session``: a loaded
    Session to use (local engine; ``model``/``device``/``threads``/``vad`` are then ignored).
    ``progress``: False, True (a progress bar on stderr, for a terminal) or ``"lines"`` (one line on
    stderr every ``progress_interval`` seconds: done/total, audio hours, speed, ETA; for logs).
    ``stop``: when set (e.g. from a signal handler), the job stops after writing the batch in flight;
    the summary then says ``interrupted`` and a rerun resumes.
    """
    if progress not in (False, True, None, "bar", "lines"):
        raise BatchError(f"progress must be False, True (a bar) or 'lines', got {progress!r}")
    if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
        raise BatchError(f"batch_size must be a positive integer, got {batch_size!r}")
    if shard_size < 1:
        raise BatchError(f"shard_size must be a positive integer, got {shard_size!r}")
    if vad == "none":
        vad = None
    if isinstance(hotwords, str):
        hotwords = [h.strip() for h in hotwords.split(",")]
    opts = JobOptions(language, tuple(h.strip() for h in (hotwords or []) if h and h.strip()), bool(itn),
                      max_new_tokens, float(segment_seconds), bool(repetition_guard), batch_size)
    use_ray = ray is not None and ray is not False
    if use_ray:
        if session is not None:
            raise BatchError("session= is for the local engine; the Ray actors load the model themselves")
        settings = ray if isinstance(ray, RaySettings) else RaySettings(address=ray if isinstance(ray, str) else None)
        settings = dataclasses.replace(
            settings, actors=actors if actors is not None else settings.actors,
            threads_per_actor=threads_per_actor if threads_per_actor is not None else settings.threads_per_actor)
        from fun_asr.session import normalize_language
        from fun_asr.spec import load_spec

        normalize_language(load_spec(), language)  # the job's language: ValueError now, not in every actor
        for what, m in (("model", model), ("VAD model", vad_model)):
            p = None if m is None else os.fspath(m)
            if p and not Path(p).expanduser().exists() and (os.path.isabs(p) or p.startswith(("~", "."))
                                                             or p.endswith(".gguf")):
                raise BatchError(f"{what} {p}: no such file here; with Ray the {what} must be at this path on "
                                 "every node (and on this machine), or be a hub repo id")
    items = collect_items(inputs, input_format, reference)
    out = Path(output_dir)
    if out.exists() and not out.is_dir():
        raise BatchError(f"{out}: is a file; the output is a folder (created if missing)")
    specs = [os.fspath(i) for i in ([inputs] if isinstance(inputs, str | os.PathLike) else inputs)]
    check_outputs_are_not_inputs(out, specs, items, None if reference is None else os.fspath(reference),
                                 input_format)
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise BatchError(f"output folder {out}: cannot create it ({exc.strerror or exc}); choose a writable "
                         "folder (-o)") from None
    bar_mode = "bar" if progress is True or progress == "bar" else "lines" if progress == "lines" else None
    started_at = time.strftime("%Y-%m-%dT%H:%M:%S%z")
    with _lock(out):
        if retry_failed:
            n = _drop_failed(out)
            if n:
                log.info("%d failed result(s) will be transcribed again", n)
        done = read_results(out, repair=True)
        todo = [it for it in items if it.id not in done]
        skipped = len(items) - len(todo)
        keys = {(it.language, it.hotwords) for it in todo}
        if len(keys) > 1:  # items with equal options next to each other: full batches of one option set
            todo.sort(key=lambda it: (it.language or "", it.hotwords or ()))
        writer = ShardWriter(out, shard_size)
        note = f"fun-asr-batch: {skipped} of {len(items)} already done in {out}" if skipped else ""
        bar = _Progress(bar_mode if todo else None, len(todo), note, progress_interval)
        model_arg = _model_arg(model)

        def emit(records: list[dict]) -> None:
            writer.write(records)
            bar.update(records)

        engine_info: dict[str, Any] = {}
        interrupted = False
        finished = False
        try:
            if not todo or (stop is not None and stop.is_set()):
                pass
            elif use_ray:
                bar.begin()
                engine_info = _ray_engine(todo, model_arg, device, vad, None if vad_model is None else
                                          _model_arg(vad_model), opts, emit, settings, bar_mode == "bar", stop)
            else:
                if session is None:
                    from fun_asr.session import Session

                    session = Session(model_arg, device=device, threads=threads, progress=bar_mode == "bar",
                                      vad=vad, vad_model=vad_model)
                session.options(language, itn, list(opts.hotwords), max_new_tokens, segment_seconds,
                                repetition_guard)
                bar.begin()
                _local_engine(todo, session, opts, emit, workers or min(4, os.cpu_count() or 1), stop)
                engine_info = {"workers": workers or min(4, os.cpu_count() or 1)}
            interrupted = stop is not None and stop.is_set() and bar.items < len(todo)
            finished = True
        except KeyboardInterrupt:
            interrupted = True
            raise
        finally:
            writer.close()
            bar.close()
            run_info = {"engine": "ray" if use_ray else "local", **engine_info, "started": started_at,
                        "inputs": [os.fspath(i) for i in ([inputs] if isinstance(inputs, str | os.PathLike)
                                                          else inputs)],
                        "model": str(getattr(session, "path", model_arg)) if session is not None else model_arg,
                        "device": device, "options": {**opts.__dict__, "hotwords": list(opts.hotwords)},
                        "items": len(items), "skipped": skipped, "processed": bar.items, "failed": bar.failed,
                        "audio_seconds": round(bar.audio, 3), "wall_seconds": round(bar.wall, 3),
                        "rtfx": round(bar.audio / bar.wall, 3) if bar.wall > 0 else 0.0,
                        "interrupted": interrupted, "shards_written": [p.name for p in writer.paths]}
            try:
                summary = write_summary(out, items, run_info)
            except OSError as exc:
                if finished:
                    raise _write_error(out / SUMMARY, exc) from None
                log.warning("%s", _write_error(out / SUMMARY, exc))  # the error in flight is the one to report
    return summary


def write_summary(out: Path, items: Sequence[Item], run_info: dict) -> dict:
    """Scans every shard of the folder: counts, audio hours, WER/CER (when references are known, from
    the items or from the records), the per-item table ``eval.tsv``; writes ``summary.json``."""
    from fun_asr.evaluate import ItemResult, Score, score, write_table

    records = read_results(out)
    refs = {it.id: it.reference for it in items if it.reference is not None}
    ids = {it.id for it in items}
    failed = [r for r in records.values() if r.get("error")]
    audio = sum(float(r.get("duration") or 0.0) for r in records.values())
    summary: dict[str, Any] = {
        "schema_version": SCHEMA_VERSION,
        "results": len(records),
        "ok": len(records) - len(failed),
        "failed": len(failed),
        "pending": sum(1 for i in ids if i not in records),
        "audio_seconds": round(audio, 3),
        "audio_hours": round(audio / 3600, 6),
        "shards": [p.name for p in _shards(out)],
        "last_run": run_info,
        "failures": [{"id": r["id"], "error": r.get("error")} for r in failed[:1000]],
    }
    table = []
    for key, rec in records.items():
        ref = refs.get(key, rec.get("reference"))
        if ref is None:
            continue
        hyp = "" if rec.get("error") else rec.get("text") or ""
        table.append(ItemResult(key, ref, hyp, score(ref, hyp), rec.get("error")))
    if table:
        total = Score()
        for it in table:
            total = total + it.score
        summary["evaluation"] = {"items": len(table), "failed": sum(1 for t in table if t.error),
                                 **total.to_dict(), "table": EVAL_TABLE}
        write_table(sorted(table, key=lambda t: t.id), out / EVAL_TABLE)
    tmp = out / f"{SUMMARY}.tmp"
    tmp.write_text(json.dumps(summary, ensure_ascii=False, indent=2) + "\n", "utf-8")
    os.replace(tmp, out / SUMMARY)
    return summary


__all__ = ["AUDIO_EXTENSIONS", "BatchError", "INPUT_FORMATS", "Item", "JobOptions", "RaySettings", "RayTranscriber",
           "ShardWriter", "collect_items", "detect_format", "load", "read_references", "read_results", "run",
           "transcribe_loaded", "write_summary"]
