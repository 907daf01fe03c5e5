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

The folder's parts are read by: :mod:`fun_asr.model.layouts` (which layout a folder holds),
:mod:`fun_asr.model.funasr_config` (config.yaml: hyperparameters, CTC head, prompt) and
:mod:`fun_asr.model.vocab` (language tables, the CTC vocabulary); their names used elsewhere are importable
from here too.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from fun_asr.model.checkpoint import Checkpoint, CheckpointError, CheckpointFiles, checked_eos_ids, hub_origin
from fun_asr.model.funasr_config import (
    ctc_params,
    file_metas,
    hparams_from_config,
    local_path,
    lookup,
    prompt_from_config,
    read_yaml,
    resolve_interpolations,
    section,
)
from fun_asr.model.hparams import HParams
from fun_asr.model.layouts import (
    LAYOUTS,
    REQUIRED_FILES,
    VAD_FILES,
    detect_layout,
    is_campplus_folder,
    is_funasr_nano,
    is_vad_folder,
    layout_description,
)
from fun_asr.model.spec import load_spec
from fun_asr.model.tensor_names import TensorEntry, tensor_table
from fun_asr.model.vocab import ctc_tokenizer, expand_specials, language_table, languages_for, read_tiktoken_ranks

__all__ = ["HF_NO_CTC", "LAYOUTS", "REQUIRED_FILES", "VAD_FILES", "FunasrCheckpoint", "detect_layout",
           "expand_specials", "funasr_source", "is_campplus_folder", "is_vad_folder", "language_table",
           "languages_for", "layout_description", "open_checkpoint", "read_tiktoken_ranks", "resolve_interpolations"]

HF_NO_CTC = ("Hugging Face layout: the checkpoint carries no CTC head (ctc_decoder.*, ctc.ctc_lo.*), so there "
             "are no timestamps; the ModelScope release of FunAudioLLM/Fun-ASR-Nano-2512 has it")

# torch dtype name -> the Checkpoint dtype names the writer understands
_DTYPES = {"float32": "F32", "float16": "F16", "bfloat16": "BF16"}


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



@dataclass(frozen=True)
class _LlmFolder:
    """The LLM's folder as config.yaml names it: its config.json, and its tokenizer's files."""

    path: Path
    config: dict[str, Any]
    tokenizer_json: str
    tokenizer_config: dict[str, Any] | None
    chat_template: str | None


def _llm_folder(root: Path, conf: dict[str, Any], metas: dict[str, Any]) -> _LlmFolder:
    llm_conf = section(conf, "llm_conf")
    llm_dir = (local_path(root, lookup(metas, "llm_conf.init_param_path"))
               or local_path(root, llm_conf.get("init_param_path"))
               or local_path(root, "Qwen3-0.6B"))
    if llm_dir is None:
        subdirs = [d for d in sorted(root.iterdir()) if d.is_dir() and (d / "config.json").is_file()]
        llm_dir = subdirs[0] if subdirs else None
    if llm_dir is None or not (llm_dir / "config.json").is_file():
        raise CheckpointError(f"{root}: no LLM folder with config.json (llm_conf.init_param_path "
                              f"{llm_conf.get('init_param_path')!r}; FunASR ships Qwen3-0.6B/)")
    tok_dir = (local_path(root, lookup(metas, "tokenizer_conf.init_param_path"))
               or local_path(root, lookup(conf, "tokenizer_conf.init_param_path")) or llm_dir)
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
    return _LlmFolder(llm_dir, llm_config, (tok_dir / "tokenizer.json").read_text("utf-8"), tok_cfg, chat_template)


def _state_dict(pt: Path) -> dict[str, Any]:
    """model.pt's tensors by name (a leading ``module.`` dropped), in the dtypes the writer takes."""
    from fun_asr.model.torch_pickle import ModelFileError, TorchTensor, iter_tensors, read_pickle

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
    return src


def _ctc_head(conf: dict[str, Any], hp: HParams, root: Path, metas: dict[str, Any],
              src: dict[str, Any]) -> tuple[HParams, dict[str, Any] | None, str | None]:
    """The CTC head, all or nothing: (hyperparameters with it, its tokenizer's GGUF keys, None), or
    (``hp`` unchanged, None, why there are no timestamps)."""
    params, reason = ctc_params(conf, hp, src)
    if params is None:
        return hp, None, reason
    tok, reason = ctc_tokenizer(conf, root, metas, params)
    if tok is None:
        return hp, None, reason
    hp_ctc = HParams(hp.encoder, hp.adaptor, hp.decoder, params)
    problems = _shape_problems(hp_ctc, src, only_stack="ctc")
    if problems:
        return hp, None, (f"model.pt's CTC tensors do not match config.yaml ({problems[0]}"
                          f"{f' and {len(problems) - 1} more' if len(problems) > 1 else ''}); timestamps disabled")
    return hp_ctc, tok, None


def _tensor_refs(hp: HParams, src: dict[str, Any], pt: Path) -> dict[str, _Ref]:
    """The table's tensors (HF names) -> where they are in model.pt; every model.pt tensor must be used."""
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
    return refs


@dataclass(kw_only=True)
class FunasrCheckpoint(CheckpointFiles):
    """An opened FunASR/ModelScope folder; tensors keyed by the table's HF names (see module doc)."""

    tensors: dict[str, _Ref]
    llm_dir: Path
    llm_config: dict[str, Any]
    ctc_unavailable: str | None = None
    ctc_tokenizer: dict[str, Any] | None = None  # GGUF metadata values (ctc.tokenizer.*)
    prompt: dict[str, Any] = field(default_factory=dict)
    language_table: str = "nano"
    layout: str = "funasr"
    _src: dict[str, Any] = field(default_factory=dict, repr=False)

    @classmethod
    def open(cls, path: str | os.PathLike[str]) -> FunasrCheckpoint:
        root = Path(path)
        if not is_funasr_nano(root):
            raise CheckpointError(f"{root}: not a FunASR Fun-ASR-Nano folder (model.pt + config.yaml with "
                                  "'model: FunASRNano')")
        conf = resolve_interpolations(read_yaml(root / "config.yaml"))
        metas_json = file_metas(root)
        metas = metas_json.get("file_path_metas") if isinstance(metas_json.get("file_path_metas"), dict) else {}
        llm = _llm_folder(root, conf, metas)
        hp = hparams_from_config(conf, llm.config, root)

        pt = local_path(root, metas.get("init_param")) if metas.get("init_param") else None
        pt = pt if pt is not None and pt.is_file() else root / "model.pt"
        src = _state_dict(pt)
        hp, ctc_tok, ctc_reason = _ctc_head(conf, hp, root, metas, src)
        refs = _tensor_refs(hp, src, pt)

        sources = [str(root.resolve()), root.name]
        hub = metas_json.get("model_name_in_hub")
        if isinstance(hub, dict):
            sources += [str(v) for v in hub.values() if v]
        repo_id, revision = _origin(root)
        if repo_id:
            sources.insert(0, repo_id)
        spec = load_spec()
        return cls(
            path=root, config=conf, hparams=hp, tensors=refs, tokenizer_json=llm.tokenizer_json,
            llm_dir=llm.path, llm_config=llm.config, tokenizer_config=llm.tokenizer_config,
            chat_template=llm.chat_template, repo_id=repo_id, revision=revision,
            ctc_unavailable=None if hp.ctc is not None else ctc_reason, ctc_tokenizer=ctc_tok,
            prompt=prompt_from_config(conf, spec), language_table=language_table(spec, sources, conf), _src=src,
        )

    # -- the Checkpoint interface (dtype, float32 and names are CheckpointFiles') --

    def eos_token_ids(self) -> list[int]:
        """FunASR builds the LLM with ``from_config`` and generates with the generation config that
        derives from the LLM's config.json: its eos_token_id are the stop ids (generation_config.json
        of the LLM folder is not read by FunASR, so not here either)."""
        ids = self.llm_config.get("eos_token_id")
        if ids is None:
            raise CheckpointError(f"{self.llm_dir / 'config.json'}: no eos_token_id; the decoder needs its stop tokens")
        return checked_eos_ids(ids, self.hparams.decoder.vocab, self.llm_dir / "config.json")

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
    repo, rev = hub_origin(root)
    if repo:
        return repo, rev
    parts = root.resolve().parts
    for i in range(len(parts) - 3):
        if parts[i] == "modelscope" and parts[i + 1] == "hub":
            rest = [p for p in parts[i + 2:] if p != "models"]
            if len(rest) >= 2:
                return f"modelscope:{rest[0]}/{rest[1]}", None
    return None, None



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

