#!/usr/bin/env python3
"""fun-asr vs Transformers 5.23 (F32) on the full-size 830M model, side by side in one run.

    python tools/bench.py [--types f16,q8_0,q4_k_m] [--clips 5,10,30] [--tokens 40] [--repeats 3]
                          [--threads 0] [--work /tmp/fun-asr-bench] [--out docs/benchmarks.md]
    python tools/bench.py --smoke          # tiny model, 1 repeat: keeps the harness from rotting (CI)

Random weights rarely emit EOS, so both engines decode exactly --tokens tokens per clip (the
benchmark-only ignore_eos switch). Engines alternate per repeat; medians are reported. Also measured
in the same run: memory read bandwidth (numpy, all threads) -> the bandwidth limit per decoded token
(decoder weight bytes read per token / bandwidth); ggml's own matmul speed on the encoder's shapes
-> the encoder's matmul bound; peak RSS of a fresh process transcribing the 10 s clip.
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))

import fun_asr  # noqa: E402
from fun_asr import _core  # noqa: E402
from fun_asr.frontend import FrontendConfig, fake_token_len, features  # noqa: E402
from make_random_checkpoint import make_checkpoint  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
RATE = 16000


def clip(seconds: float) -> np.ndarray:
    """The English example clip tiled to `seconds`."""
    import soundfile as sf

    x, rate = sf.read(ROOT / "examples" / "en_hello.wav", dtype="float32")
    assert rate == RATE
    reps = int(np.ceil(seconds * RATE / len(x)))
    return np.tile(x, reps)[: int(seconds * RATE)]


def read_bandwidth(threads: int, mb: int = 512) -> float:
    """Bytes/s of summing a large array, split across threads (numpy releases the GIL)."""
    a = np.ones(mb * 1024 * 1024 // 4, np.float32)
    parts = np.array_split(a, threads)
    best = 0.0
    for _ in range(5):
        ts = [threading.Thread(target=np.sum, args=(p,)) for p in parts]
        t0 = time.perf_counter()
        for t in ts:
            t.start()
        for t in ts:
            t.join()
        best = max(best, a.nbytes / (time.perf_counter() - t0))
    return best


def decoder_bytes_per_token(gguf_path: Path) -> int:
    import gguf

    total = 0
    for t in gguf.GGUFReader(gguf_path).tensors:
        if t.name.startswith("blk.") or t.name in ("output.weight", "output_norm.weight"):
            total += int(t.n_bytes)
        elif t.name == "token_embd.weight":
            total += int(t.n_bytes)  # tied: the output projection reads the whole matrix
    return total


def encoder_matmul_bound_ms(model: fun_asr._core.Model, types: dict[str, str], T: int, threads: int) -> float:
    """Sum of ggml mul_mat times for every matrix of the encoder + adaptor at T frames."""
    info = model.info()
    e, a = info["encoder"], info["adaptor"]
    shapes: list[tuple[str, int, int, int]] = []  # (tensor, n, k, count)
    for i in range(e["n_layers"]):
        k_in = e["input_size"] if i == 0 else e["d_model"]
        for name in ("attn_q", "attn_k", "attn_v"):
            shapes.append((f"enc.blk.{i}.{name}.weight", e["d_model"], k_in, 1))
        shapes += [(f"enc.blk.{i}.attn_output.weight", e["d_model"], e["d_model"], 1),
                   (f"enc.blk.{i}.ffn_up.weight", e["ffn"], e["d_model"], 1),
                   (f"enc.blk.{i}.ffn_down.weight", e["d_model"], e["ffn"], 1)]
    shapes += [("adp.proj1.weight", a["proj"], e["d_model"], 1), ("adp.proj2.weight", a["d_model"], a["proj"], 1)]
    for j in range(a["n_layers"]):
        for name in ("attn_q", "attn_k", "attn_v", "attn_output"):
            shapes.append((f"adp.blk.{j}.{name}.weight", a["d_model"], a["d_model"], 1))
        shapes += [(f"adp.blk.{j}.ffn_up.weight", a["ffn"], a["d_model"], 1),
                   (f"adp.blk.{j}.ffn_down.weight", a["d_model"], a["ffn"], 1)]
    cache: dict[tuple[str, int, int], float] = {}
    total = 0.0
    for name, n, k, count in shapes:
        key = (types[name].lower(), n, k)
        if key not in cache:
            cache[key] = _core.bench_matmul(key[0], n, k, T, threads=threads, repeats=5)
        total += cache[key] * count
    return total


def peak_rss_mb(code: str) -> float:
    """Peak RSS (VmHWM) of a fresh Python process running `code`.

    Read by the child itself from /proc: rusage's ru_maxrss would include this (large) parent's RSS,
    which Linux carries into a child across fork + exec.
    """
    probe = code + "\nprint([l for l in open('/proc/self/status') if l.startswith('VmHWM')][0].split()[1])"
    r = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True)
    if r.returncode != 0:
        raise RuntimeError(f"RSS probe failed: {r.stderr[-2000:]}")
    return int(r.stdout.split()[-1]) / 1024.0


class Reference:
    """Transformers 5.23 F32: same frontend, encoder + adaptor, prefill, then `tokens` cached steps."""

    def __init__(self, ckpt: Path, threads: int) -> None:
        import torch
        from transformers import FunAsrNanoForConditionalGeneration

        torch.set_num_threads(threads)
        self.torch = torch
        self.m = FunAsrNanoForConditionalGeneration.from_pretrained(
            ckpt, attn_implementation="sdpa", dtype=torch.float32).eval()
        from tokenizers import Tokenizer

        tok = Tokenizer.from_file(str(ckpt / "tokenizer.json"))
        system = "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n"
        self.before = tok.encode(system + "<|im_start|>user\n语音转写：", add_special_tokens=False).ids
        self.after = tok.encode("<|im_end|>\n<|im_start|>assistant\n", add_special_tokens=False).ids

    def run(self, samples: np.ndarray, tokens: int) -> dict[str, float]:
        torch = self.torch
        from transformers import DynamicCache

        t = {}
        t0 = time.perf_counter()
        feats = features(samples, FrontendConfig())
        t["frontend_ms"] = (time.perf_counter() - t0) * 1e3
        with torch.inference_mode():
            t0 = time.perf_counter()
            x = torch.from_numpy(feats)[None]
            mask = torch.ones(1, x.shape[1], dtype=torch.long)
            enc = self.m.model.audio_tower(input_features=x, input_features_mask=mask).last_hidden_state
            audio = self.m.model.multi_modal_projector(enc, mask)[0, : fake_token_len(feats.shape[0])]
            t["encode_ms"] = (time.perf_counter() - t0) * 1e3
            emb_layer = self.m.model.language_model.embed_tokens
            emb = torch.cat([emb_layer(torch.tensor(self.before)), audio, emb_layer(torch.tensor(self.after))])[None]
            t0 = time.perf_counter()
            cache = DynamicCache(config=self.m.config.text_config)
            out = self.m(inputs_embeds=emb, past_key_values=cache, use_cache=True, logits_to_keep=1)
            t["prefill_ms"] = (time.perf_counter() - t0) * 1e3
            t0 = time.perf_counter()
            nxt = out.logits[:, -1].argmax(-1, keepdim=True)
            for _ in range(tokens - 1):
                out = self.m(input_ids=nxt, past_key_values=out.past_key_values, use_cache=True, logits_to_keep=1)
                nxt = out.logits[:, -1].argmax(-1, keepdim=True)
            t["decode_ms"] = (time.perf_counter() - t0) * 1e3
        t["total_ms"] = sum(t.values())
        return t


def run_ours(session: fun_asr.Session, samples: np.ndarray, tokens: int) -> dict[str, float]:
    t0 = time.perf_counter()
    r = session.transcribe(samples, sample_rate=RATE, max_new_tokens=tokens, ignore_eos=True,
                           repetition_guard=False, segment_seconds=min(30.0, session.max_segment_seconds))
    total = (time.perf_counter() - t0) * 1e3
    assert all(len(s.tokens) == tokens for s in r.segments), "ignore_eos must give exactly `tokens` tokens"
    t = {k: r.timings[k] for k in ("frontend_ms", "encode_ms", "prefill_ms", "decode_ms")}
    t["total_ms"] = total
    return t


def main() -> None:
    import warnings

    warnings.simplefilter("ignore")
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--types", default="f16,q8_0,q4_k_m")
    ap.add_argument("--clips", default="5,10,30")
    ap.add_argument("--tokens", type=int, default=40)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--threads", type=int, default=0, help="0 = all cores")
    ap.add_argument("--work", default=str(Path(tempfile.gettempdir()) / "fun-asr-bench"))
    ap.add_argument("--out", default=str(ROOT / "docs" / "benchmarks.md"))
    ap.add_argument("--smoke", action="store_true", help="tiny model, one repeat, short clip (CI)")
    args = ap.parse_args()
    threads = args.threads or os.cpu_count() or 1
    work = Path(args.work)
    size = "tiny" if args.smoke else "full"
    if args.smoke:
        args.types, args.clips, args.tokens, args.repeats = "q8_0", "5", 4, 1
    ckpt = work / f"{size}-bf16"
    if not (ckpt / "config.json").is_file():
        print(f"making the {size} random checkpoint in {ckpt} ...", flush=True)
        make_checkpoint(ckpt, size, seed=0, dtype="bf16")
    types = args.types.split(",")
    ggufs = {}
    for package in types:
        ggufs[package] = work / f"{size}-{package}.gguf"
        if not ggufs[package].is_file():
            print(f"converting {package} ...", flush=True)
            fun_asr.convert(ckpt, ggufs[package], package, progress=False)

    bandwidth = read_bandwidth(threads)
    ref = Reference(ckpt, threads)
    sessions = {p: fun_asr.Session(ggufs[p], device="cpu", threads=threads, progress=False) for p in types}
    clips = {float(s): clip(float(s)) for s in args.clips.split(",")}
    results: dict[tuple[str, float], list[dict[str, float]]] = {}
    for _rep in range(args.repeats):
        for secs, samples in clips.items():
            results.setdefault(("transformers", secs), []).append(ref.run(samples, args.tokens))
            for p in types:
                results.setdefault((p, secs), []).append(run_ours(sessions[p], samples, args.tokens))
        print(f"repeat {_rep + 1}/{args.repeats} done", flush=True)

    def med(engine: str, secs: float, key: str) -> float:
        return statistics.median(r[key] for r in results[(engine, secs)])

    ten = 10.0 if 10.0 in clips else next(iter(clips))
    rss = {}
    here = str(Path(__file__).parent)
    for p in types:
        rss[p] = peak_rss_mb(
            f"import fun_asr, sys; sys.path.insert(0, {here!r}); from bench import clip; "
            f"s = fun_asr.Session({str(ggufs[p])!r}, device='cpu', progress=False); "
            f"s.transcribe(clip({ten!r}), sample_rate=16000, max_new_tokens={args.tokens}, ignore_eos=True, "
            "repetition_guard=False)")
    rss["transformers"] = peak_rss_mb(
        f"import sys, pathlib; sys.path.insert(0, {here!r}); from bench import Reference, clip; "
        f"Reference(pathlib.Path({str(ckpt)!r}), {threads}).run(clip({ten!r}), {args.tokens})")
    limits = {p: decoder_bytes_per_token(ggufs[p]) / bandwidth * 1e3 for p in types}
    T10 = features(clips[ten], FrontendConfig()).shape[0]
    bounds = {p: encoder_matmul_bound_ms(sessions[p].model, sessions[p].model.info()["tensor_types"], T10, threads)
              for p in types}

    info = _core.system_info()
    lines = [
        "# Benchmarks: fun-asr vs Transformers 5.23 (F32)",
        "",
        f"Generated by `python tools/bench.py{' --smoke' if args.smoke else ''}`: {size} random checkpoint, "
        f"{args.tokens} generated tokens per clip (EOS ignored), {args.repeats} alternating repeats, medians, "
        f"{threads} threads for both engines. Machine: {platform.machine()}, {os.cpu_count()} cores, "
        f"ggml {info['ggml_version']} ({', '.join(k for k, v in info['cpu_features'].items() if v == '1')}). "
        f"Memory read bandwidth measured in the same run: {bandwidth / 1e9:.1f} GB/s.",
        "",
        "| engine | clip s | total ms | RTFx | vs Transformers | frontend ms | encoder ms | prefill ms | "
        "decode ms/token | bandwidth limit ms/token | decode / limit |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    console = []
    for secs in clips:
        ref_total = med("transformers", secs, "total_ms")
        for engine in ["transformers", *types]:
            total = med(engine, secs, "total_ms")
            per_tok = med(engine, secs, "decode_ms") / max(args.tokens - 1, 1)
            lim = limits.get(engine)
            row = (f"| {engine} | {secs:g} | {total:.0f} | {secs * 1e3 / total:.1f} | {ref_total / total:.2f}x | "
                   f"{med(engine, secs, 'frontend_ms'):.0f} | {med(engine, secs, 'encode_ms'):.0f} | "
                   f"{med(engine, secs, 'prefill_ms'):.0f} | {per_tok:.1f} | "
                   f"{'' if lim is None else f'{lim:.1f}'} | {'' if lim is None else f'{per_tok / lim:.2f}'} |")
            lines.append(row)
            console.append(f"{engine:12s} {secs:4g}s total {total:7.0f} ms  RTFx {secs * 1e3 / total:6.1f}  "
                           f"x{ref_total / total:5.2f} vs transformers  decode {per_tok:6.1f} ms/tok"
                           + ("" if lim is None else f" (limit {lim:.1f}, ratio {per_tok / lim:.2f})"))
    lines += [
        "",
        f"## Encoder vs ggml's matmul on the same shapes ({ten:g} s clip, T_lfr={T10})",
        "",
        "| type | encoder+adaptor ms | sum of ggml mul_mat ms (same shapes) | ratio |",
        "|---|---|---|---|",
    ]
    for p in types:
        enc = med(p, ten, "encode_ms")
        lines.append(f"| {p} | {enc:.0f} | {bounds[p]:.0f} | {enc / bounds[p]:.2f} |")
        console.append(f"{p:12s} encoder {enc:.0f} ms vs matmul bound {bounds[p]:.0f} ms: ratio {enc / bounds[p]:.2f}")
    lines += ["", f"## Peak RSS (fresh process transcribing the {ten:g} s clip)", "", "| engine | peak RSS MB |",
              "|---|---|"]
    for engine in ["transformers", *types]:
        lines.append(f"| {engine} | {rss[engine]:.0f} |")
        console.append(f"{engine:12s} peak RSS {rss[engine]:.0f} MB")
    print("\n".join(console))
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text("\n".join(lines) + "\n", "utf-8")
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
