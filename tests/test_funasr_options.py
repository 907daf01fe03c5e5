"""FunASR 1.4.16's per-call options: the FSMN-VAD kwargs ``silence_schedule``, ``dynamic_silence`` and
``max_end_silence_time`` (``AutoModel.generate(**kwargs)`` -> ``FsmnVADStreaming.inference``) through
``Session.transcribe``/``transcribe_batch``, fun-asr-transcribe and fun-asr-batch, checked against FunASR's own
VAD code on the real weights; and FunASR's JSONL manifests (``key``, ``source``, ``target``) in fun-asr-batch.

FunASR runs from tests/funasr_ref.py (skipped when funasr 1.4.16 is not importable); the speech clip is
espeak-ng's, as in tests/test_vad_reference.py (skipped without espeak-ng).
"""

from __future__ import annotations

import contextlib
import dataclasses
import io
import json
import re
import shutil
import warnings
from pathlib import Path

import numpy as np
import pytest
import soundfile as sf

import fun_asr
import funasr_ref
from fun_asr.asr.options import VadOptions, check_vad_options, parse_silence_schedule
from fun_asr.jobs import batch
from fun_asr.vad import DEFAULT_SILENCE_SCHEDULE, FsmnVad, VadConfig

pytestmark = pytest.mark.filterwarnings("ignore::fun_asr.notices.TruncatedOutputWarning")

SR = 16000
MAX_SEG_MS = 30000  # FunASR's ASR pipeline: vad_kwargs={"max_single_segment_time": 30000}
INF = float("inf")
needs_funasr = pytest.mark.skipif(not funasr_ref.funasr_available(),
                                  reason="funasr 1.4.16 not importable: " + funasr_ref.INSTALL_LINES[0])
needs_espeak = pytest.mark.skipif(shutil.which("espeak-ng") is None, reason="espeak-ng not installed")

# generate() kwargs, each with a different effect on the clip below (checked in the parity test)
CASES = {
    "default": {},
    "short_first_chunk": {"silence_schedule": [(0, 300), (INF, 1200)]},
    "schedule_off": {"dynamic_silence": False},  # the config's fixed 800 ms, speech_noise_thres 0.6
    "schedule_over_fixed": {"dynamic_silence": True, "max_end_silence_time": 500},  # the schedule wins
    "fixed": {"max_end_silence_time": 500},
    "no_row_past_30s": {"silence_schedule": [(30000, 600)]},  # past the last row: the previous threshold stays
    "three_rows": {"silence_schedule": [(0, 2000), (60000, 150), (INF, 900)]},
}


# --- the options themselves (no model) ------------------------------------------------------------------

def test_one_list_of_transcription_options() -> None:
    """transcribe() and transcribe_batch() take exactly the options Session.options() checks (OptionArgs), and an
    unknown one is refused naming the call and the accepted options."""
    import inspect

    from fun_asr.asr.options import OptionArgs, check_option_names

    checked = [n for n in inspect.signature(fun_asr.Session.options).parameters if n != "self"]
    assert checked == list(OptionArgs.__annotations__)
    for method in (fun_asr.Session.transcribe, fun_asr.Session.transcribe_batch):
        params = inspect.signature(method).parameters
        assert params["options"].kind is inspect.Parameter.VAR_KEYWORD and not set(params) & set(checked)
    check_option_names({"language": "en", "diarize": True}, "transcribe")
    with pytest.raises(TypeError, match=r"transcribe\(\) got an unexpected keyword argument 'langauge'; .*language"):
        check_option_names({"langauge": "en"}, "transcribe")


def test_option_checks_and_formats() -> None:
    sched = ((10000.0, 2000), (20000.0, 1000), (INF, 100))
    assert parse_silence_schedule("10000:2000, 20000:1000, inf:100") == sched
    assert parse_silence_schedule('[[10000, 2000], [20000, 1000], ["inf", 100]]') == sched
    opts = check_vad_options([(10000, 2000), (20000, 1000), (INF, 100)])
    assert opts.silence_schedule == sched and opts.dynamic_silence is None and opts.given
    # JSON-ready, and back
    assert opts.to_dict() == {"silence_schedule": [[10000, 2000], [20000, 1000], ["inf", 100]]}
    assert check_vad_options(**json.loads(json.dumps(opts.to_dict()))) == opts
    assert not check_vad_options().given and check_vad_options().to_dict() == {}
    bad = [({"silence_schedule": []}, ValueError, "is empty"),
           ({"silence_schedule": 5}, TypeError, r"list of \(accumulated_speech_ms, silence_ms\) pairs"),
           ({"silence_schedule": [(10, 20, 30)]}, TypeError, r"silence_schedule\[0\] must be a pair"),
           ({"silence_schedule": [(1000, 200), (1000, 100)]}, ValueError, "the limits must increase"),
           ({"silence_schedule": [(-1, 200)]}, ValueError, "accumulated_speech_ms must be a number >= 0"),
           ({"silence_schedule": [(INF, 150.5)]}, ValueError, "whole number of milliseconds"),
           ({"silence_schedule": [(INF, True)]}, ValueError, "silence_ms"),
           ({"silence_schedule": "1000-200"}, ValueError, "write accumulated_speech_ms:silence_ms"),
           ({"silence_schedule": "[[1000, 200]"}, ValueError, "not JSON"),
           ({"dynamic_silence": "yes"}, TypeError, "dynamic_silence must be True, False or None"),
           ({"max_end_silence_time": 800.0}, ValueError, "max_end_silence_time must be a whole number"),
           ({"max_end_silence_time": -5}, ValueError, "between 0 and"),
           ({"silence_schedule": [(INF, 100)], "dynamic_silence": False}, ValueError,
            r"only used by the dynamic end-silence schedule, which is off here \(dynamic_silence=False\)"),
           ({"silence_schedule": [(INF, 100)], "max_end_silence_time": 500}, ValueError,
            "max_end_silence_time turns it off")]
    for kw, exc, msg in bad:
        with pytest.raises(exc, match=msg):
            check_vad_options(**kw)
    # the schedule on with a fixed end silence is FunASR's too (the schedule then overrides it)
    assert check_vad_options([(INF, 100)], True, 500).to_dict() == {
        "silence_schedule": [["inf", 100]], "dynamic_silence": True, "max_end_silence_time": 500}


@pytest.mark.parametrize("dynamic_silence", [None, True, False])
@pytest.mark.parametrize("max_end_silence_time", [None, 500])
def test_config_follows_funasr_switch(dynamic_silence: bool | None, max_end_silence_time: int | None) -> None:
    """``VadConfig.dynamic`` is FunASR's ``kwargs.get("dynamic_silence", kwargs.get("max_end_silence_time") is
    None)``; the starting end silence is init_cache's (the given max_end_silence_time, else the config's)."""
    kwargs = {k: v for k, v in (("dynamic_silence", dynamic_silence),
                                ("max_end_silence_time", max_end_silence_time)) if v is not None}
    cfg = check_vad_options(**kwargs).apply(VadConfig())
    assert cfg.dynamic == kwargs.get("dynamic_silence", kwargs.get("max_end_silence_time") is None)
    assert cfg.end_silence_ms == (max_end_silence_time or 800)
    assert cfg.silence_schedule == DEFAULT_SILENCE_SCHEDULE


@pytest.mark.parametrize("key", ["window_size_ms", "max_end_silence_time", "frame_in_ms", "lookback_time_start_point"])
def test_config_null_for_an_integer_option_is_a_clear_error(key: str) -> None:
    """A config.yaml (or a VAD GGUF's stored config) with ``key: null`` where FunASR's option is an integer is
    a ValueError naming the key (the GGUF fuzzer found ``window_size_ms: null`` ending in a TypeError);
    our own ``*_ms`` options whose default is None still take null."""
    with pytest.raises(ValueError, match=f"model_conf.{key} must be int"):
        VadConfig.from_dict({"model_conf": {key: None}})
    cfg = VadConfig.from_dict({"model_conf": {"max_single_segment_ms": None, "max_end_silence_ms": None}})
    assert cfg.max_single_segment_ms is None and cfg.max_end_silence_ms is None


# --- against FunASR 1.4.16 on the real weights ----------------------------------------------------------

@pytest.fixture(scope="module")
def clip() -> np.ndarray:
    """~138 s of espeak-ng speech (three 60 s chunks): 92 s with 0.3-3 s pauses, then 46 s with short ones."""
    if shutil.which("espeak-ng") is None:
        pytest.skip("espeak-ng not installed")
    from test_vad_reference import SENTENCES, _speech_with_pauses, _tts

    utts = [_tts(s) for s in SENTENCES]
    return np.concatenate([_speech_with_pauses(utts, 92, seed=11, pauses=(0.3, 3.0)),
                           _speech_with_pauses(utts, 40, seed=5, pauses=(0.05, 0.5))])


@pytest.fixture(scope="module")
def vad_gguf(vad_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    from fun_asr.converter.vad import convert_vad

    out = tmp_path_factory.mktemp("vad") / "fsmn-vad.gguf"
    convert_vad(vad_dir, out)
    return out


@pytest.fixture(scope="module")
def reference(vad_dir: Path, clip: np.ndarray):  # noqa: ANN201
    """FunASR's ``AutoModel(model=fsmn-vad, max_single_segment_time=30000).generate(input=clip, **kwargs)``
    per case (cached)."""
    cache: dict[str, list[list[int]]] = {}

    def get(case: str) -> list[list[int]]:
        if case not in cache:
            model = funasr_ref.automodel(str(vad_dir), MAX_SEG_MS)
            opts = model.model.vad_opts
            # FunASR's init_cache writes a given max_end_silence_time into the model's own options, where it
            # stays for every later call: put the config's value back around each call
            keep = opts.max_end_silence_time
            try:
                cache[case] = funasr_ref.vad_segments(vad_dir, clip, max_single_segment_time=MAX_SEG_MS,
                                                      **CASES[case])
            finally:
                opts.max_end_silence_time = keep
        return cache[case]

    return get


def _close(ours: list[list[int]], ref: list[list[int]], tol_ms: int = 10) -> None:
    assert len(ours) == len(ref), f"{len(ours)} segments vs FunASR's {len(ref)}:\n{ours}\n{ref}"
    diff = np.abs(np.asarray(ours, np.int64).reshape(-1, 2) - np.asarray(ref, np.int64).reshape(-1, 2))
    assert diff.size == 0 or diff.max() <= tol_ms, f"max boundary difference {diff.max()} ms:\n{ours}\n{ref}"


@needs_funasr
@needs_espeak
def test_vad_segments_match_funasr_per_kwargs(vad_gguf: Path, clip: np.ndarray, reference) -> None:  # noqa: ANN001
    vad = FsmnVad.load(vad_gguf, threads=1)
    base = dataclasses.replace(vad.cfg, max_single_segment_ms=MAX_SEG_MS)
    ours = {}
    for case, kwargs in CASES.items():
        ours[case] = vad.segments(clip, check_vad_options(**kwargs).apply(base))
        _close(ours[case], reference(case))
    # every case is a different segmentation of this clip, except the schedule over a fixed end silence,
    # which is FunASR's default schedule exactly (the options are really exercised)
    groups = {json.dumps(v) for k, v in ours.items() if k != "schedule_over_fixed"}
    assert len(groups) == len(CASES) - 1 and ours["schedule_over_fixed"] == ours["default"]
    assert len(ours["short_first_chunk"][0]) == 2 and ours["short_first_chunk"][0] != ours["default"][0]


def _closed(events: list[list[int]]) -> list[list[int]]:
    """Streaming VAD events ([beg, -1], [-1, end], [beg, end]) -> the closed segments, as DynamicStreamingVAD."""
    out, start = [], None
    for beg, end in events:
        if beg >= 0 and end == -1:
            start = beg
        elif beg == -1:
            out.append([start if start is not None else 0, end])
            start = None
        else:
            out.append([beg, end])
            start = None
    return out


@needs_funasr
@needs_espeak
def test_realtime_schedule_hook_matches_dynamic_streaming_vad(vad_gguf: Path, vad_dir: Path,
                                                              clip: np.ndarray) -> None:
    """The hook for the realtime (VAD-mode) stream: ``FsmnVad.stream(..., schedule="server",
    server_schedule=...)`` is FunASR's ``DynamicStreamingVAD(silence_schedule=...)``."""
    import torch
    from funasr.models.fsmn_vad_streaming.dynamic_vad import DynamicStreamingVAD

    x = clip[: 45 * SR]
    table = [(3000, 500), (INF, 200)]
    model = funasr_ref.automodel(str(vad_dir), MAX_SEG_MS)
    keep = model.model.vad_opts.max_end_silence_time
    try:
        with funasr_ref._isolated():
            dyn = DynamicStreamingVAD(model, silence_schedule=table)
            ref = [list(map(int, seg)) for i in range(0, x.size, 960)
                   for seg in dyn.feed(torch.from_numpy(x[i : i + 960].copy()), is_final=False)]
    finally:
        model.model.vad_opts.max_end_silence_time = keep
    vad = FsmnVad.load(vad_gguf, threads=1)
    cfg = dataclasses.replace(vad.cfg, max_single_segment_ms=MAX_SEG_MS)

    def run(**kw: object) -> list[list[int]]:
        stream = vad.stream(60, cfg, schedule="server", **kw)
        return _closed([ev for i in range(0, x.size, 960) for ev in stream.feed(x[i : i + 960])])

    ours = run(server_schedule=table)
    _close(ours, ref)
    assert len(ours) > len(run())  # shorter end silences than the default table: more, shorter sentences
    with pytest.raises(ValueError, match="server_schedule is the realtime server's table"):
        vad.stream(60, cfg, server_schedule=table)
    with pytest.raises(ValueError, match="server_schedule must be"):
        vad.stream(60, cfg, schedule="server", server_schedule=[("x", 1)])


@pytest.fixture(scope="module")
def session(tiny_gguf, vad_gguf: Path) -> fun_asr.Session:  # noqa: ANN001
    return fun_asr.Session(tiny_gguf("q8_0"), device="cpu", vad="fsmn", vad_model=vad_gguf)


def _segments_ms(result: fun_asr.Transcription) -> list[list[int]]:
    return [[int(round(s.start * 1000)), int(round(s.end * 1000))] for s in result.segments]


@needs_funasr
@needs_espeak
def test_session_passes_the_kwargs(session: fun_asr.Session, clip: np.ndarray, reference) -> None:  # noqa: ANN001
    for case in ("short_first_chunk", "schedule_off", "fixed"):
        kwargs = CASES[case]
        r = session.transcribe(clip, sample_rate=SR, max_new_tokens=1, **kwargs)
        _close(_segments_ms(r), reference(case))
        assert r.segmentation == "vad" and r.options.items() >= check_vad_options(**kwargs).to_dict().items()
    default = session.transcribe(clip, sample_rate=SR, max_new_tokens=1)
    _close(_segments_ms(default), reference("default"))
    assert "silence_schedule" not in default.options and "dynamic_silence" not in default.options
    # transcribe_batch: the same options for every recording; the string form of the CLI too
    rs = session.transcribe_batch([clip, clip[: 40 * SR]], sample_rate=SR, max_new_tokens=1,
                                  silence_schedule="0:300,inf:1200")
    _close(_segments_ms(rs[0]), reference("short_first_chunk"))
    assert rs[1].options["silence_schedule"] == [[0, 300], ["inf", 1200]] and len(rs[1].segments) >= 3


def test_kwargs_need_the_vad(tiny_gguf, vad_gguf: Path) -> None:  # noqa: ANN001
    x = np.zeros(SR, np.float32)
    plain = fun_asr.Session(tiny_gguf("q8_0"), device="cpu", vad=None)
    with pytest.raises(ValueError, match="FSMN-VAD options, but the VAD does not run here .this Session has no VAD"):
        plain.transcribe(x, sample_rate=SR, silence_schedule=[(INF, 500)])
    with_vad = fun_asr.Session(tiny_gguf("q8_0"), device="cpu", vad="fsmn", vad_model=vad_gguf)
    with pytest.raises(ValueError, match=r"dynamic_silence: FSMN-VAD options, but the VAD does not run here \(vad=Fa"):
        with_vad.transcribe(x, sample_rate=SR, vad=False, dynamic_silence=False)
    with pytest.raises(ValueError, match="the limits must increase"):
        with_vad.transcribe_batch([x], sample_rate=SR, silence_schedule=[(5, 1), (5, 2)])
    assert isinstance(with_vad.options(silence_schedule=[(INF, 300)]).vad_options, VadOptions)


# --- the command lines ------------------------------------------------------------------------------

def _run_cli(main, argv: list[str]) -> tuple[int, str, str]:  # noqa: ANN001
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err), warnings.catch_warnings():
        code = main(argv)
    return code, out.getvalue(), err.getvalue()


@needs_funasr
@needs_espeak
def test_transcribe_cli_flags(session: fun_asr.Session, clip: np.ndarray, vad_gguf: Path, tmp_path: Path,
                              reference) -> None:  # noqa: ANN001
    from fun_asr.cli.transcribe import main

    wav = tmp_path / "speech.wav"
    sf.write(wav, clip, SR, subtype="FLOAT")
    common = [str(wav), "-m", str(session.path), "--vad-model", str(vad_gguf), "--device", "cpu",
              "--max-new-tokens", "1", "-f", "json", "--quiet"]
    for flags, case in ((["--silence-schedule", "0:300,inf:1200"], "short_first_chunk"),
                        (["--no-dynamic-silence"], "schedule_off"),
                        (["--dynamic-silence", "--max-end-silence-time", "500"], "schedule_over_fixed")):
        code, out, err = _run_cli(main, common + flags)
        assert code == 0, err
        rec = json.loads(out)
        _close([[int(round(s["start"] * 1000)), int(round(s["end"] * 1000))] for s in rec["segments"]],
               reference(case))
        assert rec["options"].items() >= check_vad_options(**CASES[case]).to_dict().items()
    # usage errors: one line each, before the model loads (-m does not exist)
    for flags, msg in ((["--silence-schedule", "1000-200"], "write accumulated_speech_ms:silence_ms"),
                       (["--silence-schedule", "inf:100", "--no-dynamic-silence"],
                        r"off here \(--no-dynamic-silence\); pass --dynamic-silence to use the schedule"),
                       (["--max-end-silence-time", "-1"], "--max-end-silence-time must be a whole number"),
                       (["--silence-schedule", "inf:100", "--vad", "none"], "drop --vad none"),
                       (["--silence-schedule", "inf:100", "--stream"], "--stream uses the realtime server's")):
        code, out, err = _run_cli(main, [str(wav), "-m", str(tmp_path / "none.gguf"), *flags])
        assert code == 2 and err.count("\n") == 1, err
        assert re.search(msg, err), err


@needs_funasr
@needs_espeak
def test_batch_cli_flags(session: fun_asr.Session, clip: np.ndarray, vad_gguf: Path, tmp_path: Path,
                         reference) -> None:  # noqa: ANN001
    from fun_asr.cli.batch import main

    folder = tmp_path / "in"
    folder.mkdir()
    sf.write(folder / "a.wav", clip, SR, subtype="FLOAT")
    sf.write(folder / "b.wav", clip[: 40 * SR], SR, subtype="FLOAT")
    code, _, err = _run_cli(main, [str(folder), "-o", str(tmp_path / "out"), "-m", str(session.path), "--vad-model",
                                   str(vad_gguf), "--device", "cpu", "--max-new-tokens", "1", "--quiet",
                                   "--silence-schedule", '[[0, 300], ["inf", 1200]]'])
    assert code == 0, err
    recs = batch.read_results(tmp_path / "out")
    _close([[int(round(s["start"] * 1000)), int(round(s["end"] * 1000))] for s in recs["a"]["segments"]],
           reference("short_first_chunk"))
    assert recs["b"]["options"]["silence_schedule"] == [[0, 300], ["inf", 1200]]
    summary = json.loads((tmp_path / "out" / "summary.json").read_text())
    assert summary["last_run"]["options"]["vad_options"] == {"silence_schedule": [[0, 300], ["inf", 1200]]}
    code, _, err = _run_cli(main, [str(folder), "-o", str(tmp_path / "o2"), "-m", str(session.path),
                                   "--dynamic-silence", "--silence-schedule", "5:1,5:2"])
    assert code == 2 and "the limits must increase" in err
    # the library entry point refuses them where no VAD runs
    plain = fun_asr.Session(session.path, device="cpu", vad=None)
    with pytest.raises(ValueError, match="the VAD does not run here"):
        batch.run([folder], tmp_path / "o3", session=plain, max_new_tokens=1, dynamic_silence=False)


# --- FunASR's JSONL manifests -------------------------------------------------------------------------

def test_batch_reads_funasr_jsonl(tiny_gguf, tmp_path: Path) -> None:  # noqa: ANN001
    """FunASR's scp2jsonl lines (``key``, ``source``, ``source_len``, ``target``, ``target_len``; SenseVoice's
    ``text_language`` tags) next to ours: the ids, audio, references and languages arrive."""
    from fun_asr.cli.batch import main

    rng = np.random.default_rng(7)
    paths = []
    for i in range(3):
        p = tmp_path / "wav" / f"utt{i}.wav"
        p.parent.mkdir(exist_ok=True)
        sf.write(p, (0.1 * rng.standard_normal(SR * (i + 1))).astype(np.float32), SR)
        paths.append(p)
    lines = [{"key": "ID0012W0013", "source": str(paths[0]), "source_len": 88,
              "target": "当客户风险承受能力评估依据发生变化时", "target_len": 19},
             {"key": "BAC009S0764W0121", "source": "wav/utt1.wav", "source_len": 110, "target": "hello world",
              "target_len": 2, "text_language": "<|en|>"},
             {"key": "nolang", "source": str(paths[2]), "target": "x", "text_language": "<|nospeech|>"}]
    manifest = tmp_path / "funasr.jsonl"
    manifest.write_text("".join(json.dumps(line, ensure_ascii=False) + "\n" for line in lines), "utf-8")
    items = batch.collect_items([manifest])
    assert [(it.id, it.audio, it.reference, it.language) for it in items] == [
        ("ID0012W0013", str(paths[0]), lines[0]["target"], None),
        ("BAC009S0764W0121", str(paths[1]), "hello world", "en"),  # relative to the manifest's folder
        ("nolang", str(paths[2]), "x", None)]
    # the whole job through the command line: records keyed by FunASR's ids, with their references
    model = tiny_gguf("q8_0")
    code, _, err = _run_cli(main, [str(manifest), "-o", str(tmp_path / "out"), "-m", str(model), "--vad", "none",
                                   "--device", "cpu", "--max-new-tokens", "2", "--quiet"])
    assert code == 0, err
    recs = batch.read_results(tmp_path / "out")
    assert set(recs) == {"ID0012W0013", "BAC009S0764W0121", "nolang"}
    assert recs["ID0012W0013"]["reference"] == lines[0]["target"] and recs["ID0012W0013"]["error"] is None
    assert recs["BAC009S0764W0121"]["options"]["language"] == "en" and recs["nolang"]["options"]["language"] is None
    summary = json.loads((tmp_path / "out" / "summary.json").read_text())
    assert summary["evaluation"]["items"] == 3
    # a FunASR line without its audio says which keys are accepted
    bad = tmp_path / "bad.jsonl"
    bad.write_text(json.dumps({"key": "a", "target": "no audio"}) + "\n")
    with pytest.raises(batch.BatchError, match=r"bad.jsonl:1: no audio path .* source"):
        batch.collect_items([bad])
