"""ggml's Vulkan backend as a module of the portable build: on a machine without a Vulkan driver, or with a broken one,
"auto" runs on the CPU and "vulkan" is an error saying why in one line; "auto" never takes a software driver;
system_info lists the devices.

Runs where this build ships libggml-vulkan.so (scripts/test.sh builds it where glslc and the Vulkan headers are);
the device's own numbers and tokens are tests/test_model_parity.py's and tests/test_gpu.py's.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

import fun_asr
from fun_asr import _core
from gpu import REQUIRED, VULKAN, backend_gpus
from test_demo import _references

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"
SHIPPED = (Path(_core.__file__).parent / "libggml-vulkan.so").is_file()

pytestmark = [pytest.mark.skipif(not SHIPPED and "vulkan" not in REQUIRED,
                                 reason="this build has no Vulkan module (libggml-vulkan.so)"),
              pytest.mark.device_process]


def _transcribe(env: dict[str, str], device: str, tmp_path: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "fun_asr.cli.transcribe", "-m", "demo", "--device", device,
                           str(EXAMPLES / "demo_1.wav")], capture_output=True, text=True,
                          env={**os.environ, **env}, cwd=tmp_path, timeout=300)


def test_module_is_shipped() -> None:
    assert SHIPPED, f"no libggml-vulkan.so beside {_core.__file__}"


@pytest.mark.parametrize("why,env", [
    ("no driver", {"VK_ICD_FILENAMES": "/nonexistent/icd.json", "VK_DRIVER_FILES": "/nonexistent/icd.json"}),
    ("a broken driver", {"VK_ICD_FILENAMES": "BROKEN", "VK_DRIVER_FILES": "BROKEN"}),
])
def test_vulkan_without_a_working_driver_is_an_error_naming_why(why: str, env: dict[str, str], tmp_path: Path) -> None:
    """`--device vulkan` where the Vulkan loader finds no driver, or one whose library is not there: nothing is
    transcribed (exit code 2, never the CPU in its place), and one line on stderr names the device and ggml's reason
    (as system_info()["unavailable_backends"] gives it). The Python API raises the same."""
    if env["VK_ICD_FILENAMES"] == "BROKEN":
        icd = tmp_path / "broken_icd.json"
        icd.write_text(json.dumps({"file_format_version": "1.0.0",
                                   "ICD": {"library_path": str(tmp_path / "libvulkan_missing.so"),
                                           "api_version": "1.3.0"}}))
        env = {k: str(icd) for k in env}
    r = _transcribe(env, "vulkan", tmp_path)
    assert r.returncode == 2 and r.stdout == "", r.stderr
    said = [line for line in r.stderr.splitlines() if "vulkan" in line.lower()]
    assert len(said) == 1 and r.stderr.count("error:") == 1, r.stderr
    reason = subprocess.run([sys.executable, "-c", "import fun_asr; print(fun_asr.system_info()['unavailable_backends']"
                             "['vulkan'])"], capture_output=True, text=True, env={**os.environ, **env})
    assert reason.returncode == 0 and reason.stdout.startswith("libggml-vulkan.so"), reason.stdout + reason.stderr
    assert said[0] == (f"fun-asr-transcribe: error: --device vulkan: device 'vulkan' is not usable here: "
                       f"{reason.stdout.strip()}; use --device cpu or --device auto"), said
    api = subprocess.run([sys.executable, "-c", "import fun_asr; fun_asr.Session('demo', device='vulkan')"],
                         capture_output=True, text=True, env={**os.environ, **env}, cwd=tmp_path)
    # fun_asr.errors.SetupError: a ValueError with code device.unusable
    assert api.returncode != 0 and ("fun_asr.errors.SetupError: device 'vulkan' is not usable here: libggml-vulkan.so"
                                    in api.stderr), api.stderr


def test_a_missing_driver_is_not_an_error_for_other_devices(tmp_path: Path) -> None:
    """auto (the CPU here) and cpu say nothing about Vulkan; a backend the build lacks is an error that blames the
    build and names the backends it has."""
    env = {"VK_ICD_FILENAMES": "/nonexistent/icd.json", "VK_DRIVER_FILES": "/nonexistent/icd.json"}
    r = _transcribe(env, "auto", tmp_path)
    assert r.returncode == 0 and "vulkan" not in r.stderr.lower(), r.stderr
    assert r.stdout.strip() == _references()["demo_1"]  # auto: the CPU, which gives its transcript
    r = _transcribe(env, "metal", tmp_path)
    assert r.returncode == 2 and "--device metal: this build has no Metal backend; it has: " in r.stderr, r.stderr
    assert "Vulkan (no device here)" in r.stderr, r.stderr


@VULKAN
def test_auto_never_takes_a_software_driver() -> None:
    """lavapipe is listed (GGML_VK_VISIBLE_DEVICES names it) and `vulkan` takes it; `auto` stays on the CPU."""
    vulkan = backend_gpus("vulkan")
    assert vulkan
    assert _core.check_device("vulkan") == vulkan[0]["name"]
    if all("llvmpipe" in d["description"].lower() for d in vulkan):
        assert _core.check_device("auto") == _core.check_device("cpu")
        assert fun_asr.Session("demo", progress=False, vad=None).model.info()["backend"] == "CPU"
    assert _core.device_fallback("vulkan") == ""


@VULKAN
def test_matrices_a_gpu_cannot_bind_stay_in_host_memory(tiny_gguf) -> None:  # noqa: ANN001
    """lavapipe binds at most 128 MiB: the tiny model's F32 token embedding (151936 x 256 x 4 bytes) stays in host
    memory, its products and lookups on the CPU, and the model still decodes (test_model_parity: its numbers); the
    F16 one (78 MB) lives on the device."""
    if "llvmpipe" not in backend_gpus("vulkan")[0]["description"].lower():
        pytest.skip("the 128 MiB binding limit is lavapipe's")
    f32 = fun_asr.load_model(tiny_gguf("f32"), device="vulkan")
    assert f32.info()["host_weights"] == ["token_embd.weight"] and f32.info()["host_token_lookup"]
    f16 = fun_asr.load_model(tiny_gguf("f16"), device="vulkan")
    assert f16.info()["host_weights"] == [] and not f16.info()["host_token_lookup"]
    assert fun_asr.load_model(tiny_gguf("f32")).info()["host_weights"] == []  # (the CPU: everything is host memory)
