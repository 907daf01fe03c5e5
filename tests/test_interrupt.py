"""Interrupting a computation from another thread (Model.interrupt, Session.interrupt): it stops at the next
graph node (ggml's CPU abort callback) or decoding step, raises fun_asr.Interrupted (not a RuntimeError), and
leaves the model as it was: the next call gives the same tokens. The server's use of it (a closed sentence
interrupts running partials) is tests/test_stream_scheduling.py."""

from __future__ import annotations

import threading
import time

import numpy as np
import pytest
import soundfile as sf

import fun_asr
from fun_asr import _core


def _prompt(model: _core.Model, n: int) -> np.ndarray:
    rng = np.random.default_rng(0)
    return np.ascontiguousarray(model.embed(rng.integers(0, 151643, n).tolist()))


def _prefill_nodes(model: _core.Model) -> int:
    return sum(int(e["count"]) for key, e in model.profile().items() if key.startswith("prefill/"))


def test_model_interrupt_stops_before_and_between_steps(wide_gguf) -> None:  # noqa: ANN001
    m = fun_asr.load_model(wide_gguf("q8_0"), threads=2)
    p = _prompt(m, 40)
    (ref, reason), = m.generate_batch([p], 6, [])
    m.interrupt()
    assert m.interrupt_requested
    with pytest.raises(fun_asr.Interrupted):
        m.generate_batch([p], 6, [])
    assert not issubclass(fun_asr.Interrupted, RuntimeError)  # callers' error handling leaves it alone
    m.clear_interrupt()
    seen: list[int] = []

    def on_step(produced: int, active: int) -> None:
        seen.append(produced)
        if produced == 2:
            m.interrupt()

    with pytest.raises(fun_asr.Interrupted):
        m.generate_batch([p], 6, [], on_step=on_step)
    assert seen == [0, 1, 2]  # the step after the interrupt was not computed
    with pytest.raises(fun_asr.Interrupted):  # the request holds until withdrawn
        m.generate_batch([p], 6, [])
    m.clear_interrupt()
    assert m.generate_batch([p], 6, []) == [(ref, reason)]


def test_model_interrupt_stops_a_graph_between_nodes(wide_gguf) -> None:  # noqa: ANN001
    """A long prefill (one graph) interrupted from another thread a quarter of the way in: the graph stops
    part-way (the profile counts fewer nodes than a whole prefill, and more than none)."""
    m = fun_asr.load_model(wide_gguf("q8_0"), threads=2)
    p = _prompt(m, 1500)
    m.profiling = True
    t0 = time.perf_counter()
    (ref, _), = m.generate_batch([p], 1, [])
    whole_s = time.perf_counter() - t0
    whole = _prefill_nodes(m)
    outcomes = []
    for attempt in range(4):  # a machine that stalls the worker past the interrupt makes it stop before node 0
        m.reset_profile()
        out: list[str] = []

        def work(out: list[str] = out) -> None:
            try:
                m.generate_batch([p], 1, [])
                out.append("finished")
            except fun_asr.Interrupted:
                out.append("interrupted")

        worker = threading.Thread(target=work)
        worker.start()
        time.sleep(whole_s / 4 * (attempt + 1) / 2)
        m.interrupt()
        worker.join(60)
        m.clear_interrupt()
        outcomes.append((out, _prefill_nodes(m), whole))
        if out == ["interrupted"] and 0 < _prefill_nodes(m) < whole:
            break
    else:
        pytest.fail(f"no prefill stopped part-way: {outcomes}")
    m.profiling = False
    assert m.generate_batch([p], 1, [])[0][0] == ref


def test_session_interrupt_and_interruptible(demo, three) -> None:  # noqa: ANN001
    x, rate = sf.read(three, dtype="float32")
    x = x[: rate * 3]
    ref = demo.transcribe(x, sample_rate=rate, vad=False)
    assert demo.interrupt() is False  # nothing runs: nothing happens
    assert demo.transcribe(x, sample_rate=rate, vad=False).text == ref.text
    with demo.interruptible():  # an interrupt before the call starts is not lost
        assert demo.interrupt() is True
        with pytest.raises(fun_asr.Interrupted):
            demo.transcribe(x, sample_rate=rate, vad=False)
        with pytest.raises(fun_asr.Interrupted):  # the whole call stops (not one failed recording)
            demo.transcribe_batch([x, x], sample_rate=rate, vad=False)
    again = demo.transcribe(x, sample_rate=rate, vad=False)
    assert again.text == ref.text and [s.tokens for s in again.segments] == [s.tokens for s in ref.segments]


def test_session_interrupt_from_another_thread(demo, three) -> None:  # noqa: ANN001
    x, rate = sf.read(three, dtype="float32")
    ref = demo.transcribe(x, sample_rate=rate)
    results: list[object] = []

    def work() -> None:
        for _ in range(200):  # until one is interrupted (one that ends before the interrupt lands is fine)
            try:
                demo.transcribe(x, sample_rate=rate)
            except fun_asr.Interrupted as exc:
                results.append(exc)
                return
        results.append("never interrupted")

    worker = threading.Thread(target=work)
    worker.start()
    while worker.is_alive() and not results:
        demo.interrupt()
        time.sleep(0.002)
    worker.join(120)
    assert len(results) == 1 and isinstance(results[0], fun_asr.Interrupted), results
    assert demo.transcribe(x, sample_rate=rate).text == ref.text
