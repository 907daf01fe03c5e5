"""Lossless speculative decoding: with a draft, generation gives plain greedy's tokens, stop reason and
every logits row bit for bit, whatever the draft (runtime/generate.cpp decode_with_draft).

The verification pass runs the draft's positions with the decode-step arithmetic (mul_mat_step per
column, the fused attention's per-row loop), so each position's logits equal a single step's there.
Random full-width models (the "wide" checkpoint: the released decoder's widths and vocabulary, 2 layers)
have nearly flat logits, so any rounding difference would change tokens or digests.
"""

from __future__ import annotations

import numpy as np
import pytest

from fun_asr import _core

pytestmark = pytest.mark.filterwarnings("ignore::fun_asr.notices.TruncatedOutputWarning")


def _prompt(model: _core.Model, n: int, seed: int) -> np.ndarray:
    d = model.info()["decoder"]["d_model"]
    rng = np.random.default_rng(seed)
    ids = rng.integers(0, 151643, n).tolist()
    return np.ascontiguousarray(model.embed(ids) + 0.5 * rng.standard_normal((n, d)).astype(np.float32))


def _run(model: _core.Model, prompt: np.ndarray, new: int, stops: list[int], draft: list[int] | None,
         guard: bool = False) -> tuple[list[int], str, list[int], dict]:
    (tokens, reason), = model.generate_batch([prompt], new, stops, repetition_guard=guard, draft=draft)
    digests = model.last_logit_digests()
    return tokens, reason, digests[0] if digests else [], model.last_generation()


@pytest.mark.parametrize("package", ["f32", "f16", "q8_0", "q4_k_m"])
def test_any_draft_gives_greedy_bit_for_bit(package: str, wide_gguf) -> None:  # noqa: ANN001
    model = _core.load_gguf(str(wide_gguf(package)), device="cpu", threads=2)
    model.logit_digests = True
    prompt = _prompt(model, 23, 4)
    plain, reason, digests, stats = _run(model, prompt, 30, [], None)
    assert reason == "max_new_tokens" and len(plain) == 30 and stats["draft_proposed"] == 0
    assert stats["decode_passes"] == 29
    rng = np.random.default_rng(1)
    drafts = {
        "exact": plain,
        "longer": plain + [5, 6, 7],
        "wrong at 5": plain[:5] + [(plain[5] + 1) % 151643] + plain[6:],
        "tokens missing": plain[:8] + plain[11:],  # realigned on the last two tokens
        "junk": rng.integers(0, 151643, 40).tolist(),
        "one token": plain[:1],
    }
    for name, draft in drafts.items():
        tokens, r, dg, st = _run(model, prompt, 30, [], draft)
        assert (tokens, r) == (plain, reason), name
        assert dg == digests, f"{name}: logits rows differ from plain greedy"
        assert st["draft_accepted"] <= st["draft_proposed"]
        # every pass gives its accepted draft tokens plus one of its own: 29 tokens after the prefill's
        assert st["draft_accepted"] + st["decode_passes"] == 29, st
        if name == "exact":  # draft_max + 1 tokens per pass (the last pass is cut by max_new_tokens)
            assert st["decode_passes"] == -(-29 // (model.draft_max + 1)), st
        if name == "junk":
            assert st["draft_accepted"] <= 2, st


def test_stops_inside_a_verified_draft(wide_gguf) -> None:  # noqa: ANN001
    """A stop id, the repetition guard and max_new_tokens met in the middle of a verified draft end the
    output exactly where plain greedy ends it."""
    model = _core.load_gguf(str(wide_gguf("q8_0")), device="cpu", threads=2)
    model.logit_digests = True
    prompt = _prompt(model, 17, 9)
    plain, _, _, _ = _run(model, prompt, 30, [], None)
    stop = [plain[12]]  # the first time this token comes, plain greedy stops ("eos", the stop id included)
    want = _run(model, prompt, 30, stop, None)
    assert want[1] == "eos" and want[0][-1] == plain[12]
    got = _run(model, prompt, 30, stop, plain)
    assert got[:3] == want[:3]
    for new in (1, 2, 7, 13):
        want = _run(model, prompt, new, [], None)
        got = _run(model, prompt, new, [], plain)
        assert got[:3] == want[:3], new
        assert len(got[0]) == new
    loop = plain[:4] + [plain[4]] * 40  # a draft that repeats a token: the guard ends the same way
    assert _run(model, prompt, 30, [], loop, guard=True)[:3] == _run(model, prompt, 30, [], None, guard=True)[:3]


def test_draft_options_and_errors(wide_gguf) -> None:  # noqa: ANN001
    model = _core.load_gguf(str(wide_gguf("q4_k_m")), device="cpu", threads=0)
    prompt = _prompt(model, 11, 2)
    plain, _, _, _ = _run(model, prompt, 12, [], None)
    model.draft_max = 0  # drafts off: plain steps
    assert _run(model, prompt, 12, [], plain)[3]["draft_proposed"] == 0
    model.draft_max = 3
    tokens, _, _, st = _run(model, prompt, 12, [], plain)
    assert tokens == plain and st["decode_passes"] == 3  # 11 more tokens, 3 + 1 per pass
    model.flash_attn = False  # the matmul attention sums over the pass's longest row: drafts unused
    tokens, _, _, st = _run(model, prompt, 12, [], plain)
    assert tokens == plain and st["draft_proposed"] == 0
    with pytest.raises(ValueError, match="draft is for one sequence"):
        model.generate_batch([prompt, prompt], 4, [], draft=plain)
    with pytest.raises(IndexError, match="draft token 1000000000 is outside the vocabulary"):
        model.generate_batch([prompt], 4, [], draft=[10**9])
    with pytest.raises(ValueError, match="draft_max"):
        model.draft_max = -1
