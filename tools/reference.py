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
