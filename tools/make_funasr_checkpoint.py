#!/usr/bin/env python3
"""Writes a random-weight Fun-ASR-Nano checkpoint in FunASR's own (ModelScope) layout, CTC head included.
Needs torch 2.13, transformers 5.23, funasr 1.4.16 (``--no-deps``, see tests/funasr_ref.py) and tiktoken.

    python tools/make_funasr_checkpoint.py OUT [--seed 0] [--no-ctc] [--drop-tensor NAME]
                                           [--non-contiguous] [--dtype bf16|f32] [--hf-copy DIR]

The model is funasr 1.4.16's own ``FunASRNano`` class built from the ``config.yaml`` written here (tiny
dimensions, same structure as the release: SenseVoice encoder with encoders0 / encoders / tp_encoders,
Transformer adaptor, Qwen3 LLM, Transformer ctc_decoder + ctc.ctc_lo); its state_dict is saved as the
release saves it: ``torch.save({"state_dict": {name: tensor.to(bfloat16)}})``. The folder:

    model.pt  config.yaml  configuration.json  multilingual.tiktoken  Qwen3-0.6B/{config.json, tokenizer.json,
    tokenizer_config.json}

- ``multilingual.tiktoken`` is a small byte-level BPE (the 256 bytes + merges learned here from a little
  zh/en/ja text) in tiktoken's file format; FunASR's SenseVoiceTokenizer appends its 1679 special tokens,
  and ``ctc_vocab_size`` is set to the total, the blank being the last id (as in the release: 60515).
- ``--non-contiguous`` stores every other matrix transposed-in-memory (strides (1, rows)) and the biases as
  views at an offset into a larger storage: a reader that ignores strides or offsets reads wrong numbers.
- ``--drop-tensor NAME`` leaves one tensor out (e.g. ``ctc.ctc_lo.bias``): FunASR then disables timestamps.
- ``--hf-copy DIR`` also writes the same weights in the Hugging Face layout (``FunAsrNanoForConditionalGeneration``
  names, config.json, safetensors), by a mapping written out here by hand, independent of fun-asr's table.

Random init gives near-constant greedy tokens: the LLM's 2-D weights are scaled (``--lm-scale``), the CTC
output layer too (``--ctc-scale``, peaky posteriors), and every norm/bias gets random values. The embedding
rows of the tokenizer's filler entries are zero, so the LLM writes real (short) text pieces.
"""

from __future__ import annotations

import argparse
import base64
import contextlib
import io
import json
import re
import sys
from collections import Counter
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from make_random_checkpoint import TOKENIZER_CORPUS, make_tokenizer_json  # noqa: E402

LLM_DIR = "Qwen3-0.6B"
CTC_VOCAB_FILE = "multilingual.tiktoken"
TIKTOKEN_PATTERN = r"""'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"""
N_SPECIALS = 2 + 105 + 11 + 4 + 6 + 50 + 1501  # FunASR 1.4.16 SenseVoiceTokenizer (num_languages >= 105)
BPE_CORPUS = TOKENIZER_CORPUS + [
    "今天天气怎么样？明天会下雨吗？北京的天气很好。", "hello, how are you today? I am fine, thank you.",
    "speech recognition with timestamps, forced alignment of the text.", "我们一起去吃饭吧，好不好？",
]


def tiny_dims() -> dict[str, Any]:
    return dict(enc_d=256, enc_heads=4, enc_ffn=256, num_blocks=3, tp_blocks=1, llm_d=256, adp_ffn=512, adp_layers=2,
                adp_heads=8, ctc_d=256, ctc_ffn=512, ctc_layers=2, ctc_heads=8, llm_layers=2, llm_heads=4, llm_kv=2,
                llm_head_dim=64, llm_ffn=512, bpe_merges=400)


def qwen3_config(d: dict[str, Any]) -> dict[str, Any]:
    """A Qwen3 config.json in the shape of Qwen3-0.6B's (tiny dimensions)."""
    return {
        "architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3", "attention_bias": False,
        "attention_dropout": 0.0, "bos_token_id": 151643, "eos_token_id": 151645, "head_dim": d["llm_head_dim"],
        "hidden_act": "silu", "hidden_size": d["llm_d"], "initializer_range": 0.02,
        "intermediate_size": d["llm_ffn"], "max_position_embeddings": 4096, "max_window_layers": d["llm_layers"],
        "num_attention_heads": d["llm_heads"], "num_hidden_layers": d["llm_layers"],
        "num_key_value_heads": d["llm_kv"], "rms_norm_eps": 1e-06, "rope_scaling": None, "rope_theta": 1000000,
        "sliding_window": None, "tie_word_embeddings": True, "torch_dtype": "bfloat16", "use_cache": True,
        "use_sliding_window": False, "vocab_size": 151936,
    }


def funasr_config(d: dict[str, Any], ctc_vocab: int, ctc: bool = True) -> dict[str, Any]:
    """config.yaml in the release's structure (model options FunASR's AutoModel reads), tiny dimensions."""
    conf: dict[str, Any] = {
        "model": "FunASRNano",
        "model_conf": {"lsm_weight": 0.1, "length_normalized_loss": True},
        "audio_encoder": "SenseVoiceEncoderSmall",
        "audio_encoder_conf": {
            "output_size": d["enc_d"], "attention_heads": d["enc_heads"], "linear_units": d["enc_ffn"],
            "num_blocks": d["num_blocks"], "tp_blocks": d["tp_blocks"], "dropout_rate": 0.1,
            "positional_dropout_rate": 0.1, "attention_dropout_rate": 0.1, "input_layer": "pe",
            "pos_enc_class": "SinusoidalPositionEncoder", "normalize_before": True, "kernel_size": 11,
            "sanm_shfit": 0, "selfattention_layer_type": "sanm", "freeze": True, "freeze_layer_num": -1,
            "feat_permute": True,
        },
        "llm": "Qwen3-0.6b",
        "llm_conf": {"hub": "hf", "freeze": True, "llm_dtype": "bf16", "init_param_path": LLM_DIR, "use_lora": False},
        "audio_adaptor": "Transformer",
        "audio_adaptor_conf": {"downsample_rate": 1, "use_low_frame_rate": True, "ffn_dim": d["adp_ffn"],
                               "llm_dim": d["llm_d"], "encoder_dim": d["enc_d"], "n_layer": d["adp_layers"],
                               "attention_heads": d["adp_heads"], "freeze": True},
        "frontend": "WavFrontend",
        # dither 0: FunASR's WavFrontend defaults to 1.0 (random noise in the fbank); fun-asr uses 0
        # (docs/model.md, Frontend)
        "frontend_conf": {"fs": 16000, "window": "hamming", "n_mels": 80, "frame_length": 25, "frame_shift": 10,
                          "lfr_m": 7, "lfr_n": 6, "cmvn_file": None, "dither": 0.0},
        "tokenizer": "HuggingfaceTokenizer",
        "tokenizer_conf": {"init_param_path": "${llm_conf.init_param_path}"},
        "dataset_conf": {"ctc_tokenizer": "SenseVoiceTokenizer", "ctc_target_normalize": True,
                         "ctc_tokenizer_conf": {"vocab_path": None, "is_multilingual": True, "num_languages": 8749}},
    }
    if ctc:
        conf.update({
            "ctc_decoder": "Transformer",
            "ctc_decoder_conf": {"downsample_rate": 1, "ffn_dim": d["ctc_ffn"], "llm_dim": d["ctc_d"],
                                 "encoder_dim": d["enc_d"], "n_layer": d["ctc_layers"],
                                 "attention_heads": d["ctc_heads"], "freeze": False},
            "ctc_weight": 1.0,
            "ctc_vocab_size": ctc_vocab,
            "ctc_conf": {"dropout_rate": 0.0, "ctc_type": "builtin", "reduce": True, "ignore_nan_grad": True},
        })
    return conf


def make_tiktoken_vocab(n_merges: int, corpus: list[str] | None = None) -> list[bytes]:
    """Byte-level BPE trained on a little text (`corpus`, default BPE_CORPUS): the 256 bytes, then merges by
    pair frequency."""
    from tokenizers import Regex, pre_tokenizers

    split = pre_tokenizers.Split(Regex(TIKTOKEN_PATTERN), behavior="isolated")
    words: Counter[tuple[bytes, ...]] = Counter()
    for line in BPE_CORPUS if corpus is None else corpus:
        for piece, _ in split.pre_tokenize_str(line):
            words[tuple(bytes([b]) for b in piece.encode("utf-8"))] += 1
    vocab = [bytes([b]) for b in range(256)]
    known = set(vocab)
    for _ in range(n_merges):
        pairs: Counter[tuple[bytes, bytes]] = Counter()
        for w, c in words.items():
            for a, b in zip(w, w[1:], strict=False):
                pairs[(a, b)] += c
        if not pairs:
            break
        (a, b), _ = max(pairs.items(), key=lambda kv: (kv[1], kv[0]))
        merged = a + b
        if merged not in known:
            vocab.append(merged)
            known.add(merged)
        new: Counter[tuple[bytes, ...]] = Counter()
        for w, c in words.items():
            out, i = [], 0
            while i < len(w):
                if i + 1 < len(w) and w[i] == a and w[i + 1] == b:
                    out.append(merged)
                    i += 2
                else:
                    out.append(w[i])
                    i += 1
            new[tuple(out)] += c
        words = new
    return vocab


def _noncontiguous(t):  # noqa: ANN001, ANN202 - torch.Tensor
    """Same values, other memory layout: matrices transposed in memory, vectors at an offset in a bigger
    storage."""
    import torch

    if t.ndim == 2:
        return t.t().contiguous().t()
    if t.ndim == 1:
        big = torch.cat([torch.zeros(7, dtype=t.dtype), t, torch.zeros(3, dtype=t.dtype)])
        return big[7:7 + t.shape[0]]
    return t


def build_model(conf: dict[str, Any], root: Path, seed: int, lm_scale: float, ctc_scale: float):  # noqa: ANN201
    """funasr's FunASRNano from config.yaml (paths resolved as AutoModel resolves them), random weights."""
    import torch

    with contextlib.redirect_stdout(io.StringIO()):
        import funasr.models.llm_asr.adaptor  # noqa: F401 - registers the Transformer adaptor
        import funasr.models.sense_voice.model  # noqa: F401 - registers SenseVoiceEncoderSmall
        import funasr.tokenizer.whisper_tokenizer  # noqa: F401 - registers SenseVoiceTokenizer
        from funasr.models.fun_asr_nano.model import FunASRNano
    kwargs = json.loads(json.dumps(conf))
    kwargs["llm_conf"]["init_param_path"] = str(root / LLM_DIR)
    kwargs["tokenizer_conf"]["init_param_path"] = str(root / LLM_DIR)
    kwargs["dataset_conf"]["ctc_tokenizer_conf"]["vocab_path"] = str(root / CTC_VOCAB_FILE)
    torch.manual_seed(seed)
    model = FunASRNano(input_size=80 * 7, **{k: v for k, v in kwargs.items() if k not in ("model", "model_conf")},
                       **kwargs["model_conf"]).eval()
    gen = torch.Generator().manual_seed(seed + 1)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.ndim == 1:
                base = 1.0 if re.search(r"norm\d*\.weight$|norm\.weight$|_norm\.weight$", name) else 0.0
                p.copy_(base + 0.1 * torch.randn(p.shape, generator=gen))
            elif name.startswith("llm.") and lm_scale != 1.0:
                p.mul_(lm_scale)
            elif name.startswith("ctc.ctc_lo.") and ctc_scale != 1.0:
                p.mul_(ctc_scale)
        # The tiny tokenizer pads its vocabulary with filler entries up to Qwen's special ids; their
        # embeddings (tied: also their output rows) are zeroed so that greedy decoding picks real text
        # pieces, whose CTC tokenization is short enough to be aligned to a few seconds of audio.
        emb = model.llm.get_input_embeddings().weight
        vocab = json.loads((root / LLM_DIR / "tokenizer.json").read_text("utf-8"))["model"]["vocab"]
        fillers = [i for tok, i in vocab.items() if tok.startswith("\u2400filler")]
        if fillers:
            emb[min(fillers):max(fillers) + 1] = 0
    return model


def make_funasr_checkpoint(out: str | Path, seed: int = 0, ctc: bool = True, drop: list[str] | None = None,
                           non_contiguous: bool = False, dtype: str = "bf16", lm_scale: float = 5.0,
                           ctc_scale: float = 4.0, hf_copy: str | Path | None = None,
                           configuration_json: bool = True) -> Path:
    import torch

    root = Path(out)
    root.mkdir(parents=True, exist_ok=True)
    d = tiny_dims()
    (root / LLM_DIR).mkdir(exist_ok=True)
    (root / LLM_DIR / "config.json").write_text(json.dumps(qwen3_config(d), indent=2), "utf-8")
    (root / LLM_DIR / "tokenizer.json").write_text(make_tokenizer_json(), "utf-8")
    (root / LLM_DIR / "tokenizer_config.json").write_text(json.dumps({
        "tokenizer_class": "Qwen2Tokenizer", "model_max_length": 131072, "eos_token": "<|im_end|>",
        "pad_token": "<|endoftext|>", "bos_token": None, "add_prefix_space": False, "errors": "replace",
        "clean_up_tokenization_spaces": False,
    }, indent=2), "utf-8")
    vocab = make_tiktoken_vocab(d["bpe_merges"])
    (root / CTC_VOCAB_FILE).write_text(
        "".join(f"{base64.b64encode(t).decode()} {i}\n" for i, t in enumerate(vocab)), "ascii")
    ctc_vocab = len(vocab) + N_SPECIALS
    conf = funasr_config(d, ctc_vocab, ctc=ctc)
    import yaml

    (root / "config.yaml").write_text(yaml.safe_dump(conf, sort_keys=False, allow_unicode=True), "utf-8")
    if configuration_json:
        (root / "configuration.json").write_text(json.dumps({
            "framework": "pytorch", "task": "auto-speech-recognition", "model": {"type": "funasr"},
            "pipeline": {"type": "funasr-pipeline"},
            "file_path_metas": {"init_param": "model.pt", "config": "config.yaml",
                                "llm_conf": {"init_param_path": LLM_DIR},
                                "tokenizer_conf": {"init_param_path": LLM_DIR},
                                "dataset_conf": {"ctc_tokenizer_conf": {"vocab_path": CTC_VOCAB_FILE}}},
        }, indent=2), "utf-8")

    model = build_model(conf, root, seed, lm_scale, ctc_scale)
    tdt = {"bf16": torch.bfloat16, "f32": torch.float32}[dtype]
    sd: dict[str, Any] = {}
    for i, (k, v) in enumerate(model.state_dict().items()):
        if k in (drop or []):
            continue
        v = v.detach().to(tdt)
        sd[k] = _noncontiguous(v) if non_contiguous and i % 2 == 0 else v.contiguous()
    torch.save({"state_dict": sd}, root / "model.pt")
    if hf_copy is not None:
        write_hf_layout(root, hf_copy)
    return root


def derive_checkpoint(src: str | Path, dst: str | Path, drop: list[str] | None = None,
                      non_contiguous: bool = False, rename_to: str | None = None) -> Path:
    """A copy of a FunASR folder with model.pt re-saved: tensors left out (``drop``) and/or stored
    non-contiguously; the same weights otherwise (no model is rebuilt)."""
    import shutil

    import torch

    src, dst = Path(src), Path(dst)
    shutil.copytree(src, dst, ignore=shutil.ignore_patterns("model.pt"), dirs_exist_ok=True)
    sd = torch.load(src / "model.pt", map_location="cpu", weights_only=True)["state_dict"]
    out = {}
    for i, (k, v) in enumerate(sd.items()):
        if k in (drop or []):
            continue
        out[k] = _noncontiguous(v.contiguous()) if non_contiguous and i % 2 == 0 else v
    torch.save({"state_dict": out}, dst / "model.pt")
    return dst


# -- the same weights in the Hugging Face layout (a hand-written mapping, for cross-checks) -----

def hf_state_dict(sd: dict[str, Any], conf: dict[str, Any]) -> dict[str, Any]:
    """FunASR state_dict -> FunAsrNanoForConditionalGeneration names (no CTC: the HF port has none)."""
    enc = conf["audio_encoder_conf"]
    n_main = int(enc["num_blocks"])
    out: dict[str, Any] = {}
    common = {"norm1": "input_layernorm", "norm2": "post_attention_layernorm",
              "self_attn.linear_out": "self_attn.o_proj", "feed_forward.w_1": "mlp.fc1", "feed_forward.w_2": "mlp.fc2"}
    enc_map = {**common, "self_attn.fsmn_block": "self_attn.fsmn.conv"}
    adp_map = {**common, "self_attn.linear_q": "self_attn.q_proj", "self_attn.linear_k": "self_attn.k_proj",
               "self_attn.linear_v": "self_attn.v_proj"}
    for name, t in sd.items():
        m = re.fullmatch(r"audio_encoder\.(encoders0|encoders|tp_encoders)\.(\d+)\.(.+)\.(weight|bias)", name)
        if m:
            group, j, mod, kind = m.group(1), int(m.group(2)), m.group(3), m.group(4)
            layer = 0 if group == "encoders0" else (1 + j if group == "encoders" else n_main + j)
            p = f"model.audio_tower.layers.{layer}."
            if mod == "self_attn.linear_q_k_v":
                q, k, v = t.chunk(3, dim=0)
                out[p + f"self_attn.q_proj.{kind}"], out[p + f"self_attn.k_proj.{kind}"] = q, k
                out[p + f"self_attn.v_proj.{kind}"] = v
            else:
                out[p + f"{enc_map[mod]}.{kind}"] = t
            continue
        m = re.fullmatch(r"audio_encoder\.(after_norm|tp_norm)\.(weight|bias)", name)
        if m:
            total = n_main + int(enc["tp_blocks"])
            layer = n_main - 1 if m.group(1) == "after_norm" else total - 1
            out[f"model.audio_tower.layers.{layer}.final_layernorm.{m.group(2)}"] = t
            continue
        m = re.fullmatch(r"audio_adaptor\.linear(\d)\.(weight|bias)", name)
        if m:
            out[f"model.multi_modal_projector.linear_{m.group(1)}.{m.group(2)}"] = t
            continue
        m = re.fullmatch(r"audio_adaptor\.blocks\.(\d+)\.(.+)\.(weight|bias)", name)
        if m:
            out[f"model.multi_modal_projector.layers.{m.group(1)}.{adp_map[m.group(2)]}.{m.group(3)}"] = t
            continue
        if name.startswith("llm.model."):
            out["model.language_model." + name[len("llm.model."):]] = t
            continue
        if name == "llm.lm_head.weight" or name.startswith(("ctc_decoder.", "ctc.")):
            continue  # tied (the HF port stores only the embedding); the HF port has no CTC head
        raise KeyError(f"no HF name for {name}")
    return out


def write_hf_layout(funasr_dir: str | Path, out: str | Path) -> Path:
    """The weights of a FunASR folder written as a Hugging Face Fun-ASR-Nano checkpoint."""
    import torch
    import yaml
    from safetensors.torch import save_file

    src, dst = Path(funasr_dir), Path(out)
    dst.mkdir(parents=True, exist_ok=True)
    conf = yaml.safe_load((src / "config.yaml").read_text("utf-8"))
    llm = json.loads((src / LLM_DIR / "config.json").read_text("utf-8"))
    sd = torch.load(src / "model.pt", map_location="cpu", weights_only=True)["state_dict"]
    hf = {k: v.contiguous() for k, v in hf_state_dict(sd, conf).items()}
    save_file(hf, str(dst / "model.safetensors"), metadata={"format": "pt"})
    enc, adp = conf["audio_encoder_conf"], conf["audio_adaptor_conf"]
    dropped = ("architectures", "torch_dtype", "rope_theta", "rope_scaling")
    text_config = {k: v for k, v in llm.items() if k not in dropped}
    text_config["rope_parameters"] = {"rope_type": "default", "rope_theta": float(llm["rope_theta"])}
    config = {
        "architectures": ["FunAsrNanoForConditionalGeneration"], "model_type": "fun_asr_nano",
        "audio_config": {"model_type": "fun_asr_nano_encoder", "hidden_size": enc["output_size"],
                         "num_attention_heads": enc["attention_heads"], "intermediate_size": enc["linear_units"],
                         "num_hidden_layers": enc["num_blocks"] + enc["tp_blocks"],
                         "num_timestamp_prediction_layers": enc["tp_blocks"], "num_mel_bins": 80,
                         "num_stacked_frames": 7, "fsmn_kernel_size": enc["kernel_size"],
                         "max_position_embeddings": 2049, "layer_norm_eps": 1e-5},
        "adaptor_config": {"hidden_size": llm["hidden_size"], "num_attention_heads": adp.get("attention_heads", 8),
                           "intermediate_size": llm["hidden_size"] // 4, "num_hidden_layers": adp["n_layer"],
                           "projector_hidden_size": adp["ffn_dim"], "layer_norm_eps": 1e-12},
        "text_config": text_config,
        "tie_word_embeddings": llm.get("tie_word_embeddings", True),
    }
    (dst / "config.json").write_text(json.dumps(config, indent=2), "utf-8")
    (dst / "generation_config.json").write_text(json.dumps({"eos_token_id": llm["eos_token_id"],
                                                            "do_sample": False}, indent=2), "utf-8")
    for name in ("tokenizer.json", "tokenizer_config.json"):
        (dst / name).write_text((src / LLM_DIR / name).read_text("utf-8"), "utf-8")
    return dst


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("out")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--no-ctc", action="store_true", help="no CTC head (like the HF model.pt)")
    ap.add_argument("--drop-tensor", action="append", default=[], help="leave this model.pt tensor out")
    ap.add_argument("--non-contiguous", action="store_true")
    ap.add_argument("--dtype", choices=["bf16", "f32"], default="bf16")
    ap.add_argument("--lm-scale", type=float, default=5.0)
    ap.add_argument("--ctc-scale", type=float, default=4.0)
    ap.add_argument("--hf-copy", help="also write the same weights in the Hugging Face layout here")
    args = ap.parse_args()
    path = make_funasr_checkpoint(args.out, args.seed, not args.no_ctc, args.drop_tensor, args.non_contiguous,
                                  args.dtype, args.lm_scale, args.ctc_scale, args.hf_copy)
    print(f"wrote {path}: {sorted(p.name for p in path.iterdir())}")


if __name__ == "__main__":
    main()
