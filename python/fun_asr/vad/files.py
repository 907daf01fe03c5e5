"""FunASR FSMN-VAD model files -> config, metadata, tensors and the native model.

Reads a FunASR folder (``model.pt`` by the restricted unpickler of :mod:`fun_asr.model.torch_pickle`: no
pickle code runs; ``config.yaml``; ``am.mvn``), an ``fsmn_vad`` GGUF (``fun-asr-convert``), or the VAD
embedded in an ASR package. Writing a VAD GGUF is :mod:`fun_asr.converter.vad`.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import numpy as np

from fun_asr.model.funasr_checkpoint import REQUIRED_FILES, is_vad_folder  # noqa: F401 - re-exported
from fun_asr.model.gguf_file import metadata_fields, open_gguf, source_name, submodel_metadata
from fun_asr.model.spec import load_spec

ARCH = "fsmn_vad"


class VadModelError(ValueError):
    """The folder or file is not a usable FSMN-VAD model."""


def read_config(path: Path) -> dict[str, Any]:
    import yaml

    try:
        conf = yaml.safe_load((path / "config.yaml").read_text("utf-8")) or {}
    except (OSError, yaml.YAMLError) as exc:
        raise VadModelError(f"{path / 'config.yaml'}: cannot read ({exc})") from None
    if not isinstance(conf, dict) or not isinstance(conf.get("encoder_conf"), dict):
        raise VadModelError(f"{path / 'config.yaml'}: no encoder_conf section (not an FSMN-VAD config)")
    enc = conf["encoder_conf"]
    if int(enc.get("rorder", 0)) != 0 or int(enc.get("lstride", 1)) != 1:
        raise VadModelError(f"{path / 'config.yaml'}: FSMN with rorder={enc.get('rorder')} / "
                            f"lstride={enc.get('lstride')} is not supported (FunASR's VAD has 0 / 1)")
    return conf


def hparams(conf: dict[str, Any]) -> dict[str, int]:
    """GGUF keys ``fsmn_vad.<name>`` (model_specs/fsmn_vad.json ``hparams``) from config.yaml."""
    spec = load_spec(ARCH)["hparams"]
    enc = conf["encoder_conf"]
    out = {}
    for key, source in spec.items():
        if key == "doc":
            continue
        if source not in enc:
            raise VadModelError(f"config.yaml encoder_conf has no {source!r}")
        out[key] = int(enc[source])
    return out


def _symbols(hp: dict[str, int]) -> dict[str, int]:
    return {"in_dim": hp["input_dim"], "in_affine": hp["input_affine_dim"], "linear_dim": hp["linear_dim"],
            "proj_dim": hp["proj_dim"], "lorder": hp["lorder"], "out_affine": hp["output_affine_dim"],
            "out_dim": hp["output_dim"]}


def table(hp: dict[str, int]) -> list[tuple[str, str, tuple[int, ...]]]:
    """(model.pt name, GGUF name, torch-order shape) for every tensor, in file order."""
    t = load_spec(ARCH)["tensors"]
    sym = _symbols(hp)
    rows = []
    for group, layers in (("vad_network", [None]), ("vad_cmvn", [None]), ("vad_layer", range(hp["block_count"]))):
        for i in layers:
            for e in t[group]:
                shape = tuple(s if isinstance(s, int) else sym[s] for s in e["shape"])
                name = e["pt"] if i is None else e["pt"].replace("{i}", str(i))
                rows.append((name, e["gguf"] if i is None else e["gguf"].replace("{i}", str(i)), shape))
    return rows


def read_vad_folder(path: str | os.PathLike[str]) -> tuple[dict[str, Any], dict[str, Any],
                                                          list[tuple[str, np.ndarray]]]:
    """(config.yaml, GGUF metadata, [(gguf name, float32 array in torch order)]) of a FunASR VAD folder."""
    from fun_asr.model.torch_pickle import load_state_dict
    from fun_asr.vad.frontend import read_am_mvn

    p = Path(path)
    missing = [f for f in REQUIRED_FILES if not (p / f).is_file()]
    if missing:
        raise VadModelError(f"{p}: not an FSMN-VAD folder (missing {', '.join(missing)}; FunASR's layout has "
                            f"{', '.join(REQUIRED_FILES)})")
    conf = read_config(p)
    hp = hparams(conf)
    sd = load_state_dict(p / "model.pt")
    try:
        shift, scale = read_am_mvn(p / "am.mvn")
    except ValueError as exc:
        raise VadModelError(str(exc)) from None
    tensors = []
    expected = table(hp)
    known = {name for name, _, _ in expected}
    extra = sorted(k for k in sd if k not in known)
    if extra:
        raise VadModelError(f"{p / 'model.pt'}: unexpected tensor {extra[0]!r}" +
                            (f" (and {len(extra) - 1} more)" if len(extra) > 1 else ""))
    for name, gguf_name, shape in expected:
        if name == "<am.mvn AddShift>":
            arr = shift
        elif name == "<am.mvn Rescale>":
            arr = scale
        elif name not in sd:
            raise VadModelError(f"{p / 'model.pt'}: missing tensor {name!r}")
        else:
            arr = np.asarray(sd[name], dtype=np.float32)
            if gguf_name.endswith(".fsmn.weight"):  # [proj, 1, lorder, 1] -> [proj, lorder]
                if arr.ndim != 4 or arr.shape[1] != 1 or arr.shape[3] != 1:
                    raise VadModelError(f"{p / 'model.pt'}: {name} has shape {list(arr.shape)}, expected "
                                        f"[{shape[0]}, 1, {shape[1]}, 1]")
                arr = arr[:, 0, :, 0]
        if tuple(arr.shape) != shape:
            raise VadModelError(f"{p}: tensor {name} has shape {list(arr.shape)}, expected {list(shape)} from "
                                "config.yaml")
        if not np.isfinite(arr).all():
            raise VadModelError(f"{p}: tensor {name} contains NaN or infinite values")
        tensors.append((gguf_name, np.ascontiguousarray(arr, dtype=np.float32)))
    return conf, metadata(conf, hp), tensors


def metadata(conf: dict[str, Any], hp: dict[str, int], repo_id: str | None = None,
             revision: str | None = None) -> dict[str, Any]:
    """An fsmn_vad GGUF's metadata (``fun_asr.model.gguf_file.submodel_metadata``)."""
    return submodel_metadata(ARCH, conf, hp, repo_id, revision)



def vad_for_embedding(path: str | os.PathLike[str]) -> tuple[dict[str, Any], list[tuple[str, np.ndarray]]]:
    """What an ASR package embeds of a VAD model: its ``fsmn_vad.*`` metadata (with where it came from) and its
    ``vad.*`` tensors (F32). ``path``: a FunASR fsmn-vad folder, an ``fsmn_vad`` GGUF, or a package that embeds
    one. The tensors are checked against the table of config.yaml's dimensions either way."""
    p = Path(path)
    if p.is_dir():
        conf, meta, tensors = read_vad_folder(p)
        origin = source_name(p)
    elif p.is_file():
        import gguf

        reader = open_gguf(p, VadModelError)
        found = metadata_fields(reader, (f"{ARCH}.", "general.source."))
        text = found.get(f"{ARCH}.config_json")
        if not isinstance(text, str):
            raise VadModelError(f"{p}: holds no FSMN-VAD (no {ARCH}.config_json: give an fsmn_vad GGUF, a package "
                                "that embeds one, or a FunASR fsmn-vad folder)")
        conf = json.loads(text)
        meta = metadata(conf, hparams(conf))
        expected = {g: shape for _, g, shape in table(hparams(conf))}
        tensors = []
        for t in reader.tensors:
            if t.name not in expected:
                continue
            if t.tensor_type != gguf.GGMLQuantizationType.F32:
                raise VadModelError(f"{p}: VAD tensor {t.name} is {t.tensor_type.name}, expected F32")
            arr = np.asarray(t.data, dtype=np.float32).reshape(expected[t.name])
            tensors.append((t.name, np.ascontiguousarray(arr)))
        missing = sorted(set(expected) - {n for n, _ in tensors})
        if missing:
            raise VadModelError(f"{p}: VAD tensor {missing[0]} is missing")
        source = found.get("general.source.huggingface.repository")
        origin = str(source) if source is not None else source_name(p)
        if isinstance(found.get(f"{ARCH}.source"), str):
            origin = found[f"{ARCH}.source"]
    else:
        raise FileNotFoundError(f"{p}: no such VAD model (a .gguf file or a FunASR fsmn-vad folder)")
    keys = {k: v for k, v in meta.items() if k.startswith(f"{ARCH}.")}
    keys[f"{ARCH}.source"] = origin
    keys[f"{ARCH}.license"] = load_spec(ARCH)["license"]["name"]
    return keys, tensors


def load_native(path: str | os.PathLike[str], threads: int = 1):  # noqa: ANN201 - (_core.VadModel, config dict)
    """The native network and config.yaml of an fsmn_vad GGUF or a FunASR VAD folder."""
    from fun_asr import _core

    p = Path(path)
    if p.is_dir():
        conf, meta, tensors = read_vad_folder(p)
        rows = [(name, "f32", list(reversed(arr.shape)), arr) for name, arr in tensors]
        return _core.load_vad_tensors(meta, rows, threads=threads, origin=str(p)), conf
    if not p.is_file():
        raise FileNotFoundError(f"{p}: no such VAD model (a .gguf file or a FunASR fsmn-vad folder)")
    try:
        model = _core.load_vad_gguf(str(p), threads=threads)
    except (RuntimeError, ValueError) as exc:
        raise VadModelError(f"{p}: not a usable fsmn_vad GGUF ({exc})") from None
    text = metadata_fields(open_gguf(p, VadModelError), (f"{ARCH}.config_json",)).get(f"{ARCH}.config_json")
    try:
        conf = json.loads(text) if isinstance(text, str) else None
    except ValueError as exc:
        raise VadModelError(f"{p}: not a usable fsmn_vad GGUF ({ARCH}.config_json: {exc})") from None
    if not isinstance(conf, dict):
        raise VadModelError(f"{p}: not a usable fsmn_vad GGUF (no {ARCH}.config_json object: the model's config.yaml)")
    return model, conf
