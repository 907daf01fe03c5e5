"""fun-asr-eval: WER/CER of one transcript set against another (references, or another model's run)."""

from __future__ import annotations

import argparse
import json
import sys

PROG = "fun-asr-eval"


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(
        prog=PROG,
        description="Score transcripts against references with FunASR-style normalisation (punctuation removed, "
                    "full-width -> half-width, lower case; CJK scored per character, other text per word).",
        epilog="HYP and REF are each a fun-asr-batch output folder, a JSONL file (id, text per line) or a Kaldi text "
               "file ('<id> <text>'). E.g. a Q4_K_M run against an F16 run: fun-asr-eval out-q4 out-f16")
    ap.add_argument("hypothesis", metavar="HYP", help="the transcripts to score")
    ap.add_argument("reference", metavar="REF", help="the references (or the run to compare with)")
    ap.add_argument("--table", metavar="FILE", help="write the per-item table (TSV) to FILE (an existing FILE is "
                                                    "refused unless --overwrite)")
    ap.add_argument("--overwrite", action="store_true", help="with --table: replace FILE if it exists")
    ap.add_argument("--worst", type=int, default=0, metavar="N",
                    help="print the N items with the most errors (only items with errors: WER > 0 or failed)")
    ap.add_argument("--json", action="store_true", help="print the summary as JSON")
    return ap


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.worst < 0:
        print(f"{PROG}: error: --worst must be 0 or more, got {args.worst}", file=sys.stderr)
        return 2
    if args.overwrite and not args.table:
        print(f"{PROG}: error: --overwrite is for --table FILE", file=sys.stderr)
        return 2
    from fun_asr.jobs.batch import BatchError
    from fun_asr.jobs.evaluate import TextSourceError, compare
    from fun_asr.outputs import ExistingOutputError, check_new_outputs

    try:
        if args.table:
            check_new_outputs([args.table], args.overwrite)
        report = compare(args.hypothesis, args.reference)
    except ExistingOutputError as exc:
        print(f"{PROG}: error: {exc} (nothing was done)", file=sys.stderr)
        return 2
    except (TextSourceError, BatchError) as exc:
        print(f"{PROG}: error: {exc}", file=sys.stderr)
        return 2
    if not report.items:
        print(f"{PROG}: error: no id is in both {args.hypothesis} and {args.reference} ({len(report.missing)} "
              f"references, {len(report.extra)} hypotheses); nothing was scored", file=sys.stderr)
        return 2
    if args.table:
        try:
            report.write_table(args.table, overwrite=args.overwrite)
        except ExistingOutputError as exc:  # appeared meanwhile: still never replaced
            print(f"{PROG}: error: {exc}", file=sys.stderr)
            return 2
        except OSError as exc:
            print(f"{PROG}: error: --table {args.table}: cannot write it ({exc.strerror or exc})", file=sys.stderr)
            return 1
    if args.json:
        print(json.dumps({"hypothesis": args.hypothesis, "reference": args.reference, **report.summary()},
                         ensure_ascii=False, indent=2))
    else:
        print(report.describe())
    if args.worst > 0:
        wrong = [it for it in report.items if it.score.word_errors > 0 or it.error]
        worst = sorted(wrong, key=lambda it: (-it.score.word_errors, it.id))[: args.worst]
        if not wrong:
            print(f"{PROG}: no item has errors", file=sys.stderr)
        for it in worst:
            wer = "n/a" if it.score.wer is None else f"{100 * it.score.wer:.1f}%"
            print(f"{it.id}\tWER {wer}\tREF {it.reference}\tHYP {it.hypothesis}" + (f"\tERROR {it.error}" if it.error
                                                                                     else ""))
    if report.missing:
        print(f"{PROG}: {len(report.missing)} reference ids have no hypothesis (not scored), e.g. "
              f"{', '.join(report.missing[:5])}", file=sys.stderr)
    return 0


__all__ = ["build_parser", "main"]

if __name__ == "__main__":
    sys.exit(main())
