"""fun-asr-transcribe: audio files -> text / json / srt / vtt."""

from __future__ import annotations

import argparse
import logging
import sys
import warnings
from pathlib import Path

from fun_asr.formats import FORMATS, render
from fun_asr.hub import DEFAULT_REPO


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="fun-asr-transcribe",
                                 description="Transcribe audio files with Fun-ASR-Nano (no PyTorch).")
    ap.add_argument("files", nargs="+", metavar="FILE", help="audio files (wav, flac, ogg, mp3, ...)")
    ap.add_argument("-m", "--model", default=DEFAULT_REPO,
                    help=f"GGUF file, checkpoint folder or hub repo id (default {DEFAULT_REPO}, fetched and "
                         "converted once)")
    ap.add_argument("--language", help="zh, en, ja (or chinese/english/japanese, 中文/英文/日文); default: automatic")
    ap.add_argument("--no-itn", action="store_true", help="no inverse text normalization")
    ap.add_argument("--hotwords", help="comma-separated words to favour, e.g. 'FunASR,ggml'")
    ap.add_argument("-f", "--format", default="txt", choices=[*FORMATS, "all"], help="output format (default txt)")
    ap.add_argument("-o", "--output-dir", help="write FILE.<format> here instead of printing to stdout")
    ap.add_argument("--device", default="auto", help="auto, cpu, cuda, cuda:N (default auto)")
    ap.add_argument("--threads", type=int, default=0, help="CPU threads (default: all cores)")
    ap.add_argument("--max-new-tokens", type=int, default=512, help="decoding limit per segment (default 512)")
    ap.add_argument("--segment-seconds", type=float, default=30.0, help="longest segment (default 30)")
    ap.add_argument("--no-repetition-guard", action="store_true", help="do not stop n-gram loops early")
    ap.add_argument("--batch-size", type=int, default=8,
                    help="segments decoded together across files (default 8; 1 = one by one)")
    ap.add_argument("--quiet", action="store_true", help="no progress or warnings on stderr")
    ap.add_argument("--verbose", action="store_true", help="full tracebacks and logging")
    return ap


def main(argv: list[str] | None = None) -> int:
    try:
        return _main(argv)
    except BrokenPipeError:  # e.g. `fun-asr-transcribe a.wav | head`
        return 0


def _main(argv: list[str] | None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=logging.INFO if args.verbose else logging.WARNING, format="%(message)s")
    if args.format == "all" and not args.output_dir:
        print("fun-asr-transcribe: error: -f all needs -o DIR (one file per input and format)", file=sys.stderr)
        return 2
    if args.quiet:
        warnings.simplefilter("ignore")
    else:
        warnings.simplefilter("always")
        warnings.formatwarning = lambda msg, *a, **k: f"fun-asr-transcribe: warning: {msg}\n"
    interactive = sys.stderr.isatty() and not args.quiet
    try:
        from fun_asr.session import Session

        session = Session(args.model, device=args.device, threads=args.threads, progress=interactive)
    except Exception as exc:  # noqa: BLE001 - one clear line unless --verbose
        if args.verbose:
            raise
        print(f"fun-asr-transcribe: error: cannot load model {args.model}: {exc}", file=sys.stderr)
        return 1

    formats = list(FORMATS) if args.format == "all" else [args.format]
    out_dir = Path(args.output_dir) if args.output_dir else None
    if out_dir:
        out_dir.mkdir(parents=True, exist_ok=True)
    failed = 0
    from fun_asr.audio import load_audio

    bar = None
    if interactive and len(args.files) > 1:
        from tqdm import tqdm

        bar = tqdm(total=len(args.files), unit="file", desc="transcribing")
    step = max(1, args.batch_size)
    for k in range(0, len(args.files), step):
        # Read this group's files (a bad one is reported and skipped), then transcribe them together.
        group: list[tuple[str, object]] = []
        for name in args.files[k : k + step]:
            try:
                group.append((name, load_audio(name)))
            except Exception as exc:  # noqa: BLE001 - report and go on with the other files
                if args.verbose:
                    raise
                failed += 1
                print(f"fun-asr-transcribe: error: {name}: {exc}", file=sys.stderr)
                if bar:
                    bar.update(1)
        if not group:
            continue
        try:
            results = session.transcribe_batch(
                [audio for _, audio in group], sample_rate=16000, language=args.language, itn=not args.no_itn,
                hotwords=args.hotwords, max_new_tokens=args.max_new_tokens, segment_seconds=args.segment_seconds,
                repetition_guard=not args.no_repetition_guard, batch_size=step,
                progress=interactive and bar is None,
            )
        except Exception as exc:  # noqa: BLE001 - options are shared, so the whole group fails alike
            if args.verbose:
                raise
            failed += len(group)
            for name, _ in group:
                print(f"fun-asr-transcribe: error: {name}: {exc}", file=sys.stderr)
            if bar:
                bar.update(len(group))
            continue
        for (name, _), result in zip(group, results, strict=True):
            for fmt in formats:
                text = render(result, fmt)
                if out_dir:
                    (out_dir / f"{Path(name).stem}.{fmt}").write_text(text, "utf-8")
                else:
                    if len(args.files) > 1 and fmt == "txt":
                        text = f"{name}: {text}"
                    sys.stdout.write(text)
                    sys.stdout.flush()
        if bar:
            bar.update(len(group))
    if bar:
        bar.close()
    if failed:
        print(f"fun-asr-transcribe: {failed} of {len(args.files)} file(s) failed", file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
