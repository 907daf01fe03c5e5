#!/usr/bin/env python3
"""WER of a model on espeak-ng voices that tools/train_tiny.py never trains on: the honest figure for the
20-word demo (its held-out clips in tests/data/tiny_trained/heldout use training voices).

    python tools/eval_unseen_voices.py [-m demo] [--clips 48] [--recordings 20] [--seed 7]

- single: one utterance of 1-4 of the demo's words per clip, a voice of train_tiny's UNSEEN_VARIANTS (none of its
  VOICE_VARIANTS) on three English accents, at 135 or 165 words per minute (inside the training range of 110-230),
  0.3 s of silence either side;
- several: 2-4 such utterances in one recording, joined by pauses of 1-2 s (the FSMN-VAD's default keeps pauses
  under ~2 s inside one segment, so these are several utterances in one segment), each recording's words in order.

Both go through ``Session.transcribe`` (the VAD, then the ASR per segment). Prints each condition's WER, its errors
and the run's date; every choice comes from ``--seed``. Needs espeak-ng (``apt-get install espeak-ng``).
"""

from __future__ import annotations

import argparse
import datetime
import sys
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))
sys.path.insert(0, str(ROOT / "tools"))

from train_tiny import UNSEEN_VARIANTS, VOICE_VARIANTS, espeak  # noqa: E402
from trained_model import SAMPLE_RATE, WORDS, wer  # noqa: E402

ACCENTS = ("en", "en-us", "en-gb")
SPEEDS = (135, 165)  # inside the training range (110-230 wpm)


def utterance(rng: np.random.Generator) -> dict[str, Any]:
    words = [WORDS[k] for k in rng.integers(0, len(WORDS), size=int(rng.integers(1, 5)))]
    voice = f"{ACCENTS[int(rng.integers(len(ACCENTS)))]}{UNSEEN_VARIANTS[int(rng.integers(len(UNSEEN_VARIANTS)))]}"
    return {"text": " ".join(words), "voice": voice, "speed": SPEEDS[int(rng.integers(len(SPEEDS)))]}


def synth(utterances: list[dict[str, Any]], pauses: list[float]) -> np.ndarray:
    """float32 16 kHz: 0.3 s of silence, the utterances (each at -6 dBFS peak) with the pauses, 0.3 s of silence."""
    gap = np.zeros(int(0.3 * SAMPLE_RATE))
    parts = [gap]
    for k, u in enumerate(utterances):
        if k:
            parts.append(np.zeros(int(pauses[k - 1] * SAMPLE_RATE)))
        x = espeak(u["text"], u["voice"], u["speed"], 50, 0)
        parts.append(0.5 * x / max(float(np.abs(x).max()), 1e-9))
    parts.append(gap)
    return np.concatenate(parts).astype(np.float32)


def condition(session: Any, recordings: list[tuple[list[dict[str, Any]], list[float]]]) -> dict[str, Any]:
    refs, hyps, segments = [], [], 0
    for utterances, pauses in recordings:
        result = session.transcribe(synth(utterances, pauses), sample_rate=SAMPLE_RATE)
        refs.append(" ".join(u["text"] for u in utterances))
        hyps.append(" ".join(seg.text for seg in result.segments))
        segments += len(result.segments)
    errors = [(r, h) for r, h in zip(refs, hyps, strict=True) if wer([r], [h]) > 0]
    return {"wer": wer(refs, hyps), "words": sum(len(r.split()) for r in refs), "recordings": len(refs),
            "segments": segments, "errors": errors}


def recordings(seed: int, clips: int, several: int) -> dict[str, list[tuple[list[dict[str, Any]], list[float]]]]:
    """The two conditions' recordings (utterances and pauses), every choice from ``seed``."""
    rng = np.random.default_rng(seed)
    single = [([utterance(rng)], []) for _ in range(clips)]
    multi = []
    for _ in range(several):
        n = int(rng.integers(2, 5))
        multi.append(([utterance(rng) for _ in range(n)], [round(float(rng.uniform(1.0, 2.0)), 2)
                                                         for _ in range(n - 1)]))
    return {"single": single, "several (1-2 s pauses)": multi}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("-m", "--model", default="demo", help="model (default: the demo)")
    ap.add_argument("--clips", type=int, default=48, help="single-utterance clips")
    ap.add_argument("--recordings", type=int, default=20, help="recordings of 2-4 utterances with 1-2 s pauses")
    ap.add_argument("--seed", type=int, default=7)
    ap.add_argument("--threads", type=int, default=0)
    args = ap.parse_args()
    assert not set(UNSEEN_VARIANTS) & set(VOICE_VARIANTS), "a variant here is one train_tiny.py trains on"
    import fun_asr

    session = fun_asr.Session(args.model, device="cpu", threads=args.threads, progress=False)
    print(f"eval_unseen_voices: {datetime.date.today()}, model {args.model}, seed {args.seed}, voices "
          f"{'/'.join(ACCENTS)} x {len(UNSEEN_VARIANTS)} variants never trained, {SPEEDS} wpm")
    for name, recs in recordings(args.seed, args.clips, args.recordings).items():
        c = condition(session, recs)
        print(f"{name}: WER {c['wer'] * 100:.1f} % ({c['words']} words, {c['recordings']} recordings, "
              f"{c['segments']} VAD segments)")
        for r, h in c["errors"]:
            print(f"    ref {r!r} hyp {h!r}")


if __name__ == "__main__":
    main()
