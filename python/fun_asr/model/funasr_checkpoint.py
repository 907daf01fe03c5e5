"""Reads a Fun-ASR-Nano checkpoint in FunASR's own (ModelScope) layout, and tells the layouts apart.

A FunASR folder, as ModelScope ships ``FunAudioLLM/Fun-ASR-Nano-2512`` (and the non ``-hf`` HF repo):

    model.pt            torch.save({"state_dict": ...}), BF16 in the release: audio_encoder.*,
                        audio_adaptor.*, llm.model.*, llm.lm_head.weight, and on ModelScope the CTC head
                        ctc_decoder.* + ctc.ctc_lo.*
    config.yaml         FunASR's model options (audio_encoder_conf, audio_adaptor_conf, llm_conf,
                        ctc_decoder_conf, ctc_vocab_size, dataset_conf.ctc_tokenizer_conf, frontend_conf)
    configuration.json  optional: file_path_metas (paths relative to the folder), model_name_in_hub
    Qwen3-0.6B/         the LLM's config.json and tokenizer (tokenizer.json, tokenizer_config.json)
    multilingual.tiktoken   the CTC tokenizer's BPE ranks (SenseVoiceTokenizer), when the CTC head ships

:class:`FunasrCheckpoint` presents it with the interface of :class:`fun_asr.model.checkpoint.Checkpoint`: its
``tensors`` are keyed by the HF names of the one tensor table (``model_specs/fun_asr_nano.json``, column
``funasr`` gives each tensor's model.pt name; the fused ``linear_q_k_v`` is split into q, k, v), so the
converter and the direct loader treat both layouts alike and write identical tensors for identical
weights. ``model.pt`` is read by :mod:`fun_asr.model.torch_pickle` (no pickle code runs; strides honoured).

Hyperparameters come from config.yaml and the LLM's config.json; the prompt from the model spec adjusted
by config.yaml (``use_low_frame_rate``, ``dataset_conf.sys_prompt`` / ``do_think``). The CTC head is
kept when, and only when, every CTC tensor is present with its shape and the CTC vocabulary is found
(FunASR 1.4.16 disables timestamps otherwise); ``ctc_unavailable`` then says why.
"""

from __future__ import annotations

import base64
import copy
import json
import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from fun_asr.model.checkpoint import Checkpoint, CheckpointError, to_float32
from fun_asr.model.hparams import ConfigError, CtcParams, HParams, parse_hparams
from fun_asr.model.spec import load_spec
from fun_asr.model.tensor_names import TensorEntry, tensor_table

LAYOUTS = ("hf", "funasr", "fsmn_vad", "campplus")

HF_NO_CTC = ("Hugging Face layout: the checkpoint carries no CTC head (ctc_decoder.*, ctc.ctc_lo.*), so there "
             "are no timestamps; the ModelScope release of FunAudioLLM/Fun-ASR-Nano-2512 has it")

# torch dtype name -> the Checkpoint dtype names the writer understands
_DTYPES = {"float32": "F32", "float16": "F16", "bfloat16": "BF16"}


# -- layout detection ---------------------------------------------------------------------------


VAD_FILES = ("model.pt", "config.yaml", "am.mvn")  # a FunASR FSMN-VAD folder
REQUIRED_FILES = VAD_FILES


def is_vad_folder(path: str | os.PathLike[str]) -> bool:
    """A FunASR FSMN-VAD folder: model.pt + config.yaml naming an FSMN VAD + am.mvn."""
    p = Path(path)
    if not (p.is_dir() and all((p / f).is_file() for f in VAD_FILES)):
        return False
    try:
        text = (p / "config.yaml").read_text("utf-8", errors="replace")
    except OSError:
        return False
    return "FsmnVAD" in text or "encoder: FSMN" in text


def is_campplus_folder(path: str | os.PathLike[str]) -> bool:
    """A FunASR/ModelScope CAM++ speaker-model folder: config.yaml naming ``model: CAMPPlus`` (the weights file,
    configuration.json and the rest are checked by fun_asr.speakers.files)."""
    p = Path(path)
    if not (p.is_dir() and (p / "config.yaml").is_file()):
        return False
    try:
        text = (p / "config.yaml").read_text("utf-8", errors="replace")
    except OSError:
        return False
    return re.search(r"(?m)^model:\s*['\"]?CAMPPlus['\"]?\s*$", text) is not None


def _read_yaml(path: Path) -> dict[str, Any]:
    import yaml

    try:
        conf = yaml.safe_load(path.read_text("utf-8"))
    except (OSError, UnicodeDecodeError, yaml.YAMLError) as exc:
        raise CheckpointError(f"{path}: cannot read ({exc})") from None
    if not isinstance(conf, dict):
        raise CheckpointError(f"{path}: not a YAML mapping")
    return conf


def _is_funasr_nano(root: Path) -> bool:
    if not ((root / "config.yaml").is_file() and (root / "model.pt").is_file()):
        return False
    try:
        text = (root / "config.yaml").read_text("utf-8", errors="replace")
    except OSError:
        return False
    return re.search(r"(?m)^model:\s*['\"]?FunASRNano\b", text) is not None


def detect_layout(path: str | os.PathLike[str]) -> str:
    """Which checkpoint layout a folder holds: ``"hf"`` (config.json + model*.safetensors, the
    Transformers port), ``"funasr"`` (model.pt + config.yaml naming FunASRNano + the LLM folder, as
    ModelScope ships it), ``"fsmn_vad"`` (FunASR's VAD: model.pt, config.yaml, am.mvn) or ``"campplus"`` (FunASR's
    CAM++ speaker model: config.yaml naming CAMPPlus + campplus_cn_common.bin).
    Raises :class:`CheckpointError` (a ValueError) naming what is accepted otherwise."""

    root = Path(path)
    if not root.exists():
        raise CheckpointError(f"{root}: no such file or directory")
    if not root.is_dir():
        raise CheckpointError(f"{root}: not a checkpoint directory (expected a folder: Hugging Face config.json + "
                              "model.safetensors, or FunASR model.pt + config.yaml; a .gguf file is loaded as is)")
    if is_vad_folder(root):
        return "fsmn_vad"
    if is_campplus_folder(root):
        return "campplus"
    if _is_funasr_nano(root):
        return "funasr"
    if (root / "config.json").is_file() or any(root.glob("*.safetensors")) or (
            root / "model.safetensors.index.json").is_file():
        return "hf"  # possibly incomplete: the HF reader says precisely what is missing
    present = sorted(p.name for p in root.iterdir())[:12]
    raise CheckpointError(
        f"{root}: not a checkpoint folder fun-asr reads (found: {', '.join(present) or 'nothing'}). Accepted: "
        "a Hugging Face Fun-ASR-Nano folder (config.json + model.safetensors + tokenizer.json), a FunASR / "
        "ModelScope Fun-ASR-Nano folder (model.pt + config.yaml with 'model: FunASRNano' + the Qwen3-0.6B "
        "folder), a FunASR FSMN-VAD folder (model.pt + config.yaml + am.mvn), or a FunASR CAM++ folder (config.yaml "
        "with 'model: CAMPPlus' + campplus_cn_common.bin)")


def layout_description(layout: str) -> str:
    """One line for the converter to print: which layout it read."""
    return {
        "hf": "Hugging Face Fun-ASR-Nano checkpoint (config.json, safetensors, tokenizer.json)",
        "funasr": "FunASR/ModelScope Fun-ASR-Nano checkpoint (model.pt, config.yaml, LLM folder)",
        "fsmn_vad": "FunASR FSMN-VAD folder (model.pt, config.yaml, am.mvn)",
        "campplus": "FunASR CAM++ speaker-model folder (config.yaml, campplus_cn_common.bin)",
    }[layout]


def open_checkpoint(path: str | os.PathLike[str]) -> Checkpoint | FunasrCheckpoint:
    """The checkpoint of an HF or FunASR folder, with one interface (see the module doc)."""
    layout = detect_layout(path)
    if layout == "hf":
        return Checkpoint.open(path)
    if layout == "funasr":
        return FunasrCheckpoint.open(path)
    if layout == "campplus":
        raise CheckpointError(f"{path}: is a CAM++ speaker-model folder, not a Fun-ASR-Nano checkpoint (convert it on "
                              "its own: fun-asr-convert writes a campplus GGUF)")
    raise CheckpointError(f"{path}: is an FSMN-VAD folder, not a Fun-ASR-Nano checkpoint (convert it on its own: "
                          "fun-asr-convert writes an fsmn_vad GGUF)")


# -- config.yaml helpers ------------------------------------------------------------------------

_INTERP = re.compile(r"\$\{([A-Za-z0-9_.]+)\}")


def _lookup(conf: dict[str, Any], dotted: str) -> Any:
    cur: Any = conf
    for part in dotted.split("."):
        if not isinstance(cur, dict) or part not in cur:
            return None
        cur = cur[part]
    return cur


def resolve_interpolations(conf: dict[str, Any]) -> dict[str, Any]:
    """OmegaConf-style ``${a.b}`` references in string values, resolved against the config itself
    (a reference to a missing key is left as written)."""
    def fix(v: Any, depth: int = 0) -> Any:
        if isinstance(v, dict):
            return {k: fix(x, depth) for k, x in v.items()}
        if isinstance(v, list):
            return [fix(x, depth) for x in v]
        if isinstance(v, str) and depth < 8:
            m = _INTERP.fullmatch(v)
            if m:
                target = _lookup(conf, m.group(1))
                return v if target is None else fix(target, depth + 1)
            return _INTERP.sub(lambda mm: str(_lookup(conf, mm.group(1)) or mm.group(0)), v)
        return v

    return fix(conf)


def _conf(conf: dict[str, Any], name: str) -> dict[str, Any]:
    v = conf.get(name)
    if v is None:
        return {}
    if not isinstance(v, dict):
        raise CheckpointError(f"config.yaml: {name} must be a mapping, got {type(v).__name__}")
    return v


def _file_metas(root: Path) -> dict[str, Any]:
    p = root / "configuration.json"
    if not p.is_file():
        return {}
    try:
        data = json.loads(p.read_text("utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise CheckpointError(f"{p}: not valid JSON ({exc})") from None
    return data if isinstance(data, dict) else {}


def _local_path(root: Path, value: Any) -> Path | None:
    """A path named in config.yaml / configuration.json: relative to the folder, or absolute (FunASR
    resolves configuration.json's file_path_metas against the folder)."""
    if not isinstance(value, str) or not value:
        return None
    p = Path(value)
    for cand in ((root / p) if not p.is_absolute() else p, root / p.name):
        if cand.exists():
            return cand
    return None


# -- the checkpoint -----------------------------------------------------------------------------

@dataclass(frozen=True)
class _Ref:
    source: str  # model.pt name
    part: tuple[int, int] | None  # (k, n): rows k of n of the source (fused q/k/v)
    shape: tuple[int, ...]
    dtype: str  # F32 | F16 | BF16


def _encoder_names(hp: HParams, layer: int) -> dict[str, str]:
    e = hp.encoder
    n_main = e.n_layers - e.n_tp_layers
    if layer == 0:
        enc = "encoders0.0"
    elif layer < n_main:
        enc = f"encoders.{layer - 1}"
    else:
        enc = f"tp_encoders.{layer - n_main}"
    return {"{enc}": enc, "{enc_norm}": "after_norm" if layer == n_main - 1 else "tp_norm"}


def funasr_source(entry: TensorEntry, hp: HParams) -> tuple[str, tuple[int, int] | None]:
    """The model.pt name (and fused part) of one table entry."""
    name = entry.funasr
    if not name:
        raise CheckpointError(f"tensor table: {entry.gguf} has no FunASR name")
    if entry.stack == "enc" and entry.layer is not None:
        for k, v in _encoder_names(hp, entry.layer).items():
            name = name.replace(k, v)
    part = None
    if entry.funasr_part:
        k, n = (int(x) for x in entry.funasr_part.split("/"))
        part = (k, n)
    return name, part


def language_table(spec: dict[str, Any], sources: list[str], config: dict[str, Any] | None = None) -> str:
    """The language variant (``model_specs`` ``language_tables.variants`` key: ``nano`` or ``mlt_nano``)
    for a checkpoint: an explicit ``language_table`` in its config, else the first variant whose
    pattern occurs in one of ``sources`` (repo ids, hub names, folder names; case-insensitive)."""
    tables = spec["language_tables"]
    variants = tables["variants"]
    explicit = (config or {}).get("language_table")
    if isinstance(explicit, str):
        if explicit not in variants:
            raise CheckpointError(f"config: language_table {explicit!r} is not one of {', '.join(variants)}")
        return explicit
    for name, v in variants.items():
        for pat in v.get("patterns", []):
            if any(pat.lower() in s.lower() for s in sources if s):
                return name
    return tables["default"]


def languages_for(spec: dict[str, Any], variant: str | None) -> dict[str, Any]:
    """The languages table (code -> names, prompt_name, join) of a variant; None / unknown -> the default."""
    tables = spec.get("language_tables")
    if not tables:
        return spec["languages"]
    v = tables["variants"].get(variant or tables["default"]) or tables["variants"][tables["default"]]
    return spec[v["table"]]


def expand_specials(recipe: dict[str, Any], num_languages: int) -> list[str]:
    """The special tokens of a SenseVoice-style tiktoken vocabulary, in id order (model spec recipe)."""
    out: list[str] = []
    for item in recipe["specials"]:
        if isinstance(item, str):
            out.append(item)
        elif "each" in item:
            values = list(recipe[item["each"]])
            if item.get("limit") == "num_languages":
                values = values[:num_languages]
            out += [item["format"].replace("{}", str(v)) for v in values]
        else:
            a, b = item["range"]
            scale = item.get("scale")
            for i in range(a, b):
                out.append(item["format"].format(i * scale if scale is not None else i))
    return out


def read_tiktoken_ranks(path: Path) -> str:
    """The text of a tiktoken BPE file (``base64 rank`` per line), checked: ranks are 0..n-1, each once,
    and every single byte is a token (tiktoken's byte-pair merge needs them)."""
    try:
        text = path.read_text("ascii")
    except (OSError, UnicodeDecodeError) as exc:
        raise CheckpointError(f"{path}: cannot read the CTC vocabulary ({exc})") from None
    ranks: set[int] = set()
    singles = 0
    for no, line in enumerate(text.splitlines(), 1):
        if not line:
            continue
        parts = line.split()
        if len(parts) != 2 or not parts[1].isdigit():
            raise CheckpointError(f"{path}:{no}: expected 'base64-token rank'")
        try:
            tok = base64.b64decode(parts[0], validate=True)
        except ValueError:
            raise CheckpointError(f"{path}:{no}: token is not base64") from None
        ranks.add(int(parts[1]))
        singles += len(tok) == 1
    n = len(ranks)
    if n == 0 or max(ranks) != n - 1:
        raise CheckpointError(f"{path}: ranks must be 0..n-1, each once ({n} distinct ranks, largest "
                              f"{max(ranks, default=-1)})")
    if singles < 256:
        raise CheckpointError(f"{path}: only {singles} of the 256 single-byte tokens are in the vocabulary")
    return text


@dataclass
class FunasrCheckpoint:
    """An opened FunASR/ModelScope folder; tensors keyed by the table's HF names (see module doc)."""

    path: Path
    config: dict[str, Any]  # config.yaml, ${...} resolved
    hparams: HParams
    tensors: dict[str, _Ref]
    tokenizer_json: str
    llm_dir: Path
    llm_config: dict[str, Any]
    tokenizer_config: dict[str, Any] | None = None
    chat_template: str | None = None
    preprocessor_config: dict[str, Any] | None = None
    generation_config: dict[str, Any] | None = None
    repo_id: str | None = None
    revision: str | None = None
    ctc_unavailable: str | None = None
    ctc_tokenizer: dict[str, Any] | None = None  # GGUF metadata values (ctc.tokenizer.*)
    prompt: dict[str, Any] = field(default_factory=dict)
    language_table: str = "nano"
    layout: str = "funasr"
    _src: dict[str, Any] = field(default_factory=dict, repr=False)

    @classmethod
    def open(cls, path: str | os.PathLike[str]) -> FunasrCheckpoint:
        from fun_asr.model.torch_pickle import ModelFileError, TorchTensor, iter_tensors, read_pickle

        root = Path(path)
        if not _is_funasr_nano(root):
            raise CheckpointError(f"{root}: not a FunASR Fun-ASR-Nano folder (model.pt + config.yaml with "
                                  "'model: FunASRNano')")
        conf = resolve_interpolations(_read_yaml(root / "config.yaml"))
        metas_json = _file_metas(root)
        metas = metas_json.get("file_path_metas") if isinstance(metas_json.get("file_path_metas"), dict) else {}

        # -- the LLM folder (config + tokenizer) --
        llm_conf = _conf(conf, "llm_conf")
        llm_dir = (_local_path(root, _lookup(metas, "llm_conf.init_param_path"))
                   or _local_path(root, llm_conf.get("init_param_path"))
                   or _local_path(root, "Qwen3-0.6B"))
        if llm_dir is None:
            subdirs = [d for d in sorted(root.iterdir()) if d.is_dir() and (d / "config.json").is_file()]
            llm_dir = subdirs[0] if subdirs else None
        if llm_dir is None or not (llm_dir / "config.json").is_file():
            raise CheckpointError(f"{root}: no LLM folder with config.json (llm_conf.init_param_path "
                                  f"{llm_conf.get('init_param_path')!r}; FunASR ships Qwen3-0.6B/)")
        tok_dir = (_local_path(root, _lookup(metas, "tokenizer_conf.init_param_path"))
                   or _local_path(root, _lookup(conf, "tokenizer_conf.init_param_path")) or llm_dir)
        if not (tok_dir / "tokenizer.json").is_file():
            raise CheckpointError(f"{tok_dir}: missing tokenizer.json (the LLM tokenizer)")
        try:
            llm_config = json.loads((llm_dir / "config.json").read_text("utf-8"))
            tok_cfg = (json.loads((tok_dir / "tokenizer_config.json").read_text("utf-8"))
                       if (tok_dir / "tokenizer_config.json").is_file() else None)
        except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
            raise CheckpointError(f"{llm_dir}: cannot read the LLM config ({exc})") from None
        if llm_config.get("rope_scaling"):
            raise CheckpointError(f"{llm_dir / 'config.json'}: rope_scaling {llm_config['rope_scaling']!r} is not "
                                  "supported (plain RoPE only)")
        chat_template = None
        if (tok_dir / "chat_template.jinja").is_file():
            chat_template = (tok_dir / "chat_template.jinja").read_text("utf-8")
        elif tok_cfg and isinstance(tok_cfg.get("chat_template"), str):
            chat_template = tok_cfg["chat_template"]

        # -- hyperparameters --
        hp = _hparams(conf, llm_config, root)

        # -- model.pt --
        pt = _local_path(root, metas.get("init_param")) if metas.get("init_param") else None
        pt = pt if pt is not None and pt.is_file() else root / "model.pt"
        try:
            tree = read_pickle(pt)
        except ModelFileError as exc:
            raise CheckpointError(str(exc)) from None
        if isinstance(tree, dict) and not any(isinstance(v, TorchTensor) for v in tree.values()):
            for key in ("state_dict", "model_state_dict", "model"):
                if isinstance(tree.get(key), dict):
                    tree = tree[key]
                    break
        src: dict[str, Any] = {}
        for name, t in iter_tensors(tree):
            src[name[len("module."):] if name.startswith("module.") else name] = t
        if not src:
            raise CheckpointError(f"{pt}: no tensors in the state_dict")
        bad = [(n, t.dtype) for n, t in src.items() if t.dtype not in _DTYPES]
        if bad:
            raise CheckpointError(f"{pt}: tensor {bad[0][0]} has dtype {bad[0][1]}; accepted: float32, float16, "
                                  "bfloat16")

        # -- the CTC head: all or nothing --
        ctc_params, ctc_reason = _ctc_params(conf, hp, src)
        ctc_tok = None
        if ctc_params is not None:
            ctc_tok, ctc_reason = _ctc_tokenizer(conf, root, metas, ctc_params)
            if ctc_tok is None:
                ctc_params = None
        if ctc_params is not None:
            hp_ctc = HParams(hp.encoder, hp.adaptor, hp.decoder, ctc_params)
            problems = _shape_problems(hp_ctc, src, only_stack="ctc")
            if problems:
                ctc_params, ctc_reason = None, (
                    f"model.pt's CTC tensors do not match config.yaml ({problems[0]}"
                    f"{f' and {len(problems) - 1} more' if len(problems) > 1 else ''}); timestamps disabled")
            else:
                hp = hp_ctc
        if ctc_params is None:
            ctc_tok = None

        refs: dict[str, _Ref] = {}
        used: set[str] = set()
        for entry in tensor_table(hp):
            name, part = funasr_source(entry, hp)
            if entry.gguf == "token_embd.weight" and hp.decoder.tie_embeddings and "llm.lm_head.weight" in src:
                # FunASR ties lm_head to embed_tokens and loads llm.lm_head.weight last into the shared
                # parameter: that is the value its model uses for both.
                used.add(name)
                name = "llm.lm_head.weight"
            if name not in src:
                raise CheckpointError(f"{pt}: missing tensor {name} (for {entry.gguf})")
            t = src[name]
            want = entry.shape if part is None else (entry.shape[0] * part[1], *entry.shape[1:])
            if tuple(t.shape) != tuple(want):
                raise CheckpointError(f"{pt}: tensor {name} has shape {list(t.shape)}, expected {list(want)} from "
                                      "config.yaml and the LLM config")
            refs[entry.hf] = _Ref(name, part, entry.shape, _DTYPES[t.dtype])
            used.add(name)
        if hp.decoder.tie_embeddings:
            used.add("llm.lm_head.weight")
        extra = [n for n in src if n not in used and not (hp.ctc is None and n.startswith(("ctc_decoder.", "ctc.")))]
        if extra:
            raise CheckpointError(f"{pt}: unexpected tensor {extra[0]}"
                                  + (f" (and {len(extra) - 1} more)" if len(extra) > 1 else "")
                                  + "; config.yaml does not account for it (LoRA adapters must be merged first)")

        sources = [str(root.resolve()), root.name]
        hub = metas_json.get("model_name_in_hub")
        if isinstance(hub, dict):
            sources += [str(v) for v in hub.values() if v]
        repo_id, revision = _origin(root)
        if repo_id:
            sources.insert(0, repo_id)
        spec = load_spec()
        return cls(
            path=root, config=conf, hparams=hp, tensors=refs,
            tokenizer_json=(tok_dir / "tokenizer.json").read_text("utf-8"),
            llm_dir=llm_dir, llm_config=llm_config, tokenizer_config=tok_cfg, chat_template=chat_template,
            repo_id=repo_id, revision=revision, ctc_unavailable=None if hp.ctc is not None else ctc_reason,
            ctc_tokenizer=ctc_tok, prompt=_prompt(conf, spec), language_table=language_table(spec, sources, conf),
            _src=src,
        )

    # -- the Checkpoint interface --

    def eos_token_ids(self) -> list[int]:
        """FunASR builds the LLM with ``from_config`` and generates with the generation config that
        derives from the LLM's config.json: its eos_token_id are the stop ids (generation_config.json
        of the LLM folder is not read by FunASR, so not here either)."""
        ids = self.llm_config.get("eos_token_id")
        if ids is None:
            raise CheckpointError(f"{self.llm_dir / 'config.json'}: no eos_token_id; the decoder needs its stop tokens")
        ids = [ids] if isinstance(ids, int) else list(ids)
        bad = [i for i in ids if not isinstance(i, int) or not 0 <= i < self.hparams.decoder.vocab]
        if bad:
            raise CheckpointError(f"{self.llm_dir / 'config.json'}: eos_token_id {bad} outside the vocabulary")
        return ids

    def raw(self, name: str) -> np.ndarray:
        """The stored array (float32, float16, or BF16 as uint16): a C-contiguous copy (model.pt tensors
        may be strided), the q/k/v rows of a fused tensor sliced out."""
        ref = self.tensors[name]
        arr = self._src[ref.source].raw()
        if ref.part is not None:
            k, n = ref.part
            rows = arr.shape[0] // n
            arr = np.ascontiguousarray(arr[k * rows:(k + 1) * rows])
        return arr

    def dtype(self, name: str) -> str:
        return self.tensors[name].dtype

    def float32(self, name: str) -> np.ndarray:
        return to_float32(self.raw(name), self.tensors[name].dtype == "BF16")

    def names(self):  # noqa: ANN201 - Iterator[str]
        return iter(self.tensors)

    def close(self) -> None:
        pass

    def extra_metadata(self) -> dict[str, Any]:
        """GGUF keys this layout adds (CTC head, CTC tokenizer, LLM config, source files)."""
        k = "fun_asr_nano."
        meta: dict[str, Any] = {k + "source.llm_config_json": json.dumps(self.llm_config, ensure_ascii=False)}
        if self.ctc_tokenizer:
            meta.update(self.ctc_tokenizer)
        return meta


def _origin(root: Path) -> tuple[str | None, str | None]:
    """(repo id, revision) of a hub cache folder: ModelScope (``.../modelscope/hub/[models/]owner/name``)
    gives ``modelscope:owner/name``; the HF cache gives ``owner/name`` and the snapshot revision."""
    from fun_asr.model.checkpoint import _hub_origin

    repo, rev = _hub_origin(root)
    if repo:
        return repo, rev
    parts = root.resolve().parts
    for i in range(len(parts) - 3):
        if parts[i] == "modelscope" and parts[i + 1] == "hub":
            rest = [p for p in parts[i + 2:] if p != "models"]
            if len(rest) >= 2:
                return f"modelscope:{rest[0]}/{rest[1]}", None
    return None, None


def _check(cond: bool, message: str) -> None:
    if not cond:
        raise CheckpointError(f"config.yaml: {message}")


def _hparams(conf: dict[str, Any], llm_config: dict[str, Any], root: Path) -> HParams:
    spec = load_spec()
    enc_name = conf.get("audio_encoder")
    _check(enc_name == "SenseVoiceEncoderSmall",
           f"audio_encoder {enc_name!r} is not supported (accepted: SenseVoiceEncoderSmall)")
    enc = _conf(conf, "audio_encoder_conf")
    _check(enc.get("hub") != "ms", "audio_encoder_conf.hub 'ms' (an encoder downloaded from another model) is not "
                                   "supported")
    _check(int(enc.get("sanm_shfit", 0) or 0) == 0, f"audio_encoder_conf.sanm_shfit {enc.get('sanm_shfit')} is not "
                                                    "supported (accepted: 0)")
    _check(enc.get("normalize_before", True) is True, "audio_encoder_conf.normalize_before must be true")
    _check(enc.get("selfattention_layer_type", "sanm") == "sanm",
           f"audio_encoder_conf.selfattention_layer_type {enc.get('selfattention_layer_type')!r} is not supported")
    num_blocks, tp_blocks = int(enc.get("num_blocks", 6)), int(enc.get("tp_blocks", 0))
    _check(num_blocks >= 1 and tp_blocks >= 1,
           f"audio_encoder_conf num_blocks {num_blocks} / tp_blocks {tp_blocks}: both must be >= 1 (with tp_blocks 0 "
           "FunASR applies after_norm and tp_norm back to back, which the tensor table cannot hold)")
    fe = _conf(conf, "frontend_conf")
    ours = spec["frontend"]
    _check(conf.get("frontend", "WavFrontend") == "WavFrontend",
           f"frontend {conf.get('frontend')!r} is not supported (accepted: WavFrontend)")
    for key, want in (("fs", ours["sample_rate"]), ("n_mels", ours["fbank"]["num_mel_bins"]),
                      ("frame_length", ours["fbank"]["frame_length_ms"]),
                      ("frame_shift", ours["fbank"]["frame_shift_ms"]), ("window", ours["fbank"]["window"]),
                      ("lfr_m", ours["lfr_m"]), ("lfr_n", ours["lfr_n"])):
        if key in fe:
            _check(fe[key] == want, f"frontend_conf.{key} is {fe[key]!r}; fun-asr's frontend has {want!r}")
    _check(not fe.get("cmvn_file"), "frontend_conf.cmvn_file is set; fun-asr's Fun-ASR-Nano frontend has no CMVN")

    adp_name = conf.get("audio_adaptor")
    _check(adp_name == "Transformer", f"audio_adaptor {adp_name!r} is not supported (accepted: Transformer)")
    adp = _conf(conf, "audio_adaptor_conf")
    llm_d = int(llm_config.get("hidden_size", 0))
    n_main = num_blocks
    config = {
        "audio_config": {
            "hidden_size": enc.get("output_size", 256),
            "num_attention_heads": enc.get("attention_heads", 4),
            "intermediate_size": enc.get("linear_units", 2048),
            "num_hidden_layers": n_main + tp_blocks,
            "num_timestamp_prediction_layers": tp_blocks,
            "fsmn_kernel_size": enc.get("kernel_size", 11),
            "num_mel_bins": fe.get("n_mels", ours["fbank"]["num_mel_bins"]),
            "num_stacked_frames": fe.get("lfr_m", ours["lfr_m"]),
            "max_position_embeddings": spec["limits"]["default_max_lfr_frames"] + 1,
            "layer_norm_eps": 1e-5,  # SenseVoice's LayerNorm is torch's default
        },
        "adaptor_config": {
            # FunASR sets llm_dim from the LLM and encoder_dim from the encoder; FFN is llm_dim // 4 and
            # the blocks' LayerNorm has eps 1e-12 (funasr.models.transformer.layer_norm)
            "hidden_size": llm_d,
            "projector_hidden_size": adp.get("ffn_dim", 2048),
            "num_attention_heads": adp.get("attention_heads", 8),
            "intermediate_size": llm_d // 4,
            "num_hidden_layers": adp.get("n_layer", 2),
            "downsample_rate": adp.get("downsample_rate", 2),
            "layer_norm_eps": spec["ctc"]["layer_norm_eps"],
        },
        "text_config": llm_config,
    }
    try:
        return parse_hparams(config)
    except ConfigError as exc:
        raise CheckpointError(f"{root}: {str(exc).replace('config.json', 'config.yaml / LLM config.json')}") from None


def _ctc_params(conf: dict[str, Any], hp: HParams, src: dict[str, Any]) -> tuple[CtcParams | None, str | None]:
    ctc_names = sorted(n for n in src if n.startswith(("ctc_decoder.", "ctc.")))
    name = conf.get("ctc_decoder")
    if not name:
        if ctc_names:
            return None, (f"model.pt has {len(ctc_names)} CTC tensors but config.yaml names no ctc_decoder; "
                          "they are ignored (no timestamps)")
        return None, "config.yaml names no ctc_decoder and model.pt has no CTC tensors: no timestamps"
    if name != "Transformer":
        return None, f"config.yaml: ctc_decoder {name!r} is not supported (accepted: Transformer); no timestamps"
    c = _conf(conf, "ctc_decoder_conf")
    if int(c.get("downsample_rate", 2)) != 1:
        return None, (f"config.yaml: ctc_decoder_conf.downsample_rate {c.get('downsample_rate', 2)} is not "
                      "supported (accepted: 1); no timestamps")
    d = int(c.get("llm_dim", 4096))
    vocab = int(conf.get("ctc_vocab_size", 60515))
    blank = int(_conf(conf, "ctc_conf").get("blank_id", vocab - 1))
    params = CtcParams(d_model=d, proj=int(c.get("ffn_dim", 2048)), n_heads=int(c.get("attention_heads", 8)),
                       ffn=d // 4, n_layers=int(c.get("n_layer", 2)), vocab=vocab, blank_id=blank,
                       eps=float(load_spec()["ctc"]["layer_norm_eps"]), frame_ms=int(load_spec()["ctc"]["frame_ms"]))
    if d % params.n_heads or not 0 <= blank < vocab:
        return None, (f"config.yaml: ctc_decoder_conf / ctc_conf are inconsistent (llm_dim {d}, heads "
                      f"{params.n_heads}, blank_id {blank}, ctc_vocab_size {vocab}); no timestamps")
    expected = [e for e in tensor_table(HParams(hp.encoder, hp.adaptor, hp.decoder, params)) if e.stack == "ctc"]
    missing = [e.funasr for e in expected if e.funasr not in src]
    if missing:
        shown = ", ".join(missing[:3]) + (", ..." if len(missing) > 3 else "")
        return None, (f"model.pt lacks {len(missing)} of the {len(expected)} CTC tensors ({shown}); FunASR disables "
                      "timestamps for such a checkpoint, and so does fun-asr (text is unaffected)")
    return params, None


def _shape_problems(hp: HParams, src: dict[str, Any], only_stack: str) -> list[str]:
    out = []
    for e in tensor_table(hp):
        if e.stack != only_stack:
            continue
        t = src.get(e.funasr)
        if t is None:
            out.append(f"{e.funasr} missing")
        elif tuple(t.shape) != e.shape:
            out.append(f"{e.funasr} has shape {list(t.shape)}, expected {list(e.shape)}")
    return out


def _ctc_tokenizer(conf: dict[str, Any], root: Path, metas: dict[str, Any],
                   params: CtcParams) -> tuple[dict[str, Any] | None, str | None]:
    ds = _conf(conf, "dataset_conf")
    name = conf.get("ctc_tokenizer", ds.get("ctc_tokenizer"))
    tconf = conf.get("ctc_tokenizer_conf", ds.get("ctc_tokenizer_conf")) or {}
    recipes = load_spec()["ctc"]["tokenizers"]
    if name not in recipes:
        return None, (f"config.yaml: ctc_tokenizer {name!r} is not supported (accepted: {', '.join(recipes)}); "
                      "no timestamps")
    recipe = recipes[name]
    vocab = (_local_path(root, _lookup(metas, "dataset_conf.ctc_tokenizer_conf.vocab_path"))
             or _local_path(root, _lookup(metas, "ctc_tokenizer_conf.vocab_path"))
             or _local_path(root, tconf.get("vocab_path"))
             or _local_path(root, recipe["vocab_file"]))
    if vocab is None:
        found = sorted(root.glob("*.tiktoken"))
        vocab = found[0] if len(found) == 1 else None
    if vocab is None or not vocab.is_file():
        return None, (f"{root}: the CTC head is complete but its vocabulary ({recipe['vocab_file']}, "
                      f"ctc_tokenizer_conf.vocab_path {tconf.get('vocab_path')!r}) is not in the folder; no timestamps")
    if not tconf.get("is_multilingual", True):
        return None, "config.yaml: ctc_tokenizer_conf.is_multilingual false (the GPT-2 vocabulary) is not supported"
    ranks = read_tiktoken_ranks(vocab)
    specials = expand_specials(recipe, int(tconf.get("num_languages", 8749)))
    k = "fun_asr_nano.ctc.tokenizer."
    return {
        k + "type": recipe["format"],
        k + "name": name,
        k + "pattern": recipe["pattern"],
        k + "ranks": ranks,
        k + "specials": json.dumps(specials, ensure_ascii=False),
        k + "source": vocab.name,
    }, None


def _prompt(conf: dict[str, Any], spec: dict[str, Any]) -> dict[str, Any]:
    """The spec's prompt, adjusted as FunASR's data_load_speech does from config.yaml: no halving of the
    audio length without use_low_frame_rate; no system turn with dataset_conf.sys_prompt false; the empty
    think block appended with dataset_conf.do_think false."""
    p = copy.deepcopy(spec["prompt"])
    if not _conf(conf, "audio_adaptor_conf").get("use_low_frame_rate", False):
        p["fake_token_len"] = dict(p["fake_token_len"], halvings=0)
    ds = _conf(conf, "dataset_conf")
    if ds.get("sys_prompt", True) is False:
        p["template"] = p["template"].replace("<|im_start|>system\n{system}<|im_end|>\n", "")
    if ds.get("do_think", True) is False:
        p["template"] += "<think>\n\n</think>\n\n"
    return p
