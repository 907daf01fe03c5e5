"""The portable wheel (FUN_ASR_PORTABLE=ON) against the build in this environment, side by side, and on an AVX2-only
CPU under emulation.

    python tools/portable_check.py --wheel dist/fun_asr-*.whl [--model full-q8_0.gguf] [--repeats 3] [--no-build]
    python tools/portable_check.py --build                       # builds the wheel first (~10 min on 2 cores)

1. installs the wheel into a fresh virtual environment (timed), with its dependencies from the package index;
2. `fun-asr-transcribe -m demo examples/demo_1.wav` there (timed: the first transcription after the install);
3. the same clip under `qemu-x86_64 -cpu Haswell` (Debian's qemu-user): ggml must pick its AVX2 variant and
   fun-asr's kernels their AVX2 copies; an AVX-512 instruction would stop it with SIGILL;
4. with ``--model``: a 10 s clip through that model (encode ms, decode ms per token) with this environment's build
   and with the wheel, alternating, ``--repeats`` times each, and the ratio.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

MEASURE = r"""
import json, sys, time
import numpy as np
import fun_asr
s = fun_asr.Session(sys.argv[1], device="cpu", threads=int(sys.argv[2]), vad=None, progress=False)
rng = np.random.default_rng(0)
t = np.arange(160000) / 16000
x = (0.3 * np.sin(2 * np.pi * 220 * t) + 0.05 * rng.standard_normal(t.size)).astype(np.float32)
s.transcribe(x[:16000], sample_rate=16000, max_new_tokens=4, ignore_eos=True)
t0 = time.perf_counter()
r = s.transcribe(x, sample_rate=16000, max_new_tokens=40, ignore_eos=True)
wall = (time.perf_counter() - t0) * 1e3
tokens = sum(len(seg.tokens) for seg in r.segments)
print(json.dumps({"total_ms": wall, "encode_ms": r.timings["encode_ms"],
                  "decode_ms_per_token": r.timings["decode_ms"] / max(1, tokens),
                  "cpu": [k for k, v in fun_asr.system_info()["cpu_features"].items() if v == "1"]}))
"""


def run(cmd: list[str], **kw) -> subprocess.CompletedProcess:  # noqa: ANN003
    return subprocess.run(cmd, capture_output=True, text=True, **kw)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--wheel", type=Path, help="the portable wheel (default: build one with --build)")
    ap.add_argument("--build", action="store_true", help="pip wheel . with FUN_ASR_PORTABLE=ON first")
    ap.add_argument("--model", type=Path, help="a full-size .gguf for the speed comparison")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--work", type=Path, default=Path(tempfile.gettempdir()) / "fun-asr-portable")
    args = ap.parse_args()
    args.work.mkdir(parents=True, exist_ok=True)
    report: dict[str, object] = {"date": time.strftime("%Y-%m-%d")}
    wheel = args.wheel
    if args.build:
        t0 = time.perf_counter()
        out = args.work / "wheel"
        shutil.rmtree(out, ignore_errors=True)
        r = run([sys.executable, "-m", "pip", "wheel", str(ROOT), "--no-build-isolation", "--no-deps", "-w", str(out),
                 "-C", "cmake.define.FUN_ASR_PORTABLE=ON", "-C", "build-dir=build/portable"], cwd=ROOT)
        if r.returncode:
            sys.exit(f"portable_check: the wheel did not build:\n{r.stdout[-3000:]}\n{r.stderr[-3000:]}")
        report["build_s"] = round(time.perf_counter() - t0, 1)
        wheel = next(out.glob("fun_asr-*.whl"))
    if wheel is None:
        sys.exit("portable_check: give --wheel WHEEL or --build")
    report["wheel"] = wheel.name
    report["wheel_mb"] = round(wheel.stat().st_size / 1e6, 1)
    venv = args.work / "venv"
    shutil.rmtree(venv, ignore_errors=True)
    run([sys.executable, "-m", "venv", str(venv)], check=True)
    py = venv / "bin" / "python"
    t0 = time.perf_counter()
    r = run([str(py), "-m", "pip", "install", "-q", str(wheel)])
    if r.returncode:
        sys.exit(f"portable_check: the wheel did not install:\n{r.stderr[-3000:]}")
    report["install_s"] = round(time.perf_counter() - t0, 1)
    clip = ROOT / "examples" / "demo_1.wav"
    expected = dict(line.split(None, 1) for line in (ROOT / "examples" / "demo.txt").read_text().splitlines())
    t0 = time.perf_counter()
    r = run([str(venv / "bin" / "fun-asr-transcribe"), "-m", "demo", str(clip)], cwd=args.work)
    report["first_transcription_s"] = round(time.perf_counter() - t0, 2)
    report["demo_text"] = r.stdout.strip()
    report["demo_ok"] = r.returncode == 0 and r.stdout.strip() == expected["demo_1"].strip()
    qemu = shutil.which("qemu-x86_64")
    if qemu:
        code = ("import fun_asr; s = fun_asr.Session('demo', device='cpu', vad=None, progress=False); "
                f"print(s.transcribe({str(clip)!r}).text); "
                "print([k for k, v in fun_asr.system_info()['cpu_features'].items() if v == '1'])")
        r = run([qemu, "-cpu", "Haswell", str(py), "-c", code], cwd=args.work)
        lines = r.stdout.strip().splitlines()
        report["haswell_returncode"] = r.returncode
        report["haswell_text"] = lines[0] if lines else ""
        report["haswell_ggml_features"] = lines[1] if len(lines) > 1 else ""
        report["haswell_ok"] = r.returncode == 0 and bool(lines) and lines[0] == expected["demo_1"].strip()
    else:
        report["haswell_ok"] = None  # no qemu-user here (Debian: apt-get install qemu-user)
    if args.model:
        rows: dict[str, list[dict]] = {"this build": [], "portable wheel": []}
        for _ in range(args.repeats):
            for name, python in (("this build", sys.executable), ("portable wheel", str(py))):
                env = dict(os.environ, PYTHONPATH="")
                r = run([python, "-c", MEASURE, str(args.model), str(args.threads)], cwd=args.work, env=env)
                if r.returncode:
                    sys.exit(f"portable_check: measuring with {name} failed:\n{r.stderr[-3000:]}")
                rows[name].append(json.loads(r.stdout.strip().splitlines()[-1]))
        best = {name: {k: min(x[k] for x in runs) for k in ("total_ms", "encode_ms", "decode_ms_per_token")}
                for name, runs in rows.items()}
        report["speed"] = best
        report["speed_ratio_portable_over_native"] = {
            k: round(best["portable wheel"][k] / best["this build"][k], 3) for k in best["this build"]}
    print(json.dumps(report, indent=1))
    ok = report["demo_ok"] and report["haswell_ok"] is not False
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
