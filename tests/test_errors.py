"""Errors as data (fun_asr.errors): each error keeps its code, option, limit and values, stays the built-in exception
it always was, and says itself in each front end's words from the option table and the settings table; no message
is rewritten after the fact. Also the typed request/response models of the HTTP routes."""

from __future__ import annotations

import logging
import pickle
import re
from pathlib import Path

import pytest

from fun_asr.asr.option_table import OPTIONS
from fun_asr.asr.options import check_hotwords, check_lengths, check_vad_options
from fun_asr.asr.pipeline import no_vad_notice
from fun_asr.asr.speakers import no_speaker_model
from fun_asr.audio.decode import AudioError, Limits, too_long
from fun_asr.errors import (
    CODES,
    FRONTS,
    FrontFilter,
    FunAsrError,
    Message,
    OptionError,
    OptionTypeError,
    literal,
    names_input,
    render,
    spell,
)
from fun_asr.speakers.cluster import check_counts

ROOT = Path(__file__).resolve().parents[1]


def _raised(fn, *args, **kwargs) -> FunAsrError:  # noqa: ANN001
    with pytest.raises(FunAsrError) as exc:
        fn(*args, **kwargs)
    return exc.value


def test_hotword_limit_in_every_front_end() -> None:
    exc = _raised(check_hotwords, [f"w{i}" for i in range(201)], Limits())
    assert isinstance(exc, ValueError) and isinstance(exc, OptionError)
    assert (exc.code, exc.option, exc.limit, exc.values) == ("limit.hotwords", "hotwords", "max_hotwords",
                                                             {"count": 201, "most": 200})
    said = {front: render(exc, front) for front in FRONTS}
    assert said == {
        "python": "201 hotwords; at most 200 are accepted (Session(limits=Limits(max_hotwords=...)))",
        "cli": "--hotwords: 201 hotwords; at most 200 are accepted",
        "server-console": "--hotword-file: 201 hotwords; at most 200 are accepted",
        "http-client": "hotwords: 201 hotwords; at most 200 are accepted",
        "websocket": "hotwords: 201 hotwords; at most 200 are accepted"}
    assert str(exc) == said["python"] and exc.args == (said["python"],)
    assert render(exc, "websocket", {"hotwords": "HOTWORDS"}) == "HOTWORDS: 201 hotwords; at most 200 are accepted"


def test_options_are_spelled_from_the_option_table() -> None:
    exc = _raised(check_lengths, 1, 0.5, 60.0, Limits())
    assert render(exc, "cli").startswith(OPTIONS["segment_seconds"].cli + " must be between 1 and 60.00")
    assert render(exc, "server-console").startswith("--max-segment-seconds must")
    assert render(exc, "http-client").startswith("fun-asr-serve --max-segment-seconds must")
    exc = _raised(check_lengths, "x", 30.0, 60.0, Limits())
    assert isinstance(exc, ValueError) and exc.code == "option.range"
    exc = _raised(check_lengths, 1, "x", 60.0, Limits())
    assert isinstance(exc, TypeError) and isinstance(exc, OptionTypeError) and exc.code == "option.type"
    for name, o in OPTIONS.items():  # every option's spelling is the table's
        assert spell(name, "python") == name
        if o.cli is not None:
            assert spell(name, "cli") == o.cli
        if o.form is not None:
            assert spell(name, "http-client") == o.form


def test_values_are_said_as_each_front_end_sets_them() -> None:
    exc = _raised(check_vad_options, [(10000, 2000)], False)
    assert exc.code == "option.needs" and exc.option == "silence_schedule"
    assert render(exc, "cli") == ("--silence-schedule is only used by the dynamic end-silence schedule, which is "
                                  "off here (--no-dynamic-silence); pass --dynamic-silence to use the schedule, or "
                                  "leave --silence-schedule out")
    assert "(dynamic_silence=false); pass dynamic_silence=true" in render(exc, "http-client")
    assert "(dynamic_silence=False); pass dynamic_silence=True" in str(exc)


def test_speaker_counts_and_models() -> None:
    exc = _raised(check_counts, 0)
    assert str(exc) == "num_speakers must be a positive integer or None, got 0"
    assert render(exc, "cli") == ("--num-speakers must be a positive integer, got 0 (omit --num-speakers to have "
                                  "the speakers counted)")
    exc = no_speaker_model("m.gguf")
    assert exc.code == "speaker_model.missing" and exc.option == "speaker_model" and isinstance(exc, ValueError)
    wanted = {"python": "(diarize=True, --diarize, spk=true)", "cli": "(--diarize)",
              "server-console": "(--enable-spk / spk=true)", "http-client": "(spk=true)", "websocket": "(SPK:true)"}
    for front, asked in wanted.items():
        assert f"m.gguf: speaker labels {asked} need" in render(exc, front), front
    assert "(fun-asr-serve --speaker-model: a .gguf" in render(exc, "http-client")


def test_audio_limit_names_the_flag_where_there_is_one() -> None:
    exc = too_long("a.wav", 9.0, 5)
    assert isinstance(exc, AudioError) and exc.code == "limit.audio_seconds" and exc.limit == "max_audio_seconds"
    assert str(exc) == "a.wav: 9.0 s of audio; at most 5 s are accepted (Limits.max_audio_seconds)"
    assert render(exc, "cli") == "a.wav: 9.0 s of audio; at most 5 s are accepted"
    assert render(exc, "server-console").endswith("are accepted (--max-audio-seconds)")
    assert render(exc, "http-client").endswith("are accepted (fun-asr-serve --max-audio-seconds)")
    assert render(too_long("b.wav", None, 5), "python").startswith("b.wav: more than 5 s of audio")


def test_errors_pickle_with_their_data_and_nest() -> None:
    exc = _raised(check_hotwords, ["x" * 101], Limits())
    back = pickle.loads(pickle.dumps(exc))
    assert type(back) is type(exc) and (back.code, back.option, back.limit) == (exc.code, exc.option, exc.limit)
    assert render(back, "cli") == render(exc, "cli")
    nested = Message("{source}: {error}", source="a.wav", error=exc)
    assert render(nested, "cli") == "a.wav: " + render(exc, "cli")
    assert render(pickle.loads(pickle.dumps(nested)), "cli") == render(nested, "cli")
    assert render(ValueError("plain"), "cli") == "plain"  # anything else: as it is
    with pytest.raises(ValueError, match="unknown error code"):
        OptionError("no.such.code", "x")
    assert all(re.fullmatch(r"[a-z_]+\.[a-z_]+", code) for code in CODES)


def test_errors_say_which_input_they_name_as_data(tmp_path: Path) -> None:
    """An error whose message starts with the input's name carries that name (``source``, names_input), through
    pickling too; the OS's errors name theirs in ``filename``; other errors name none."""
    from fun_asr.audio.decode import decode_audio

    for audio, name in ((tmp_path / "none.wav", str(tmp_path / "none.wav")), (tmp_path, str(tmp_path)),
                        (b"", "<audio bytes>"), (b"not audio at all", "<audio bytes>")):
        with pytest.raises((AudioError, FileNotFoundError)) as info:
            decode_audio(audio)
        assert names_input(info.value) == name and str(info.value).startswith(name + ": ")
    long = too_long("a.wav", 9.0, 5)
    assert names_input(long) == "a.wav" and names_input(pickle.loads(pickle.dumps(long))) == "a.wav"
    assert pickle.loads(pickle.dumps(AudioError("b.wav: x", source="b.wav"))).source == "b.wav"
    assert names_input(OSError(2, "No such file or directory", Path("c.wav"))) == "c.wav"
    assert names_input(ValueError("a.wav: named in the text only")) is None
    assert names_input(_raised(check_hotwords, ["x" * 101], Limits())) is None


def test_a_user_value_is_never_a_template() -> None:
    exc = _raised(check_hotwords, ["{o[x]}" * 30], Limits())
    assert "'{o[x]}{o[x]}{o[x]}" in str(exc) and "'{o[x]}{o[x]}{o[x]}" in render(exc, "cli")
    assert Message(literal("/tmp/{a}") + ": {o[vad_model]}").render("cli") == "/tmp/{a}: --vad-model"


def test_notices_carry_their_data() -> None:
    notice = no_vad_notice("/m.gguf")
    assert notice.code == "no_vad" and notice.detail is not None
    assert "give --vad-model (vad_model=)" in notice and "--vad none (vad=None) turns" in notice
    cli = render(notice, "cli")
    assert "give --vad-model, or set" in cli and "; --vad none turns this notice off" in cli
    assert pickle.loads(pickle.dumps(notice)).detail is not None
    warning = UserWarning(notice)
    assert render(warning, "cli") == cli


def test_front_filter_renders_log_arguments(caplog: pytest.LogCaptureFixture) -> None:
    log = logging.getLogger("fun_asr.test_errors")
    handler = logging.Handler()
    seen: list[str] = []
    handler.emit = lambda record: seen.append(record.getMessage())  # type: ignore[method-assign]
    handler.addFilter(FrontFilter("server-console"))
    log.addHandler(handler)
    log.setLevel(logging.WARNING)  # whatever an earlier test left on the "fun_asr" loggers
    log.disabled = False
    try:
        log.warning("%s", no_vad_notice("/m.gguf"))
        log.warning("plain %s", "text")
    finally:
        log.removeHandler(handler)
    assert "vad_model=" not in seen[0] and "give --vad-model, or set" in seen[0] and seen[1] == "plain text"


def test_no_message_is_rewritten_after_the_fact() -> None:
    """The Python API's words are never regex-rewritten into a front end's: no rewriting function is left."""
    sources = "\n".join(p.read_text("utf-8") for p in (ROOT / "python" / "fun_asr").rglob("*.py"))
    for gone in ("def cli_words", "def server_words", "class CliWordsFilter", "def _limit_words",
                 "def _protocol_words", "class _ServerWords", "Limits(max_hotwords=...)))\" in"):
        assert gone not in sources, gone
    assert not (ROOT / "python" / "fun_asr" / "asr" / "messages.py").exists()


def test_http_models_describe_the_answers() -> None:
    """The OpenAI and FunASR routes' request and response models (the OpenAPI schema names them)."""
    pytest.importorskip("fastapi")
    from fun_asr.serve.protocols.funasr_http.models import AsrResponse
    from fun_asr.serve.protocols.openai.models import ModelList, TranscriptionJson, VerboseTranscription

    body = {"text": "hi", "segments": [{"text": "hi", "start": 0.0, "end": 1.0, "avg_logprob": -0.1,
                                        "compression_ratio": 1.0, "no_speech_prob": None}],
            "duration": 1.0, "processing_time": 0.1, "rtf": 0, "warnings": [], "warning_codes": []}
    dumped = AsrResponse.model_validate(body).model_dump(mode="json", exclude_unset=True)
    assert dumped == body and list(dumped) == list(body) and dumped["rtf"] == 0 and type(dumped["rtf"]) is int
    plain = {"object": "list", "data": [{"id": "fun-asr-nano", "object": "model", "created": 1, "owned_by": "x"}]}
    assert ModelList.model_validate(plain).model_dump(exclude_none=True) == plain
    assert TranscriptionJson.model_validate({"text": "", "truncated": False, "input_truncated": False,
                                             "warnings": [], "warning_codes": []}).text == ""
    assert "segments" in VerboseTranscription.model_fields
