"""The log-probability of every token the decoder takes (Model.token_logprobs): log softmax of its logits row at
the token, computed beside the greedy choice in a CPU decode step's graph (kernels/decoder_fused
argmax_logprob_columns) and on the host from the logits after a prefill or where the graph does not choose. The
same bits alone, in batches, with continuous batching and on the plain graph (FUN_ASR_FUSE=0, host path); equal to
numpy's log softmax of the step's logits."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np
import pytest

from fun_asr import _core

pytestmark = pytest.mark.filterwarnings("ignore::fun_asr.notices.TruncatedOutputWarning")

_CHILD = r"""
import json, sys
import numpy as np
from fun_asr import _core
model = _core.load_gguf(sys.argv[1], device="cpu", threads=2)
model.token_logprobs = True
d = model.info()["decoder"]["d_model"]
rng = np.random.default_rng(3)
prompts = [np.ascontiguousarray(model.embed(rng.integers(0, 151643, n).tolist())
                                + 0.5 * rng.standard_normal((n, d)).astype(np.float32)) for n in (7, 30, 12, 3, 45)]
out = {"alone": [], "lps": []}
for p in prompts:
    (tokens, _), = model.generate_batch([p], 8, [])
    out["alone"].append(tokens)
    out["lps"].append([float(x).hex() for x in model.last_token_logprobs()[0]])
res = model.generate_batch(prompts, 8, [])
out["batch"] = [[float(x).hex() for x in lp] for lp in model.last_token_logprobs()]
res = model.generate_batch(prompts, [3, 8, 5, 8, 2], [], max_active=2)
out["continuous"] = [[float(x).hex() for x in lp] for lp in model.last_token_logprobs()]
print(json.dumps(out))
"""


def _run(path: str, fuse: bool) -> dict:
    env = {k: v for k, v in os.environ.items() if k != "FUN_ASR_FUSE"}
    if not fuse:
        env["FUN_ASR_FUSE"] = "0"
    r = subprocess.run([sys.executable, "-c", _CHILD, path], env=env, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    return json.loads(r.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("package", ["f32", "q8_0"])
def test_token_logprobs_are_the_same_bits_on_every_path(package: str, wide_gguf) -> None:  # noqa: ANN001
    fused, plain = _run(str(wide_gguf(package)), True), _run(str(wide_gguf(package)), False)
    assert fused == plain  # the graph's op (fused) and the host (plain graph: no argmax node)
    assert fused["batch"] == fused["lps"]
    assert fused["continuous"] == [lp[:n] for lp, n in zip(fused["lps"], [3, 8, 5, 8, 2], strict=True)]
    assert all(len(lp) == 8 for lp in fused["lps"])


def test_token_logprobs_equal_numpys_log_softmax(wide_gguf) -> None:  # noqa: ANN001
    model = _core.load_gguf(str(wide_gguf("q8_0")), device="cpu", threads=2)
    d = model.info()["decoder"]["d_model"]
    rng = np.random.default_rng(5)
    prompt = np.ascontiguousarray(model.embed(rng.integers(0, 151643, 20).tolist())
                                  + 0.5 * rng.standard_normal((20, d)).astype(np.float32))
    model.token_logprobs = True
    (tokens, _), = model.generate_batch([prompt], 6, [])
    got = model.last_token_logprobs()[0]
    assert len(got) == len(tokens) == 6
    logits = [np.asarray(model.prefill(prompt), dtype=np.float64)]
    for t in tokens[:-1]:
        logits.append(np.asarray(model.step(int(t)), dtype=np.float64))
    for row, t, lp in zip(logits, tokens, got, strict=True):
        assert int(np.argmax(row)) == t
        want = row[t] - row.max() - np.log(np.exp(row - row.max()).sum())
        assert lp <= 0 and abs(lp - want) < 1e-5, (lp, want)
    model.token_logprobs = False
    model.generate_batch([prompt], 3, [])
    assert model.last_token_logprobs() == []
