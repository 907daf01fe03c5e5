#!/usr/bin/env python3
"""Peak RSS of fun-asr-transcribe on long recordings (docs/reliability.md, "Long recordings").

    python tools/long_audio_rss.py [--work DIR] [--model M.gguf] [--cases silent10m,silent4h,speech10m,speech1h]

Makes the recordings with sox (silence) and espeak-ng + sox (speech: 40 utterances of the tiny model's
words with pauses, 22.05 kHz, repeated), the tiny trained model's F32 GGUF (tests/data/tiny_trained) and
finds the real FSMN-VAD (tests/vad_fixture.py), then runs each case under ``/usr/bin/time -v``:

    fun-asr-transcribe FILE -m MODEL --device cpu --vad fsmn --vad-model VAD --quiet -f json   (and --vad none)

and prints the peak RSS ("Maximum resident set size") and wall time of each, one JSON line per run.
"""

from __future__ import annotations

import argparse
import json
import random
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))

WORDS = ("zero one two three four five six seven eight nine "
         "yes no up down left right stop go on off").split()
SILENT = {"silent10m": 600, "silent2h": 7200, "silent4h": 14400}
SPEECH = {"speech10m": 600, "speech1h": 3600, "speech4h": 14400}


def _silent(path: Path, seconds: int) -> None:
    subprocess.run(["sox", "-n", "-r", "16000", "-c", "1", "-b", "16", str(path), "trim", "0", str(seconds)],
                   check=True)


def _speech_block(work: Path) -> Path:
    """About two minutes of espeak-ng speech (22.05 kHz mono) with 0.3-1.5 s pauses, made once."""
    block = work / "speech_block.wav"
    if block.is_file():
        return block
    rng = random.Random(0)
    parts = []
    with tempfile.TemporaryDirectory(dir=work) as tmp:
        for i in range(40):
            text = " ".join(rng.choice(WORDS) for _ in range(rng.randint(2, 6)))
            raw = Path(tmp) / f"u{i}.wav"
            subprocess.run(["espeak-ng", "-v", "en-us", "-s", str(rng.randint(130, 180)), "-w", str(raw), text],
                           check=True)
            padded = Path(tmp) / f"p{i}.wav"
            subprocess.run(["sox", str(raw), str(padded), "pad", "0", f"{rng.uniform(0.3, 1.5):.2f}"], check=True)
            parts.append(str(padded))
        subprocess.run(["sox", *parts, str(block)], check=True)
    return block


def _speech(path: Path, seconds: int, work: Path) -> None:
    block = _speech_block(work)
    info = subprocess.run(["soxi", "-D", str(block)], check=True, capture_output=True, text=True)
    repeats = max(0, round(seconds / float(info.stdout)) - 1)
    subprocess.run(["sox", str(block), str(path), "repeat", str(repeats)], check=True)


def _model(work: Path) -> Path:
    gguf = work / "trained-f32.gguf"
    if not gguf.is_file():
        import fun_asr
        import trained_model

        ckpt = trained_model.trained_checkpoint(work / "ckpt")
        fun_asr.convert(ckpt, gguf, "f32", progress=False)
    return gguf


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--work", type=Path, default=Path(tempfile.gettempdir()) / "fun-asr-long-audio")
    ap.add_argument("--model", type=Path, help="GGUF (default: the tiny trained model, built into --work)")
    ap.add_argument("--cases", default="silent10m,silent4h,speech10m,speech1h")
    ap.add_argument("--vad", default="fsmn,none", help="--vad modes to run (fsmn, none)")
    ap.add_argument("--exe", help="the fun-asr-transcribe to measure (default: the one on PATH)")
    args = ap.parse_args()
    from vad_fixture import fsmn_vad_dir

    args.work.mkdir(parents=True, exist_ok=True)
    model = args.model or _model(args.work)
    vad_dir = fsmn_vad_dir()
    exe = args.exe or shutil.which("fun-asr-transcribe") or "fun-asr-transcribe"
    for case in args.cases.split(","):
        path = args.work / f"{case}.wav"
        if not path.is_file():
            if case in SILENT:
                _silent(path, SILENT[case])
            elif case in SPEECH:
                _speech(path, SPEECH[case], args.work)
            else:
                raise SystemExit(f"unknown case {case!r}: {', '.join([*SILENT, *SPEECH])}")
        for mode in args.vad.split(","):
            vad = ["--vad", "fsmn", "--vad-model", str(vad_dir)] if mode == "fsmn" else ["--vad", "none"]
            cmd = ["/usr/bin/time", "-v", exe, str(path), "-m", str(model), "--device", "cpu", *vad, "--quiet",
                   "-f", "json"]
            r = subprocess.run(cmd, capture_output=True, text=True)
            rss = re.search(r"Maximum resident set size \(kbytes\): (\d+)", r.stderr)
            wall = re.search(r"Elapsed \(wall clock\) time \(h:mm:ss or m:ss\): (\S+)", r.stderr)
            out = {"case": case, "vad": mode, "rc": r.returncode,
                   "peak_rss_mb": round(int(rss.group(1)) / 1024, 1) if rss else None,
                   "wall": wall.group(1) if wall else None}
            if r.returncode == 0:
                res = json.loads(r.stdout)
                out.update(duration=res["duration"], segments=len(res["segments"]), words=len(res["text"].split()))
            else:
                out["stderr"] = r.stderr[-500:]
            print(json.dumps(out), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
