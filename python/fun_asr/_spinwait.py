"""libgomp's spin count from a wait in microseconds, set before fun_asr._core (and libgomp) loads.

ggml's CPU backend synchronises its threads with an OpenMP barrier after every graph node (~700 per
decoded token); libgomp spins GOMP_SPINCOUNT times at each before sleeping (300,000 by default).
When another process holds a core (a busy laptop, CI beside a build) the spinning thread steals the
time slice the late thread needs. Measured on 2 cores beside one busy process (Q4_K_M, 10 s clip,
2 threads): the default spin 7.8 s encode instead of 1.6 s; 10,000 spins 4.0x the quiet time;
500 spins (~14 us here) 1.8x with the quiet speed kept; 300 or fewer (<= 8 us) lose quiet speed.
The count is set from a wait in microseconds (FUN_ASR_SPIN_US, default 15) and this CPU's time per
spin iteration (a `pause` takes ~3 ns on older Intel cores, ~30 ns on AMD Zen, ~45 ns on newer
Intel), measured by fun_asr._spin (no libgomp) before the extension (and libgomp) loads. An explicit
OMP_WAIT_POLICY or GOMP_SPINCOUNT from the user wins.
"""

from __future__ import annotations

import os as _os


def set_spin_count() -> None:
    """Sets GOMP_SPINCOUNT (unless the user set it or OMP_WAIT_POLICY) from FUN_ASR_SPIN_US and this CPU."""
    import warnings

    try:
        spin_us = float(_os.environ.get("FUN_ASR_SPIN_US", "15"))
        if not 0.0 <= spin_us <= 100_000.0:
            raise ValueError
    except ValueError:
        warnings.warn(f"FUN_ASR_SPIN_US={_os.environ['FUN_ASR_SPIN_US']!r} is not a number of microseconds "
                      "(0 to 100000); using 15", stacklevel=3)
        spin_us = 15.0
    try:
        from fun_asr import _spin

        ns = _spin.spin_ns()
    except ImportError:  # an install without the probe module (an old build): the count this CPU measured
        ns = 28.0
    _os.environ["GOMP_SPINCOUNT"] = str(max(50, min(1_000_000, round(spin_us * 1000.0 / max(ns, 0.5)))))
