"""Every fuzz harness of tools/fuzz/ still starts and fuzzes without a finding for a short budget.

``FUN_ASR_FUZZ_SECONDS`` (default 10) is each harness's time; a longer run is the same command by hand
(``python tools/fuzz/fuzz_<name>.py -max_total_time=600``, see docs/reliability.md). Each run starts from the
harness's seeds in a fresh corpus folder, so CI never depends on what an earlier run found.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
FUZZ = ROOT / "tools" / "fuzz"
HARNESSES = sorted(p.stem[len("fuzz_"):] for p in FUZZ.glob("fuzz_*.py"))
SECONDS = int(os.environ.get("FUN_ASR_FUZZ_SECONDS", "10"))


def test_every_input_kind_has_a_harness() -> None:
    assert set(HARNESSES) >= {"gguf", "safetensors", "torch_pickle", "audio", "upload", "realtime"}


@pytest.mark.parametrize("harness", HARNESSES)
def test_harness_fuzzes_without_findings(harness: str, tmp_path: Path) -> None:
    pytest.importorskip("atheris")
    pytest.importorskip("torch")  # the seeds' models come from tools/make_random_checkpoint.py
    env = {**os.environ, "FUN_ASR_GGML_LOG": ""}
    cmd = [sys.executable, str(FUZZ / f"fuzz_{harness}.py"), f"-max_total_time={SECONDS}",
           "--corpus", str(tmp_path / "corpus"), f"-artifact_prefix={tmp_path}/"]
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=SECONDS + 600)
    out = proc.stdout + proc.stderr
    found = sorted(p.name for p in tmp_path.iterdir() if p.name.startswith(("crash-", "oom-", "timeout-")))
    assert proc.returncode == 0 and not found, f"fuzz_{harness}: rc {proc.returncode}, {found}:\n{out[-6000:]}"
    runs = re.search(r"stat::number_of_executed_units: (\d+)", out)
    assert runs and int(runs.group(1)) > 0, out[-3000:]
