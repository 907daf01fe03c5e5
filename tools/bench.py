#!/usr/bin/env python3
"""fun-asr vs Transformers 5.23 (F32) on the full-size 830M model, side by side in one run.

    python tools/bench.py [--types f16,q8_0,q4_k_m] [--clips 5,10,30] [--tokens 40] [--repeats 3]
                          [--threads 0] [--work /tmp/fun-asr-bench] [--out docs/benchmarks.md]
    python tools/bench.py --smoke          # tiny model, 1 repeat: keeps the harness from rotting (CI)
    python tools/bench.py --contention [--busy 1] [--types q8_0,q4_k_m]
                                           # shared CPU: quiet vs beside busy processes, threads = all
                                           # cores, 1 and 0 (auto); Transformers F32 too (docs/contention.md)
    python tools/bench.py --batch-split [--device cpu|cuda] [--types q8_0] [--batch-files 64]
                                           # continuous batching at batch sizes 1, 8, 16, 64 (each clip its
                                           # own token count) and where a decode step goes (tools/batch_split.py;
                                           # docs/benchmarks_batch.md)
    python tools/bench.py --vad-only --vad-model DIR_OR_GGUF [--pipeline-model GGUF]
                                           # FSMN-VAD speed on a 10-minute clip (1 thread), vs the numpy
                                           # reference and FunASR's torch AutoModel; VAD share of a pipeline

Random weights rarely emit EOS, so both engines decode exactly --tokens tokens per clip (the
benchmark-only ignore_eos switch). Engines alternate per repeat; medians are reported. Also measured
in the same run: memory read bandwidth (all threads, before and after the runs; and 1 thread) -> the
bandwidth limit per decoded token (decoder weight bytes read per token / the better probe); ggml's own
matmul speed on the encoder's shapes -> the encoder's matmul bound; peak RSS of a fresh process
transcribing the 10 s clip.
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
from fun_asr.audio.frontend import FrontendConfig, fake_token_len, features  # noqa: E402
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
    """Bytes/s of reading a large array, split across threads: the best of numpy's sum (numpy releases
    the GIL) and a plain C++ read loop in fun-asr's extension - each is a lower bound on the machine's
    limit, so the higher one is the honest limit to compare decode against."""
    native = _core.read_bandwidth(mb, threads=threads, repeats=5)
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
    return max(best, native)


def decoder_bytes_per_token(gguf_path: Path) -> int:
    import gguf

    total = 0
    for t in gguf.GGUFReader(gguf_path).tensors:
        if t.name.startswith("blk.") or t.name in ("output.weight", "output_norm.weight"):
            total += int(t.n_bytes)
        elif t.name == "token_embd.weight":
            total += int(t.n_bytes)  # tied: the output projection reads the whole matrix
    return total


def decoder_macs_per_token(gguf_path: Path) -> int:
    """Multiply-adds of one decode step of one sequence: every decoder matrix once, and the output
    projection (the tied token_embd where the file has no output.weight)."""
    import gguf

    tensors = {t.name: t for t in gguf.GGUFReader(gguf_path).tensors}
    total = 0
    for name, t in tensors.items():
        if name.startswith("blk.") and name.endswith(".weight") and len(t.shape) == 2:
            total += int(t.shape[0]) * int(t.shape[1])
    out = tensors.get("output.weight", tensors.get("token_embd.weight"))
    if out is not None:
        total += int(out.shape[0]) * int(out.shape[1])
    return total


def encoder_matmul_bound_ms(model: fun_asr._core.Model, types: dict[str, str], T: int, threads: int) -> float:
    """Sum of the best matmul time (ggml's mul_mat or fun-asr's AMX GEMM, whichever is faster on the
    shape) for every matrix of the encoder + adaptor at T frames."""
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
        if key not in cache:  # the best of ggml's mul_mat and fun-asr's own GEMMs (AMX, int8) on this shape
            cache[key] = min(_core.bench_matmul(key[0], n, k, T, threads=threads, repeats=5, path=path)
                             for path in ("ggml", "encoder"))
        total += cache[key] * count
    return total


def torch_matmul_gflops(n: int, k: int, m: int, threads: int) -> float:
    """What PyTorch's F32 GEMM reaches on one encoder shape (the reference's compute speed)."""
    import torch

    torch.set_num_threads(threads)
    w, x = torch.randn(n, k), torch.randn(k, m)
    w @ x
    times = []
    for _ in range(10):
        t0 = time.perf_counter()
        w @ x
        times.append(time.perf_counter() - t0)
    return 2 * n * k * m / statistics.median(times) / 1e9


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


def speech_with_pauses(seconds: float, seed: int = 0) -> np.ndarray:
    """The example clips joined by 0.3-3 s pauses with light noise, `seconds` long (VAD benchmarks)."""
    import soundfile as sf

    rng = np.random.default_rng(seed)
    utts = [sf.read(ROOT / "examples" / f"{n}.wav", dtype="float32")[0] for n in ("en_hello", "zh_weather", "ja_hello")]
    parts, total = [], 0
    while total < seconds * RATE:
        gap = np.zeros(int(RATE * rng.uniform(0.3, 3.0)), np.float32)
        u = utts[int(rng.integers(len(utts)))]
        parts += [gap, u]
        total += gap.size + u.size
    x = np.concatenate(parts)[: int(seconds * RATE)]
    return (x + 0.003 * rng.standard_normal(x.size)).astype(np.float32)


def vad_bench(vad_model: str, pipeline_model: str | None, out: Path, repeats: int, seconds: float = 600.0) -> None:
    """FSMN-VAD on a 10-minute clip, one thread, side by side: native, numpy reference, FunASR torch."""
    from fun_asr.audio.frontend import fbank
    from fun_asr.converter.hub import resolve_vad
    from fun_asr.vad import FsmnVad, detect_segments, frame_decibels

    x = speech_with_pauses(seconds)
    path = resolve_vad(vad_model)
    native = FsmnVad.load(path, threads=1)
    rows: list[tuple[str, float, str]] = []

    def timed(fn) -> tuple[float, object]:  # noqa: ANN001
        best, res = float("inf"), None
        for _ in range(repeats):
            t0 = time.perf_counter()
            res = fn()
            best = min(best, time.perf_counter() - t0)
        return best, res

    t_fb, fb = timed(lambda: fbank(x, FrontendConfig()))
    t_net, probs = timed(lambda: native.clip_silence_probs(fb))
    t_dec, segs = timed(lambda: detect_segments(probs, frame_decibels(x), x.size, native.cfg))
    rows.append(("fbank (kaldi-native-fbank; shared with the ASR frontend)", t_fb, ""))
    rows.append(("VAD network (ggml, 1 thread)", t_net, ""))
    rows.append(("VAD decisions + frame energies (Python)", t_dec, ""))
    rows.append(("**VAD alone** (network + decisions)", t_net + t_dec, f"{len(segs)} segments"))
    rows.append(("VAD with its fbank", t_fb + t_net + t_dec, ""))
    if Path(vad_model).is_dir():
        ref = FsmnVad.from_dir(vad_model)
        t_np, segs_np = timed(lambda: ref.segments(x))
        rows.append(("numpy reference, whole VAD with fbank", t_np, "same segments" if segs_np == segs else
                     "DIFFERENT segments"))
        try:
            sys.path.insert(0, str(ROOT / "tests"))
            import torch

            import funasr_ref  # noqa: PLC0415

            if funasr_ref.funasr_available():
                torch.set_num_threads(1)
                t_fa, segs_fa = timed(lambda: funasr_ref.vad_segments(vad_model, x, max_single_segment_time=30000))
                same = "same segments" if segs_fa == segs else f"{len(segs_fa)} segments (±10 ms: see tests)"
                rows.append(("FunASR 1.4.16 AutoModel (torch, 1 thread), whole VAD with fbank", t_fa, same))
        except ImportError:
            pass
    lines = [
        "# FSMN-VAD speed",
        "",
        f"Generated by `python tools/bench.py --vad-only`: a {seconds / 60:.0f}-minute clip (the example clips "
        "with 0.3-3 s pauses and light noise), one thread everywhere, best of "
        f"{repeats}. Machine: {platform.machine()}, {os.cpu_count()} cores, "
        f"ggml {_core.system_info()['ggml_version']}.",
        "",
        "| stage | seconds | × real time | notes |",
        "|---|---|---|---|",
    ]
    for name, secs, note in rows:
        lines.append(f"| {name} | {secs:.3f} | {seconds / secs:,.0f}× | {note} |")
    if pipeline_model:
        s = fun_asr.Session(pipeline_model, device="cpu", threads=0, vad="fsmn", vad_model=str(path), progress=False)
        r = s.transcribe(x, sample_rate=RATE, max_new_tokens=40, ignore_eos=True, repetition_guard=False)
        t = {k: v / 1e3 for k, v in r.timings.items() if k.endswith("_ms")}
        share = 100 * t["vad_ms"] / t["total_ms"]
        lines += [
            "",
            f"Whole pipeline on the same clip with `{Path(pipeline_model).name}` (all cores, 40 tokens per segment): "
            f"total {t['total_ms']:.1f} s, VAD {t['vad_ms']:.2f} s = **{share:.2f} %** of the total (fbank "
            f"{t['frontend_ms']:.2f} s, shared by VAD and ASR; encode {t['encode_ms']:.1f} s, prefill "
            f"{t['prefill_ms']:.1f} s, decode {t['decode_ms']:.1f} s; {len(r.segments)} segments).",
        ]
    text = "\n".join(lines) + "\n"
    print(text)
    out.write_text(text, "utf-8")


class Busy:
    """`n` processes spinning `while True: pass` (a browser tab, another job) while the block runs."""

    def __init__(self, n: int) -> None:
        self.n, self.procs = n, []

    def __enter__(self) -> Busy:
        self.procs = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(self.n)]
        time.sleep(0.5)  # let them reach the scheduler's steady state
        return self

    def __exit__(self, *exc: object) -> None:
        for p in self.procs:
            p.kill()
        for p in self.procs:
            p.wait()


def contention_bench(ggufs: dict[str, Path], ckpt: Path, cores: int, busy: int, repeats: int, tokens: int,
                     out: Path, with_reference: bool = True) -> None:
    """Quiet vs beside `busy` spinning processes, side by side in one run: each engine and thread count
    runs `repeats` times quiet, then `repeats` times with the busy processes (medians), on the 10 s clip."""
    x = clip(10.0)
    rows: list[tuple[str, str, dict[str, float], dict[str, float], str]] = []

    def measure(run) -> dict[str, float]:  # noqa: ANN001
        rs = [run() for _ in range(repeats)]
        return {k: statistics.median(r[k] for r in rs) for k in rs[0]}

    if with_reference:
        ref = Reference(ckpt, cores)
        ref.run(x, tokens)
        quiet = measure(lambda: ref.run(x, tokens))
        with Busy(busy):
            loaded = measure(lambda: ref.run(x, tokens))
        rows.append(("transformers F32", str(cores), quiet, loaded, ""))
        del ref
    for label, path in ggufs.items():
        for threads in sorted({cores, 1, 0}, key=lambda t: (t == 0, -t)):
            s = fun_asr.Session(path, device="cpu", threads=threads, progress=False, vad=None)
            run_ours(s, x, tokens)
            quiet = measure(lambda s=s: run_ours(s, x, tokens))
            qpick = s.model.thread_choice()["threads"]
            with Busy(busy):
                run_ours(s, x, tokens)  # let threads=0 see the load (as any run after the first does)
                loaded = measure(lambda s=s: run_ours(s, x, tokens))
                bpick = s.model.thread_choice()["threads"]
            note = f"picked {qpick} quiet, {bpick} busy" if threads == 0 else ""
            rows.append((f"fun-asr {label}", "0 (auto)" if threads == 0 else str(threads), quiet, loaded, note))
            print(f"{label} threads={threads}: quiet {quiet['total_ms']:.0f} ms, busy {loaded['total_ms']:.0f} ms "
                  f"({loaded['total_ms'] / quiet['total_ms']:.2f}x) {note}", flush=True)
    best_quiet = {r[0]: min(q["total_ms"] for n, t, q, _, _ in rows if n == r[0]) for r in rows}
    info = _core.system_info()
    lines = [
        "# Shared CPU: quiet vs beside a busy process",
        "",
        f"Generated by `python tools/bench.py --contention --busy {busy}`: full-size random checkpoint, 10 s clip, "
        f"{tokens} tokens (EOS ignored), medians of {repeats}, quiet then beside {busy} process(es) spinning "
        f"`while True: pass`. Machine: {platform.machine()}, {os.cpu_count()} cores, ggml {info['ggml_version']}, "
        f"fun-asr kernels {_core.matvec_isa() or 'ggml only'}, int8 GEMM {_core.int8_gemm_isa() or 'off'} "
        f"(FUN_ASR_MATVEC={os.environ.get('FUN_ASR_MATVEC', '')!r}, "
        f"FUN_ASR_AMX={os.environ.get('FUN_ASR_AMX', '')!r}), "
        f"GOMP_SPINCOUNT={os.environ.get('GOMP_SPINCOUNT')}.",
        "",
        "Slowdown = busy / quiet of the same row; vs best quiet = busy / the engine's fastest quiet row "
        "(what a user who tuned threads on a quiet machine sees once the machine is shared).",
        "",
        "| engine | threads | quiet ms | busy ms | slowdown | vs best quiet | decode ms/token quiet / busy | "
        "encoder ms quiet / busy | note |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for name, threads, q, b, note in rows:
        dq, db = q["decode_ms"] / max(tokens - 1, 1), b["decode_ms"] / max(tokens - 1, 1)
        lines.append(f"| {name} | {threads} | {q['total_ms']:.0f} | {b['total_ms']:.0f} | "
                     f"{b['total_ms'] / q['total_ms']:.2f}x | {b['total_ms'] / best_quiet[name]:.2f}x | "
                     f"{dq:.1f} / {db:.1f} | {q['encode_ms']:.0f} / {b['encode_ms']:.0f} | {note} |")
    text = "\n".join(lines) + "\n"
    print(text)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(text, "utf-8")
    print(f"wrote {out}")


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
    ap.add_argument("--profile", action="store_true", help="add a per-node profile per type (where time goes)")
    ap.add_argument("--wer", action="store_true",
                    help="add the held-out WER per package type of the tiny model trained here "
                         "(tests/data/tiny_trained)")
    ap.add_argument("--contention", action="store_true",
                    help="shared CPU: quiet vs beside --busy spinning processes (docs/contention.md)")
    ap.add_argument("--busy", type=int, default=1, help="with --contention: busy processes beside the run")
    ap.add_argument("--no-reference", action="store_true", help="with --contention: skip Transformers")
    ap.add_argument("--device", default=None,
                    help="cuda / cuda:N: the GPU benchmark (latency, transcribe_batch RTFx, GPU memory) instead")
    ap.add_argument("--gpu", action="store_true", help="the GPU benchmark on --device (default cuda; cpu: smoke test)")
    ap.add_argument("--batch-files", type=int, default=64, help="with --device cuda: clips of 5-29.5 s")
    ap.add_argument("--batch-sizes", default=None, help="with --device cuda (default 16,64) or --batch-split "
                                                            "(default 1,8,16,64)")
    ap.add_argument("--batch-split", action="store_true",
                    help="continuous-batching throughput and the decode step's split (docs/benchmarks_batch.md)")
    ap.add_argument("--tokens-per-second", type=float, default=4.0, help="with --device cuda: batch decode length")
    ap.add_argument("--vad-only", action="store_true", help="only the FSMN-VAD benchmark (docs/vad_benchmarks.md)")
    ap.add_argument("--vad-model", default=None, help="FSMN-VAD: FunASR folder, .gguf or hub id (funasr/fsmn-vad)")
    ap.add_argument("--pipeline-model", default=None, help="with --vad-only: a GGUF to time the whole pipeline with")
    ap.add_argument("--vad-seconds", type=float, default=600.0, help="with --vad-only: clip length (default 600)")
    args = ap.parse_args()
    if args.vad_only:
        default_out = str(ROOT / "docs" / "benchmarks.md")
        out = Path(args.out) if args.out != default_out else ROOT / "docs" / "vad_benchmarks.md"
        vad_bench(args.vad_model or "funasr/fsmn-vad", args.pipeline_model, out, max(1, args.repeats),
                  args.vad_seconds)
        return
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
    for label in types:  # "q4_k_m" or "q4_k_m/enc=q8_0" (a package with another encoder type)
        package, _, enc = label.partition("/enc=")
        ggufs[label] = work / (f"{size}-{package}.gguf" if not enc else f"{size}-{package}-enc-{enc}.gguf")
        if not ggufs[label].is_file():
            print(f"converting {label} ...", flush=True)
            fun_asr.convert(ckpt, ggufs[label], package, progress=False, encoder_type=enc or None)

    if args.batch_split:
        from batch_split import batch_split_bench

        device = args.device or "cpu"
        sizes = [int(b) for b in (args.batch_sizes or ("1,3" if args.smoke else "1,8,16,64")).split(",")]
        files = 6 if args.smoke else args.batch_files
        lines = [f"# Continuous batching and the decode step's split on {device}", "",
                 f"Generated by `python tools/bench.py --batch-split --device {device} --types {args.types} "
                 f"--batch-files {files}` on {time.strftime('%Y-%m-%d')}: full-size random checkpoint"
                 f"{' (tiny: --smoke)' if args.smoke else ''}; {platform.machine()}, {threads} threads; ggml "
                 f"{_core.system_info()['ggml_version']}.", ""]
        for label in types:
            lines += batch_split_bench(ggufs[label], device, threads, files, sizes, args.tokens_per_second, label)
            lines.append("")
        default_out = str(ROOT / "docs" / "benchmarks.md")
        out = Path(args.out) if args.out != default_out else ROOT / "docs" / "benchmarks_batch.md"
        out.write_text("\n".join(lines), "utf-8")
        print("\n".join(lines))
        print(f"wrote {out}")
        return
    if args.batch_sizes is None:
        args.batch_sizes = "16,64"
    gpu_mode = args.gpu or args.device not in (None, "cpu")
    if args.smoke and gpu_mode:
        args.batch_files, args.batch_sizes = 3, "1,3"
    if gpu_mode:
        default_out = str(ROOT / "docs" / "benchmarks.md")
        out = Path(args.out) if args.out != default_out else ROOT / "docs" / "benchmarks_cuda.md"
        gpu_bench(ggufs, args.device or "cuda", args.repeats, args.tokens, out, args.batch_files,
                  [int(b) for b in args.batch_sizes.split(",")], args.tokens_per_second, threads)
        return
    if args.contention:
        default_out = str(ROOT / "docs" / "benchmarks.md")
        out = Path(args.out) if args.out != default_out else ROOT / "docs" / "contention.md"
        contention_bench(ggufs, ckpt, threads, args.busy, args.repeats, args.tokens, out,
                         with_reference=not args.no_reference)
        return
    # The probe before the runs and after them, and with 1 thread: some VMs switch between memory speeds (a
    # slow mode where the second thread reads little more than the first), and a single probe can miss it.
    bw_before = read_bandwidth(threads)
    bw_one = read_bandwidth(1) if threads > 1 else bw_before
    ref = Reference(ckpt, threads)
    sessions = {p: fun_asr.Session(ggufs[p], device="cpu", threads=threads, progress=False, vad=None) for p in types}
    clips = {float(s): clip(float(s)) for s in args.clips.split(",")}
    results: dict[tuple[str, float], list[dict[str, float]]] = {}
    for _rep in range(args.repeats):
        for secs, samples in clips.items():
            results.setdefault(("transformers", secs), []).append(ref.run(samples, args.tokens))
            for p in types:
                results.setdefault((p, secs), []).append(run_ours(sessions[p], samples, args.tokens))
        print(f"repeat {_rep + 1}/{args.repeats} done", flush=True)

    bw_after = read_bandwidth(threads)
    bandwidth = max(bw_before, bw_after)
    print(f"memory read bandwidth: {bw_before / 1e9:.1f} GB/s before the runs, {bw_after / 1e9:.1f} after, "
          f"{bw_one / 1e9:.1f} with 1 thread", flush=True)

    # Batching: 8 different 5 s clips, one by one vs transcribe_batch (same options, same tokens).
    batch_type = "q8_0" if "q8_0" in types else types[0]
    rng = np.random.default_rng(0)
    base = clip(5.0)
    eight = [np.roll(base, int(rng.integers(1, len(base)))) * float(rng.uniform(0.5, 1.0)) for _ in range(8)]
    kw = dict(sample_rate=RATE, max_new_tokens=args.tokens, ignore_eos=True, repetition_guard=False)
    s_b = sessions[batch_type]
    one_ms, batch_ms = [], []
    batch_parts: list[dict[str, float]] = []
    for _rep in range(max(1, args.repeats - 1)):
        t0 = time.perf_counter()
        singles = [s_b.transcribe(c, **kw) for c in eight]
        one_ms.append((time.perf_counter() - t0) * 1e3)
        t0 = time.perf_counter()
        batched = s_b.transcribe_batch(eight, batch_size=8, **kw)
        batch_ms.append((time.perf_counter() - t0) * 1e3)
        assert [r.segments[0].tokens for r in singles] == [r.segments[0].tokens for r in batched]
        gen = s_b.model.last_generation()  # the batch's one generate_batch (8 clips, one segment each)
        batch_parts.append({"frontend_ms": sum(r.timings["frontend_ms"] for r in batched),
                            "encode_ms": sum(r.timings["encode_ms"] for r in batched),
                            "prefill_ms": gen["prefill_ms"], "decode_ms": gen["decode_ms"]})

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

    enc_shape = (2048, 512, T10)  # the encoder's FFN up-projection at the 10 s clip
    torch_gflops = torch_matmul_gflops(*enc_shape, threads)
    def enc_type(label: str) -> str:  # the type of the encoder's FFN matrices in a package
        package, _, enc = label.partition("/enc=")
        return enc or {"q4_k_m": "q4_k"}.get(package, package)

    flop = 2 * enc_shape[0] * enc_shape[1] * enc_shape[2] / 1e6
    ggml_gflops = {p: flop / _core.bench_matmul(enc_type(p), *enc_shape, threads=threads, repeats=10) for p in types}
    ours_gflops = {p: flop / _core.bench_matmul(enc_type(p), *enc_shape, threads=threads, repeats=10, path="encoder")
                   for p in types}

    info = _core.system_info()
    lines = [
        "# Benchmarks: fun-asr vs Transformers 5.23 (F32)",
        "",
        f"Generated by `python tools/bench.py{' --smoke' if args.smoke else ''}`: {size} random checkpoint, "
        f"{args.tokens} generated tokens per clip (EOS ignored), {args.repeats} alternating repeats, medians, "
        f"{threads} threads for both engines. Machine: {platform.machine()}, {os.cpu_count()} cores, "
        f"ggml {info['ggml_version']} ({', '.join(k for k, v in info['cpu_features'].items() if v == '1')}), "
        f"fun-asr kernels {_core.matvec_isa() or 'ggml only'}, int8 GEMM {_core.int8_gemm_isa() or 'off'}, "
        "environment: "
        + (", ".join(f"{k}={os.environ[k]}" for k in ("FUN_ASR_MATVEC", "FUN_ASR_AMX", "FUN_ASR_GEMM", "FUN_ASR_ATTN",
                                                     "ATEN_CPU_CAPABILITY", "MKL_ENABLE_INSTRUCTIONS", "GOMP_SPINCOUNT")
                    if k in os.environ)
           or "none set") + ". "
        f"Memory read bandwidth measured in the same run: {bandwidth / 1e9:.1f} GB/s (the better of a probe "
        f"before the runs, {bw_before / 1e9:.1f} GB/s, and one after them, {bw_after / 1e9:.1f} GB/s; "
        f"1 thread: {bw_one / 1e9:.1f} GB/s).",
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
        f"## Encoder vs the best matmul on the same shapes ({ten:g} s clip, T_lfr={T10})",
        "",
        "Per shape the faster of ggml's mul_mat and fun-asr's encoder GEMM (AMX for Q8_0 where the CPU has it, "
        "else the int8 GEMM for Q8_0 / Q4_K / Q6_K on AVX2).",
        "",
        "| type | encoder+adaptor ms | sum of best matmul ms (same shapes) | ratio |",
        "|---|---|---|---|",
    ]
    for p in types:
        enc = med(p, ten, "encode_ms")
        lines.append(f"| {p} | {enc:.0f} | {bounds[p]:.0f} | {enc / bounds[p]:.2f} |")
        console.append(f"{p:12s} encoder {enc:.0f} ms vs matmul bound {bounds[p]:.0f} ms: ratio {enc / bounds[p]:.2f}")
    targets = {"q8_0": 5.6, "q4_k_m": 7.0}  # 1.5x the best peer measured beside us
    lines += [
        "",
        f"## Targets ({ten:g} s clip, {args.tokens} tokens)",
        "",
        f"Compute speed on the encoder's FFN shape {enc_shape[0]}x{enc_shape[1]} x {enc_shape[2]} frames: PyTorch F32 "
        f"GEMM {torch_gflops:.0f} GFLOP/s; ggml " + ", ".join(f"{p} {g:.0f}" for p, g in ggml_gflops.items()) +
        " GFLOP/s; the path fun-asr takes (AMX for Q8_0 where available, else the int8 GEMM) " +
        ", ".join(f"{p} {g:.0f}" for p, g in ours_gflops.items()) +
        " GFLOP/s. Best case below = frontend + encoder at the best matmul speed + measured prefill + every token "
        "at the bandwidth limit: what this runtime could reach on this machine with perfect overlap of everything "
        "else.",
        "",
        "| type | measured vs Transformers | target | best case ms | best-case ratio | decode / limit |",
        "|---|---|---|---|---|---|",
    ]
    ref_ten = med("transformers", ten, "total_ms")
    for p in types:
        best = (med(p, ten, "frontend_ms") + bounds[p] + med(p, ten, "prefill_ms") + args.tokens * limits[p])
        per_tok = med(p, ten, "decode_ms") / max(args.tokens - 1, 1)
        target = targets.get(p.partition("/enc=")[0], 0)
        lines.append(f"| {p} | {ref_ten / med(p, ten, 'total_ms'):.2f}x | {target:g}x | {best:.0f} | "
                     f"{ref_ten / best:.2f}x | {per_tok / limits[p]:.2f} |")
        console.append(f"{p:12s} best case {best:.0f} ms -> {ref_ten / best:.2f}x (target {target:g}x)")
    one, many = statistics.median(one_ms), statistics.median(batch_ms)
    # What batching can reach here at best: it leaves the frontend's, encoder's and prefill's work as it is
    # (the same products, one clip or prompt at a time or not), and its decode steps are 8-column products,
    # which on few cores run at a compute rate, not the memory's. Ceiling = one by one / (those three as
    # measured in the batch + the decode's multiply-adds at the fastest rate any matmul path reaches on the
    # decoder's FFN shape with many columns).
    parts = {k: statistics.median(d[k] for d in batch_parts) for k in batch_parts[0]}
    dec = sessions[batch_type].model.info()["decoder"]
    ffn_type = sessions[batch_type].model.info()["tensor_types"]["blk.0.ffn_up.weight"].lower()
    wide = 256
    gemm_ms = min(_core.bench_matmul(ffn_type, dec["ffn"], dec["d_model"], wide, threads=threads, repeats=5, path=path)
                  for path in ("ggml", "frames", "encoder"))
    gemm_rate = dec["ffn"] * dec["d_model"] * wide / gemm_ms * 1e3  # multiply-adds per second
    decode_macs = 8 * max(args.tokens - 1, 0) * decoder_macs_per_token(ggufs[batch_type])
    decode_floor = decode_macs / gemm_rate * 1e3
    fixed = parts["frontend_ms"] + parts["encode_ms"] + parts["prefill_ms"]
    ceiling = one / (fixed + decode_floor)
    lines += [
        "",
        f"## Batching ({batch_type}, 8 different 5 s clips, {args.tokens} tokens each)",
        "",
        "| mode | total ms | clips/s | throughput vs one by one |",
        "|---|---|---|---|",
        f"| one by one | {one:.0f} | {8e3 / one:.2f} | 1.00x |",
        f"| transcribe_batch(batch_size=8) | {many:.0f} | {8e3 / many:.2f} | {one / many:.2f}x |",
        "",
        "Token ids were checked identical between the two modes in this run.",
        "",
        f"Where the batch's time goes (medians): frontend {parts['frontend_ms']:.0f} ms, encoder "
        f"{parts['encode_ms']:.0f} ms, prefill {parts['prefill_ms']:.0f} ms, decode {parts['decode_ms']:.0f} ms. "
        f"**Ceiling on this machine: {ceiling:.2f}x** = one by one / (frontend + encoder + prefill as measured "
        f"in the batch, whose work batching leaves unchanged, + the decode's {decode_macs / 1e9:.3g} G "
        f"multiply-adds at {gemm_rate / 1e9:.0f} G/s, the fastest matmul rate here on the decoder's FFN shape "
        f"({dec['ffn']}x{dec['d_model']}, {ffn_type}) with {wide} columns: {decode_floor:.0f} ms).",
    ]
    console.append(f"batching: one by one {one:.0f} ms, batched {many:.0f} ms -> {one / many:.2f}x "
                   f"(ceiling here {ceiling:.2f}x)")
    lines += ["", f"## Peak RSS (fresh process transcribing the {ten:g} s clip)", "", "| engine | peak RSS MB |",
              "|---|---|"]
    for engine in ["transformers", *types]:
        lines.append(f"| {engine} | {rss[engine]:.0f} |")
        console.append(f"{engine:12s} peak RSS {rss[engine]:.0f} MB")
    if args.profile:
        lines += profile_section(sessions, clips[ten], args.tokens)
    if args.wer:
        lines += wer_section(types, work, threads)
    print("\n".join(console))
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text("\n".join(lines) + "\n", "utf-8")
    print(f"wrote {out}")


class GpuMemory:
    """Peak memory in use on GPU `index` (nvidia-smi, every 0.2 s) while the `with` block runs, minus the level
    before."""

    def __init__(self, index: int = 0) -> None:
        self.index = index
        self.base = self.peak = self._used()
        self._stop = threading.Event()

    def _used(self) -> float:
        try:
            r = subprocess.run(["nvidia-smi", "-i", str(self.index), "--query-gpu=memory.used",
                                "--format=csv,noheader,nounits"], capture_output=True, text=True)
        except OSError:
            return float("nan")
        return float(r.stdout.split()[0]) if r.returncode == 0 and r.stdout.strip() else float("nan")

    def _poll(self) -> None:
        while not self._stop.wait(0.2):
            self.peak = max(self.peak, self._used())

    def __enter__(self) -> GpuMemory:
        self._thread = threading.Thread(target=self._poll, daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
        self.peak = max(self.peak, self._used())

    @property
    def mib(self) -> float:
        return self.peak - self.base


def gpu_bench(ggufs: dict[str, Path], device: str, repeats: int, tokens: int, out: Path, files: int,
              batch_sizes: list[int], tokens_per_second: float, cpu_threads: int) -> None:
    """fun-asr on a GPU: one 10 s clip (latency, per stage), then `files` clips of 5-29.5 s through
    transcribe_batch (RTFx = audio seconds / wall seconds) at each batch size, GPU memory, and the same 10 s clip
    on this machine's CPU (time, and how many leading tokens agree with the GPU's: random weights have nearly
    flat logits, so this is a sanity figure, not the parity test - that is tests/test_model_parity.py)."""
    info = _core.system_info()
    gpus = [d for d in info["devices"] if d["type"] == "gpu"]
    gpu_index = int(device.partition(":")[2] or 0)
    rng = np.random.default_rng(0)
    durations = sorted(float(d) for d in rng.uniform(5.0, 29.5, files))
    base = clip(30.0)
    corpus = [np.roll(base, int(rng.integers(1, len(base))))[: int(d * RATE)] * float(rng.uniform(0.5, 1.0))
              for d in durations]
    audio_s = sum(durations)
    ten = clip(10.0)
    lines = [
        f"# fun-asr on {gpus[gpu_index]['description'] if gpu_index < len(gpus) else device}",
        "",
        f"Generated by `python tools/bench.py --gpu --device {device}` on {time.strftime('%Y-%m-%d')}: full-size "
        f"random checkpoint; {platform.machine()} host with {os.cpu_count()} cores; ggml {info['ggml_version']}. "
        f"Single clip: {tokens} tokens (EOS ignored), 1 warm-up + {repeats} runs, medians. Batch: {files} clips "
        f"of 5-29.5 s ({audio_s:.0f} s of audio), sorted by length and cut into batches; each batch decodes "
        f"ceil({tokens_per_second:g} x its longest clip's seconds) tokens per clip, EOS ignored "
        "(real speech gives ~3-5 tokens per second). GPU memory: nvidia-smi's peak minus the level before the "
        "model was loaded.",
        "",
        "| type | load s | 10 s clip ms | RTFx | encoder ms | prefill ms | decode ms/token | CPU "
        f"({cpu_threads} threads) ms | tokens equal to CPU |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    batch_rows = ["", "| type | batch size | wall s | RTFx (audio s / wall s) | tokens | tokens/s | peak GPU MiB | "
                  "prefill s | decode s | of the decoder passes: graphs s | copies s | compute s | host argmax s |",
                  "|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    kw = dict(sample_rate=RATE, ignore_eos=True, repetition_guard=False)
    for label, path in ggufs.items():
        with GpuMemory(gpu_index) as mem:
            t0 = time.perf_counter()
            s = fun_asr.Session(path, device=device, progress=False, vad=None)
            load_s = time.perf_counter() - t0
            run_ours(s, ten, tokens)  # warm-up: kernels' first launches, cuBLAS handles, graph allocation
            runs = [run_ours(s, ten, tokens) for _ in range(repeats)]
            gpu_tokens = s.transcribe(ten, max_new_tokens=tokens, **kw).segments[0].tokens
            batch = []
            for bs in batch_sizes:
                t0 = time.perf_counter()
                n_tok = 0
                parts = dict.fromkeys(("prefill_ms", "decode_ms", "graph_ms", "transfer_ms", "compute_ms",
                                       "select_ms"), 0.0)
                for i in range(0, files, bs):
                    group = corpus[i:i + bs]
                    new = int(np.ceil(tokens_per_second * durations[min(i + bs, files) - 1]))
                    res = s.transcribe_batch(group, batch_size=bs, max_new_tokens=new, **kw)
                    n_tok += sum(len(seg.tokens) for r in res for seg in r.segments)
                    gen = s.model.last_generation()  # the group's one generate_batch (one segment per clip)
                    for key in parts:
                        parts[key] += gen[key]
                wall = time.perf_counter() - t0
                batch.append((bs, wall, n_tok, parts))
                print(f"{label} batch {bs}: {wall:.2f} s for {audio_s:.0f} s of audio, RTFx {audio_s / wall:.0f}, "
                      f"{n_tok} tokens", flush=True)
        del s
        cpu = fun_asr.Session(path, device="cpu", threads=cpu_threads, progress=False, vad=None)
        t0 = time.perf_counter()
        cpu_tokens = cpu.transcribe(ten, max_new_tokens=tokens, **kw).segments[0].tokens
        cpu_ms = (time.perf_counter() - t0) * 1e3
        del cpu
        agree = next((i for i, (a, b) in enumerate(zip(gpu_tokens, cpu_tokens, strict=True)) if a != b), tokens)

        def med(key: str, runs: list[dict[str, float]] = runs) -> float:
            return statistics.median(r[key] for r in runs)

        per_token = med("decode_ms") / max(tokens - 1, 1)
        lines.append(f"| {label} | {load_s:.1f} | {med('total_ms'):.0f} | {10e3 / med('total_ms'):.0f} | "
                     f"{med('encode_ms'):.1f} | {med('prefill_ms'):.1f} | {per_token:.2f} | "
                     f"{cpu_ms:.0f} | {agree}/{tokens} |")
        for bs, wall, n_tok, parts in batch:
            batch_rows.append(f"| {label} | {bs} | {wall:.2f} | {audio_s / wall:.0f} | {n_tok} | {n_tok / wall:.0f} | "
                              f"{mem.mib:.0f} | " + " | ".join(f"{v / 1e3:.2f}" for v in parts.values()) + " |")
        print(lines[-1], flush=True)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text("\n".join(lines + batch_rows) + "\n", "utf-8")
    print("\n".join(lines + batch_rows))
    print(f"wrote {out}")


def wer_section(types: list[str], work: Path, threads: int) -> list[str]:
    """Accuracy next to speed: the trained tiny model's held-out WER in every package type (random
    weights cannot say whether a quantization keeps accuracy)."""
    sys.path.insert(0, str(ROOT / "tests"))
    import trained_model

    if not (trained_model.ARTIFACT / "manifest.json").is_file():
        return ["", "## WER per type", "", "(tests/data/tiny_trained is missing: no WER)"]
    ckpt = trained_model.trained_checkpoint(work / "trained-ckpt")
    clips = trained_model.heldout_audio()
    refs = [text for _, text in clips]
    lines = ["", "## WER per type (the tiny model trained here, held-out clips)", "",
             f"{len(clips)} held-out clips, {sum(len(trained_model.normalize_text(r)) for r in refs)} words "
             "(docs/trained_model.md).", "", "| type | WER | vs f32 |", "|---|---|---|"]
    base = None
    for package in ["f32", *[t for t in types if t != "f32"]]:
        pkg, _, enc = package.partition("/enc=")
        path = work / (f"trained-{pkg}.gguf" if not enc else f"trained-{pkg}-enc-{enc}.gguf")
        if not path.is_file():
            fun_asr.convert(ckpt, path, pkg, progress=False, encoder_type=enc or None)
        s = fun_asr.Session(path, device="cpu", threads=threads, vad=None, progress=False)
        hyps = [r.text for r in s.transcribe_batch([x for x, _ in clips], sample_rate=RATE, language="en")]
        w = trained_model.wer(refs, hyps)
        base = w if base is None else base
        lines.append(f"| {package} | {100 * w:.2f} % | {100 * (w - base):+.2f} points |")
    print("\n".join(lines))
    return lines


def profile_section(sessions: dict[str, fun_asr.Session], samples: np.ndarray, tokens: int) -> list[str]:
    """Per-node profile (one extra run per type, every node computed and timed on its own): where the
    time goes per stage, and the matmul GFLOP/s per weight kind."""
    lines = ["", "## Per-node profile (`--profile`: one run per type, nodes timed one by one)", ""]
    for p, s in sessions.items():
        s.model.profiling = True
        s.model.reset_profile()
        run_ours(s, samples, tokens)
        prof = s.model.profile()
        s.model.profiling = False
        stages: dict[str, float] = {}
        for key, v in prof.items():
            stages[key.split("/")[0]] = stages.get(key.split("/")[0], 0.0) + v["ms"]
        total = sum(stages.values()) or 1.0
        lines += [f"### {p}", "", "| stage | ms | share |", "|---|---|---|"]
        for k, v in sorted(stages.items(), key=lambda kv: -kv[1]):
            lines.append(f"| {k} | {v:.0f} | {100 * v / total:.0f} % |")
        lines += ["", "| stage/op[/weight] | nodes | ms | GFLOP/s |", "|---|---|---|---|"]
        for key, v in sorted(prof.items(), key=lambda kv: -kv[1]["ms"])[:15]:
            rate = f"{v['flops'] / v['ms'] / 1e6:.1f}" if v["flops"] and v["ms"] else "–"
            lines.append(f"| {key} | {v['count']} | {v['ms']:.1f} | {rate} |")
        lines.append("")
        print("\n".join(lines[-20:]))
    return lines


if __name__ == "__main__":
    main()
