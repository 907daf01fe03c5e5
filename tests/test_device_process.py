"""GPU cases run in a process of their own (tests/device_process.py): a case whose process dies fails alone, after
one more try in a new process, and the cases after it still run and report; outcomes, skips and the summary come
back as pytest's own."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

TESTS = Path(__file__).resolve().parent

CONFTEST = f'''
import sys
sys.path.insert(0, {str(TESTS)!r})
import device_process

def pytest_configure(config):
    device_process.register(config)
'''

CASES = '''
import os
from pathlib import Path
import pytest

pytestmark = pytest.mark.device_process
FLAG = Path(__file__).with_name("died-once")

def test_ok():
    pass

def test_dies():
    os.abort()

def test_dies_once():
    if not FLAG.exists():
        FLAG.write_text("x")
        os.abort()

def test_after():
    pass

def test_skips():
    pytest.skip("no such device")

def test_fails():
    assert 1 == 2

@pytest.mark.parametrize("device", ["cpu", "vulkan"])
def test_param(device):
    assert os.environ.get("FUN_ASR_TEST_CHILD_REPORT") if device == "vulkan" else True
'''


def test_a_dying_case_fails_alone_and_the_rest_report(tmp_path: Path) -> None:
    (tmp_path / "conftest.py").write_text(CONFTEST)
    (tmp_path / "test_cases.py").write_text(CASES)
    r = subprocess.run([sys.executable, "-m", "pytest", "-rA", "-p", "no:cacheprovider", str(tmp_path)],
                       cwd=tmp_path, capture_output=True, text=True, timeout=300)
    out = r.stdout
    assert r.returncode == 1, out
    for case in ("test_ok", "test_dies_once", "test_after", "test_param[cpu]", "test_param[vulkan]"):
        assert f"PASSED test_cases.py::{case}" in out, out
    assert "SKIPPED" in out and "no such device" in out, out
    assert "FAILED test_cases.py::test_fails" in out, out
    assert "FAILED test_cases.py::test_dies" in out and "killed by SIGABRT" in out, out
    assert "and again in a second process" in out, out
    assert "GPU cases whose process died" in out and "test_cases.py::test_dies_once: " in out, out
    assert "2 failed, 5 passed, 1 skipped" in out, out


def test_a_hanging_case_is_killed_and_fails(tmp_path: Path) -> None:
    (tmp_path / "conftest.py").write_text(CONFTEST)
    (tmp_path / "test_hang.py").write_text("import time\nimport pytest\n\npytestmark = pytest.mark.device_process\n\n"
                                           "def test_hangs():\n    time.sleep(600)\n\ndef test_next():\n    pass\n")
    r = subprocess.run([sys.executable, "-m", "pytest", "-rA", "-p", "no:cacheprovider", str(tmp_path)],
                       cwd=tmp_path, capture_output=True, text=True, timeout=300,
                       env={**os.environ, "FUN_ASR_TEST_CHILD_TIMEOUT": "5"})
    assert r.returncode == 1 and "killed by SIGKILL" in r.stdout and "killed after 5 s" in r.stdout, r.stdout
    assert "PASSED test_hang.py::test_next" in r.stdout and "1 failed, 1 passed" in r.stdout, r.stdout


def test_a_process_that_dies_at_exit_keeps_its_cases_and_says_so(tmp_path: Path) -> None:
    (tmp_path / "conftest.py").write_text(CONFTEST + "\nimport os\n\ndef pytest_unconfigure(config):\n"
                                          "    if os.environ.get('FUN_ASR_TEST_CHILD_REPORT'):\n        os.abort()\n")
    (tmp_path / "test_exit.py").write_text("import pytest\n\npytestmark = pytest.mark.device_process\n\n"
                                           "def test_one():\n    pass\n\ndef test_two():\n    pass\n")
    r = subprocess.run([sys.executable, "-m", "pytest", "-rA", "-p", "no:cacheprovider", str(tmp_path)],
                       cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0 and "2 passed" in r.stdout, r.stdout
    assert "died at exit" in r.stdout and "was killed by SIGABRT at its exit" in r.stdout, r.stdout
