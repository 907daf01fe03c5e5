"""The tiny Fun-ASR-Nano trained here (tools/train_tiny.py): rebuild it, and its held-out clips.

Everything here needs numpy, soundfile and safetensors only (no torch, no espeak-ng):

- ``trained_checkpoint(dest)`` rebuilds the full Hugging Face layout checkpoint (config.json,
  model.safetensors, tokenizer.json, ...) from the committed artifact in ``tests/data/tiny_trained``:
  the non-embedding weights (matrices stored as F16, written back as F32), the trained rows of the
  token embedding, and the untrained rows regenerated from a fixed seed.
- ``heldout_clips(dest)`` writes the held-out clips (16 kHz int16 WAV) and returns their transcripts.
  The committed FLACs hold the clean espeak-ng speech; the light noise is added here from a seed,
  exactly as in training (``add_noise``).
- ``three_utterances_clip(dest)`` joins three held-out clips with silences (for VAD + ASR tests).
- ``wer`` is the word error rate used in docs/trained_model.md.

tools/train_tiny.py imports the recipe functions from here, so training and tests share them.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np

from fun_asr.model.demo import (  # noqa: F401 - the recipe's shared pieces, re-exported
    EMBEDDING_KEY,
    PLAIN_FILES,
    QWEN_FIRST_SPECIAL_ID,
    WORDS,
    artifact_dir,
    embedding_base,
    full_tokenizer_json,
    manifest,
)
from fun_asr.model.demo import build_checkpoint as trained_checkpoint  # noqa: F401

# The model's files ship in the package (python/fun_asr/model/demo_model: the `-m demo` model); the held-out
# clips stay with the tests.
ARTIFACT = artifact_dir()
HELDOUT = Path(__file__).resolve().parent / "data" / "tiny_trained" / "heldout"
SAMPLE_RATE = 16000


# --- the shared recipe ---------------------------------------------------------------------------

def add_noise(clean: np.ndarray, snr_db: float, seed: int, kind: str = "white") -> np.ndarray:
    """Clean int16 speech -> int16 speech with noise at `snr_db` below the speech RMS.
    The RMS is taken over samples louder than 1 % of the peak (the speech, not the silences).
    `kind`: "white" (flat), "pink" (power ~ 1/f) or "brown" (~ 1/f^2), each at the same RMS."""
    x = clean.astype(np.float64)
    peak = np.abs(x).max() if x.size else 0.0
    loud = x[np.abs(x) > 0.01 * peak] if peak > 0 else x
    rms = float(np.sqrt(np.mean(loud**2))) if loud.size else 0.0
    rng = np.random.default_rng(seed)
    noise = rng.standard_normal(x.shape[0])
    if kind != "white":
        if kind not in ("pink", "brown"):
            raise ValueError(f"noise kind {kind!r}: white, pink or brown")
        spectrum = np.fft.rfft(noise)
        f = np.maximum(np.arange(spectrum.size), 1.0)
        spectrum /= np.sqrt(f) if kind == "pink" else f
        noise = np.fft.irfft(spectrum, n=x.shape[0])
        noise /= max(float(np.sqrt(np.mean(noise**2))), 1e-12)
    noisy = x + noise * rms * 10.0 ** (-snr_db / 20.0)
    return np.clip(np.round(noisy), -32768, 32767).astype(np.int16)


def normalize_text(text: str) -> list[str]:
    """Lower case, punctuation removed, split on white space."""
    return re.sub(r"[^\w\s']", " ", text.lower()).split()


def edit_distance(ref: list[str], hyp: list[str]) -> int:
    d = list(range(len(hyp) + 1))
    for i, r in enumerate(ref, 1):
        prev, d[0] = d[0], i
        for j, h in enumerate(hyp, 1):
            prev, d[j] = d[j], min(d[j] + 1, d[j - 1] + 1, prev + (r != h))
    return d[len(hyp)]


def wer(refs: list[str], hyps: list[str]) -> float:
    """Word edit distance summed over the set / reference words in the set (case and punctuation normalised)."""
    errors = sum(edit_distance(normalize_text(r), normalize_text(h)) for r, h in zip(refs, hyps, strict=True))
    words = sum(len(normalize_text(r)) for r in refs)
    return errors / max(words, 1)


# --- rebuilding the checkpoint ------------------------------------------------------------------

# --- held-out audio -----------------------------------------------------------------------------

def _write_wav(path: Path, samples: np.ndarray) -> None:
    import soundfile as sf

    sf.write(str(path), samples, SAMPLE_RATE, subtype="PCM_16")


def heldout_clean(artifact: Path = ARTIFACT) -> list[tuple[np.ndarray, dict]]:
    """(clean int16 samples, manifest entry) for every held-out clip."""
    import soundfile as sf

    out = []
    for entry in manifest(artifact)["heldout"]:
        data, rate = sf.read(str(HELDOUT / entry["file"]), dtype="int16")
        if rate != SAMPLE_RATE:
            raise ValueError(f"{entry['file']}: {rate} Hz, expected {SAMPLE_RATE}")
        out.append((data, entry))
    return out


def heldout_audio(artifact: Path = ARTIFACT) -> list[tuple[np.ndarray, str]]:
    """(noisy int16 samples, transcript) for every held-out clip, in manifest order."""
    return [(add_noise(clean, e["snr_db"], e["noise_seed"]), e["text"]) for clean, e in heldout_clean(artifact)]


def heldout_clips(dest: Path, artifact: Path = ARTIFACT) -> list[tuple[Path, str]]:
    """Writes the held-out clips as 16 kHz int16 WAV files into `dest`: [(path, transcript), ...]."""
    dest = Path(dest)
    dest.mkdir(parents=True, exist_ok=True)
    out = []
    for (samples, text), entry in zip(heldout_audio(artifact), manifest(artifact)["heldout"], strict=True):
        path = dest / (Path(entry["file"]).stem + ".wav")
        _write_wav(path, samples)
        out.append((path, text))
    return out


def three_utterances_clip(dest: Path, picks: tuple[int, int, int] = (3, 17, 29),
                          silences: tuple[float, float, float, float] = (1.0, 1.6, 1.8, 1.2),
                          artifact: Path = ARTIFACT) -> tuple[Path, list[str]]:
    """Silence, utterance, silence, utterance, silence, utterance, silence, as one 16 kHz WAV.

    The utterances are held-out clips `picks` (clean speech with their leading/trailing pauses);
    the silences (seconds) carry light white noise (seeded). Returns (path, words in order).
    The utterance spans in seconds (start and end of each clip's audio in the file) are written
    next to it as ``three_utterances.json``: {"words": [...], "utterances": [{"text", "start", "end"}]}."""
    dest = Path(dest)
    dest.mkdir(parents=True, exist_ok=True)
    clean = heldout_clean(artifact)
    rng = np.random.default_rng(1234)
    parts: list[np.ndarray] = []
    spans = []
    t = 0
    for k, sil in enumerate(silences):
        n = int(round(sil * SAMPLE_RATE))
        parts.append(np.zeros(n, np.int16))
        t += n
        if k < len(picks):
            samples, entry = clean[picks[k]]
            parts.append(samples)
            spans.append({"text": entry["text"], "start": t / SAMPLE_RATE, "end": (t + len(samples)) / SAMPLE_RATE})
            t += len(samples)
    joined = np.concatenate(parts)
    noisy = add_noise(joined, 30.0, int(rng.integers(1 << 31)))
    path = dest / "three_utterances.wav"
    _write_wav(path, noisy)
    words = [w for s in spans for w in s["text"].split()]
    (dest / "three_utterances.json").write_text(json.dumps({"words": words, "utterances": spans}, indent=1), "utf-8")
    return path, words


# --- the held-out conditions --------------------------------------------------------------------

def multi_utterance_recordings(n: int = 20, seed: int = 4321, pauses: tuple[float, float] = (1.0, 3.0),
                               artifact: Path = ARTIFACT) -> list[tuple[np.ndarray, str, dict]]:
    """`n` recordings of 2-4 held-out clips (each clean, with its own leading/trailing silence and voice) joined
    by digital silence of ``pauses`` seconds (uniform), 0.5 s of silence either end: the odd ones digitally clean,
    the even ones with white noise 20-35 dB below the speech over the whole recording. [(int16 samples, words in
    order, recipe)]. With the default 1-3 s the VAD hears separate utterances; below ~1 s FunASR's VAD (its
    end-silence schedule starts at 2 s) keeps several utterances in one segment."""
    clean = heldout_clean(artifact)
    rng = np.random.default_rng(seed)
    out = []
    for k in range(n):
        picks = [int(i) for i in rng.choice(len(clean), size=int(rng.integers(2, 5)), replace=False)]
        gaps = [round(float(rng.uniform(*pauses)), 2) for _ in picks[1:]]
        parts = [np.zeros(SAMPLE_RATE // 2, np.int16)]
        for j, i in enumerate(picks):
            if j:
                parts.append(np.zeros(int(gaps[j - 1] * SAMPLE_RATE), np.int16))
            parts.append(clean[i][0])
        parts.append(np.zeros(SAMPLE_RATE // 2, np.int16))
        x = np.concatenate(parts)
        snr = None if k % 2 else round(float(rng.uniform(20.0, 35.0)), 2)
        noise_seed = int(rng.integers(1 << 31))
        if snr is not None:
            x = add_noise(x, snr, noise_seed)
        text = " ".join(clean[i][1]["text"] for i in picks)
        out.append((x, text, {"clips": [clean[i][1]["file"] for i in picks], "pauses": gaps, "snr_db": snr}))
    return out


def condition_wers(session, batch_size: int = 16, merged: bool = False) -> dict[str, dict]:  # noqa: ANN001
    """The held-out WER per condition with a Session (its VAD, if any, in front for the multi-utterance ones):
    ``clean`` (the FLACs as they are: digital silence around the speech), ``noisy`` (with their recorded light
    noise), ``multi`` (:func:`multi_utterance_recordings`, 1-3 s pauses, through the VAD); with ``merged`` also
    ``merged`` (the same with 0.3-1.0 s pauses, which the VAD keeps together: segments of several utterances).
    {condition: {"wer", "words", "errors"}}."""
    clips = heldout_clean()
    refs = [e["text"] for _, e in clips]
    conditions = {
        "clean": ([c for c, _ in clips], refs, False),
        "noisy": ([add_noise(c, e["snr_db"], e["noise_seed"]) for c, e in clips], refs, False),
    }
    multi = multi_utterance_recordings()
    conditions["multi"] = ([x for x, _, _ in multi], [t for _, t, _ in multi], None)
    if merged:
        close = multi_utterance_recordings(pauses=(0.3, 1.0))
        conditions["merged"] = ([x for x, _, _ in close], [t for _, t, _ in close], None)
    out = {}
    for name, (audio, texts, vad) in conditions.items():
        arrays = [a.astype(np.float32) / 32768.0 for a in audio]
        res = session.transcribe_batch(arrays, sample_rate=SAMPLE_RATE, batch_size=batch_size, vad=vad)
        hyps = [r.text for r in res]
        out[name] = {"wer": wer(texts, hyps), "words": sum(len(normalize_text(t)) for t in texts),
                     "segments": sum(len(r.segments) for r in res),
                     "errors": [(r, h) for r, h in zip(texts, hyps, strict=True)
                                if normalize_text(r) != normalize_text(h)]}
    return out
