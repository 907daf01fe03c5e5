"""How sure the recognizer is (fun_asr.asr.confidence, Segment's confidence fields): each segment's token
log-probabilities as the decoder computed them (the same bits one by one and in batches), avg_logprob as their mean,
Whisper's compression_ratio, no_speech_prob from the VAD's silence probabilities, word probabilities (token words and
the CTC head's timed words), and the text outputs' marking of low-confidence words."""

from __future__ import annotations

import math
import random
import subprocess
import sys
import zlib
from pathlib import Path

import numpy as np
import pytest

import fun_asr
from fun_asr.asr import confidence
from fun_asr.asr.ctc import funasr_text, funasr_text_origin
from fun_asr.asr.formats import render
from fun_asr.asr.results import Segment, Transcription

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"
pytestmark = pytest.mark.filterwarnings("ignore::fun_asr.notices.TruncatedOutputWarning")


def test_compression_ratio_is_whispers() -> None:
    for text in ["hello world", "ha " * 40, "今天天气很好", "x"]:
        data = text.encode()
        assert confidence.compression_ratio(text) == len(data) / len(zlib.compress(data)) > 0
    assert confidence.compression_ratio("") == 0.0
    assert confidence.compression_ratio("ha " * 40) > 2.4 > confidence.compression_ratio("the cat sat on a mat")


def test_split_words_join_to_the_text() -> None:
    assert confidence.split_words(" Hello, world. How are you?") == [" Hello,", " world.", " How", " are", " you?"]
    assert confidence.split_words("今天好。ok 你") == ["今", "天", "好。", "ok", " 你"]
    rng = random.Random(0)
    for _ in range(500):
        text = "".join(rng.choice(["a", "b", " ", ",", "。", "天", "\n", "'"]) for _ in range(rng.randint(0, 15)))
        assert "".join(confidence.split_words(text)) == text


def test_token_words_take_the_mean_probability_of_their_tokens() -> None:
    pieces = {1: b" un", 2: b"believ", 3: b"able", 4: b",", 5: b" \xe5\xa4", 6: b"\xa9", 7: b" go"}
    lps = [-0.1, -2.0, -0.5, -0.01, -1.0, -0.2, -3.0]
    words = confidence.token_words(list(pieces), lps, pieces.__getitem__)
    assert [w["word"] for w in words] == [" unbelievable,", " 天", " go"]
    p = [math.exp(x) for x in lps]
    assert [w["probability"] for w in words] == [round(sum(p[0:4]) / 4, 4), round((p[4] + p[5]) / 2, 4),
                                                 round(p[6], 4)]
    with pytest.raises(ValueError, match="3 tokens but 2"):
        confidence.token_words([1, 2, 3], [0.0, 0.0], pieces.__getitem__)


def test_decoded_offsets_follow_the_bytes() -> None:
    rng = random.Random(1)
    alphabet = [b"a", b" ", "天".encode(), b"\xe5", b"\xa4", b"\xff", "é".encode(), b"\xc3"]
    for _ in range(2000):
        data = b"".join(rng.choice(alphabet) for _ in range(rng.randint(0, 10)))
        text, offsets = confidence._decoded(data)
        assert text == data.decode("utf-8", errors="replace")
        assert len(offsets) == len(text) + 1 and offsets[-1] == len(data)
        assert offsets == sorted(offsets) and all(0 <= o <= len(data) for o in offsets)
        for ch, a, b in zip(text, offsets, offsets[1:], strict=False):
            if ch != "\ufffd":
                assert data[a:b] == ch.encode()


def test_funasr_text_origin_maps_every_character() -> None:
    rng = random.Random(2)
    for _ in range(2000):
        r = "".join(rng.choice(["a", " ", "\t", "/sil", "/", "s", "你", "\n"]) for _ in range(rng.randint(0, 12)))
        text, origin = funasr_text_origin(r)
        assert text == funasr_text(r) and len(origin) == len(text)
        assert all(r[o] == c or c == " " for c, o in zip(text, origin, strict=True))


@pytest.fixture(scope="module")
def clips() -> list[np.ndarray]:
    from trained_model import heldout_audio

    return [x.astype(np.float32) / 32768.0 for x, _ in heldout_audio()[:12]]


def test_segments_carry_the_decoders_log_probabilities_alone_and_in_batches(demo: fun_asr.Session,
                                                                               clips: list[np.ndarray]) -> None:
    alone = [demo.transcribe(c, sample_rate=16000) for c in clips]
    batch = demo.transcribe_batch(clips, sample_rate=16000, batch_size=8)
    for a, b in zip(alone, batch, strict=True):
        for sa, sb in zip(a.segments, b.segments, strict=True):
            assert sa.tokens == sb.tokens and sa.token_logprobs == sb.token_logprobs  # the same bits
            assert len(sa.token_logprobs) == len(sa.tokens) and all(x <= 0 for x in sa.token_logprobs)
            assert sa.avg_logprob == pytest.approx(float(np.mean(sa.token_logprobs)), abs=1e-12)
            assert sa.compression_ratio == confidence.compression_ratio(sa.text)
            d = a.to_dict()["segments"][0]
            assert {"avg_logprob", "compression_ratio", "no_speech_prob", "token_logprobs", "token_words"} <= set(d)
    # the model's own numbers for the first segment's prompt: what the Session recorded
    seg = alone[0].segments[0]
    assert seg.token_words and "".join(w["word"] for w in seg.token_words).strip() == seg.text
    kept = [lp for t, lp in zip(seg.tokens, seg.token_logprobs, strict=True) if t not in demo.stop_ids]
    assert [w["probability"] for w in seg.token_words] == [round(math.exp(x), 4) for x in kept]  # a word a token


def test_no_speech_prob_is_the_vads_mean_silence_over_the_segment(demo: fun_asr.Session, three: Path) -> None:
    import soundfile as sf

    r = demo.transcribe(three)
    samples, _ = sf.read(three, dtype="float32")
    vad = demo.vad
    probs = vad.frame_probs(samples)
    silence = probs[:, list(vad.cfg.sil_pdf_ids)].sum(axis=1).astype(np.float64)
    assert len(r.segments) == 3
    for s in r.segments:
        a, b = -(-int(round(s.start * 1000)) // 10), -(-int(round(s.end * 1000)) // 10)
        assert s.no_speech_prob == pytest.approx(float(silence[a:b].mean()), abs=1e-6)
        assert 0 <= s.no_speech_prob < 0.5  # speech
    # without a VAD there is no such probability
    plain = fun_asr.Session("demo", device="cpu", vad=None, progress=False)
    assert all(s.no_speech_prob is None for s in plain.transcribe(three).segments)


def test_ctc_words_get_the_decoders_probability(ctc_demo: dict[str, Path], three: Path) -> None:
    s = fun_asr.Session(ctc_demo["f32"], device="cpu", vad=None, progress=False)
    r = s.transcribe(three, word_timestamps=True)
    assert r.words
    paired = 0
    for seg in r.segments:
        assert all(0 < w["probability"] <= 1 for w in seg.words)
        ctc = [w for w in seg.words if w["word"].strip()]
        if [w["word"].strip() for w in ctc] == [w["word"].strip() for w in seg.token_words]:
            # the CTC head spells the decoder's words one for one: each gets that word's probability
            assert [w["probability"] for w in ctc] == [w["probability"] for w in seg.token_words]
            paired += 1
    assert paired == len(r.segments) >= 1


def _transcription(words: list[tuple[str, float]]) -> Transcription:
    seg = Segment(0.0, 1.0, "".join(w for w, _ in words).strip(), [], "eos", False, False,
                  token_words=[{"word": w, "probability": p} for w, p in words])
    return Transcription(seg.text, [seg], "en", 1.0, {})


def test_text_outputs_mark_low_confidence_words() -> None:
    t = _transcription([(" five", 0.99), (" two", 0.4), (" nine.", 0.2)])
    assert render(t, "txt") == "five two nine.\n"
    assert render(t, "txt", mark_below=0.5) == "five (two?) (nine.?)\n"
    assert "five (two?) (nine.?)" in render(t, "srt", mark_below=0.5)
    assert "five two (nine.?)" in render(t, "vtt", mark_below=0.3)
    with pytest.raises(ValueError, match="from 0 to 1"):
        render(t, "txt", mark_below=1.5)


def test_cli_mark_below(tmp_path: Path) -> None:
    r = subprocess.run([sys.executable, "-m", "fun_asr.cli.transcribe", "-m", "demo", str(EXAMPLES / "demo_1.wav"),
                        "--mark-below", "1"], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == " ".join(f"({w}?)" for w in "five two five eight".split())
    r = subprocess.run([sys.executable, "-m", "fun_asr.cli.transcribe", "-m", "demo", str(EXAMPLES / "demo_1.wav"),
                        "--mark-below", "2"], capture_output=True, text=True, timeout=300)
    assert r.returncode != 0 and "--mark-below must be a probability from 0 to 1" in r.stderr


def test_a_model_with_token_logprobs_off_gives_none(demo: fun_asr.Session, three: Path) -> None:
    import json

    demo.model.token_logprobs = False
    try:
        r = demo.transcribe(three)
    finally:
        demo.model.token_logprobs = True
    assert r.text and all(s.token_logprobs is None and s.avg_logprob is None and s.token_words is None
                          for s in r.segments)
    assert json.loads(json.dumps(r.to_dict()))["segments"][0]["avg_logprob"] is None
