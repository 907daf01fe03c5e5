"""Requests arriving while a batch decodes: the server's batcher with and without joining, side by side.

    python tools/arrivals_bench.py [--model demo] [--requests 60] [--interval-ms 30] [--batch 8] [--device cpu]

The server's decoder (fun_asr.serve.core.batcher.Batcher, no HTTP) gets ``--requests`` recordings, one every
``--interval-ms`` (the trained demo model's held-out clips by default: real words that end at their own EOS). With
joining (the server's default) a request that arrives mid-batch is encoded when a decoder slot frees and decodes
in the running steps, answered as soon as it is done; without, it waits for the running batch to end. Prints
wall time, latency (submit to answer: mean, p50, p90, max) and the ratio, and checks that both give the same texts.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import numpy as np
import soundfile as sf

ROOT = Path(__file__).resolve().parents[1]


def clips(n: int, work: Path) -> list[np.ndarray]:
    sys.path.insert(0, str(ROOT / "tests"))
    from trained_model import heldout_clips

    found = [sf.read(str(p), dtype="float32")[0] for p, _ in heldout_clips(work / "clips")]
    return [found[i % len(found)] for i in range(n)]


def run(session, audio: list[np.ndarray], interval_s: float, batch: int,  # noqa: ANN001
        join: bool, max_new_tokens: int) -> tuple[float, list[float], list[str]]:
    from fun_asr.serve.core.batcher import Batcher
    from fun_asr.serve.core.requests import DecodeRequest

    batcher = Batcher(session, max_batch=batch, max_new_tokens=max_new_tokens, join_running=join)
    request = DecodeRequest(language="en")
    done: list[float] = [0.0] * len(audio)
    futures = []
    t0 = time.perf_counter()
    for i, x in enumerate(audio):
        target = t0 + i * interval_s
        time.sleep(max(0.0, target - time.perf_counter()))
        sent = time.perf_counter()
        fut = batcher.submit(x, request, name=f"request {i}")
        fut.add_done_callback(lambda f, i=i, sent=sent: done.__setitem__(i, time.perf_counter() - sent))
        futures.append(fut)
    texts = [f.result(timeout=600).text for f in futures]
    wall = time.perf_counter() - t0
    batcher.close()
    return wall, done, texts


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="demo", help="a .gguf or 'demo' (default)")
    ap.add_argument("--requests", type=int, default=60)
    ap.add_argument("--interval-ms", type=float, default=30.0)
    ap.add_argument("--batch", type=int, default=8, help="the batcher's max batch (--max-batch of fun-asr-serve)")
    ap.add_argument("--max-new-tokens", type=int, default=64,
                    help="each request's token budget (a random-weight model never ends earlier)")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--threads", type=int, default=0)
    ap.add_argument("--work", type=Path, default=Path("/tmp/fun-asr-arrivals"))
    args = ap.parse_args()
    import fun_asr

    session = fun_asr.Session(args.model, device=args.device, threads=args.threads, vad=None, progress=False)
    audio = clips(args.requests, args.work)
    run(session, audio[:4], 0.0, args.batch, True, args.max_new_tokens)  # warm-up
    rows = {}
    for join in (False, True, False, True):  # alternating: the second pair shows the noise
        rows.setdefault(join, []).append(run(session, audio, args.interval_ms / 1e3, args.batch, join,
                                              args.max_new_tokens))
    same = all(r[2] == rows[False][0][2] for runs in rows.values() for r in runs)
    seconds = sum(len(x) for x in audio) / 16000
    print(f"{args.requests} requests ({seconds:.0f} s of audio), one every {args.interval_ms:g} ms, batch "
          f"{args.batch}, at most {args.max_new_tokens} tokens each, model {args.model}, device {args.device}; "
          f"{time.strftime('%Y-%m-%d')}\n")
    print("| batcher | wall s | mean latency ms | p50 | p90 | max |")
    print("|---|---|---|---|---|---|")
    means = {}
    for join, runs in rows.items():
        for wall, lat, _ in runs:
            ms = sorted(x * 1e3 for x in lat)
            means.setdefault(join, []).append(statistics.mean(ms))
            print(f"| {'joining' if join else 'batch by batch'} | {wall:.2f} | {statistics.mean(ms):.0f} | "
                  f"{ms[len(ms) // 2]:.0f} | {ms[int(0.9 * (len(ms) - 1))]:.0f} | {ms[-1]:.0f} |")
    ratio = statistics.mean(means[False]) / statistics.mean(means[True])
    print(f"\nmean latency, batch by batch / joining: {ratio:.2f}x; same texts: {'yes' if same else 'NO'}")


if __name__ == "__main__":
    main()
