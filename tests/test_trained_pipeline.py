"""The trained tiny model behind the real FSMN-VAD: silence + three utterances goes through VAD + ASR and
through streaming to the right words, in the right order, at plausible times."""

from __future__ import annotations

import json

import pytest
import soundfile as sf

import trained_model

pytestmark = pytest.mark.skipif(not (trained_model.ARTIFACT / "manifest.json").is_file(),
                                reason="the trained artifact tests/data/tiny_trained is not present")


@pytest.fixture(scope="module")
def pipeline(tmp_path_factory: pytest.TempPathFactory):  # noqa: ANN201
    import fun_asr
    from vad_fixture import fsmn_vad_dir

    root = tmp_path_factory.mktemp("trained_pipeline")
    ckpt = trained_model.trained_checkpoint(root / "ckpt")
    gguf = root / "trained-f32.gguf"
    fun_asr.convert(ckpt, gguf, "f32", progress=False)
    session = fun_asr.Session(gguf, device="cpu", vad="fsmn", vad_model=fsmn_vad_dir())
    # 3 s of silence at the end: longer than the VAD's end silence (FunASR's schedules use 2000 ms for a
    # sentence this short), so the last segment closes before the audio ends
    clip, words = trained_model.three_utterances_clip(root / "clip", silences=(1.0, 1.6, 1.8, 3.0))
    spans = json.loads((root / "clip" / "three_utterances.json").read_text())["utterances"]
    return session, clip, words, spans


END_SILENCE_S = 2.0  # vad.DEFAULT_SILENCE_SCHEDULE / STREAMING_SILENCE_SCHEDULE for a sentence under 5 s


def _words(text: str) -> list[str]:
    return trained_model.normalize_text(text)


def test_vad_and_asr_hear_three_utterances(pipeline) -> None:  # noqa: ANN001
    session, clip, words, spans = pipeline
    r = session.transcribe(clip, language="en")
    assert r.segmentation == "vad"
    assert _words(r.text) == words, (r.text, words)
    # every VAD segment overlaps an utterance; together they cover each utterance's middle
    for seg in r.segments:
        assert any(seg.start < u["end"] and u["start"] < seg.end for u in spans), (seg, spans)
    for u in spans:
        mid = (u["start"] + u["end"]) / 2
        assert any(seg.start <= mid <= seg.end for seg in r.segments), (u, [(s.start, s.end) for s in r.segments])
    # the silences around produce no text: segments start at most 0.5 s early (look-back) and end at most
    # the end silence (2 s) + 0.1 s after the speech; the last 0.8 s of the clip is in no segment
    assert r.segments[0].start >= spans[0]["start"] - 0.5
    assert r.segments[-1].end <= spans[-1]["end"] + END_SILENCE_S + 0.1
    assert r.segments[-1].end <= r.duration - 0.8


def test_streaming_hears_three_utterances(pipeline) -> None:  # noqa: ANN001
    session, clip, words, spans = pipeline
    x, rate = sf.read(clip, dtype="float32")
    stream = session.stream(language="en")
    events = []
    for i in range(0, x.size, 1600):
        events += stream.feed(x[i : i + 1600], sample_rate=rate)
    events += stream.close()
    sentences = [e for e in events if e.type == "sentence"]
    assert [w for s in sentences for w in _words(s.text)] == words, [s.text for s in sentences]
    starts = [s.start for s in sentences]
    assert starts == sorted(starts) and sentences[0].start / 1000 >= spans[0]["start"] - 0.5
    assert sentences[-1].end / 1000 <= spans[-1]["end"] + END_SILENCE_S + 0.1
    assert sentences[-1].end / 1000 <= x.size / rate - 0.8
    assert any(e.type == "partial" for e in events)
