"""fun-asr-batch: a corpus -> a folder of JSONL shards + summary.json, resumable, locally or on Ray."""

from __future__ import annotations

import argparse
import contextlib
import os
import signal
import sys
import threading
import warnings
from collections.abc import Iterator
from typing import Any

from fun_asr.asr.option_table import OPTIONS
from fun_asr.cli import common
from fun_asr.cli.common import UsageError
from fun_asr.errors import render

PROG = "fun-asr-batch"
PROGRESS_INTERVAL_ENV = "FUN_ASR_PROGRESS_INTERVAL"  # seconds between progress lines off a terminal (default 10)


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(
        prog=PROG,
        description="Transcribe a corpus into a folder of JSONL shards (one object per recording) and summary.json. "
                    "Rerunning the same command skips what is done, so a stopped job resumes.",
        epilog="Inputs: directories (searched recursively), globs ('data/**/*.flac'), lists of paths (.txt/.lst), "
               "JSONL or CSV/TSV manifests (id, audio, optional text, language, hotwords; FunASR's JSONL key, source, "
               "target, text_language too), Kaldi wav.scp (a 'text' file beside it gives the references). Local "
               "paths or fsspec URLs (s3://, gs://, https://, ...).")
    ap.add_argument("inputs", nargs="+", metavar="INPUT", help="what to transcribe (see below)")
    ap.add_argument("-o", "--output-dir", required=True, help="result folder (created if missing; a rerun resumes)")
    common.add_recognizer_arguments(
        ap, model_help="; with --ray it must exist at this path on every node, or be a hub id",
        language_help="zh, en, ja (or chinese/english/japanese, 中文/英文/日文, FunASR's aliases; any other name "
                      "reaches the prompt as written); leave it out for automatic; a manifest's per-item 'language' "
                      "overrides it",
        hotwords_help="comma-separated words to favour; a manifest's per-item 'hotwords' override")
    ap.add_argument("--device", default="auto", help="auto, cpu, gpu[:N], cuda[:N], vulkan[:N], metal (default auto)")
    ap.add_argument("--threads", type=int, default=0,
                    help="CPU threads of the local engine (default 0: auto, up to all cores)")
    tokens = OPTIONS["max_new_tokens"]
    ap.add_argument(tokens.cli, type=int, default=tokens.default, help=f"{tokens.help} (default {tokens.default})")
    common.add_segment_seconds_argument(ap)
    ap.add_argument("--vad", default="auto", choices=["auto", "fsmn", "none"],
                    help="FunASR's FSMN-VAD in front of the recognizer (default auto: when available)")
    ap.add_argument("--vad-model", help="FSMN-VAD model: a .gguf, a FunASR fsmn-vad folder, or a hub repo id")
    common.add_vad_arguments(ap)
    common.add_speaker_arguments(ap)
    common.add_line_arguments(ap, "; each record gets the subtitle cues ('cues': start, end, text)")
    ap.add_argument("--no-repetition-guard", action="store_true", help="do not stop n-gram loops early")
    ap.add_argument("--batch-size", type=int, default=8,
                    help="recordings per batch, and segments decoded together (default 8)")
    ap.add_argument("--reference", metavar="TEXT",
                    help="reference transcripts: a Kaldi text file ('<id> <text>') or JSONL (id, text); WER/CER go "
                         "into each record, summary.json and eval.tsv")
    ap.add_argument("--input-format", default="auto", choices=["auto", "dir", "glob", "list", "jsonl", "csv", "scp",
                                                              "audio"],
                    help="what the inputs are (default auto: from their names)")
    ap.add_argument("--workers", type=int, default=None,
                    help="local engine: audio reader threads (default min(4, CPUs))")
    ap.add_argument("--shard-size", type=int, default=1000, help="records per shard file (default 1000)")
    ap.add_argument("--retry-failed", action="store_true", help="transcribe again the recordings that failed before")
    ap.add_argument("--overwrite", action="store_true",
                    help="replace a summary.json or eval.tsv in the output folder that fun-asr-batch did not write "
                         "(without it such a folder is refused; a job's own records are always updated)")
    ray = ap.add_argument_group("Ray engine (pip install 'fun-asr[ray]')")
    ray.add_argument("--ray", nargs="?", const="", default=None, metavar="ADDRESS",
                     help="run on Ray: without ADDRESS, RAY_ADDRESS or a new local cluster; 'auto' = the cluster "
                          "started on this machine with 'ray start'; or host:port, ray://host:10001")
    ray.add_argument("--actors", type=int, default=None,
                     help="Sessions (model copies) in the actor pool (default: cluster CPUs / threads per actor, "
                          "or one per GPU with --device cuda)")
    ray.add_argument("--threads-per-actor", type=int, default=None,
                     help="CPU threads of each actor's Session (default: a node's CPUs - 1, at most 4)")
    ap.add_argument("--quiet", action="store_true",
                    help="no progress (a bar on a terminal, else a line every 10 s) or messages on stderr")
    ap.add_argument("--verbose", action="store_true", help="full tracebacks and logging")
    return ap


def _error(msg: str) -> None:
    print(f"{PROG}: error: {msg}", file=sys.stderr)


def _check(args: argparse.Namespace) -> str | None:
    if args.batch_size < 1:
        return f"--batch-size must be 1 or more, got {args.batch_size}"
    if args.max_new_tokens < 1:
        return f"--max-new-tokens must be 1 or more, got {args.max_new_tokens}"
    if not args.segment_seconds >= 1.0:
        return f"--segment-seconds must be at least 1, got {args.segment_seconds:g}"
    if args.threads < 0:
        return f"--threads must be 0 (auto) or more, got {args.threads}"
    if args.workers is not None and args.workers < 1:
        return f"--workers must be 1 or more, got {args.workers}"
    if args.shard_size < 1:
        return f"--shard-size must be 1 or more, got {args.shard_size}"
    if args.vad_model and args.vad == "none":
        return "--vad-model with --vad none: choose one"
    if args.ray is None and (args.actors is not None or args.threads_per_actor is not None):
        return "--actors and --threads-per-actor are for the Ray engine: add --ray [ADDRESS]"
    if args.actors is not None and args.actors < 1:
        return f"--actors must be 1 or more, got {args.actors}"
    if args.threads_per_actor is not None and args.threads_per_actor < 1:
        return f"--threads-per-actor must be 1 or more, got {args.threads_per_actor}"
    if args.language is not None:
        from fun_asr.asr.session import normalize_language
        from fun_asr.model.spec import load_spec

        try:
            normalize_language(load_spec(), args.language)
        except ValueError as exc:
            return f"--language {args.language}: {exc}"
    try:
        args.vad_kwargs = common.vad_kwargs(args)
        common.check_model_free_options(args, device=args.ray is None)  # Ray: the device is on the nodes
        common.check_speaker_arguments(args)
        args.line_kwargs = common.line_kwargs(args)
    except UsageError as exc:
        return str(exc)
    return None


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    common.setup_logging(PROG, args)
    problem = _check(args)
    if problem:
        _error(problem)
        return 2
    if args.quiet:
        warnings.simplefilter("ignore")
    stop = threading.Event()
    received: list[int] = []
    with _stop_on_signals(stop, received):
        summary = _run(args, stop, received)
    if isinstance(summary, int):  # an exit code: the job failed or was interrupted
        return summary
    if not args.quiet:
        print(_describe(summary, args.output_dir), file=sys.stderr)
    if received:
        print(f"{PROG}: stopped by {signal.Signals(received[0]).name} after writing the batch in flight; rerun the "
              "same command to resume", file=sys.stderr)
        return 128 + received[0]
    if summary["failed"]:  # exit code 1: some inputs failed (README: Exit codes)
        if not args.quiet:
            print(f"{PROG}: {summary['failed']} recording(s) failed (their errors are in the records and "
                  "summary.json); --retry-failed transcribes them again", file=sys.stderr)
        return 1
    return 0


@contextlib.contextmanager
def _stop_on_signals(stop: threading.Event, received: list[int]) -> Iterator[None]:
    """SIGINT/SIGTERM set ``stop`` (the job ends after the batch in flight; the signal goes into ``received``);
    a second one stops at once (KeyboardInterrupt)."""

    def on_signal(signum: int, frame: object) -> None:
        if received:  # the second one: stop now (the batch in flight is redone on resume)
            raise KeyboardInterrupt
        received.append(signum)
        stop.set()
        with contextlib.suppress(OSError):
            os.write(2, f"\n{PROG}: {signal.Signals(signum).name}: stopping after the batch in flight (send it "
                        "again to stop at once)\n".encode())

    handlers = {}
    if threading.current_thread() is threading.main_thread():  # (signals reach the main thread only)
        handlers = {sig: signal.signal(sig, on_signal) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield
    finally:
        for sig, old in handlers.items():
            signal.signal(sig, old)


def _job_config(args: argparse.Namespace) -> dict[str, Any]:
    """The flags as :func:`fun_asr.jobs.batch.run`'s settings and transcription options."""
    progress: bool | str = False if args.quiet else True if sys.stderr.isatty() else "lines"
    try:
        interval = float(os.environ.get(PROGRESS_INTERVAL_ENV) or 10.0)
    except ValueError:
        interval = 10.0
    settings = {k: getattr(args, k) for k in ("model", "device", "threads", "vad_model", "batch_size", "reference",
                                              "input_format", "workers", "shard_size", "retry_failed", "actors",
                                              "threads_per_actor", "speaker_model", "overwrite")}
    options = {**common.decode_kwargs(args), "language": args.language, **args.vad_kwargs,
               **common.speaker_kwargs(args), **args.line_kwargs}
    return {**settings, **options, "vad": None if args.vad == "none" else args.vad, "progress": progress,
            "progress_interval": interval, "ray": None if args.ray is None else (args.ray or True)}


def _run(args: argparse.Namespace, stop: threading.Event, received: list[int]) -> dict | int:
    """The job's summary, or the exit code of a job that failed or was interrupted (its message printed)."""
    from fun_asr.jobs.batch import BatchError, OutputWriteError, run

    try:
        return run(args.inputs, args.output_dir, stop=stop, **_job_config(args))
    except KeyboardInterrupt:
        print(f"\n{PROG}: interrupted; rerun the same command to resume", file=sys.stderr)
        return 128 + (received[0] if received else signal.SIGINT)
    except BatchError as exc:
        _error(render(exc, "cli"))
        return 2
    except OutputWriteError as exc:
        _error(str(exc))
        return 1
    except Exception as exc:  # noqa: BLE001 - one clear line unless --verbose
        if args.verbose:
            raise
        msg = render(exc, "cli")
        if isinstance(exc, OSError) and exc.filename:  # not "[Errno 30] Read-only file system: 'x'"
            msg = (f"{exc.filename}: {exc.strerror or exc}; fix that (permissions, free space) and rerun the same "
                   "command to resume")
        _error(f"{type(exc).__name__}: {msg}" if not isinstance(exc, ValueError | OSError) else msg)
        return 1


def _describe(summary: dict, out: str) -> str:
    run = summary["last_run"]
    lines = [f"{PROG}: {run['processed']} transcribed ({run['failed']} failed), {run['skipped']} already done; "
             f"{run['audio_seconds'] / 3600:.3f} h of audio in {run['wall_seconds']:.1f} s (RTFx {run['rtfx']:.1f})",
             f"{PROG}: {summary['results']} results ({summary['failed']} failed, {summary['pending']} pending) in "
             f"{os.path.join(out, 'summary.json')}"]
    ev = summary.get("evaluation")
    if ev:
        wer = "n/a" if ev["wer"] is None else f"{100 * ev['wer']:.2f}%"
        cer = "n/a" if ev["cer"] is None else f"{100 * ev['cer']:.2f}%"
        lines.append(f"{PROG}: WER {wer}, CER {cer} on {ev['items']} items (per item: "
                     f"{os.path.join(out, ev['table'])})")
    return "\n".join(lines)


__all__ = ["build_parser", "main"]

if __name__ == "__main__":
    sys.exit(main())
