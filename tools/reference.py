"""The Transformers 5.23 reference: stage outputs and greedy decoding of FunAsrNano modules."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch
from transformers import DynamicCache, FunAsrNanoForConditionalGeneration


def load_reference(path: Path, round_to: torch.dtype | None = None) -> FunAsrNanoForConditionalGeneration:
    """F32 reference model; round_to=torch.float16 rounds every 2-D weight like an F16 package."""
    m = FunAsrNanoForConditionalGeneration.from_pretrained(path, attn_implementation="eager", dtype=torch.float32)
    m = m.eval()
    if round_to is not None:
        with torch.no_grad():
            for p in m.parameters():
                if p.ndim == 2:
                    p.copy_(p.to(round_to).to(torch.float32))
    return m


@torch.no_grad()
def reference_stages(m: FunAsrNanoForConditionalGeneration, feats: np.ndarray) -> dict[str, np.ndarray]:
    """enc.blk.{i}.out, enc.out, adp.proj.out, adp.blk.{j}.out, adp.out for one unpadded sequence."""
    x = torch.from_numpy(feats)[None]
    mask = torch.ones(1, x.shape[1], dtype=torch.long)
    enc = m.model.audio_tower(input_features=x, input_features_mask=mask, output_hidden_states=True)
    out = {f"enc.blk.{i}.out": h[0].numpy() for i, h in enumerate(enc.hidden_states[1:])}
    out["enc.out"] = enc.last_hidden_state[0].numpy()
    proj = m.model.multi_modal_projector
    captured: dict[str, torch.Tensor] = {}
    hooks = [proj.linear_2.register_forward_hook(lambda _m, _i, o: captured.__setitem__("adp.proj.out", o))]
    for j, layer in enumerate(proj.layers):
        hooks.append(layer.register_forward_hook(
            lambda _m, _i, o, j=j: captured.__setitem__(f"adp.blk.{j}.out", o[0] if isinstance(o, tuple) else o)))
    try:
        adp = proj(enc.last_hidden_state, mask)
    finally:
        for h in hooks:
            h.remove()
    out.update({k: v[0].numpy() for k, v in captured.items()})
    out["adp.out"] = adp[0].numpy()
    return out


class ReferenceDecoder:
    """Qwen3 of the reference with a DynamicCache: prefill and single-token steps."""

    def __init__(self, m: FunAsrNanoForConditionalGeneration) -> None:
        self.m = m
        self.cache: DynamicCache | None = None

    @torch.no_grad()
    def embed(self, ids: list[int]) -> np.ndarray:
        return self.m.model.language_model.embed_tokens(torch.tensor(ids)).numpy()

    @torch.no_grad()
    def prefill(self, emb: np.ndarray) -> np.ndarray:
        self.cache = DynamicCache(config=self.m.config.text_config)
        out = self.m(inputs_embeds=torch.from_numpy(emb)[None], past_key_values=self.cache, use_cache=True)
        return out.logits[0, -1].numpy()

    @torch.no_grad()
    def step(self, token: int) -> np.ndarray:
        emb = self.m.model.language_model.embed_tokens(torch.tensor([[token]]))
        out = self.m(inputs_embeds=emb, past_key_values=self.cache, use_cache=True)
        return out.logits[0, -1].numpy()

    def greedy(self, emb: np.ndarray, max_new: int, stop: list[int]) -> list[int]:
        logits = self.prefill(emb)
        tokens: list[int] = []
        while True:
            tok = int(np.argmax(logits))
            tokens.append(tok)
            if tok in stop or len(tokens) >= max_new:
                return tokens
            logits = self.step(tok)


def rel_max_abs(ours: np.ndarray, ref: np.ndarray) -> float:
    """max |ours - ref| relative to the reference's scale (max |ref|)."""
    return float(np.abs(ours - ref).max() / max(np.abs(ref).max(), 1e-12))


# --- an independent numpy implementation of FunASR's frontend (docs/model.md, Frontend) ------------

def kaldi_fbank_numpy(samples: np.ndarray, rate: int = 16000, n_mels: int = 80) -> np.ndarray:
    """Kaldi fbank (25/10 ms, hamming, preemphasis 0.97, DC removal, snip_edges, power, log, dither 0)
    of samples already scaled by 32768, written from the Kaldi recipe in float64."""
    x = np.asarray(samples, dtype=np.float64)
    flen, shift, nfft = rate * 25 // 1000, rate * 10 // 1000, 512
    if len(x) < flen:
        return np.zeros((0, n_mels), np.float32)
    n = 1 + (len(x) - flen) // shift
    frames = np.stack([x[i * shift : i * shift + flen] for i in range(n)])
    frames = frames - frames.mean(axis=1, keepdims=True)
    prev = np.concatenate([frames[:, :1], frames[:, :-1]], axis=1)
    frames = frames - 0.97 * prev
    frames = frames * (0.54 - 0.46 * np.cos(2 * np.pi * np.arange(flen) / (flen - 1)))
    power = np.abs(np.fft.rfft(frames, n=nfft)) ** 2

    def mel(f: np.ndarray | float) -> np.ndarray | float:
        return 1127.0 * np.log(1.0 + np.asarray(f) / 700.0)

    lo, hi = mel(20.0), mel(rate / 2)
    delta = (hi - lo) / (n_mels + 1)
    bins = mel(np.arange(nfft // 2) * rate / nfft)
    W = np.zeros((n_mels, nfft // 2))
    for b in range(n_mels):
        left, center, right = lo + b * delta, lo + (b + 1) * delta, lo + (b + 2) * delta
        up = (bins > left) & (bins <= center)
        down = (bins > center) & (bins < right)
        W[b, up] = (bins[up] - left) / (center - left)
        W[b, down] = (right - bins[down]) / (right - center)
    energies = power[:, : nfft // 2] @ W.T
    return np.log(np.maximum(energies, np.finfo(np.float32).eps)).astype(np.float32)


def lfr_numpy(frames: np.ndarray, m: int = 7, n: int = 6) -> np.ndarray:
    """FunASR apply_lfr, written loop by loop."""
    T = frames.shape[0]
    padded = np.vstack([np.tile(frames[:1], ((m - 1) // 2, 1)), frames])
    out = []
    for i in range(-(-T // n)):
        rows = [padded[min(i * n + j, padded.shape[0] - 1)] for j in range(m)]
        out.append(np.concatenate(rows))
    return np.asarray(out, dtype=np.float32).reshape(len(out), frames.shape[1] * m)


def reference_transcribe_tokens(m: FunAsrNanoForConditionalGeneration, tokenizer_json: str, samples16k: np.ndarray,
                                language: str | None, itn: bool, hotwords: list[str], max_new: int,
                                stop: list[int]) -> list[int]:
    """The model end to end (docs/model.md, End to end) with the Transformers modules: numpy frontend
    (x32768, fbank, LFR), encoder + adaptor, the first fake_token_len rows spliced into FunASR's prompt,
    greedy decoding."""
    from tokenizers import Tokenizer

    feats = lfr_numpy(kaldi_fbank_numpy(samples16k.astype(np.float64) * 32768.0))
    n_audio = feats.shape[0]
    for _ in range(3):
        n_audio = (n_audio - 1) // 2 + 1
    audio = reference_stages(m, feats)["adp.out"][:n_audio]
    prompt = ""
    if hotwords:
        prompt = ("请结合上下文信息，更加准确地完成语音转写任务。如果没有相关信息，我们会留空。"
                  "\n\n\n**上下文信息：**\n\n\n"
                  f"热词列表：[{', '.join(hotwords)}]\n")
    names = {"zh": "中文", "en": "英文", "ja": "日文"}
    prompt += "语音转写" if language is None else f"语音转写成{names[language]}"
    if not itn:
        prompt += "，不进行文本规整"
    prompt += "："
    tok = Tokenizer.from_str(tokenizer_json)
    before = tok.encode(f"<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n<|im_start|>user\n{prompt}",
                        add_special_tokens=False).ids
    after = tok.encode("<|im_end|>\n<|im_start|>assistant\n", add_special_tokens=False).ids
    dec = ReferenceDecoder(m)
    emb = np.ascontiguousarray(np.concatenate([dec.embed(before), audio, dec.embed(after)]), dtype=np.float32)
    return dec.greedy(emb, max_new, stop)
