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
import inspect
import json
import logging
import os
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from fun_asr.asr.option_table import OPTIONS, VAD_OPTIONS, check_lines
from fun_asr.converter.hub import DEFAULT_REPO
from fun_asr.errors import FunAsrError, literal, options_field
from fun_asr.jobs.inputs import (
    AUDIO_EXTENSIONS,
    INPUT_FORMATS,
    BatchError,
    Item,
    collect_items,
    detect_format,
    read_references,
)
from fun_asr.jobs.local import JobOptions, Progress, load, local_engine, transcribe_loaded
from fun_asr.jobs.ray_engine import RaySettings, RayTranscriber, ray_engine
from fun_asr.jobs.records import EVAL_TABLE, SCHEMA_VERSION, SUMMARY, read_results, shard_files
from fun_asr.jobs.shards import (
    OutputWriteError,
    ShardWriter,
    check_outputs_are_not_inputs,
    drop_failed,
    shard_lock,
    write_error,
)

log = logging.getLogger("fun_asr.batch")


def _model_arg(model: str | os.PathLike[str]) -> str:
    """A local model as an absolute path (Ray workers have their own working directory); a hub id as is."""
    p = Path(model).expanduser()
    return str(p.resolve()) if p.exists() else os.fspath(model)


@dataclass(frozen=True)
class JobSettings:
    """How a job runs: everything :func:`run` takes besides the transcription options (the job keys of
    :data:`fun_asr.asr.option_table.OPTIONS`) and ``session`` / ``stop``."""

    model: str | os.PathLike[str] = DEFAULT_REPO
    device: str = "auto"
    threads: int = 0
    vad: str | None = "auto"
    vad_model: str | os.PathLike[str] | None = None
    batch_size: int = 8
    reference: str | os.PathLike[str] | None = None
    input_format: str = "auto"
    workers: int | None = None
    shard_size: int = 1000
    retry_failed: bool = False
    ray: bool | str | RaySettings | None = None
    actors: int | None = None
    threads_per_actor: int | None = None
    progress: bool | str = False
    progress_interval: float = 10.0
    speaker_model: str | os.PathLike[str] | None = None
    overwrite: bool = False


SETTINGS = tuple(f.name for f in dataclasses.fields(JobSettings))
JOB_OPTIONS = {o.job: o.name for o in OPTIONS.values() if o.job}  # job key -> option name


def job_config(config: dict[str, Any]) -> tuple[JobSettings, dict[str, Any]]:
    """``run``'s keyword arguments as (the settings, the transcription options by option name, defaults filled
    in); TypeError naming an unknown one and the accepted ones."""
    unknown = sorted(set(config) - set(SETTINGS) - set(JOB_OPTIONS))
    if unknown:
        raise TypeError(f"run() got an unexpected keyword argument {unknown[0]!r}; a job takes "
                        f"{', '.join([*SETTINGS, *JOB_OPTIONS])}")
    settings = JobSettings(**{k: v for k, v in config.items() if k in SETTINGS})
    options = {name: config.get(key, OPTIONS[name].default) for key, name in JOB_OPTIONS.items()}
    return settings, options


def job_options(o: dict[str, Any], batch_size: int) -> JobOptions:
    """The job's transcription options checked once, before anything runs (BatchError naming the option)."""
    from fun_asr.asr.options import check_vad_options
    from fun_asr.speakers.cluster import DEFAULT_CLUSTERING
    from fun_asr.speakers.diarize import SpeakerOptions

    hotwords = o["hotwords"]
    if isinstance(hotwords, str):
        hotwords = [h.strip() for h in hotwords.split(",")]
    try:
        vad_options = check_vad_options(*(o[k] for k in VAD_OPTIONS)).to_dict()
        clustering = o["speaker_clustering"]
        checked = SpeakerOptions.check(o["num_speakers"], o["min_speakers"], o["max_speakers"],
                                       DEFAULT_CLUSTERING if clustering is None else clustering)
        lines = check_lines(o)
    except FunAsrError as exc:  # kept as data: each front end says it in its words
        raise BatchOptionError(exc.code, exc.message.template, option=exc.option, limit=exc.limit,
                               **exc.values) from None
    except (TypeError, ValueError) as exc:
        raise BatchError(str(exc)) from None
    counts: dict[str, Any] = checked.counts()
    if clustering is not None:  # given: passed on (None: the Session's default)
        counts["speaker_clustering"] = checked.speaker_clustering
    if counts and not o["diarize"]:
        raise BatchOptionError("option.needs", options_field(counts) + ": speaker options, but {h[no_speakers_asked]}",
                               option=next(iter(counts)))
    return JobOptions(o["language"], tuple(h.strip() for h in (hotwords or []) if h and h.strip()), bool(o["itn"]),
                      o["max_new_tokens"], float(o["segment_seconds"]), bool(o["repetition_guard"]), batch_size,
                      vad_options, {"diarize": True, **counts} if o["diarize"] else {}, lines)


def _check_settings(s: JobSettings) -> None:
    if s.progress not in (False, True, None, "bar", "lines"):
        raise BatchError(f"progress must be False, True (a bar) or 'lines', got {s.progress!r}")
    if isinstance(s.batch_size, bool) or not isinstance(s.batch_size, int) or s.batch_size < 1:
        raise BatchError(f"batch_size must be a positive integer, got {s.batch_size!r}")
    if s.shard_size < 1:
        raise BatchError(f"shard_size must be a positive integer, got {s.shard_size!r}")


def _ray_settings(s: JobSettings, session: Any, language: str | None) -> RaySettings:
    """The Ray engine's settings, and what can be checked here before any actor starts."""
    if session is not None:
        raise BatchError("session= is for the local engine; the Ray actors load the model themselves")
    ray = s.ray if isinstance(s.ray, RaySettings) else RaySettings(address=s.ray if isinstance(s.ray, str) else None)
    ray = dataclasses.replace(
        ray, actors=s.actors if s.actors is not None else ray.actors,
        threads_per_actor=s.threads_per_actor if s.threads_per_actor is not None else ray.threads_per_actor)
    from fun_asr.asr.session import normalize_language
    from fun_asr.model.spec import load_spec

    normalize_language(load_spec(), language)  # the job's language: ValueError now, not in every actor
    for what, m in (("model", s.model), ("VAD model", s.vad_model)):
        p = None if m is None else os.fspath(m)
        if p and not Path(p).expanduser().exists() and (os.path.isabs(p) or p.startswith(("~", "."))
                                                         or p.endswith(".gguf")):
            raise BatchError(f"{what} {p}: no such file here; with Ray the {what} must be at this path on "
                             "every node (and on this machine), or be a hub repo id")
    return ray


def _prepare_output(out: Path, inputs: list[str], items: list[Item], s: JobSettings) -> None:
    if out.exists() and not out.is_dir():
        raise BatchError(f"{out}: is a file; the output is a folder (created if missing)")
    check_outputs_are_not_inputs(out, inputs, items, None if s.reference is None else os.fspath(s.reference),
                                 s.input_format)
    _check_foreign_files(out, s.overwrite)
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise BatchError(f"output folder {out}: cannot create it ({exc.strerror or exc}); choose a writable "
                         "folder (-o)") from None


def run(inputs: Sequence[str | os.PathLike[str]] | str | os.PathLike[str], output_dir: str | os.PathLike[str], *,
        session: Any = None, stop: threading.Event | None = None, **config: Any) -> dict:
    """Transcribes a corpus into ``output_dir`` (see the module doc) and returns the summary (also
    written to ``output_dir/summary.json``). ``config``: the :class:`JobSettings` and the transcription options
    (the job keys of :data:`fun_asr.asr.option_table.OPTIONS`: ``language``, ``itn``, ``hotwords``,
    ``max_new_tokens``, ``segment_seconds``, ``repetition_guard``, the VAD, speaker and subtitle line options).

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
    ``max_line_width`` (with ``max_line_count``): every record gets ``cues``, its srt/vtt subtitle cues
    (``start``, ``end``, ``text`` with its lines joined by a line break) made with those line limits.
    ``overwrite``: replace a ``summary.json`` or ``eval.tsv`` in ``output_dir`` that a fun-asr-batch job did not
    write (without it such a folder is refused before anything runs; the job's own records are always updated).
    """
    s, options = job_config(config)
    _check_settings(s)
    if s.vad == "none":
        s = dataclasses.replace(s, vad=None)
    opts = job_options(options, s.batch_size)
    if s.speaker_model is not None and not options["diarize"]:
        raise BatchOptionError("option.needs", "{o[speaker_model]} is for {o[diarize=True]}", option="speaker_model")
    use_ray = s.ray is not None and s.ray is not False
    ray = _ray_settings(s, session, opts.language) if use_ray else None
    items = collect_items(inputs, s.input_format, s.reference)
    out = Path(output_dir)
    specs = [os.fspath(i) for i in ([inputs] if isinstance(inputs, str | os.PathLike) else inputs)]
    _prepare_output(out, specs, items, s)
    with shard_lock(out):
        return _run_locked(out, specs, items, s, opts, session, stop, ray)


def _run_locked(out: Path, specs: list[str], items: list[Item], s: JobSettings, opts: JobOptions, session: Any,
                stop: threading.Event | None, ray: RaySettings | None) -> dict:
    """The job in its locked output folder: what is not done yet, through the engine, then the summary."""
    bar_mode = _bar_mode(s.progress)
    started_at = time.strftime("%Y-%m-%dT%H:%M:%S%z")
    if s.retry_failed:
        n = drop_failed(out)
        if n:
            log.info("%d failed result(s) will be transcribed again", n)
    done = read_results(out, repair=True)
    todo = [it for it in items if it.id not in done]
    skipped = len(items) - len(todo)
    if len({(it.language, it.hotwords) for it in todo}) > 1:  # equal options side by side: full batches
        todo.sort(key=lambda it: (it.language or "", it.hotwords or ()))
    writer = ShardWriter(out, s.shard_size)
    note = f"fun-asr-batch: {skipped} of {len(items)} already done in {out}" if skipped else ""
    bar = Progress(bar_mode if todo else None, len(todo), note, s.progress_interval)
    model_arg = _model_arg(s.model)

    def emit(records: list[dict]) -> None:
        writer.write(records)
        bar.update(records)

    engine_info: dict[str, Any] = {}
    interrupted = finished = False
    try:
        if todo and not (stop is not None and stop.is_set()):
            if ray is None and session is None:
                session = _load_session(s, model_arg, bar_mode == "bar")
            engine_info = _engine(todo, s, opts, session, ray, emit, bar, stop)
        interrupted = stop is not None and stop.is_set() and bar.items < len(todo)
        finished = True
    except KeyboardInterrupt:
        interrupted = True
        raise
    finally:
        writer.close()
        bar.close()
        run_info = {"engine": "ray" if ray is not None else "local", **engine_info, "started": started_at,
                    "inputs": specs, "model": _model_name(session, model_arg), "device": s.device,
                    "options": {**opts.__dict__, "hotwords": list(opts.hotwords)}, "items": len(items),
                    "skipped": skipped, **bar.counts(), "interrupted": interrupted,
                    "shards_written": [p.name for p in writer.paths]}
        summary = _summary(out, items, run_info, finished)
    return summary


def _bar_mode(progress: bool | str | None) -> str | None:
    return "bar" if progress is True or progress == "bar" else "lines" if progress == "lines" else None


def _model_name(session: Any, model_arg: str) -> str:
    return str(getattr(session, "path", model_arg)) if session is not None else model_arg


def _engine(todo: list[Item], s: JobSettings, opts: JobOptions, session: Any, ray: RaySettings | None,
            emit: Callable[[list[dict]], None], bar: Progress, stop: threading.Event | None) -> dict[str, Any]:
    """The items through the Ray engine (``ray``) or the local one (``session``); what the summary says of it."""
    if ray is not None:
        bar.begin()
        session_args = {"model": _model_arg(s.model), "device": s.device, "vad": s.vad,
                        "vad_model": None if s.vad_model is None else _model_arg(s.vad_model),
                        "speaker_model": _model_arg(s.speaker_model) if s.speaker_model else None}
        return ray_engine(todo, session_args, opts, emit, ray, _bar_mode(s.progress) == "bar", stop)
    session.options(**opts.transcription_options(opts.language, opts.hotwords))
    bar.begin()
    workers = s.workers or min(4, os.cpu_count() or 1)
    local_engine(todo, session, opts, emit, workers, stop)
    return {"workers": workers}


class BatchOptionError(FunAsrError, BatchError):
    """A job's option or setting is wrong (a :class:`BatchError` that keeps its :mod:`fun_asr.errors` data)."""


def _load_session(s: JobSettings, model_arg: str, progress: bool) -> Any:
    from fun_asr.asr.session import Session

    try:
        return Session(model_arg, device=s.device, threads=s.threads, progress=progress, vad=s.vad,
                       vad_model=s.vad_model, speaker_model=_model_arg(s.speaker_model) if s.speaker_model else "auto")
    except (OSError, ValueError, RuntimeError) as exc:  # nothing was done
        raise BatchError(f"cannot load model {s.model}: {exc}") from None


def _summary(out: Path, items: list[Item], run_info: dict, finished: bool) -> Any:
    try:
        return write_summary(out, items, run_info)
    except OSError as exc:
        if finished:
            raise write_error(out / SUMMARY, exc) from None
        log.warning("%s", write_error(out / SUMMARY, exc))  # the error in flight is the one to report
        return None


def _run_signature() -> inspect.Signature:
    """``run``'s parameters as help() shows them: the settings and the job's transcription options by name."""
    p = inspect.Parameter
    params = [p("inputs", p.POSITIONAL_OR_KEYWORD), p("output_dir", p.POSITIONAL_OR_KEYWORD),
              p("session", p.KEYWORD_ONLY, default=None), p("stop", p.KEYWORD_ONLY, default=None)]
    params += [p(f.name, p.KEYWORD_ONLY, default=f.default) for f in dataclasses.fields(JobSettings)]
    params += [p(key, p.KEYWORD_ONLY, default=OPTIONS[name].default) for key, name in JOB_OPTIONS.items()]
    return inspect.Signature(params, return_annotation=dict)


run.__signature__ = _run_signature()  # type: ignore[attr-defined]


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
    for shard in shard_files(out):
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

        listed = existing_message([literal(str(p)) for p in replaceable], "{o[overwrite=True]}",
                                  note=", not written by fun-asr-batch")
        raise BatchOptionError("output.exists", listed + " (nothing was done)", option="overwrite")


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
        "shards": [p.name for p in shard_files(out)],
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


__all__ = ["AUDIO_EXTENSIONS", "BatchError", "INPUT_FORMATS", "Item", "JobOptions", "JobSettings", "OutputWriteError",
           "RaySettings",
           "RayTranscriber", "ShardWriter", "collect_items", "detect_format", "load", "read_references", "read_results",
           "run", "transcribe_loaded", "write_summary"]
