"""The model families a recognizer package can carry beside it (FunASR's FSMN-VAD and CAM++): one
:class:`SubModel` record each, and one implementation of what every family needs.

A record names the family's GGUF architecture, its hub repository and files, and its own reading functions (a
FunASR folder -> config, metadata, tensors; what a package embeds of it). :meth:`SubModel.convert` writes a
family's own GGUF, :meth:`SubModel.cache_path` says where the hub's conversion lives;
:func:`fun_asr.converter.hub.resolve_submodel` fetches one from the hub, :func:`fun_asr.asr.components.find_component`
finds the one a Session uses, and :func:`fun_asr.converter.convert` embeds any of them in a package
(``vad_model=``, ``speaker_model=``). A new family is one more record here, its reader and its graph.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from fun_asr.converter.cache import cache_dir
from fun_asr.converter.output import ConversionReport, check_output, write_gguf_file
from fun_asr.model.gguf_file import source_name
from fun_asr.model.spec import load_spec
from fun_asr.speakers import files as speaker_files
from fun_asr.vad import files as vad_files

Tensors = list[tuple[str, np.ndarray]]


@dataclass(frozen=True)
class SubModel:
    """A model family a package can carry beside the ASR model: how it is found, fetched, read and converted."""

    arch: str  # the GGUF architecture, also the cache file's suffix
    what: str  # "VAD model", "speaker model": for messages
    folder: str  # its FunASR folder, for messages
    default_repo: str
    files: tuple[str, ...]  # what a snapshot fetches
    hint: str  # how to give one without the hub (a template of fun_asr.errors)
    option: str  # the convert() keyword that embeds one in a package (CLI: the same with dashes)
    read_folder: Callable[[Path], tuple[dict[str, Any], dict[str, Any], Tensors]]  # config, metadata, tensors
    hparams: Callable[[dict[str, Any]], dict[str, Any]]
    metadata: Callable[..., dict[str, Any]]  # (config, hparams, repo_id, revision)
    for_embedding: Callable[[str | os.PathLike[str]], tuple[dict[str, Any], Tensors]]  # what a package embeds
    types: tuple[str, ...] = ("f32",)  # the tensor types its own GGUF can have (the first: the default)
    # its own GGUF's last touches: (metadata, tensors, hparams, type, where it came from) -> tensors
    finish: Callable[..., Tensors] | None = None

    @property
    def flag(self) -> str:
        return "--" + self.option.replace("_", "-")

    def tensor_type(self, package: str) -> str:
        """The tensor type its GGUF gets for a recognizer package type: the package's when this family has
        it (f16), else the default (no quantized forms: Q8_0/Q4_K do not apply to these small models)."""
        return package.lower() if package.lower() in self.types else self.types[0]

    def convert(self, src: str | os.PathLike[str], dst: str | os.PathLike[str], type: str | None = None, *,
                overwrite: bool = False, repo_id: str | None = None,
                revision: str | None = None) -> ConversionReport:
        """Its FunASR folder -> its own GGUF. Same output rules as :func:`fun_asr.convert` (never an input, a
        device or an existing file without ``overwrite``)."""
        type = type or self.types[0]
        if type not in self.types:
            raise ValueError(f"unknown {self.what} type {type!r}: accepted {', '.join(self.types)}")
        start = time.perf_counter()
        out = Path(dst)
        check_output(out, Path(src), overwrite)
        conf, meta, tensors = self.read_folder(Path(src))
        hp = self.hparams(conf)
        if repo_id or revision:
            meta = self.metadata(conf, hp, repo_id, revision)
        if self.finish is not None:
            tensors = self.finish(meta, tensors, hp, type, repo_id or source_name(src))
        write_gguf_file(out, Path(src), self.arch, meta, tensors, overwrite)
        counts: dict[str, int] = {}
        for _, arr in tensors:
            key = "f16" if arr.dtype == np.float16 else "f32"
            counts[key] = counts.get(key, 0) + 1
        return ConversionReport(path=out, package_type=f"{self.arch}, {type}", tensor_count=len(tensors),
                                file_bytes=out.stat().st_size, seconds=time.perf_counter() - start,
                                type_counts=counts, layout=self.arch)

    def cache_path(self, repo: str, tag: str, modelscope: bool = False) -> Path:
        """Where the conversion of ``repo`` at ``tag`` (a commit or a snapshot digest) lives in the fun-asr cache;
        ``tag`` ``*``: the glob of every conversion of it."""
        prefix = "modelscope--" if modelscope else ""
        return cache_dir() / "models" / f"{prefix}{repo.replace('/', '--')}--{tag[:12]}-{self.arch}.gguf"

    def cached(self, repo: str, modelscope: bool = False) -> Path | None:
        """The newest converted GGUF of ``repo`` in the fun-asr cache."""
        pattern = self.cache_path(repo, "*", modelscope)
        done = sorted(pattern.parent.glob(pattern.name), key=lambda p: p.stat().st_mtime)
        return done[-1] if done else None


_VAD_SPEC = load_spec(vad_files.ARCH)
VAD = SubModel(
    vad_files.ARCH, "VAD model", "FunASR fsmn-vad folder", _VAD_SPEC["upstream"]["repo_id"],
    tuple(_VAD_SPEC["upstream"]["files"]),
    "give {h[give_vad]} a local fsmn-vad folder or .gguf, or use a model package that embeds its VAD "
    "(fun-asr-convert SRC --vad-model DIR)",
    "vad_model", vad_files.read_vad_folder, vad_files.hparams, vad_files.metadata, vad_files.vad_for_embedding)

# FunASR's cam++ (name_maps_from_hub: "cam++" -> funasr/campplus on the Hugging Face hub,
# iic/speech_campplus_sv_zh-cn_16k-common on ModelScope)
SPEAKER = SubModel(
    speaker_files.ARCH, "speaker model", "FunASR CAM++ folder", "funasr/campplus",
    ("campplus_cn_common.bin", "model.pt", "config.yaml", "configuration.json"),
    "give {h[give_speaker]} a local CAM++ folder or .gguf, or use a model package that embeds one "
    "(fun-asr-convert SRC --speaker-model DIR)",
    "speaker_model", speaker_files.read_campplus_folder, speaker_files.hparams, speaker_files.metadata,
    speaker_files.speaker_for_embedding, speaker_files.TENSOR_TYPES, speaker_files.for_own_gguf)

SUBMODELS = (VAD, SPEAKER)  # in the order a package's metadata and tensors list them
