"""The decoder's fused element-wise ops (csrc/kernels/decoder_fused): the same bits as the plain graph
(FUN_ASR_FUSE=0), fewer nodes per decode step."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np
import pytest

import fun_asr

_CODE = (
    "import hashlib, json, sys, numpy as np, fun_asr\n"
    "m = fun_asr.load_model(sys.argv[1], threads=2)\n"
    "m.logit_digests = True\n"
    "rng = np.random.default_rng(11)\n"
    "emb = [np.ascontiguousarray(m.embed(rng.integers(0, 1000, n).tolist())) for n in (9, 23, 40, 17, 31)]\n"
    "out = {}\n"
    "for name, batch in (('one', emb[:1]), ('two', emb[:2]), ('five', emb)):\n"
    "    gens = m.generate_batch(batch, 8, [])\n"
    "    out[name] = [[list(t) for t, _ in gens], m.last_logit_digests()]\n"
    "m.profiling = True\n"
    "m.prefill(emb[2])\n"
    "out['steps'] = [hashlib.sha256(np.asarray(m.step(int(t))).tobytes()).hexdigest() for t in range(4)]\n"
    "p = m.profile()\n"
    "out['kinds'] = {k: v['count'] for k, v in p.items()}\n"
    "m.profiling = False\n"
    "m.prefill(np.ascontiguousarray(m.embed(rng.integers(0, 1000, 1500).tolist())))\n"
    "out['long'] = [hashlib.sha256(np.asarray(m.step(int(t))).tobytes()).hexdigest() for t in range(3)]\n"
    "print(json.dumps(out))\n"
)


def _run(path: str, switches: dict[str, str]) -> dict:
    env = {k: v for k, v in os.environ.items() if k != "FUN_ASR_FUSE"}
    env.update(switches)
    r = subprocess.run([sys.executable, "-c", _CODE, path], env=env, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout.strip().splitlines()[-1])


@pytest.mark.skipif(fun_asr._core.matvec_isa() == "", reason="no AVX2: the decoder's cached attention op is off")
@pytest.mark.parametrize("package", ["f32", "q8_0", "q4_k_m"])
def test_fused_decoder_ops_give_the_plain_graphs_bits(package: str, wide_gguf) -> None:  # noqa: ANN001
    """Residual sum + RMSNorm, the q/k heads' norms, one RoPE for both, the K/V store, SwiGLU, and q/k/v and
    gate/up in the mat-vec kernels in fewer nodes: logits bit for bit the plain graph's (one sequence, batches
    of 2 and 5 with prefills of 9-40 positions, Model.step, and steps after a 1500-position prefill), and the
    steps really ran the fused ops with fewer nodes."""
    fused = _run(str(wide_gguf(package)), {})
    plain = _run(str(wide_gguf(package)), {"FUN_ASR_FUSE": "0"})
    for name in ("one", "two", "five", "steps", "long"):  # (long: RoPE at positions 1500-1502)
        assert fused[name] == plain[name], name
    assert all(len(t) == 8 for t in fused["five"][0])
    f, p = fused["kinds"], plain["kinds"]
    steps, layers = 4, 2
    # per step: the norms (and the residual sums before them) computed inside the products after them (q/k/v,
    # gate/up, the output projection), SwiGLU inside the down projection, the q/k heads' norms, their RoPE and
    # the K/V store inside the attention
    def count(suffix: str) -> int:
        return sum(c for k, c in f.items() if k.startswith("decode/") and k.endswith(suffix))

    assert not any(k in f for k in ("decode/ADD_RMS_NORM", "decode/RMS_NORM", "decode/MUL"))
    assert count("/attn_q+attn_k+attn_v/ADD_RMS_NORM") == layers * steps
    assert count("/ffn_gate+ffn_up/ADD_RMS_NORM") == layers * steps
    assert count("/ADD_RMS_NORM") == (2 * layers + 1) * steps  # and the output projection's
    assert count("/ffn_down/SWIGLU") == layers * steps
    assert f.get("decode/ATTN") == layers * steps  # (with the heads' norms, RoPE and K/V store inside)
    gone = ("decode/HEADS_RMS_NORM", "decode/STORE_KV", "decode/ROPE", "decode/HEADS_NORM_ROPE_STORE")
    assert not any(k in f for k in gone)
    assert p.get("decode/ROPE") == 2 * layers * steps
    # the prefill: those three in one node before the attention (where ggml's RoPE forms are known: all CI)
    assert f.get("prefill/HEADS_NORM_ROPE_STORE") == layers
    assert not any(k in f for k in ("prefill/HEADS_RMS_NORM", "prefill/STORE_KV", "prefill/ROPE"))
    assert "decode/SWIGLU" not in f and "decode/SILU" not in f
    assert p.get("decode/SILU") == layers * steps
    assert "decode/SET_ROWS" not in f and p.get("decode/SET_ROWS") == 2 * layers * steps
    assert "decode/ADD" not in f and p.get("decode/ADD") == 2 * layers * steps
    # q/k/v and gate/up one node each (the mat-vec kernels' matvec_many, or the int8 GEMM's where the Q8_0
    # matrices are kept in its layout: that one in both graphs)
    for group in ("attn_q+attn_k+attn_v", "ffn_gate+ffn_up"):
        assert count("/" + group) + count("/" + group + "/ADD_RMS_NORM") == layers * steps, group
        if not any(k.startswith("decode/GEMM_INT8/") for k in p):
            assert not any(group in k for k in p)
    steps_f = sum(c for k, c in f.items() if k.startswith("decode/"))
    steps_p = sum(c for k, c in p.items() if k.startswith("decode/"))
    assert steps_f + 13 * layers * steps + 2 * steps <= steps_p


def _max_element(x: np.ndarray) -> int:
    """std::max_element's answer: the first element nothing later compares greater than."""
    best = 0
    for i in range(1, len(x)):
        if x[best] < x[i]:
            best = i
    return best


def _ctc_label(x: np.ndarray) -> int:
    """A CTC frame's label: the first element equal to the largest non-NaN value (0 when all are NaN)."""
    finite = x[~np.isnan(x)]
    return int(np.flatnonzero(x == finite.max())[0]) if finite.size else 0


def test_first_argmax_is_the_hosts_greedy_choice() -> None:
    """The argmax a decode step's graph makes (and the host's picks) is std::max_element's: the first of equal
    maxima (-0 and +0 alike), a NaN never chosen unless it is element 0, infinities as numbers; across the
    vector body and the scalar tail of every length."""
    rng = np.random.default_rng(5)
    cases = [np.array(c, np.float32) for c in ([1.0], [np.nan, 5, 6], [1, np.nan, 3, 3, 2], [-0.0, 0.0, -1],
                                               [0.0, -0.0], [-np.inf] * 7, [np.nan] * 9, [1, 2, np.inf, np.nan, np.inf],
                                               [2, 1, 1, 1, 1, 1, 1, 1, 2])]
    for n in (2, 3, 4, 5, 7, 8, 9, 17, 63, 1000):
        x = rng.standard_normal(n).astype(np.float32)
        nan = x.copy()
        nan[rng.integers(0, n, max(1, n // 5))] = np.nan
        cases += [x, np.round(x), nan]
    for c in cases:
        assert fun_asr._core.first_argmax(c) == _max_element(c), c
    big = rng.standard_normal(151936).astype(np.float32)
    big[[7, 90000]] = 9.0
    assert fun_asr._core.first_argmax(big) == 7
    # the CTC head's frames (the same op): a NaN at 0 is passed over too, the first maximum of the rest wins
    for c in cases:
        assert fun_asr._core.first_argmax(c, nan_first_wins=False) == _ctc_label(c), c
    with pytest.raises(ValueError, match="non-empty 1-D"):
        fun_asr._core.first_argmax(np.zeros((2, 2), np.float32))


def test_steps_choose_in_the_graph_and_still_give_logits(tiny_gguf) -> None:  # noqa: ANN001
    """A decode step's greedy choice is made in the graph (one index per sequence copied out): the same tokens
    and, with the digests on, the same logits as choosing on the host from the copied logits (FUN_ASR_FUSE=0)."""
    path = str(tiny_gguf("q8_0"))
    code = ("import json, sys, numpy as np, fun_asr\n"
            "m = fun_asr.load_model(sys.argv[1], threads=2)\n"
            "rng = np.random.default_rng(3)\n"
            "emb = [np.ascontiguousarray(m.embed(rng.integers(0, 200, n).tolist())) for n in (5, 9, 7)]\n"
            "m.profiling = True\n"
            "a = [list(t) for t, _ in m.generate_batch(emb, 9, [])]\n"
            "argmax_nodes = m.profile().get('decode/ARGMAX', {}).get('count', 0)\n"
            "m.logit_digests = True\n"
            "b = [list(t) for t, _ in m.generate_batch(emb, 9, [])]\n"
            "print(json.dumps([a, b, m.last_logit_digests(), argmax_nodes]))\n")
    runs = {}
    for name, switches in (("graph", {}), ("host", {"FUN_ASR_FUSE": "0"})):
        env = {k: v for k, v in os.environ.items() if k != "FUN_ASR_FUSE"}
        env.update(switches)
        r = subprocess.run([sys.executable, "-c", code, path], env=env, capture_output=True, text=True, timeout=300)
        assert r.returncode == 0, r.stderr
        runs[name] = json.loads(r.stdout.strip().splitlines()[-1])
    assert runs["graph"][:3] == runs["host"][:3]
    assert runs["graph"][0] == runs["graph"][1] and all(len(t) == 9 for t in runs["graph"][0])
    assert runs["graph"][3] == 8 and runs["host"][3] == 0  # one ARGMAX node per step (8 steps after the prefill)
