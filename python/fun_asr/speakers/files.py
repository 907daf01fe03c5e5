"""CAM++ model files -> hyperparameters, GGUF metadata and the (folded) tensors the native graph takes.

Reads a FunASR / ModelScope CAM++ folder (``config.yaml`` with ``model: CAMPPlus`` and ``model_conf``; the
weights file named by ``configuration.json``'s ``file_path_metas.init_param``, else ``campplus_cn_common.bin``,
else ``model.pt``: a ``torch.save``'d state_dict read by :mod:`fun_asr.model.torch_pickle`, no pickle code
run), a ``campplus`` GGUF (``fun-asr-convert``), or the CAM++ embedded in an ASR package.

Every batch norm is folded here (numpy, float64, then cast): into the preceding conv's weight and a bias
where it directly follows a conv (FCM convs, the TDNN, each dense layer's 1x1 conv, the last transit layer
with ``out_nonlinear``, the final dense layer), otherwise into one per-channel scale and shift (the
BN-ReLU in front of each dense layer and transit layer). The tensor names, shapes and sources are the
one table in model_specs/campplus.json. Writing a speaker GGUF is :mod:`fun_asr.converter.speaker`.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from fun_asr.model.funasr_checkpoint import is_campplus_folder  # noqa: F401 - re-exported
from fun_asr.model.gguf_file import metadata_fields, open_gguf, source_name, submodel_metadata
from fun_asr.model.spec import load_spec

ARCH = "campplus"
PREFIX = "spk."  # tensor names
WEIGHT_FILES = ("campplus_cn_common.bin", "model.pt")
TENSOR_TYPES = ("f32", "f16")


class SpeakerModelError(ValueError):
    """The folder or file is not a usable CAM++ speaker model."""


# -- hyperparameters --------------------------------------------------------------------------------

def _read_yaml(path: Path) -> dict[str, Any]:
    import yaml

    try:
        conf = yaml.safe_load(path.read_text("utf-8")) or {}
    except (OSError, UnicodeDecodeError, yaml.YAMLError) as exc:
        raise SpeakerModelError(f"{path}: cannot read ({exc})") from None
    if not isinstance(conf, dict):
        raise SpeakerModelError(f"{path}: not a YAML mapping")
    return conf


def check_conf(conf: dict[str, Any], where: str) -> dict[str, Any]:
    """config.yaml (``model: CAMPPlus`` + ``model_conf``) checked for what the native graph supports."""
    if conf.get("model") != "CAMPPlus":
        raise SpeakerModelError(f"{where}: model is {conf.get('model')!r}, not 'CAMPPlus' (FunASR's CAM++)")
    mc = conf.get("model_conf", {}) or {}
    if not isinstance(mc, dict):
        raise SpeakerModelError(f"{where}: model_conf must be a mapping")
    sup = load_spec(ARCH)["supported"]
    for key, default in (("config_str", "batchnorm-relu"), ("output_level", "segment")):
        value = mc.get(key, default)
        if value not in sup[key]:
            raise SpeakerModelError(f"{where}: model_conf.{key} = {value!r} is not supported (accepted: "
                                    f"{', '.join(map(repr, sup[key]))})")
    return conf


def hparams(conf: dict[str, Any]) -> dict[str, Any]:
    """GGUF keys ``campplus.<name>`` (model_specs/campplus.json ``hparams``): ints and int lists."""
    mc = conf.get("model_conf", {}) or {}
    out: dict[str, Any] = {}
    for key, src in load_spec(ARCH)["hparams"].items():
        if key == "doc":
            continue
        value = mc.get(src["conf"], src["default"]) if "conf" in src else src["value"]
        try:
            out[key] = [int(v) for v in value] if isinstance(value, list) else int(value)
        except (TypeError, ValueError):
            raise SpeakerModelError(f"config.yaml model_conf.{src.get('conf', key)} = {value!r} is not an integer") \
                from None
    return out


def _conv_out(n: int, k: int, stride: int) -> int:
    return (n + 2 * ((k - 1) // 2) - k) // stride + 1


@dataclass(frozen=True)
class Dims:
    """Channel counts and sizes that follow from the hyperparameters (as FunASR's CAMPPlus computes them)."""

    hp: dict[str, Any]

    def __post_init__(self) -> None:
        hp = self.hp
        n = len(hp["block.layer_count"])
        if not (len(hp["block.kernel_size"]) == len(hp["block.dilation"]) == n) or n == 0:
            raise SpeakerModelError("campplus: block.layer_count, block.kernel_size and block.dilation must have "
                                    "the same (non-zero) length")
        for key in ("feat_dim", "embedding_length", "growth_rate", "bn_size", "tdnn.channels", "tdnn.kernel_size",
                    "tdnn.stride", "fcm.channels", "fcm.kernel_size", "fcm.stride", "cam.reduction", "cam.seg_len"):
            if hp[key] < 1:
                raise SpeakerModelError(f"campplus.{key} = {hp[key]} must be >= 1")
        for key in ("fcm.kernel_size", "tdnn.kernel_size"):
            if hp[key] % 2 == 0:
                raise SpeakerModelError(f"campplus.{key} = {hp[key]} must be odd")
        if any(k % 2 == 0 or k < 1 for k in hp["block.kernel_size"]):
            raise SpeakerModelError(f"campplus.block.kernel_size {hp['block.kernel_size']} must be odd")
        if len(hp["fcm.block_count"]) == 0 or min(hp["fcm.block_count"]) < 1:
            raise SpeakerModelError(f"campplus.fcm.block_count {hp['fcm.block_count']} must list >= 1 blocks")
        if self.fcm_freq * hp["fcm.channels"] != hp["fcm.channels"] * (hp["feat_dim"] // 8):
            raise SpeakerModelError(f"campplus.feat_dim = {hp['feat_dim']}: the FCM head leaves {self.fcm_freq} "
                                    f"frequency rows, FunASR's TDNN expects feat_dim // 8 = {hp['feat_dim'] // 8}")
        if self.bn_ch // hp["cam.reduction"] < 1:
            raise SpeakerModelError("campplus: bn_size * growth_rate // cam.reduction must be >= 1")

    @property
    def fcm_freq(self) -> int:
        f = self.hp["feat_dim"]
        k, s = self.hp["fcm.kernel_size"], self.hp["fcm.stride"]
        for _ in self.hp["fcm.block_count"]:
            f = _conv_out(f, k, s)
        return _conv_out(f, k, s)  # conv2

    @property
    def bn_ch(self) -> int:
        return self.hp["bn_size"] * self.hp["growth_rate"]

    def block_in(self, b: int) -> int:
        c = self.hp["tdnn.channels"]
        for i in range(b):
            c = (c + self.hp["block.layer_count"][i] * self.hp["growth_rate"]) // 2
        return c

    def block_out(self, b: int) -> int:
        return self.block_in(b) + self.hp["block.layer_count"][b] * self.hp["growth_rate"]

    @property
    def final_ch(self) -> int:
        return self.block_out(len(self.hp["block.layer_count"]) - 1) // 2

    def symbols(self, b: int | None = None, i: int | None = None) -> dict[str, int]:
        hp = self.hp
        s = {"fcm_ch": hp["fcm.channels"], "fcm_k": hp["fcm.kernel_size"], "tdnn_ch": hp["tdnn.channels"],
             "tdnn_in": hp["fcm.channels"] * self.fcm_freq, "fcm_freq": self.fcm_freq, "tdnn_k": hp["tdnn.kernel_size"],
             "growth": hp["growth_rate"], "bn_ch": self.bn_ch, "bn_half": self.bn_ch // hp["cam.reduction"],
             "emb": hp["embedding_length"], "stats_dim": 2 * self.final_ch}
        if b is not None:
            s["layer_k"] = hp["block.kernel_size"][b]
            s["block_out"] = self.block_out(b)
            s["transit_out"] = self.block_out(b) // 2
            if i is not None:
                s["layer_in"] = self.block_in(b) + i * hp["growth_rate"]
        return s


# -- the tensor table --------------------------------------------------------------------------------

@dataclass(frozen=True)
class SpeakerTensor:
    gguf: str
    shape: tuple[int, ...]  # torch order
    kind: str  # conv | matrix | kernel | bias
    source: dict[str, str]  # the table entry's pt / conv / bn / part / layout, placeholders filled in


def _fill(text: str, idx: dict[str, int]) -> str:
    for k, v in idx.items():
        text = text.replace("{" + k + "}", str(v)).replace("{" + k + "1}", str(v + 1))
    return text


def table(hp: dict[str, Any]) -> list[SpeakerTensor]:
    """Every tensor of a CAM++ of these hyperparameters, in file order."""
    dims = Dims(hp)
    t = load_spec(ARCH)["tensors"]
    rows: list[SpeakerTensor] = []

    def add(group: str, idx: dict[str, int], sym: dict[str, int]) -> None:
        for e in t[group]:
            shape = tuple(s if isinstance(s, int) else sym[s] for s in e["shape"])
            src = {k: _fill(v, idx) for k, v in e.items() if k in ("pt", "conv", "bn", "part", "layout")}
            rows.append(SpeakerTensor(_fill(e["gguf"], idx), shape, e["kind"], src))

    base = dims.symbols()
    add("fcm_stem", {}, base)
    for g, n in enumerate(hp["fcm.block_count"]):
        for j in range(n):
            add("fcm_block", {"g": g, "j": j}, base)
            if j == 0 and hp["fcm.stride"] != 1:
                add("fcm_shortcut", {"g": g, "j": j}, base)
    add("fcm_out", {}, base)
    add("tdnn", {}, base)
    n_blocks = len(hp["block.layer_count"])
    for b in range(n_blocks):
        for i in range(hp["block.layer_count"][b]):
            add("dense_layer", {"b": b, "i": i}, dims.symbols(b, i))
        add("transit_last" if b == n_blocks - 1 else "transit", {"b": b}, dims.symbols(b))
    add("embedding", {}, base)
    for r in rows:
        assert len(r.gguf) <= 63, r.gguf
    return rows


# -- reading a FunASR folder ---------------------------------------------------------------------------

def weights_path(folder: Path) -> Path:
    """The weights file of a CAM++ folder: configuration.json's file_path_metas.init_param, else
    campplus_cn_common.bin, else model.pt."""
    cfg = folder / "configuration.json"
    if cfg.is_file():
        try:
            meta = json.loads(cfg.read_text("utf-8"))
        except (OSError, UnicodeDecodeError, ValueError) as exc:
            raise SpeakerModelError(f"{cfg}: cannot read ({exc})") from None
        name = (meta.get("file_path_metas") or {}).get("init_param") if isinstance(meta, dict) else None
        if isinstance(name, str) and name:
            p = folder / name
            if not p.is_file():
                raise SpeakerModelError(f"{cfg}: file_path_metas.init_param names {name!r}, which is not in {folder}")
            return p
    for name in WEIGHT_FILES:
        if (folder / name).is_file():
            return folder / name
    raise SpeakerModelError(f"{folder}: no CAM++ weights file (configuration.json file_path_metas.init_param, or "
                            f"{' / '.join(WEIGHT_FILES)})")


def _bn_fold(sd: dict[str, np.ndarray], prefix: str, channels: int, eps: float, where: str) -> tuple[np.ndarray,
                                                                                                     np.ndarray]:
    """(scale, shift) float64 of an eval-mode batch norm: y = x * scale + shift."""
    def get(name: str, required: bool = True) -> np.ndarray | None:
        key = f"{prefix}.{name}"
        if key not in sd:
            if required:
                raise SpeakerModelError(f"{where}: missing tensor {key!r}")
            return None
        arr = np.asarray(sd[key], dtype=np.float64).reshape(-1)
        if arr.shape != (channels,):
            raise SpeakerModelError(f"{where}: tensor {key} has shape {list(np.shape(sd[key]))}, expected [{channels}]")
        return arr

    mean, var = get("running_mean"), get("running_var")
    gamma, beta = get("weight", False), get("bias", False)
    if (gamma is None) != (beta is None):
        raise SpeakerModelError(f"{where}: batch norm {prefix} has only one of weight / bias")
    if not (var > -eps).all():
        raise SpeakerModelError(f"{where}: {prefix}.running_var has values <= -eps (not a variance)")
    scale = 1.0 / np.sqrt(var + eps)
    if gamma is not None:
        scale = scale * gamma
    shift = -mean * scale + (beta if beta is not None else 0.0)
    return scale, shift


def _relayout(arr: np.ndarray, layout: str, r: SpeakerTensor, dims: Dims, name: str, where: str) -> np.ndarray:
    """A torch conv weight in the table's layout (see model_specs/campplus.json "tensors.doc")."""
    if not layout:
        return arr
    if layout == "squeeze":
        if arr.ndim != 3 or arr.shape[2] != 1:
            raise SpeakerModelError(f"{where}: {name} has shape {list(arr.shape)}, expected "
                                    f"[{r.shape[0]}, {r.shape[1]}, 1] (a 1x1 conv)")
        return arr[:, :, 0]
    if layout == "channels_last":  # [out, in, k...] -> [out, k..., in]
        if arr.ndim != len(r.shape):
            raise SpeakerModelError(f"{where}: {name} has {arr.ndim} dimensions, expected {len(r.shape)}")
        return arr.transpose(0, *range(2, arr.ndim), 1)
    if layout == "fcm_channels_last":  # [out, C*F', k] (in = c*F' + f) -> [out, k, F', C]
        c, f = dims.hp["fcm.channels"], dims.fcm_freq
        if arr.ndim != 3 or arr.shape[1] != c * f:
            raise SpeakerModelError(f"{where}: {name} has shape {list(arr.shape)}, expected [{r.shape[0]}, {c * f}, "
                                    f"{r.shape[1]}] (the FCM's {c} channels x {f} frequency rows)")
        return arr.reshape(arr.shape[0], c, f, arr.shape[2]).transpose(0, 3, 2, 1)
    raise SpeakerModelError(f"campplus tensor table: unknown layout {layout!r}")


def fold_tensors(sd: dict[str, np.ndarray], hp: dict[str, Any], where: str) -> list[tuple[str, np.ndarray]]:
    """[(gguf name, float32 array in the table's shape)] of a CAMPPlus state_dict, batch norms folded."""
    eps = float(load_spec(ARCH)["supported"]["bn_epsilon"])
    dims = Dims(hp)
    rows = table(hp)
    used: set[str] = set()
    out: list[tuple[str, np.ndarray]] = []

    def tensor(name: str) -> np.ndarray:
        if name not in sd:
            raise SpeakerModelError(f"{where}: missing tensor {name!r}")
        used.add(name)
        return np.asarray(sd[name], dtype=np.float64)

    for r in rows:
        src = r.source
        layout = src.get("layout", "")
        if "conv" in src:
            w = tensor(src["conv"])
            out_ch = w.shape[0] if w.ndim else 0
            scale, shift = _bn_fold(sd, src["bn"], out_ch, eps, where)
            used.update(k for k in sd if k.startswith(src["bn"] + "."))
            bias_name = src["conv"][: -len("weight")] + "bias"
            if src["part"] == "weight":
                arr = w * scale.reshape((-1,) + (1,) * (w.ndim - 1))
            else:
                b = tensor(bias_name) if bias_name in sd else np.zeros(out_ch)
                arr = b * scale + shift
        elif "bn" in src:
            channels = r.shape[0]
            scale, shift = _bn_fold(sd, src["bn"], channels, eps, where)
            used.update(k for k in sd if k.startswith(src["bn"] + "."))
            arr = scale if src["part"] == "scale" else shift
        else:
            arr = tensor(src["pt"])
        if src.get("part", "weight") == "weight":
            arr = _relayout(arr, layout, r, dims, src.get("conv") or src.get("pt", ""), where)
        if tuple(arr.shape) != r.shape:
            name = src.get("conv") or src.get("pt") or src.get("bn")
            raise SpeakerModelError(f"{where}: tensor {name} gives {r.gguf} of shape {list(arr.shape)}, expected "
                                    f"{list(r.shape)} from config.yaml")
        if not np.isfinite(arr).all():
            raise SpeakerModelError(f"{where}: {r.gguf} (from {src.get('conv') or src.get('pt') or src.get('bn')}) "
                                    "contains NaN or infinite values")
        out.append((r.gguf, np.ascontiguousarray(arr, dtype=np.float32)))
    extra = sorted(k for k in sd if k not in used and not k.endswith("num_batches_tracked"))
    if extra:
        raise SpeakerModelError(f"{where}: unexpected tensor {extra[0]!r}" +
                                (f" (and {len(extra) - 1} more)" if len(extra) > 1 else "") +
                                " for this config.yaml (a different CAM++ architecture?)")
    return out


def read_campplus_folder(path: str | os.PathLike[str]) -> tuple[dict[str, Any], dict[str, Any],
                                                               list[tuple[str, np.ndarray]]]:
    """(config.yaml, GGUF metadata, [(gguf name, float32 array)]) of a FunASR/ModelScope CAM++ folder."""
    from fun_asr.model.torch_pickle import ModelFileError, load_state_dict

    p = Path(path)
    if not p.is_dir():
        raise SpeakerModelError(f"{p}: not a folder (a CAM++ folder has config.yaml + campplus_cn_common.bin)")
    if not (p / "config.yaml").is_file():
        raise SpeakerModelError(f"{p}: not a CAM++ folder (no config.yaml; FunASR's layout has config.yaml, "
                                "configuration.json and campplus_cn_common.bin)")
    conf = check_conf(_read_yaml(p / "config.yaml"), str(p / "config.yaml"))
    hp = hparams(conf)
    weights = weights_path(p)
    try:
        sd = load_state_dict(weights)
    except ModelFileError as exc:
        raise SpeakerModelError(str(exc)) from None
    tensors = fold_tensors(sd, hp, str(weights))
    return conf, metadata(conf, hp), tensors


def metadata(conf: dict[str, Any], hp: dict[str, Any], repo_id: str | None = None,
             revision: str | None = None) -> dict[str, Any]:
    """A campplus GGUF's metadata (``fun_asr.model.gguf_file.submodel_metadata``)."""
    return submodel_metadata(ARCH, conf, hp, repo_id, revision)


# -- reading a GGUF --------------------------------------------------------------------------------------

def gguf_fields(path: str | os.PathLike[str]) -> dict[str, Any]:
    """The ``campplus.*`` and ``general.*`` metadata of a GGUF file (SpeakerModelError when it cannot be read)."""
    return metadata_fields(open_gguf(path, SpeakerModelError), (f"{ARCH}.", "general."))


def hparams_from_fields(fields: dict[str, Any], where: str) -> dict[str, Any]:
    """The ``campplus.*`` hyperparameters of a GGUF's metadata (every key of the spec's hparams)."""
    hp: dict[str, Any] = {}
    for key, src in load_spec(ARCH)["hparams"].items():
        if key == "doc":
            continue
        value = fields.get(f"{ARCH}.{key}")
        want_list = isinstance(src.get("value", src.get("default")), list)
        ok = (isinstance(value, list) and all(isinstance(v, int) for v in value)) if want_list else \
            isinstance(value, int) and not isinstance(value, bool)
        if not ok:
            raise SpeakerModelError(f"{where}: metadata {ARCH}.{key} is missing or not an integer"
                                    f"{' list' if want_list else ''}")
        hp[key] = value
    Dims(hp)  # validates
    return hp


def read_speaker_gguf(path: str | os.PathLike[str]) -> tuple[dict[str, Any], dict[str, Any],
                                                            list[tuple[str, np.ndarray]]]:
    """(metadata fields, hparams, [(gguf name, float32 array)]) of the CAM++ in a GGUF (a campplus file or a
    package that embeds one). Tensors are checked against the table of the file's hyperparameters."""

    p = Path(path)
    reader = open_gguf(p, SpeakerModelError)
    fields = metadata_fields(reader, (f"{ARCH}.", "general."))
    if f"{ARCH}.embedding_length" not in fields:
        raise SpeakerModelError(f"{p}: holds no CAM++ speaker model (no {ARCH}.* metadata: give a campplus GGUF, a "
                                "package that embeds one, or a FunASR CAM++ folder)")
    hp = hparams_from_fields(fields, str(p))
    expected = {r.gguf: r for r in table(hp)}
    found: dict[str, np.ndarray] = {}
    for t in reader.tensors:
        if not t.name.startswith(PREFIX):
            continue
        r = expected.get(t.name)
        if r is None:
            raise SpeakerModelError(f"{p}: unexpected speaker tensor {t.name}")
        kinds = ("F32",) if r.kind in ("bias", "kernel") else ("F32", "F16")
        if t.tensor_type.name not in kinds:
            raise SpeakerModelError(f"{p}: speaker tensor {t.name} is {t.tensor_type.name}, expected "
                                    f"{' or '.join(kinds)}")
        arr = np.asarray(t.data)
        if arr.size != int(np.prod(r.shape)):
            raise SpeakerModelError(f"{p}: speaker tensor {t.name} has {arr.size} values, expected shape "
                                    f"{list(r.shape)}")
        found[t.name] = np.ascontiguousarray(arr.astype(np.float32).reshape(r.shape))
    missing = [n for n in expected if n not in found]
    if missing:
        raise SpeakerModelError(f"{p}: speaker tensor {missing[0]} is missing")
    return fields, hp, [(n, found[n]) for n in expected]


def cast(tensors: list[tuple[str, np.ndarray]], hp: dict[str, Any], type: str) -> list[tuple[str, np.ndarray]]:
    """Conv and matrix tensors in ``type`` (f32 or f16); kernels and biases stay F32."""
    if type not in TENSOR_TYPES:
        raise ValueError(f"unknown speaker model type {type!r}: accepted {', '.join(TENSOR_TYPES)}")
    kinds = {r.gguf: r.kind for r in table(hp)}
    dtype = np.float16 if type == "f16" else np.float32
    return [(n, a.astype(dtype) if kinds[n] in ("conv", "matrix") else a) for n, a in tensors]


def for_own_gguf(meta: dict[str, Any], tensors: list[tuple[str, np.ndarray]], hp: dict[str, Any], type: str,
                 origin: str) -> list[tuple[str, np.ndarray]]:
    """A campplus GGUF's own last touches: ``general.file_type`` and where it came from in ``meta`` (in place),
    the conv/matrix tensors in ``type``."""
    meta["general.file_type"] = 1 if type == "f16" else 0
    meta[f"{ARCH}.source"] = origin
    return cast(tensors, hp, type)


def speaker_for_embedding(path: str | os.PathLike[str], type: str | None = None) -> tuple[
        dict[str, Any], list[tuple[str, np.ndarray]]]:
    """What an ASR package embeds of a speaker model: its ``campplus.*`` metadata (with where it came from and
    its license) and its ``spk.*`` tensors. ``path``: a FunASR CAM++ folder, a ``campplus`` GGUF, or a package
    that embeds one. Conv/matrix tensors in ``type`` (f32 or f16); None: F32 from a folder, as stored (F32 or
    F16) from a GGUF."""
    p = Path(path)
    if p.is_dir():
        conf, meta, tensors = read_campplus_folder(p)
        hp = hparams(conf)
        origin = source_name(p)
    elif p.is_file():
        fields, hp, tensors = read_speaker_gguf(p)
        if type is None:
            type = "f16" if _stored_f16(p) else "f32"
        text = fields.get(f"{ARCH}.config_json")
        conf = json.loads(text) if isinstance(text, str) else {"model": "CAMPPlus"}
        meta = metadata(conf, hp)
        origin = fields.get(f"{ARCH}.source") or fields.get("general.source.huggingface.repository") or \
            source_name(p)
    else:
        raise FileNotFoundError(f"{p}: no such speaker model (a .gguf file or a FunASR CAM++ folder)")
    keys = {k: v for k, v in meta.items() if k.startswith(f"{ARCH}.")}
    keys[f"{ARCH}.source"] = str(origin)
    spec = load_spec(ARCH)
    keys[f"{ARCH}.license"] = spec["license"]["name"]
    keys[f"{ARCH}.license.link"] = spec["license"]["url"]
    return keys, cast(tensors, hp, type or "f32")


def _stored_f16(path: Path) -> bool:
    """Whether a GGUF stores its CAM++ conv/matrix tensors in F16."""
    import gguf

    reader = open_gguf(path, SpeakerModelError)
    return any(t.name.startswith(PREFIX) and t.tensor_type == gguf.GGMLQuantizationType.F16 for t in reader.tensors)
