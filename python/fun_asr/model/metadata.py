"""A checkpoint's GGUF metadata (hyperparameters, tokenizer, spec) and its tensor check: shared by the
writer and the in-memory loader."""

from __future__ import annotations

import json
from typing import Any

import gguf

from fun_asr.model.checkpoint import Checkpoint, CheckpointError
from fun_asr.model.funasr_checkpoint import HF_NO_CTC, FunasrCheckpoint, language_table
from fun_asr.model.hparams import HParams
from fun_asr.model.spec import FAMILY, load_spec, spec_text
from fun_asr.model.tensor_names import TensorEntry

ARCH = FAMILY
FILE_TYPE = {"f32": 0, "f16": 1, "q8_0": 7, "q4_k_m": 15}  # general.file_type of each package type


# each part of HParams: (GGUF key after "fun_asr_nano.<part>.", its field), in the files' key order
_HPARAM_KEYS: dict[str, tuple[tuple[str, str], ...]] = {
    "encoder": (("input_size", "input_size"), ("num_mel_bins", "num_mel_bins"),
                ("num_stacked_frames", "num_stacked_frames"), ("embedding_length", "d_model"),
                ("block_count", "n_layers"), ("tp_block_count", "n_tp_layers"), ("attention.head_count", "n_heads"),
                ("feed_forward_length", "ffn"), ("fsmn_kernel_size", "fsmn_kernel"),
                ("context_length", "max_positions"), ("attention.layer_norm_epsilon", "eps")),
    "adaptor": (("embedding_length", "d_model"), ("projector_length", "proj"), ("block_count", "n_layers"),
                ("attention.head_count", "n_heads"), ("feed_forward_length", "ffn"),
                ("attention.layer_norm_epsilon", "eps")),
    "decoder": (("embedding_length", "d_model"), ("block_count", "n_layers"), ("attention.head_count", "n_heads"),
                ("attention.head_count_kv", "n_kv_heads"), ("attention.key_length", "head_dim"),
                ("feed_forward_length", "ffn"), ("vocab_size", "vocab"), ("context_length", "max_positions"),
                ("attention.layer_norm_rms_epsilon", "rms_eps"), ("rope.freq_base", "rope_theta"),
                ("tie_word_embeddings", "tie_embeddings")),
    "ctc": (("embedding_length", "d_model"), ("projector_length", "proj"), ("attention.head_count", "n_heads"),
            ("feed_forward_length", "ffn"), ("block_count", "n_layers"), ("vocab_size", "vocab"),
            ("blank_id", "blank_id"), ("attention.layer_norm_epsilon", "eps"), ("frame_ms", "frame_ms")),
}
_FLOAT_FIELDS = {"eps", "rms_eps", "rope_theta"}  # stored as float32 whatever the config wrote


def _hparam_keys(prefix: str, params: object, fields: tuple[tuple[str, str], ...]) -> dict[str, Any]:
    """One part's GGUF keys: ``prefix + key`` -> the field's value."""
    return {prefix + key: float(getattr(params, name)) if name in _FLOAT_FIELDS else getattr(params, name)
            for key, name in fields}


def check_tensors(ckpt: Checkpoint | FunasrCheckpoint, entries: list[TensorEntry]) -> None:
    """Every table entry present with its shape, and nothing else; errors name the tensor."""
    expected = {e.hf: e for e in entries}
    missing = [n for n in expected if n not in ckpt.tensors]
    if missing:
        more = f" (and {len(missing) - 1} more)" if len(missing) > 1 else ""
        raise CheckpointError(f"{ckpt.path}: missing tensor {missing[0]}{more}")
    extra = [n for n in ckpt.tensors if n not in expected]
    if extra:
        hint = (
            " (tie_word_embeddings is true, so lm_head.weight is not expected)"
            if "lm_head.weight" in extra
            else ""
        )
        raise CheckpointError(
            f"{ckpt.path}: unexpected tensor {extra[0]}{hint}"
            + (f" (and {len(extra) - 1} more)" if len(extra) > 1 else "")
            + "; the config does not account for it"
        )
    for name, entry in expected.items():
        got = ckpt.tensors[name].shape
        if tuple(got) != entry.shape:
            raise CheckpointError(
                f"{ckpt.path}: tensor {name} has shape {list(got)}, expected {list(entry.shape)} from config.json"
            )


def gguf_metadata(ckpt: Checkpoint | FunasrCheckpoint, hp: HParams, package: str | None = None,
                  repo_id: str | None = None, revision: str | None = None) -> dict[str, Any]:
    """Every GGUF metadata key (docs/model.md, GGUF package) for this checkpoint, as plain Python values.

    The GGUF writer stores ints as uint32, floats as float32, lists as int arrays; loading a checkpoint
    directory directly hands the same dict to the native loader, so both paths read one set of keys.
    Both layouts (HF, FunASR) give the same keys; a FunASR checkpoint with its CTC head adds
    ``fun_asr_nano.ctc.*`` (dimensions, blank id, and the CTC tokenizer ``ctc.tokenizer.*``), one without
    says why in ``fun_asr_nano.ctc.unavailable``.
    """
    spec = load_spec()
    e, a, d = hp.encoder, hp.adaptor, hp.decoder
    k = f"{ARCH}."
    meta: dict[str, Any] = {
        "general.architecture": ARCH,
        "general.type": "model",
        "general.name": "Fun-ASR-Nano",
        "general.license": spec["license"]["name"],
        "general.license.link": spec["license"]["url"],
        "general.quantization_version": gguf.GGML_QUANT_VERSION,
    }
    if package is not None:
        meta["general.file_type"] = FILE_TYPE[package]
    repo_id, revision = repo_id or ckpt.repo_id, revision or ckpt.revision
    if repo_id and repo_id.startswith("modelscope:"):
        meta["general.source.modelscope.repository"] = repo_id.split(":", 1)[1]
        meta["general.source.url"] = f"https://modelscope.cn/models/{repo_id.split(':', 1)[1]}"
    elif repo_id:
        meta["general.source.huggingface.repository"] = repo_id
        meta["general.source.url"] = f"https://huggingface.co/{repo_id}"
    if revision:
        meta["general.source.revision"] = revision
    for part, params in (("encoder", e), ("adaptor", a), ("decoder", d)):
        meta.update(_hparam_keys(f"{k}{part}.", params, _HPARAM_KEYS[part]))
    meta.update({
        k + "decoder.eos_token_ids": ckpt.eos_token_ids(),
        k + "prompt": json.dumps(getattr(ckpt, "prompt", None) or spec["prompt"], ensure_ascii=False),
        k + "model_spec": spec_text(),
        k + "source.config_json": json.dumps(ckpt.config, ensure_ascii=False),
        k + "source.layout": getattr(ckpt, "layout", "hf"),
        k + "language_table": getattr(ckpt, "language_table", None)
        or language_table(spec, [repo_id or "", str(ckpt.path)], ckpt.config),
    })
    if hp.ctc is not None:
        meta.update(_hparam_keys(f"{k}ctc.", hp.ctc, _HPARAM_KEYS["ctc"]))
    else:
        meta[k + "ctc.unavailable"] = getattr(ckpt, "ctc_unavailable", None) or HF_NO_CTC
    extra = getattr(ckpt, "extra_metadata", None)
    if extra is not None:
        meta.update(extra())
    for key, value in (
        ("source.preprocessor_config_json", ckpt.preprocessor_config),
        ("source.generation_config_json", ckpt.generation_config),
        ("source.tokenizer_config_json", ckpt.tokenizer_config),
    ):
        if value is not None:
            meta[k + key] = json.dumps(value, ensure_ascii=False)
    meta[gguf.Keys.Tokenizer.HF_JSON] = ckpt.tokenizer_json
    if ckpt.chat_template:
        meta[gguf.Keys.Tokenizer.CHAT_TEMPLATE] = ckpt.chat_template
    return meta

