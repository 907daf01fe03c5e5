"""Batch throughput with continuous batching, and where a decode step's time goes (`tools/bench.py --batch-split`).

A corpus of clips of 5-29.5 s, each with its own token count (``--tokens-per-second`` x that clip's seconds, as
real speech ends by EOS at its own length; random weights rarely emit EOS, so each clip's count is its token
budget): every clip is encoded (fun-asr's encoder and adaptor, one recording at a time), then all of them are
decoded by ``Model.generate_batch`` with ``max_active`` = the batch size (continuous batching: when a clip ends, the
next one's prefill joins the running steps). RTFx = audio seconds / (encode + decode seconds).

The decoder inputs are each clip's adaptor output between a fixed prompt of 12 + 8 rows (the model's embeddings of
ids 1..20), the shape of a transcription's prompt. The split: of the decoder passes (prefills and steps), graph
building and allocation, host<->device copies, compute, and the host's token choice (where the graph did not
make it); each batch size also as static batches (the clips in order, cut into batches that wait for their longest
clip). Then one decode step of B sequences (the decode steps of a 16-token generation, prefill excluded) with the
host's share: graph + copies + choice over the step. Last, the encoder: every clip's own pass against packed
passes of N clips (Model.encode_batch: one graph, attention and FSMN memory per clip), with whether each clip's
adaptor output came out the same bits.
"""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np

import fun_asr
from fun_asr import _core
from fun_asr.audio.frontend import FrontendConfig, features

RATE = 16000
SPLIT_KEYS = ("graph_ms", "transfer_ms", "compute_ms", "select_ms")


def corpus(files: int, seed: int = 0) -> tuple[list[float], list[np.ndarray]]:
    """`files` clips of 5-29.5 s (shortest first): a tone-and-noise signal, each clip its own cut and level."""
    rng = np.random.default_rng(seed)
    durations = sorted(float(d) for d in rng.uniform(5.0, 29.5, files))
    t = np.arange(int(30 * RATE)) / RATE
    base = (0.3 * np.sin(2 * np.pi * 220 * t) * np.sin(2 * np.pi * 3 * t) + 0.05 * rng.standard_normal(t.size))
    clips = [np.roll(base, int(rng.integers(1, base.size)))[: int(d * RATE)].astype(np.float32)
             * float(rng.uniform(0.5, 1)) for d in durations]
    return durations, clips


def decoder_inputs(model: _core.Model, frontend: FrontendConfig,
                   clips: list[np.ndarray]) -> tuple[list[np.ndarray], float]:
    """Each clip's decoder input (prompt rows around its adaptor output) and the milliseconds spent encoding."""
    ids = list(range(1, 21))
    before, after = model.embed(ids[:12]), model.embed(ids[12:])
    t0 = time.perf_counter()
    inputs = [np.ascontiguousarray(np.concatenate([before, model.encode(features(c, frontend)), after]))
              for c in clips]
    return inputs, (time.perf_counter() - t0) * 1e3


def packed_encoding(model: _core.Model, frontend: FrontendConfig, clips: list[np.ndarray],
                    packs: list[int]) -> list[tuple[int, float, float, bool]]:
    """(N, ms one pass per clip, ms packed N per pass, every clip's rows the same) per N in `packs`."""
    feats = [features(c, frontend) for c in clips]
    t0 = time.perf_counter()
    alone = [model.encode(f) for f in feats]
    alone_ms = (time.perf_counter() - t0) * 1e3
    out = []
    for n in packs:
        t0 = time.perf_counter()
        packed = [r for i in range(0, len(feats), n) for r in model.encode_batch(feats[i:i + n])]
        ms = (time.perf_counter() - t0) * 1e3
        out.append((n, alone_ms, ms, all(np.array_equal(a, b) for a, b in zip(alone, packed, strict=True))))
    return out


def step_split(model: _core.Model, inputs: list[np.ndarray], batch: int, tokens: int = 16) -> dict[str, float]:
    """One decode step of `batch` sequences (the decode steps of a `tokens`-token generation, prefill excluded:
    last_generation()'s step_* keys): per key of SPLIT_KEYS, ms per step, and `host_share` (all but compute)."""
    prompts = [inputs[i % len(inputs)] for i in range(batch)]
    model.generate_batch(prompts, tokens, [])
    gen = model.last_generation()
    steps = max(1, gen["decode_passes"])
    out = {"graph_ms": gen["step_graph_ms"] / steps, "transfer_ms": gen["step_transfer_ms"] / steps,
           "compute_ms": gen["step_compute_ms"] / steps, "select_ms": gen["select_ms"] / steps}
    total = sum(out.values())
    out["step_ms"] = total
    out["host_share"] = (total - out["compute_ms"]) / total if total > 0 else 0.0
    out["graphs_built_per_step"] = (gen["graphs_built"] - gen["prefill_passes"]) / steps
    return out


def batch_split_bench(gguf: Path, device: str, threads: int, files: int, batch_sizes: list[int],
                      tokens_per_second: float, label: str) -> list[str]:
    """The markdown lines of both tables for one model file on `device`."""
    session = fun_asr.Session(gguf, device=device, threads=threads, progress=False, vad=None)
    model, frontend = session.model, session.frontend
    durations, clips = corpus(files)
    audio_s = sum(durations)
    limits = [max(1, int(np.ceil(tokens_per_second * d))) for d in durations]
    inputs, encode_ms = decoder_inputs(model, frontend, clips)
    model.generate_batch(inputs[:1], 2, [])  # warm-up
    # The KV cache of the largest batch that runs in slots, allocated and touched once before anything is timed (the
    # first call at a new size pays for that: 2.5 s for 8 slots of the full-size model on a 2-core VM); the
    # longest clips, the longest with the largest token count (the corpus is sorted by length).
    slots = max([b for b in batch_sizes if 1 < b < len(inputs)], default=0)
    if slots:
        model.generate_batch(inputs[-slots:], [1] * (slots - 1) + [max(limits)], [])
    results = []
    def ways(b: int) -> tuple[str, ...]:
        return ("one by one",) if b == 1 else ("all at once",) if b >= len(inputs) else ("continuous", "static")

    for bs, how in [(b, m) for b in batch_sizes for m in ways(b)]:
        t0 = time.perf_counter()
        if how in ("static", "one by one"):  # chunks of bs clips in order, each waiting for its longest (no joining)
            stats = dict.fromkeys(("prefill_ms", "decode_ms", *SPLIT_KEYS, "decode_passes", "slot_moves"), 0.0)
            for i in range(0, len(inputs), bs):
                model.generate_batch(inputs[i:i + bs], limits[i:i + bs], [])
                gen = model.last_generation()
                for k in stats:
                    stats[k] += gen[k]
        else:
            model.generate_batch(inputs, limits, [], max_active=bs)
            stats = model.last_generation()
        results.append((bs, how, (time.perf_counter() - t0) * 1e3, stats))
    lines = []
    for bs, how, decode_ms, st in results:
        wall = (encode_ms + decode_ms) / 1e3
        lines.append(f"| {label} | {bs} | {how} | {audio_s / wall:.1f} | {wall:.2f} | {encode_ms / 1e3:.2f} | "
                     f"{st['prefill_ms'] / 1e3:.2f} | {st['decode_ms'] / 1e3:.2f} | {int(st['decode_passes'])} | "
                     f"{int(st['slot_moves'])} | " + " | ".join(f"{st[k] / 1e3:.2f}" for k in SPLIT_KEYS) + " |")
    steps = []
    for bs in sorted({1, *batch_sizes, 64}):
        sp = step_split(model, inputs, bs)
        steps.append(f"| {label} | {bs} | {sp['step_ms']:.2f} | " + " | ".join(f"{sp[k]:.3f}" for k in SPLIT_KEYS)
                     + f" | {sp['graphs_built_per_step']:.2f} | {100 * sp['host_share']:.1f} % |")
    packs = sorted({min(b, int(model.max_packed_sequences)) for b in batch_sizes if b > 1})
    encoders = [f"| {label} | {n} | {a / 1e3:.2f} | {p / 1e3:.2f} | {a / p:.2f} | {'yes' if same else 'NO'} |"
                for n, a, p, same in packed_encoding(model, frontend, clips, packs)]
    return [
        f"Batch throughput ({files} clips of 5-29.5 s, {audio_s:.0f} s of audio; each clip "
        f"ceil({tokens_per_second:g} x its seconds) tokens, {sum(limits)} in all; continuous batching, and static "
        "batches for comparison):",
        "",
        "| model | batch size | batching | RTFx | wall s | encode s | prefill s | decode s | decode passes | "
        "slot moves | graphs s | copies s | compute s | host choice s |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
        *lines,
        "",
        "One decode step of B sequences (ms per step; host share = graphs + copies + choice over the step):",
        "",
        "| model | B | step ms | graphs | copies | compute | host choice | graphs built per step | host share |",
        "|---|---|---|---|---|---|---|---|---|",
        *steps,
        "",
        f"The encoder over the {files} clips: one pass per clip, or N clips packed into each pass (the Session packs "
        f"where the device says it gains: caps packed_encoding = {model.info()['caps']['packed_encoding']} here):",
        "",
        "| model | N | one per clip s | packed s | speed-up | same bits |",
        "|---|---|---|---|---|---|",
        *encoders,
    ]
