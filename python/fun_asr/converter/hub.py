"""Resolving a model argument: a GGUF file, a checkpoint folder, or a Hugging Face repo id.

A repo id is downloaded once with huggingface_hub (into its usual cache; HF_HUB_OFFLINE=1 uses the
cache only) and converted once into fun-asr's cache (~/.cache/fun-asr/models, or
$FUN_ASR_CACHE_DIR/models), so later sessions start from the GGUF.
"""

from __future__ import annotations

import logging
import os
import re
from pathlib import Path

from fun_asr.converter.cache import cache_dir
from fun_asr.converter.submodel import SPEAKER, VAD, SubModel
from fun_asr.errors import MissingFileError
from fun_asr.model.spec import load_spec

log = logging.getLogger("fun_asr")

_SPEC = load_spec()
DEFAULT_REPO = _SPEC["upstream"]["repo_id"]
DEFAULT_REVISION = _SPEC["upstream"]["revision"]
CHECKPOINT_FILES = [
    "config.json", "model.safetensors", "model-*.safetensors", "model.safetensors.index.json", "tokenizer.json",
    "tokenizer_config.json", "chat_template.jinja", "chat_template.json", "preprocessor_config.json",
    "generation_config.json",
]
_REPO_ID = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+$")


_COMMIT = re.compile(r"^[0-9a-f]{40}$")


def _offline() -> bool:
    return os.environ.get("HF_HUB_OFFLINE", "").strip().lower() not in ("", "0", "false", "no", "off")


def _endpoint() -> str:
    from huggingface_hub import constants

    return str(getattr(constants, "ENDPOINT", None) or os.environ.get("HF_ENDPOINT") or "https://huggingface.co")


def _reachable(url: str, timeout: float = 5.0) -> str | None:
    """None when `url` answers at all (any HTTP status), else why it cannot be reached (one attempt)."""
    import urllib.error
    import urllib.request

    try:
        urllib.request.urlopen(urllib.request.Request(url, method="HEAD"), timeout=timeout).close()
    except urllib.error.HTTPError:
        return None  # it answered
    except (urllib.error.URLError, OSError) as exc:
        reason = getattr(exc, "reason", exc)
        return str(getattr(reason, "strerror", None) or reason)
    return None


# (templates of fun_asr.errors: each front end names its own flag or keyword)
MODEL_HINT = ("give {h[give_model]} a local .gguf file or checkpoint folder, or try -m demo (a 20-word demo model "
              "shipped with the package: digits, yes/no, up/down/left/right, stop/go, on/off)")
VAD_HINT, SPEAKER_HINT = VAD.hint, SPEAKER.hint


def _snapshot(name: str, revision: str | None, files: list[str] | None = None, hint: str = MODEL_HINT) -> Path:
    """The local snapshot folder of `name`@`revision`, downloading it if needed.

    A pinned commit already in the hub cache is used without any network access. Otherwise the hub
    is probed once (5 s) before downloading, so that an offline machine fails at once with one line
    instead of huggingface_hub's retries (~24 s of repeated warnings)."""
    from huggingface_hub import snapshot_download

    where = f"{name}@{revision or 'main'}"
    if _offline() or (revision and _COMMIT.match(revision)):
        try:
            return Path(snapshot_download(name, revision=revision, allow_patterns=files or CHECKPOINT_FILES,
                                          local_files_only=True)).resolve()
        except Exception as exc:  # noqa: BLE001 - not in the cache (huggingface_hub raises several types)
            if _offline():
                raise MissingFileError(
                    "model.fetch", "cannot fetch {where}: HF_HUB_OFFLINE is set and it is not in the local hub cache "
                    "({kind}); unset HF_HUB_OFFLINE to download it, or " + hint, where=where,
                    kind=type(exc).__name__) from None
    endpoint = _endpoint()
    why = _reachable(endpoint)
    if why is not None:
        raise MissingFileError(
            "model.fetch", "cannot fetch {where}: {endpoint} is unreachable ({why}); offline? set HF_HUB_OFFLINE=1 to "
            "use the local hub cache, or " + hint, where=where, endpoint=endpoint, why=why)
    hub_log = logging.getLogger("huggingface_hub")
    level = hub_log.level
    hub_log.setLevel(logging.ERROR)  # no per-retry warnings; the error below says what happened
    try:
        return Path(snapshot_download(name, revision=revision, allow_patterns=files or CHECKPOINT_FILES)).resolve()
    except Exception as exc:  # huggingface_hub raises many types (404, auth, network)
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise FileNotFoundError(f"cannot fetch {where}: {first}") from None
    finally:
        hub_log.setLevel(level)


DEMO = "demo"


def _resolve_demo(package_type: str, progress: bool) -> Path:
    """The 20-word demo model (:mod:`fun_asr.model.demo`), rebuilt from the package's files and converted once, with
    FunASR's FSMN-VAD (shipped beside it) embedded."""
    import tempfile

    from fun_asr.model import demo

    out = cache_dir() / "models" / f"demo--{demo.fingerprint()}-{package_type}.gguf"
    if not out.is_file():
        from fun_asr.converter import convert

        log.info("building the 20-word demo model into %s (%s), once", out, package_type)
        out.parent.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory(prefix=".demo-", dir=out.parent) as tmp:
            ckpt = demo.build_checkpoint(Path(tmp) / "demo")
            convert(ckpt, out, package_type, progress=progress, overwrite=True, vad_model=demo.vad_dir())
    return out


def resolve_model(model: str | os.PathLike[str], package_type: str, revision: str | None = None,
                  progress: bool = True) -> Path:
    """Local path for `model`: itself if it exists, else the converted GGUF of a hub repo id (or of the
    20-word demo model for ``"demo"``)."""
    path = Path(model).expanduser()
    if path.exists():
        return path
    name = str(model)
    if name == DEMO:
        return _resolve_demo(package_type, progress)
    if name.startswith(MODELSCOPE):
        return _resolve_modelscope(name[len(MODELSCOPE):], package_type, revision, progress)
    if not _REPO_ID.match(name):
        raise FileNotFoundError(
            f"{name}: not a file, not a folder, and not a Hugging Face repo id (owner/name) or "
            f"modelscope:owner/name; give a .gguf file, a checkpoint folder, e.g. {DEFAULT_REPO}, or demo (the "
            "20-word demo model shipped with the package)"
        )
    if revision is None and name == DEFAULT_REPO:
        revision = DEFAULT_REVISION
    snapshot = _snapshot(name, revision)
    commit = snapshot.name
    out = cache_dir() / "models" / f"{name.replace('/', '--')}--{commit[:12]}-{package_type}.gguf"
    if not out.is_file():
        from fun_asr.converter import convert

        log.info("converting %s@%s to %s (%s), once", name, commit[:12], out, package_type)
        # overwrite: another process converting the same snapshot at once writes the same bytes
        report = convert(snapshot, out, package_type, progress=progress, repo_id=name, revision=commit,
                         overwrite=True, vad_model=_vad_to_embed(None, progress))
        log.info("%s", report.summary())
    return out


def _vad_to_embed(repo: str | None, progress: bool) -> Path | None:
    """The FSMN-VAD that a hub model's conversion embeds (FunASR's ``fsmn-vad``; ModelScope's for a ModelScope
    model), fetched and converted once; None, with a warning, when it cannot be had (the Session then looks
    for a VAD again at load time)."""
    try:
        return resolve_vad(repo, download=True, progress=progress)
    except (OSError, ValueError) as exc:
        log.warning("FSMN-VAD %s unavailable (%s): converting without it", repo or VAD.default_repo, exc)
        return None


MODELSCOPE = "modelscope:"
# What a ModelScope Fun-ASR-Nano snapshot needs (FunASR layout: model.pt + config.yaml + the LLM folder,
# the CTC vocabulary); the VAD files for its VAD repo.
MODELSCOPE_FILES = ["model.pt", "config.yaml", "configuration.json", "*.tiktoken", "*.json", "*.txt", "*.model",
                    "Qwen3-0.6B/*", "*/config.json", "*/tokenizer*", "*/vocab.json", "*/merges.txt",
                    "*/generation_config.json", "am.mvn"]
MODELSCOPE_VAD_REPO = "iic/speech_fsmn_vad_zh-cn-16k-common-pytorch"


def _modelscope_snapshot(repo: str, revision: str | None, files: list[str]) -> Path:
    """The local ModelScope snapshot of `repo` (the `modelscope` library's own cache and download)."""
    if not _REPO_ID.match(repo):
        raise FileNotFoundError(f"modelscope:{repo}: not a ModelScope repo id (owner/name)")
    try:
        from modelscope import snapshot_download
    except ImportError:
        raise FileNotFoundError(f"modelscope:{repo} needs the ModelScope client: pip install 'fun-asr[modelscope]'"
                                ) from None
    try:
        try:
            folder = snapshot_download(repo, revision=revision, allow_patterns=files)
        except TypeError:  # older clients: no allow_patterns
            folder = snapshot_download(repo, revision=revision)
    except Exception as exc:  # noqa: BLE001 - the client raises many types (network, auth, 404)
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise FileNotFoundError(f"cannot fetch modelscope:{repo}@{revision or 'master'}: {first}") from None
    return Path(folder).resolve()


def _snapshot_tag(folder: Path, revision: str | None) -> str:
    """A short tag for a snapshot's converted GGUF: its revision, else a digest of its files' names and sizes
    (a new release changes it, so a stale conversion is never reused)."""
    import hashlib

    h = hashlib.sha256((revision or "").encode())
    for f in sorted(p for p in folder.rglob("*") if p.is_file()):
        h.update(f"{f.relative_to(folder)}:{f.stat().st_size};".encode())
    return h.hexdigest()[:12]


def _resolve_modelscope(repo: str, package_type: str, revision: str | None, progress: bool) -> Path:
    snapshot = _modelscope_snapshot(repo, revision, MODELSCOPE_FILES)
    out = cache_dir() / "models" / f"modelscope--{repo.replace('/', '--')}--{_snapshot_tag(snapshot, revision)}-" \
                                   f"{package_type}.gguf"
    if not out.is_file():
        from fun_asr.converter import convert

        log.info("converting modelscope:%s to %s (%s), once", repo, out, package_type)
        report = convert(snapshot, out, package_type, progress=progress, repo_id=MODELSCOPE + repo,
                         revision=revision, overwrite=True,
                         vad_model=_vad_to_embed(MODELSCOPE + MODELSCOPE_VAD_REPO, progress))
        log.info("%s", report.summary())
    return out


def resolve_submodel(kind: SubModel, model: str | os.PathLike[str] | None = None, *, download: bool = True,
                     progress: bool = False) -> Path | None:
    """A ``kind`` model to load: ``model`` itself when it is a path (a .gguf or a FunASR folder), else the
    converted GGUF of a hub repo (default ``kind.default_repo``; ``modelscope:owner/name`` from ModelScope),
    converted once into the fun-asr cache. ``download=False`` looks only at what is already on this machine
    (fun-asr's cache, then the local hub cache) and returns None when it is not there."""
    del progress  # sub-models are small: converted without a progress bar
    if model is not None and Path(model).expanduser().exists():
        return Path(model).expanduser()
    name = str(model or kind.default_repo)
    files = list(kind.files)
    if name.startswith(MODELSCOPE):
        repo = name[len(MODELSCOPE):]
        if not download:
            return kind.cached(repo, modelscope=True)
        snapshot = _modelscope_snapshot(repo, None, files)
        out = kind.cache_path(repo, _snapshot_tag(snapshot, None), modelscope=True)
        if not out.is_file():
            kind.convert(snapshot, out, overwrite=True, repo_id=name)
        return out
    if not _REPO_ID.match(name):
        raise FileNotFoundError(f"{name}: no such {kind.what} (a .gguf file, a {kind.folder}, or a hub repo id such "
                                f"as {kind.default_repo})")
    if not download:
        done = kind.cached(name)
        if done is not None:
            return done
        from huggingface_hub import snapshot_download

        try:
            snapshot = Path(snapshot_download(name, allow_patterns=files, local_files_only=True)).resolve()
        except Exception:  # noqa: BLE001 - not in the local hub cache
            return None
    else:
        snapshot = _snapshot(name, None, files, hint=kind.hint)
    out = kind.cache_path(name, snapshot.name)
    if not out.is_file():
        log.info("converting %s@%s to %s, once", name, snapshot.name[:12], out)
        kind.convert(snapshot, out, overwrite=True, repo_id=name, revision=snapshot.name)
    return out


def resolve_vad(model: str | os.PathLike[str] | None = None, *, download: bool = True,
                progress: bool = False) -> Path | None:
    """:func:`resolve_submodel` for the FSMN-VAD (default ``funasr/fsmn-vad``)."""
    return resolve_submodel(VAD, model, download=download, progress=progress)


MODELSCOPE_SPEAKER_REPO = "iic/speech_campplus_sv_zh-cn_16k-common"  # FunASR's "cam++" on ModelScope


def resolve_speaker_model(model: str | os.PathLike[str] | None = None, *, download: bool = True,
                          progress: bool = False) -> Path | None:
    """:func:`resolve_submodel` for CAM++ (default ``funasr/campplus``)."""
    return resolve_submodel(SPEAKER, model, download=download, progress=progress)
