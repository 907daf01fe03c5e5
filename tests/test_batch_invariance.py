"""A sequence decodes to the same logits, bit for bit, whatever the batch around it.

Matrix: every package type x batch sizes 1, 2, 3, 4, 8 x every kernel path this CPU has
(FUN_ASR_MATVEC=0: ggml only; avx2; avxvnni; the default, avx512vnni where the CPU has it), on a random
model with the released decoder's widths and vocabulary but two decoder layers ("wide"): the
products a decode step runs have their full-size shapes, and random logits are nearly flat, so
any difference in rounding would show. Each sequence's logits rows (a digest of every row a token
was taken from) and tokens in batches of B must equal its own one-by-one run.

The prompts have different lengths (attention over slots of different lengths; one crosses 512
cached positions, where ggml's flash attention splits the keys of a single sequence across
threads) and two are identical (one file sent twice). The kernel choice is made once per process,
so each path runs in its own subprocess.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from fun_asr import _core
from gpu import GPU

# These tests decode a few tokens on purpose: the max_new_tokens warnings are expected.
pytestmark = pytest.mark.filterwarnings("ignore::fun_asr.notices.TruncatedOutputWarning")

PACKAGES = ["f32", "f16", "q8_0", "q4_k_m"]
BATCH_SIZES = [1, 2, 3, 4, 8]


def _paths() -> list[str]:
    """FUN_ASR_MATVEC values for the kernel paths this CPU can run ("" = the default choice)."""
    isa = _core.matvec_isa()
    paths = ["0"]
    if isa in ("avx2", "avxvnni", "avx512vnni"):
        paths.append("avx2")
    if isa == "avx512vnni" and _core.system_info()["cpu_features"].get("AVX_VNNI") == "1":
        paths.append("avxvnni")  # Intel's client cores' copies, forced on a CPU that also has AVX-512
    if isa in ("avxvnni", "avx512vnni"):
        paths.append("")
    return paths


# Run in a subprocess: argv = package path, JSON options; prints a JSON report.
CHILD = r"""
import json, sys
import numpy as np
from fun_asr import _core

path, opts = sys.argv[1], json.loads(sys.argv[2])
new = opts["new_tokens"]
model = _core.load_gguf(path, device=opts["device"], threads=2)
model.logit_digests = True
model.flash_attn = opts["flash_attn"]
model.max_step_sequences = opts["max_step_sequences"]
d = model.info()["decoder"]["d_model"]
rng = np.random.default_rng(7)
lengths = [5, 37, 12, 3, 64, 37, 20, 509]  # the 6th repeats the 2nd; the last crosses 512 positions
prompts = []
for i, n in enumerate(lengths):
    if i == 5:
        prompts.append(prompts[1].copy())
        continue
    ids = rng.integers(0, 151643, n).tolist()
    prompts.append(np.ascontiguousarray(model.embed(ids) + 0.5 * rng.standard_normal((n, d)).astype(np.float32)))

def run(ps):
    out = model.generate_batch(ps, new, [])
    return [t for t, _ in out], model.last_logit_digests()

single = [run([p]) for p in prompts]
single = [(t[0], g[0]) for t, g in single]
report = {"isa": _core.matvec_isa(), "mismatches": [], "tokens": [t for t, _ in single]}
for B in opts["batch_sizes"]:
    tokens, digests = run(prompts[:B])
    for b in range(B):
        if tokens[b] != single[b][0] or digests[b] != single[b][1]:
            first = next(i for i, (x, y) in enumerate(zip(digests[b], single[b][1])) if x != y)
            report["mismatches"].append({"B": B, "seq": b, "first_step": first,
                                         "tokens_equal": tokens[b] == single[b][0]})
print(json.dumps(report))
"""


def run_matrix(package_path: Path, matvec: str, new_tokens: int = 6, batch_sizes: list[int] | None = None,
               flash_attn: bool = True, max_step_sequences: int = 0, device: str = "cpu") -> dict:
    """Decodes the prompts one by one and in batches in a subprocess with FUN_ASR_MATVEC=matvec."""
    env = dict(os.environ)
    env.pop("FUN_ASR_MATVEC", None)
    if matvec:
        env["FUN_ASR_MATVEC"] = matvec
    opts = {"new_tokens": new_tokens, "batch_sizes": [b for b in (batch_sizes or BATCH_SIZES) if b > 1],
            "flash_attn": flash_attn, "max_step_sequences": max_step_sequences, "device": device}
    out = subprocess.run([sys.executable, "-c", CHILD, str(package_path), json.dumps(opts)], env=env,
                         capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("matvec", _paths(), ids=lambda p: {"0": "ggml", "": "default"}.get(p, p))
@pytest.mark.parametrize("package", PACKAGES)
def test_batch_is_invariant(package: str, matvec: str, wide_gguf) -> None:  # noqa: ANN001
    report = run_matrix(wide_gguf(package), matvec)
    if matvec == "0":
        assert report["isa"] == ""
    elif matvec:
        assert report["isa"] == matvec
    # the random model's tokens vary (a stuck decoder would hide nothing, but say little)
    assert len({t for seq in report["tokens"] for t in seq}) > 8
    assert report["mismatches"] == [], report["mismatches"]


@GPU
@pytest.mark.device_process
@pytest.mark.parametrize("package", PACKAGES)
def test_batch_tokens_are_invariant_on_cuda(package: str, wide_gguf) -> None:  # noqa: ANN001
    """The same matrix with the model on the GPU (tools/gpu_check.sh runs it): the same tokens in every batch.
    Not the same logits bit for bit: ggml's CUDA kernels round a batch differently from one sequence
    (matrix kernels chosen by column count), and the H200 run (2026-12-04) showed digests differing
    from the first step on, in every package, with every token equal."""
    report = run_matrix(wide_gguf(package), "", device="cuda")
    assert len({t for seq in report["tokens"] for t in seq}) > 8
    assert [m for m in report["mismatches"] if not m["tokens_equal"]] == [], report["mismatches"]


@pytest.mark.parametrize("matvec", ["0", ""], ids=["ggml", "default"])
@pytest.mark.parametrize("package", ["f16", "q4_k_m"])
def test_matmul_attention_and_chunked_steps_are_invariant(package: str, matvec: str, wide_gguf) -> None:  # noqa: ANN001
    """The matmul/softmax/matmul attention (flash_attn off) attends over each sequence's own length, and a
    batch stepped in chunks of 3 sequences (what very large batches do) gives the same numbers."""
    if matvec == "" and _core.matvec_isa() == "":
        pytest.skip("no kernel path on this CPU")
    report = run_matrix(wide_gguf(package), matvec, new_tokens=4, batch_sizes=[4, 8], flash_attn=False,
                        max_step_sequences=3)
    assert report["mismatches"] == [], report["mismatches"]


def test_one_kv_head_decodes_past_half_the_cache(tmp_path: Path) -> None:
    """A model with a single K/V head: a lone decode step reads that head once per query head. With a
    prompt longer than the cache's capacity over the number of query heads, the old stride-0 view reached
    past the cache's bytes and ggml aborted the process (found by tools/fuzz/fuzz_upload.py). It now
    decodes, equal to the same sequence in a batch and close to the matmul attention."""
    import numpy as np

    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tools" / "fuzz"))
    import _seeds

    model = _core.load_gguf(str(_seeds.micro_gguf("f32")), device="cpu", threads=1)
    dec = model.info()["decoder"]
    assert dec["n_kv_heads"] == 1 and dec["n_heads"] > 1
    rng = np.random.default_rng(0)
    n = 200  # the cache holds 256 positions (rounded up): 200 > 256 / n_heads
    prompt = np.ascontiguousarray(model.embed(rng.integers(0, 60, n).tolist())
                                  + rng.standard_normal((n, dec["d_model"])).astype(np.float32))
    model.logit_digests = True
    model.flash_attn = True
    alone = model.generate_batch([prompt], 6, [])
    alone_digests = model.last_logit_digests()
    pair = model.generate_batch([prompt, prompt], 6, [])
    assert [t for t, _ in pair] == [alone[0][0]] * 2
    assert model.last_logit_digests() == alone_digests * 2
    steps = []
    for flash in (True, False):
        model.flash_attn = flash
        model.prefill(prompt)
        steps.append(model.step(int(alone[0][0][0])))
    np.testing.assert_allclose(steps[0], steps[1], rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("package", ["f16", "q8_0"])
def test_continuous_batching_gives_each_sequence_its_own_run(package: str, wide_gguf) -> None:  # noqa: ANN001
    """generate_batch(max_active=3) over 7 prompts that end after different numbers of tokens: as each ends, the
    last running slot moves into its place and the next prompt's prefill joins the steps. Every sequence's tokens,
    stop reason and logits (digests of every row a token came from) equal its own one-by-one run, bit for bit."""
    import numpy as np

    model = _core.load_gguf(str(wide_gguf(package)), device="cpu", threads=2)
    model.logit_digests = True
    d = model.info()["decoder"]["d_model"]
    rng = np.random.default_rng(11)
    prompts = [np.ascontiguousarray(model.embed(rng.integers(0, 151643, n).tolist())
                                    + 0.5 * rng.standard_normal((n, d)).astype(np.float32))
               for n in (5, 37, 12, 3, 64, 20, 9)]
    free = [model.generate_batch([p], 10, [])[0][0] for p in prompts]
    # stop ids that end sequences at different steps (each sequence's token at its own position)
    stops = sorted({free[i][k] for i, k in ((0, 2), (2, 5), (4, 1), (5, 7))})
    alone = []
    for p in prompts:
        (tokens, reason), = model.generate_batch([p], 10, stops)
        alone.append((tokens, reason, model.last_logit_digests()[0]))
    assert len({len(t) for t, _, _ in alone}) >= 3  # really mixed lengths
    out = model.generate_batch(prompts, 10, stops, max_active=3)
    stats = model.last_generation()
    digests = model.last_logit_digests()
    for i, ((tokens, reason), (t1, r1, d1)) in enumerate(zip(out, alone, strict=True)):
        assert (tokens, reason) == (t1, r1), i
        assert digests[i] == d1, i
    assert stats["slot_moves"] > 0 and stats["prefill_passes"] >= len(prompts) - 3
    # one sequence per slot at most 3 at once: fewer decode passes than one by one, more than the longest alone
    assert max(len(t) for t, _, _ in alone) <= stats["decode_passes"] + 1 < sum(len(t) for t, _, _ in alone)
    # each sequence's own token budget (what a real batch has: its clips end at different lengths)
    limits = [3, 10, 5, 8, 2, 6, 4]
    own = [model.generate_batch([p], n, [])[0] for p, n in zip(prompts, limits, strict=True)]
    assert model.generate_batch(prompts, limits, [], max_active=3) == own
    assert model.generate_batch(prompts[:1], np.int64(3), []) == own[:1]  # numpy's integers count as ints
    assert model.generate_batch(prompts[:2], list(np.array(limits[:2])), [], max_active=1) == own[:2]
    assert [len(t) for t, _ in own] == limits
    with pytest.raises(ValueError, match="max_active"):
        model.generate_batch(prompts, 4, [], max_active=-1)
    with pytest.raises(ValueError, match="entries for 7 sequences"):
        model.generate_batch(prompts, [4, 4], [])
    with pytest.raises(TypeError, match="max_new_tokens"):
        model.generate_batch(prompts, "4", [])


def test_prompts_joining_a_running_batch_decode_as_alone(wide_gguf) -> None:  # noqa: ANN001
    """generate_batch(max_active=2, join=...): prompts handed over while the batch runs (as requests arriving at
    a server) join it as slots free; every sequence's tokens and logits equal its own run, on_done reports each
    as it ends (before the call returns), and the join callback may encode/embed on the model but not decode."""
    import numpy as np

    model = _core.load_gguf(str(wide_gguf("q8_0")), device="cpu", threads=2)
    model.logit_digests = True
    d = model.info()["decoder"]["d_model"]
    rng = np.random.default_rng(5)
    prompts = [np.ascontiguousarray(model.embed(rng.integers(0, 151643, n).tolist())
                                    + 0.5 * rng.standard_normal((n, d)).astype(np.float32))
               for n in (6, 30, 11, 4, 18)]
    alone = []
    for p in prompts:
        alone.append((model.generate_batch([p], 9, [])[0], model.last_logit_digests()[0]))
    free_run = [tokens for (tokens, _), _ in alone]
    stops = sorted({free_run[0][2], free_run[2][4], free_run[3][1]})  # sequences end at different steps
    alone = []
    for p in prompts:
        alone.append((model.generate_batch([p], 9, stops)[0], model.last_logit_digests()[0]))
    later = list(range(2, len(prompts)))  # prompts 2.. arrive while 0 and 1 decode, one per call
    asked: list[tuple[int, int]] = []
    ended: list[int] = []

    def join(free: int, max_rows: int) -> list:
        asked.append((free, max_rows))
        assert model.embed([1, 2]).shape == (2, d)  # a stateless call is fine in here
        with pytest.raises(RuntimeError, match="inside generate_batch's join or done callback"):
            model.generate_batch([prompts[0]], 1, [])
        return [prompts[later.pop(0)]] if later else []

    out = model.generate_batch(prompts[:2], 9, stops, max_active=2, join=join, join_rows=40,
                               on_done=lambda i, tokens, reason: ended.append(i))
    assert len(out) == len(prompts) and not later and sorted(ended) == list(range(len(prompts)))
    assert len({len(t) for t, _ in out}) >= 3  # really mixed lengths
    digests = model.last_logit_digests()
    for i, ((tokens, reason), ((t1, r1), d1)) in enumerate(zip(out, alone, strict=True)):
        assert (tokens, reason) == (t1, r1) and digests[i] == d1, i
    assert all(free >= 1 and rows >= 40 for free, rows in asked)
    assert ended.index(0) < len(prompts) - 1  # the first one ended while others ran
    with pytest.raises(ValueError, match="max_active > 0"):
        model.generate_batch(prompts[:1], 2, [], join=join)
    too_long = lambda free, rows: [np.zeros((rows + 1, d), np.float32)]  # noqa: E731
    with pytest.raises(ValueError, match="whole rows"):
        model.generate_batch(prompts[:1], 2, [], max_active=2, join=too_long)
    assert model.generate_batch(prompts[:1], 9, stops)[0] == alone[0][0]  # usable after a failed call
