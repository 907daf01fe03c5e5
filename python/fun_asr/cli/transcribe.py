"""fun-asr-transcribe: audio files -> text / json / srt / vtt."""

from __future__ import annotations

import argparse
import io
import json
import logging
import os
import sys
import tempfile
import warnings
from pathlib import Path
from typing import Any

from fun_asr.asr.formats import FORMATS, render
from fun_asr.asr.messages import CliWordsFilter, cli_words
from fun_asr.cli import exits
from fun_asr.cli.exits import terminate_on_sigterm
from fun_asr.converter.hub import DEFAULT_REPO
from fun_asr.outputs import ExistingOutputError, check_new_outputs, write_atomic

PROG = "fun-asr-transcribe"
STDIN = "-"


class UsageError(Exception):
    """A bad option or output path: reported on one line before any work, exit code 2."""


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog=PROG, description="Transcribe audio files with Fun-ASR-Nano (no PyTorch).")
    ap.add_argument("files", nargs="+", metavar="FILE",
                    help="audio files (wav, flac, ogg, mp3, ...); '-' reads one file from standard input")
    ap.add_argument("-m", "--model", default=DEFAULT_REPO,
                    help=f"GGUF file, checkpoint folder or hub repo id (default {DEFAULT_REPO}, fetched and "
                         "converted once)")
    ap.add_argument("--language", help="zh, en, ja (or chinese/english/japanese, 中文/英文/日文, FunASR's aliases); "
                                       "any other name reaches the prompt as written, with a warning; leave it "
                                       "out for automatic")
    ap.add_argument("--no-itn", action="store_true", help="no inverse text normalization")
    ap.add_argument("--hotwords", help="comma-separated words to favour, e.g. 'FunASR,ggml'")
    ap.add_argument("-f", "--format", default="txt", choices=[*FORMATS, "all"], help="output format (default txt)")
    ap.add_argument("-o", "--output-dir", help="write one file per input and format into this directory instead of "
                                               "printing to stdout (created if missing)")
    ap.add_argument("--overwrite", action="store_true",
                    help="with -o: replace output files that already exist (each replaced whole, never half-written); "
                         "without it a run whose outputs exist is refused before anything is transcribed")
    ap.add_argument("--device", default="auto", help="auto, cpu, cuda, cuda:N (default auto)")
    ap.add_argument("--threads", type=int, default=0,
                    help="CPU threads (default 0: auto, up to all cores, fewer on a busy machine when that is faster)")
    ap.add_argument("--max-new-tokens", type=int, default=None,
                    help="decoding limit per segment (default 512; --stream-mode chunked: per chunk, default 200)")
    ap.add_argument("--segment-seconds", "--max-segment-seconds", dest="segment_seconds", type=float, default=30.0,
                    help="longest segment in seconds: the VAD's forced cut, or the pause splitter's limit (default 30)")
    ap.add_argument("--vad", default="auto", choices=["auto", "fsmn", "none"],
                    help="FunASR's FSMN-VAD in front of the recognizer: auto = when available (fetched with the "
                         "default hub model; a local model uses it when already cached), fsmn = required, none = "
                         "cut long audio at pauses (default auto)")
    ap.add_argument("--vad-model", help="FSMN-VAD model: a .gguf, a FunASR fsmn-vad folder, or a hub repo id "
                                        "(default funasr/fsmn-vad)")
    add_vad_arguments(ap)
    add_speaker_arguments(ap)
    ap.add_argument("--no-repetition-guard", action="store_true", help="do not stop n-gram loops early")
    ap.add_argument("--word-timestamps", action="store_true",
                    help="per-word (CTC token) times from the checkpoint's CTC head, as FunASR: in json, and srt/vtt "
                         "get one cue per word (the ModelScope checkpoint has the head; the Hugging Face one does not)")
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


def add_vad_arguments(ap: argparse.ArgumentParser) -> None:
    """FunASR 1.4.16's per-call FSMN-VAD kwargs as flags (shared with fun-asr-batch)."""
    ap.add_argument("--silence-schedule", metavar="MS:SILENCE,...",
                    help="FunASR's dynamic end-silence schedule (generate(silence_schedule=...)): pairs of "
                         "accumulated speech ms : end silence ms, the first row whose limit is reached applies, e.g. "
                         "'10000:2000,20000:1000,30000:800,40000:600,50000:400,60000:200,inf:100' (the default)")
    ap.add_argument("--dynamic-silence", action=argparse.BooleanOptionalAction, default=None,
                    help="FunASR's dynamic_silence: the schedule on or off (default on unless --max-end-silence-time "
                         "is given; off = a fixed end silence, the VAD config's 800 ms)")
    ap.add_argument("--max-end-silence-time", type=int, metavar="MS",
                    help="FunASR's max_end_silence_time: a fixed end silence in ms (turns the schedule off unless "
                         "--dynamic-silence)")


def vad_kwargs(args: argparse.Namespace) -> dict:
    """The VAD flags checked (UsageError naming the flag) -> Session.transcribe kwargs (only those given)."""
    from fun_asr.asr.options import check_vad_options

    try:
        opts = check_vad_options(args.silence_schedule, args.dynamic_silence, args.max_end_silence_time)
    except (TypeError, ValueError) as exc:
        msg = str(exc)
        for name in ("silence_schedule", "dynamic_silence", "max_end_silence_time"):
            msg = msg.replace(name, "--" + name.replace("_", "-"))
        msg = msg.replace("--dynamic-silence=True", "--dynamic-silence").replace("--dynamic-silence=False",
                                                                                 "--no-dynamic-silence")
        raise UsageError(msg.replace("silence --silence-schedule", "silence schedule")) from None
    if opts.given and args.vad == "none":
        raise UsageError("--silence-schedule, --dynamic-silence and --max-end-silence-time set the FSMN-VAD; "
                         "drop --vad none")
    return opts.kwargs()


def main(argv: list[str] | None = None) -> int:
    terminate_on_sigterm()
    try:
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


def _error(msg: str) -> None:
    print(f"{PROG}: error: {msg}", file=sys.stderr)


def check_options(args: argparse.Namespace) -> None:
    """Everything that can be checked without the model, once, before it loads."""
    if args.batch_size < 1:
        raise UsageError(f"--batch-size must be 1 or more, got {args.batch_size}")
    if args.max_new_tokens is not None and args.max_new_tokens < 1:
        raise UsageError(f"--max-new-tokens must be 1 or more, got {args.max_new_tokens}")
    chunked_stream = args.stream and args.stream_mode == "chunked"
    if args.max_new_tokens is None and not chunked_stream:
        args.max_new_tokens = 512
    if not args.segment_seconds >= 1.0:
        raise UsageError(f"--segment-seconds must be at least 1, got {args.segment_seconds:g}")
    if args.threads < 0:
        raise UsageError(f"--threads must be 0 (auto) or more, got {args.threads}")
    if args.language is not None:  # any name reaches the prompt (as FunASR); a control character, too long: no
        from fun_asr.asr.language import normalize_language
        from fun_asr.model.spec import load_spec

        try:
            normalize_language(load_spec(), args.language)
        except ValueError as exc:
            raise UsageError(f"--language {args.language!r}: {exc}") from None
    if args.vad_model and args.vad == "none":
        raise UsageError("--vad-model with --vad none: choose one")
    check_model_free_options(args)
    check_speaker_arguments(args)
    if args.diarize and args.stream:
        raise UsageError("--diarize is for file transcription; for live speakers use fun-asr-serve --enable-spk")
    if args.files.count(STDIN) > 1:
        raise UsageError("'-' (standard input) can be given once")
    if args.realtime and not args.stream:
        raise UsageError("--realtime paces --stream FILE; add --stream")
    args.vad_kwargs = vad_kwargs(args)
    chunked = args.stream_mode == "chunked"
    if not (args.stream and chunked) and (args.chunk_ms is not None or args.rollback_chars is not None):
        raise UsageError("--chunk-ms and --rollback-chars are for --stream --stream-mode chunked")
    if args.stream_mode != "vad" and not args.stream:
        raise UsageError("--stream-mode is for --stream; add --stream")
    if args.chunk_ms is not None and not 1 <= args.chunk_ms <= 60000:
        raise UsageError(f"--chunk-ms must be between 1 and 60000, got {args.chunk_ms}")
    if args.rollback_chars is not None and args.rollback_chars < 0:
        raise UsageError(f"--rollback-chars must be 0 or more, got {args.rollback_chars}")
    if args.stream:
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
    formats = list(FORMATS) if args.format == "all" else [args.format]
    if not args.output_dir:
        if args.format == "all":
            raise UsageError("-f all needs -o DIR (one file per input and format)")
        if len(args.files) > 1 and args.format in ("srt", "vtt"):
            raise UsageError(f"-f {args.format} with {len(args.files)} inputs needs -o DIR: subtitles of several "
                             "files in one stream cannot be told apart")
    _check_inputs(args.files)
    check_stream_input(args)
    args.names = output_names(args.files)
    if args.output_dir:
        out = Path(args.output_dir)
        _check_outputs_are_not_inputs(out, args.files, args.names, formats)
        _check_output_dir(out)
        try:
            check_new_outputs([out / f"{base}.{fmt}" for base in args.names for fmt in formats], args.overwrite)
        except ExistingOutputError as exc:
            raise UsageError(f"-o {out}: {exc}") from None
    elif args.overwrite:
        raise UsageError("--overwrite is for -o DIR (without -o nothing is written to files)")
    args.formats = formats


def check_model_free_options(args: argparse.Namespace, device: bool = True) -> None:
    """The device (unless ``device`` is False: the model runs elsewhere), the hotwords and the decoding limit:
    what can be judged without the model (UsageError naming the flag), so that a wrong one fails at once instead
    of after the model is fetched, converted and loaded."""
    from fun_asr import _core
    from fun_asr.asr.options import check_hotwords
    from fun_asr.audio.decode import Limits

    try:
        if device:
            _core.check_device(args.device)
    except ValueError as exc:
        raise UsageError(f"--device {args.device}: {cli_words(str(exc))}") from None
    limits = Limits()
    try:
        check_hotwords(args.hotwords, limits)
    except (TypeError, ValueError) as exc:
        msg = cli_words(str(exc))
        raise UsageError(msg if msg.startswith("--hotwords") else f"--hotwords: {msg}") from None
    if args.max_new_tokens is not None and args.max_new_tokens > limits.max_new_tokens:
        raise UsageError(f"--max-new-tokens must be at most {limits.max_new_tokens}, got {args.max_new_tokens}")


def add_speaker_arguments(ap: argparse.ArgumentParser) -> None:
    """--diarize, --num-speakers, --min-speakers, --max-speakers, --speaker-model (fun-asr-transcribe/-batch)."""
    ap.add_argument("--diarize", action="store_true",
                    help="who spoke when: each segment gets a speaker (SPK0, SPK1, ...; FunASR's CAM++ + clustering): "
                         "[SPK0] in txt/srt, <v SPK0> in vtt, speaker in json")
    ap.add_argument("--num-speakers", type=int, default=None, help="with --diarize: exactly this many speakers")
    ap.add_argument("--min-speakers", type=int, default=None, help="with --diarize: at least this many (default 1)")
    ap.add_argument("--max-speakers", type=int, default=None, help="with --diarize: at most this many (default 15)")
    ap.add_argument("--speaker-model", help="CAM++ speaker model for --diarize: a .gguf, a FunASR CAM++ folder or a "
                                            "hub repo id (default: the one embedded in the model package, "
                                            "$FUN_ASR_SPEAKER_MODEL, or the hub model's)")


def check_speaker_arguments(args: argparse.Namespace) -> None:
    """The speaker flags need --diarize; the counts must make sense (UsageError before the model loads)."""
    for flag in ("num_speakers", "min_speakers", "max_speakers", "speaker_model"):
        if getattr(args, flag) is not None and not args.diarize:
            raise UsageError(f"--{flag.replace('_', '-')} is for --diarize; add --diarize")
    if args.diarize:
        from fun_asr.speakers.diarize import SpeakerOptions

        try:
            SpeakerOptions.check(args.num_speakers, args.min_speakers, args.max_speakers)
        except ValueError as exc:
            raise UsageError(cli_words(str(exc))) from None


def speaker_kwargs(args: argparse.Namespace) -> dict[str, Any]:
    """--diarize and its counts as transcribe() kwargs (none without --diarize)."""
    if not getattr(args, "diarize", False):
        return {}
    return {"diarize": True, "num_speakers": args.num_speakers, "min_speakers": args.min_speakers,
            "max_speakers": args.max_speakers}


def _check_inputs(files: list[str]) -> None:
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


def _check_outputs_are_not_inputs(out: Path, files: list[str], names: list[str], formats: list[str]) -> None:
    """No file this run writes is one of its inputs: the same path once links are resolved, or the same
    file (inode) under another name (a hard link, a case-insensitive disk)."""
    real: dict[str, str] = {}
    inodes: dict[tuple[int, int], str] = {}
    for name in files:
        if name == STDIN:
            continue
        real.setdefault(os.path.realpath(name), name)
        try:
            st = os.stat(name)
        except OSError:
            continue
        inodes.setdefault((st.st_dev, st.st_ino), name)
    if not real:
        return
    for base in names:
        for fmt in formats:
            path = out / f"{base}.{fmt}"
            same = real.get(os.path.realpath(path))
            how = ""
            if same is None:
                try:
                    st = os.stat(path)
                except OSError:
                    continue
                same = inodes.get((st.st_dev, st.st_ino))
                how = " (the same file under another name: a link)"
            if same is not None:
                raise UsageError(f"-o {out}: writing {path} would overwrite the input {same}{how}; nothing was "
                                 "written: choose another -o folder")


def _check_output_dir(out: Path) -> None:
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


def _read_stdin() -> io.BytesIO:
    data = sys.stdin.buffer.read()
    buf = io.BytesIO(data)
    buf.name = "<stdin>"
    return buf


def _main(argv: list[str] | None) -> int:
    args = build_parser().parse_args(argv)
    level = logging.INFO if args.verbose else logging.ERROR if args.quiet else logging.WARNING
    logging.basicConfig(level=level, format=f"{PROG}: %(message)s")  # --quiet: the JSON still has warning_codes
    for handler in logging.getLogger().handlers:  # the Session's notices in this command's flags
        handler.addFilter(CliWordsFilter())
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
        warnings.formatwarning = lambda msg, *a, **k: f"{PROG}: warning: {cli_words(str(msg))}\n"
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
        _error(f"cannot load model {args.model}: {cli_words(str(exc))}")
        return exits.NOTHING_DONE
    try:
        if not (args.stream and args.stream_mode == "chunked"):
            session.options(None, not args.no_itn, args.hotwords, args.max_new_tokens, args.segment_seconds,
                            not args.no_repetition_guard, **args.vad_kwargs, **speaker_kwargs(args))
        language = session.normalize_language(args.language)
    except (ValueError, TypeError) as exc:
        _error(cli_words(str(exc)))
        return 2

    if args.stream:
        return _stream(session, args, language)
    out_dir = Path(args.output_dir) if args.output_dir else None
    names = args.names
    failed = 0
    step = args.batch_size
    for k in range(0, len(args.files), step):
        group = args.files[k : k + step]
        inputs = [_read_stdin() if name == STDIN else name for name in group]
        results = session.transcribe_batch(
            inputs, language=language, itn=not args.no_itn, hotwords=args.hotwords,
            max_new_tokens=args.max_new_tokens, segment_seconds=args.segment_seconds,
            repetition_guard=not args.no_repetition_guard, batch_size=step, progress=interactive,
            word_timestamps=args.word_timestamps, **args.vad_kwargs, **speaker_kwargs(args),
        )
        for i, (name, result) in enumerate(zip(group, results, strict=True)):
            shown = "<stdin>" if name == STDIN else name
            if not result.ok:
                failed += 1
                error = cli_words(result.error or "")
                _error(error if error.startswith(shown) else f"{shown}: {error}")
                if out_dir is None and args.format == "json":  # one line per input, failed ones too
                    print(json.dumps({"input": shown, "error": cli_words(result.error or "")}, ensure_ascii=False),
                          flush=True)
                continue
            try:
                _emit(result, shown, names[k + i], args, out_dir, len(args.files) > 1)
            except ExistingOutputError as exc:  # appeared after the checks: still never replaced
                failed += 1
                _error(f"{shown}: {exc}")
            except OSError as exc:
                failed += 1
                _error(f"{shown}: cannot write {exc.filename or 'its output'} ({exc.strerror or exc})")
    if failed:
        print(f"{PROG}: {failed} of {len(args.files)} file(s) failed", file=sys.stderr)
    return exits.SOME_FAILED if failed else exits.OK


def _clock(ms: int) -> str:
    m, rest = divmod(int(ms), 60_000)
    return f"{m:02d}:{rest / 1000:06.3f}"


def _stream(session, args: argparse.Namespace, language: str | None) -> int:  # noqa: ANN001
    """--stream: feed standard input or a file to Session.stream(), print events as they come."""
    import time

    import numpy as np

    from fun_asr.audio.decode import AudioError
    from fun_asr.audio.piped import RawPcmConflict

    chunked = args.stream_mode == "chunked"
    try:
        if chunked:
            stream = session.stream(language, not args.no_itn, args.hotwords, mode="chunked",
                                    max_new_tokens=args.max_new_tokens,
                                    repetition_guard=not args.no_repetition_guard, chunk_ms=args.chunk_ms,
                                    rollback_chars=args.rollback_chars)
        else:
            stream = session.stream(language, not args.no_itn, args.hotwords, max_new_tokens=args.max_new_tokens,
                                    repetition_guard=not args.no_repetition_guard)
    except (ValueError, TypeError) as exc:
        _error(cli_words(str(exc)))
        return 2
    as_json = args.format == "json"
    tty = sys.stdout.isatty()
    shown_partial = [False]
    shown_fixed = [0]

    def show_chunks(events: list, final: bool = False) -> None:
        """Chunked mode: -f json one SDK result per line; a terminal shows the fixed text and, dimmed, the
        unfixed end on one refreshed line; otherwise the text is written as it becomes fixed."""
        for ev in events:
            if as_json:
                print(json.dumps(ev.to_dict(), ensure_ascii=False), flush=True)
            elif tty:
                width = os.get_terminal_size().columns - 1
                line = ev.fixed_text + "\033[2m" + ev.unfixed_text + "\033[0m"
                tail = ev.text[-width:] if len(ev.text) > width else None
                sys.stdout.write("\r\033[K" + (tail if tail is not None else line) + ("\n" if ev.is_final else ""))
                sys.stdout.flush()
            else:
                sys.stdout.write(ev.fixed_text[shown_fixed[0]:] + ("\n" if ev.is_final else ""))
                sys.stdout.flush()
                shown_fixed[0] = len(ev.fixed_text)

    def show(events: list, final: bool = False) -> None:
        if chunked:
            show_chunks(events, final)
            return
        for ev in events:
            if as_json:
                print(json.dumps(ev.to_dict(), ensure_ascii=False), flush=True)
            elif ev.type == "sentence":
                if shown_partial[0]:
                    sys.stdout.write("\r\033[K")
                    shown_partial[0] = False
                print(f"[{_clock(ev.start)} --> {_clock(ev.end)}] {ev.text}", flush=True)
            elif tty:
                sys.stdout.write(f"\r\033[K… {ev.text[-(os.get_terminal_size().columns - 3):]}")
                sys.stdout.flush()
                shown_partial[0] = True
        if final:
            if shown_partial[0]:
                sys.stdout.write("\r\033[K")
            if as_json:
                print(json.dumps({"type": "final", **stream.response(is_final=True), "latency_ms": stream.latency()},
                                 ensure_ascii=False), flush=True)

    try:
        blocks, rate, notes = _stream_input(args)
    except RawPcmConflict as exc:  # a header on standard input given --raw-pcm
        _error(str(exc))
        return 2
    except (OSError, ValueError) as exc:  # no audio in a form we read: nothing was shown
        name = args.files[0]
        _error(str(exc) if name == STDIN or str(exc).startswith(name) else f"{name}: {exc}")
        return 1
    t0 = time.perf_counter()
    fed = 0
    failed = None
    try:
        for block in blocks:
            if args.realtime:
                wait = t0 + fed / rate - time.perf_counter()
                if wait > 0:
                    time.sleep(wait)
            show(stream.feed(np.ascontiguousarray(block), sample_rate=rate))
            fed += block.size
    except AudioError as exc:  # samples that are not audio, or a decoder that gave none
        failed = str(exc)
        if fed == 0:
            _error(failed)
            return 1
    show(stream.close(), final=True)
    from fun_asr.notices import InputWarning

    for note in notes:
        warnings.warn(note, InputWarning, stacklevel=1)
    if failed:
        _error(failed)
        return 1
    return 0


def check_stream_input(args: argparse.Namespace) -> None:
    """--raw-pcm RATE: with --stream, a rate in range, and not for a FILE that starts with a header (UsageError)."""
    rate = args.raw_pcm
    if rate is None:
        return
    if not args.stream:
        raise UsageError("--raw-pcm RATE is for --stream (e.g. --stream --raw-pcm 16000 -); without --stream, "
                         "'-' and files are decoded from their headers (wav, flac, ogg, mp3, ...)")
    if not 1000 <= rate <= 384_000:
        raise UsageError(f"--raw-pcm RATE must be a sample rate from 1000 to 384000 Hz, got {rate}")
    name = args.files[0]
    if name != STDIN and os.path.isfile(name):
        from fun_asr.audio.piped import ACCEPTED, KIND_NAMES, header_kind

        with open(name, "rb") as f:
            kind = header_kind(f.read(12))
        if kind is not None:
            raise UsageError(f"--raw-pcm with {name}: the file starts with a {KIND_NAMES[kind]} header, not raw PCM; "
                             f"drop --raw-pcm ({ACCEPTED} are recognized by their headers)")


def _stream_input(args: argparse.Namespace) -> tuple[Any, int, list[str]]:
    """--stream's input: (mono float32 blocks, their sample rate, warnings to show at the end (the list fills as the
    blocks are read)). Standard input, --raw-pcm and anything that is not a regular file (a named pipe, /dev/stdin)
    are read as they arrive, their header checked now (:class:`~fun_asr.audio.piped.PipedAudio`); a regular file
    is decoded whole now and given in 100 ms pieces at 16 kHz. OSError / ValueError (AudioError) name what is
    wrong; RawPcmConflict when --raw-pcm meets a header."""
    from fun_asr.audio.decode import SAMPLE_RATE, decode_audio
    from fun_asr.audio.piped import PipedAudio

    name = args.files[0]
    if name == STDIN or args.raw_pcm is not None or not os.path.isfile(name):
        fd = sys.stdin.buffer.fileno() if name == STDIN else os.open(name, os.O_RDONLY)
        piped = PipedAudio(fd, "standard input" if name == STDIN else name, args.raw_pcm)
        return piped.blocks(), piped.rate, piped.warnings
    samples, info = decode_audio(name)
    step = SAMPLE_RATE // 10  # 100 ms
    return (samples[i : i + step] for i in range(0, samples.size, step)), SAMPLE_RATE, list(info.warnings)


def _emit(result, shown: str, base: str, args: argparse.Namespace, out_dir: Path | None,  # noqa: ANN001
          several: bool) -> None:
    if out_dir is None:
        fmt = args.formats[0]
        if fmt == "json":  # always one compact object per line: `*.wav -f json > all.jsonl` is JSONL for any count
            text = json.dumps({"input": shown, **result.to_dict()}, ensure_ascii=False) + "\n"
        else:
            text = render(result, fmt, words=args.word_timestamps)
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
            text = render(result, fmt, words=args.word_timestamps)
        write_atomic(path, text, overwrite=args.overwrite)
        written.append(str(path))
    if not args.quiet:
        print(f"{PROG}: {shown} -> {', '.join(written)}", file=sys.stderr)


if __name__ == "__main__":
    sys.exit(main())
