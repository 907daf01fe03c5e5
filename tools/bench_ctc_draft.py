#!/usr/bin/env python3
"""CTC drafts on the full-size model: what the CTC head costs and what a matching CTC transcript saves.

    python tools/bench_ctc_draft.py [--types q8_0,q4_k_m] [--seconds 10] [--tokens 40] [--repeats 3]
                                    [--threads 2] [--work /tmp/fun-asr-bench]
    python tools/bench_ctc_draft.py --smoke   # tiny model and head, one repeat: keeps the harness from rotting (CI)

The full-size random checkpoint of tools/bench.py (HF layout: no CTC head) gets a random CTC head of the
release's dimensions (5 blocks of width 512, linear1 2048, FFN 128, 60,515 labels), its tensors typed as
fun-asr-convert types them, added to the package (tests/trained_ctc.py add_ctc_head). Three ways, alternating
per repeat, on the same clip, decoding exactly --tokens tokens (ignore_eos, as tools/bench.py):

- **plain**: ``Session.ctc_drafts = False`` (what an HF checkpoint gets);
- **CTC, wrong**: the random head's greedy transcript as the draft: what the head and a useless draft cost;
- **CTC, matching**: the real head runs (its cost is paid), but the draft handed to the decoder is the
  model's own plain-greedy output: the best case, a CTC transcript that tokenizes exactly like the LLM's.
- **CTC, no punctuation**: the same, with every 6th token of that output left out of the draft and those ids
  set as ``Model.draft_skip`` (what the Session does with the punctuation a normalized CTC transcript lacks).

Random weights cannot say how often a real CTC head agrees with its LLM (the trained demo model's head agrees on
106 of 109 draft tokens of its held-out clips: tests/test_speculative.py); these rows bound what it costs and
gains on the full-size model. Tokens are checked equal in all three.
"""

from __future__ import annotations

import argparse
import dataclasses
import statistics
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))
sys.path.insert(0, str(ROOT / "tools"))

import fun_asr  # noqa: E402
from bench import RATE, clip  # noqa: E402
from make_random_checkpoint import make_checkpoint  # noqa: E402
from trained_ctc import add_ctc_head, ctc_metadata, specials  # noqa: E402

RELEASE_CTC = dict(d_model=512, proj=2048, n_heads=8, ffn=128, n_layers=5, vocab=60515)
SMOKE_CTC = dict(d_model=64, proj=128, n_heads=4, ffn=16, n_layers=1, vocab=2000)


def random_ranks(n: int, seed: int) -> list[bytes]:
    """256 single bytes, then distinct random 3-byte strings: a vocabulary of `n` tokens."""
    rng = np.random.default_rng(seed)
    out = [bytes([b]) for b in range(256)]
    seen = set(out)
    while len(out) < n:
        t = bytes(rng.integers(0, 256, 3, dtype=np.uint8).tolist())
        if t not in seen:
            seen.add(t)
            out.append(t)
    return out


def with_random_ctc(ckpt: Path, src: Path, dest: Path, package: str, c: dict[str, int], seed: int = 0) -> Path:
    """`src` (a package of `ckpt`) plus a random CTC head of dimensions `c`, typed as the converter types it for
    `package`."""
    import gguf

    from fun_asr import _core
    from fun_asr.converter.plan import place
    from fun_asr.model.funasr_checkpoint import open_checkpoint
    from fun_asr.model.hparams import CtcParams
    from fun_asr.model.tensor_names import tensor_table

    if dest.is_file():
        return dest
    ranks = random_ranks(c["vocab"] - len(specials()), seed)
    opened = open_checkpoint(ckpt)
    hp = opened.hparams
    opened.close()
    hp = dataclasses.replace(hp, ctc=CtcParams(c["d_model"], c["proj"], c["n_heads"], c["ffn"], c["n_layers"],
                                               c["vocab"], c["vocab"] - 1, 1e-12))
    rng = np.random.default_rng(seed)
    tensors = []
    for entry in (e for e in tensor_table(hp) if e.stack == "ctc"):
        shape = tuple(entry.shape)
        if entry.kind == "norm":
            x = 1.0 + 0.1 * rng.standard_normal(shape)
        elif entry.kind == "bias":
            x = 0.1 * rng.standard_normal(shape)
        else:
            x = rng.standard_normal(shape) / np.sqrt(shape[-1])
        x = np.ascontiguousarray(x, np.float32)
        p = place(entry, package, hp)
        if p.type == "f32":
            tensors.append((entry.gguf, x, None))
        else:
            packed = np.frombuffer(_core.quantize(x.reshape(-1, shape[-1]), p.type), np.uint8)
            tensors.append((entry.gguf, packed.reshape(*shape[:-1], -1), gguf.GGMLQuantizationType[p.type.upper()]))
    meta = ctc_metadata(c["d_model"], c["proj"], c["n_heads"], c["ffn"], c["n_layers"], ranks, "random (bench)")
    return add_ctc_head(src, dest, meta, tensors)


def run(s: fun_asr.Session, x: np.ndarray, tokens: int) -> tuple[dict[str, float], list[int]]:
    t0 = time.perf_counter()
    r = s.transcribe(x, sample_rate=RATE, max_new_tokens=tokens, ignore_eos=True, repetition_guard=False)
    t = {k: float(r.timings.get(k, 0.0)) for k in ("encode_ms", "ctc_draft_ms", "prefill_ms", "decode_ms",
                                                   "decode_passes", "draft_proposed", "draft_accepted")}
    t["total_ms"] = (time.perf_counter() - t0) * 1e3
    return t, [k for sg in r.segments for k in sg.tokens]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--types", default="q8_0,q4_k_m")
    ap.add_argument("--seconds", type=float, default=10.0)
    ap.add_argument("--tokens", type=int, default=40)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--work", type=Path, default=Path("/tmp/fun-asr-bench"))
    ap.add_argument("--smoke", action="store_true", help="tiny model and head, one repeat, short clip (CI)")
    a = ap.parse_args()
    size, head = ("tiny", SMOKE_CTC) if a.smoke else ("full", RELEASE_CTC)
    if a.smoke:
        a.repeats, a.seconds, a.tokens = 1, 3.0, 6
    ckpt = a.work / f"{size}-bf16"
    if not (ckpt / "config.json").exists():
        make_checkpoint(ckpt, size, seed=0, dtype="bf16")
    x = clip(a.seconds)
    rows = []
    for package in a.types.split(","):
        src = a.work / f"{size}-{package}.gguf"
        if not src.is_file():
            fun_asr.convert(ckpt, src, package, progress=False)
        pkg = with_random_ctc(ckpt, src, a.work / f"{size}-{package}-ctc.gguf", package, head)
        s = fun_asr.Session(str(pkg), device="cpu", threads=a.threads, progress=False, vad=None)
        s.ctc_drafts = False
        _, oracle = run(s, x, a.tokens)  # warm-up, and the tokens a matching CTC transcript would give
        real_draft = s.engine._ctc_draft

        marks = sorted(set(oracle[5::6]) - {oracle[0]})
        unpunctuated = [t for t in oracle if t not in marks]

        def matching(enc: np.ndarray, real=real_draft, oracle=oracle) -> list[int]:  # noqa: ANN001
            real(enc)  # the head's cost is paid
            return list(oracle)

        def no_punctuation(enc: np.ndarray, real=real_draft, model=s.model, marks=marks,  # noqa: ANN001
                           draft=unpunctuated) -> list[int]:
            real(enc)
            model.draft_skip = marks
            return list(draft)

        res: dict[str, list[dict[str, float]]] = {"plain": [], "CTC, wrong": [], "CTC, matching": [],
                                                  "CTC, no punctuation": []}
        for _ in range(a.repeats):
            for way in res:
                s.ctc_drafts = way != "plain"
                s.engine._ctc_draft = {"CTC, matching": matching,  # type: ignore[method-assign]
                                       "CTC, no punctuation": no_punctuation}.get(way, real_draft)
                s.model.draft_skip = []
                t, toks = run(s, x, a.tokens)
                assert toks == oracle, f"{package} {way}: tokens differ from plain greedy"
                res[way].append(t)
        base = statistics.median(r["total_ms"] for r in res["plain"])
        for way, runs in res.items():
            med = {k: statistics.median(r[k] for r in runs) for k in runs[0]}
            if way == "plain":
                med["decode_passes"] = a.tokens - 1  # one per token after the prefill's
            rows.append(f"| {package} | {way} | {med['total_ms']:.0f} | {base / med['total_ms']:.2f}× | "
                        f"{med['encode_ms']:.0f} | {med['ctc_draft_ms']:.1f} | {med['decode_ms']:.0f} | "
                        f"{med['decode_passes']:.0f} | {med['draft_accepted']:.0f}/{med['draft_proposed']:.0f} |")
        print(f"{package} done", flush=True)
    print(f"\n{a.seconds:.0f} s clip, {a.tokens} tokens, {a.threads} threads, medians of {a.repeats}\n")
    print("| type | draft | total ms | vs plain | encode ms | CTC head ms | decode ms | decoder passes | "
          "draft kept |")
    print("|---|---|---|---|---|---|---|---|---|")
    print("\n".join(rows))


if __name__ == "__main__":
    main()
