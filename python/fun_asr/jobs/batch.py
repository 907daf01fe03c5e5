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

import dataclasses
import json
import logging
import os
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from fun_asr.converter.hub import DEFAULT_REPO
from fun_asr.jobs.inputs import (
    AUDIO_EXTENSIONS,
    INPUT_FORMATS,
    BatchError,
    Item,
    collect_items,
    detect_format,
    read_references,
)
from fun_asr.jobs.local import JobOptions, _local_engine, _Progress, load, transcribe_loaded
from fun_asr.jobs.ray_engine import RaySettings, RayTranscriber, _ray_engine
from fun_asr.jobs.records import EVAL_TABLE, SCHEMA_VERSION, SUMMARY, _shards, read_results
from fun_asr.jobs.shards import (
    OutputWriteError,
    ShardWriter,
    _drop_failed,
    _lock,
    _write_error,
    check_outputs_are_not_inputs,
)

log = logging.getLogger("fun_asr.batch")


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
        stop: threading.Event | None = None, progress_interval: float = 10.0, silence_schedule: Any = None,
        dynamic_silence: bool | None = None, max_end_silence_time: int | None = None, diarize: bool = False,
        num_speakers: int | None = None, min_speakers: int | None = None, max_speakers: int | None = None,
        speaker_model: str | os.PathLike[str] | None = None, overwrite: bool = False,
        speaker_clustering: str | None = None) -> dict:
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
    ``silence_schedule``, ``dynamic_silence``, ``max_end_silence_time``: FunASR's per-call VAD kwargs, as
    ``Session.transcribe`` takes them. ``diarize`` (with ``num_speakers``, ``min_speakers``, ``max_speakers``,
    ``speaker_clustering``: ``"auto"`` or ``"funasr"``, None: the Session's, ``"auto"``): speaker labels in every
    record's segments (``speaker_model``: the CAM++ to use, else the Session's lookup).
    ``overwrite``: replace a ``summary.json`` or ``eval.tsv`` in ``output_dir`` that a fun-asr-batch job did not
    write (without it such a folder is refused before anything runs; the job's own records are always updated).
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
    from fun_asr.asr.options import check_vad_options

    try:
        vad_options = check_vad_options(silence_schedule, dynamic_silence, max_end_silence_time).to_dict()
    except (TypeError, ValueError) as exc:
        raise BatchError(str(exc)) from None
    from fun_asr.speakers.cluster import DEFAULT_CLUSTERING
    from fun_asr.speakers.diarize import SpeakerOptions

    try:
        checked = SpeakerOptions.check(num_speakers, min_speakers, max_speakers,
                                       DEFAULT_CLUSTERING if speaker_clustering is None else speaker_clustering)
    except ValueError as exc:
        raise BatchError(str(exc)) from None
    counts: dict[str, Any] = checked.counts()
    if speaker_clustering is not None:  # given: passed on (None: the Session's default)
        counts["speaker_clustering"] = checked.speaker_clustering
    if counts and not diarize:
        raise BatchError(f"{', '.join(counts)}: speaker options, but diarize is False")
    if speaker_model is not None and not diarize:
        raise BatchError("speaker_model is for diarize=True")
    speaker_options = {"diarize": True, **counts} if diarize else {}
    opts = JobOptions(language, tuple(h.strip() for h in (hotwords or []) if h and h.strip()), bool(itn),
                      max_new_tokens, float(segment_seconds), bool(repetition_guard), batch_size, vad_options,
                      speaker_options)
    use_ray = ray is not None and ray is not False
    if use_ray:
        if session is not None:
            raise BatchError("session= is for the local engine; the Ray actors load the model themselves")
        settings = ray if isinstance(ray, RaySettings) else RaySettings(address=ray if isinstance(ray, str) else None)
        settings = dataclasses.replace(
            settings, actors=actors if actors is not None else settings.actors,
            threads_per_actor=threads_per_actor if threads_per_actor is not None else settings.threads_per_actor)
        from fun_asr.asr.session import normalize_language
        from fun_asr.model.spec import load_spec

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
    _check_foreign_files(out, overwrite)
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
                                          _model_arg(vad_model), opts, emit, settings, bar_mode == "bar", stop,
                                          _model_arg(speaker_model) if speaker_model else None)
            else:
                if session is None:
                    from fun_asr.asr.session import Session

                    try:
                        session = Session(model_arg, device=device, threads=threads, progress=bar_mode == "bar",
                                          vad=vad, vad_model=vad_model,
                                          speaker_model=_model_arg(speaker_model) if speaker_model else "auto")
                    except (OSError, ValueError, RuntimeError) as exc:  # nothing was done
                        raise BatchError(f"cannot load model {model}: {exc}") from None
                session.options(language=language, itn=itn, hotwords=list(opts.hotwords), max_new_tokens=max_new_tokens,
                                segment_seconds=segment_seconds, repetition_guard=repetition_guard, **vad_options,
                                **speaker_options)  # as given: JobOptions holds them converted
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


def foreign_files(out: Path) -> tuple[list[Path], list[Path]]:
    """Files in ``out`` under the names a job writes that no fun-asr-batch job wrote: (``summary.json`` /
    ``eval.tsv`` that --overwrite may replace, shard files that are never touched)."""
    from fun_asr.jobs.evaluate import TABLE_HEADER

    replaceable: list[Path] = []
    summary = out / SUMMARY
    if os.path.lexists(summary):
        try:
            data = json.loads(summary.read_text("utf-8"))
            ours = isinstance(data, dict) and "schema_version" in data and "last_run" in data
        except (OSError, ValueError):
            ours = False
        if not ours:
            replaceable.append(summary)
    table = out / EVAL_TABLE
    if os.path.lexists(table):
        try:
            with open(table, encoding="utf-8") as f:
                ours = f.readline() == TABLE_HEADER
        except (OSError, ValueError):
            ours = False
        if not ours:
            replaceable.append(table)
    shards = []
    for shard in _shards(out):
        try:
            with open(shard, "rb") as f:
                first = f.readline()
            rec = json.loads(first) if first.strip() else {"id": None}
            ours = isinstance(rec, dict) and "id" in rec
        except (OSError, ValueError):
            ours = False
        if not ours:
            shards.append(shard)
    return replaceable, shards


def _check_foreign_files(out: Path, overwrite: bool) -> None:
    if not out.is_dir():
        return
    replaceable, shards = foreign_files(out)
    if shards:
        names = ", ".join(str(p) for p in shards[:3]) + (f" and {len(shards) - 3} more" if len(shards) > 3 else "")
        raise BatchError(f"output folder {out}: {names} look like result shards but are not fun-asr-batch records; "
                         "nothing was done: move them away or choose another folder (-o)")
    if replaceable and not overwrite:
        from fun_asr.outputs import existing_message

        raise BatchError(f"{existing_message(replaceable, 'overwrite=True', note=', not written by fun-asr-batch')} "
                         "(nothing was done)")


def write_summary(out: Path, items: Sequence[Item], run_info: dict) -> dict:
    """Scans every shard of the folder: counts, audio hours, WER/CER (when references are known, from
    the items or from the records), the per-item table ``eval.tsv``; writes ``summary.json``."""
    from fun_asr.jobs.evaluate import ItemResult, Score, score, write_table

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


__all__ = ["AUDIO_EXTENSIONS", "BatchError", "INPUT_FORMATS", "Item", "JobOptions", "OutputWriteError", "RaySettings",
           "RayTranscriber", "ShardWriter", "collect_items", "detect_format", "load", "read_references", "read_results",
           "run", "transcribe_loaded", "write_summary"]
