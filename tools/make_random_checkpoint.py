#!/usr/bin/env python3
"""Writes a random-weight Fun-ASR-Nano checkpoint in the official Hugging Face layout.
Needs the test extra (``pip install ".[test]"``: torch 2.13.0 CPU and transformers 5.23.0).

    python tools/make_random_checkpoint.py OUT --size tiny|wide|full [--seed 0] [--dtype f32|bf16|f16]
                                           [--shards N] [--lm-scale 5]

The weights come from Transformers' own ``FunAsrNanoForConditionalGeneration(config)``; the files
are what ``save_pretrained`` writes (config.json, generation_config.json, model.safetensors or
shards + index) plus a tokenizer.json, tokenizer_config.json, chat_template.jinja and
preprocessor_config.json in the same layout as FunAudioLLM/Fun-ASR-Nano-2512-hf.

Random init gives near-constant greedy tokens; the decoder's 2-D weights are scaled (``--lm-scale``)
and every norm/bias gets random values so that parity checks see varied numbers and tokens.
The tokenizer is a small byte-level BPE trained here, with Qwen's special tokens at Qwen's ids
(151643 ...), so stop ids and the chat markers behave as in the real model.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

QWEN_SPECIAL_TOKENS = [
    "<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|object_ref_start|>", "<|object_ref_end|>",
    "<|box_start|>", "<|box_end|>", "<|quad_start|>", "<|quad_end|>", "<|vision_start|>",
    "<|vision_end|>", "<|vision_pad|>", "<|image_pad|>", "<|video_pad|>", "<tool_call>",
    "</tool_call>", "<|fim_prefix|>", "<|fim_middle|>", "<|fim_suffix|>", "<|fim_pad|>",
    "<|repo_name|>", "<|file_sep|>", "<tool_response>", "</tool_response>", "<think>", "</think>",
]
QWEN_FIRST_SPECIAL_ID = 151643
EOS_IDS = [151645, 151643]  # <|im_end|>, <|endoftext|>

CHAT_TEMPLATE = (
    "{% for message in messages %}<|im_start|>{{ message['role'] }}\n{{ message['content'] }}<|im_end|>\n"
    "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)

TOKENIZER_CORPUS = [
    "You are a helpful assistant.",
    "请结合上下文信息，更加准确地完成语音转写任务。如果没有相关信息，我们会留空。",
    "**上下文信息：** 热词列表：[", "]", "语音转写：", "语音转写成中文：", "语音转写成英文：", "语音转写成日文：",
    "，不进行文本规整", "system user assistant", "hello world, this is a test of speech recognition.",
    "the quick brown fox jumps over the lazy dog 0123456789",
    "今天天气很好，我们去公园散步。", "こんにちは、音声認識のテストです。",
]


def tiny_config() -> dict[str, Any]:
    """Small enough for CI, shaped so every stored type occurs (rows of 256 for the k-quants)."""
    return dict(
        audio_config=dict(
            model_type="fun_asr_nano_encoder", hidden_size=256, num_attention_heads=4,
            intermediate_size=256, num_hidden_layers=4, num_timestamp_prediction_layers=1,
            num_mel_bins=80, num_stacked_frames=7, fsmn_kernel_size=11, max_position_embeddings=2049,
        ),
        adaptor_config=dict(
            hidden_size=256, num_attention_heads=4, intermediate_size=64, num_hidden_layers=2,
            projector_hidden_size=512,
        ),
        text_config=dict(
            model_type="qwen3", hidden_size=256, intermediate_size=512, num_hidden_layers=2,
            num_attention_heads=4, num_key_value_heads=2, head_dim=64, vocab_size=151936,
            rope_parameters={"rope_type": "default", "rope_theta": 1000000.0}, rms_norm_eps=1e-6,
            max_position_embeddings=4096, tie_word_embeddings=True,
        ),
    )


def full_config() -> dict[str, Any]:
    """The released Fun-ASR-Nano-2512 dimensions (830M parameters)."""
    return dict(
        audio_config=dict(
            model_type="fun_asr_nano_encoder", hidden_size=512, num_attention_heads=4,
            intermediate_size=2048, num_hidden_layers=70, num_timestamp_prediction_layers=20,
            num_mel_bins=80, num_stacked_frames=7, fsmn_kernel_size=11, max_position_embeddings=2049,
        ),
        adaptor_config=dict(
            hidden_size=1024, num_attention_heads=8, intermediate_size=256, num_hidden_layers=2,
            projector_hidden_size=2048,
        ),
        text_config=dict(
            model_type="qwen3", hidden_size=1024, intermediate_size=3072, num_hidden_layers=28,
            num_attention_heads=16, num_key_value_heads=8, head_dim=128, vocab_size=151936,
            rope_parameters={"rope_type": "default", "rope_theta": 1000000.0}, rms_norm_eps=1e-6,
            max_position_embeddings=40960, tie_word_embeddings=True,
        ),
    )


def wide_config(decoder_layers: int = 2) -> dict[str, Any]:
    """The released decoder's widths (d 1024, FFN 3072, 16/8 heads of 128, vocab 151936) with only
    ``decoder_layers`` layers, after a tiny encoder and adaptor: full-size matrices and output layer
    (what the decode kernels see at full size) for fast tests and benchmarks."""
    cfg = tiny_config()
    full = full_config()["text_config"]
    cfg["adaptor_config"].update(hidden_size=full["hidden_size"], num_attention_heads=8, num_hidden_layers=1,
                                 intermediate_size=full["hidden_size"] // 4)
    cfg["text_config"] = dict(full, num_hidden_layers=decoder_layers)
    return cfg


def make_tokenizer_json() -> str:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=600, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False
    )
    tok.train_from_iterator(TOKENIZER_CORPUS, trainer)
    data = json.loads(tok.to_str())
    # tokenizers numbers added tokens after the model vocabulary, so pad the vocabulary with
    # unreachable filler entries up to Qwen's first special id (as in the real 151643-entry vocab).
    vocab = data["model"]["vocab"]
    for i in range(len(vocab), QWEN_FIRST_SPECIAL_ID):
        vocab[f"\u2400filler{i}"] = i
    data["added_tokens"] = [
        {"id": QWEN_FIRST_SPECIAL_ID + i, "content": t, "single_word": False, "lstrip": False,
         "rstrip": False, "normalized": False, "special": True}
        for i, t in enumerate(QWEN_SPECIAL_TOKENS)
    ]
    return json.dumps(data, ensure_ascii=False)


def make_checkpoint(out: str | Path, size: str = "tiny", seed: int = 0, dtype: str = "f32",
                    shards: int = 1, lm_scale: float = 5.0,
                    config_overrides: dict[str, Any] | None = None) -> Path:
    try:
        import torch
        from transformers import FunAsrNanoConfig, FunAsrNanoForConditionalGeneration, GenerationConfig
    except ImportError as exc:
        raise SystemExit(f"make_random_checkpoint.py needs PyTorch and Transformers ({exc.name} is missing): "
                         "pip install '.[test]' (torch==2.13.0, transformers==5.23.0)") from None

    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    cfg_dict = {"tiny": tiny_config, "wide": wide_config, "full": full_config}[size]()
    for section, values in (config_overrides or {}).items():
        cfg_dict[section].update(values)
    torch.manual_seed(seed)
    config = FunAsrNanoConfig(**cfg_dict)
    with torch.device("cpu"):
        model = FunAsrNanoForConditionalGeneration(config).eval()
    gen = torch.Generator().manual_seed(seed + 1)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.ndim == 1:  # norms and biases: move off the 1 / 0 defaults
                base = 1.0 if name.endswith("norm.weight") else 0.0
                p.copy_(base + 0.1 * torch.randn(p.shape, generator=gen))
            elif name.startswith("model.language_model.") and lm_scale != 1.0:
                p.mul_(lm_scale)
    torch_dtype = {"f32": torch.float32, "bf16": torch.bfloat16, "f16": torch.float16}[dtype]
    model = model.to(torch_dtype)
    model.generation_config = GenerationConfig(
        eos_token_id=EOS_IDS, pad_token_id=EOS_IDS[1], max_new_tokens=512, do_sample=False,
    )
    save_kwargs: dict[str, Any] = {}
    if shards > 1:
        total = sum(p.numel() * p.element_size() for p in model.parameters())
        save_kwargs["max_shard_size"] = f"{max(1, total // shards // 1_000_000 + 1)}MB"
    model.save_pretrained(out, **save_kwargs)

    (out / "tokenizer.json").write_text(make_tokenizer_json(), "utf-8")
    (out / "tokenizer_config.json").write_text(json.dumps({
        "tokenizer_class": "Qwen2Tokenizer", "model_max_length": 131072,
        "eos_token": "<|im_end|>", "pad_token": "<|endoftext|>", "bos_token": None,
        "add_prefix_space": False, "errors": "replace",
    }, indent=2), "utf-8")
    (out / "chat_template.jinja").write_text(CHAT_TEMPLATE, "utf-8")
    (out / "preprocessor_config.json").write_text(json.dumps({
        "feature_extractor_type": "FunAsrNanoFeatureExtractor", "sampling_rate": 16000,
        "feature_size": 80, "num_mel_bins": 80, "lfr_m": 7, "lfr_n": 6, "padding_value": 0.0,
        "return_attention_mask": True, "processor_class": "FunAsrNanoProcessor",
    }, indent=2), "utf-8")
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("out")
    ap.add_argument("--size", choices=["tiny", "wide", "full"], default="tiny")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--dtype", choices=["f32", "bf16", "f16"], default="f32")
    ap.add_argument("--shards", type=int, default=1)
    ap.add_argument("--lm-scale", type=float, default=5.0)
    args = ap.parse_args()
    path = make_checkpoint(args.out, args.size, args.seed, args.dtype, args.shards, args.lm_scale)
    print(f"wrote {path}: {sorted(p.name for p in path.iterdir())}")


if __name__ == "__main__":
    main()
