#!/usr/bin/env python3
"""CAM++ speaker-embedding speed: the native ggml graph (F32 and F16 files) vs FunASR's torch CAMPPlus, side by
side in one run, on 1.5 s windows (FunASR's diarization window) of the released model's dimensions (random
weights, tools/make_campplus_checkpoint.py --config full).

    python tools/bench_speaker.py [--threads 2] [--batches 1,32] [--repeats 5] [--work /tmp/fun-asr-spk-bench]
                                  [--no-torch] [--parity]
    python tools/bench_speaker.py --smoke     # tiny config, 1 repeat: keeps the harness from rotting

Reported per window: the network (features given), the frontend (fbank + mean removal, numpy/knf), and the
same network in torch at the same thread count; the network's GFLOP per window and the rate it reaches; a
plain F32 GEMM rate of this machine in the same run (numpy, same threads) as the yardstick, and the load
average (the machine may be shared). Engines alternate within each repeat; the best and the median of the
repeats are printed. The last line scales to a 10-minute recording (~800 windows of 1.5 s at a 0.75 s shift).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))

RATE = 16000
WINDOW = int(1.5 * RATE)


def network_gflop(info: dict, frames: int) -> float:
    """Multiply-adds x 2 of one window of `frames` feature frames (every conv and product of the graph)."""
    def out(n: int, k: int, s: int) -> int:
        return (n + 2 * ((k - 1) // 2) - k) // s + 1

    c, k = info["fcm_channels"], info["fcm_kernel_size"]
    f, t = info["feat_dim"], frames
    macs = c * k * k * t * f  # stem
    for n in info["fcm_block_count"]:
        for j in range(n):
            f_out = out(f, k, info["fcm_stride"]) if j == 0 else f
            macs += 2 * c * c * k * k * t * f_out + (c * c * t * f_out if j == 0 else 0)
            f = f_out
    f = out(f, k, info["fcm_stride"])
    macs += c * c * k * k * t * f
    t2 = out(t, info["tdnn_kernel_size"], info["tdnn_stride"])
    macs += info["tdnn_channels"] * c * f * info["tdnn_kernel_size"] * t2
    ch, g, bn = info["tdnn_channels"], info["growth_rate"], info["bn_size"] * info["growth_rate"]
    for b, layers in enumerate(info["block_layer_count"]):
        for i in range(layers):
            macs += bn * (ch + i * g) * t2 + g * bn * info["block_kernel_size"][b] * t2
        ch += layers * g
        macs += (ch // 2) * ch * t2
        ch //= 2
    macs += info["embedding_length"] * 2 * ch
    return 2 * macs / 1e9


def gemm_rate(threads: int) -> float:
    """GFLOP/s of a plain F32 GEMM (numpy's BLAS limited to `threads` threads; 1024^3; best of 5)."""
    from threadpoolctl import threadpool_limits

    a = np.random.default_rng(0).random((1024, 1024), dtype=np.float32)
    b = a.T.copy()
    fastest = float("inf")
    with threadpool_limits(limits=threads):
        a @ b
        for _ in range(5):
            t = time.perf_counter()
            a @ b
            fastest = min(fastest, time.perf_counter() - t)
    return 2 * 1024 ** 3 / fastest / 1e9


def interleaved(engines: dict[str, Callable[[], object]], repeats: int) -> dict[str, tuple[float, float]]:
    """(best, median) seconds of each engine, run alternately `repeats` times after one warm-up each (on a
    shared machine alternating spreads the load over all engines; the best run is the least disturbed)."""
    for fn in engines.values():
        fn()
    times: dict[str, list[float]] = {k: [] for k in engines}
    for _ in range(repeats):
        for name, fn in engines.items():
            t = time.perf_counter()
            fn()
            times[name].append(time.perf_counter() - t)
    return {k: (min(v), statistics.median(v)) for k, v in times.items()}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--batches", default="1,32")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--work", default="/tmp/fun-asr-spk-bench")
    ap.add_argument("--no-torch", action="store_true", help="skip FunASR's torch module")
    ap.add_argument("--parity", action="store_true", help="also print cosines against FunASR's module")
    ap.add_argument("--smoke", action="store_true", help="tiny config, 1 repeat")
    args = ap.parse_args()
    config = "tiny" if args.smoke else "full"
    repeats = 1 if args.smoke else args.repeats
    batches = [int(b) for b in args.batches.split(",")]

    import fun_asr
    from fun_asr.speakers.native import SpeakerModel
    from make_campplus_checkpoint import load_reference, make_campplus_checkpoint

    work = Path(args.work)
    folder = work / f"campplus-{config}"
    if not (folder / "config.yaml").is_file():
        make_campplus_checkpoint(folder, config, seed=0)
    files = {}
    for typ in ("f32", "f16"):
        files[typ] = work / f"campplus-{config}-{typ}.gguf"
        if not files[typ].is_file():
            fun_asr.convert(folder, files[typ], typ, progress=False)

    rng = np.random.default_rng(0)
    windows = [(0.1 * rng.standard_normal(WINDOW)).astype(np.float32) for _ in range(max(batches))]
    models = {typ: SpeakerModel.load(path, threads=args.threads) for typ, path in files.items()}
    feats = np.stack([models["f32"].features(w) for w in windows])
    frames = feats.shape[1]
    info = models["f32"].info
    gflop = network_gflop(info, frames)
    print(f"load average {', '.join(f'{v:.1f}' for v in os.getloadavg())} on {os.cpu_count()} cores")
    print(f"CAM++ {config}: {info['embedding_dim']}-d, {frames} frames per 1.5 s window, {gflop:.2f} GFLOP per "
          f"window; {args.threads} threads; machine F32 GEMM (numpy) {gemm_rate(args.threads):.0f} GFLOP/s")
    front = interleaved({"frontend": lambda: [models["f32"].features(w) for w in windows[:8]]}, repeats)
    t_front = front["frontend"][0] / 8
    print(f"frontend (fbank + mean, per window): {t_front * 1e3:.2f} ms")

    ref = None
    if not args.no_torch:
        import torch

        torch.set_num_threads(args.threads)
        ref = load_reference(folder)
    rows = []
    for b in batches:
        x = np.ascontiguousarray(feats[:b])
        engines: dict[str, Callable[[], object]] = {
            f"native {typ}": (lambda m=m, x=x: m.embed_features(x)) for typ, m in models.items()}
        if ref is not None:
            import torch

            def run(xt: object = torch.from_numpy(x)) -> None:
                with torch.no_grad():
                    ref(xt)

            engines["torch f32"] = run
        for name, (best_t, median_t) in interleaved(engines, repeats).items():
            rows.append((name, b, best_t / b))
            extra = ""
            if name.startswith("native"):
                extra = f", {models[name.split()[1]].native.batch_for(frames)} windows per graph"
            print(f"{name:11s} batch {b:3d}: {best_t / b * 1e3:7.2f} ms/window best, {median_t / b * 1e3:7.2f} "
                  f"median ({gflop / (best_t / b):5.1f} GFLOP/s{extra})")
    fastest = min(t for name, _, t in rows if name.startswith("native"))
    print(f"10-minute recording (~800 windows): network {800 * fastest:.1f} s + frontend {800 * t_front:.1f} s "
          "at the best native rate")
    if args.parity and ref is not None:
        import torch

        with torch.no_grad():
            want = ref(torch.from_numpy(feats[:8])).numpy()
        for typ, m in models.items():
            got = m.embed_features(feats[:8])
            cos = (got * want).sum(1) / np.linalg.norm(got, axis=1) / np.linalg.norm(want, axis=1)
            print(f"parity {typ}: min cosine {cos.min():.7f} over 8 windows")


if __name__ == "__main__":
    main()
