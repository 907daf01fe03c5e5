"""fun-asr-convert: HF safetensors checkpoint -> one GGUF; --inspect shows what a GGUF holds."""

from __future__ import annotations

import argparse
import json
import os
import sys

from fun_asr.cli import exits
from fun_asr.converter import PACKAGE_TYPES, OutputError, convert, format_inspection, inspect_gguf
from fun_asr.errors import render

PROG = "fun-asr-convert"


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(
        prog=PROG,
        description="Convert a Fun-ASR-Nano checkpoint folder (Hugging Face layout: config.json + safetensors; "
                    "or FunASR/ModelScope layout: model.pt + config.yaml + Qwen3-0.6B/), a FunASR FSMN-VAD folder "
                    "(model.pt, config.yaml, am.mvn) or a FunASR CAM++ speaker-model folder (config.yaml, "
                    "campplus_cn_common.bin), into one GGUF file.",
    )
    ap.add_argument("src", help="checkpoint directory (config.json, model*.safetensors, tokenizer.json), "
                    "or with --inspect a .gguf file")
    ap.add_argument("-o", "--output", help="output .gguf path (default: SRC-TYPE.gguf beside SRC)")
    ap.add_argument("-t", "--type", default="q8_0", choices=PACKAGE_TYPES, help="package type (default q8_0)")
    ap.add_argument("--encoder-type", default=None, choices=["f32", "f16", "q8_0", "q4_k", "q6_k"],
                    help="store the audio encoder's matrices in this type instead of the package's (e.g. f16 in a "
                         "q4_k_m package: the encoder is compute-bound; see docs/performance.md)")
    ap.add_argument("--vad-model", metavar="DIR|GGUF",
                    help="embed this FSMN-VAD in the package (a FunASR fsmn-vad folder: model.pt, config.yaml, am.mvn; "
                         "or an fsmn_vad GGUF), so the recognizer and its VAD travel in one file")
    ap.add_argument("--speaker-model", metavar="DIR|GGUF",
                    help="embed this CAM++ speaker model in the package (a FunASR CAM++ folder: config.yaml, "
                         "campplus_cn_common.bin, stored F32; or a campplus GGUF, its F32 or F16 tensors as "
                         "stored), for speaker diarization from the one file")
    ap.add_argument("--force", action="store_true",
                    help="replace an existing output file (never an input, a device or anything inside SRC)")
    ap.add_argument("--inspect", action="store_true", help="describe a GGUF file instead of converting")
    ap.add_argument("--json", action="store_true", help="with --inspect: print JSON")
    ap.add_argument("--threads", type=int, default=0, help="quantization threads (0 = all cores)")
    ap.add_argument("--repo-id", help="source repo id to record (default: guessed from a hub cache path)")
    ap.add_argument("--revision", help="source revision to record")
    ap.add_argument("--quiet", action="store_true", help="no progress bar")
    ap.add_argument("--verbose", action="store_true", help="show tracebacks on errors")
    return ap


def _error(msg: str) -> None:
    print(f"{PROG}: error: {msg}", file=sys.stderr)


def _inspect(args: argparse.Namespace) -> int:
    """--inspect FILE: what the GGUF holds; a file that is missing, a folder, or no readable GGUF is one error line
    and exit code 2 (nothing was done: README "Exit codes", a model that cannot be loaded)."""
    try:
        info = inspect_gguf(args.src)
    except (OSError, ValueError) as exc:
        if args.verbose:
            raise
        _error(str(exc).strip() or f"{args.src}: cannot be read as a GGUF file")
        return exits.NOTHING_DONE
    if args.json:
        info = {k: v for k, v in info.items() if k != "metadata"}
        print(json.dumps(info, indent=2, ensure_ascii=False))
    else:
        print(format_inspection(info))
    return exits.OK


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    with exits.terminate_on_sigterm():
        return _convert(args)


def _convert(args: argparse.Namespace) -> int:
    """The command with its parsed arguments (main: SIGTERM raises exits.Terminated meanwhile)."""
    try:
        if args.inspect:
            return _inspect(args)
        from fun_asr.converter import detect_layout, layout_description
        from fun_asr.model.checkpoint import CheckpointError

        if not os.path.exists(args.src):
            _error(f"{args.src}: no such checkpoint folder or file")
            return exits.NOTHING_DONE
        try:
            layout = detect_layout(args.src)
        except CheckpointError as exc:  # not a folder fun-asr-convert reads: nothing was done, fix the command
            _error(str(exc))
            return exits.NOTHING_DONE
        print(f"read {args.src}: {layout_description(layout)}")
        suffix = {"fsmn_vad": "fsmn_vad", "campplus": "campplus"}.get(layout, args.type)
        out = args.output or f"{args.src.rstrip('/')}-{suffix}.gguf"
        report = convert(args.src, out, args.type, progress=not args.quiet and sys.stderr.isatty(),
                         threads=args.threads, repo_id=args.repo_id, revision=args.revision, overwrite=args.force,
                         encoder_type=args.encoder_type, vad_model=args.vad_model,
                         speaker_model=args.speaker_model)
        print(report.summary())
        return 0
    except BrokenPipeError:  # e.g. `--inspect FILE | head`
        return 0
    except (OSError, ValueError) as exc:
        if args.verbose:
            raise
        _error(render(exc, "cli", names={"overwrite": "--force"}))  # (this command's --force)
        # the output would destroy something, or the source is not there: nothing was done, fix the command (2);
        # a source that fails while it is read or converted: 1
        return exits.NOTHING_DONE if isinstance(exc, OutputError | FileNotFoundError) else exits.SOME_FAILED
    except KeyboardInterrupt:
        print(f"\n{PROG}: interrupted (no output written)", file=sys.stderr)
        return exits.INTERRUPTED
    except exits.Terminated:
        print(f"\n{PROG}: terminated (no output written)", file=sys.stderr)
        return exits.TERMINATED


if __name__ == "__main__":
    sys.exit(main())
