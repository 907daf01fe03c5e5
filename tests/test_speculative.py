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


def test_tokens_to_skip_bridge_what_the_draft_lacks(wide_gguf) -> None:  # noqa: ANN001
    """Model.draft_skip (the punctuation a CTC transcript lacks): a draft without some of greedy's tokens is
    matched with those tokens left out on both sides, so it stays aligned across them and a pass that meets one
    does not end drafting; more draft tokens are kept, and the output is plain greedy's, bit for bit."""
    model = _core.load_gguf(str(wide_gguf("q8_0")), device="cpu", threads=2)
    model.logit_digests = True
    prompt = _prompt(model, 19, 6)
    plain, reason, digests, _ = _run(model, prompt, 30, [], None)
    marks = sorted({plain[i] for i in (4, 9, 15, 22)} - {plain[0]})  # the "punctuation" greedy puts in
    draft = [t for t in plain if t not in marks]  # what a CTC transcript would give: none of it
    assert len(draft) < len(plain)
    runs = {}
    for skip in ([], marks):
        model.draft_skip = skip
        tokens, r, dg, st = _run(model, prompt, 30, [], draft)
        assert (tokens, r, dg) == (plain, reason, digests), skip
        runs[bool(skip)] = st
    assert list(model.draft_skip) == marks
    without, with_skip = runs[False], runs[True]
    assert with_skip["draft_accepted"] > without["draft_accepted"], (with_skip, without)
    assert with_skip["decode_passes"] < without["decode_passes"], (with_skip, without)
    with pytest.raises(IndexError, match="draft_skip token -1 is outside the vocabulary"):
        model.draft_skip = [-1]
    model.draft_skip = []


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


# -- the Session, the stream and the server's batcher ----------------------------------------------------


def _three_audio(three) -> np.ndarray:  # noqa: ANN001
    import soundfile as sf

    x, rate = sf.read(three, dtype="float32")
    assert rate == 16000
    return x


def _stream_events(session, x: np.ndarray) -> list[dict]:  # noqa: ANN001
    """A VAD stream of `x` fed in 60 ms chunks: every event, as dicts."""
    st = session.stream()
    events = []
    for i in range(0, x.size, 960):
        events += st.feed(x[i : i + 960])
    events += st.close()
    return [e.to_dict() for e in events]


def test_transcribe_draft_is_lossless_and_counted(demo, three) -> None:  # noqa: ANN001
    """Session.transcribe(draft=): the same result with the right draft, a wrong one or none; a right draft is
    kept and saves decoder passes (the timings count them); bad drafts are clear errors."""
    x = _three_audio(three)[: 16000 * 3]
    kw = dict(sample_rate=16000, vad=False)
    plain = demo.transcribe(x, **kw)
    tokens = [t for s in plain.segments for t in s.tokens]
    assert len(tokens) >= 3 and "draft_proposed" not in plain.timings
    for draft in (tokens, tokens[:2], [7, 8, 9, 10], tokens + tokens):
        r = demo.transcribe(x, draft=draft, **kw)
        assert r.text == plain.text and [t for s in r.segments for t in s.tokens] == tokens, draft
        assert {"decode_passes", "draft_proposed", "draft_accepted"} <= r.timings.keys()
    exact = demo.transcribe(x, draft=tokens, **kw).timings
    assert exact["draft_accepted"] == exact["draft_proposed"] > 0
    assert exact["decode_passes"] < len(tokens) - 1  # plain greedy: one pass per token after the prefill's
    with pytest.raises(TypeError, match="draft must be a list of token ids"):
        demo.transcribe(x, draft="hello", **kw)
    with pytest.raises(TypeError, match="token ids"):
        demo.transcribe(x, draft=[1.5], **kw)
    with pytest.raises(ValueError, match=r"token id -1 is outside the vocabulary \[0, 151936\)"):
        demo.transcribe(x, draft=[5, -1], **kw)
    with pytest.raises(ValueError, match=r"drafts\[1\]: token id 999999 is outside"):
        demo.transcribe_batch([x, x], sample_rate=16000, drafts=[None, [999999]])
    with pytest.raises(ValueError, match="drafts must be a list of 2"):
        demo.transcribe_batch([x, x], sample_rate=16000, drafts=[tokens])
    # in a batch the segments decode together, without drafts; the results are the same
    both = demo.transcribe_batch([x, x], sample_rate=16000, vad=False, drafts=[tokens, None])
    assert all(r.text == plain.text and "draft_proposed" not in r.timings for r in both)
    alone = demo.transcribe_batch([x], sample_rate=16000, vad=False, drafts=[tokens])[0]
    assert alone.text == plain.text and alone.timings["draft_accepted"] > 0


def test_stream_partials_are_the_draft_of_the_next_decode(demo, three) -> None:  # noqa: ANN001
    """A VAD stream gives each decode of an open sentence (the next partial, the closing decode) the sentence's
    latest partial tokens as its draft: the same events as with drafts off (Model.draft_max = 0); on the demo
    model's three utterances most draft tokens are kept, so fewer decoder passes run."""
    x = _three_audio(three)
    real = demo.transcribe
    stats: list[dict] = []

    def spy(*args, **kwargs):  # noqa: ANN002, ANN003, ANN202
        r = real(*args, **kwargs)
        if kwargs.get("draft"):
            stats.append(r.timings)
        return r

    runs = {}
    demo.transcribe = spy
    try:
        for draft_max in (4, 0):
            demo.model.draft_max = draft_max
            stats.clear()
            runs[draft_max] = (_stream_events(demo, x), list(stats))
    finally:
        demo.model.draft_max = 4
        del demo.transcribe
    (with_drafts, on), (without, off) = runs[4], runs[0]
    assert with_drafts == without and sum(e["type"] == "sentence" for e in with_drafts) == 3
    assert len(on) == len(off) >= 6  # every decode after a sentence's first partial had a draft
    proposed, kept = sum(t["draft_proposed"] for t in on), sum(t["draft_accepted"] for t in on)
    assert proposed > 0 and kept >= proposed // 2, (kept, proposed)
    assert sum(t["decode_passes"] for t in on) < sum(t["decode_passes"] for t in off)


def test_batcher_takes_a_draft_only_for_a_lone_request(demo, three) -> None:  # noqa: ANN001
    from concurrent.futures import Future

    from fun_asr.serve.core.batcher import Batcher
    from fun_asr.serve.core.requests import DecodeRequest

    x = _three_audio(three)[: 16000 * 3]
    plain = demo.transcribe(x, sample_rate=16000, vad=False)
    tokens = [t for s in plain.segments for t in s.tokens]
    b = Batcher(demo, max_batch=4, max_new_tokens=512)
    try:
        options = DecodeRequest(None, True, (), 512, 30.0, False, False)
        lone = b.submit(x, options, "stream", draft=tokens).result(timeout=120)
        assert lone.text == plain.text and lone.timings["draft_accepted"] > 0
        jobs = [(options, (x, name, tokens), Future(), "final", 0.0) for name in ("a", "b")]
        b._run(jobs)  # two requests decoded together: one pass per step for both, no drafts
        for _, _, fut, _, _ in jobs:
            r = fut.result(timeout=1)
            assert r.text == plain.text and "draft_proposed" not in r.timings
    finally:
        b.close()


# -- the CTC head's greedy transcript as the draft (checkpoints with a CTC head) ---------------------------

def _heldout(tmp_path_factory: pytest.TempPathFactory, n: int) -> list[tuple[np.ndarray, str]]:
    import soundfile as sf

    from trained_model import heldout_clips

    clips = heldout_clips(tmp_path_factory.mktemp("heldout"))[:n]
    return [(sf.read(str(path), dtype="float32")[0], text) for path, text in clips]


@pytest.fixture(scope="module")
def heldout(tmp_path_factory: pytest.TempPathFactory) -> list[tuple[np.ndarray, str]]:
    return _heldout(tmp_path_factory, 16)


def _tokens(r) -> list[int]:  # noqa: ANN001
    return [t for s in r.segments for t in s.tokens]


@pytest.mark.parametrize("package", ["f32", "q4_k_m"])
def test_ctc_draft_is_lossless_and_saves_passes(ctc_demo, heldout, package: str) -> None:  # noqa: ANN001
    """With a CTC head, a segment decoded alone takes the CTC greedy transcript as its draft: the same tokens
    as without (Session.ctc_drafts = False), and on the demo model with its trained head most draft tokens are
    kept, so far fewer decoder passes run than one per token."""
    import fun_asr

    s = fun_asr.Session(str(ctc_demo[package]), device="cpu", vad=None, progress=False)
    assert s.ctc_drafts and s.aligner is not None
    passes = plain_passes = proposed = kept = 0
    for x, _text in heldout:
        s.ctc_drafts = True
        on = s.transcribe(x, sample_rate=16000)
        s.ctc_drafts = False
        off = s.transcribe(x, sample_rate=16000)
        assert _tokens(on) == _tokens(off) and on.text == off.text
        assert "draft_proposed" not in off.timings and "ctc_draft_ms" not in off.timings
        assert on.timings["ctc_draft_ms"] > 0
        passes += on.timings["decode_passes"]
        plain_passes += len(_tokens(off)) - 1  # plain greedy: one pass per token after the prefill's
        proposed += on.timings["draft_proposed"]
        kept += on.timings["draft_accepted"]
    assert proposed > 0 and kept >= 0.9 * proposed, (kept, proposed)
    assert passes < 0.6 * plain_passes, (passes, plain_passes)


def test_ctc_draft_only_for_a_lone_segment_and_never_over_a_given_draft(ctc_demo, heldout) -> None:  # noqa: ANN001
    """Segments decoded together take no draft (the CTC head does not run, the kept encoder outputs are
    dropped); a draft the caller gives is the one verified; a stream's decode without a draft takes the CTC
    one; draft_max = 0 turns it off."""
    import fun_asr

    s = fun_asr.Session(str(ctc_demo["f32"]), device="cpu", vad=None, progress=False)
    (x, _), (y, _) = heldout[0], heldout[1]
    alone = [s.transcribe(a, sample_rate=16000) for a in (x, y)]
    both = s.transcribe_batch([x, y], sample_rate=16000)
    for a, b in zip(alone, both, strict=True):
        assert _tokens(a) == _tokens(b) and "draft_proposed" not in b.timings and "ctc_draft_ms" not in b.timings
    wrong = [7, 8, 9, 10]
    given = s.transcribe(x, sample_rate=16000, draft=wrong)
    assert _tokens(given) == _tokens(alone[0]) and "ctc_draft_ms" not in given.timings
    assert given.timings["draft_accepted"] == 0
    opts = s.options()
    tokens, _, timings = s._decode_audio(x, opts, [], 64)
    assert tokens == [t for t in _tokens(alone[0]) if t not in s.stop_ids] and timings["draft_accepted"] > 0
    s.model.draft_max = 0
    try:
        off = s.transcribe(x, sample_rate=16000)
        assert _tokens(off) == _tokens(alone[0]) and "ctc_draft_ms" not in off.timings
    finally:
        s.model.draft_max = 4


def test_ctc_drafts_per_vad_segment(ctc_demo, vad_dir, three) -> None:  # noqa: ANN001
    """With the VAD and batch_size=1 each speech segment is decoded alone with its own CTC draft: the same
    segments and tokens as decoded together (batch_size=8, no drafts), in fewer passes."""
    import fun_asr

    s = fun_asr.Session(str(ctc_demo["f32"]), device="cpu", vad="fsmn", vad_model=vad_dir, progress=False)
    x = _three_audio(three)
    one = s.transcribe(x, sample_rate=16000, batch_size=1)
    together = s.transcribe(x, sample_rate=16000, batch_size=8)
    assert len(one.segments) == len(together.segments) == 3
    assert [sg.tokens for sg in one.segments] == [sg.tokens for sg in together.segments]
    assert "draft_proposed" not in together.timings
    assert one.timings["draft_accepted"] >= 0.9 * one.timings["draft_proposed"] > 0
    assert one.timings["decode_passes"] < sum(len(sg.tokens) - 1 for sg in one.segments)


def test_ctc_drafting_leaves_punctuation_out_of_the_match(ctc_demo, heldout) -> None:  # noqa: ANN001
    """A CTC transcript has no punctuation (FunASR trains the head on normalized text): a Session on a model
    with a CTC head sets Model.draft_skip to the vocabulary's punctuation-only tokens; without one, none."""
    import fun_asr

    s = fun_asr.Session(str(ctc_demo["f32"]), device="cpu", vad=None, progress=False)
    assert list(fun_asr.Session("demo", device="cpu", vad=None, progress=False).model.draft_skip) == []
    texts = [s.tokenizer.decode([i]) for i in s.model.draft_skip]
    assert {",", ".", "?", "，", "。"} <= set(texts), texts
    assert all(t.strip() and not any(c.isalnum() for c in t) for t in texts), texts


def test_stream_events_are_the_same_with_ctc_drafts(ctc_demo, vad_dir, three) -> None:  # noqa: ANN001
    """A VAD stream on a CTC model: decodes without a previous partial (each sentence's first partial) take the
    CTC draft; every event is the same as with ctc_drafts off, in fewer decoder passes."""
    import fun_asr

    s = fun_asr.Session(str(ctc_demo["f32"]), device="cpu", vad="fsmn", vad_model=vad_dir, progress=False)
    x = _three_audio(three)
    real = s.transcribe
    timings: list[dict] = []

    def spy(*args, **kwargs):  # noqa: ANN002, ANN003, ANN202
        r = real(*args, **kwargs)
        timings.append(r.timings)
        return r

    s.transcribe = spy
    runs = {}
    for on in (True, False):
        s.ctc_drafts = on
        timings.clear()
        events = _stream_events(s, x)
        passes = sum(t.get("decode_passes", max(t["tokens"] - 1, 0)) for t in timings)
        runs[on] = (events, passes, sum("ctc_draft_ms" in t for t in timings))
    (ev_on, passes_on, ctc_on), (ev_off, passes_off, ctc_off) = runs[True], runs[False]
    assert ev_on == ev_off and sum(e["type"] == "sentence" for e in ev_on) == 3
    assert ctc_on >= 3 and ctc_off == 0  # at least each sentence's first partial
    assert passes_on < passes_off, (passes_on, passes_off)
