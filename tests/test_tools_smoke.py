"""The benchmark harness runs in smoke mode (tiny model, one repeat) so it cannot rot. No timing asserted."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

TOOLS = Path(__file__).resolve().parents[1] / "tools"


def test_bench_smoke(tmp_path: Path) -> None:
    out = tmp_path / "bench.md"
    r = subprocess.run([sys.executable, str(TOOLS / "bench.py"), "--smoke", "--work", str(tmp_path / "w"),
                        "--out", str(out)], capture_output=True, text=True, timeout=900)
    assert r.returncode == 0, r.stdout + r.stderr
    table = out.read_text()
    needles = ("| transformers | 5 |", "| q8_0 | 5 |", "bandwidth limit", "matmul", "Peak RSS", "Batching", "best case")
    for needle in needles:
        assert needle in table, needle
