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
    """Every GGUF metadata key of DESIGN §3 for this checkpoint, as plain Python values.

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
    meta.update({
        k + "encoder.input_size": e.input_size,
        k + "encoder.num_mel_bins": e.num_mel_bins,
        k + "encoder.num_stacked_frames": e.num_stacked_frames,
        k + "encoder.embedding_length": e.d_model,
        k + "encoder.block_count": e.n_layers,
        k + "encoder.tp_block_count": e.n_tp_layers,
        k + "encoder.attention.head_count": e.n_heads,
        k + "encoder.feed_forward_length": e.ffn,
        k + "encoder.fsmn_kernel_size": e.fsmn_kernel,
        k + "encoder.context_length": e.max_positions,
        k + "encoder.attention.layer_norm_epsilon": float(e.eps),
        k + "adaptor.embedding_length": a.d_model,
        k + "adaptor.projector_length": a.proj,
        k + "adaptor.block_count": a.n_layers,
        k + "adaptor.attention.head_count": a.n_heads,
        k + "adaptor.feed_forward_length": a.ffn,
        k + "adaptor.attention.layer_norm_epsilon": float(a.eps),
        k + "decoder.embedding_length": d.d_model,
        k + "decoder.block_count": d.n_layers,
        k + "decoder.attention.head_count": d.n_heads,
        k + "decoder.attention.head_count_kv": d.n_kv_heads,
        k + "decoder.attention.key_length": d.head_dim,
        k + "decoder.feed_forward_length": d.ffn,
        k + "decoder.vocab_size": d.vocab,
        k + "decoder.context_length": d.max_positions,
        k + "decoder.attention.layer_norm_rms_epsilon": float(d.rms_eps),
        k + "decoder.rope.freq_base": float(d.rope_theta),
        k + "decoder.tie_word_embeddings": d.tie_embeddings,
        k + "decoder.eos_token_ids": ckpt.eos_token_ids(),
        k + "prompt": json.dumps(getattr(ckpt, "prompt", None) or spec["prompt"], ensure_ascii=False),
        k + "model_spec": spec_text(),
        k + "source.config_json": json.dumps(ckpt.config, ensure_ascii=False),
        k + "source.layout": getattr(ckpt, "layout", "hf"),
        k + "language_table": getattr(ckpt, "language_table", None)
        or language_table(spec, [repo_id or "", str(ckpt.path)], ckpt.config),
    })
    if hp.ctc is not None:
        c = hp.ctc
        meta.update({
            k + "ctc.embedding_length": c.d_model,
            k + "ctc.projector_length": c.proj,
            k + "ctc.attention.head_count": c.n_heads,
            k + "ctc.feed_forward_length": c.ffn,
            k + "ctc.block_count": c.n_layers,
            k + "ctc.vocab_size": c.vocab,
            k + "ctc.blank_id": c.blank_id,
            k + "ctc.attention.layer_norm_epsilon": float(c.eps),
            k + "ctc.frame_ms": c.frame_ms,
        })
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

