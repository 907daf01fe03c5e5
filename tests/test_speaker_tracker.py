"""The streaming speaker tracker against FunASR 1.4.16's ``HybridSpeakerTracker`` (``funasr/bin/realtime_ws.py``).

Both are fed the same sentences (as its ``RealtimeASRSession`` feeds them: the sentence's audio, start and end in
seconds, then ``finalize`` of all locked sentences at the stop) and the same deterministic embedding function (ours
takes it as ``embed(windows) -> [N, D]``, FunASR's as a speaker model with ``generate(input=[...])``). FunASR's
``k_means`` draws from numpy's global generator: it is seeded before each of its clusterings with the seed ours
passes as ``random_state``. Expected: the same streaming speaker ids, the same tracker state, the same
``finalize`` output.
"""

from __future__ import annotations

import contextlib
import io
import zlib
from functools import lru_cache
from typing import Any

import numpy as np
import pytest

import funasr_ref
from fun_asr.speakers.timeline import sv_chunk
from fun_asr.speakers.tracker import SpeakerTracker

needs_funasr = pytest.mark.skipif(not funasr_ref.funasr_available(), reason="funasr 1.4.16 + torch not installed")
FS = 16000


@lru_cache(maxsize=1)
def _ref_tracker_class() -> Any:
    with contextlib.redirect_stdout(io.StringIO()):
        from funasr.bin.realtime_ws import HybridSpeakerTracker
    return HybridSpeakerTracker


@pytest.fixture(scope="module", autouse=True)
def _one_blas_thread():  # noqa: ANN202
    """With torch loaded (FunASR needs it) its OpenMP threads and OpenBLAS's fight over the cores: scipy's eigh
    of a 128 x 128 matrix then takes ~60x longer on 2 cores. One BLAS thread for these tests (both sides)."""
    from threadpoolctl import threadpool_limits

    with threadpool_limits(limits=1, user_api="blas"):
        yield


@pytest.fixture(autouse=True)
def _keep_global_rng():  # noqa: ANN202
    state = np.random.get_state()
    yield
    np.random.set_state(state)


class Voices:
    """A deterministic "speaker model": a window's speaker is the most common code in its (non-padding) samples
    (sentence audio holds speaker index + 1, plus a small ripple so that every window differs); its embedding is
    that speaker's centre plus noise seeded by the window's bytes, times a length from the same seed. With
    ``drift``, a voice moves over the stream: the fraction above the code (0 .. 0.4, see :func:`stream`) moves the
    centre along a direction of its own (by ``drift`` x fraction), so a tracked centre has to follow it."""

    def __init__(self, n_speakers: int, dim: int, sep: str, seed: int, drift: float = 0.0) -> None:
        rng = np.random.default_rng(seed)
        c = rng.standard_normal((n_speakers, dim))
        c /= np.linalg.norm(c, axis=1, keepdims=True)
        self.directions = rng.standard_normal((n_speakers, dim)) / np.sqrt(dim)
        self.drift = drift
        if sep in ("near", "mid"):  # a shared direction: speakers at cosine ~0.66 ("near") or ~0.55 ("mid")
            base = rng.standard_normal(dim)
            c = 0.7 * base / np.linalg.norm(base) + (0.5 if sep == "near" else 0.63) * c
            c /= np.linalg.norm(c, axis=1, keepdims=True)
        self.centres = c
        self.sigma = 0.9 if sep == "near" else 0.5
        self.calls = 0

    def __call__(self, windows: list[np.ndarray]) -> np.ndarray:
        self.calls += 1
        out = []
        for w in windows:
            codes = np.rint(w[w != 0]).astype(np.int64)
            spk = int(np.bincount(codes).argmax()) - 1
            phase = float(np.mean(w[w != 0][codes == spk + 1] - (spk + 1)))
            rng = np.random.default_rng(zlib.crc32(np.ascontiguousarray(w).tobytes()))
            d = self.centres.shape[1]
            centre = self.centres[spk] + self.drift * phase * self.directions[spk]
            v = centre / np.linalg.norm(centre) + self.sigma * rng.standard_normal(d) / np.sqrt(d)
            out.append(v / np.linalg.norm(v) * rng.uniform(5, 15))
        return np.asarray(out, dtype=np.float32)


class FunASRModel:
    """The same embeddings as FunASR's speaker model: ``generate(input=[...]) -> [{'spk_embedding': [1, D]}]``."""

    def __init__(self, voices: Voices) -> None:
        self.voices = voices

    def generate(self, input: list[np.ndarray], cache: dict | None = None, is_final: bool = True) -> list[dict]:  # noqa: A002
        import torch

        emb = self.voices(list(input))
        return [{"spk_embedding": torch.from_numpy(row[None, :].copy())} for row in emb]


class Seeded:
    """FunASR's ``ClusterBackend`` with numpy's global generator seeded before each call (its ``k_means``)."""

    def __init__(self, inner: Any, seed: int) -> None:
        self.inner, self.seed = inner, seed

    def __call__(self, x: Any, **kw: Any) -> Any:
        np.random.seed(self.seed)
        return self.inner(x, **kw)


def stream(turns: list[tuple[int, ...]], seed: int) -> list[tuple[dict, np.ndarray]]:
    """Sentences ``({'text', 'start', 'end'} in ms, audio)``: ``turns`` lists each sentence's speakers (two: the
    first speaks the first part, the second the rest). Durations 0..9 s (some shorter than a window, some
    empty), pauses 0..1.5 s. The audio is the speaker's code + 0.4 x (how far into the stream) + a ripple."""
    rng = np.random.default_rng(seed)
    out = []
    t_ms = int(rng.integers(0, 2000))
    for i, spks in enumerate(turns):
        kind = rng.random()
        dur_ms = int(rng.integers(6500, 9000)) if len(spks) > 1 else (
            0 if kind < 0.03 else int(rng.integers(200, 1400)) if kind < 0.25 else int(rng.integers(1500, 7000)))
        n = dur_ms * FS // 1000
        audio = np.empty(n, np.float32)
        cut = n if len(spks) == 1 else int(n * rng.uniform(0.4, 0.6))
        audio[:cut] = spks[0] + 1
        audio[cut:] = spks[-1] + 1
        audio += np.float32(0.4 * i / len(turns))
        audio += (0.01 * np.sin(0.001 * (np.arange(n) + t_ms * FS // 1000))).astype(np.float32)
        words = " ".join(f"w{i}_{j}" for j in range(max(1, dur_ms // 400)))
        out.append(({"text": f"s{i} {words}", "start": t_ms, "end": t_ms + dur_ms}, audio))
        t_ms += dur_ms + int(rng.integers(0, 1500))
    return out


def run_both(sentences: list[tuple[dict, np.ndarray]], voices: Voices, **options: Any
             ) -> tuple[list[dict], list[dict], SpeakerTracker, Any]:
    ref_cls = _ref_tracker_class()
    funasr_kw = {k: options[k] for k in ("threshold", "max_history_chunks", "max_speakers") if k in options}
    ref = ref_cls(FunASRModel(voices), "cpu", **funasr_kw)
    ref.cluster_backend = Seeded(ref.cluster_backend, 0)
    ours_kw = {"max_history_windows" if k == "max_history_chunks" else k: v for k, v in options.items()}
    ours = SpeakerTracker(voices, seed=0, **ours_kw)
    ref_locked: list[dict] = []
    our_locked: list[dict] = []
    for i, (sentence, audio) in enumerate(sentences):
        a, b = dict(sentence), dict(sentence)
        ref.assign_streaming(audio.copy(), sentence["start"] / 1000, sentence["end"] / 1000, a)
        spk = ours.assign(audio.copy(), sentence["start"] / 1000, sentence["end"] / 1000, b)
        assert spk == b["spk"] and type(spk) is int
        assert b == a, f"sentence {i}: ours {b['spk']}, FunASR {a['spk']}"
        ref_locked.append(a)
        our_locked.append(b)
    assert ours.stats() == ref.session_stats()
    ref_final = ref.finalize(ref_locked)
    our_final = ours.finalize(our_locked)
    assert our_final == ref_final
    return our_locked, our_final, ours, ref


def _turns(rng: np.random.Generator, n_sentences: int, n_speakers: int, mixed: float) -> list[tuple[int, ...]]:
    out: list[tuple[int, ...]] = []
    spk = 0
    while len(out) < n_sentences:
        if rng.random() < 0.5:
            spk = int(rng.integers(n_speakers))
        if rng.random() < mixed:
            other = (spk + 1 + int(rng.integers(n_speakers - 1))) % n_speakers
            out.append((spk, other))
            spk = other
        else:
            out.append((spk,))
    return out


@needs_funasr
@pytest.mark.parametrize(("n_speakers", "dim", "sep", "seed", "drift"), [
    (2, 192, "well", 0, 0.0), (3, 192, "well", 5, 0.0), (4, 32, "well", 2, 0.0), (3, 192, "near", 3, 0.0),
    (4, 32, "near", 4, 3.0), (3, 192, "mid", 8, 4.0)])
def test_stream_equals_funasr(n_speakers: int, dim: int, sep: str, seed: int, drift: float) -> None:
    # (seed 5: the ids depend on how fast a known centre moves -- 1 / min(updates + 1, 20) -- e.g. 47 of the 70
    # differ with 1 / min(updates + 1, 3))
    turns = _turns(np.random.default_rng(100 + seed), 70, n_speakers, mixed=0.12)
    sentences = stream(turns, seed=seed)
    voices = Voices(n_speakers, dim, sep, seed=seed, drift=drift)
    locked, final, ours, _ = run_both(sentences, voices)
    assert sum(len(sv_chunk([(0.0, 0.0, a)])) for _, a in sentences) > 200  # more than the 128-window history
    stats = ours.stats()
    assert stats["speaker_history_chunks"] == 128 == stats["speaker_history_limit"]
    assert 1 <= stats["speaker_centers"] <= 15
    history_start = int(min(s for s, _ in ours.windows) * 1000)
    assert len(final) > len(locked)  # sentences were split (a speaker change inside, or the history start)
    # before the history: as streamed, or the head of the one across its start
    assert all(s["start"] >= history_start or s in locked or s["end"] == history_start for s in final)
    if sep == "well":  # the synthetic speakers are told apart while streaming (one-speaker sentences >= 2 s)
        from sklearn.metrics import adjusted_rand_score

        keep = [i for i, (t, (_, a)) in enumerate(zip(turns, sentences, strict=True))
                if len(t) == 1 and len(a) >= 2 * FS]
        assert adjusted_rand_score([turns[i][0] for i in keep], [locked[i]["spk"] for i in keep]) > 0.8


@needs_funasr
def test_returning_speaker_matched_by_threshold() -> None:
    """A speaks, leaves the (60-window) history while B and C talk, and comes back with a voice that moved (cosine
    ~0.55 to A's stored centre): a new id at threshold 0.6, A's id at 0.5 -- in both trackers."""
    turns = [(0,)] * 10 + [(1 + i % 2,) for i in range(40)] + [(0,)] * 10
    sentences = stream(turns, seed=11)
    for threshold, returning in ((0.6, 3), (0.5, 0)):
        locked, _, ours, _ = run_both(sentences, Voices(3, 192, "well", seed=11, drift=6.0), threshold=threshold,
                                      max_history_chunks=60)
        assert [s["spk"] for s in locked[:10]] == [0] * 10
        assert [s["spk"] for s in locked[-10:]] == [returning] * 10
        assert len(ours.centers) == (4 if returning else 3)


@needs_funasr
def test_more_speakers_than_the_id_cap() -> None:
    """20 speakers one after another (3 sentences each): ids stop at 15, later speakers take the best free id."""
    turns = [(s,) for s in range(20) for _ in range(3)]
    sentences = stream(turns, seed=9)
    voices = Voices(20, 192, "well", seed=9)
    locked, _, ours, ref = run_both(sentences, voices)
    assert len(ours.centers) == 15 == len(ref.speaker_centers)
    # the first 15 speakers get ids 0..14 in order (sentences with a window of their own); the others reuse them
    firsts = [(t[0], s["spk"]) for t, s, (_, a) in zip(turns, locked, sentences, strict=True)
              if t[0] < 15 and len(a) >= 3 * FS // 2]
    assert all(spk == who for who, spk in firsts) and len(firsts) > 30
    assert {s["spk"] for s in locked[:45]} == set(range(15))
    assert {s["spk"] for s in locked[45:]} <= set(range(15))


@needs_funasr
def test_small_cap_and_short_history() -> None:
    """A cap of 3 ids for 5 speakers and a 40-window history (clustering bounds kept at FunASR's 1..15)."""
    rng = np.random.default_rng(7)
    sentences = stream(_turns(rng, 50, 5, mixed=0.1), seed=7)
    voices = Voices(5, 32, "well", seed=7)
    locked, _, ours, _ = run_both(sentences, voices, max_speakers=3, max_history_chunks=40, cluster_max_speakers=15)
    assert {s["spk"] for s in locked} <= {0, 1, 2}
    assert ours.stats()["speaker_history_chunks"] == 40


@needs_funasr
def test_sentence_across_the_history_start() -> None:
    """13 sentences of 3 s (3 windows each), two speakers taking turns by two, a 31-window history: the history
    starts 1.5 s into the third sentence (its third window), which finalize cuts there (its text in proportion to
    time)."""
    turns = [(i // 2 % 2,) for i in range(13)]
    sentences = []
    for i, (spk,) in enumerate(turns):
        start = 1000 + 3500 * i
        audio = np.full(3 * FS, spk + 1, np.float32) + 0.01 * np.sin(0.001 * np.arange(3 * FS) + i)
        text = f"sentence {i} " + "abcdefghij" * 3
        sentences.append(({"text": text, "start": start, "end": start + 3000}, audio.astype(np.float32)))
    locked, final, ours, _ = run_both(sentences, Voices(2, 64, "well", seed=5), max_history_chunks=31)
    history_start = int(min(s for s, _ in ours.windows) * 1000)
    assert history_start == sentences[2][0]["start"] + 1500
    head = [s for s in final if s["end"] == history_start]
    assert len(head) == 1 and head[0]["text"] == locked[2]["text"][:round(len(locked[2]["text"]) * 0.5)].strip()
    assert final[:2] == locked[:2] and final[0] is locked[0]
    # re-labelled from the whole history: the tail of sentence 2 and sentences 3..12 by who speaks (one id each)
    assert [s["text"] for s in final[4:]] == [s["text"] for s in locked[3:]]
    pairs = {(who, s["spk"]) for (who,), s in zip(turns[2:], final[3:], strict=True)}
    assert len(pairs) == 2 and len({spk for _, spk in pairs}) == 2


def test_edges_and_options() -> None:
    voices = Voices(2, 16, "well", seed=0)
    tracker = SpeakerTracker(voices)
    sentence: dict = {"text": "x", "start": 0, "end": 0}
    assert tracker.assign(np.zeros(0, np.float32), 0.0, 0.0, sentence) == 0 and sentence["spk"] == 0
    assert voices.calls == 0  # no audio: no embedding, the last speaker
    assert tracker.finalize([sentence]) == [sentence]  # nothing tracked: as they are
    assert tracker.finalize([]) == []
    audio = np.full(FS * 2, 2.0, np.float32)  # speaker 1 for 2 s: 2 windows
    s = {"text": "hello there", "start": 1000, "end": 3000}
    assert tracker.assign(audio, 1.0, 3.0, s) == 0  # the first speaker gets id 0
    assert tracker.stats() == {"speaker_history_chunks": 2, "speaker_history_embeddings": 2,
                               "speaker_history_limit": 128, "speaker_centers": 1, "speaker_center_limit": 15,
                               "last_speaker_id": 0}
    assert tracker.finalize([s]) == [s] and tracker.finalize([s])[0] is not s
    tracker.reset()
    assert tracker.stats()["speaker_history_chunks"] == 0 and tracker.centers == []
    with pytest.raises(ValueError, match="embed must return"):
        SpeakerTracker(lambda w: np.zeros((1, 4))).assign(np.ones(FS * 3, np.float32), 0.0, 3.0, {})
    for kw, msg in (({"max_history_windows": 0}, "max_history_windows must be a positive integer"),
                    ({"max_speakers": -1}, "max_speakers must be a positive integer"),
                    ({"threshold": 2.0}, "threshold must be a cosine"),
                    ({"num_speakers": 0}, "num_speakers must be a positive integer"),
                    ({"min_speakers": 4, "max_speakers": 3}, r"min_speakers \(4\) is more than max_speakers \(3\)"),
                    ({"seed": -3}, "seed must be an integer")):
        with pytest.raises(ValueError, match=msg):
            SpeakerTracker(voices, **kw)
    with pytest.raises(ValueError, match="embed must be a callable"):
        SpeakerTracker(None)  # type: ignore[arg-type]
