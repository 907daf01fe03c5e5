"""Speaker clustering of window embeddings, FunASR 1.4.16's ``ClusterBackend(merge_thr=0.78)``
(``funasr/models/campplus/cluster_backend.py``) on numpy, scikit-learn, scipy and umap-learn, with one
addition that is on by default: ``clustering="auto"`` finds the count of a recording under 20 windows by
agglomerative clustering where FunASR returns one speaker; ``clustering="funasr"`` keeps FunASR's labels
bit for bit (see "Where this module departs from FunASR" below).

FunASR's steps, by the number N of windows and whether the count is known (``num_speakers``, its
``oracle_num`` / ``preset_spk_num``):

- N < 20: every window is speaker 0;
- N < 2048: spectral clustering -- cosine similarities (``sklearn.metrics.pairwise.cosine_similarity``),
  p-pruning (each row keeps its largest ``max(6, 2.2 % of N)`` similarities), symmetrisation, the
  unnormalised Laplacian, ``scipy.linalg.eigh``, the count from the largest eigen-gap over
  ``lambdas[min-1 : max+1]`` (1..15) unless known, ``sklearn.cluster.k_means`` on the first eigenvectors;
- N >= 2048 with a known count: ``k_means`` of the L2-normalised embeddings (``n_init=10``);
- N >= 2048, count unknown: UMAP (20 neighbours, ``min_dist=0``, 60 components, cosine) then scikit-learn's
  HDBSCAN (``min_samples=10``, ``min_cluster_size=10``, one cluster allowed);
- count unknown: then ``merge_by_cos`` -- while the two closest speaker centres have cosine >= 0.78, merge them.

The same library calls in the same order on the same dtype give the same labels bit for bit, up to one
thing: FunASR calls ``k_means`` without ``random_state`` (numpy's global generator), this module passes
``random_state=seed`` (seeding numpy's global generator with ``seed`` before FunASR's call makes its draws
ours). Its UMAP is unseeded (and so multi-threaded, not reproducible); ours gets ``random_state=seed``
(single-threaded, reproducible): the same partition on well-separated speakers, not the same floats.

Where this module departs from FunASR, on purpose:

- ``clustering="auto"`` (the default): under 20 windows with the count unknown, average-linkage agglomerative
  clustering (``scipy.cluster.hierarchy``) on the windows' cosine similarities, cut where the closest two
  clusters' mean similarity falls below ``ahc_threshold`` (:data:`AHC_THRESHOLD`), the count kept within
  ``min_speakers..max_speakers``; then ``merge_by_cos`` as on the other paths. From 20 windows on, ``auto`` is
  FunASR's clustering unchanged. ``clustering="funasr"``: one speaker under 20 windows, as FunASR;
- an explicit ``num_speakers`` is honoured for N < 20 too (FunASR returns one speaker there whatever was
  asked); so is ``min_speakers`` > 1 (the eigen-gap count within ``min..max``). When fewer windows than
  the required count exist, every window is speaker 0 and a :class:`RuntimeWarning` says why;
- ``min_speakers`` / ``max_speakers`` (FunASR's fixed 1 / 15 of ``SpectralCluster``) bound the eigen-gap
  count; ``merge_by_cos`` never merges below ``min_speakers``; on the UMAP path (which has no count of its
  own) explicit bounds are enforced afterwards (HDBSCAN noise joins its nearest speaker, then the closest
  speakers merge down to ``max_speakers``; fewer than ``min_speakers`` -> k-means with ``min_speakers``);
- HDBSCAN noise (label -1) is one more speaker, as FunASR's ``postprocess`` makes it; all windows noise
  (FunASR fails an assertion in ``merge_by_cos``) is one speaker;
- the labels come back canonical: 0, 1, ... in order of first appearance (FunASR's ``correct_labels``).

The embeddings are used in the dtype given (FunASR's are float32; pass float32 for its exact labels).
"""

from __future__ import annotations

import warnings
from typing import Any

import numpy as np

from fun_asr.errors import OptionError

SMALL_WINDOWS = 20  # FunASR: fewer windows than this -> one speaker (clustering="auto": agglomerative instead)
CLUSTERINGS = ("auto", "funasr")  # auto: agglomerative under SMALL_WINDOWS, FunASR's from there on; funasr: FunASR's
DEFAULT_CLUSTERING = "auto"
# The agglomerative cut (average linkage, cosine): two groups of windows are one speaker while the mean cosine
# between their windows is at least this. Chosen on the tiny trained CAM++ and synthetic conversations of 1-4
# held-out voices under 20 windows (docs/diarization.md, tools/eval_short_conversations.py --sweep): the right
# count in 86 of 110 at 0.5 (0.45-0.55: 83-88), 49 at FunASR's 0.78. FunASR's 0.78 is a cosine of two clusters'
# *mean* embeddings; a single 1.5 s window is noisier (the tiny model's same-speaker windows: cosine 0.74 on
# average), and 0.78 between windows splits single voices.
AHC_THRESHOLD = 0.5
AHC_LINKAGE = "average"  # scipy.cluster.hierarchy.linkage method (measured against complete, single, weighted)
LARGE_WINDOWS = 2048  # FunASR: from this many windows on, k-means (count known) or UMAP+HDBSCAN (unknown)
DEFAULT_MIN_SPEAKERS = 1  # FunASR's SpectralCluster(min_num_spks=1, ...)
DEFAULT_MAX_SPEAKERS = 15  # ... max_num_spks=15
P_VALUE = 0.022  # SpectralCluster(pval=0.022)
P_MIN_KEPT = 6.0  # p-pruning keeps at least ~6 similarities a row
UMAP_NEIGHBORS = 20
UMAP_COMPONENTS = 60
HDBSCAN_MIN_SAMPLES = 10
HDBSCAN_MIN_CLUSTER_SIZE = 10
LARGE_KMEANS_INIT = 10  # KMeansCluster: n_init=10
INSTALL_HINT = "pip install 'fun-asr[speakers]'"


def _require(what: str) -> Any:
    """Import an optional dependency of speaker clustering, naming the extra to install when it is missing."""
    try:
        if what == "sklearn":
            import sklearn.cluster
            import sklearn.metrics.pairwise
            import sklearn.preprocessing

            return sklearn
        if what == "scipy":
            import scipy.cluster.hierarchy
            import scipy.linalg
            import scipy.spatial.distance

            return scipy
        if what == "umap":
            import umap.umap_ as umap_module

            return umap_module
    except ImportError as exc:
        raise ImportError(f"speaker clustering needs {what} ({exc}); install it with: {INSTALL_HINT}") from exc
    raise AssertionError(what)


def _count(name: str, value: Any) -> int | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | np.integer) or value < 1:
        raise OptionError("option.range", "{o[" + name + "]} must be a positive integer{h[or_none]}, got {value!r}"
                          "{h[omit_" + name + "]}", option=name, value=value)
    return int(value)


def check_clustering(value: Any, name: str = "speaker_clustering") -> str:
    """``value`` if it is one of :data:`CLUSTERINGS` (``"auto"``, ``"funasr"``), else ValueError naming them."""
    if not isinstance(value, str) or value not in CLUSTERINGS:
        accepted = ", ".join(repr(c) for c in CLUSTERINGS)
        raise OptionError("option.value", "{o[" + name + "]} must be one of {accepted}, got {value!r}", option=name,
                          accepted=accepted, value=value)
    return value


def check_counts(num_speakers: Any = None, min_speakers: Any = None,
                 max_speakers: Any = None) -> tuple[int | None, int | None, int | None]:
    """The speaker counts checked: each a positive integer or None, ``min_speakers <= max_speakers`` and
    ``num_speakers`` between them (ValueError otherwise); returns ``(num, min, max)``."""
    n, lo, hi = _count("num_speakers", num_speakers), _count("min_speakers", min_speakers), _count(
        "max_speakers", max_speakers)
    if lo is not None and hi is not None and lo > hi:
        raise OptionError("option.range", "{o[min_speakers]} ({lo}) is more than {o[max_speakers]} ({hi})",
                          option="min_speakers", lo=lo, hi=hi)
    if n is not None and ((lo is not None and n < lo) or (hi is not None and n > hi)):
        raise OptionError("option.range", "{o[num_speakers]}={n} is outside {o[min_speakers]}..{o[max_speakers]} "
                          "({lo}..{hi})", option="num_speakers", n=n, lo=lo if lo is not None else 1,
                          hi=hi if hi is not None else "any")
    return n, lo, hi


def check_options(num_speakers: Any = None, min_speakers: Any = None, max_speakers: Any = None,
                  merge_threshold: Any = 0.78) -> tuple[int | None, int | None, int | None, float]:
    """Validate the clustering options; returns them as ``(num, min, max, merge_threshold)``.

    Raises ValueError: a count that is not a positive integer, ``min_speakers > max_speakers``,
    ``num_speakers`` outside ``min_speakers..max_speakers``, ``merge_threshold`` outside (0, 1]."""
    n, lo, hi = check_counts(num_speakers, min_speakers, max_speakers)
    if isinstance(merge_threshold, bool) or not isinstance(merge_threshold, int | float | np.floating):
        raise ValueError(f"merge_threshold must be a number in (0, 1], got {merge_threshold!r}")
    thr = float(merge_threshold)
    if not 0.0 < thr <= 1.0:
        raise ValueError(f"merge_threshold must be in (0, 1] (a cosine similarity), got {thr}")
    return n, lo, hi, thr


def canonical_labels(labels: Any) -> np.ndarray:
    """Labels renumbered 0, 1, ... in order of first appearance (FunASR's ``correct_labels``), int64."""
    out = np.empty(len(labels), dtype=np.int64)
    ids: dict[Any, int] = {}
    for i, lab in enumerate(np.asarray(labels).tolist()):
        out[i] = ids.setdefault(lab, len(ids))
    return out


def _p_pruned(sim: np.ndarray) -> np.ndarray:
    """Zero each row's smallest similarities in place (FunASR's ``p_pruning``). Below 6 windows FunASR's count
    of zeroed entries goes negative (it then keeps only the largest few, or nothing but the diagonal): there
    nothing is pruned (never reached by FunASR, which stops at 20 windows)."""
    n = sim.shape[0]
    pval = P_MIN_KEPT / n if n * P_VALUE < P_MIN_KEPT else P_VALUE
    n_zeroed = max(int((1 - pval) * n), 0)
    for i in range(n):
        # one row at a time with numpy's default sort, as FunASR: the same choice among equal similarities
        sim[i, np.argsort(sim[i, :])[0:n_zeroed]] = 0
    return sim


def _spectral(x: np.ndarray, k: int | None, lo: int, hi: int, seed: int) -> np.ndarray:
    """FunASR's ``SpectralCluster(min_num_spks=lo, max_num_spks=hi)(x, oracle_num=k)`` with ``random_state``."""
    sklearn = _require("sklearn")
    scipy = _require("scipy")
    # FunASR passes a torch tensor, which scikit-learn turns into two separate arrays for X and Y: numpy then
    # multiplies them with the general BLAS product. The same array twice would take numpy's symmetric product
    # (A @ A.T -> syrk), which on some CPUs' BLAS kernels rounds differently (seen on a Zen 4 VM: cosines off
    # by 7e-7, another 2-speaker split of 4 speakers). A copy keeps FunASR's product.
    sim = _p_pruned(sklearn.metrics.pairwise.cosine_similarity(x, x.copy()))
    sym = 0.5 * (sim + sim.T)
    sym[np.diag_indices(sym.shape[0])] = 0
    laplacian = np.diag(np.sum(np.abs(sym), axis=1)) - sym
    lambdas, vectors = scipy.linalg.eigh(laplacian)
    if k is None:
        window = lambdas[lo - 1 : hi + 1]
        if len(window) < 2:
            k = lo
        else:
            # float(b) - float(a) as FunASR's getEigenGaps; np.argmax picks the first largest gap as it does
            gaps = [float(window[i + 1]) - float(window[i]) for i in range(len(window) - 1)]
            k = int(np.argmax(gaps)) + lo
    _, labels, _ = sklearn.cluster.k_means(vectors[:, :k], k, random_state=seed)
    return np.asarray(labels)


def _agglomerative(x: np.ndarray, lo: int, hi: int, threshold: float) -> np.ndarray:
    """Average-linkage agglomerative clustering of the windows on cosine similarity (``scipy.cluster.hierarchy``):
    groups are merged while the mean cosine between their windows is >= ``threshold``; the count is then brought
    within ``lo..hi`` (the tree cut at that many clusters). A zero embedding has cosine 0 with every other."""
    scipy = _require("scipy")
    hierarchy = scipy.cluster.hierarchy
    x = np.asarray(x, dtype=np.float64)
    norms = np.linalg.norm(x, axis=1, keepdims=True)
    unit = x / np.where(norms > 0, norms, 1.0)
    distances = np.clip(1.0 - unit @ unit.T, 0.0, 2.0)
    distances = 0.5 * (distances + distances.T)
    np.fill_diagonal(distances, 0.0)
    tree = hierarchy.linkage(scipy.spatial.distance.squareform(distances, checks=False), method=AHC_LINKAGE)
    labels = hierarchy.fcluster(tree, t=1.0 - threshold, criterion="distance")
    count = int(labels.max())
    if not lo <= count <= hi:
        labels = hierarchy.fcluster(tree, t=min(max(count, lo), hi), criterion="maxclust")
    return np.asarray(labels, dtype=np.int64) - 1


def _kmeans_normalized(x: np.ndarray, k: int, seed: int) -> np.ndarray:
    """FunASR's ``KMeansCluster``: k-means of the L2-normalised embeddings (it fixes ``random_state=0``)."""
    sklearn = _require("sklearn")
    _, labels, _ = sklearn.cluster.k_means(sklearn.preprocessing.normalize(x), k, random_state=seed,
                                           n_init=LARGE_KMEANS_INIT)
    return np.asarray(labels)


def _umap_hdbscan(x: np.ndarray, seed: int) -> np.ndarray:
    """FunASR's ``UmapHdbscan``, with UMAP seeded."""
    sklearn = _require("sklearn")
    umap_module = _require("umap")
    with warnings.catch_warnings():
        # umap-learn: "n_jobs value 1 overridden to 1 by setting random_state" -- seeded means single-threaded
        warnings.filterwarnings("ignore", message=".*overridden to 1 by setting random_state.*")
        reduced = umap_module.UMAP(n_neighbors=UMAP_NEIGHBORS, min_dist=0.0,
                                   n_components=min(UMAP_COMPONENTS, x.shape[0] - 2), metric="cosine",
                                   random_state=seed).fit_transform(x)
    labels = sklearn.cluster.HDBSCAN(min_samples=HDBSCAN_MIN_SAMPLES, min_cluster_size=HDBSCAN_MIN_CLUSTER_SIZE,
                                     allow_single_cluster=True, copy=False).fit_predict(reduced)
    return np.asarray(labels).astype(np.int64)


def _centres(labels: np.ndarray, x: np.ndarray, count: int) -> np.ndarray:
    """Unit-length mean embedding of speakers 0..count-1."""
    centres = np.stack([x[labels == i].mean(0) for i in range(count)], axis=0)
    return centres / np.linalg.norm(centres, axis=1, keepdims=True)


def merge_close_speakers(labels: np.ndarray, x: np.ndarray, threshold: float, floor: int = 1) -> np.ndarray:
    """FunASR's ``merge_by_cos``: while more than ``floor`` speakers are left and the two closest centres (means of
    their windows' embeddings) have cosine >= ``threshold``, the later speaker joins the earlier and the ones
    after it move down one. ``labels`` (0..K-1; -1 = noise, left alone) is changed in place and returned."""
    while True:
        count = int(labels.max()) + 1 if labels.size else 0
        if count <= max(floor, 1):
            return labels
        centres = _centres(labels, x, count)
        affinity = np.triu(np.matmul(centres, centres.T), 1)
        keep, gone = np.unravel_index(np.argmax(affinity), affinity.shape)
        if affinity[keep, gone] < threshold:
            return labels
        labels[labels == gone] = keep
        labels[labels > gone] -= 1


def _enforce_bounds(labels: np.ndarray, x: np.ndarray, lo: int, hi: int, seed: int) -> np.ndarray:
    """Bring an HDBSCAN result within ``lo..hi`` speakers (explicit bounds only; FunASR has none there)."""
    count = int(labels.max()) + 1 if labels.size else 0
    if count >= 1 and (labels < 0).any():
        noise = labels < 0
        centres = _centres(labels, x, count)
        unit = x[noise] / np.linalg.norm(x[noise], axis=1, keepdims=True)
        labels[noise] = np.argmax(unit @ centres.T, axis=1)
    if count < lo:
        return _kmeans_normalized(x, lo, seed)
    return merge_close_speakers(labels, x, -np.inf, floor=hi)


def _check_ahc_threshold_and_seed(ahc_threshold: Any, seed: Any) -> None:
    """ValueError unless ``ahc_threshold`` is a cosine in [-1, 1] and ``seed`` an integer in [0, 2**32)."""
    if isinstance(ahc_threshold, bool) or not isinstance(ahc_threshold, int | float | np.floating) or not (
            -1.0 <= float(ahc_threshold) <= 1.0):
        raise ValueError(f"ahc_threshold must be a cosine similarity in [-1, 1], got {ahc_threshold!r}")
    if isinstance(seed, bool) or not isinstance(seed, int | np.integer) or not 0 <= seed < 2**32:
        raise ValueError(f"seed must be an integer in [0, 2**32), got {seed!r}")


def _checked_embeddings(embeddings: Any) -> np.ndarray:
    """``embeddings`` as an array ``[N, D]``; ValueError unless 2-D and (when N > 0) real, finite, D >= 1."""
    x = np.asarray(embeddings)
    if x.ndim != 2:
        raise ValueError(f"embeddings must be a 2-D array [windows, dim], got shape {x.shape}")
    if x.shape[0] == 0:
        return x
    if x.shape[1] == 0 or not np.issubdtype(x.dtype, np.number) or np.iscomplexobj(x):
        raise ValueError(f"embeddings must be real numbers with dim >= 1, got dtype {x.dtype}, shape {x.shape}")
    if not np.isfinite(x).all():
        raise ValueError("embeddings contain NaN or infinity")
    return x


def _cluster_funasr(x: np.ndarray, k: int | None, bounds: tuple[int, int], thr: float, seed: int,
                    bounds_given: bool) -> np.ndarray:
    """FunASR's clustering of at least the required count of windows: spectral under ``LARGE_WINDOWS``, else
    k-means (count known) or UMAP + HDBSCAN (count unknown, then ``bounds`` enforced when ``bounds_given``);
    found speakers merged at ``thr`` when the count is unknown. Labels not yet canonical."""
    lo, hi = bounds
    if x.shape[0] < LARGE_WINDOWS:
        labels = _spectral(x, k, lo, hi, seed)
        if k is None:
            labels = merge_close_speakers(labels.astype(np.int64), x, thr, floor=lo)
        return labels
    if k is not None:
        return _kmeans_normalized(x, k, seed)
    labels = merge_close_speakers(_umap_hdbscan(x, seed), x, thr, floor=lo)
    if bounds_given:
        labels = _enforce_bounds(labels, x, lo, hi, seed)
    return labels


def cluster_speakers(embeddings: Any, num_speakers: int | None = None, min_speakers: int | None = None,
                     max_speakers: int | None = None, merge_threshold: float = 0.78, seed: int = 0,
                     clustering: str = DEFAULT_CLUSTERING, ahc_threshold: float = AHC_THRESHOLD) -> np.ndarray:
    """Speaker labels (int64, 0, 1, ... in order of first appearance) of N window embeddings ``[N, D]``.

    ``clustering="funasr"``: FunASR's ``ClusterBackend(merge_thr=0.78)(embeddings, oracle_num=num_speakers)``
    (see the module docstring for the steps and the few places this differs). ``"auto"`` (default): the same,
    except that under 20 windows with the count unknown the count is found by agglomerative clustering (cut at
    ``ahc_threshold``, the mean cosine between two groups' windows) instead of being one. ``num_speakers``:
    exactly that many (no merging); ``min_speakers`` / ``max_speakers``: the range of the count (FunASR's 1 / 15
    when not given); ``merge_threshold``: cosine of two found speakers' centres at which they are merged when the
    count is not given; ``seed``: the random state of k-means and UMAP. Empty input -> empty labels; one window
    -> ``[0]``.

    Raises ValueError for bad options or embeddings that are not a finite 2-D array, ImportError (naming
    ``pip install 'fun-asr[speakers]'``) when scikit-learn, scipy or umap-learn is needed and missing."""
    k, lo_given, hi_given, thr = check_options(num_speakers, min_speakers, max_speakers, merge_threshold)
    check_clustering(clustering, "clustering")
    _check_ahc_threshold_and_seed(ahc_threshold, seed)
    x = _checked_embeddings(embeddings)
    n = x.shape[0]
    if n == 0:
        return np.zeros(0, dtype=np.int64)
    lo = lo_given if lo_given is not None else DEFAULT_MIN_SPEAKERS
    hi = hi_given if hi_given is not None else max(DEFAULT_MAX_SPEAKERS, lo)
    required = k if k is not None else lo
    agglomerative = clustering == "auto" and k is None and n < SMALL_WINDOWS
    if required == 1 and (k is not None or n < SMALL_WINDOWS) and not (agglomerative and n > 1):
        return np.zeros(n, dtype=np.int64)
    if n < required:
        what = f"num_speakers={k}" if k is not None else f"min_speakers={lo}"
        warnings.warn(f"cluster_speakers: {what} asked, but there are only {n} speaker window(s) "
                      f"(1.5 s of speech each): every window is speaker 0", RuntimeWarning, stacklevel=2)
        return np.zeros(n, dtype=np.int64)
    if agglomerative:
        labels = merge_close_speakers(_agglomerative(x, lo, hi, float(ahc_threshold)), x, thr, floor=lo)
    else:
        bounds_given = lo_given is not None or hi_given is not None
        labels = _cluster_funasr(x, k, (lo, hi), thr, seed, bounds_given)
    return canonical_labels(labels)


__all__ = ["AHC_THRESHOLD", "CLUSTERINGS", "DEFAULT_CLUSTERING", "DEFAULT_MAX_SPEAKERS", "DEFAULT_MIN_SPEAKERS",
           "INSTALL_HINT", "LARGE_WINDOWS", "SMALL_WINDOWS", "canonical_labels", "check_clustering", "check_options",
           "cluster_speakers", "merge_close_speakers"]
