"""A corpus job's inputs: directories, globs, lists, JSONL/CSV manifests, Kaldi wav.scp -> items (id, audio,
reference, language, hotwords); reference texts."""

from __future__ import annotations

import csv
import glob as globlib
import io
import json
import os
import posixpath
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

AUDIO_EXTENSIONS = frozenset({".wav", ".wave", ".flac", ".ogg", ".oga", ".opus", ".mp3", ".aif", ".aiff", ".aifc",
                              ".au", ".snd", ".w64", ".rf64", ".caf", ".sph", ".nist", ".wv", ".voc"})
INPUT_FORMATS = ("auto", "dir", "glob", "list", "jsonl", "csv", "scp", "audio")
# Accepted manifest keys, first found wins. FunASR's JSONL (funasr/datasets/audio_datasets/scp2jsonl.py, what
# AutoModel.generate(input="x.jsonl") and its training read): "key", "source" (the audio), "target" (the
# transcript), optional "text_language"; its "source_len"/"target_len" are lengths, not needed here.
_ID_KEYS = ("id", "key", "utt", "utt_id", "uttid")
_AUDIO_KEYS = ("audio", "path", "audio_filepath", "wav", "file", "source")
_TEXT_KEYS = ("text", "reference", "transcript", "sentence", "target")
_LANGUAGE_KEYS = ("language", "lang", "text_language")


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


def is_url(s: str) -> bool:
    return "://" in s


def has_magic(s: str) -> bool:
    return any(c in s for c in "*?[")


def _ext(s: str) -> str:
    return posixpath.splitext(s.rstrip("/"))[1].lower()


def _read_text(path: str) -> str:
    try:
        if is_url(path):
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


def url_dirname(path: str) -> str:
    return posixpath.dirname(path) if is_url(path) else os.path.dirname(os.path.abspath(path))


def _resolve(entry: str, base: str) -> str:
    """A path from a list or manifest: URLs and absolute paths as they are; a relative path is taken
    relative to the manifest's folder when it exists there, else relative to the current directory."""
    entry = entry.strip()
    if is_url(entry) or os.path.isabs(entry):
        return entry
    if is_url(base):
        return posixpath.join(base, entry)
    candidate = os.path.join(base, entry)
    return candidate if os.path.exists(candidate) else entry


def _exists(path: str) -> bool:
    if is_url(path):
        import fsspec

        fs, p = fsspec.core.url_to_fs(path)
        return fs.exists(p)
    return os.path.exists(path)


def _is_dir(path: str) -> bool:
    if is_url(path):
        import fsspec

        fs, p = fsspec.core.url_to_fs(path)
        return fs.isdir(p)
    return os.path.isdir(path)


def _list_files(spec: str, kind: str) -> list[tuple[str, str]]:
    """(path or URL, path relative to the root) of the audio files of a directory or glob."""
    if is_url(spec):
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
        if has_magic(part):
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


def _language_tag(value: str) -> str | None:
    """A manifest's language: SenseVoice-style tags (FunASR's ``text_language``: ``<|en|>``) unwrapped; ``auto``
    and ``nospeech`` (its tag for clips without speech) mean none (automatic)."""
    value = value.strip()
    if value.startswith("<|") and value.endswith("|>"):
        value = value[2:-2].strip()
    return None if value.lower() in ("", "auto", "nospeech") else value


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
        lang = _first(row, _LANGUAGE_KEYS)
        try:
            hw = _hotwords(row.get("hotwords"))
        except BatchError as exc:
            raise BatchError(f"{name}:{n}: {exc}") from None
        items.append(Item(str(key) if key is not None else "", audio, None if ref is None else str(ref),
                          None if lang is None else _language_tag(str(lang)), hw))
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
                             "'id', 'audio' and optional 'text', 'language', 'hotwords' (or FunASR's 'key', 'source', "
                             "'target', 'text_language')") from None
        if not isinstance(obj, dict):
            raise BatchError(f"{path}:{n}: expected a JSON object, got {type(obj).__name__}")
        rows.append((n, obj))
    return _manifest_items(rows, path, url_dirname(path))


def _read_csv(path: str) -> list[Item]:
    text = _read_text(path)
    delimiter = "\t" if _ext(path) == ".tsv" else ","
    reader = csv.DictReader(io.StringIO(text), delimiter=delimiter)
    if not reader.fieldnames:
        raise BatchError(f"{path}: empty CSV manifest (a header row with 'id' and 'audio' is expected)")
    rows = [(n + 2, {(k or "").strip().lower(): v for k, v in row.items()}) for n, row in enumerate(reader)]
    return _manifest_items(rows, path, url_dirname(path))


def _read_list(path: str) -> list[Item]:
    base = url_dirname(path)
    paths = [_resolve(line, base) for line in _read_text(path).splitlines()
             if line.strip() and not line.lstrip().startswith("#")]
    return [Item(key, p) for key, p in zip(_path_list_ids(paths), paths, strict=True)]


def _read_scp(path: str) -> list[Item]:
    base = url_dirname(path)
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
    text = posixpath.join(base, "text") if is_url(path) else os.path.join(base, "text")
    if _exists(text):
        from fun_asr.jobs.evaluate import parse_kaldi_text

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
    if has_magic(spec) and not _exists(spec):
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
        new = _items_of(spec, kind)
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


def _items_of(spec: str, kind: str) -> list[Item]:
    """The recordings one input names, read as ``kind`` (a format of :data:`INPUT_FORMATS` other than auto)."""
    if kind in ("dir", "glob"):
        return _folder_items(spec, kind)
    reader = _MANIFEST_READERS.get(kind)
    if reader is not None:
        return reader(spec)
    return [_audio_item(spec)]


def _folder_items(spec: str, kind: str) -> list[Item]:
    """The audio files of a directory (``kind`` dir) or the files a glob matches, ids from their paths."""
    if kind == "dir" and not _is_dir(spec):
        raise BatchError(f"{spec}: not a directory")
    files = _list_files(spec, kind)
    if not files:
        what = "audio files" if kind == "dir" else "files"
        raise BatchError(f"{spec}: no {what} found (audio extensions: {', '.join(sorted(AUDIO_EXTENSIONS))})")
    return [Item(key, path) for key, (path, _) in zip(_unique_ids([r for _, r in files]), files, strict=True)]


def _audio_item(spec: str) -> Item:
    """One audio file (or URL) as an input of its own."""
    if not is_url(spec) and not os.path.exists(spec):
        raise BatchError(f"{spec}: no such file" + (" (a broken symbolic link)" if os.path.islink(spec)
                                                     else ""))
    if not is_url(spec) and os.path.isdir(spec):
        raise BatchError(f"{spec}: is a directory; give it as a directory input (--input-format dir)")
    return Item(_path_list_ids([spec])[0], spec)


_MANIFEST_READERS: dict[str, Callable[[str], list[Item]]] = {
    "list": _read_list, "jsonl": _read_jsonl, "csv": _read_csv, "scp": _read_scp}


def read_references(path: str | os.PathLike[str]) -> dict[str, str]:
    """id -> reference text from a Kaldi ``text`` file or a JSONL file (``id``, ``text``)."""
    from fun_asr.jobs.evaluate import TextSourceError, load_texts

    try:
        texts, _ = load_texts(path)
    except TextSourceError as exc:
        raise BatchError(str(exc)) from None
    return texts
