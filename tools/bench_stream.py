#!/usr/bin/env python3
"""How many concurrent real-time streams one machine holds (issue: streaming, "Done when").

    python tools/bench_stream.py --model full-q4_k_m.gguf --vad-model fsmn-vad.gguf [--threads 2]
                                 [--streams 1,2,4,8] [--seconds 40] [--out docs/stream_benchmarks.md]
                                 [--drafts on,off] [--interrupt on,off] [--speculate on,off]

Each stream feeds the same kind of audio (the example clips with 2.6-3 s pauses) in 60 ms chunks paced
at real time, all streams at once, through one Session whose decoding is shared by the server's batcher
(as `fun-asr-serve` does). Reported per stream count (p50/p95 over all sentences): the delay from the
audio that closed a sentence arriving to its event (decoding), from the sentence's speech end arriving to
its event (adds the VAD's end silence), from speech start to the first partial, and whether the run kept
up (close p95 under 1.5 s, feeding never more than 1.5 s behind). Random-weight models never emit EOS, so
every decode runs to its token limit: use --max-new-tokens to mimic real sentence lengths (default 40).
"""

from __future__ import annotations

import argparse
import platform
import sys
import threading
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tools"))

import fun_asr  # noqa: E402
from fun_asr.asr.stream import StreamOptions  # noqa: E402
from fun_asr.serve.core.batcher import Batcher  # noqa: E402


def conversation(seconds: float, seed: int) -> np.ndarray:
    import soundfile as sf

    rng = np.random.default_rng(seed)
    utts = [sf.read(ROOT / "examples" / f"{n}.wav", dtype="float32")[0] for n in ("en_hello", "zh_weather", "ja_hello")]
    parts, total = [], 0
    while total < seconds * 16000:
        gap = (2e-4 * rng.standard_normal(int(16000 * rng.uniform(2.6, 3.2)))).astype(np.float32)
        u = utts[int(rng.integers(len(utts)))]
        parts += [gap, u]
        total += gap.size + u.size
    return np.concatenate(parts)[: int(seconds * 16000)]


def run(session: fun_asr.Session, n: int, seconds: float, max_new: int, partial_batch: int | None = None,
        partial_wait_s: float = 0.5, interrupt: bool = True, speculate: bool = True) -> dict:
    batcher = Batcher(session, max_batch=max(1, n), max_new_tokens=max_new, partial_batch=partial_batch,
                      partial_wait_s=partial_wait_s, interrupt_partials=interrupt)

    drafts = {"decodes": 0, "with_draft": 0, "decode_passes": 0, "draft_proposed": 0, "draft_accepted": 0}
    counting = threading.Lock()  # the streams' threads all count here

    def decoder(audio: np.ndarray, tokens: int, draft: list[int] | None = None,
                partial: bool = False, speculative: bool = False) -> tuple[str, list[int]] | None:
        secs = min(session.max_segment_seconds, max(30.0, audio.size / 16000 + 1.0))
        r = batcher.submit(audio, (None, True, (), tokens, secs, False, False), "bench", draft, partial,
                           speculative).result()
        if r is None:  # a partial the batcher skipped (counted by the stream)
            return None
        with counting:
            drafts["decodes"] += 1
            if "draft_proposed" in r.timings:  # decoded alone, with the stream's previous partial as its draft
                drafts["with_draft"] += 1
                for key in ("decode_passes", "draft_proposed", "draft_accepted"):
                    drafts[key] += int(r.timings[key])
        return r.text, [t for s in r.segments for t in s.tokens]

    streams = [session.stream(max_new_tokens=max_new, decoder=decoder,
                              stream_options=StreamOptions(max_new_tokens=max_new,
                                                           partial_max_new_tokens=min(200, max_new),
                                                           speculate_silence_ms=200 if speculate else 0))
               for _ in range(n)]
    # each stream 0.7 s longer than the one before: streams that all end in the same 60 ms would close their
    # last sentences (cut by the end, no pause to speculate in) together, which real clients do not do
    clips = [conversation(seconds + 0.7 * seed, seed) for seed in range(n)]
    behind = [0.0] * n
    real: list[float] = []

    def feed(i: int) -> None:
        # The chunk ending at sample k has arrived at t0 + k / 16000 (60 ms chunks, real time). Whatever has
        # arrived while the stream was busy is fed in one call, as the server's worker does, so a slow decode
        # costs one stale partial, not one per chunk; `behind` is how late the oldest unfed chunk got.
        t0 = time.perf_counter()
        x, pos = clips[i], 0
        while pos < x.size:
            now = (time.perf_counter() - t0) * 16000
            chunk_end = min(x.size, pos + 960)
            if now < chunk_end:
                time.sleep((chunk_end - now) / 16000)
                continue
            behind[i] = max(behind[i], (now - chunk_end) / 16000)
            end = min(x.size, max(chunk_end, int(now) // 960 * 960))  # all that has fully arrived
            events = streams[i].feed(x[pos:end])
            pos = end
            arrived(events, t0 + end / 16000)
        arrived(streams[i].close(), t0 + x.size / 16000)

    def arrived(events: list, t_audio: float) -> None:
        # real-time close delay: the fed audio's end arrived (at real time) -> the sentence event; adds to
        # `close` the time the stream was still busy (its own partial decode) when that audio arrived
        now = time.perf_counter()
        with counting:
            real.extend((now - t_audio) * 1000 for ev in events if ev.type == "sentence")

    threads = [threading.Thread(target=feed, args=(i,)) for i in range(n)]
    t0 = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    wall = time.perf_counter() - t0
    batcher.close()
    finals = [d for s in streams for d in s._sentence_delays]
    closes = [d for s in streams for d in s._close_delays]
    firsts = [d for s in streams for d in s._first_partial_delays]

    def pct(v: list[float], q: float) -> float:
        return float(np.percentile(v, q)) if v else float("nan")

    return {"streams": n, "wall_s": wall, "sentences": len(finals), "final_p50": pct(finals, 50),
            "final_p95": pct(finals, 95), "close_p50": pct(closes, 50), "close_p95": pct(closes, 95),
            "real_p50": pct(real, 50), "real_p95": pct(real, 95),
            "partial_p50": pct(firsts, 50), "partial_p95": pct(firsts, 95),
            "max_behind_s": max(behind), "partials": sum(s.partials_decoded for s in streams),
            "partials_skipped": sum(s.partials_skipped for s in streams),
            "partials_interrupted": batcher.partials_interrupted,
            "speculated": sum(s.sentences_speculated for s in streams), **drafts}


def main() -> None:
    import warnings

    warnings.simplefilter("ignore")
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", required=True, action="append", help="GGUF (repeat for several)")
    ap.add_argument("--vad-model", required=True)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--streams", default="1,2,4,8")
    ap.add_argument("--seconds", type=float, default=40.0)
    ap.add_argument("--max-new-tokens", type=int, default=40)
    ap.add_argument("--out", default=str(ROOT / "docs" / "stream_benchmarks.md"))
    ap.add_argument("--partial-batch", type=int, default=1,
                    help="the batcher's partial_batch: at most this many partials decoded together (default 1)")
    ap.add_argument("--partial-wait", type=float, default=0.5,
                    help="the batcher's partial_wait_s: a partial queued longer is skipped (default 0.5 s)")
    ap.add_argument("--drafts", default="on", help="on, off, or on,off (both, alternating per stream count): "
                    "the previous partial as a lossless draft of the next decode (the model's draft_max / 0)")
    ap.add_argument("--interrupt", default="on", help="on, off, or on,off: a closed sentence interrupts the "
                    "partials being decoded (the batcher's interrupt_partials; off: it waits for them)")
    ap.add_argument("--speculate", default="on", help="on, off, or on,off: speculative closing decodes in the "
                    "VAD's end silence (StreamOptions.speculate_silence_ms 200 / 0)")
    args = ap.parse_args()
    drafts, interrupts, specs = args.drafts.split(","), args.interrupt.split(","), args.speculate.split(",")
    for name, given in (("--drafts", drafts), ("--interrupt", interrupts), ("--speculate", specs)):
        if not given or any(m not in ("on", "off") for m in given):
            ap.error(f"{name} takes on, off or on,off; got {','.join(given)!r}")
    modes = [(d, i, sp) for sp in specs for d in drafts for i in interrupts]
    lines = ["# Concurrent real-time streams", "",
             f"Generated by `python tools/bench_stream.py`: {args.seconds:g} s per stream (+0.7 s per stream "
             f"after the first, so that they do not all end at once) in 60 ms chunks at real "
             f"time (audio that arrived while a stream was busy is fed at once, as the server does), "
             f"{args.threads} threads, decoding shared by the server's batcher, at most {args.max_new_tokens} tokens "
             f"per decode (random weights never stop early, so every decode is that long). Machine: "
             f"{platform.machine()}, ggml {fun_asr.system_info()['ggml_version']}.", "",
             "Delays in ms: *close* = the audio on which the VAD closed a sentence was fed -> its sentence event "
             "(decoding); *close (real time)* = that audio arrived in real time -> the event (adds the time its "
             "stream was still busy with its own partial decode); *final* = the sentence's speech end arrived -> "
             "its event (adds the VAD's end silence: "
             "FunASR's realtime schedule waits 2 s after a short sentence); *first partial* = speech start arrived "
             "-> first partial. A load holds when the close p95 < 1.5 s and the feeding never fell more than "
             "1.5 s behind.", "",
             f"Partials: the batcher decodes closed sentences first, at most {args.partial_batch} partial(s) "
             f"together, and skips a partial queued longer than {args.partial_wait:g} s (its stream keeps the "
             "previous partial and asks again with newer audio); with *interrupt* on, a closed sentence that "
             "arrives while partials decode interrupts them (they are skipped too) and is decoded at once. "
             "*partials decoded / skipped (interrupted)* counts them. With *speculate* on, a partial 200 ms into "
             "a pause decodes the sentence as the VAD would close it if the pause went on; *speculated* = closed "
             "sentences whose decode that was (no decode when they closed).", "",
             "*drafts*: decodes that went alone with the previous partial as a draft (lossless speculative "
             "decoding; the batcher leaves drafts out of a batch) / all decodes, and the draft tokens kept / "
             "verified.", "",
             "| model | streams | drafts | interrupt | speculate | sentences | speculated | close p50 | close p95 | "
             "close (real time) p50 | p95 | final p50 | final p95 | "
             "first partial p50 | p95 | fell behind by | holds | decodes with a draft | draft tokens kept | "
             "partials decoded / skipped (interrupted) |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for model in args.model:
        session = fun_asr.Session(model, device="cpu", threads=args.threads, vad="fsmn", vad_model=args.vad_model,
                                  progress=False)
        draft_max = session.model.draft_max  # the model's own setting for "on"
        for n in [int(v) for v in args.streams.split(",")]:
            held = False
            for mode, interrupt, spec in modes:
                session.model.draft_max = draft_max if mode == "on" else 0
                r = run(session, n, args.seconds, args.max_new_tokens, args.partial_batch, args.partial_wait,
                        interrupt == "on", spec == "on")
                ok = r["close_p95"] < 1500 and r["max_behind_s"] < 1.5
                held |= ok
                lines.append(f"| {Path(model).name} | {n} | {mode} | {interrupt} | {spec} | {r['sentences']} "
                             f"| {r['speculated']} "
                             f"| {r['close_p50']:.0f} | {r['close_p95']:.0f} "
                             f"| {r['real_p50']:.0f} | {r['real_p95']:.0f} "
                             f"| {r['final_p50']:.0f} | {r['final_p95']:.0f} "
                             f"| {r['partial_p50']:.0f} | {r['partial_p95']:.0f} | {r['max_behind_s']:.2f} s | "
                             f"{'yes' if ok else 'no'} | {r['with_draft']} / {r['decodes']} "
                             f"| {r['draft_accepted']} / {r['draft_proposed']} "
                             f"| {r['partials']} / {r['partials_skipped']} ({r['partials_interrupted']}) |")
                print(lines[-1], flush=True)
            if not held:
                break
    text = "\n".join(lines) + "\n"
    Path(args.out).write_text(text, "utf-8")
    print(text)


if __name__ == "__main__":
    main()
