"""The wheel a user installs: the portable build (ggml's CPU variants and GPU backends as modules beside the
extension) in a fresh virtual environment, with no compiler and no source tree, and on an AVX2-only CPU.

scripts/test.sh builds it from the suite's own build (FUN_ASR_TEST_WHEEL names it); without it these tests skip,
except where FUN_ASR_TEST_REQUIRE names ``wheel`` (and ``qemu`` for the AVX2-only one): .ci/run does.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
import zipfile
from pathlib import Path

import pytest

from test_demo import _references

ROOT = Path(__file__).resolve().parents[1]
EXAMPLES = ROOT / "examples"
REQUIRED = {x.strip() for x in os.environ.get("FUN_ASR_TEST_REQUIRE", "").split(",") if x.strip()}
WHEEL = os.environ.get("FUN_ASR_TEST_WHEEL", "")


def _missing(what: str, why: str) -> None:
    if what in REQUIRED:
        pytest.fail(f"FUN_ASR_TEST_REQUIRE names {what}, but {why}")
    pytest.skip(why)


@pytest.fixture(scope="module")
def wheel() -> Path:
    if not WHEEL or not Path(WHEEL).is_file():
        _missing("wheel", "no wheel to test (FUN_ASR_TEST_WHEEL: scripts/test.sh builds one)")
    return Path(WHEEL)


@pytest.fixture(scope="module")
def venv(wheel: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A fresh virtual environment with the wheel installed (its dependencies from the package index)."""
    root = tmp_path_factory.mktemp("wheel-venv") / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(root)], check=True)
    t0 = time.perf_counter()
    r = subprocess.run([str(root / "bin" / "python"), "-m", "pip", "install", "-q", str(wheel)],
                       capture_output=True, text=True)
    assert r.returncode == 0, f"the wheel did not install:\n{r.stdout[-2000:]}\n{r.stderr[-2000:]}"
    print(f"\n[wheel] {wheel.name}: {wheel.stat().st_size / 1e6:.1f} MB, installed into a fresh venv in "
          f"{time.perf_counter() - t0:.1f} s")
    return root


def _clean_env() -> dict[str, str]:
    """The user's environment: nothing of the suite's source tree or venv on the path."""
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    env["PATH"] = os.pathsep.join(p for p in env.get("PATH", "").split(os.pathsep) if ".venv" not in p)
    return env


def test_wheel_carries_ggml_as_modules(wheel: Path) -> None:
    """ggml's CPU backend in its x86 variants, its base library and any GPU backend, beside the extension, which
    finds them through its own folder (RPATH $ORIGIN): no path of the build machine."""
    names = {Path(n).name for n in zipfile.ZipFile(wheel).namelist() if n.startswith("fun_asr/")}
    variants = sorted(n for n in names if n.startswith("libggml-cpu-") and n.endswith(".so"))
    assert {"libggml-cpu-x64.so", "libggml-cpu-haswell.so", "libggml-cpu-skylakex.so"} <= set(variants), variants
    assert {"libggml-base.so", "libggml.so"} <= names
    assert any(n.startswith("_core.") and n.endswith(".so") for n in names)
    from fun_asr import _core

    # every module of this suite's build (the wheel's own), and the Vulkan one where CI requires it
    built = {p.name for p in Path(_core.__file__).parent.glob("libggml-*.so")}
    assert built <= names, sorted(built - names)
    if "vulkan" in REQUIRED:
        assert "libggml-vulkan.so" in names


def test_wheel_installs_and_transcribes_the_demo(venv: Path, tmp_path: Path) -> None:
    """`fun-asr-transcribe -m demo examples/demo_1.wav` in the fresh venv, from another folder: the demo's words."""
    t0 = time.perf_counter()
    r = subprocess.run([str(venv / "bin" / "fun-asr-transcribe"), "-m", "demo", str(EXAMPLES / "demo_1.wav")],
                       capture_output=True, text=True, cwd=tmp_path, env=_clean_env())
    print(f"\n[wheel] first transcription after the install: {time.perf_counter() - t0:.2f} s")
    assert r.returncode == 0, r.stderr[-3000:]
    assert r.stdout.strip() == _references()["demo_1"]
    r = subprocess.run([str(venv / "bin" / "python"), "-c", "import fun_asr; print(fun_asr.__file__)"],
                       capture_output=True, text=True, cwd=tmp_path, env=_clean_env())
    assert r.returncode == 0 and str(venv) in r.stdout, r.stdout + r.stderr  # the wheel's, not the source tree's


def test_wheel_runs_on_an_avx2_only_cpu(venv: Path, tmp_path: Path) -> None:
    """The wheel under `qemu-x86_64 -cpu Haswell` (AVX2, FMA, F16C; no AVX-512): ggml loads its haswell variant and
    fun-asr's kernels their AVX2 copies. One AVX-512 instruction anywhere on the path would stop it (SIGILL)."""
    qemu = shutil.which("qemu-x86_64")
    if qemu is None:
        _missing("qemu", "no qemu-x86_64 (Debian: apt-get install qemu-user)")
    code = ("import fun_asr, sys; s = fun_asr.Session('demo', device='cpu', vad=None, progress=False); "
            "print(s.transcribe(sys.argv[1]).text); "
            "print(' '.join(k for k, v in fun_asr.system_info()['cpu_features'].items() if v == '1'))")
    r = subprocess.run([qemu, "-cpu", "Haswell", str(venv / "bin" / "python"), "-c", code,
                        str(EXAMPLES / "demo_2.wav")], capture_output=True, text=True, cwd=tmp_path,
                       env=_clean_env(), timeout=600)
    assert r.returncode == 0, f"exit {r.returncode} under qemu Haswell:\n{r.stderr[-3000:]}"
    text, features = r.stdout.strip().splitlines()[-2:]
    assert text == _references()["demo_2"]
    assert "AVX2" in features.split() and not any(f.startswith("AVX512") for f in features.split()), features
