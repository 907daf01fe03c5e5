"""The FSMN network in numpy (the reference the native ggml graph is tested against), offline or chunked with its
carried caches.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np


@dataclass
class FsmnWeights:
    """The FSMN network (``encoder.*`` of model.pt), float32, linear weights as [out, in]."""

    in1: tuple[np.ndarray, np.ndarray]
    in2: tuple[np.ndarray, np.ndarray]
    layers: list[tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]]  # linear W, taps [proj, lorder], affine W, b
    out1: tuple[np.ndarray, np.ndarray]
    out2: tuple[np.ndarray, np.ndarray]

    @property
    def lorder(self) -> int:
        return self.layers[0][1].shape[1]

    @property
    def proj_dim(self) -> int:
        return self.layers[0][1].shape[0]

    @classmethod
    def from_state_dict(cls, sd: Mapping[str, np.ndarray], prefix: str = "encoder.") -> FsmnWeights:
        def get(name: str) -> np.ndarray:
            key = prefix + name
            if key not in sd:
                raise KeyError(f"FSMN-VAD weights lack {key!r}")
            return np.ascontiguousarray(sd[key], dtype=np.float32)

        def affine(name: str) -> tuple[np.ndarray, np.ndarray]:
            return get(f"{name}.linear.weight"), get(f"{name}.linear.bias")

        layers = []
        i = 0
        while f"{prefix}fsmn.{i}.linear.linear.weight" in sd:
            conv = get(f"fsmn.{i}.fsmn_block.conv_left.weight")  # [proj, 1, lorder, 1]
            if conv.ndim != 4 or conv.shape[1] != 1 or conv.shape[3] != 1:
                raise ValueError(f"fsmn.{i}.fsmn_block.conv_left.weight has shape {conv.shape}, "
                                 "expected [proj, 1, lorder, 1]")
            if f"{prefix}fsmn.{i}.fsmn_block.conv_right.weight" in sd:
                raise ValueError("FSMN blocks with a right context (rorder > 0) are not supported")
            taps = np.ascontiguousarray(conv[:, 0, :, 0])
            w_aff, b_aff = affine(f"fsmn.{i}.affine")
            layers.append((get(f"fsmn.{i}.linear.linear.weight"), taps, w_aff, b_aff))
            i += 1
        if not layers:
            raise KeyError(f"FSMN-VAD weights have no {prefix}fsmn.0.* layer")
        return cls(affine("in_linear1"), affine("in_linear2"), layers, affine("out_linear1"), affine("out_linear2"))

    def new_cache(self) -> list[np.ndarray]:
        """Zero FSMN caches: per layer the last ``lorder - 1`` projected frames, float32[lorder-1, proj]."""
        return [np.zeros((taps.shape[1] - 1, taps.shape[0]), np.float32) for _, taps, _, _ in self.layers]


def _fsmn_memory(z: np.ndarray, taps: np.ndarray, cache: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``m_t = z_t + sum_j taps[:, j] * z_{t - (L-1) + j}`` over the cache + z; returns (m, new cache)."""
    T = z.shape[0]
    L = taps.shape[1]
    padded = np.concatenate([cache, z], axis=0)  # [L-1+T, D]
    m = z.copy()
    for j in range(L):
        m += taps[:, j] * padded[j: j + T]
    return m, padded[T:] if T else cache


def vad_network_numpy(weights: FsmnWeights, feats: np.ndarray, cache: list[np.ndarray] | None = None) -> np.ndarray:
    """Softmax outputs float32[T, n_classes] of the FSMN network on CMVN'd LFR features [T, 400].

    ``cache``: None for a whole clip (zero history), or the list from :meth:`FsmnWeights.new_cache`, updated
    in place, to run a clip in chunks (same result as one call)."""
    x = np.asarray(feats, dtype=np.float32)
    if x.ndim != 2:
        raise ValueError(f"feats must be [T, dim], got shape {x.shape}")
    w, b = weights.in1
    x = x @ w.T + b
    w, b = weights.in2
    x = np.maximum(x @ w.T + b, 0)
    caches = weights.new_cache() if cache is None else cache
    for i, (w_lin, taps, w_aff, b_aff) in enumerate(weights.layers):
        z = x @ w_lin.T
        m, caches[i] = _fsmn_memory(z, taps, caches[i])
        x = np.maximum(m @ w_aff.T + b_aff, 0)
    w, b = weights.out1
    x = x @ w.T + b
    w, b = weights.out2
    x = x @ w.T + b
    x -= x.max(axis=-1, keepdims=True) if x.shape[0] else 0
    np.exp(x, out=x)
    x /= x.sum(axis=-1, keepdims=True)
    return x
