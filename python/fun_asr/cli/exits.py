"""The exit codes every fun-asr command uses (README "Exit codes"), and SIGTERM as an exception.

0 everything asked for was done; 1 some inputs failed (each reported on its own line), the rest was done;
2 nothing was done: a bad flag, a missing input, an output that exists, a model that cannot be loaded; fix the
command and run it again; 130 interrupted (Ctrl-C, SIGINT), 143 terminated (SIGTERM): what was finished is kept,
nothing is left half-written.
"""

from __future__ import annotations

import contextlib
import signal
import threading
from collections.abc import Iterator

OK = 0
SOME_FAILED = 1
NOTHING_DONE = 2
INTERRUPTED = 128 + signal.SIGINT  # 130
TERMINATED = 128 + signal.SIGTERM  # 143


class Terminated(BaseException):
    """SIGTERM, raised where the program is (like KeyboardInterrupt for SIGINT), so that cleanup runs."""


def _raise_terminated(signum: int, frame: object) -> None:
    raise Terminated


@contextlib.contextmanager
def terminate_on_sigterm() -> Iterator[None]:
    """While inside: SIGTERM raises :class:`Terminated` in the main thread instead of killing the process
    outright; the handler before it comes back afterwards (a command run in-process leaves none behind)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    before = signal.signal(signal.SIGTERM, _raise_terminated)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, before)
