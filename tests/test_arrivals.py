"""Recordings that join a running transcribe_batch (Session.transcribe_batch(arrivals=...): a server's requests
arriving mid-batch): each is encoded when a decoder slot frees, its segments' prefills join the running steps, and
every result is delivered as soon as it is ready, with the tokens, texts and word times of the plain batch."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import soundfile as sf

from fun_asr.asr.pipeline import Arrivals


@pytest.mark.filterwarnings("ignore::fun_asr.notices.RecordingFailedWarning")  # the empty input, on purpose
def test_arrivals_join_the_running_batch(ctc_demo, three: Path) -> None:  # noqa: ANN001
    import fun_asr
    from trained_model import heldout_clips
    from vad_fixture import fsmn_vad_dir

    session = fun_asr.Session(str(ctc_demo["f32"]), device="cpu", vad="fsmn", vad_model=fsmn_vad_dir(),
                              progress=False)
    clips = [sf.read(str(p), dtype="float32")[0] for p, _ in heldout_clips(Path(ctc_demo["f32"]).parent / "clips")[:6]]
    speech = sf.read(str(three), dtype="float32")[0]
    inputs = [speech, clips[0], clips[1], np.zeros(0, np.float32), clips[2], speech, clips[3], clips[4], clips[5]]
    names = [f"rec {i}" for i in range(len(inputs))]
    kw = {"sample_rate": 16000, "batch_size": 3, "word_timestamps": True, "language": "en"}
    plain = session.transcribe_batch(inputs, names=names, **kw)

    arriving = list(zip(inputs[2:], names[2:], strict=True))  # all but the first two arrive one per free slot
    asked: list[int] = []
    delivered: list[int] = []
    seen_when_delivered: list[int] = []

    def take(free: int) -> list:
        asked.append(free)
        return [arriving.pop(0)] if arriving else []

    def deliver(index: int, result: fun_asr.Transcription) -> None:
        delivered.append(index)
        seen_when_delivered.append(len(inputs) - 2 - len(arriving))  # arrivals taken by then

    got = session.transcribe_batch(inputs[:2], names=names[:2], arrivals=Arrivals(take, deliver), **kw)
    assert not arriving and sorted(delivered) == list(range(len(inputs))) and all(f >= 1 for f in asked)
    # results come as they are ready: the empty input as soon as it arrived (the second arrival), the first
    # results while arrivals were still to come
    assert seen_when_delivered[delivered.index(3)] == 2 and seen_when_delivered[0] < len(inputs) - 2
    for a, b in zip(plain, got, strict=True):
        assert (a.ok, a.error, a.source) == (b.ok, b.error, b.source)
        assert [s.tokens for s in a.segments] == [s.tokens for s in b.segments] and a.text == b.text
        assert [s.words for s in a.segments] == [s.words for s in b.segments]  # (with their probabilities)
        # each token's log-probability, read as each joined sequence ends (Model.token_logprobs_of): the batch's
        assert [s.token_logprobs for s in a.segments] == [s.token_logprobs for s in b.segments]
        assert [s.no_speech_prob for s in a.segments] == [s.no_speech_prob for s in b.segments]
        assert all(s.token_logprobs and s.no_speech_prob is not None for s in b.segments)
    assert len(got[0].segments) == 3 and got[0].text and not got[3].ok
    with pytest.raises(ValueError, match="not with arrivals"):
        session.transcribe_batch(inputs[:1], drafts=[None], arrivals=Arrivals(take, deliver), **kw)
    with pytest.raises(TypeError, match="Arrivals"):
        session.transcribe_batch(inputs[:1], arrivals=(take, deliver), **kw)  # type: ignore[arg-type]
