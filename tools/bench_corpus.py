#!/usr/bin/env python3
"""Corpus throughput (audio hours per hour = RTFx) of fun-asr-batch's engines vs a plain loop.

    python tools/bench_corpus.py [-m MODEL.gguf] [--files 64] [--tokens 16] [--batch-size 8]
                                 [--engines loop,local,ray] [--repeats 1] [--threads 0] [--workers N]
                                 [--actors N --threads-per-actor M] [--ray-cpus N] [--work DIR]

Without -m it makes the tiny random test model (tools/make_random_checkpoint.py, Q8_0). The corpus is
--files synthetic recordings of 1-12 s in wav/flac/ogg at 8/16/44.1 kHz. Engines, measured side by
side in one run (alternating when --repeats > 1, medians reported):
- loop:  ``Session.transcribe(path)`` file after file (reading, decoding and the model in turn);
- local: ``fun_asr.jobs.batch.run`` with the local engine (reader threads ahead of one Session, batches of
         --batch-size recordings decoded together); same loaded Session as the loop;
- ray:   ``fun_asr.jobs.batch.run(ray=True)`` on an in-process Ray (``ray.init(num_cpus=--ray-cpus)``), actor
         start and model load included in its time (Ray's own start-up is reported apart).
All engines use the same options, and the script checks that they produce the same tokens. It
reports, and asserts nothing: the numbers depend on the machine and on what else runs on it.
"""

from __future__ import annotations

import argparse
import os
import platform
import shutil
import statistics
import sys
import tempfile
import time
import warnings
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))

FORMATS = [("wav", 16000, "PCM_16"), ("flac", 44100, "PCM_16"), ("ogg", 8000, "VORBIS"), ("wav", 44100, "PCM_16"),
           ("flac", 16000, "PCM_16"), ("ogg", 44100, "VORBIS"), ("wav", 8000, "PCM_16"), ("flac", 8000, "PCM_16")]


def make_corpus(root: Path, n: int, lo: float, hi: float, seed: int = 0) -> float:
    """n recordings of lo..hi seconds; returns their total duration in seconds."""
    import soundfile as sf

    rng = np.random.default_rng(seed)
    total = 0.0
    for i in range(n):
        ext, rate, subtype = FORMATS[i % len(FORMATS)]
        seconds = float(rng.uniform(lo, hi))
        t = np.arange(int(seconds * rate)) / rate
        x = 0.3 * np.sin(2 * np.pi * rng.uniform(120, 400) * t) + 0.05 * rng.standard_normal(len(t))
        x *= (0.6 + 0.4 * np.sin(2 * np.pi * rng.uniform(1, 4) * t)) ** 2
        sf.write(root / f"rec{i:03d}.{ext}", x.astype(np.float32), rate, subtype=subtype)
        total += len(t) / rate
    return total


def tiny_model(work: Path) -> Path:
    import fun_asr
    from make_random_checkpoint import make_checkpoint

    path = work / "tiny-q8_0.gguf"
    if not path.exists():
        ckpt = make_checkpoint(work / "tiny-f32", "tiny", seed=0, dtype="f32")
        fun_asr.convert(ckpt, path, "q8_0", progress=False)
    return path


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("-m", "--model", help="GGUF model (default: the tiny random test model)")
    ap.add_argument("--files", type=int, default=64)
    ap.add_argument("--min-seconds", type=float, default=1.0)
    ap.add_argument("--max-seconds", type=float, default=12.0)
    ap.add_argument("--tokens", type=int, default=16, help="max new tokens per segment (default 16)")
    ap.add_argument("--batch-size", type=int, default=8)
    ap.add_argument("--threads", type=int, default=0, help="Session threads of loop/local (default 0: all)")
    ap.add_argument("--workers", type=int, default=None, help="local engine reader threads (default min(4, CPUs))")
    ap.add_argument("--engines", default="loop,local,ray")
    ap.add_argument("--repeats", type=int, default=1)
    ap.add_argument("--ray-cpus", type=int, default=os.cpu_count() or 2)
    ap.add_argument("--actors", type=int, default=None)
    ap.add_argument("--threads-per-actor", type=int, default=None)
    ap.add_argument("--work", help="working folder (default: a temporary one, removed at the end)")
    args = ap.parse_args(argv)

    import fun_asr
    from fun_asr.jobs import batch

    warnings.simplefilter("ignore")
    engines = [e.strip() for e in args.engines.split(",") if e.strip()]
    work = Path(args.work) if args.work else Path(tempfile.mkdtemp(prefix="fun-asr-bench-corpus-"))
    work.mkdir(parents=True, exist_ok=True)
    corpus = work / "corpus"
    shutil.rmtree(corpus, ignore_errors=True)
    corpus.mkdir()
    audio_s = make_corpus(corpus, args.files, args.min_seconds, args.max_seconds)
    model = Path(args.model) if args.model else tiny_model(work)
    files = sorted(p for p in corpus.iterdir())
    session = fun_asr.Session(model, device="cpu", threads=args.threads, vad=None, progress=False)
    opts = dict(max_new_tokens=args.tokens)
    print(f"machine: {platform.processor() or platform.machine()}, {os.cpu_count()} CPUs, "
          f"load average {os.getloadavg()[0]:.2f} at start")
    print(f"model: {model.name}; corpus: {len(files)} files, {audio_s:.1f} s of audio "
          f"({args.min_seconds:g}-{args.max_seconds:g} s each); max_new_tokens {args.tokens}, batch size "
          f"{args.batch_size}")

    tokens: dict[str, dict[str, list]] = {}
    walls: dict[str, list[float]] = {e: [] for e in engines}
    ray_start = None
    temp = None
    if "ray" in engines:
        # A one-machine Ray kept on the loopback interface (Ray's switch for that), with a token of its own.
        os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")
        os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
        if "RAY_AUTH_MODE" not in os.environ:
            import secrets

            os.environ.update(RAY_AUTH_MODE="token", RAY_AUTH_TOKEN=secrets.token_hex(32))
        import ray

        t0 = time.perf_counter()
        temp = tempfile.mkdtemp(prefix="fa-ray-", dir="/tmp")  # short: Ray's socket paths have a length limit
        ray.init(num_cpus=args.ray_cpus, include_dashboard=False, log_to_driver=False, _temp_dir=temp,
                 _node_ip_address="127.0.0.1")
        ray_start = time.perf_counter() - t0
    try:
        for rep in range(args.repeats):
            order = engines if rep % 2 == 0 else engines[::-1]
            for engine in order:
                out = work / f"out-{engine}"
                shutil.rmtree(out, ignore_errors=True)
                t0 = time.perf_counter()
                if engine == "loop":
                    got = {}
                    for f in files:
                        r = session.transcribe(f, **opts)
                        got[f.stem] = [s.tokens for s in r.segments]
                    walls[engine].append(time.perf_counter() - t0)
                elif engine == "local":
                    batch.run([corpus], out, session=session, batch_size=args.batch_size, workers=args.workers,
                              **opts)
                    walls[engine].append(time.perf_counter() - t0)
                    got = {k: [s["tokens"] for s in r["segments"]] for k, r in batch.read_results(out).items()}
                elif engine == "ray":
                    summary = batch.run([corpus], out, model=model, device="cpu", vad=None, batch_size=args.batch_size,
                                        ray=True, actors=args.actors, threads_per_actor=args.threads_per_actor, **opts)
                    walls[engine].append(time.perf_counter() - t0)
                    got = {k: [s["tokens"] for s in r["segments"]] for k, r in batch.read_results(out).items()}
                    lr = summary["last_run"]
                    if rep == 0:
                        print(f"ray: {lr['actors']} actor(s) x {lr['threads_per_actor']} thread(s), "
                              f"{lr['cluster_cpus']:g} CPUs; ray.init took {ray_start:.1f} s (not counted)")
                else:
                    raise SystemExit(f"unknown engine {engine!r}: loop, local, ray")
                tokens[engine] = got
    finally:
        if "ray" in engines:
            import ray

            ray.shutdown()
            shutil.rmtree(temp, ignore_errors=True)
    base = engines[0]
    same = all(tokens[e] == tokens[base] for e in engines)
    loop = statistics.median(walls["loop"]) if "loop" in walls else None
    print()
    print("| engine | wall (s, median) | audio h per h (RTFx) | vs loop |")
    print("| --- | --- | --- | --- |")
    for e in engines:
        w = statistics.median(walls[e])
        ratio = f"{loop / w:.2f}x" if loop else "-"
        print(f"| {e} | {w:.2f} | {audio_s / w:.1f} | {ratio} |")
    print(f"\nsame tokens from every engine: {'yes' if same else 'NO'}; load average {os.getloadavg()[0]:.2f} at end")
    if not args.work:
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
