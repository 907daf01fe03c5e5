#!/usr/bin/env python3
"""Decode milliseconds per token, one sequence at a time and batched, side by side in one run.

    python tools/bench_batch_decode.py MODEL.gguf [MODEL.gguf ...] [--batch 1,8] [--tokens 24]
                                       [--prompt 60] [--repeats 3] [--threads 2]
                                       [--core PATH/_core.so ...]   # compare other builds of the extension
                                       [--env NAME=VALUE[,NAME=VALUE] ...]  # or the same build with switches
                                       [--logprobs]  # and each variant with token_logprobs on (what Sessions do)

Each measurement is a fresh process (FUN_ASR_MATVEC and the other switches come from the environment).
B = 1 decodes 8 prompts one by one; B = 8 decodes the same 8 prompts as one batch; the figure is the
decode time (prefill excluded) divided by the tokens the decoding steps produced. Processes alternate
over models and extension builds in every repeat; medians are reported. `--core` loads another build
of fun_asr._core (e.g. one made from an older commit with `pip install --target`) in place of the
installed one, so that before/after numbers come from the same run; `--env FUN_ASR_ATTN=ggml` runs the
installed build with those variables set as one more alternated variant (a kernel against ggml's path).
`--logprobs` measures every variant also with `Model.token_logprobs` on (each taken token's log-probability
computed beside the greedy choice, as a Session always does) and prints the cost per token.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

CHILD = r"""
import importlib.util, json, sys
import numpy as np
core_path, model_path, opts = sys.argv[1], sys.argv[2], json.loads(sys.argv[3])
if core_path:
    spec = importlib.util.spec_from_file_location("_core", core_path)
    _core = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(_core)
else:
    from fun_asr import _core
model = _core.load_gguf(model_path, device="cpu", threads=opts["threads"])
model.token_logprobs = bool(opts.get("logprobs"))
d = model.info()["decoder"]["d_model"]
rng = np.random.default_rng(0)
prompts = [np.ascontiguousarray(rng.standard_normal((opts["prompt"], d)).astype(np.float32)) for _ in range(8)]
new = opts["tokens"]
out = {"isa": _core.matvec_isa()}
model.generate_batch(prompts[:1], 2, [])  # warm-up (page cache, threads)
for B in opts["batch"]:
    ms, steps = 0.0, 0
    for i in range(0, 8, B):
        model.generate_batch(prompts[i:i + B], new, [])
        ms += model.last_generation()["decode_ms"]
        steps += (new - 1) * len(prompts[i:i + B])  # the first token of each comes from its prefill
    out[str(B)] = ms / steps
print(json.dumps(out))
"""


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("models", nargs="+", type=Path)
    ap.add_argument("--batch", default="1,8", help="batch sizes (divisors of 8)")
    ap.add_argument("--tokens", type=int, default=24)
    ap.add_argument("--prompt", type=int, default=60, help="prompt rows (random embeddings)")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--core", action="append", default=[], help="another _core build to compare (repeatable)")
    ap.add_argument("--env", action="append", default=[],
                    help="NAME=VALUE[,NAME=VALUE]: the installed build with these variables set (repeatable)")
    ap.add_argument("--logprobs", action="store_true", help="also measure each variant with token_logprobs on")
    args = ap.parse_args()
    batch = [int(b) for b in args.batch.split(",")]
    if any(b < 1 or 8 % b for b in batch):
        raise SystemExit("--batch: sizes must divide 8")
    opts = {"batch": batch, "tokens": args.tokens, "prompt": args.prompt, "threads": args.threads}
    # variants: (label, extension path or "" for the installed one, extra environment)
    variants: list[tuple[str, str, dict[str, str]]] = [("installed", "", {})]
    variants += [(core, core, {}) for core in args.core]
    for spec in args.env:
        pairs = [item.partition("=") for item in spec.split(",")]
        if any(not name or not eq for name, eq, _ in pairs):
            raise SystemExit(f"--env {spec!r}: expected NAME=VALUE[,NAME=VALUE]")
        variants.append((spec, "", {name: value for name, _, value in pairs}))
    runs_of = [(label, core, extra, False) for label, core, extra in variants]
    if args.logprobs:
        runs_of += [(f"{label} + token_logprobs", core, extra, True) for label, core, extra in variants]
    results: dict[tuple[str, str], list[dict]] = {}
    for _ in range(args.repeats):
        for model in args.models:
            for label, core, extra, logprobs in runs_of:
                r = subprocess.run([sys.executable, "-c", CHILD, core, str(model),
                                    json.dumps({**opts, "logprobs": logprobs})],
                                   capture_output=True, text=True, env={**os.environ, **extra}, check=False)
                if r.returncode != 0:
                    raise SystemExit(f"{model} ({label}): {r.stderr[-2000:]}")
                results.setdefault((model.name, label), []).append(json.loads(r.stdout.strip().splitlines()[-1]))
    print(f"decode ms per token, median of {args.repeats}, {args.threads} threads, {args.tokens} tokens, "
          f"prompt {args.prompt} rows, FUN_ASR_MATVEC={os.environ.get('FUN_ASR_MATVEC', '(default)')}")
    head = "| model | extension | ISA | " + " | ".join(f"B={b}" for b in batch) + " | B=1 / B=8 |"
    print(head)
    print("|" + " --- |" * (head.count("|") - 1))
    for (name, label), runs in results.items():
        med = {b: statistics.median(r[str(b)] for r in runs) for b in batch}
        ratio = f"{med[1] / med[8]:.2f}x" if 1 in med and 8 in med else "-"
        cells = " | ".join(f"{med[b]:.1f}" for b in batch)
        print(f"| {name} | {label} | {runs[0]['isa'] or 'ggml'} | {cells} | {ratio} |")
    if args.logprobs:
        print("\ntoken_logprobs cost, ms per token (on - off):")
        for (name, label), runs in results.items():
            on = results.get((name, f"{label} + token_logprobs"))
            if on is None:
                continue
            cost = {b: statistics.median(r[str(b)] for r in on) - statistics.median(r[str(b)] for r in runs)
                    for b in batch}
            print(f"| {name} | {label} | " + " | ".join(f"B={b}: {cost[b]:+.2f}" for b in batch) + " |")


if __name__ == "__main__":
    main()
