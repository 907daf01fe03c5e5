"""Flags and checks that fun-asr-transcribe and fun-asr-batch share: the model and language, FunASR's per-call
FSMN-VAD options, the speaker flags (--diarize ...), what can be checked before the model loads, and the
logging both set up."""

from __future__ import annotations

import argparse
import logging
from typing import Any

from fun_asr.asr.option_table import (
    OPTIONS,
    OUTPUT_OPTIONS,
    VAD_OPTIONS,
    add_arguments,
    check_lines,
    cli_dest,
    cli_values,
)
from fun_asr.converter.hub import DEFAULT_REPO, DEMO
from fun_asr.errors import FrontFilter, FunAsrError, render
from fun_asr.model.demo import WORDS as DEMO_WORDS

# What -m demo is, in every command's -m/--model help.
DEMO_HELP = (f"'{DEMO}': the 20-word demo model shipped in the package, no download (a tiny model trained on "
             f"synthetic speech that knows only {' '.join(DEMO_WORDS[:10])}, {' '.join(DEMO_WORDS[10:])}: a "
             "demonstration, not for real speech)")
# The demo never saw a hotword prompt in training (tools/train_tiny.py): with one it drops words.
DEMO_HOTWORDS = ("the 20-word demo model was not trained with hotwords: with -m demo they can make it drop words, "
                 "e.g. the hotword 'seven' turns 'go left go seven' into 'go left go'")


SPEAKER_COUNTS = ("num_speakers", "min_speakers", "max_speakers")


class UsageError(Exception):
    """A bad option or output path: reported on one line before any work, exit code 2."""


def add_recognizer_arguments(ap: argparse.ArgumentParser, *, model_help: str, language_help: str,
                             hotwords_help: str) -> None:
    """-m/--model, --language, --no-itn and --hotwords, with each command's help for three of them."""
    ap.add_argument("-m", "--model", default=DEFAULT_REPO,
                    help=f"GGUF file, checkpoint folder or hub repo id (default {DEFAULT_REPO}, fetched and "
                         f"converted once), or {DEMO_HELP}{model_help}")
    ap.add_argument("--language", help=language_help)
    ap.add_argument("--no-itn", action="store_true", help="no inverse text normalization")
    ap.add_argument("--hotwords", help=f"{hotwords_help} ({DEMO_HOTWORDS})")


def setup_logging(prog: str, args: argparse.Namespace) -> None:
    """Log lines as ``prog: message`` (--verbose: info too, --quiet: errors only), the Session's notices in the
    command's flags."""
    level = logging.INFO if args.verbose else logging.ERROR if args.quiet else logging.WARNING
    logging.basicConfig(level=level, format=f"{prog}: %(message)s")  # --quiet: the JSON still has warning_codes
    for handler in logging.getLogger().handlers:  # the Session's notices in this command's flags
        handler.addFilter(FrontFilter("cli"))


def add_vad_arguments(ap: argparse.ArgumentParser) -> None:
    """FunASR 1.4.16's per-call FSMN-VAD kwargs as flags (shared with fun-asr-batch), from the options table."""
    add_arguments(ap, VAD_OPTIONS)


def add_line_arguments(ap: argparse.ArgumentParser, more: str = "") -> None:
    """--max-line-width and --max-line-count (srt/vtt subtitle lines), from the options table; ``more``: what
    the command adds to their help."""
    add_arguments(ap, OUTPUT_OPTIONS, **{k: OPTIONS[k].help_in("cli") + more for k in OUTPUT_OPTIONS})


def line_flags(args: argparse.Namespace) -> list[str]:
    """The subtitle line flags given."""
    return [OPTIONS[k].cli for k in OUTPUT_OPTIONS if getattr(args, cli_dest(k)) is not None]  # type: ignore[misc]


def add_segment_seconds_argument(ap: argparse.ArgumentParser) -> None:
    """--segment-seconds (alias --max-segment-seconds), its default the table's."""
    o = OPTIONS["segment_seconds"]
    ap.add_argument(o.cli, "--max-segment-seconds", dest="segment_seconds", type=float, default=o.default,
                    help=f"{o.help_in('cli')} (default {o.default:g})")


def line_kwargs(args: argparse.Namespace) -> dict[str, Any]:
    """--max-line-width / --max-line-count checked (UsageError naming the flag) -> transcribe() kwargs (only
    those given)."""
    try:
        return check_lines(cli_values(args, OUTPUT_OPTIONS))
    except (TypeError, ValueError) as exc:
        raise UsageError(render(exc, "cli")) from None


def decode_kwargs(args: argparse.Namespace) -> dict[str, Any]:
    """The transcription options of a command's flags (--no-itn, --hotwords, --max-new-tokens, --segment-seconds,
    --no-repetition-guard, and --word-timestamps where the command has it) as transcribe() kwargs; the VAD,
    speaker and line flags are :func:`vad_kwargs`', :func:`speaker_kwargs`' and :func:`line_kwargs`'."""
    names = ["itn", "hotwords", "max_new_tokens", "segment_seconds", "repetition_guard"]
    if hasattr(args, cli_dest("word_timestamps")):
        names.append("word_timestamps")
    out = cli_values(args, names)
    out["hotwords"] = args.hotwords  # as given: None or the comma-separated string
    return out


def vad_kwargs(args: argparse.Namespace) -> dict:
    """The VAD flags checked (UsageError naming the flag) -> Session.transcribe kwargs (only those given)."""
    from fun_asr.asr.options import check_vad_options

    try:
        opts = check_vad_options(**cli_values(args, VAD_OPTIONS))
    except (TypeError, ValueError) as exc:
        raise UsageError(render(exc, "cli")) from None
    if opts.given and args.vad == "none":
        raise UsageError(f"{', '.join(OPTIONS[k].cli for k in VAD_OPTIONS[:-1])} and {OPTIONS[VAD_OPTIONS[-1]].cli} "
                         "set the FSMN-VAD; drop --vad none")
    return opts.kwargs()


def check_model_free_options(args: argparse.Namespace, device: bool = True) -> None:
    """The device (unless ``device`` is False: the model runs elsewhere), the hotwords and the decoding limit:
    what can be judged without the model (UsageError naming the flag), so that a wrong one fails at once instead
    of after the model is fetched, converted and loaded."""
    from fun_asr.asr.options import check_hotwords
    from fun_asr.audio.decode import Limits
    from fun_asr.model.native import usable_device

    try:
        if device:
            usable_device(args.device)
    except ValueError as exc:
        raise UsageError(f"--device {args.device}: {render(exc, 'cli')}") from None
    limits = Limits()
    try:
        check_hotwords(args.hotwords, limits)
    except FunAsrError as exc:  # (each names --hotwords itself)
        raise UsageError(render(exc, "cli")) from None
    except (TypeError, ValueError) as exc:
        raise UsageError(f"--hotwords: {exc}") from None
    if args.max_new_tokens is not None and args.max_new_tokens > limits.max_new_tokens:
        raise UsageError(f"--max-new-tokens must be at most {limits.max_new_tokens}, got {args.max_new_tokens}")


def add_speaker_arguments(ap: argparse.ArgumentParser) -> None:
    """--diarize, --num-speakers, --min-speakers, --max-speakers, --speaker-clustering, --speaker-model
    (fun-asr-transcribe/-batch)."""
    ap.add_argument("--diarize", action="store_true",
                    help="who spoke when: each segment gets a speaker (SPK0, SPK1, ...; FunASR's CAM++ + clustering): "
                         "[SPK0] in txt/srt, <v SPK0> in vtt, speaker in json")
    add_arguments(ap, SPEAKER_COUNTS)
    add_speaker_clustering_argument(ap, "with --diarize: ")
    ap.add_argument("--speaker-model", help="CAM++ speaker model for --diarize: a .gguf, a FunASR CAM++ folder or a "
                                            "hub repo id (default: the one embedded in the model package, "
                                            "$FUN_ASR_SPEAKER_MODEL, or the hub model's)")


def add_speaker_clustering_argument(ap: argparse.ArgumentParser, prefix: str = "") -> None:
    """--speaker-clustering auto|funasr (fun-asr-transcribe/-batch/-serve): the ``speaker_clustering`` option."""
    from fun_asr.speakers.cluster import CLUSTERINGS

    ap.add_argument("--speaker-clustering", choices=CLUSTERINGS, default=None,
                    help=f"{prefix}auto (default): a recording under 20 speaker windows (~15 s of speech) gets its "
                         "speaker count from agglomerative clustering; funasr: FunASR's labels exactly (one speaker "
                         "there); from 20 windows on both are FunASR's clustering")


def check_speaker_arguments(args: argparse.Namespace) -> None:
    """The speaker flags need --diarize; the counts must make sense (UsageError before the model loads)."""
    for flag in ("num_speakers", "min_speakers", "max_speakers", "speaker_clustering", "speaker_model"):
        if getattr(args, flag) is not None and not args.diarize:
            raise UsageError(f"--{flag.replace('_', '-')} is for --diarize; add --diarize")
    if args.diarize:
        from fun_asr.speakers.diarize import SpeakerOptions

        try:
            SpeakerOptions.check(args.num_speakers, args.min_speakers, args.max_speakers)
        except ValueError as exc:
            raise UsageError(render(exc, "cli")) from None


def speaker_kwargs(args: argparse.Namespace) -> dict[str, Any]:
    """--diarize, its counts and --speaker-clustering (when given) as transcribe() kwargs (none without
    --diarize)."""
    if not getattr(args, "diarize", False):
        return {}
    clustering = {} if args.speaker_clustering is None else {"speaker_clustering": args.speaker_clustering}
    return {"diarize": True, "num_speakers": args.num_speakers, "min_speakers": args.min_speakers,
            "max_speakers": args.max_speakers, **clustering}
