#!/usr/bin/env python3
"""Parity of the native core against Transformers 5.23 on the full-size (830M) random checkpoint.

    python tools/parity.py [--work /tmp/fun-asr-parity] [--types f32,f16,q8_0,q4_k_m] [--device cpu]
                           [--frames 167] [--steps 32] [--out docs/parity.md]

Makes (or reuses) the random BF16 checkpoint in the official layout and its GGUFs, then per type:
relative max-abs error of every debug stage against the reference modules (F32), decoder prefill
logits error and cosine, greedy tokens (free-running) and their agreement with the reference, and
timings of encode and per-token step at 1 and 2 threads. Writes a markdown table.
"""

from __future__ import annotations

import argparse
import platform
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))

import fun_asr  # noqa: E402
from make_random_checkpoint import make_checkpoint  # noqa: E402
from reference import ReferenceDecoder, load_reference, reference_stages, rel_max_abs  # noqa: E402

STAGES = ["enc.blk.0.out", "enc.blk.24.out", "enc.blk.49.out", "enc.blk.59.out", "enc.out", "adp.proj.out",
          "adp.blk.0.out", "adp.out"]


def fake_token_len(t: int) -> int:
    for _ in range(3):
        t = (t - 1) // 2 + 1
    return t


def median_ms(fn, repeats: int = 3) -> float:  # noqa: ANN001
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append((time.perf_counter() - t0) * 1e3)
    return float(np.median(times))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--work", default="/tmp/fun-asr-parity")
    ap.add_argument("--types", default="f32,f16,q8_0,q4_k_m")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--frames", type=int, default=167, help="LFR frames (167 = 10 s)")
    ap.add_argument("--steps", type=int, default=32)
    ap.add_argument("--out", default=str(Path(__file__).resolve().parents[1] / "docs" / "parity.md"))
    args = ap.parse_args()

    work = Path(args.work)
    ckpt = work / "full-bf16"
    if not (ckpt / "config.json").is_file():
        print(f"making the 830M random checkpoint in {ckpt} ...", flush=True)
        make_checkpoint(ckpt, "full", seed=0, dtype="bf16")
    ref_model = load_reference(ckpt)
    ref = ReferenceDecoder(ref_model)
    rng = np.random.default_rng(0)
    feats = (rng.standard_normal((args.frames, 560)) * 3 + 8).astype(np.float32)
    ref_stages = reference_stages(ref_model, feats)
    n_audio = fake_token_len(args.frames)
    prompt_a = [151644, 8, 9, 10, 151645, 198, 151644, 11, 12]
    prompt_b = [151645, 198, 151644, 13, 198]
    audio_ref = ref_stages["adp.out"][:n_audio]
    emb_ref = np.ascontiguousarray(np.concatenate([ref.embed(prompt_a), audio_ref, ref.embed(prompt_b)]))
    t0 = time.perf_counter()
    ref_logits = ref.prefill(emb_ref)
    ref_prefill_ms = (time.perf_counter() - t0) * 1e3
    ref_tokens = ref.greedy(emb_ref, args.steps, [151645, 151643])
    t0 = time.perf_counter()
    reference_stages(ref_model, feats)
    ref_encode_ms = (time.perf_counter() - t0) * 1e3

    rows = []
    for package in args.types.split(","):
        gguf_path = work / f"full-{package}.gguf"
        if not gguf_path.is_file():
            print(f"converting {package} ...", flush=True)
            fun_asr.convert(ckpt, gguf_path, package, progress=False)
        model = fun_asr.load_model(gguf_path, device=args.device)
        stages = model.debug_stages(feats)
        errs = {s: rel_max_abs(stages[s], ref_stages[s]) for s in STAGES if s in stages}
        audio = model.encode(feats)[:n_audio]
        emb = np.ascontiguousarray(np.concatenate([model.embed(prompt_a), audio, model.embed(prompt_b)]))
        logits = model.prefill(emb_ref)  # same input as the reference: decoder-only error
        cos = float(logits @ ref_logits / (np.linalg.norm(logits) * np.linalg.norm(ref_logits)))
        tokens = model.generate(emb, args.steps, [151645, 151643])  # end to end from our own encoder
        pairs = list(zip(tokens, ref_tokens, strict=False))
        agree = sum(a == b for a, b in pairs) / max(len(ref_tokens), 1)
        prefix = next((i for i, (a, b) in enumerate(pairs) if a != b), len(pairs))
        timing = {}
        for threads in (1, 2):
            model.threads = threads
            timing[f"enc{threads}"] = median_ms(lambda m=model: m.encode(feats))
            model.prefill(emb)
            tok = tokens[0]
            n = 16
            t0 = time.perf_counter()
            for _ in range(n):
                model.step(tok)
            timing[f"step{threads}"] = (time.perf_counter() - t0) * 1e3 / n
        rows.append(dict(package=package, errs=errs, logit_rel=rel_max_abs(logits, ref_logits), cos=cos,
                         agree=agree, prefix=prefix, n=len(ref_tokens), bytes=gguf_path.stat().st_size, **timing))
        r = rows[-1]
        print(f"{package:7s} enc.out {errs.get('enc.out', float('nan')):.2e} adp.out {errs['adp.out']:.2e} "
              f"logits {r['logit_rel']:.2e} cos {cos:.6f} greedy {agree:.0%} (first {prefix}/{r['n']} identical) "
              f"encode {timing['enc1']:.0f}/{timing['enc2']:.0f} ms "
              f"step {timing['step1']:.1f}/{timing['step2']:.1f} ms", flush=True)
        del model

    info = fun_asr.system_info()
    lines = [
        "# Parity: native core vs Transformers 5.23 (full 830M config, random weights)",
        "",
        "Generated by `python tools/parity.py`. Reference: `FunAsrNanoForConditionalGeneration` in F32 "
        "(eager attention) loaded from a random BF16 checkpoint in the official layout "
        "(`tools/make_random_checkpoint.py --size full`, decoder 2-D weights x5). Errors are "
        "max |ours - ref| / max |ref| per stage. Input: "
        f"{args.frames} LFR frames (= {args.frames * 0.06:.1f} s) of log-mel-like noise; decoder prompt = "
        f"{len(prompt_a)} tokens + {n_audio} audio rows (fake_token_len) + {len(prompt_b)} tokens.",
        "",
        f"Machine: {platform.processor() or platform.machine()}, ggml {info['ggml_version']}, "
        f"CPU features {', '.join(k for k, v in info['cpu_features'].items() if v == '1')}; device `{args.device}`.",
        "",
        "## Stage errors (relative max-abs)",
        "",
        "| type | size MB | " + " | ".join(STAGES) + " |",
        "|---|---|" + "---|" * len(STAGES),
    ]
    for r in rows:
        lines.append(f"| {r['package']} | {r['bytes'] / 1e6:.0f} | " +
                     " | ".join(f"{r['errs'].get(s, float('nan')):.1e}" for s in STAGES) + " |")
    lines += [
        "",
        "## Decoder",
        "",
        "Prefill logits on the reference's own input embeddings (decoder error alone); greedy tokens "
        f"free-running for {args.steps} steps from our own encoder output (end-to-end).",
        "",
        "| type | logits rel max-abs | logits cosine | greedy agreement | identical prefix |",
        "|---|---|---|---|---|",
    ]
    for r in rows:
        lines.append(f"| {r['package']} | {r['logit_rel']:.1e} | {r['cos']:.6f} | {r['agree']:.0%} | "
                     f"{r['prefix']}/{r['n']} |")
    lines += [
        "",
        "## Timings (median ms; same run)",
        "",
        f"Reference (Transformers F32, torch threads={__import__('torch').get_num_threads()}): encoder+adaptor "
        f"{ref_encode_ms:.0f} ms, prefill {ref_prefill_ms:.0f} ms.",
        "",
        f"| type | encode T={args.frames}, 1 thread | 2 threads | step ms/token, 1 thread | 2 threads |",
        "|---|---|---|---|---|",
    ]
    for r in rows:
        lines.append(f"| {r['package']} | {r['enc1']:.0f} | {r['enc2']:.0f} | {r['step1']:.1f} | {r['step2']:.1f} |")
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text("\n".join(lines) + "\n", "utf-8")
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
