"""The server's decoder under load: closed sentences before partials, stale partials skipped, running partials
interrupted by a closed sentence (serve/core/batcher.py; the stream's side is
tests/test_stream.py::test_skipped_partials_are_asked_again_and_leave_the_sentences_alone, Session.interrupt's
is tests/test_interrupt.py)."""

from __future__ import annotations

import threading
import time
from concurrent.futures import Future
from types import SimpleNamespace

import numpy as np

from fun_asr import Interrupted
from fun_asr.asr.interrupts import RunningCalls
from fun_asr.serve.core.batcher import Batcher
from fun_asr.serve.core.requests import DecodeRequest

FINAL = DecodeRequest(None, True, (), 5, 30.0, False, False)
PARTIAL = DecodeRequest(None, True, (), 3, 30.0, False, False)


class _Recorder:
    """A session whose transcribe_batch records each batch's names; the first call waits for `gate`.
    interrupt() / interruptible() as Session's: an interrupt while a call or block runs makes the waiting
    call raise Interrupted (its names go to `interrupted`)."""

    def __init__(self) -> None:
        self.batches: list[list[str]] = []
        self.interrupted: list[list[str]] = []
        self.gate = threading.Event()
        self.started = threading.Event()
        self.flag = threading.Event()
        self.calls = RunningCalls(self.flag.set, self.flag.clear)  # as Session's, on an Event
        self.interruptible = self.calls.running
        self.interrupt = self.calls.interrupt

    def transcribe_batch(self, audios: list, names: list[str], **_: object) -> list:  # noqa: ANN401
        with self.interruptible():
            self.started.set()
            while not self.gate.wait(0.005):
                if self.flag.is_set():
                    self.interrupted.append(list(names))
                    raise Interrupted("interrupted")
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


def test_a_closed_sentence_interrupts_running_partials() -> None:
    rec = _Recorder()
    b = Batcher(rec, max_batch=4, max_new_tokens=5, partial_batch=2)  # type: ignore[arg-type]
    try:
        x = np.zeros(1600, np.float32)
        p1 = b.submit(x, PARTIAL, "p1", partial=True)
        assert rec.started.wait(10)
        p2 = b.submit(x, PARTIAL, "p2", partial=True)
        f1 = b.submit(x, FINAL, "f1")  # p1 runs: it gives way
        assert p1.result(10) is None  # interrupted: its stream asks again
        rec.gate.set()
        assert f1.result(10).text == "f1" and p2.result(10).text == "p2"
        assert rec.interrupted == [["p1"]] and rec.batches == [["f1"], ["p2"]], (rec.interrupted, rec.batches)
        assert b.partials_interrupted == 1 and b.partials_skipped == 1
        f2 = b.submit(x, FINAL, "f2")  # no partial runs: a final never interrupts anything else
        assert f2.result(10).text == "f2" and rec.interrupted == [["p1"]]
    finally:
        b.close()


def test_partials_taken_while_a_final_waits_are_not_started() -> None:
    rec = _Recorder()
    rec.gate.set()
    b = Batcher(rec, max_batch=4, max_new_tokens=5)  # type: ignore[arg-type]
    b.close()  # no worker: the test plays it
    x = np.zeros(1600, np.float32)
    b.jobs.put((FINAL, (x, "f", None), Future(), "final", time.monotonic()))  # came after the partial was taken
    partial: Future = Future()
    b._run([(PARTIAL, (x, "p", None), partial, "partial", time.monotonic())])
    assert partial.result(0) is None and rec.batches == [] and b.partials_interrupted == 1
    b.jobs.get_nowait()
    partial = Future()
    b._run([(PARTIAL, (x, "p", None), partial, "partial", time.monotonic())])
    assert partial.result(0).text == "p" and rec.batches == [["p"]]


def test_speculative_closing_decodes_come_after_finals_and_before_partials() -> None:
    rec = _Recorder()
    b = Batcher(rec, max_batch=4, max_new_tokens=5, partial_batch=1, partial_wait_s=0.3)  # type: ignore[arg-type]
    try:
        x = np.zeros(1600, np.float32)
        p0 = b.submit(x, PARTIAL, "p0", partial=True)
        assert rec.started.wait(10)
        rec.started.clear()
        s0 = b.submit(x, PARTIAL, "s0", partial=True, speculative=True)  # interrupts p0, as a final would
        assert p0.result(10) is None and rec.interrupted == [["p0"]]
        assert b.partials_interrupted == 1
        assert rec.started.wait(10)  # s0 runs
        busy = b.submit(x, FINAL, "busy")  # s0 runs (gate closed); busy waits behind it: s0 is not interrupted
        time.sleep(0.5)  # s1 will have waited longer than partial_wait_s: a speculative decode is never skipped
        p1 = b.submit(x, PARTIAL, "p1", partial=True)
        s1 = b.submit(x, PARTIAL, "s1", partial=True, speculative=True)
        f1 = b.submit(x, FINAL, "f1")
        time.sleep(0.4)
        rec.gate.set()
        assert s0.result(10).text == "s0" and busy.result(10).text == "busy" and f1.result(10).text == "f1"
        assert s1.result(10).text == "s1"
        assert p1.result(10) is None  # stale by then: skipped
        assert rec.batches == [["s0"], ["busy", "f1"], ["s1"]], rec.batches
        assert rec.interrupted == [["p0"]]
    finally:
        b.close()


def test_a_partial_interrupted_from_outside_is_skipped_and_the_worker_goes_on() -> None:
    rec = _Recorder()
    b = Batcher(rec, max_batch=4, max_new_tokens=5, interrupt_partials=False)  # type: ignore[arg-type]
    try:
        x = np.zeros(1600, np.float32)
        p = b.submit(x, PARTIAL, "p", partial=True)
        assert rec.started.wait(10)
        f = b.submit(x, FINAL, "f")  # interrupt_partials off: the final does not interrupt
        time.sleep(0.05)
        assert not p.done()
        assert rec.interrupt()  # someone else interrupts the session
        assert p.result(10) is None and b.partials_interrupted == 1
        rec.gate.set()
        assert f.result(10).text == "f" and b.submit(x, FINAL, "g").result(10).text == "g"
    finally:
        b.close()


def test_close_answers_what_waits_even_beside_cancelled_requests() -> None:
    """Shutting down answers every waiting request RuntimeError, also when a waiter already cancelled its own
    (setting a cancelled future's exception raises: the requests after it went unanswered), and a request
    after close() is refused at once instead of waiting forever."""
    rec = _Recorder()
    b = Batcher(rec, max_batch=4, max_new_tokens=5, partial_batch=2)  # type: ignore[arg-type]
    b.interrupt_partials = False  # the finals below wait for the running call instead of interrupting it
    x = np.zeros(1600, np.float32)
    busy = b.submit(x, FINAL, "busy")
    assert rec.started.wait(10)
    gone = b.submit(x, PARTIAL, "gone", partial=True)
    left = b.submit(x, PARTIAL, "left", partial=True)
    final = b.submit(x, FINAL, "final")
    assert gone.cancel()
    closing = threading.Thread(target=b.close)
    closing.start()
    time.sleep(0.1)
    rec.gate.set()
    closing.join(20)
    assert not closing.is_alive() and not b.thread.is_alive()
    assert busy.result(1).text == "busy" and final.result(1).text == "final"  # the batch it was on, and one more
    assert isinstance(left.exception(1), RuntimeError) and "shutting down" in str(left.exception())
    assert gone.cancelled()
    try:
        b.submit(x, FINAL, "late")
    except RuntimeError as exc:
        assert "shutting down" in str(exc)
    else:
        raise AssertionError("a request after close() was accepted")
    b.close()  # twice is harmless


class _Joiner(_Recorder):
    """A _Recorder whose batches take arrivals once the gate opens (as Session.transcribe_batch does whenever a
    decoder slot frees): `batches` records each call's names followed by the names that joined it."""

    def transcribe_batch(self, audios: list, names: list[str], arrivals: object = None,  # noqa: ANN401
                         **kw: object) -> list:
        out = super().transcribe_batch(audios, names, **kw)
        if arrivals is not None:
            joined = arrivals.take(4)  # type: ignore[attr-defined]
            self.batches[-1] += [name for _, name in joined]
            for i, (_, name) in enumerate(joined):
                arrivals.deliver(len(names) + i, SimpleNamespace(ok=True, text=name, segments=[], timings={}))  # type: ignore[attr-defined]
            out += [SimpleNamespace(ok=True, text=name, segments=[], timings={}) for _, name in joined]
        return out


def test_requests_join_a_running_batch_first_come_first_served() -> None:
    """Finals with the running batch's options join it; one with other options that waits before them stops the
    joining (it goes next, then the rest); partials never join."""
    other = DecodeRequest("en", True, (), 5, 30.0, False, False)
    rec = _Joiner()
    b = Batcher(rec, max_batch=4, max_new_tokens=5)  # type: ignore[arg-type]
    try:
        x = np.zeros(1600, np.float32)
        busy = b.submit(x, FINAL, "busy")
        assert rec.started.wait(10)
        futures = [b.submit(x, FINAL, "a1"), b.submit(x, FINAL, "a2"), b.submit(x, PARTIAL, "p", partial=True)]
        time.sleep(0.05)
        rec.gate.set()
        assert busy.result(10).text == "busy" and [f.result(10).text for f in futures] == ["a1", "a2", "p"]
        assert rec.batches[0] == ["busy", "a1", "a2"] and b.joined == 2, rec.batches
        rec.gate.clear()
        rec.started.clear()
        busy = b.submit(x, FINAL, "busy2")
        assert rec.started.wait(10)
        futures = [b.submit(x, other, "o1"), b.submit(x, FINAL, "a3")]
        time.sleep(0.05)
        rec.gate.set()
        assert [f.result(10).text for f in [busy, *futures]] == ["busy2", "o1", "a3"]
        assert rec.batches[-3:] == [["busy2"], ["o1"], ["a3"]], rec.batches
    finally:
        b.close()


def test_close_while_a_joining_batch_runs_ends_the_worker() -> None:
    """close() while a batch that takes arrivals runs: its joining sees the end mark and takes nothing more, the
    request that waited is decoded as the one more batch, and the worker ends (close returns)."""
    rec = _Joiner()
    b = Batcher(rec, max_batch=4, max_new_tokens=5)  # type: ignore[arg-type]
    x = np.zeros(1600, np.float32)
    busy = b.submit(x, FINAL, "busy")
    assert rec.started.wait(10)
    later = b.submit(x, FINAL, "later")
    closer = threading.Thread(target=b.close)
    closer.start()
    time.sleep(0.05)  # the end mark is queued behind `later`
    rec.gate.set()
    closer.join(20)
    assert not closer.is_alive() and not b.thread.is_alive()
    assert busy.result(1).text == "busy" and later.result(1).text == "later"
    assert rec.batches == [["busy"], ["later"]], rec.batches
