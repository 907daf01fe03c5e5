"""Speaker clustering and the speaker timeline against FunASR 1.4.16 (``funasr/models/campplus``).

``clustering="funasr"`` is bit-equal to FunASR (after FunASR's own ``correct_labels``), and so is the default
(``"auto"``) from 20 windows on; under 20 windows with the count unknown the default finds the count by
agglomerative clustering (tested on synthetic embeddings here, end to end in tests/test_diarization.py).

Bit-equal: spectral clustering (20 <= N < 2048 windows, with and without
``num_speakers``, with ``min``/``max`` bounds), ``merge_by_cos``, k-means for N >= 2048 with a known count,
``sv_chunk``, ``postprocess`` (+ speaker centres) and ``distribute_spk``. FunASR's ``k_means`` draws from numpy's
global generator, ours from ``random_state=seed``: the global generator is seeded with the same seed right
before each FunASR call, which makes the draws the same. The UMAP+HDBSCAN path (N >= 2048, count unknown) is
unseeded and multi-threaded in FunASR: there the partition is compared (adjusted Rand index 1.0, same count).
FunASR gets torch tensors, as its callers pass ``embeddings.cpu()``; ours gets the same float32 as numpy.
"""

from __future__ import annotations

import contextlib
import io
import random
import sys
from functools import lru_cache
from typing import Any

import numpy as np
import pytest

import funasr_ref
from fun_asr.speakers import cluster as cl
from fun_asr.speakers.cluster import check_options, cluster_speakers, merge_close_speakers
from fun_asr.speakers.timeline import distribute_speakers, speaker_centers, speaker_timeline, sv_chunk

needs_funasr = pytest.mark.skipif(not funasr_ref.funasr_available(), reason="funasr 1.4.16 + torch not installed")


@lru_cache(maxsize=1)
def _ref() -> tuple[Any, Any]:
    """FunASR's ``cluster_backend`` and ``utils`` modules (``import funasr`` prints, imports every submodule)."""
    with contextlib.redirect_stdout(io.StringIO()):
        from funasr.models.campplus import cluster_backend, utils
    return cluster_backend, utils


@pytest.fixture(scope="module", autouse=True)
def _one_blas_thread():  # noqa: ANN202
    """With torch loaded (FunASR needs it) its OpenMP threads and OpenBLAS's fight over the cores: scipy's eigh
    of a 128 x 128 matrix then takes ~60x longer on 2 cores. One BLAS thread for these tests (both sides)."""
    from threadpoolctl import threadpool_limits

    with threadpool_limits(limits=1, user_api="blas"):
        yield


@pytest.fixture(autouse=True)
def _keep_global_rng():  # noqa: ANN202
    """The tests seed numpy's global generator for FunASR's ``k_means``: give other tests theirs back."""
    state = np.random.get_state()
    yield
    np.random.set_state(state)


def make(n: int, k: int, d: int, sep: str, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """N window embeddings of K speakers taking turns (3..24 windows each): unit speaker directions in D dims,
    'well' (random, nearly orthogonal; within-speaker cosine ~0.9) or 'near' (sharing a common direction;
    between-speaker cosine ~0.8, within ~0.7), times a random length 5..15 (as real embeddings are not unit)."""
    rng = np.random.default_rng(seed)
    c = rng.standard_normal((k, d))
    c /= np.linalg.norm(c, axis=1, keepdims=True)
    if sep == "near":
        base = rng.standard_normal(d)
        c = 0.7 * base / np.linalg.norm(base) + 0.5 * c
        c /= np.linalg.norm(c, axis=1, keepdims=True)
    sigma = 0.5 if sep == "well" else 1.0
    spk: list[int] = []
    while len(spk) < n:
        spk += [int(rng.integers(k))] * int(rng.integers(3, 25))
    truth = np.array(spk[:n], dtype=np.int64)
    x = c[truth] + sigma * rng.standard_normal((n, d)) / np.sqrt(d)
    x = x / np.linalg.norm(x, axis=1, keepdims=True) * rng.uniform(5, 15, (n, 1))
    return x.astype(np.float32), truth


def funasr_backend(x: np.ndarray, k: int | None = None, seed: int = 0, merge_thr: float = 0.78) -> np.ndarray:
    """``ClusterBackend(merge_thr)(torch tensor, oracle_num=k)`` with the global generator seeded, relabelled."""
    import torch

    cb, utils = _ref()
    np.random.seed(seed)
    return utils.correct_labels(cb.ClusterBackend(merge_thr=merge_thr)(torch.from_numpy(x), oracle_num=k))


def funasr_spectral(x: np.ndarray, k: int | None = None, lo: int = 1, hi: int = 15, merge_thr: float | None = None,
                    seed: int = 0) -> np.ndarray:
    """FunASR's ``SpectralCluster(lo, hi)`` called directly (no 20-window gate), then ``merge_by_cos``."""
    import torch

    cb, utils = _ref()
    np.random.seed(seed)
    labels = cb.SpectralCluster(min_num_spks=lo, max_num_spks=hi)(torch.from_numpy(x), k)
    if merge_thr is not None:
        labels = cb.ClusterBackend().merge_by_cos(labels, torch.from_numpy(x), merge_thr)
    return utils.correct_labels(labels)


def _cases() -> list[tuple[int, int, int, str]]:
    out = []
    for n in (1, 5, 19, 20, 21, 150):
        for k in (2, 3, 4):
            for d in (192, 32):
                for sep in ("well", "near"):
                    out.append((n, k, d, sep))
    out += [(1200, 3, 192, "well"), (1200, 2, 32, "near")]  # > 1000 windows
    return out


@needs_funasr
@pytest.mark.parametrize(("n", "k", "d", "sep"), _cases())
def test_labels_equal_funasr(n: int, k: int, d: int, sep: str) -> None:
    x, truth = make(n, k, d, sep, seed=1000 * n + 10 * k + d + (sep == "near"))
    # count unknown: FunASR's ClusterBackend exactly (one speaker below 20 windows) with clustering="funasr", and
    # the default from 20 windows on
    ours = cluster_speakers(x.copy(), clustering="funasr")
    assert ours.dtype == np.int64
    np.testing.assert_array_equal(ours, funasr_backend(x))
    if n < 20:
        assert (ours == 0).all()
    elif n < 1000:  # (the 1200-window sets: the same path, a few seconds more for each)
        np.testing.assert_array_equal(cluster_speakers(x.copy()), ours)
    # count known
    if n < k:
        with pytest.warns(RuntimeWarning, match=f"num_speakers={k} asked, but there are only {n}"):
            assert (cluster_speakers(x, num_speakers=k) == 0).all()
        return
    ours_k = cluster_speakers(x.copy(), num_speakers=k, seed=3)
    if n >= 20:
        np.testing.assert_array_equal(ours_k, funasr_backend(x, k, seed=3))
        assert ours_k.max() + 1 == k
    elif n >= 6:  # FunASR returns one speaker here; we run its spectral clustering with the count asked
        np.testing.assert_array_equal(ours_k, funasr_spectral(x, k, seed=3))
        assert ours_k.max() + 1 == k
    else:  # below 6 windows FunASR's p-pruning would zero every similarity: no pruning
        assert sorted(set(ours_k.tolist())) == list(range(k))
    if n >= 150 and sep == "well":  # the synthetic speakers are found
        from sklearn.metrics import adjusted_rand_score

        assert adjusted_rand_score(truth, ours) == 1.0
        assert adjusted_rand_score(truth, ours_k) == 1.0


@needs_funasr
@pytest.mark.parametrize("d", [192, 32])
def test_bounds_equal_funasr_spectral_bounds(d: int) -> None:
    # max_speakers: the eigen-gap count within 1..max (FunASR's SpectralCluster(max_num_spks=...)), then merging
    x4, _ = make(150, 4, d, "well", seed=9 + d)
    ours = cluster_speakers(x4.copy(), max_speakers=2)
    np.testing.assert_array_equal(ours, funasr_spectral(x4, None, 1, 2, merge_thr=0.78))
    assert ours.max() + 1 <= 2
    assert cluster_speakers(x4.copy()).max() + 1 == 4
    # min_speakers: within min..15
    x3, _ = make(150, 3, d, "well", seed=8 + d)
    ours = cluster_speakers(x3.copy(), min_speakers=3, max_speakers=6, seed=5)
    np.testing.assert_array_equal(ours, funasr_spectral(x3, None, 3, 6, merge_thr=0.78, seed=5))
    # the eigen-gap count over lambdas[min-1 : max+1] when min > the gap's choice
    # (merge_threshold=1: only identical centres would merge, i.e. none -- the spectral step alone)
    ours = cluster_speakers(x3.copy(), min_speakers=5, max_speakers=9, merge_threshold=1.0)
    ref = funasr_spectral(x3, None, 5, 9, merge_thr=None)
    np.testing.assert_array_equal(ours, ref)
    assert ref.max() + 1 >= 5
    assert cluster_speakers(x3.copy(), min_speakers=5, max_speakers=9).max() + 1 == 5  # merged down to the floor


def _two_close_and_one_far(n: int, d: int, cos: float, seed: int) -> np.ndarray:
    """Three tight speakers (within-speaker cosine ~0.98): A and B at cosine ``cos``, C far from both."""
    rng = np.random.default_rng(seed)
    a, c = rng.standard_normal((2, d))
    a /= np.linalg.norm(a)
    c /= np.linalg.norm(c)
    e = rng.standard_normal(d)
    e -= (e @ a) * a
    e /= np.linalg.norm(e)
    b = cos * a + np.sqrt(1 - cos**2) * e
    centres = np.stack([a, b, c])
    spk = np.arange(n) // 10 % 3  # turns of 10 windows: A, B, C, A, ...
    x = centres[spk] + 0.15 * rng.standard_normal((n, d)) / np.sqrt(d)
    return (x * rng.uniform(5, 15, (n, 1))).astype(np.float32)


@needs_funasr
@pytest.mark.parametrize("d", [192, 32])
def test_merge_by_cos_merges_two_near_speakers(d: int) -> None:
    x = _two_close_and_one_far(150, d, cos=0.85, seed=d)
    before = funasr_spectral(x)  # the spectral step alone finds all three
    assert before.max() + 1 == 3
    ours = cluster_speakers(x.copy())
    np.testing.assert_array_equal(ours, funasr_backend(x))
    assert ours.max() + 1 == 2  # A and B (cosine 0.85 >= 0.78) merged
    assert len(set(zip(before.tolist(), ours.tolist(), strict=True))) == 3  # C kept apart, A+B one
    higher = cluster_speakers(x.copy(), merge_threshold=0.9)
    np.testing.assert_array_equal(higher, funasr_backend(x, merge_thr=0.9))
    assert higher.max() + 1 == 3
    # a floor: min_speakers=3 stops the merging (FunASR has no floor and merges to 2)
    np.testing.assert_array_equal(cluster_speakers(x.copy(), min_speakers=3), before)
    # num_speakers given: no merging (FunASR merges only when the count is unknown)
    np.testing.assert_array_equal(cluster_speakers(x.copy(), num_speakers=3), funasr_backend(x, 3))


@needs_funasr
def test_merge_close_speakers_equals_merge_by_cos_on_random_labels() -> None:
    import torch

    cb, _ = _ref()
    backend = cb.ClusterBackend()
    rng = np.random.default_rng(5)
    merged_counts = set()
    for case in range(300):
        k = int(rng.integers(2, 9))
        n = int(rng.integers(k, 60))
        d = int(rng.choice([8, 32, 192]))
        labels = np.concatenate([np.arange(k), rng.integers(0, k, n - k)])
        rng.shuffle(labels)
        base = rng.standard_normal(d)
        spread = float(rng.uniform(0.2, 1.5))
        centres = base + spread * rng.standard_normal((k, d))
        x = (centres[labels] + rng.standard_normal((n, d)) * rng.uniform(0.1, 1.0)).astype(np.float32)
        thr = float(rng.choice([0.78, 0.5, 0.9, 1.0]))
        ref = backend.merge_by_cos(labels.copy(), torch.from_numpy(x), thr)
        ours = merge_close_speakers(labels.astype(np.int64), x, thr)
        np.testing.assert_array_equal(ours, ref, err_msg=f"case {case}")
        merged_counts.add(k - int(ours.max()) - 1)
    assert {0, 1, 2} <= merged_counts  # no merge, one merge and several merges all happened


@needs_funasr
def test_large_sets_umap_hdbscan_and_kmeans() -> None:
    """N >= 2048: count unknown -> UMAP + HDBSCAN (+ merge_by_cos); count known -> k-means of unit vectors."""
    from sklearn.metrics import adjusted_rand_score

    x, truth = make(2100, 3, 192, "well", seed=14)
    ref = funasr_backend(x)  # unseeded UMAP, parallel: not reproducible, the partition is
    ours = cluster_speakers(x.copy(), seed=0)
    assert adjusted_rand_score(ref, ours) == 1.0
    assert ours.max() + 1 == ref.max() + 1 == 3
    assert adjusted_rand_score(truth, ours) == 1.0
    # known count: FunASR's KMeansCluster fixes random_state=0, our default seed is 0 -> bit-equal
    np.testing.assert_array_equal(cluster_speakers(x.copy(), num_speakers=3), funasr_backend(x, 3))
    np.testing.assert_array_equal(cluster_speakers(x.copy(), num_speakers=2), funasr_backend(x, 2))


def test_umap_hdbscan_is_seeded(monkeypatch: pytest.MonkeyPatch) -> None:
    """Our UMAP gets ``random_state=seed``: the same labels every time (FunASR's is unseeded). The path is taken
    from 100 windows on here so that it runs on a small set."""
    pytest.importorskip("umap")
    from sklearn.metrics import adjusted_rand_score

    monkeypatch.setattr(cl, "LARGE_WINDOWS", 100)
    x, truth = make(400, 3, 32, "well", seed=21)
    first = cluster_speakers(x.copy(), seed=4)
    np.testing.assert_array_equal(cluster_speakers(x.copy(), seed=4), first)
    assert adjusted_rand_score(truth, first) == 1.0


def test_large_set_bounds_enforced_after_hdbscan(monkeypatch: pytest.MonkeyPatch) -> None:
    """FunASR's UMAP path has no count bounds; explicit ones are enforced after it (HDBSCAN stubbed here)."""
    x, truth = make(300, 4, 32, "well", seed=3)
    fake = truth.copy()
    fake[::37] = -1  # some HDBSCAN noise
    monkeypatch.setattr(cl, "LARGE_WINDOWS", 100)
    monkeypatch.setattr(cl, "_umap_hdbscan", lambda x, seed: fake.copy())
    # no bounds: noise stays one more speaker (FunASR's postprocess makes -1 a speaker too)
    labels = cluster_speakers(x)
    assert labels.max() + 1 == 5
    np.testing.assert_array_equal(labels == labels[0], fake == fake[0])
    # max_speakers=2: noise joins its nearest speaker, then the closest speakers merge down to 2
    labels = cluster_speakers(x, max_speakers=2)
    assert labels.max() + 1 == 2
    assert (labels[fake >= 0][None, :] == labels[fake >= 0][:, None]).sum() > 0
    for s in range(4):  # each synthetic speaker stays whole
        assert len(set(labels[truth == s].tolist())) == 1
    # min_speakers above what HDBSCAN found: k-means with min_speakers
    monkeypatch.setattr(cl, "_umap_hdbscan", lambda x, seed: np.where(truth < 2, 0, 1))
    labels = cluster_speakers(x, min_speakers=4)
    assert labels.max() + 1 == 4
    # all noise: one speaker (FunASR fails an assertion in merge_by_cos)
    monkeypatch.setattr(cl, "_umap_hdbscan", lambda x, seed: np.full(len(x), -1))
    assert (cluster_speakers(x) == 0).all()


def test_small_inputs_and_explicit_counts() -> None:
    assert cluster_speakers(np.zeros((0, 192), np.float32)).shape == (0,)
    assert cluster_speakers(np.zeros((0, 192), np.float32), num_speakers=3).shape == (0,)
    np.testing.assert_array_equal(cluster_speakers(np.ones((1, 8), np.float32)), [0])
    np.testing.assert_array_equal(cluster_speakers(np.ones((1, 8), np.float32), num_speakers=1), [0])
    with pytest.warns(RuntimeWarning, match="only 1 speaker window"):
        np.testing.assert_array_equal(cluster_speakers(np.ones((1, 8), np.float32), num_speakers=2), [0])
    # two speakers, six windows each
    truth = np.array([0] * 6 + [1] * 6)
    rng = np.random.default_rng(2)
    c = rng.standard_normal((2, 192))
    x = (c[truth] + 0.05 * rng.standard_normal((12, 192))).astype(np.float32)
    assert (cluster_speakers(x, clustering="funasr") == 0).all()  # FunASR: under 20 windows, one speaker
    np.testing.assert_array_equal(cluster_speakers(x), truth)  # the default: agglomerative there
    np.testing.assert_array_equal(cluster_speakers(x, num_speakers=2), truth)  # honoured
    np.testing.assert_array_equal(cluster_speakers(x, min_speakers=2), truth)  # min_speakers > 1 honoured too
    small = np.concatenate([x[:2], x[-2:]])  # 4 windows: no p-pruning (FunASR's would zero them all at 5)
    np.testing.assert_array_equal(cluster_speakers(small, num_speakers=2), [0, 0, 1, 1])
    np.testing.assert_array_equal(cluster_speakers(np.concatenate([x[:3], x[-2:]]), num_speakers=2), [0, 0, 0, 1, 1])
    np.testing.assert_array_equal(cluster_speakers(x[[0, -1]], num_speakers=2), [0, 1])
    with pytest.warns(RuntimeWarning, match="min_speakers=13 asked, but there are only 12"):
        assert (cluster_speakers(x, min_speakers=13) == 0).all()


def test_option_validation() -> None:
    x = np.ones((3, 4), np.float32)
    for bad in (0, -1, 1.5, True, "2"):
        with pytest.raises(ValueError, match="num_speakers must be a positive integer"):
            cluster_speakers(x, num_speakers=bad)  # type: ignore[arg-type]
        with pytest.raises(ValueError, match="min_speakers must be a positive integer"):
            cluster_speakers(x, min_speakers=bad)  # type: ignore[arg-type]
        with pytest.raises(ValueError, match="max_speakers must be a positive integer"):
            cluster_speakers(x, max_speakers=bad)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=r"min_speakers \(4\) is more than max_speakers \(3\)"):
        cluster_speakers(x, min_speakers=4, max_speakers=3)
    with pytest.raises(ValueError, match=r"num_speakers=5 is outside min_speakers..max_speakers \(1..4\)"):
        cluster_speakers(x, num_speakers=5, max_speakers=4)
    with pytest.raises(ValueError, match=r"num_speakers=2 is outside min_speakers..max_speakers \(3..any\)"):
        cluster_speakers(x, num_speakers=2, min_speakers=3)
    for thr in (0, 1.5, -0.2, "0.7", None):
        with pytest.raises(ValueError, match="merge_threshold must be"):
            cluster_speakers(x, merge_threshold=thr)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="seed must be an integer"):
        cluster_speakers(x, seed=-1)
    with pytest.raises(ValueError, match=r"2-D array \[windows, dim\], got shape \(4,\)"):
        cluster_speakers(np.ones(4, np.float32))
    with pytest.raises(ValueError, match="NaN or infinity"):
        cluster_speakers(np.full((25, 4), np.nan, np.float32))
    with pytest.raises(ValueError, match="real numbers"):
        cluster_speakers(np.array([["a", "b"]]))
    assert check_options(2, 1, 3, 0.5) == (2, 1, 3, 0.5)
    np.testing.assert_array_equal(cluster_speakers(np.ones((3, 4)), num_speakers=np.int64(1)), [0, 0, 0])


def test_missing_dependency_names_the_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    x, _ = make(30, 2, 16, "well", seed=0)
    monkeypatch.setitem(sys.modules, "sklearn", None)
    assert (cluster_speakers(x[:10], clustering="funasr") == 0).all()  # FunASR's: below 20 windows nothing imported
    assert cluster_speakers(x[:10]).shape == (10,)  # the default's agglomerative clustering is scipy's
    with pytest.raises(ImportError, match=r"pip install 'fun-asr\[speakers\]'"):
        cluster_speakers(x)
    monkeypatch.delitem(sys.modules, "sklearn")
    monkeypatch.setitem(sys.modules, "umap", None)
    monkeypatch.setitem(sys.modules, "umap.umap_", None)
    monkeypatch.setattr(cl, "LARGE_WINDOWS", 25)
    with pytest.raises(ImportError, match=r"umap.*pip install 'fun-asr\[speakers\]'"):
        cluster_speakers(x)
    # the default's agglomerative clustering (under 20 windows) needs scipy
    for name in [m for m in sys.modules if m == "scipy" or m.startswith("scipy.")]:
        monkeypatch.setitem(sys.modules, name, None)
    with pytest.raises(ImportError, match=r"scipy.*pip install 'fun-asr\[speakers\]'"):
        cluster_speakers(x[:10])


# -- under 20 windows: agglomerative clustering by default ----------------------------------------------------------


def _turns(k: int, n: int, d: int, seed: int, noise: float = 0.5) -> tuple[np.ndarray, np.ndarray]:
    """N window embeddings of K well-separated speakers taking turns of 1-3 windows, each speaker at least once
    (random unit directions in D dims, within-speaker cosine ~0.8 at noise 0.5, times a random length 5..15)."""
    rng = np.random.default_rng(seed)
    c = rng.standard_normal((k, d))
    c /= np.linalg.norm(c, axis=1, keepdims=True)
    spk = list(rng.permutation(k))
    while len(spk) < n:
        spk.append(int(rng.choice([s for s in range(k) if s != spk[-1]])) if k > 1 else 0)
    runs = [s for s in spk for _ in range(int(rng.integers(1, 4)))]
    truth = np.array(runs[:n], dtype=np.int64)
    missing = set(range(k)) - set(truth.tolist())
    for i, s in enumerate(sorted(missing)):  # a speaker cut off by n: its window at the end
        truth[n - 1 - i] = s
    x = c[truth] + noise * rng.standard_normal((n, d)) / np.sqrt(d)
    x = x / np.linalg.norm(x, axis=1, keepdims=True) * rng.uniform(5, 15, (n, 1))
    return x.astype(np.float32), cl.canonical_labels(truth)


@pytest.mark.parametrize("d", [192, 32])
@pytest.mark.parametrize("k", [1, 2, 3, 4])
def test_agglomerative_finds_the_count_below_20_windows(k: int, d: int) -> None:
    """1-4 well-separated speakers in 2..19 windows: the default finds them all, window for window; FunASR's
    clustering (``clustering="funasr"``) calls every window speaker 0."""
    for n in sorted({max(k, 2), k + 1, 6, 12, 19}):
        for seed in range(3):
            x, truth = _turns(k, n, d, seed=100 * k + 10 * n + seed + d)
            np.testing.assert_array_equal(cluster_speakers(x.copy()), truth, err_msg=f"n={n} seed={seed}")
            np.testing.assert_array_equal(cluster_speakers(x.copy(), clustering="auto"), truth)
            funasr = cluster_speakers(x.copy(), clustering="funasr")
            assert funasr.dtype == np.int64 and (funasr == 0).all()


def test_agglomerative_cut_is_the_mean_cosine_between_groups() -> None:
    """Two groups of identical windows: one speaker when their cosine is at least ``ahc_threshold`` (default
    AHC_THRESHOLD), two below; a larger spread inside a group does not change that (average linkage)."""
    rng = np.random.default_rng(0)
    a, e = rng.standard_normal((2, 64))
    a /= np.linalg.norm(a)
    e -= (e @ a) * a
    e /= np.linalg.norm(e)
    truth = np.array([0, 0, 0, 1, 1, 1, 0, 0])

    def pair(cos: float) -> np.ndarray:
        b = cos * a + np.sqrt(1 - cos**2) * e
        return np.stack([a, b])[truth] * 3.0

    thr = cl.AHC_THRESHOLD
    assert (cluster_speakers(pair(thr + 0.02)) == 0).all()
    np.testing.assert_array_equal(cluster_speakers(pair(thr - 0.02)), truth)
    np.testing.assert_array_equal(cluster_speakers(pair(0.7), ahc_threshold=0.75), truth)
    assert (cluster_speakers(pair(0.7), ahc_threshold=0.65) == 0).all()
    # merge_by_cos still runs after it: centres at cosine >= merge_threshold are one speaker
    assert (cluster_speakers(pair(0.7), ahc_threshold=0.75, merge_threshold=0.6) == 0).all()
    np.testing.assert_array_equal(cluster_speakers(pair(0.1)[[0, 3]]), [0, 1])  # two windows
    np.testing.assert_array_equal(cluster_speakers(pair(0.1)[:1]), [0])


def test_agglomerative_keeps_the_count_bounds() -> None:
    x, truth = _turns(4, 16, 64, seed=3)
    assert cluster_speakers(x).max() + 1 == 4
    for hi in (1, 2, 3):  # the tree cut at max_speakers
        labels = cluster_speakers(x, max_speakers=hi)
        assert labels.max() + 1 == hi
        for s in range(4):  # each speaker stays whole
            assert len(set(labels[truth == s].tolist())) == 1
    x2, truth2 = _turns(2, 12, 64, seed=4)
    assert cluster_speakers(x2, min_speakers=2).max() + 1 == 2
    labels = cluster_speakers(x2, min_speakers=3, max_speakers=5)  # the tree cut at min_speakers
    assert labels.max() + 1 == 3
    assert len(set(zip(truth2.tolist(), labels.tolist(), strict=True))) == 3  # a speaker split, none joined
    np.testing.assert_array_equal(cluster_speakers(x2, num_speakers=2), truth2)  # a given count: spectral, as before
    with pytest.warns(RuntimeWarning, match="min_speakers=13 asked, but there are only 12"):
        assert (cluster_speakers(x2, min_speakers=13) == 0).all()
    # FunASR's clustering keeps its own behaviour under 20 windows: spectral within min..max when min > 1
    np.testing.assert_array_equal(cluster_speakers(x2, min_speakers=2, clustering="funasr"), truth2)
    assert (cluster_speakers(x, max_speakers=3, clustering="funasr") == 0).all()


def test_from_20_windows_on_the_default_is_funasrs() -> None:
    """From 20 windows on ``auto`` is FunASR's clustering: the same labels as ``clustering="funasr"`` (which
    test_labels_equal_funasr holds equal to FunASR's own), whatever the agglomerative threshold."""
    for n, k, sep in ((20, 2, "well"), (20, 4, "near"), (21, 3, "well"), (60, 3, "near"), (150, 4, "well")):
        x, _ = make(n, k, 32, sep, seed=n + k)
        funasr = cluster_speakers(x.copy(), clustering="funasr")
        np.testing.assert_array_equal(cluster_speakers(x.copy()), funasr)
        np.testing.assert_array_equal(cluster_speakers(x.copy(), ahc_threshold=0.99), funasr)
        np.testing.assert_array_equal(cluster_speakers(x.copy(), max_speakers=2),
                                      cluster_speakers(x.copy(), max_speakers=2, clustering="funasr"))


def test_clustering_option_is_checked() -> None:
    x = np.ones((3, 4), np.float32)
    for bad in ("FunASR", "ahc", "", None, 1):
        with pytest.raises(ValueError, match=r"clustering must be one of 'auto', 'funasr', got"):
            cluster_speakers(x, clustering=bad)  # type: ignore[arg-type]
    for bad in (1.5, -2, "0.5", None, True):
        with pytest.raises(ValueError, match="ahc_threshold must be"):
            cluster_speakers(x, ahc_threshold=bad)  # type: ignore[arg-type]
    from fun_asr.speakers.diarize import SpeakerOptions

    with pytest.raises(ValueError, match=r"speaker_clustering must be one of 'auto', 'funasr', got 'spectral'"):
        SpeakerOptions.check(speaker_clustering="spectral")
    opts = SpeakerOptions.check(2, None, 3, "funasr")
    assert opts.to_dict() == {"num_speakers": 2, "max_speakers": 3, "speaker_clustering": "funasr"}
    assert opts.counts() == {"num_speakers": 2, "max_speakers": 3}
    assert SpeakerOptions().to_dict() == {"speaker_clustering": "auto"}


# -- timeline ----------------------------------------------------------------------------------------------------


def _random_segments(rng: random.Random, fs: int) -> list[list[Any]]:
    """VAD-like segments [start_s, end_s, samples]: starts on ms, lengths 0..7 s incl. shorter than a window."""
    segs = []
    t_ms = rng.randint(0, 3000)
    for _ in range(rng.randint(1, 5)):
        kind = rng.random()
        if kind < 0.3:
            n = rng.randint(0, int(1.5 * fs))  # shorter than (or exactly) a window
        elif kind < 0.4:
            n = int(rng.choice([0.75, 1.5, 2.25, 3.0, 3.75]) * fs) + rng.choice([-1, 0, 1])
        else:
            n = rng.randint(int(1.5 * fs), 7 * fs)
        dur_ms = n * 1000 // fs
        segs.append([t_ms / 1000.0, (t_ms + dur_ms) / 1000.0,
                     np.random.default_rng(rng.randint(0, 10**9)).standard_normal(n).astype(np.float32)])
        t_ms += dur_ms + rng.randint(0, 2000)
    return segs


@needs_funasr
def test_sv_chunk_equals_funasr() -> None:
    _, utils = _ref()
    rng = random.Random(0)
    n_windows = 0
    for case in range(300):
        fs = 16000 if case % 4 else 8000
        segs = _random_segments(rng, fs)
        ref = utils.sv_chunk(segs, fs=fs)
        ours = sv_chunk([tuple(s) for s in segs], fs=fs)
        assert len(ours) == len(ref), case
        for (a, b, data), (ra, rb, rdata) in zip(ours, ref, strict=True):
            assert (a, b) == (ra, rb)
            assert data.dtype == rdata.dtype and data.shape == (int(1.5 * fs),)
            np.testing.assert_array_equal(data, rdata)
        n_windows += len(ours)
    assert n_windows > 1000
    assert sv_chunk([]) == []
    assert sv_chunk([(1.0, 1.0, np.zeros(0, np.float32))]) == []
    one = sv_chunk([(2.0, 2.5, np.ones(8000, np.float32))])  # half a window: one window, zero-padded
    assert [(a, b) for a, b, _ in one] == [(2.0, 2.5)]
    assert one[0][2][:8000].sum() == 8000 and not one[0][2][8000:].any()
    with pytest.raises(ValueError, match="samples must be 1-D"):
        sv_chunk([(0.0, 1.0, np.zeros((2, 8000)))])
    with pytest.raises(ValueError, match=r"must be \(start_s, end_s, samples\)"):
        sv_chunk([(0.0, np.zeros(10))])
    with pytest.raises(ValueError, match="fs must be"):
        sv_chunk([], fs=1)


def _random_windows(rng: random.Random) -> list[list[Any]]:
    """Window lists: real ones (sv_chunk of random segments) or arbitrary intervals sorted by start (overlaps,
    gaps, turns under 0.7 s, windows inside windows)."""
    if rng.random() < 0.5:
        return [[a, b, None] for a, b, _ in sv_chunk(_random_segments(rng, 16000))]
    out = []
    t = rng.uniform(0, 5)
    for _ in range(rng.randint(1, 40)):
        t += rng.choice([0.0, rng.uniform(0, 0.3), rng.uniform(0, 1.5), 0.75])
        out.append([t, t + rng.choice([1.5, rng.uniform(0.05, 3.0)]), None])
    return sorted(out, key=lambda w: w[0])


def _random_labels(rng: random.Random, n: int) -> np.ndarray:
    ids = rng.sample(range(10), rng.randint(1, 4))
    labels: list[int] = []
    while len(labels) < n:
        labels += [rng.choice(ids)] * rng.choice([1, 1, 2, 3, 8])
    return np.array(labels[:n])


@needs_funasr
def test_timeline_centres_and_distribution_equal_funasr() -> None:
    _, utils = _ref()
    rng = random.Random(1)
    seen_smoothing = seen_overlap_split = 0
    for case in range(500):
        windows = _random_windows(rng)
        if not windows:
            continue
        labels = _random_labels(rng, len(windows))
        emb = np.random.default_rng(case).standard_normal((len(windows), 8)).astype(np.float32)
        ref, ref_centres = utils.postprocess([list(w) for w in windows], None, labels, emb, return_spk_center=True)
        ours = speaker_timeline([(a, b) for a, b, _ in windows], labels)
        assert ours == [list(t) for t in ref], case
        assert all(type(spk) is int for _, _, spk in ours)
        np.testing.assert_array_equal(speaker_centers(labels, emb), ref_centres)
        seen_smoothing += len(ours) < len(utils.merge_seque([[w[0], w[1], s] for w, s in zip(
            windows, utils.correct_labels(labels), strict=True)]))
        seen_overlap_split += any(round(a, 2) != a for a, _, _ in ours)
        # distribute_spk: sentences in ms around and across the turns
        span = (windows[0][0] * 1000, max(w[1] for w in windows) * 1000)
        sentences = []
        for _ in range(rng.randint(1, 12)):
            a = rng.uniform(span[0] - 2000, span[1] + 500)
            sentences.append({"start": int(a), "end": int(a + rng.choice([50, 400, 1500, 6000, 20000])), "text": "x"})
        if rng.random() < 0.2:
            sentences.append({"start": int(span[1] + 5000), "end": int(span[1] + 6000), "text": "none"})
        ref_s = utils.distribute_spk([dict(s) for s in sentences], ref)
        ours_s = distribute_speakers([dict(s) for s in sentences], ours)
        assert ours_s == ref_s, case
    assert seen_smoothing > 50 and seen_overlap_split > 20


@needs_funasr
def test_distribute_keeps_funasr_accounting() -> None:
    """FunASR counts a leading speaker's overlap twice and adds its later turns: speaker 0 (600 ms, counted
    1200) beats speaker 1's 1000 ms, and speaker 1 (300 ms counted 600, + 300 of its next turn = 900) beats
    speaker 0's 800 ms."""
    _, utils = _ref()
    cases = [
        ([[0.0, 0.6, 0], [0.6, 1.6, 1]], {"start": 0, "end": 1600}, 0),
        ([[0.0, 0.3, 1], [0.35, 0.65, 1], [0.7, 1.5, 0]], {"start": 0, "end": 1500}, 1),
        ([[5.0, 6.0, 2]], {"start": 0, "end": 1000}, 0),  # no overlap: speaker 0
    ]
    for timeline, sentence, spk in cases:
        assert distribute_speakers([dict(sentence)], timeline)[0]["spk"] == spk
        assert utils.distribute_spk([dict(sentence)], timeline)[0]["spk"] == spk
    with pytest.raises(ValueError, match="sentence 0 must be a dict with 'start' and 'end'"):
        distribute_speakers([{"begin": 0}], [])


def test_timeline_edge_cases() -> None:
    assert speaker_timeline([], np.zeros(0, int)) == []
    assert speaker_centers(np.zeros(0, int), np.zeros((0, 4))).shape == (0, 4)
    # one turn: not rounded (FunASR's smooth returns a single turn as it is)
    assert speaker_timeline([(0.123456, 1.623456)], [7]) == [[0.123456, 1.623456, 0]]
    # overlap split at the middle, short turns to the nearer neighbour
    windows = [(0.0, 1.5), (0.75, 2.25), (1.5, 3.0), (2.0, 2.4), (3.1, 4.6)]
    # (a turn inside the previous one gets a negative length, then joining it moves the end back: FunASR's)
    assert speaker_timeline(windows, [4, 4, 9, 4, 9]) == [[0.0, 2.4, 0], [3.1, 4.6, 1]]
    assert speaker_timeline([(0.0, 1.5), (0.75, 2.25), (1.5, 3.0), (2.25, 3.75)], [1, 1, 2, 2]) == [
        [0.0, 1.88, 0], [1.88, 3.75, 1]]
    with pytest.raises(ValueError, match="one label per window"):
        speaker_timeline([(0.0, 1.5)], [0, 1])


def test_similarities_take_funasrs_general_product(monkeypatch: pytest.MonkeyPatch) -> None:
    """FunASR's torch input reaches numpy as two arrays, multiplied with the general BLAS product; the same array
    twice would take numpy's symmetric product (x @ x.T), which rounds differently with some CPUs' BLAS kernels
    (a Zen 4 VM: another split in test_bounds_equal_funasr_spectral_bounds). Ours passes two arrays as well, and
    its matrix is the one the torch input gives."""
    import sklearn.metrics.pairwise as pairwise

    real, seen = pairwise.cosine_similarity, []

    def spy(X, Y=None, **kw):  # noqa: ANN001, ANN003, ANN202, N803
        seen.append((X, Y))
        return real(X, Y, **kw)

    monkeypatch.setattr(pairwise, "cosine_similarity", spy)
    x, _ = make(60, 3, 32, "well", seed=1)
    cluster_speakers(x.copy())
    assert len(seen) == 1 and seen[0][1] is not None and seen[0][0] is not seen[0][1]
    if funasr_ref.funasr_available():
        import torch

        t = torch.from_numpy(x.copy())
        np.testing.assert_array_equal(real(*seen[0]), real(t, t))
