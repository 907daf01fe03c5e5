"""The server's decoder under load: closed sentences before partials, stale partials skipped (serve/batcher.py,
asr/stream.py)."""

from __future__ import annotations

import threading
import time
from concurrent.futures import Future
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import soundfile as sf

from fun_asr.asr.stream import StreamOptions
from fun_asr.serve.batcher import Batcher

pytestmark = pytest.mark.filterwarnings("ignore::fun_asr.notices.TruncatedOutputWarning")

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"
SR = 16000
OPTS = StreamOptions(max_new_tokens=5, partial_max_new_tokens=3)
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
        fresh: list[Future] = []
        stale = b.submit(x, PARTIAL, "stale", partial=True)
        time.sleep(0.5)  # `stale` has now waited longer than partial_wait_s
        p1 = b.submit(x, PARTIAL, "p1", partial=True)
        f1 = b.submit(x, FINAL, "f1")
        p2 = b.submit(x, PARTIAL, "p2", partial=True)
        p3 = b.submit(x, PARTIAL, "p3", partial=True)
        f2 = b.submit(x, FINAL, "f2")
        fresh += [p1, p2, p3]
        rec.gate.set()
        assert busy.result(10).text == "busy"
        assert f1.result(10).text == "f1" and f2.result(10).text == "f2"
        assert [p.result(10).text for p in fresh] == ["p1", "p2", "p3"]
        assert stale.result(10) is None and b.partials_skipped == 1
        # the finals together first, never with a partial; then the partials, at most partial_batch at once
        assert rec.batches == [["busy"], ["f1", "f2"], ["p1", "p2"], ["p3"]], rec.batches
    finally:
        b.close()


def _conversation() -> np.ndarray:
    rng = np.random.default_rng(5)
    quiet = lambda s: (2e-4 * rng.standard_normal(int(s * SR))).astype(np.float32)  # noqa: E731
    load = lambda n: sf.read(EXAMPLES / n, dtype="float32")[0]  # noqa: E731
    return np.concatenate([quiet(1.0), load("en_hello.wav"), quiet(2.6), load("zh_weather.wav"), quiet(3.0),
                           load("ja_hello.wav"), quiet(1.2)])


@pytest.fixture(scope="module")
def session(tiny_gguf, vad_dir: Path, tmp_path_factory: pytest.TempPathFactory):  # noqa: ANN001, ANN201
    import fun_asr
    from fun_asr.converter.vad import convert_vad

    out = tmp_path_factory.mktemp("schedvad") / "vad.gguf"
    convert_vad(vad_dir, out)
    return fun_asr.Session(tiny_gguf("f32"), device="cpu", vad="fsmn", vad_model=out)


def _feed(st, x: np.ndarray, chunk: int = 960) -> list:  # noqa: ANN001
    events = []
    for i in range(0, x.size, chunk):
        events += st.feed(x[i : i + chunk])
    return events + st.close()


def _sentences(events: list) -> list[tuple]:
    return [(e.text, e.start, e.end, tuple(e.tokens)) for e in events if e.type == "sentence"]


def test_skipped_partials_are_asked_again_and_leave_the_sentences_alone(session) -> None:  # noqa: ANN001
    x = _conversation()
    plain = session.stream(stream_options=OPTS, max_new_tokens=5)
    want = _sentences(_feed(plain, x))
    assert len(want) == 3 and plain.partials_decoded >= 3

    # every other partial skipped: asked again at the next 60 ms step (not 960 ms later), sentences unchanged
    calls: list[tuple[int, bool]] = []

    def skipping(audio: np.ndarray, n: int, partial: bool = False) -> tuple[str, list[int]] | None:
        calls.append((audio.size, partial))
        if partial and sum(1 for _, p in calls if p) % 2 == 1:
            return None
        return plain._decode_local(audio, n)

    st = session.stream(stream_options=OPTS, max_new_tokens=5, decoder=skipping)
    assert _sentences(_feed(st, x)) == want
    assert st.partials_skipped >= 2 and st.partials_decoded >= 2
    assert sum(1 for _, p in calls if not p) == 3  # the closed sentences, with partial=False
    skipped_then_retried = [b - a for (a, pa), (b, pb) in zip(calls, calls[1:], strict=False) if pa and pb]
    assert any(0 < d <= 960 for d in skipped_then_retried), skipped_then_retried  # one 60 ms step later
