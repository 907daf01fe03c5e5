"""Synthetic multi-speaker conversations (espeak-ng) and the diarization error rate, for speaker tests.

- Voices: an espeak-ng *speaker* is a base voice (accent), a voice variant (``+name``: formants, pitch
  range, breathiness...), a pitch (``-p``) and a speed (``-s``). tools/train_tiny_speaker.py trains the
  tiny CAM++ in tests/data/tiny_speaker on TRAIN_VARIANTS x TRAIN_BASES only; conversations here use
  HELDOUT_VARIANTS x HELDOUT_BASES only. Variants are held out by *family* (voice files with the same
  formant tables), and the speakers of one conversation come from distinct families.
- :func:`make_conversation` -- 2-4 held-out speakers, 30-60 s, turns of 1-6 words from the demo model's
  20 WORDS, one-word back-channels, pauses 0.2-1.5 s, no overlap, light white noise; returns the samples
  (float32, 16 kHz, exactly int16 / 32768) and the reference turns ``(start_s, end_s, speaker, text)``
  (start/end: the turn's speech, trimmed of espeak-ng's silences). Cached as .npz under
  ``$FUN_ASR_TEST_CACHE`` or ``~/.cache/fun-asr/test-data/`` (atomic rename; espeak-ng only on a miss).
- :func:`make_short_conversation` -- 1-4 held-out speakers taking exactly ``n_turns`` turns of
  ``min_words``..``max_words`` words with pauses of ``min_gap_s``..``max_gap_s`` (by default 0.8-2.0 s: every
  turn is its own VAD segment at the 800 ms end silence diarization uses); short recordings, where FunASR's
  clustering (under 20 speaker windows) finds one speaker. Cached like :func:`make_conversation`.
- :func:`turns_right` -- how many reference turns a hypothesis labels right (best one-to-one speaker mapping).
- :func:`der` -- diarization error rate with pyannote.metrics (optimal speaker mapping); ``collar`` is
  the NIST md-eval collar: +-collar seconds around every reference boundary are not scored (pyannote's
  own ``collar`` argument is the *total* width, so it gets ``2 * collar``).
- :func:`count_ok` -- whether the hypothesis has as many speakers as the reference.
- :func:`eval_set` -- the standard held-out conversation list: (seed, n_speakers) for 2, 3, 4 speakers.

Needs numpy, soundfile and soxr (and espeak-ng on a cache miss); ``der`` needs pyannote.metrics.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import shutil
import subprocess
import tempfile
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from fun_asr.model.demo import WORDS
from trained_model import add_noise  # train_tiny's noise: white, snr_db below the speech RMS

SAMPLE_RATE = 16000
FIXTURE_VERSION = 2  # bump when the recipe changes (the cache key includes it)
SHORT_FIXTURE_VERSION = 1  # the same for make_short_conversation's recipe

# Accents. The training set uses the first group only, the conversations the second only.
TRAIN_BASES = ("en", "en-us", "en-gb-scotland", "en-029", "en-gb-x-rp")
HELDOUT_BASES = ("en-us-nyc", "en-gb-x-gbclan", "en-gb-x-gbcwmd")

# espeak-ng 1.51 voice variants (file names under espeak-ng-data/voices/!v), grouped into families of
# near-identical voice files (same formant tables, e.g. Andy/AnxiousAndy/Lee; Denis/victor/Storm;
# john/norbert/Tweaky differ in one formant line). Held out: whole families, 3 female and 10 male; a
# conversation takes its speakers from distinct families. Every other variant trains (TRAIN_VARIANTS).
# Not used: "Mr serious" (a space in its file name).
HELDOUT_FAMILIES = (
    ("Alicia",), ("Annie",), ("steph", "steph2", "steph3"),
    ("Andy", "AnxiousAndy", "Lee"), ("Denis", "victor", "Storm"), ("robert", "rob", "quincy"), ("Gene", "Gene2"),
    ("Jacky",), ("travis",), ("kaukovalta",), ("antonio",), ("john", "norbert", "Tweaky", "croak"), ("pablo",),
)
HELDOUT_VARIANTS = tuple(v for fam in HELDOUT_FAMILIES for v in fam)
TRAIN_VARIANTS = (
    "Alex", "Andrea", "aunty", "belinda", "linda", "f4", "boris", "Demonic", "Diogo", "Henrique", "Hugo",
    "michel", "miguel", "anika", "anikaRobot", "ed", "klatt", "klatt2", "klatt3", "klatt4", "klatt5", "klatt6",
    "adam", "benjamin", "caleb", "david", "edward", "edward2", "announcer", "UniRobot", "iven", "iven2", "iven3",
    "iven4", "marcelo", "Mario", "Michael", "gustave", "max", "RicishayMax", "RicishayMax2", "RicishayMax3",
    "robosoft", "robosoft2", "robosoft3", "robosoft4", "robosoft5", "robosoft6", "robosoft7", "robosoft8",
    "m7", "m8", "Nguyen", "Mike", "m3", "m1", "m2", "m4", "m5", "m6", "f1", "f2", "f3", "f5", "whisperf",
    "whisper", "grandpa", "grandma", "paul", "pedro", "sandro", "shelby", "zac", "fast", "Marco",
)
# Words a listener says while the other one talks.
BACKCHANNELS = ("yes", "no", "right", "go", "on", "off", "stop", "up")
CONVERSATION_SNR_DB = (20.0, 35.0)


def cache_root() -> Path:
    env = os.environ.get("FUN_ASR_TEST_CACHE")
    return Path(env) if env else Path.home() / ".cache" / "fun-asr" / "test-data"


def espeak_available() -> bool:
    return shutil.which("espeak-ng") is not None


def installed_variants() -> set[str]:
    """Variant file names that this espeak-ng knows (``espeak-ng --voices=variant``, column File)."""
    out = subprocess.run(["espeak-ng", "--voices=variant"], check=True, capture_output=True, text=True).stdout
    names = set()
    for line in out.splitlines()[1:]:
        for field in line.split():
            if field.startswith("!v/"):
                names.add(field[3:])
    return names


@dataclass(frozen=True)
class Speaker:
    """One synthetic speaker: espeak-ng ``-v base+variant -p pitch -s speed`` (jittered per turn)."""

    base: str
    variant: str
    pitch: int
    speed: int
    level_db: float = -6.0  # peak level of its turns (dBFS), jittered per turn

    @property
    def name(self) -> str:
        return f"{self.variant}@{self.base}/p{self.pitch}/s{self.speed}"


def trim_silence(x: np.ndarray, rel: float = 0.01, pad_s: float = 0.01) -> np.ndarray:
    """espeak-ng's leading/trailing silence off: the span of samples above ``rel`` x peak, +pad."""
    peak = float(np.abs(x).max()) if x.size else 0.0
    if peak <= 0:
        return x[:0]
    idx = np.nonzero(np.abs(x) > rel * peak)[0]
    pad = int(pad_s * SAMPLE_RATE)
    return x[max(0, idx[0] - pad): min(x.shape[0], idx[-1] + 1 + pad)]


def synth(base: str, variant: str, text: str, pitch: int, speed: int, gap: int = 0) -> np.ndarray:
    """espeak-ng -> float64 at 16 kHz (soxr), trimmed of silence, peak 1."""
    import soundfile as sf
    import soxr

    cmd = ["espeak-ng", "-v", f"{base}+{variant}", "-p", str(int(pitch)), "-s", str(int(speed)),
           "-g", str(int(gap)), "--stdout", text]
    wav = subprocess.run(cmd, check=True, capture_output=True).stdout
    x, rate = sf.read(io.BytesIO(wav), dtype="float64")
    x = trim_silence(soxr.resample(x, rate, SAMPLE_RATE))
    if x.size == 0:
        raise RuntimeError(f"espeak-ng produced silence for {cmd}")
    return x / np.abs(x).max()


def heldout_speakers(rng: np.random.Generator, n: int) -> list[Speaker]:
    """``n`` held-out speakers from distinct HELDOUT_FAMILIES (a random variant of each; random held-out
    base, pitch 25-75, speed 135-185, peak level -12..-3 dBFS)."""
    if not 1 <= n <= len(HELDOUT_FAMILIES):
        raise ValueError(f"n_speakers must be 1..{len(HELDOUT_FAMILIES)}, got {n}")
    fams = rng.choice(len(HELDOUT_FAMILIES), size=n, replace=False)
    out = []
    for f in fams:
        fam = HELDOUT_FAMILIES[int(f)]
        out.append(Speaker(base=HELDOUT_BASES[int(rng.integers(len(HELDOUT_BASES)))],
                           variant=fam[int(rng.integers(len(fam)))], pitch=int(rng.integers(25, 76)),
                           speed=int(rng.integers(135, 186)), level_db=round(float(rng.uniform(-12.0, -3.0)), 2)))
    return out


def turn_words(rng: np.random.Generator) -> list[str]:
    """A turn's words: 20 % one back-channel word, 25 % 1-2 words, 55 % 3-6 words (from WORDS)."""
    u = rng.random()
    if u < 0.2:  # back-channel
        return [BACKCHANNELS[int(rng.integers(len(BACKCHANNELS)))]]
    n = int(rng.integers(1, 3)) if u < 0.45 else int(rng.integers(3, 7))
    return [WORDS[int(k)] for k in rng.integers(0, len(WORDS), size=n)]


def _build(seed: int, n_speakers: int, min_s: float, max_s: float, min_speech_s: float
           ) -> tuple[np.ndarray, list[tuple[float, float, str, str]]]:
    rng = np.random.default_rng([FIXTURE_VERSION, seed, n_speakers])
    speakers = heldout_speakers(rng, n_speakers)
    target = float(rng.uniform(min_s, max_s))
    pieces: list[np.ndarray] = []
    turns: list[tuple[float, float, str, str]] = []
    pos = int(rng.uniform(0.3, 1.0) * SAMPLE_RATE)
    pieces.append(np.zeros(pos))
    talked = np.zeros(n_speakers)
    order = list(rng.permutation(n_speakers))  # everybody speaks early on
    prev = -1
    while True:
        if order:
            who = int(order.pop(0))
        else:  # anyone but the last speaker, favouring who spoke least
            w = np.array([0.0 if k == prev else 1.0 / (1.0 + talked[k]) for k in range(n_speakers)])
            if rng.random() < 0.08:  # the same speaker again after a pause
                w[prev] = w.max() if prev >= 0 else 0.0
            who = int(rng.choice(n_speakers, p=w / w.sum()))
        spk = speakers[who]
        words = turn_words(rng)
        pitch = int(np.clip(spk.pitch + rng.integers(-3, 4), 0, 99))
        speed = int(np.clip(spk.speed + rng.integers(-10, 11), 80, 450))
        level = spk.level_db + float(rng.uniform(-1.5, 1.5))
        x = synth(spk.base, spk.variant, " ".join(words), pitch, speed, int(rng.integers(0, 4))) * 10.0 ** (level / 20)
        start = pos
        pieces.append(x)
        pos += x.shape[0]
        turns.append((start / SAMPLE_RATE, pos / SAMPLE_RATE, spk.name, " ".join(words)))
        talked[who] += x.shape[0] / SAMPLE_RATE
        prev = who
        gap = int(rng.uniform(0.2, 1.5) * SAMPLE_RATE)
        if pos / SAMPLE_RATE >= target and talked.sum() >= min_speech_s and talked.min() > 0:
            gap = int(rng.uniform(0.3, 1.0) * SAMPLE_RATE)
            pieces.append(np.zeros(gap))
            break
        pieces.append(np.zeros(gap))
        pos += gap
    clean = np.clip(np.round(np.concatenate(pieces) * 32767.0), -32768, 32767).astype(np.int16)
    snr = float(rng.uniform(*CONVERSATION_SNR_DB))
    noisy = add_noise(clean, snr, int(rng.integers(1 << 31)))
    return noisy, turns


def make_conversation(seed: int, n_speakers: int, min_s: float = 30.0, max_s: float = 60.0,
                      min_speech_s: float = 20.0, cache: bool = True,
                      ) -> tuple[np.ndarray, list[tuple[float, float, str, str]]]:
    """A conversation of ``n_speakers`` held-out espeak-ng speakers, ``min_s``..``max_s`` seconds long
    (at least ``min_speech_s`` of speech: FunASR's ClusterBackend calls < 20 windows one speaker).

    Returns (samples float32 16 kHz mono in [-1, 1), turns [(start_s, end_s, speaker_name, text)]).
    Deterministic in (seed, n_speakers, lengths) for a given espeak-ng; cached unless ``cache=False``.
    """
    if not 1 <= int(n_speakers) <= len(HELDOUT_FAMILIES):
        raise ValueError(f"n_speakers must be 1..{len(HELDOUT_FAMILIES)}, got {n_speakers!r}")
    if not 0 < min_s <= max_s:
        raise ValueError(f"need 0 < min_s <= max_s, got {min_s}, {max_s}")
    key = json.dumps([FIXTURE_VERSION, int(seed), int(n_speakers), float(min_s), float(max_s), float(min_speech_s)])
    digest = hashlib.sha256(key.encode()).hexdigest()[:16]
    path = cache_root() / "tiny-speaker-conversations" / f"conv-{seed}-{n_speakers}-{digest}.npz"
    return _cached(path, cache, lambda: _build(int(seed), int(n_speakers), float(min_s), float(max_s),
                                               float(min_speech_s)))


def _build_turns(seed: int, n_speakers: int, n_turns: int, words: tuple[int, int], gaps: tuple[float, float]
                 ) -> tuple[np.ndarray, list[tuple[float, float, str, str]]]:
    rng = np.random.default_rng([SHORT_FIXTURE_VERSION, 17, seed, n_speakers, n_turns])
    speakers = heldout_speakers(rng, n_speakers)
    pos = int(rng.uniform(0.3, 1.0) * SAMPLE_RATE)
    pieces: list[np.ndarray] = [np.zeros(pos)]
    turns: list[tuple[float, float, str, str]] = []
    talked = np.zeros(n_speakers)
    order = list(rng.permutation(n_speakers))  # everybody speaks first once
    prev = -1
    for _ in range(n_turns):
        if order:
            who = int(order.pop(0))
        elif n_speakers == 1:
            who = 0
        else:  # anyone but the last speaker, favouring who spoke least
            w = np.array([0.0 if k == prev else 1.0 / (1.0 + talked[k]) for k in range(n_speakers)])
            who = int(rng.choice(n_speakers, p=w / w.sum()))
        spk = speakers[who]
        text = " ".join(WORDS[int(k)] for k in rng.integers(0, len(WORDS), size=int(rng.integers(words[0],
                                                                                                  words[1] + 1))))
        pitch = int(np.clip(spk.pitch + rng.integers(-3, 4), 0, 99))
        speed = int(np.clip(spk.speed + rng.integers(-10, 11), 80, 450))
        level = spk.level_db + float(rng.uniform(-1.5, 1.5))
        x = synth(spk.base, spk.variant, text, pitch, speed, int(rng.integers(0, 4))) * 10.0 ** (level / 20)
        pieces.append(x)
        turns.append((pos / SAMPLE_RATE, (pos + x.shape[0]) / SAMPLE_RATE, spk.name, text))
        pos += x.shape[0]
        talked[who] += x.shape[0] / SAMPLE_RATE
        prev = who
        gap = int(rng.uniform(*gaps) * SAMPLE_RATE)
        pieces.append(np.zeros(gap))
        pos += gap
    clean = np.clip(np.round(np.concatenate(pieces) * 32767.0), -32768, 32767).astype(np.int16)
    noisy = add_noise(clean, float(rng.uniform(*CONVERSATION_SNR_DB)), int(rng.integers(1 << 31)))
    return noisy, turns


def make_short_conversation(seed: int, n_speakers: int, n_turns: int, min_words: int = 2, max_words: int = 6,
                            min_gap_s: float = 0.8, max_gap_s: float = 2.0, cache: bool = True,
                            ) -> tuple[np.ndarray, list[tuple[float, float, str, str]]]:
    """Exactly ``n_turns`` turns of ``n_speakers`` held-out espeak-ng speakers (each speaks first once, then
    anyone but the last speaker, favouring who spoke least): ``min_words``..``max_words`` of the demo model's
    WORDS a turn, ``min_gap_s``..``max_gap_s`` of pause after each, light noise. Needs ``n_turns >= n_speakers``.

    Returns (samples float32 16 kHz mono in [-1, 1), turns [(start_s, end_s, speaker_name, text)]), as
    :func:`make_conversation`; deterministic in its arguments for a given espeak-ng; cached unless ``cache=False``.
    """
    if not 1 <= int(n_speakers) <= len(HELDOUT_FAMILIES):
        raise ValueError(f"n_speakers must be 1..{len(HELDOUT_FAMILIES)}, got {n_speakers!r}")
    if int(n_turns) < int(n_speakers):
        raise ValueError(f"n_turns ({n_turns}) must be at least n_speakers ({n_speakers}): everybody speaks")
    if not 1 <= min_words <= max_words:
        raise ValueError(f"need 1 <= min_words <= max_words, got {min_words}, {max_words}")
    if not 0 <= min_gap_s <= max_gap_s:
        raise ValueError(f"need 0 <= min_gap_s <= max_gap_s, got {min_gap_s}, {max_gap_s}")
    args = [int(seed), int(n_speakers), int(n_turns), int(min_words), int(max_words), float(min_gap_s),
            float(max_gap_s)]
    digest = hashlib.sha256(json.dumps([SHORT_FIXTURE_VERSION, *args]).encode()).hexdigest()[:16]
    path = cache_root() / "tiny-speaker-conversations" / f"short-{seed}-{n_speakers}-{n_turns}-{digest}.npz"
    return _cached(path, cache, lambda: _build_turns(int(seed), int(n_speakers), int(n_turns),
                                                     (int(min_words), int(max_words)),
                                                     (float(min_gap_s), float(max_gap_s))))


def _cached(path: Path, cache: bool, build: Callable[[], tuple[np.ndarray, list[tuple[float, float, str, str]]]]
            ) -> tuple[np.ndarray, list[tuple[float, float, str, str]]]:
    """``build()`` (int16 samples, turns) read from / written to ``path`` (atomic rename), as float32."""
    if cache and path.is_file():
        with np.load(path) as z:
            samples = z["samples"]
            turns = [tuple(t) for t in json.loads(str(z["turns"]))]
        return samples.astype(np.float32) / 32768.0, [(float(a), float(b), str(s), str(t)) for a, b, s, t in turns]
    if not espeak_available():
        raise RuntimeError("espeak-ng is not installed (apt-get install espeak-ng) and the conversation is not cached "
                           f"({path})")
    pcm, turns = build()
    if cache:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=".conv-", suffix=".npz", dir=path.parent)
        os.close(fd)
        try:
            with open(tmp, "wb") as f:
                np.savez(f, samples=pcm, turns=np.array(json.dumps(turns)))
            os.replace(tmp, path)
        finally:
            if os.path.exists(tmp):
                os.unlink(tmp)
    return pcm.astype(np.float32) / 32768.0, turns


def eval_set(n: int = 24, first_seed: int = 1000) -> list[tuple[int, int]]:
    """The standard held-out conversations: (seed, n_speakers), speakers cycling 2, 3, 4."""
    return [(first_seed + i, 2 + i % 3) for i in range(n)]


# --- scoring ------------------------------------------------------------------------------------

Turn = Sequence  # (start_s, end_s, speaker[, text])


def _annotation(turns: Sequence[Turn]):  # noqa: ANN202
    from pyannote.core import Annotation, Segment

    ann = Annotation()
    for i, t in enumerate(turns):
        start, end, who = float(t[0]), float(t[1]), str(t[2])
        if end > start:
            ann[Segment(start, end), i] = who
    return ann


def der(reference: Sequence[Turn], hypothesis: Sequence[Turn], collar: float = 0.25,
        uem: tuple[float, float] | None = None, detail: bool = False) -> float | dict:
    """Diarization error rate (missed + false alarm + confusion) / scored reference speech, after the
    optimal one-to-one speaker mapping (pyannote.metrics DiarizationErrorRate).

    ``collar``: seconds not scored on EACH side of every reference boundary (NIST md-eval ``-c``);
    pyannote's ``collar`` is the total width, hence ``collar=2 * collar`` there. ``uem``: the scored
    span (default: from 0 to the end of the last reference or hypothesis turn). ``detail``: the
    components (seconds) instead of the rate.
    """
    from pyannote.core import Segment, Timeline
    from pyannote.metrics.diarization import DiarizationErrorRate

    if collar < 0:
        raise ValueError(f"collar must be >= 0 seconds, got {collar}")
    ref, hyp = _annotation(reference), _annotation(hypothesis)
    if uem is None:
        end = max([float(t[1]) for t in (*reference, *hypothesis)] or [0.0])
        uem = (0.0, end)
    metric = DiarizationErrorRate(collar=2.0 * collar, skip_overlap=False)
    comp = metric(ref, hyp, uem=Timeline([Segment(*uem)]), detailed=True)
    if detail:
        return dict(comp)
    return float(comp["diarization error rate"])


def speaker_count(turns: Sequence[Turn]) -> int:
    return len({str(t[2]) for t in turns if float(t[1]) > float(t[0])})


def count_ok(reference: Sequence[Turn], hypothesis: Sequence[Turn]) -> bool:
    """The hypothesis names as many speakers as the reference."""
    return speaker_count(reference) == speaker_count(hypothesis)


def turns_right(reference: Sequence[Turn], hypothesis: Sequence[Turn]) -> int:
    """How many reference turns get the right speaker: each turn takes the hypothesis speaker it overlaps most
    (none: wrong), then reference and hypothesis speakers are paired one to one so that the most turns agree
    (``scipy.optimize.linear_sum_assignment``). Equal to ``len(reference)`` when every turn is right."""
    from scipy.optimize import linear_sum_assignment

    got: list[str | None] = []
    for t in reference:
        a, b = float(t[0]), float(t[1])
        overlap: dict[str, float] = {}
        for h in hypothesis:
            o = min(b, float(h[1])) - max(a, float(h[0]))
            if o > 0:
                overlap[str(h[2])] = overlap.get(str(h[2]), 0.0) + o
        got.append(max(overlap, key=lambda k: overlap[k]) if overlap else None)
    refs = sorted({str(t[2]) for t in reference})
    hyps = sorted({g for g in got if g is not None})
    if not hyps:
        return 0
    agree = np.zeros((len(refs), len(hyps)))
    for t, g in zip(reference, got, strict=True):
        if g is not None:
            agree[refs.index(str(t[2])), hyps.index(g)] += 1
    rows, cols = linear_sum_assignment(agree, maximize=True)
    return int(agree[rows, cols].sum())


if __name__ == "__main__":
    for s, n in eval_set(3):
        x, tr = make_conversation(s, n)
        print(f"seed {s}: {n} speakers, {x.shape[0] / SAMPLE_RATE:.1f} s, {len(tr)} turns, "
              f"speech {sum(b - a for a, b, _, _ in tr):.1f} s")
