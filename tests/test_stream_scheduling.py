"""The server's decoder under load: closed sentences before partials, stale partials skipped (serve/batcher.py;
the stream's side is tests/test_stream.py::test_skipped_partials_are_asked_again_and_leave_the_sentences_alone)."""

from __future__ import annotations

import threading
import time
from types import SimpleNamespace

import numpy as np

from fun_asr.serve.batcher import Batcher

FINAL = (None, True, (), 5, 30.0, False, False)
PARTIAL = (None, True, (), 3, 30.0, False, False)


class _Recorder:
    """A session whose transcribe_batch records each batch's names; the first call waits for `gate`."""

    def __init__(self) -> None:
        self.batches: list[list[str]] = []
        self.gate = threading.Event()
        self.started = threading.Event()

    def transcribe_batch(self, audios: list, names: list[str], **_: object) -> list:  # noqa: ANN401
        self.started.set()
        self.gate.wait(30)
        self.batches.append(list(names))
        return [SimpleNamespace(ok=True, text=n, segments=[], timings={}) for n in names]


def test_closed_sentences_go_first_and_stale_partials_are_skipped() -> None:
    rec = _Recorder()
    b = Batcher(rec, max_batch=4, max_new_tokens=5, partial_batch=2, partial_wait_s=0.3)  # type: ignore[arg-type]
    try:
        x = np.zeros(1600, np.float32)
        busy = b.submit(x, FINAL, "busy")
        assert rec.started.wait(10)
        stale = b.submit(x, PARTIAL, "stale", partial=True)
        time.sleep(0.5)  # `stale` has now waited longer than partial_wait_s
        p1 = b.submit(x, PARTIAL, "p1", partial=True)
        f1 = b.submit(x, FINAL, "f1")
        p2 = b.submit(x, PARTIAL, "p2", partial=True)
        p3 = b.submit(x, PARTIAL, "p3", partial=True)
        f2 = b.submit(x, FINAL, "f2")
        rec.gate.set()
        assert busy.result(10).text == "busy"
        assert f1.result(10).text == "f1" and f2.result(10).text == "f2"
        assert [p.result(10).text for p in (p1, p2, p3)] == ["p1", "p2", "p3"]
        assert stale.result(10) is None and b.partials_skipped == 1
        # the finals together first, never with a partial; then the partials, at most partial_batch at once
        assert rec.batches == [["busy"], ["f1", "f2"], ["p1", "p2"], ["p3"]], rec.batches
    finally:
        b.close()
