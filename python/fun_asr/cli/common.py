"""Flags and checks that fun-asr-transcribe and fun-asr-batch share: the model and language, FunASR's per-call
FSMN-VAD options, the speaker flags (--diarize ...), what can be checked before the model loads, and the
logging both set up."""

from __future__ import annotations

import argparse
import logging
from typing import Any

from fun_asr.asr.messages import CliWordsFilter, cli_words
from fun_asr.converter.hub import DEFAULT_REPO, DEMO
from fun_asr.model.demo import WORDS as DEMO_WORDS

# What -m demo is, in every command's -m/--model help.
DEMO_HELP = (f"'{DEMO}': the 20-word demo model shipped in the package, no download (a tiny model trained on "
             f"synthetic speech that knows only {' '.join(DEMO_WORDS[:10])}, {' '.join(DEMO_WORDS[10:])}: a "
             "demonstration, not for real speech)")
# The demo never saw a hotword prompt in training (tools/train_tiny.py): with one it drops words.
DEMO_HOTWORDS = ("the 20-word demo model was not trained with hotwords: with -m demo they can make it drop words, "
                 "e.g. the hotword 'seven' turns 'go left go seven' into 'go left go'")


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
        handler.addFilter(CliWordsFilter())


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
    """--diarize, --num-speakers, --min-speakers, --max-speakers, --speaker-clustering, --speaker-model
    (fun-asr-transcribe/-batch)."""
    ap.add_argument("--diarize", action="store_true",
                    help="who spoke when: each segment gets a speaker (SPK0, SPK1, ...; FunASR's CAM++ + clustering): "
                         "[SPK0] in txt/srt, <v SPK0> in vtt, speaker in json")
    ap.add_argument("--num-speakers", type=int, default=None, help="with --diarize: exactly this many speakers")
    ap.add_argument("--min-speakers", type=int, default=None, help="with --diarize: at least this many (default 1)")
    ap.add_argument("--max-speakers", type=int, default=None, help="with --diarize: at most this many (default 15)")
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
            raise UsageError(cli_words(str(exc))) from None


def speaker_kwargs(args: argparse.Namespace) -> dict[str, Any]:
    """--diarize, its counts and --speaker-clustering (when given) as transcribe() kwargs (none without
    --diarize)."""
    if not getattr(args, "diarize", False):
        return {}
    clustering = {} if args.speaker_clustering is None else {"speaker_clustering": args.speaker_clustering}
    return {"diarize": True, "num_speakers": args.num_speakers, "min_speakers": args.min_speakers,
            "max_speakers": args.max_speakers, **clustering}
