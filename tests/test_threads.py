"""Thread counts: the numbers never depend on them, and threads=0 (auto) picks by timing.

threads=0 times decode steps with each candidate count now and then (runtime/thread_chooser.h) and
gives steps, encoder passes and prefills the fastest: on a shared CPU fewer threads than cores can be
faster (a graph's threads wait for the one that lost its core at every barrier). Switching the count
between steps is only safe because every kernel's result for an element does not depend on how rows
are split among threads: checked here bit for bit, decode and encoder, for every package type.
The policy itself is checked on synthetic timings (timings of a real run are never asserted).
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable

import numpy as np
import pytest

from fun_asr import _core

pytestmark = pytest.mark.filterwarnings("ignore::fun_asr.notices.TruncatedOutputWarning")



def _prompts(model: _core.Model) -> list[np.ndarray]:
    d = model.info()["decoder"]["d_model"]
    rng = np.random.default_rng(11)
    out = []
    for n in (9, 33):
        ids = rng.integers(0, 151643, n).tolist()
        out.append(np.ascontiguousarray(model.embed(ids) + 0.5 * rng.standard_normal((n, d)).astype(np.float32)))
    return out


@pytest.mark.parametrize("package", ["f32", "q8_0", "q4_k_m"])  # the fp, int8 and repacked kernels
def test_thread_count_changes_no_number(package: str, wide_gguf) -> None:  # noqa: ANN001
    """Logits rows (digests) and tokens of decoding, and the encoder's output, are bit-identical with 1 and 2
    threads and with threads=0, whose steps switch counts (its probes run with the other count); 3 threads
    (rows split unevenly) for Q4_K_M, whose repacked 8-row groups are the unevenest split."""
    path = str(wide_gguf(package))
    feats = np.random.default_rng(2).standard_normal((41, 560)).astype(np.float32)
    results = {}
    counts = (1, 2, 3, 0) if package == "q4_k_m" else (1, 2, 0)
    for threads in counts:
        model = _core.load_gguf(path, device="cpu", threads=threads)
        model.logit_digests = True
        ps = _prompts(model)
        out = model.generate_batch(ps, 40, [])  # 40 steps: two probes under threads=0
        one = model.generate_batch(ps[:1], 40, [])
        results[threads] = ([t for t, _ in out], model.last_logit_digests(), one[0][0],
                            model.encode(feats).tobytes())
        if threads == 0 and (os.cpu_count() or 1) > 1:
            choice = model.thread_choice()
            assert choice["auto"] and choice["probes"] >= 4, choice
            assert all(ms > 0 for ms in choice["step_ms"][:2]), choice  # both counts were timed
    for threads in counts[1:]:
        assert results[threads][0] == results[1][0], f"tokens differ with {threads} threads"
        assert results[threads][1] == results[1][1], f"logits differ with {threads} threads"
        assert results[threads][2] == results[1][2]
        assert results[threads][3] == results[1][3], f"encoder output differs with {threads} threads"


def test_candidates() -> None:
    assert _core.ThreadChooser(1).candidates == [1]
    assert _core.ThreadChooser(2).candidates == [2, 1]
    assert _core.ThreadChooser(3).candidates == [3, 2, 1]
    assert _core.ThreadChooser(8).candidates == [8, 7, 4, 2, 1]
    assert _core.ThreadChooser(16).candidates == [16, 15, 8, 4, 2, 1]
    with pytest.raises(ValueError, match="max_threads"):
        _core.ThreadChooser(0)


def _drive(chooser: _core.ThreadChooser, cost: Callable[[int], float], steps: int, columns: int = 1) -> list[int]:
    used = []
    for _ in range(steps):
        n = chooser.step_threads()
        used.append(n)
        chooser.record_step(n, columns, cost(n))
    return used


def test_quiet_machine_keeps_all_cores() -> None:
    """Decode 19 ms with 2 threads, 25 ms with 1 (this machine, quiet): all cores, one probe in 16."""
    c = _core.ThreadChooser(2)
    used = _drive(c, {2: 19.0, 1: 25.0}.__getitem__, 64)
    assert c.bulk_threads() == 2
    assert used.count(1) == 64 // c.probe_every  # only the probes
    assert [i + 1 for i, n in enumerate(used) if n == 1] == [16, 32, 48, 64]


def test_busy_machine_moves_to_fewer_threads_and_back() -> None:
    """Beside a busy process (2 threads 34 ms, 1 thread 25 ms) the first probe moves everything to one
    thread; when the machine is quiet again, the next probe of two threads moves it back."""
    c = _core.ThreadChooser(2)
    busy = {2: 34.0, 1: 25.0}.__getitem__
    used = _drive(c, busy, 16)
    assert used[-1] == 1 and c.bulk_threads() == 1
    used = _drive(c, busy, 32)
    assert used.count(2) == 2 and c.bulk_threads() == 1  # probes of 2 threads, still slower
    _drive(c, {2: 19.0, 1: 25.0}.__getitem__, 16)
    assert c.bulk_threads() == 2


def test_a_small_difference_does_not_switch() -> None:
    c = _core.ThreadChooser(2)
    _drive(c, {2: 20.0, 1: 20.0 * (c.switch_margin + 0.02)}.__getitem__, 64)  # 1 thread 3 % faster
    assert c.bulk_threads() == 2


def test_many_cores_walk_to_the_fastest_count() -> None:
    """16 cores with 4 busy elsewhere: the fastest count is 8 here; probes walk there neighbour by neighbour."""
    c = _core.ThreadChooser(16)
    cost = {16: 60.0, 15: 50.0, 8: 20.0, 4: 30.0, 2: 45.0, 1: 80.0}.__getitem__
    _drive(c, cost, 16 * 12)
    assert c.bulk_threads() == 8


def test_estimates_are_kept_per_column_count() -> None:
    """A server's batch size changes: each column count has its own estimates, so a 4-sequence step is
    never compared with a 1-sequence one, and going back to 1 finds the old estimates."""
    c = _core.ThreadChooser(2)
    _drive(c, {2: 19.0, 1: 25.0}.__getitem__, 16)
    assert c.estimates == [19.0, 25.0]
    c.record_step(1, 4, 30.0)  # 4 sequences, one thread: not comparable with the 1-column 19 ms
    assert c.estimates == [-1.0, 30.0] and c.bulk_threads() == 2
    c.record_step(2, 4, 45.0)
    assert c.bulk_threads() == 1  # at 4 columns one thread measured faster
    c.record_step(2, 1, 19.0)
    assert c.estimates[1] == 25.0 and c.bulk_threads() == 2


def _spin_env(**env: str) -> str:
    child = dict(os.environ)
    for k in ("GOMP_SPINCOUNT", "OMP_WAIT_POLICY", "FUN_ASR_SPIN_US"):
        child.pop(k, None)
    child.update(env)
    r = subprocess.run([sys.executable, "-W", "always", "-c",
                        "import os, fun_asr; print(os.environ.get('GOMP_SPINCOUNT', 'unset'))"],
                       env=child, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    return r.stdout.strip().splitlines()[-1] + ("\n" + r.stderr if r.stderr else "")


def test_spin_count_comes_from_a_wait_in_microseconds() -> None:
    """GOMP_SPINCOUNT = FUN_ASR_SPIN_US (default 15) / this CPU's spin-iteration time, set before libgomp
    loads; the user's own GOMP_SPINCOUNT or OMP_WAIT_POLICY wins; a bad FUN_ASR_SPIN_US is said."""
    from fun_asr import _spin

    ns = _spin.spin_ns()
    assert 0.05 < ns < 5000
    default = int(_spin_env())
    assert 50 <= default <= 1_000_000
    longer = int(_spin_env(FUN_ASR_SPIN_US="60"))
    assert 2.0 < longer / default < 8.0  # 4x the wait (the spin time is measured again: noisy)
    assert _spin_env(GOMP_SPINCOUNT="1234") == "1234"
    assert _spin_env(OMP_WAIT_POLICY="passive") == "unset"
    out = _spin_env(FUN_ASR_SPIN_US="fast")
    assert "FUN_ASR_SPIN_US='fast' is not a number of microseconds" in out
    assert "is not a number of microseconds" in _spin_env(FUN_ASR_SPIN_US="-3")
