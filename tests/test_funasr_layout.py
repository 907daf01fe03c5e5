"""The FunASR / ModelScope checkpoint layout (model.pt + config.yaml + Qwen3-0.6B/) and its CTC head,
checked against funasr 1.4.16's own FunASRNano on the same random weights.

The checkpoint comes from tools/make_funasr_checkpoint.py (funasr's FunASRNano class, random weights, a
BF16 state_dict saved with torch.save as the release). Skipped when funasr 1.4.16 and what its Fun-ASR-Nano
path imports are not installed (see tests/funasr_nano_ref.py).
"""

from __future__ import annotations

import json
import pickle
import shutil
import zipfile
from pathlib import Path

import numpy as np
import pytest
import soundfile as sf

from funasr_nano_ref import funasr_transcribe, nano_reference_available

pytestmark = pytest.mark.skipif(not nano_reference_available(),
                                reason="funasr 1.4.16 (+ six, tiktoken) not installed: see tests/funasr_nano_ref.py")

ROOT = Path(__file__).resolve().parents[1]
CLIPS = {"zh": ROOT / "examples" / "zh_weather.wav", "en": ROOT / "examples" / "en_hello.wav"}
MAX_NEW = 16  # FunASR's max_length; short texts keep the CTC alignment feasible on a few seconds of audio


def _gguf_tensors(path: Path) -> dict[str, tuple[str, bytes]]:
    import gguf

    r = gguf.GGUFReader(path)
    return {t.name: (t.tensor_type.name, bytes(np.asarray(t.data).tobytes())) for t in r.tensors}


def _audio(lang: str) -> np.ndarray:
    x, sr = sf.read(CLIPS[lang], dtype="float32")
    assert sr == 16000
    return x


# -- layout detection and conversion ----------------------------------------------------------------

def test_detect_layout(nano: dict[str, Path], tmp_path: Path) -> None:
    from fun_asr.model.checkpoint import CheckpointError
    from fun_asr.model.funasr_checkpoint import detect_layout

    assert detect_layout(nano["ms"]) == "funasr"
    assert detect_layout(nano["hf"]) == "hf"
    vad = tmp_path / "vad"
    vad.mkdir()
    for f in ("model.pt", "am.mvn"):
        (vad / f).write_bytes(b"x")
    (vad / "config.yaml").write_text("model: FsmnVAD\nencoder: FSMN\n")
    assert detect_layout(vad) == "fsmn_vad"
    other = tmp_path / "other"
    other.mkdir()
    (other / "config.yaml").write_text("model: Paraformer\n")
    (other / "model.pt").write_bytes(b"x")
    with pytest.raises(CheckpointError, match="Accepted: a Hugging Face Fun-ASR-Nano folder"):
        detect_layout(other)


@pytest.mark.parametrize("package", ["f32", "q8_0", "q4_k_m"])
def test_same_tensors_as_the_hf_layout(nano: dict[str, Path], package: str, tmp_path: Path) -> None:
    """Identical weights give identical GGUF tensors from either layout; the FunASR one adds the CTC head."""
    from fun_asr import convert

    paths = {}
    for name in ("ms", "hf"):
        if package == "f32":
            paths[name] = nano[f"{name}-f32"]
        else:
            paths[name] = tmp_path / f"{name}.gguf"
            report = convert(nano[name], paths[name], package, progress=False)
            assert report.layout == {"ms": "funasr", "hf": "hf"}[name]
            assert report.ctc == (name == "ms")
    ms, hf = _gguf_tensors(paths["ms"]), _gguf_tensors(paths["hf"])
    extra = sorted(set(ms) - set(hf))
    assert set(hf) <= set(ms)
    assert all(n.startswith("ctc.") for n in extra) and len(extra) == 4 + 16 * 2 + 2
    different = [n for n in hf if ms[n] != hf[n]]
    assert not different, f"{len(different)} tensors differ, e.g. {different[:3]}"


def test_non_contiguous_model_pt(nano: dict[str, Path], tmp_path: Path) -> None:
    """model.pt tensors stored transposed-in-memory or at a storage offset read the same."""
    from fun_asr import convert
    from fun_asr.model.torch_pickle import iter_tensors, read_pickle
    from make_funasr_checkpoint import derive_checkpoint

    nc = derive_checkpoint(nano["ms"], tmp_path / "nc", non_contiguous=True)
    tensors = dict(iter_tensors(read_pickle(nc / "model.pt")))
    assert sum(not t.is_contiguous for t in tensors.values()) > 10
    assert sum(t.offset > 0 for t in tensors.values()) > 20
    out = convert(nc, tmp_path / "nc.gguf", "f32", progress=False).path
    assert _gguf_tensors(out) == _gguf_tensors(nano["ms-f32"])


def test_metadata_and_prompt_from_config(nano: dict[str, Path], tmp_path: Path) -> None:
    """Hyperparameters from config.yaml + the LLM config; the prompt follows config.yaml's switches."""
    import yaml

    from fun_asr.model.native import model_metadata

    meta = model_metadata(nano["ms-f32"])
    k = "fun_asr_nano."
    assert meta[k + "source.layout"] == "funasr"
    assert meta[k + "adaptor.attention.head_count"] == 8
    assert abs(meta[k + "adaptor.attention.layer_norm_epsilon"] - 1e-12) < 1e-18
    assert meta[k + "encoder.block_count"] == 4 and meta[k + "encoder.tp_block_count"] == 1
    assert list(meta[k + "decoder.eos_token_ids"]) == [151645]  # the LLM config.json, as FunASR's generate
    assert meta[k + "ctc.block_count"] == 2 and meta[k + "ctc.blank_id"] == meta[k + "ctc.vocab_size"] - 1
    assert json.loads(meta[k + "prompt"])["fake_token_len"]["halvings"] == 3
    assert meta[k + "language_table"] == "nano"

    alt = tmp_path / "alt"
    shutil.copytree(nano["ms"], alt)
    conf = yaml.safe_load((alt / "config.yaml").read_text())
    conf["audio_adaptor_conf"]["use_low_frame_rate"] = False
    conf["dataset_conf"]["sys_prompt"] = False
    conf["dataset_conf"]["do_think"] = False
    (alt / "config.yaml").write_text(yaml.safe_dump(conf))
    prompt = json.loads(model_metadata(alt)[k + "prompt"])
    assert prompt["fake_token_len"]["halvings"] == 0
    assert "system" not in prompt["template"] and prompt["template"].endswith("<think>\n\n</think>\n\n")


def test_mlt_language_table(nano: dict[str, Path], tmp_path: Path) -> None:
    from fun_asr.model.funasr_checkpoint import languages_for
    from fun_asr.model.native import model_metadata
    from fun_asr.model.spec import load_spec

    mlt = tmp_path / "hub" / "Fun-ASR-MLT-Nano-2512"
    shutil.copytree(nano["ms"], mlt)
    meta = model_metadata(mlt)
    assert meta["fun_asr_nano.language_table"] == "mlt_nano"
    spec = load_spec()
    table = languages_for(spec, meta["fun_asr_nano.language_table"])
    assert len(table) == 31 and table["ko"]["prompt_name"] == "韩文" and table["sv"]["prompt_name"] == "瑞典语"
    assert languages_for(spec, "nano") == spec["languages"]


def test_config_errors(nano: dict[str, Path], tmp_path: Path) -> None:
    import yaml

    from fun_asr import convert
    from fun_asr.model.checkpoint import CheckpointError

    def variant(name: str, edit) -> Path:  # noqa: ANN001
        d = tmp_path / name
        shutil.copytree(nano["ms"], d)
        conf = yaml.safe_load((d / "config.yaml").read_text())
        edit(conf, d)
        (d / "config.yaml").write_text(yaml.safe_dump(conf))
        return d

    cases = [
        ("shift", lambda c, d: c["audio_encoder_conf"].update(sanm_shfit=1), "sanm_shfit 1 is not supported"),
        ("lfr", lambda c, d: c["frontend_conf"].update(lfr_n=1), "frontend_conf.lfr_n is 1"),
        ("blocks", lambda c, d: c["audio_encoder_conf"].update(num_blocks=5),
         "missing tensor audio_encoder.encoders.2.norm1"),
        ("units", lambda c, d: c["audio_encoder_conf"].update(linear_units=128), "expected .* from config.yaml"),
        ("nollm", lambda c, d: (shutil.rmtree(d / "Qwen3-0.6B"), c["llm_conf"].update(init_param_path="nope")),
         "no LLM folder"),
    ]
    for name, edit, message in cases:
        with pytest.raises(CheckpointError, match=message):
            convert(variant(name, edit), tmp_path / f"{name}.gguf", "f32", progress=False)
    assert not list(tmp_path.glob("*.gguf"))


# -- numbers against FunASR's torch model -----------------------------------------------------------

def test_stages_and_ctc_logprobs_match_funasr(nano: dict[str, Path]) -> None:
    import torch

    from fun_asr import load_model
    from fun_asr.audio.frontend import FrontendConfig, features
    from fun_asr.model.spec import load_spec
    from funasr_ref import automodel

    m = automodel(str(nano["ms"])).model
    feats = features(_audio("zh"), FrontendConfig.from_spec(load_spec()))
    x = torch.from_numpy(feats.copy())[None]  # FunASR scales its input in place
    lens = torch.tensor([feats.shape[0]])
    with torch.no_grad():
        enc, _ = m.encode(x, lens)
        adp, _ = m.audio_adaptor(enc, lens)
        dec, _ = m.ctc_decoder(enc, lens)
        ref = m.ctc.log_softmax(dec)[0].numpy()
    model = load_model(nano["ms-f32"], threads=2)
    info = model.info()["ctc"]
    assert info["available"] and info["reason"] is None and info["vocab"] == ref.shape[1]
    stages = model.debug_stages(feats)
    for name, want in (("enc.out", enc[0]), ("adp.out", adp[0]), ("ctc.dec.out", dec[0])):
        want = want.numpy()
        assert np.abs(stages[name] - want).max() <= 1e-4 * np.abs(want).max(), name
    ours = model.ctc_logprobs(feats)
    assert ours.shape == ref.shape
    assert np.abs(ours - ref).max() <= 1e-4 * np.abs(ref).max()
    adp2, lp2 = model.encode_ctc(feats)
    assert np.array_equal(lp2, ours) and np.array_equal(adp2, model.encode(feats))
    # the folder loads directly too (BF16 matrices stay BF16 there, hence the looser bound)
    direct = load_model(nano["ms"], threads=2)
    assert direct.info()["ctc"]["available"]
    assert np.abs(direct.ctc_logprobs(feats) - ref).max() <= 1e-2 * np.abs(ref).max()


def test_hf_copy_matches_funasr_torch(nano: dict[str, Path]) -> None:
    """The hand-written FunASR -> HF mapping (tools/make_funasr_checkpoint.py) is right: Transformers' model
    on the HF copy computes what FunASR's does (so 'same tensors as the HF layout' means the same model)."""
    import torch
    from transformers import FunAsrNanoForConditionalGeneration

    from fun_asr.audio.frontend import FrontendConfig, features
    from fun_asr.model.spec import load_spec
    from funasr_ref import automodel

    m = automodel(str(nano["ms"])).model
    hf = FunAsrNanoForConditionalGeneration.from_pretrained(nano["hf"], dtype=torch.float32).eval()
    feats = features(_audio("en"), FrontendConfig.from_spec(load_spec()))
    with torch.no_grad():
        enc, lens = m.encode(torch.from_numpy(feats.copy())[None], torch.tensor([feats.shape[0]]))
        adp, _ = m.audio_adaptor(enc, lens)
        mask = torch.ones(1, feats.shape[0], dtype=torch.long)
        h = hf.model.audio_tower(torch.from_numpy(feats.copy())[None], mask).last_hidden_state
        p = hf.model.multi_modal_projector(h, mask)
    assert torch.allclose(h, enc, atol=1e-4 * float(enc.abs().max()))
    assert torch.allclose(p, adp, atol=1e-4 * float(adp.abs().max()))


@pytest.mark.filterwarnings("ignore::fun_asr.notices.TruncatedOutputWarning")  # max_new_tokens=16 on purpose
@pytest.mark.parametrize("lang", ["zh", "en"])
def test_tokens_and_timestamps_match_funasr(nano: dict[str, Path], lang: str) -> None:
    """Our greedy decode gives FunASR's tokens; our CTC alignment gives FunASR 1.4.16's timestamps:
    exactly on FunASR's own CTC posteriors, within one 60 ms frame on ours."""
    from fun_asr import Session
    from fun_asr.asr.ctc import CtcAligner, CtcTokenizer, align, funasr_text
    from fun_asr.audio.frontend import features
    from fun_asr.model.native import model_metadata

    samples = _audio(lang)
    ref = funasr_transcribe(str(nano["ms"]), samples, max_length=MAX_NEW)
    res = ref["result"]
    session = Session(nano["ms-f32"], device="cpu", threads=2, vad=None)
    tr = session.transcribe(samples, sample_rate=16000, max_new_tokens=MAX_NEW, repetition_guard=False)
    assert len(tr.segments) == 1
    tokens = tr.segments[0].tokens
    assert tokens == ref["generated_ids"]
    raw = session.tokenizer.decode([t for t in tokens if t not in session.stop_ids])
    text = funasr_text(raw)
    assert text == res["text"]

    tok = CtcTokenizer.from_metadata(model_metadata(nano["ms-f32"]))
    blank = session.model.info()["ctc"]["blank_id"]
    assert res["timestamps"], "FunASR gave no timestamps: the test text does not fit the audio"
    exact = align(ref["ctc_log_probs"], text, tok, blank)
    assert [w.to_dict() for w in exact] == res["timestamps"]

    feats = features(samples, session.frontend)
    ours = align(session.model.ctc_logprobs(feats), text, tok, blank)
    assert [w.text for w in ours] == [t["token"] for t in res["timestamps"]]
    for w, t in zip(ours, res["timestamps"], strict=True):
        assert abs(w.start - t["start_time"]) <= 0.0601 and abs(w.end - t["end_time"]) <= 0.0601, (w, t)
    # the one-call form a Session uses per segment (times shifted by the segment start)
    aligner = CtcAligner.from_model(session.model, model_metadata(nano["ms-f32"]))
    shifted = aligner.words(session.model, feats, raw, offset_ms=1500)
    assert [(w.text, w.start_ms - 1500, w.end_ms - 1500, w.score) for w in shifted] == \
        [(w.text, w.start_ms, w.end_ms, w.score) for w in ours]


# -- incomplete CTC head, unsafe model.pt ----------------------------------------------------------

def test_missing_ctc_tensor_gives_no_ctc(nano: dict[str, Path], tmp_path: Path) -> None:
    from fun_asr import convert, load_model
    from fun_asr.asr.ctc import CtcTokenizer
    from fun_asr.model.native import model_metadata
    from funasr_ref import automodel
    from make_funasr_checkpoint import derive_checkpoint

    d = derive_checkpoint(nano["ms"], tmp_path / "noctc", drop=["ctc.ctc_lo.bias"])
    report = convert(d, tmp_path / "noctc.gguf", "f32", progress=False)
    assert report.layout == "funasr" and not report.ctc
    assert "lacks 1 of the 38 CTC tensors (ctc.ctc_lo.bias)" in report.ctc_unavailable
    assert "no CTC head: model.pt lacks 1 of the 38" in report.summary()
    tensors = _gguf_tensors(report.path)
    assert not any(n.startswith("ctc.") for n in tensors)
    full = _gguf_tensors(nano["ms-f32"])
    assert all(full[n] == v for n, v in tensors.items())
    for src in (report.path, d):
        model = load_model(src, threads=1)
        info = model.info()["ctc"]
        assert info == {"available": False, "reason": info["reason"]}
        assert "ctc.ctc_lo.bias" in info["reason"]
        with pytest.raises(ValueError, match="no CTC head: model.pt lacks"):
            model.ctc_logprobs(np.zeros((4, 560), np.float32))
    with pytest.raises(ValueError, match="no CTC tokenizer in this model: model.pt lacks"):
        CtcTokenizer.from_metadata(model_metadata(report.path))
    # FunASR 1.4.16 itself drops its CTC head (and so its timestamps) for this checkpoint
    assert automodel(str(d)).model.ctc_decoder is None


def test_forbidden_global_in_model_pt_runs_nothing(nano: dict[str, Path], tmp_path: Path) -> None:
    import os

    from fun_asr import convert, load_model
    from fun_asr.model.checkpoint import CheckpointError
    from fun_asr.model.funasr_checkpoint import detect_layout, open_checkpoint

    class Payload:
        def __init__(self, path: Path) -> None:
            self.path = path

        def __reduce__(self):  # noqa: ANN204
            return os.system, (f"touch {self.path}",)

    d = tmp_path / "evil"
    shutil.copytree(nano["ms"], d, ignore=shutil.ignore_patterns("model.pt"))
    marker = tmp_path / "pwned"
    # a state_dict-shaped pickle with the payload among its values, in a torch zip checkpoint
    pkl = pickle.dumps({"state_dict": {"audio_encoder.after_norm.weight": Payload(marker)}}, protocol=2)
    with zipfile.ZipFile(d / "model.pt", "w") as z:
        z.writestr("model/data.pkl", pkl)
        z.writestr("model/byteorder", "little")
        z.writestr("model/version", "3\n")
    assert detect_layout(d) == "funasr"
    global_name = f"{os.system.__module__}.system"
    for fn in (open_checkpoint, lambda p: convert(p, tmp_path / "evil.gguf", "f32", progress=False),
               lambda p: load_model(p)):
        with pytest.raises(CheckpointError, match=rf"global '{global_name}', which is not allowed"):
            fn(d)
    assert not marker.exists() and not (tmp_path / "evil.gguf").exists()
    # the payload is real: plain pickle runs it
    other = tmp_path / "proof"
    pickle.loads(pickle.dumps(Payload(other), protocol=2))
    assert other.exists()
