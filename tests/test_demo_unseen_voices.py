"""The demo on voices it never trained on (tools/eval_unseen_voices.py, seed 7): espeak-ng voice variants that
tools/train_tiny.py never uses, one utterance per clip and 2-4 utterances with 1-2 s pauses in one recording (the
FSMN-VAD keeps several of them in one segment).

The bounds are today's measured figures (docs/trained_model.md, "Voices it never heard"), so the test fails if the
demo gets worse; the goal for the demo is 5 % and 10 %, which its training recipe does not reach yet."""

from __future__ import annotations

import shutil

import pytest

import fun_asr

pytestmark = pytest.mark.skipif(shutil.which("espeak-ng") is None, reason="needs espeak-ng (apt-get install espeak-ng)")

# Words wrong out of the words said, as measured on the AVX2 and the AVX-512 kernel paths (the larger of the two).
MEASURED_ERRORS = {"single": (7, 122), "several (1-2 s pauses)": (46, 156)}


def test_training_never_uses_the_unseen_voices() -> None:
    from train_tiny import UNSEEN_VARIANTS, VOICE_VARIANTS, VOICES

    assert not set(UNSEEN_VARIANTS) & set(VOICE_VARIANTS)
    assert not any(v.endswith(u) for v in VOICES for u in UNSEEN_VARIANTS)


def test_demo_on_unseen_voices_is_no_worse_than_measured() -> None:
    from eval_unseen_voices import condition, recordings

    session = fun_asr.Session("demo", device="cpu", progress=False)
    for name, recs in recordings(seed=7, clips=48, several=20).items():
        got = condition(session, recs)
        errors, words = MEASURED_ERRORS[name]
        assert got["words"] == words, (name, got["words"])
        assert got["wer"] <= errors / words + 1e-9, (name, got["wer"], got["errors"])
