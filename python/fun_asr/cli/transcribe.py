"""fun-asr-transcribe: audio files -> text / json / srt / vtt.

This module parses and checks the flags and runs the files through the Session in batches; the inputs, output
names and formats are :mod:`fun_asr.cli.transcribe_files`', --stream is :mod:`fun_asr.cli.transcribe_stream`, the
flags fun-asr-batch shares are :mod:`fun_asr.cli.common`'s."""

from __future__ import annotations

import argparse
import io
import json
import os
import sys
import warnings
from pathlib import Path

from fun_asr.asr.formats import FORMATS
from fun_asr.asr.option_table import default
from fun_asr.cli import common, exits
from fun_asr.cli.common import UsageError
from fun_asr.cli.exits import terminate_on_sigterm
from fun_asr.cli.transcribe_files import PROG, STDIN, check_inputs, check_outputs, emit, output_names
from fun_asr.cli.transcribe_files import error as _error
from fun_asr.cli.transcribe_stream import check_stream_input, run_stream
from fun_asr.errors import render
from fun_asr.outputs import ExistingOutputError

__all__ = ["PROG", "STDIN", "UsageError", "build_parser", "check_options", "check_stream_input", "main",
           "output_names"]


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog=PROG, description="Transcribe audio files with Fun-ASR-Nano (no PyTorch).")
    ap.add_argument("files", nargs="+", metavar="FILE",
                    help="audio files (wav, flac, ogg, mp3, ...); '-' reads one file from standard input")
    common.add_recognizer_arguments(
        ap, model_help="",
        language_help="zh, en, ja (or chinese/english/japanese, 中文/英文/日文, FunASR's aliases); any other name "
                      "reaches the prompt as written, with a warning; leave it out for automatic",
        hotwords_help="comma-separated words to favour, e.g. 'FunASR,ggml'")
    ap.add_argument("-f", "--format", default="txt", choices=[*FORMATS, "all"], help="output format (default txt)")
    ap.add_argument("-o", "--output-dir", help="write one file per input and format into this directory instead of "
                                               "printing to stdout (created if missing)")
    ap.add_argument("--overwrite", action="store_true",
                    help="with -o: replace output files that already exist (each replaced whole, never half-written); "
                         "without it a run whose outputs exist is refused before anything is transcribed")
    ap.add_argument("--device", default="auto", help="auto, cpu, gpu[:N], cuda[:N], vulkan[:N], metal (default auto)")
    ap.add_argument("--threads", type=int, default=0,
                    help="CPU threads (default 0: auto, up to all cores, fewer on a busy machine when that is faster)")
    ap.add_argument("--max-new-tokens", type=int, default=None,
                    help=f"decoding limit per segment (default {default('max_new_tokens')}; --stream-mode chunked: "
                         "per chunk, default 200)")
    common.add_segment_seconds_argument(ap)
    ap.add_argument("--vad", default="auto", choices=["auto", "fsmn", "none"],
                    help="FunASR's FSMN-VAD in front of the recognizer: auto = when available (fetched with the "
                         "default hub model; a local model uses it when already cached), fsmn = required, none = "
                         "cut long audio at pauses (default auto)")
    ap.add_argument("--vad-model", help="FSMN-VAD model: a .gguf, a FunASR fsmn-vad folder, or a hub repo id "
                                        "(default funasr/fsmn-vad)")
    common.add_vad_arguments(ap)
    common.add_speaker_arguments(ap)
    ap.add_argument("--no-repetition-guard", action="store_true", help="do not stop n-gram loops early")
    ap.add_argument("--word-timestamps", action="store_true",
                    help="per-word (CTC token) times from the checkpoint's CTC head, as FunASR: in json, and srt/vtt "
                         "get one cue per word (the ModelScope checkpoint has the head; the Hugging Face one does not)")
    ap.add_argument("--mark-below", type=float, default=None, metavar="P",
                    help="in txt/srt/vtt, write each word whose probability (the recognizer's own, 0-1) is below P "
                         "as (word?), for review; json always has each word's probability")
    common.add_line_arguments(ap)
    ap.add_argument("--batch-size", type=int, default=8,
                    help="segments decoded together across files (default 8; 1 = one by one)")
    ap.add_argument("--stream", action="store_true",
                    help="real-time streaming: FILE is '-' (standard input: WAV, FLAC, OGG or MP3, recognized by "
                         "their headers and decoded as they arrive, e.g. from arecord -t wav or sox -d -t flac -; "
                         "headerless PCM needs --raw-pcm) or an audio file; prints partial results and timed sentences "
                         "(-f json: one event per line)")
    ap.add_argument("--realtime", action="store_true", help="with --stream FILE: feed the file at real-time pace")
    ap.add_argument("--raw-pcm", type=int, metavar="RATE",
                    help="with --stream: the input is raw PCM without a header, 16-bit little-endian mono samples at "
                         "RATE Hz (e.g. 16000: what arecord -t raw -f S16_LE -c 1 or ffmpeg -f s16le -ac 1 write)")
    ap.add_argument("--stream-mode", default="vad", choices=["vad", "chunked"],
                    help="with --stream: vad = FunASR's realtime server (VAD sentences + partials, default); "
                         "chunked = Fun-ASR-Nano's streaming SDK (the whole audio re-decoded every --chunk-ms, "
                         "text that never changes once fixed; no VAD needed)")
    ap.add_argument("--chunk-ms", type=int, default=None,
                    help="--stream-mode chunked: a decode every this many ms of audio (default 720)")
    ap.add_argument("--rollback-chars", type=int, default=None,
                    help="--stream-mode chunked: characters at the end that stay unfixed (default 8)")
    ap.add_argument("--quiet", action="store_true", help="no progress, warnings or 'wrote' lines on stderr")
    ap.add_argument("--verbose", action="store_true", help="full tracebacks and logging")
    return ap


def main(argv: list[str] | None = None) -> int:
    try:
        with terminate_on_sigterm():
            return _main(argv)
    except BrokenPipeError:  # e.g. `fun-asr-transcribe a.wav | head`
        try:
            sys.stdout = open(os.devnull, "w")  # noqa: SIM115 - no flush error at exit
        except OSError:
            pass
        return exits.OK
    except KeyboardInterrupt:
        print(f"\n{PROG}: interrupted", file=sys.stderr)
        return exits.INTERRUPTED
    except exits.Terminated:
        print(f"\n{PROG}: terminated", file=sys.stderr)
        return exits.TERMINATED


def check_options(args: argparse.Namespace) -> None:
    """Everything that can be checked without the model, once, before it loads."""
    _check_numbers(args)
    if args.language is not None:  # any name reaches the prompt (as FunASR); a control character, too long: no
        from fun_asr.asr.language import normalize_language
        from fun_asr.model.spec import load_spec

        try:
            normalize_language(load_spec(), args.language)
        except ValueError as exc:
            raise UsageError(f"--language {args.language!r}: {exc}") from None
    if args.vad_model and args.vad == "none":
        raise UsageError("--vad-model with --vad none: choose one")
    common.check_model_free_options(args)
    common.check_speaker_arguments(args)
    if args.files.count(STDIN) > 1:
        raise UsageError("'-' (standard input) can be given once")
    args.vad_kwargs = common.vad_kwargs(args)
    args.line_kwargs = common.line_kwargs(args)
    _check_stream_flags(args)
    _check_output_flags(args)


def _check_numbers(args: argparse.Namespace) -> None:
    if args.batch_size < 1:
        raise UsageError(f"--batch-size must be 1 or more, got {args.batch_size}")
    if args.mark_below is not None and not 0.0 <= args.mark_below <= 1.0:
        raise UsageError(f"--mark-below must be a probability from 0 to 1, got {args.mark_below}")
    if args.mark_below is not None and args.stream:
        raise UsageError("--mark-below marks the words of file transcripts; --stream prints sentences as they close "
                         "(-f json: each sentence's avg_logprob)")
    if args.max_new_tokens is not None and args.max_new_tokens < 1:
        raise UsageError(f"--max-new-tokens must be 1 or more, got {args.max_new_tokens}")
    chunked_stream = args.stream and args.stream_mode == "chunked"
    if args.max_new_tokens is None and not chunked_stream:
        args.max_new_tokens = default("max_new_tokens")
    if not args.segment_seconds >= 1.0:
        raise UsageError(f"--segment-seconds must be at least 1, got {args.segment_seconds:g}")
    if args.threads < 0:
        raise UsageError(f"--threads must be 0 (auto) or more, got {args.threads}")


def _check_stream_flags(args: argparse.Namespace) -> None:
    """--stream and the flags that belong to it (or not)."""
    if args.diarize and args.stream:
        raise UsageError("--diarize is for file transcription; for live speakers use fun-asr-serve --enable-spk")
    if args.realtime and not args.stream:
        raise UsageError("--realtime paces --stream FILE; add --stream")
    chunked = args.stream_mode == "chunked"
    if not (args.stream and chunked) and (args.chunk_ms is not None or args.rollback_chars is not None):
        raise UsageError("--chunk-ms and --rollback-chars are for --stream --stream-mode chunked")
    if args.stream_mode != "vad" and not args.stream:
        raise UsageError("--stream-mode is for --stream; add --stream")
    if args.chunk_ms is not None and not 1 <= args.chunk_ms <= 60000:
        raise UsageError(f"--chunk-ms must be between 1 and 60000, got {args.chunk_ms}")
    if args.rollback_chars is not None and args.rollback_chars < 0:
        raise UsageError(f"--rollback-chars must be 0 or more, got {args.rollback_chars}")
    if not args.stream:
        return
    if len(args.files) != 1:
        raise UsageError("--stream takes one input: '-' (standard input) or one audio file")
    if args.vad == "none" and not chunked:
        raise UsageError("--stream needs the VAD (it closes the sentences); drop --vad none, or use "
                         "--stream-mode chunked")
    if args.vad_kwargs:
        raise UsageError("--silence-schedule, --dynamic-silence and --max-end-silence-time apply to file "
                         "transcription (FunASR's offline VAD); --stream uses the realtime server's schedule")
    if args.format not in ("txt", "json") or args.output_dir:
        raise UsageError("--stream prints to stdout: -f txt (lines) or -f json (one event per line), no -o")


def _check_output_flags(args: argparse.Namespace) -> None:
    """-f, -o, --overwrite and the subtitle line flags against the inputs."""
    formats = list(FORMATS) if args.format == "all" else [args.format]
    if args.line_kwargs and not {"srt", "vtt"} & set(formats):
        raise UsageError(f"{' and '.join(common.line_flags(args))} shape srt/vtt subtitles; add -f srt, -f vtt or "
                         "-f all")
    if not args.output_dir:
        if args.format == "all":
            raise UsageError("-f all needs -o DIR (one file per input and format)")
        if len(args.files) > 1 and args.format in ("srt", "vtt"):
            raise UsageError(f"-f {args.format} with {len(args.files)} inputs needs -o DIR: subtitles of several "
                             "files in one stream cannot be told apart")
    check_inputs(args.files)
    check_stream_input(args)
    args.names = output_names(args.files)
    if args.output_dir:
        check_outputs(Path(args.output_dir), args.files, args.names, formats, args.overwrite)
    elif args.overwrite:
        raise UsageError("--overwrite is for -o DIR (without -o nothing is written to files)")
    args.formats = formats


def _read_stdin() -> io.BytesIO:
    data = sys.stdin.buffer.read()
    buf = io.BytesIO(data)
    buf.name = "<stdin>"
    return buf


def _main(argv: list[str] | None) -> int:
    args = build_parser().parse_args(argv)
    common.setup_logging(PROG, args)
    try:
        check_options(args)
    except UsageError as exc:
        for line in str(exc).splitlines():
            _error(line)
        return 2
    from fun_asr.notices import RecordingFailedWarning

    if args.quiet:
        warnings.simplefilter("ignore")
    else:
        warnings.simplefilter("always")
        warnings.formatwarning = lambda msg, *a, **k: f"{PROG}: warning: {render(msg, 'cli')}\n"
    warnings.simplefilter("ignore", RecordingFailedWarning)  # failures are reported as errors below
    interactive = sys.stderr.isatty() and not args.quiet
    try:
        from fun_asr.asr.session import Session

        session = Session(args.model, device=args.device, threads=args.threads, progress=interactive,
                          vad=None if args.vad == "none" else args.vad, vad_model=args.vad_model,
                          speaker_model=args.speaker_model or "auto")
    except Exception as exc:  # noqa: BLE001 - one clear line unless --verbose
        if args.verbose:
            raise
        _error(f"cannot load model {args.model}: {render(exc, 'cli')}")
        return exits.NOTHING_DONE
    options = {**common.decode_kwargs(args), **args.vad_kwargs, **common.speaker_kwargs(args), **args.line_kwargs}
    try:
        if not (args.stream and args.stream_mode == "chunked"):
            session.options(**{k: v for k, v in options.items() if k != "word_timestamps"})
        language = session.normalize_language(args.language)
    except (ValueError, TypeError) as exc:
        _error(render(exc, "cli"))
        return 2
    if args.stream:
        return run_stream(session, args, language)
    return _transcribe_files(session, args, {**options, "language": language}, interactive)


def _transcribe_files(session, args: argparse.Namespace, options: dict, interactive: bool) -> int:  # noqa: ANN001
    """The files through ``session`` in groups of --batch-size, each result written as it is ready."""
    out_dir = Path(args.output_dir) if args.output_dir else None
    failed = 0
    step = args.batch_size
    for k in range(0, len(args.files), step):
        group = args.files[k : k + step]
        inputs = [_read_stdin() if name == STDIN else name for name in group]
        results = session.transcribe_batch(inputs, batch_size=step, progress=interactive, **options)
        for i, (name, result) in enumerate(zip(group, results, strict=True)):
            shown = "<stdin>" if name == STDIN else name
            if not result.ok:
                failed += 1
                error = render(result.error or "", "cli")
                # a failed result's error names its source (Session: "SOURCE: ..." or a message that names it)
                _error(error if result.source == shown else f"{shown}: {error}")
                if out_dir is None and args.format == "json":  # one line per input, failed ones too
                    print(json.dumps({"input": shown, "error": error}, ensure_ascii=False),
                          flush=True)
                continue
            try:
                emit(result, shown, args.names[k + i], args, out_dir, len(args.files) > 1)
            except ExistingOutputError as exc:  # appeared after the checks: still never replaced
                failed += 1
                _error(f"{shown}: {exc}")
            except OSError as exc:
                failed += 1
                _error(f"{shown}: cannot write {exc.filename or 'its output'} ({exc.strerror or exc})")
    if failed:
        print(f"{PROG}: {failed} of {len(args.files)} file(s) failed", file=sys.stderr)
    return exits.SOME_FAILED if failed else exits.OK


if __name__ == "__main__":
    sys.exit(main())
