"""Which calls an interrupt stops: Session.interrupt() and Session.interruptible() (see there)."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager


class RunningCalls:
    """Counts the calls (or blocks) running; ``interrupt()`` raises the flag only while one runs, and the last
    one to end lowers it, so an interrupt stops what runs then (and what starts before those end) and never a
    later call. ``raise_flag`` / ``lower_flag``: the flag the running calls look at (Model.interrupt /
    Model.clear_interrupt)."""

    def __init__(self, raise_flag: Callable[[], object], lower_flag: Callable[[], object]) -> None:
        self._raise, self._lower = raise_flag, lower_flag
        self._count = 0
        self._lock = threading.Lock()

    @contextmanager
    def running(self) -> Iterator[None]:
        with self._lock:
            self._count += 1
        try:
            yield
        finally:
            with self._lock:
                self._count -= 1
                if self._count == 0:
                    self._lower()

    def interrupt(self) -> bool:
        """Raises the flag if a call runs; returns whether one did."""
        with self._lock:
            if self._count:
                self._raise()
            return self._count > 0
