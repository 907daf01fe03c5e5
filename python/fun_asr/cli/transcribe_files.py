"""fun-asr-transcribe's files: the inputs checked before the model loads, one output name per input, the -o
folder checked, and a result written in the chosen formats (to stdout, or one file per format)."""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING

from fun_asr.asr.formats import render
from fun_asr.cli.common import UsageError
from fun_asr.outputs import ExistingOutputError, check_new_outputs, write_atomic

if TYPE_CHECKING:
    from fun_asr.asr.results import Transcription

PROG = "fun-asr-transcribe"
STDIN = "-"


def error(msg: str) -> None:
    """One error line on stderr, named after the command."""
    print(f"{PROG}: error: {msg}", file=sys.stderr)


def check_inputs(files: list[str]) -> None:
    """Every input file exists and is readable: a wrong name is reported before the model loads."""
    problems = []
    for name in files:
        if name == STDIN:
            continue
        if not os.path.exists(name):
            why = "a broken symbolic link" if os.path.islink(name) else "no such audio file"
            problems.append(f"{name}: {why}")
        elif os.path.isdir(name):
            problems.append(f"{name}: is a directory, not an audio file (give the files in it, e.g. {name}/*.wav)")
        elif not os.access(name, os.R_OK):
            problems.append(f"{name}: cannot read it (permission denied)")
    if problems:
        raise UsageError("\n".join(problems))


def _file_id(path: str | Path) -> tuple[int, int] | None:
    """(device, inode) of an existing file; None when it cannot be stat'ed (not there yet)."""
    try:
        st = os.stat(path)
    except OSError:
        return None
    return st.st_dev, st.st_ino


def check_outputs_are_not_inputs(out: Path, files: list[str], names: list[str], formats: list[str]) -> None:
    """No file this run writes is one of its inputs: the same path once links are resolved, or the same
    file (inode) under another name (a hard link, a case-insensitive disk)."""
    inputs = [name for name in files if name != STDIN]
    if not inputs:
        return
    real: dict[str, str] = {}
    inodes: dict[tuple[int, int], str] = {}
    for name in inputs:
        real.setdefault(os.path.realpath(name), name)
        file_id = _file_id(name)
        if file_id is not None:
            inodes.setdefault(file_id, name)
    for base in names:
        for fmt in formats:
            path = out / f"{base}.{fmt}"
            same, how = real.get(os.path.realpath(path)), ""
            if same is None:
                file_id = _file_id(path)
                same = None if file_id is None else inodes.get(file_id)
                how = " (the same file under another name: a link)"
            if same is not None:
                raise UsageError(f"-o {out}: writing {path} would overwrite the input {same}{how}; nothing was "
                                 "written: choose another -o folder")


def check_outputs(out: Path, files: list[str], names: list[str], formats: list[str], overwrite: bool) -> None:
    """-o DIR before the model loads: no output is an input, the folder can be written to, and no output exists
    already unless ``overwrite``."""
    check_outputs_are_not_inputs(out, files, names, formats)
    check_output_dir(out)
    try:
        check_new_outputs([out / f"{base}.{fmt}" for base in names for fmt in formats], overwrite)
    except ExistingOutputError as exc:
        raise UsageError(f"{exc} (nothing was done)") from None


def check_output_dir(out: Path) -> None:
    """-o DIR: a directory (created if missing) that can be written to."""
    if out.exists() and not out.is_dir():
        raise UsageError(f"-o {out}: is an existing file; -o takes a directory (it is created if missing)")
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise UsageError(f"-o {out}: cannot create the directory ({exc.strerror or exc})") from None
    try:
        with tempfile.NamedTemporaryFile(dir=out, prefix=".fun-asr-write-test-"):
            pass
    except OSError as exc:
        raise UsageError(f"-o {out}: cannot write there ({exc.strerror or exc})") from None


def output_names(inputs: list[str]) -> list[str]:
    """A unique output base name per input, predictable from the inputs alone.

    The file stem (``talk``) when it is unique in this run; inputs whose names collide keep more of
    their name, step by step, until they differ: the extension (``talk.wav``, ``talk.flac``), then
    parent folders (``a__talk.wav``, ``b__talk.wav``); the same input again (the same path, however
    it is spelled: ``x.wav``, ``./x.wav``, ``X.WAV``) gets the first one's name with ``-2``, ``-3``.
    Standard input is ``stdin``. Names are compared case-insensitively (for case-insensitive disks).
    """
    # the same path (or one differing only in case, which no parent folder can tell apart) is numbered
    # after the first one's name below
    keys = [name if name == STDIN else os.path.normpath(os.path.abspath(name)).casefold() for name in inputs]
    first: dict[str, str] = {}  # path -> the input as first given
    for key, name in zip(keys, inputs, strict=True):
        first.setdefault(key, name)
    names = dict(zip(first, _unique_names(list(first.values())), strict=True))
    used = {n.casefold() for n in names.values()}
    out = []
    seen: set[str] = set()
    for key in keys:
        base = names[key]
        if key not in seen:
            seen.add(key)
            out.append(base)
            continue
        k = 2
        while f"{base}-{k}".casefold() in used:
            k += 1
        used.add(f"{base}-{k}".casefold())
        out.append(f"{base}-{k}")
    return out


def _unique_names(inputs: list[str]) -> list[str]:
    """output_names for inputs that are all different paths."""
    def candidate(name: str, level: int) -> str:
        if name == STDIN:
            return "stdin"
        p = Path(name)
        if level == 0:
            return p.stem or p.name
        if level == 1:
            return p.name
        parts = Path(os.path.abspath(name)).parts[1:]
        return "__".join(parts[-level:]) if level <= len(parts) else ""

    levels = [0] * len(inputs)
    while True:
        names = [candidate(n, lv) for n, lv in zip(inputs, levels, strict=True)]
        seen: dict[str, list[int]] = {}
        for i, n in enumerate(names):
            seen.setdefault(n.casefold(), []).append(i)
        clashes = [idx for idx in seen.values() if len(idx) > 1]
        if not clashes:
            return names
        progressed = False
        for idx in clashes:
            for i in idx:
                if candidate(inputs[i], levels[i] + 1):
                    levels[i] += 1
                    progressed = True
        if not progressed:  # (not reached: the paths differ, so some parent folder tells them apart)
            counts: dict[str, int] = {}
            out = []
            for n in names:
                k = counts[n.casefold()] = counts.get(n.casefold(), 0) + 1
                out.append(n if k == 1 else f"{n}-{k}")
            return out


def say_why_empty(result: Transcription, shown: str) -> None:
    """A result without text says why on stderr (stdout keeps its format: an empty line, an empty file):
    ``FILE: no speech found (no_speech)`` where the VAD found no speech (so the recognizer did not run), ``FILE: no
    words recognized`` where it ran and said nothing. Audio shorter than one frame (``too_short``) has its own
    warning."""
    if result.text.strip() or result.empty_reason == "too_short":
        return
    if result.empty_reason == "no_speech":
        why = "no speech found (no_speech)"
    else:
        why = "no words recognized (the text is empty)"
    print(f"{PROG}: {shown}: {why}", file=sys.stderr)


def emit(result, shown: str, base: str, args: argparse.Namespace, out_dir: Path | None,  # noqa: ANN001
          several: bool) -> None:
    """One result: to stdout in the one format (JSON: one line per input), or one file per format in -o."""
    if not args.quiet:
        say_why_empty(result, shown)
    if out_dir is None:
        fmt = args.formats[0]
        if fmt == "json":  # always one compact object per line: `*.wav -f json > all.jsonl` is JSONL for any count
            text = json.dumps({"input": shown, **result.to_dict()}, ensure_ascii=False) + "\n"
        else:
            text = render(result, fmt, words=args.word_timestamps, mark_below=args.mark_below)
            if several and fmt == "txt":
                text = f"{shown}: {text}"
        sys.stdout.write(text)
        sys.stdout.flush()
        return
    written = []
    for fmt in args.formats:
        path = out_dir / f"{base}.{fmt}"
        if fmt == "json":
            text = json.dumps({"input": shown, **result.to_dict()}, ensure_ascii=False, indent=2) + "\n"
        else:
            text = render(result, fmt, words=args.word_timestamps, mark_below=args.mark_below)
        write_atomic(path, text, overwrite=args.overwrite)
        written.append(str(path))
    if not args.quiet:
        print(f"{PROG}: {shown} -> {', '.join(written)}", file=sys.stderr)
