#!/usr/bin/env python3
"""What speaker labels cost: the share of diarization in the whole pipeline, side by side in one run.

    python tools/bench_diarization.py [--minutes 10] [--type q4_k_m] [--speaker-type f32] [--repeats 1]
                                      [--threads 0] [--work /tmp/fun-asr-bench] [--out docs/diarization_bench.md]
    python tools/bench_diarization.py --smoke     # the tiny models, 1 minute: keeps the harness from rotting

A ``--minutes`` recording of 3 held-out espeak-ng speakers (tests/speaker_fixture.py conversations put end to
end), the full-size random Fun-ASR-Nano (830M, ``--type``) behind the real FSMN-VAD, and the full-size random
CAM++ (the released model's config: 192-dim embeddings, growth 32, 128 initial channels). Each repeat transcribes
the recording without and with ``diarize=True`` (alternating); random weights rarely emit EOS, so every segment
decodes exactly ``--tokens`` tokens (the benchmark-only ignore_eos switch), like tools/bench.py. Prints and writes
the medians: total seconds each way, the speaker stage's own time (windows -> CAM++ -> clustering, from
``timings["speaker_ms"]``) and its share of the diarized total. FunASR's own (its guide: RTFx 102 -> 46 with
speakers on) is the comparison.
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tools"))
sys.path.insert(0, str(ROOT / "tests"))

import fun_asr  # noqa: E402
from fun_asr import _core  # noqa: E402

RATE = 16000


def recording(minutes: float, speakers: int = 3) -> tuple[np.ndarray, int]:
    """Conversations of the same ``speakers`` held-out voices set end to end up to ``minutes``."""
    import speaker_fixture

    parts, seconds, seed = [], 0.0, 5000
    while seconds < minutes * 60:
        x, _ = speaker_fixture.make_conversation(seed, speakers, min_s=50.0, max_s=60.0)
        parts.append(x)
        seconds += x.size / RATE
        seed += 1
    x = np.concatenate(parts)[: int(minutes * 60 * RATE)]
    return x, len(parts)


def models(work: Path, asr_type: str, speaker_type: str, smoke: bool) -> tuple[Path, Path]:
    from fun_asr.converter.speaker import convert_speaker
    from make_campplus_checkpoint import make_campplus_checkpoint
    from make_random_checkpoint import make_checkpoint

    size = "tiny" if smoke else "full"
    work.mkdir(parents=True, exist_ok=True)
    gguf = work / f"nano-{size}-{asr_type}.gguf"
    if not gguf.is_file():
        ckpt = work / f"nano-{size}-ckpt"
        if not (ckpt / "config.json").is_file():
            make_checkpoint(ckpt, size=size)
        fun_asr.convert(ckpt, gguf, asr_type, progress=False, overwrite=True)
    spk = work / f"campplus-{size}-{speaker_type}.gguf"
    if not spk.is_file():
        folder = make_campplus_checkpoint(work / f"campplus-{size}", config=size)
        convert_speaker(folder, spk, speaker_type, overwrite=True)
    return gguf, spk


def main() -> None:
    import warnings

    warnings.simplefilter("ignore")
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--minutes", type=float, default=10.0)
    ap.add_argument("--type", default="q4_k_m", help="the ASR package type (default q4_k_m)")
    ap.add_argument("--speaker-type", default="f32", choices=["f32", "f16"])
    ap.add_argument("--tokens", type=int, default=40, help="tokens decoded per segment (default 40)")
    ap.add_argument("--repeats", type=int, default=1)
    ap.add_argument("--threads", type=int, default=0)
    ap.add_argument("--work", default="/tmp/fun-asr-bench")
    ap.add_argument("--out", default=str(ROOT / "docs" / "diarization_bench.md"))
    ap.add_argument("--smoke", action="store_true", help="tiny models, 1 minute, 1 repeat, nothing written")
    args = ap.parse_args()
    if args.smoke:
        args.minutes, args.repeats = 1.0, 1
    from vad_fixture import fsmn_vad_dir

    gguf, spk = models(Path(args.work), args.type, args.speaker_type, args.smoke)
    x, n_conv = recording(args.minutes)
    s = fun_asr.Session(gguf, device="cpu", threads=args.threads, vad="fsmn", vad_model=fsmn_vad_dir(),
                        progress=False, speaker_model=spk)
    kw = {"sample_rate": RATE, "max_new_tokens": args.tokens, "ignore_eos": True, "repetition_guard": False}
    s.transcribe(x[: 10 * RATE], diarize=True, **kw)  # warm-up
    plain, diar, spk_s, found = [], [], [], None
    for _ in range(args.repeats):
        t0 = time.perf_counter()
        r0 = s.transcribe(x, dynamic_silence=False, **kw)  # the VAD mode diarize=True runs in: the same segments
        plain.append(time.perf_counter() - t0)
        t0 = time.perf_counter()
        r1 = s.transcribe(x, diarize=True, **kw)
        diar.append(time.perf_counter() - t0)
        spk_s.append(r1.timings["speaker_ms"] / 1e3)
        found = r1.num_speakers
        # speakers change no words (a segment two speakers share is only cut in two)
        assert "".join(r0.text.split()) == "".join(r1.text.split())
        print({k: v for k, v in r1.timings.items() if k.endswith("_ms")}, file=sys.stderr)
    p, d, k = statistics.median(plain), statistics.median(diar), statistics.median(spk_s)
    audio = x.size / RATE
    from fun_asr.speakers.timeline import sv_chunk

    windows = len(sv_chunk([(g.start, g.end, np.zeros(int(round((g.end - g.start) * RATE)), np.float32))
                            for g in r0.segments]))
    cpu = platform.processor() or platform.machine()
    size = "tiny (--smoke)" if args.smoke else "full-size"
    lines = [
        "# Speaker diarization: what it costs",
        "",
        f"Generated by `python tools/bench_diarization.py` on {cpu}, {os.cpu_count()} cores (threads "
        f"{args.threads or 'all'}), ggml {_core.system_info()['ggml_version']}: a {audio / 60:.1f}-minute recording "
        f"of 3 held-out espeak-ng voices ({n_conv} synthetic conversations end to end), the {size} random "
        f"Fun-ASR-Nano `{args.type}` behind the real FSMN-VAD ({len(r0.segments)} segments, {args.tokens} tokens "
        f"each; {len(r1.segments)} after cutting the segments two speakers share), the {size} random CAM++ "
        f"`{args.speaker_type}` ({windows} windows of 1.5 s); medians of {args.repeats}.",
        "",
        "| run | seconds | × real time |",
        "|---|---|---|",
        f"| transcribe (dynamic_silence=False: the segments diarize=True uses) | {p:.1f} | {audio / p:.1f}× |",
        f"| transcribe, diarize=True | {d:.1f} | {audio / d:.1f}× |",
        f"| of which the speaker stage (windows, CAM++, clustering) | {k:.2f} | {audio / k:.0f}× |",
        "",
        f"**Diarization's share of the pipeline: {100 * k / d:.1f} %** of the diarized run's time (by the wall "
        f"clock, diarized vs plain: {100 * (d - p) / d:+.1f} %). FunASR's guide: RTFx 102 without speakers, 46 "
        f"with (diarization {100 * (1 - 46 / 102):.0f} % of its pipeline). Speakers found: {found} (random weights: "
        "the count says nothing here; quality is measured on the trained tiny CAM++, docs/diarization.md).",
    ]
    text = "\n".join(lines) + "\n"
    print(text)
    if not args.smoke:
        Path(args.out).write_text(text, "utf-8")


if __name__ == "__main__":
    main()
