"""fun_asr.asr.ctc: the CTC tokenizer (tiktoken BPE), torchaudio's forced alignment, FunASR's token grouping;
and the HF layout's lack of a CTC head. (End-to-end parity with FunASR: tests/test_funasr_layout.py.)"""

from __future__ import annotations

import base64
import importlib.util
import json
from pathlib import Path

import numpy as np
import pytest

from fun_asr.asr.ctc import CtcAligner, CtcTokenizer, TokenTime, align_ids, forced_align, funasr_text, greedy_ids

HAVE_TORCH = importlib.util.find_spec("torch") is not None
HAVE_TIKTOKEN = importlib.util.find_spec("tiktoken") is not None
PATTERN = r"""'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"""

TEXTS = [
    "", "hello world", "Hello, World!  How's it going? I'm fine; they'd've said 'no'.",
    "今天天气很好，我们去公园散步。",
    "こんにちは、音声認識のテストです。", "mixed 中文 and English 123 4567 ²½ Ⅷ", "  leading and trailing  ",
    "tabs\tand\nnewlines\n\n  \t", "emoji 😀👍🏽 and combining é (e\u0301) ñ",
    "Thai ภาษาไทย Arabic العربية Hindi हिन्दी",
    "<|zh|><|nospeech|> special-token text <|endoftext|>", "a" * 40 + "b" * 3, "reche23 eecT成K", "/sil x  /sil",
    "don't won't can't 's 't 're", "\u00a0non-breaking\u2009thin\u3000ideographic space",
]


@pytest.fixture(scope="module")
def vocab_text() -> str:
    """A small tiktoken vocabulary (the one tools/make_funasr_checkpoint.py writes)."""
    from make_funasr_checkpoint import make_tiktoken_vocab

    return "".join(f"{base64.b64encode(t).decode()} {i}\n" for i, t in enumerate(make_tiktoken_vocab(300)))


@pytest.fixture(scope="module")
def specials() -> list[str]:
    from fun_asr.model.funasr_checkpoint import expand_specials
    from fun_asr.model.spec import load_spec

    return expand_specials(load_spec()["ctc"]["tokenizers"]["SenseVoiceTokenizer"], 8749)


def test_specials_recipe(specials: list[str]) -> None:
    """FunASR 1.4.16's SenseVoiceTokenizer special tokens: 1679 of them (the release: 58836 ranks + 1679 = 60515)."""
    assert len(specials) == len(set(specials)) == 1679
    assert specials[:3] == ["<|endoftext|>", "<|startoftranscript|>", "<|en|>"]
    assert specials[2 + 105] == "<|ASR|>" and specials[2 + 105 + 11 + 3] == "<|NEUTRAL|>"
    assert specials[-1] == "<|30.00|>" and specials[-1501] == "<|0.00|>" and "<|SPECIAL_TOKEN_50|>" in specials


@pytest.mark.skipif(not HAVE_TIKTOKEN, reason="tiktoken not installed")
def test_tokenizer_matches_tiktoken(vocab_text: str, specials: list[str]) -> None:
    """Our encode is tiktoken's encode(text, disallowed_special=()) (what FunASR's SenseVoiceTokenizer calls);
    decode of single tokens is tiktoken's decode."""
    import tiktoken

    ranks = {base64.b64decode(t): int(r) for t, r in (line.split() for line in vocab_text.splitlines())}
    enc = tiktoken.Encoding(name="test", pat_str=PATTERN, mergeable_ranks=ranks,
                            special_tokens={s: len(ranks) + i for i, s in enumerate(specials)},
                            explicit_n_vocab=len(ranks) + len(specials))
    ours = CtcTokenizer.from_tiktoken(vocab_text, PATTERN, specials)
    assert ours.vocab_size == enc.n_vocab
    rng = np.random.default_rng(0)
    alphabet = list("abcdefg xyz,.!?'\n\t 0123456789天气很好我们中文ñé😀\u0301")
    texts = TEXTS + ["".join(rng.choice(alphabet, size=rng.integers(1, 60))) for _ in range(200)]
    for text in texts:
        ids = enc.encode(text, disallowed_special=())
        assert ours.encode(text) == ids, text
        assert ours.decode(ids) == enc.decode(ids)
        for i in ids:
            assert ours.decode([i]) == enc.decode([i])
    special_ids = [len(ranks) + specials.index("<|zh|>"), len(ranks) + specials.index("<|1.00|>")]
    assert ours.decode(special_ids) == "<|zh|>"  # timestamp tokens are dropped, as FunASR's decode does


@pytest.mark.skipif(not HAVE_TORCH, reason="torch not installed")
def test_forced_align_matches_torchaudio_kernel() -> None:
    """Vectorized forced_align == a scalar transcription of torchaudio's CPU kernel (and == torchaudio itself
    when it imports), on random posteriors with repeats, near-minimal lengths and exact ties."""
    import torch

    from funasr_nano_ref import _forced_align_scalar

    real = None
    try:
        import torchaudio.functional as F

        real = F.forced_align
    except Exception:  # noqa: BLE001 - no usable torchaudio here
        pass
    rng = np.random.default_rng(1)
    cases = 0
    for trial in range(150):
        V = int(rng.integers(3, 12))
        blank = int(rng.integers(0, V))
        L = int(rng.integers(1, 9))
        labels = [x for x in range(V) if x != blank]
        tg = rng.choice(labels, size=L)
        if trial % 3 == 0 and L > 1:
            tg[1] = tg[0]  # a repeat
        R = int(np.sum(tg[1:] == tg[:-1]))
        T = L + R + int(rng.integers(0, 3 if trial % 2 else 15))
        logits = rng.normal(size=(T, V)).astype(np.float32) * (3 if trial % 4 else 0.0)  # all-equal: ties
        if trial % 5 == 0:
            logits = np.round(logits)  # many ties
        lp = torch.log_softmax(torch.from_numpy(logits), dim=-1)
        path, scores = forced_align(lp.numpy(), tg, blank)
        ref_path, ref_scores = _forced_align_scalar(lp[None], torch.from_numpy(tg)[None], blank)
        assert path.tolist() == ref_path[0].tolist(), (trial, tg, blank)
        assert np.array_equal(scores, ref_scores[0].numpy())
        if real is not None:
            p2, s2 = real(lp[None], torch.from_numpy(tg)[None].int(), blank=blank)
            assert path.tolist() == p2[0].tolist()
        cases += 1
    assert cases == 150


def test_forced_align_refusals() -> None:
    lp = np.log(np.full((3, 4), 0.25, np.float32))
    with pytest.raises(ValueError, match="too long for CTC"):
        forced_align(lp, [1, 1, 2], 0)  # 3 targets + 1 repeat > 3 frames
    with pytest.raises(ValueError, match="blank"):
        forced_align(lp, [0, 1], 0)
    with pytest.raises(ValueError, match="empty"):
        forced_align(lp, [], 0)
    with pytest.raises(ValueError, match="in \\[0, vocab\\)"):
        forced_align(lp, [7], 0)
    assert align_ids(lp, [1, 1, 2], 0) == []  # FunASR returns no timestamps then


def test_grouping_and_times() -> None:
    """FunASR's grouping: runs of one label (blanks dropped), end exclusive, score = max prob of the run
    rounded to 3 places, times = frames x 60 ms."""
    blank, T, V = 3, 8, 4
    want = [blank, 0, 0, blank, 1, 1, 1, 2]  # a path the posteriors force
    p = np.full((T, V), 0.02, np.float32)
    for t, k in enumerate(want):
        p[t, k] = 0.94 - 0.01 * t
    p /= p.sum(1, keepdims=True)
    out = align_ids(np.log(p), [0, 1, 2], blank)
    assert [(w.token_id, w.start_frame, w.end_frame, w.start_ms, w.end_ms) for w in out] == [
        (0, 1, 3, 60, 180), (1, 4, 7, 240, 420), (2, 7, 8, 420, 480)]
    assert out[0].score == round(float(max(p[1, 0], p[2, 0])), 3) and out[1].score == round(float(p[4, 1]), 3)
    assert out[1].to_dict()["start_time"] == 4 * 6 * 10 / 1000
    assert isinstance(out[0], TokenTime) and out[2].end == 0.48


def test_funasr_text_and_greedy() -> None:
    assert funasr_text(" a  b\n/silc\t ") == " a b c "
    lp = np.log(np.array([[.9, .1], [.9, .1], [.1, .9], [.9, .1], [.9, .1]], np.float32))
    assert greedy_ids(lp, blank=1) == [0, 0]


def test_hf_layout_has_no_ctc(tiny_gguf, tiny_f32: Path) -> None:  # noqa: ANN001
    """The HF port's checkpoint carries no CTC weights: no CTC head, a reason, no tokenizer, no timestamps."""
    from fun_asr import load_model
    from fun_asr.model.native import model_metadata

    for src in (tiny_gguf("f32"), tiny_f32):
        model = load_model(src, threads=1)
        info = model.info()["ctc"]
        assert info["available"] is False and "Hugging Face layout" in info["reason"]
        with pytest.raises(ValueError, match="no CTC head: Hugging Face layout"):
            model.ctc_logprobs(np.zeros((5, model.info()["encoder"]["input_size"]), np.float32))
        with pytest.raises(ValueError, match="no CTC head"):
            model.encode_ctc(np.zeros((5, model.info()["encoder"]["input_size"]), np.float32))
        meta = model_metadata(src)
        assert meta["fun_asr_nano.source.layout"] == "hf" and meta["fun_asr_nano.language_table"] == "nano"
        with pytest.raises(ValueError, match="no CTC tokenizer"):
            CtcTokenizer.from_metadata(meta)
        assert CtcAligner.from_model(model, meta) is None
        assert not any(k.startswith("fun_asr_nano.ctc.tokenizer") for k in meta)
        assert json.loads(meta["fun_asr_nano.prompt"])["fake_token_len"]["halvings"] == 3


def test_ctc_greedy_is_the_argmax_of_the_log_probabilities(ctc_demo) -> None:  # noqa: ANN001
    """Model.encode_keep_encoder gives encode()'s rows and the encoder output; Model.ctc_greedy on that output
    gives each frame's argmax of ctc_logprobs (one encoder pass, the head after it); bad input is a clear
    ValueError. The demo model's trained head hears: its greedy transcript is the held-out clip's text."""
    import soundfile as sf

    from fun_asr import Session
    from fun_asr.asr.ctc import draft_text, merge_labels
    from fun_asr.audio.frontend import features
    from trained_model import heldout_clips

    s = Session(str(ctc_demo["f32"]), device="cpu", vad=None, progress=False)
    m = s.model
    path, text = heldout_clips(Path(ctc_demo["f32"]).parent / "clips")[0]
    feats = features(sf.read(str(path), dtype="float32")[0], s.frontend)
    rows, enc = m.encode_keep_encoder(feats)
    assert np.array_equal(rows, m.encode(feats)) and np.array_equal(enc, m.debug_stages(feats)["enc.out"])
    labels = m.ctc_greedy(enc)
    assert labels.dtype == np.int32 and labels.shape == (feats.shape[0],)
    logp = m.ctc_logprobs(feats)
    assert np.array_equal(labels, logp.argmax(-1))
    assert np.array_equal(m.ctc_logprobs_encoded(enc), logp)  # word timestamps from the kept encoder output
    blank = m.info()["ctc"]["blank_id"]
    assert merge_labels(np.array([blank, 5, 5, blank, 5, 7, 7]), blank) == [5, 5, 7]
    assert draft_text(labels, blank, s.aligner.tokenizer) == text
    d = m.info()["encoder"]["d_model"]
    for bad, msg in ((np.zeros((0, d), np.float32), "empty"), (np.zeros((3, d + 1), np.float32), "columns"),
                     (np.full((3, d), np.nan, np.float32), "NaN")):
        with pytest.raises(ValueError, match=msg):
            m.ctc_greedy(bad)
        with pytest.raises(ValueError, match=msg):
            m.ctc_logprobs_encoded(bad)
    with pytest.raises(TypeError, match="float32"):
        m.ctc_greedy(np.zeros((3, d), np.float64))


def test_ctc_greedy_needs_a_ctc_head(tiny_gguf) -> None:  # noqa: ANN001
    from fun_asr.model.native import load_model

    m = load_model(tiny_gguf("f32"), threads=1)
    for fn in (m.ctc_greedy, m.ctc_logprobs_encoded):
        with pytest.raises(ValueError, match="no CTC head"):
            fn(np.zeros((3, m.info()["encoder"]["d_model"]), np.float32))


def test_word_timestamps_and_ctc_draft_share_the_kept_encoder_output(ctc_demo) -> None:  # noqa: ANN001
    """With word timestamps on, the CTC head runs on the encoder output kept at encode time (for the draft, then
    for the alignment): the trained head times the held-out clip's words, in order, inside the clip."""
    import soundfile as sf

    from fun_asr import Session
    from trained_model import heldout_clips

    s = Session(str(ctc_demo["f32"]), device="cpu", vad=None, progress=False)
    path, text = heldout_clips(Path(ctc_demo["f32"]).parent / "clips_ts")[0]
    x = sf.read(str(path), dtype="float32")[0]
    r = s.transcribe(x, sample_rate=16000, word_timestamps=True)
    assert r.text == text and r.timings["draft_accepted"] > 0
    words = r.segments[0].words
    assert "".join(w["word"] for w in words).split() == text.split()
    starts = [w["start"] for w in words]
    assert starts == sorted(starts) and 0 <= starts[0] and words[-1]["end"] <= len(x) / 16000 + 0.06
    s.ctc_drafts = False
    again = s.transcribe(x, sample_rate=16000, word_timestamps=True)
    assert again.segments[0].words == words and "draft_proposed" not in again.timings
