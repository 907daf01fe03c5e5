"""The decoder's fused element-wise ops (csrc/kernels/decoder_fused): the same bits as the plain graph
(FUN_ASR_FUSE=0), fewer nodes per decode step."""

from __future__ import annotations

import json
import os
import subprocess
import sys

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
    "m.prefill(emb[2])\n"
    "m.profiling = True\n"
    "out['steps'] = [hashlib.sha256(np.asarray(m.step(int(t))).tobytes()).hexdigest() for t in range(4)]\n"
    "p = m.profile()\n"
    "out['kinds'] = {k: v['count'] for k, v in p.items()}\n"
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
    """Residual sum + RMSNorm, the q/k heads' norms, one RoPE for both, the K/V store and SwiGLU in fewer
    nodes: logits bit for bit the plain graph's (one sequence, batches of 2 and 5 with prefills of 9-40
    positions, Model.step), and the steps really ran the fused ops with fewer nodes."""
    fused = _run(str(wide_gguf(package)), {})
    plain = _run(str(wide_gguf(package)), {"FUN_ASR_FUSE": "0"})
    for name in ("one", "two", "five", "steps"):
        assert fused[name] == plain[name], name
    assert all(len(t) == 8 for t in fused["five"][0])
    f, p = fused["kinds"], plain["kinds"]
    steps, layers = 4, 2
    # per step: the residual sums with their norms (2 per layer; the first layer's norm is ggml's), one
    # q/k norm, one K/V store, one RoPE instead of two, SwiGLU instead of SiLU and MUL
    assert f.get("decode/ADD_RMS_NORM") == 2 * layers * steps
    assert f.get("decode/HEADS_RMS_NORM") == f.get("decode/STORE_KV") == layers * steps
    assert f.get("decode/ROPE") == layers * steps and p.get("decode/ROPE") == 2 * layers * steps
    assert f.get("decode/SWIGLU") == layers * steps and "decode/SILU" not in f
    assert p.get("decode/SILU") == layers * steps
    assert "decode/SET_ROWS" not in f and p.get("decode/SET_ROWS") == 2 * layers * steps
    assert "decode/ADD" not in f and p.get("decode/ADD") == 2 * layers * steps
    assert sum(f.values()) + 7 * layers * steps <= sum(p.values())
