"""Vulkan drivers known to corrupt memory are kept out: Mesa's lavapipe before Mesa 25 (Debian 12's 22.3.6).
``--device vulkan`` refuses one with one line that names it, the Vulkan test cases skip naming it; a driver that
is not known bad, and every other device, is taken as before. The version is read from the Vulkan loader (the
driver's "Mesa 22.3.6 (LLVM 15.0.6)"); the rule itself is checked on given versions, so it runs everywhere."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from fun_asr.model import vulkan_driver
from gpu import backend_gpus, vulkan_refused

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"
LAVAPIPE = "llvmpipe (LLVM 15.0.6, 256 bits)"


@pytest.mark.parametrize("info,version", [("Mesa 22.3.6 (LLVM 15.0.6)", (22, 3, 6)), ("Mesa 25.0.7", (25, 0, 7)),
                                          ("Mesa 24.1", (24, 1, 0)), ("NVIDIA 550.54", None), ("", None)])
def test_mesa_version_of_the_driver_info(info: str, version: tuple[int, ...] | None) -> None:
    assert vulkan_driver._mesa_version(info) == version


@pytest.mark.parametrize("versions,bad", [(((22, 3, 6),), True), (((24, 3, 4),), True), (((25, 0, 7),), False),
                                          ((), False)])
def test_lavapipe_before_mesa_25_is_kept_out(versions: tuple, bad: bool, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(vulkan_driver, "lavapipe_versions", lambda: versions)
    monkeypatch.delenv("FUN_ASR_ALLOW_BAD_VULKAN_DRIVER", raising=False)
    why = vulkan_driver.known_bad(LAVAPIPE)
    assert bool(why) == bad
    if bad:
        assert f"Mesa {'.'.join(map(str, versions[0]))}'s lavapipe" in why and "corrupts memory" in why
    assert vulkan_driver.known_bad("NVIDIA GeForce RTX 4090") == ""  # a GPU's driver is never read
    monkeypatch.setenv("FUN_ASR_ALLOW_BAD_VULKAN_DRIVER", "1")
    assert vulkan_driver.known_bad(LAVAPIPE) == ""


def test_the_loader_reads_this_machines_lavapipe() -> None:
    """Where the loader lists lavapipe, its Mesa version comes back (Debian 12: (22, 3, 6)); () without one."""
    found = vulkan_driver.lavapipe_versions()
    icds = list(Path("/usr/share/vulkan/icd.d").glob("lvp_icd*.json"))
    if not icds:
        assert found == ()
    else:
        assert found and all(len(v) == 3 and v[0] >= 20 for v in found), found


@pytest.mark.skipif(not (backend_gpus("vulkan") and vulkan_refused()),
                    reason="no Vulkan device here whose driver is kept out")
def test_device_vulkan_refuses_a_known_bad_driver_in_one_line(tmp_path: Path) -> None:
    r = subprocess.run([sys.executable, "-m", "fun_asr.cli.transcribe", "-m", "demo", "--device", "vulkan",
                        str(EXAMPLES / "demo_1.wav")], capture_output=True, text=True, cwd=tmp_path, timeout=300,
                       env={**os.environ, "FUN_ASR_ALLOW_BAD_VULKAN_DRIVER": ""})
    assert r.returncode == 2 and r.stdout == "", (r.returncode, r.stdout, r.stderr)
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and "--device vulkan" in lines[0] and "lavapipe, which corrupts memory" in lines[0], lines
