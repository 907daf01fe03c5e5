"""``Session.stream(mode="chunked")``: Fun-ASR-Nano's streaming SDK (720 ms chunks, cumulative re-encoding,
``rollback_chars``, fixed/unfixed text, ``prev_text``) on the tiny trained model, so real words are checked:
the fixed text only ever grows, the final text is ``Session.transcribe`` of the whole clip, feeding sizes do
not matter, long streams roll over to a new window at a pause."""

from __future__ import annotations

import contextlib
import io
import json
import logging
import warnings
from pathlib import Path

import numpy as np
import pytest
import soundfile as sf

import fun_asr
from fun_asr.asr.chunked import ChunkedOptions, ChunkedStream
from fun_asr.audio.decode import AudioError
from trained_model import WORDS, heldout_audio, three_utterances_clip, wer

SR = 16000
CHUNK = SR * 720 // 1000


@pytest.fixture(scope="module")
def session() -> fun_asr.Session:
    logging.getLogger("fun_asr").setLevel(logging.ERROR)  # the demo model's notice
    return fun_asr.Session("demo", device="cpu", progress=False, vad=None)


@pytest.fixture(scope="module")
def clips() -> list[tuple[np.ndarray, str]]:
    return [(x.astype(np.float32) / 32768.0, text) for x, text in heldout_audio()]


def _run(stream: ChunkedStream, x: np.ndarray, piece: int) -> list:
    events = []
    for k in range(0, x.size, piece):
        events += stream.feed(x[k : k + piece])
    return events + stream.close()


def _check_events(events: list, audio_samples: int, chunk: int = CHUNK) -> None:
    """The SDK's shape and the fixed text's promise: each event's text starts with its fixed text, each
    fixed text starts with the one before (never rewritten), the last is final with everything fixed."""
    assert [e.chunk_idx for e in events] == list(range(1, len(events) + 1))
    assert [e.is_final for e in events] == [False] * (len(events) - 1) + [True]
    assert len(events) == audio_samples // chunk + 1  # one per 720 ms boundary, then the final one
    for k, e in enumerate(events[:-1]):
        assert e.audio_duration_ms == (k + 1) * chunk * 1000 / SR
    assert events[-1].audio_duration_ms == audio_samples * 1000 / SR
    for e in events:
        assert e.text.startswith(e.fixed_text) and e.unfixed_text == e.text[len(e.fixed_text):]
    for a, b in zip(events, events[1:], strict=False):
        assert b.fixed_text.startswith(a.fixed_text), (a, b)
    assert events[-1].fixed_text == events[-1].text


def test_fixed_text_grows_and_final_equals_transcribe(session: fun_asr.Session, clips: list) -> None:
    picked = clips[::3]  # 20 held-out clips, 0.9-3.3 s, 1-4 words
    finals, refs, fixed_early = [], [], 0
    for x, ref in picked:
        stream = session.stream(mode="chunked")
        events = _run(stream, x, 1600)
        _check_events(events, x.size)
        want = session.transcribe(x, sample_rate=SR)
        assert events[-1].text == want.text, (ref, [e.to_dict() for e in events])
        fixed_early += any(e.fixed_text for e in events[:-1])
        finals.append(events[-1].text)
        refs.append(ref)
    # real words: the demo model hears them (the held-out WER is 1.78 %), and some clips got fixed text
    # before their end (a text longer than rollback_chars): the fixing is exercised, not only the final
    assert wer(refs, finals) <= 0.05 and all(w in WORDS for t in finals for w in t.split())
    assert fixed_early >= 5


def test_results_do_not_depend_on_feed_sizes(session: fun_asr.Session, clips: list) -> None:
    x = np.concatenate([clips[4][0], clips[7][0]])
    runs = [[e.to_dict() for e in _run(session.stream(mode="chunked"), x, piece)] for piece in (160, 4000, x.size)]
    assert runs[0] == runs[1] == runs[2]
    # int16 bytes, and 8 kHz audio (resampled on the fly) give the same chunk boundaries
    pcm = (np.clip(x, -1, 1) * 32767).astype("<i2").tobytes()
    stream = session.stream(mode="chunked")
    events = [e for k in range(0, len(pcm), 3200) for e in stream.feed(pcm[k : k + 3200])] + stream.close()
    _check_events(events, x.size)
    import soxr

    x8 = soxr.resample(x, SR, 8000).astype(np.float32)
    stream = session.stream(mode="chunked")
    events = [e for k in range(0, x8.size, 800) for e in stream.feed(x8[k : k + 800], sample_rate=8000)]
    events += stream.close()
    assert [e.is_final for e in events].count(True) == 1 and events[-1].text
    assert len(events) == stream.received // CHUNK + 1


def test_sdk_parameters_and_results(session: fun_asr.Session, clips: list) -> None:
    opts = ChunkedOptions()
    assert (opts.chunk_ms, opts.rollback_chars, opts.max_new_tokens) == (720, 8, 200)  # the SDK's defaults
    x = np.concatenate([clips[0][0], clips[2][0]])  # "five two five eight" + "go down seven seven"
    stream = session.stream(mode="chunked", chunk_ms=480, rollback_chars=0)
    assert stream.copts.chunk_ms == 480 and stream.opts.max_new_tokens == 200
    events = _run(stream, x, 2000)
    _check_events(events, x.size, chunk=SR * 480 // 1000)
    # rollback_chars=0: a meaningful text is fixed whole at every chunk
    assert all(e.fixed_text == e.text for e in events if sum(c.isalnum() for c in e.text) >= 2)
    assert set(events[0].to_dict()) == {"text", "fixed_text", "is_final", "chunk_idx", "audio_duration_ms"}
    # the default rollback keeps at least 8 characters unfixed (cut back to a whole token)
    events = _run(session.stream(mode="chunked"), x, 2000)
    before = ["", *[e.fixed_text for e in events]]
    grew = [e for e, fixed in zip(events[:-1], before, strict=False) if e.fixed_text != fixed]
    assert grew and all(len(e.unfixed_text) >= 8 for e in grew)
    # prev_text: the answer starts with it, fixed from the first chunk
    stream = session.stream(mode="chunked", stream_options=ChunkedOptions(prev_text="one"))
    events = _run(stream, clips[1][0], 4000)  # "down"
    assert all(e.fixed_text.startswith("one") for e in events) and events[-1].text.startswith("one")
    assert stream.stats()["forced_tokens"] > 0
    # audio ending on a chunk boundary: the final event is that chunk's decode (not decoded twice)
    y = np.concatenate([clips[2][0], np.zeros(3 * CHUNK, np.float32)])[: 3 * CHUNK]
    stream = session.stream(mode="chunked")
    events = _run(stream, y, CHUNK)
    assert len(events) == 4 and stream.stats()["decodes"] == 3 and events[-1].text == events[-2].text
    assert events[-1].fixed_text == events[-1].text == session.transcribe(y, sample_rate=SR).text
    # nothing at all, and less than a frame of audio: one final event with no text
    for audio in (np.zeros(0, np.float32), np.zeros(100, np.float32)):
        stream = session.stream(mode="chunked")
        events = stream.feed(audio) + stream.close()
        assert [e.to_dict() for e in events] == [{"text": "", "fixed_text": "", "is_final": True, "chunk_idx": 1,
                                                  "audio_duration_ms": audio.size / 16}]
        assert stream.close() == []
        with pytest.raises(RuntimeError, match="closed"):
            stream.feed(audio)


def test_windows_roll_over_at_pauses(session: fun_asr.Session, tmp_path: Path) -> None:
    """Past ``window_seconds`` the window is cut at its quietest point, its text fixed in full, and a new
    window starts there: the fixed text still only grows, and the words are heard."""
    path, words = three_utterances_clip(tmp_path)
    x, _ = sf.read(path, dtype="float32")
    spans = json.loads((tmp_path / "three_utterances.json").read_text())["utterances"]
    stream = session.stream(mode="chunked", stream_options=ChunkedOptions(window_seconds=6.0, search_seconds=2.0))
    events = _run(stream, x, 960)
    _check_events(events, x.size)
    st = stream.stats()
    assert st["windows"] >= 2 and len(stream.cuts) == st["windows"] - 1
    # each cut is in a silence between (or around) the utterances, never inside one
    for cut in stream.cuts:
        assert not any(s["start"] * SR + 800 < cut < s["end"] * SR - 800 for s in spans), (cut / SR, spans)
    assert wer([" ".join(words)], [events[-1].text]) <= 0.25
    # the encoder saw each second of audio several times (cumulative re-encoding), bounded by the window
    assert x.size / SR * 2 < st["encoded_seconds"] < x.size / SR * 6 / 0.72
    assert st["decodes"] >= len(events) - 1 and st["first_fixed_ms"] is not None


def test_mode_and_option_errors(session: fun_asr.Session) -> None:
    with pytest.raises(ValueError, match="mode must be 'vad'"):
        session.stream(mode="sentences")
    with pytest.raises(ValueError, match="chunk_ms and rollback_chars are options of mode='chunked'"):
        session.stream(chunk_ms=720)
    with pytest.raises(ValueError, match="streaming needs the FSMN-VAD"):
        session.stream()  # the VAD mode, the default, is unchanged
    with pytest.raises(ValueError, match="replacement decoder= is for mode='vad' only"):
        session.stream(mode="chunked", decoder=lambda audio, n: ("", []))
    with pytest.raises(TypeError, match="ChunkedOptions"):
        session.stream(mode="chunked", stream_options=object())
    for kw, msg in (({"chunk_ms": 0}, "chunk_ms must be an integer >= 1"),
                    ({"rollback_chars": -1}, "rollback_chars must be an integer >= 0"),
                    ({"max_new_tokens": 0}, "max_new_tokens must be an integer >= 1"),
                    ({"chunk_ms": 20_000}, "must hold at least 4 chunks")):
        with pytest.raises(ValueError, match=msg):
            session.stream(mode="chunked", **kw)
    with pytest.raises(ValueError, match="longer than the encoder's window"):
        session.stream(mode="chunked", stream_options=ChunkedOptions(window_seconds=500.0, search_seconds=5.0))
    stream = session.stream(mode="chunked")
    with pytest.raises(AudioError, match="ambiguous"):  # either layout: transcribe refuses it too
        stream.feed(np.zeros((10, 2), np.float32))
    with pytest.raises(AudioError, match="even byte count"):
        stream.feed(b"\x00\x01\x02")


def test_cli_stream_mode_chunked(session: fun_asr.Session, clips: list, tmp_path: Path) -> None:
    from fun_asr.cli.transcribe import main

    x = np.concatenate([clips[0][0], clips[2][0]])
    wav = tmp_path / "two.wav"
    sf.write(wav, x, SR, subtype="FLOAT")
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err), warnings.catch_warnings():
        code = main([str(wav), "-m", str(session.path), "--vad", "none", "--stream", "--stream-mode", "chunked",
                     "-f", "json", "--quiet"])
    assert code == 0, err.getvalue()
    lines = [json.loads(line) for line in out.getvalue().splitlines()]
    want = [e.to_dict() for e in _run(session.stream(mode="chunked"), x, SR // 10)]
    assert lines == want
    out = io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(io.StringIO()), warnings.catch_warnings():
        assert main([str(wav), "-m", str(session.path), "--vad", "none", "--stream", "--stream-mode", "chunked",
                     "--quiet"]) == 0
    assert out.getvalue() == want[-1]["text"] + "\n"  # off a terminal: the text as it becomes fixed
    err = io.StringIO()
    with contextlib.redirect_stderr(err):
        assert main([str(wav), "-m", "nothing.gguf", "--chunk-ms", "500"]) == 2
    assert "--chunk-ms and --rollback-chars are for --stream --stream-mode chunked" in err.getvalue()


def test_previous_decode_is_a_lossless_draft(session: fun_asr.Session, clips: list) -> None:
    """Each decode of a window takes the window's previous decode (past its fixed tokens) as the draft of
    lossless speculative decoding: the events are exactly those with drafts off (Model.draft_max = 0), and
    draft tokens are kept, so fewer decoder passes run (on 20 clips here: 254 passes instead of 278)."""
    x = np.concatenate([c for c, _ in clips[:8]])  # ~15 s of held-out speech: words to re-decode
    runs = {}
    for draft_max in (4, 0):
        session.model.draft_max = draft_max
        try:
            stream = session.stream(mode="chunked")
            runs[draft_max] = ([e.to_dict() for e in _run(stream, x, 3200)], stream.stats())
        finally:
            session.model.draft_max = 4
    (with_draft, st), (without, st0) = runs[4], runs[0]
    assert with_draft == without
    assert st0["draft_proposed"] == 0 and st0["decode_passes"] > 0
    assert 0 < st["draft_accepted"] <= st["draft_proposed"], st
    assert st["decode_passes"] < st0["decode_passes"], (st, st0)
