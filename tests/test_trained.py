"""A model that hears: the tiny Fun-ASR-Nano trained by tools/train_tiny.py (tests/data/tiny_trained),
rebuilt without torch, converted with fun_asr.convert, transcribing held-out espeak-ng clips.

WER bounds: F32 <= 5 %, F16 and Q8_0 within +1 point of F32, Q4_K_M within +5 points.
The measured numbers are in docs/trained_model.md.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import soundfile as sf

import fun_asr
from trained_model import (
    ARTIFACT,
    EMBEDDING_KEY,
    embedding_base,
    heldout_clips,
    manifest,
    normalize_text,
    three_utterances_clip,
    trained_checkpoint,
    wer,
)

TYPES = ["f32", "f16", "q8_0", "q4_k_m"]
F32_MAX_WER = 0.05
MAX_EXTRA = {"f32": 0.0, "f16": 0.01, "q8_0": 0.01, "q4_k_m": 0.05}
CLI_CLIPS = (0, 1, 2, 3)  # held-out clips the CLI must get word for word (every type gets them right)


@pytest.fixture(scope="session")
def trained_ckpt(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return trained_checkpoint(tmp_path_factory.mktemp("trained") / "tiny-trained")


@pytest.fixture(scope="session")
def trained_gguf(trained_ckpt: Path, gguf_converter):  # noqa: ANN001, ANN201
    """trained_gguf("q8_0") -> the converted package (converted once per type)."""
    return gguf_converter(trained_ckpt, "tiny-trained")


@pytest.fixture(scope="session")
def heldout(tmp_path_factory: pytest.TempPathFactory) -> list[tuple[Path, str]]:
    return heldout_clips(tmp_path_factory.mktemp("heldout"))


@pytest.fixture(scope="session")
def transcripts(trained_gguf, heldout: list[tuple[Path, str]]):  # noqa: ANN001, ANN201
    """transcripts("q8_0") -> the Session's text for every held-out clip (computed once per type)."""
    cache: dict[str, list[str]] = {}

    def get(package: str) -> list[str]:
        if package not in cache:
            s = fun_asr.Session(trained_gguf(package), device="cpu")
            res = s.transcribe_batch([str(p) for p, _ in heldout], batch_size=16)
            cache[package] = [r.text for r in res]
        return cache[package]

    return get


def test_artifact_is_small_and_rebuilds_exactly(trained_ckpt: Path) -> None:
    from safetensors.numpy import load_file

    size = sum(p.stat().st_size for p in ARTIFACT.rglob("*") if p.is_file())
    assert size <= 10_000_000, f"tests/data/tiny_trained is {size / 1e6:.2f} MB"
    man = manifest()
    emb = man["embedding"]
    tensors = load_file(str(trained_ckpt / "model.safetensors"))
    table = tensors[EMBEDDING_KEY]
    assert table.shape == (emb["vocab"], emb["dim"]) and table.dtype == np.float32
    # the untrained rows are the seeded ones, bit for bit (numpy's PCG64 stream)
    base = embedding_base(emb["vocab"], emb["dim"], emb["seed"], emb["std"])
    ids = load_file(str(ARTIFACT / "weights.safetensors"))["trained_rows.ids"]
    keep = np.ones(emb["vocab"], bool)
    keep[ids] = False
    assert np.array_equal(table[keep], base[keep])
    import hashlib

    assert hashlib.sha256(table.tobytes()).hexdigest() == emb["sha256"]
    assert sum(t.size for k, t in tensors.items() if k != EMBEDDING_KEY) == man["parameters"]["non_embedding"]
    config = json.loads((trained_ckpt / "config.json").read_text())
    assert config["text_config"]["vocab_size"] == 151936


def test_session_on_checkpoint_folder_hears(trained_ckpt: Path, heldout: list[tuple[Path, str]]) -> None:
    s = fun_asr.Session(trained_ckpt, device="cpu")
    path, text = heldout[0]
    r = s.transcribe(str(path))
    assert normalize_text(r.text) == normalize_text(text)
    assert r.segments[0].stop_reason == "eos"


@pytest.mark.parametrize("package", TYPES)
def test_heldout_wer(package: str, transcripts, heldout: list[tuple[Path, str]]) -> None:  # noqa: ANN001
    refs = [t for _, t in heldout]
    f32 = wer(refs, transcripts("f32"))
    got = wer(refs, transcripts(package))
    wrong = [(r, h) for r, h in zip(refs, transcripts(package), strict=True) if normalize_text(r) != normalize_text(h)]
    assert f32 <= F32_MAX_WER, f"F32 held-out WER {f32:.3f}; wrong: {wrong}"
    assert got <= f32 + MAX_EXTRA[package] + 1e-9, f"{package} WER {got:.3f} vs F32 {f32:.3f}; wrong: {wrong}"


# The held-out WER per condition of the -m demo package (Q8_0 with FunASR's FSMN-VAD embedded), as measured by
# `python tools/train_tiny.py eval` (docs/trained_model.md, "WER per condition"): clean (digital silence around
# the speech), noisy (the clips' recorded light noise), multi (2-4 clips joined by 1-3 s pauses, through the VAD):
# 3 of 169, 3 of 169 and 9 of 197 words wrong.
CONDITION_WER = {"clean": 3 / 169, "noisy": 3 / 169, "multi": 9 / 197}


@pytest.fixture(scope="session")
def demo_package(trained_ckpt: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The package `-m demo` builds: Q8_0 with the shipped FSMN-VAD embedded."""
    from fun_asr.model.demo import vad_dir

    out = tmp_path_factory.mktemp("demo-package") / "demo-q8_0.gguf"
    fun_asr.convert(trained_ckpt, out, "q8_0", progress=False, vad_model=vad_dir())
    return out


def test_demo_wer_per_condition(demo_package: Path) -> None:
    from trained_model import condition_wers

    s = fun_asr.Session(demo_package, device="cpu", progress=False)
    assert s.vad_source == "embedded"
    got = condition_wers(s)
    for cond, measured in CONDITION_WER.items():
        assert got[cond]["wer"] <= min(measured, 0.05) + 1e-9, (cond, got[cond]["wer"], got[cond]["errors"])


def test_language_and_itn_prompts_hear(trained_gguf, heldout: list[tuple[Path, str]]) -> None:  # noqa: ANN001
    """The model was also trained with language=en and itn=False prompts (FunASR's other instructions)."""
    s = fun_asr.Session(trained_gguf("q8_0"), device="cpu")
    clips = heldout[:20]
    res = s.transcribe_batch([str(p) for p, _ in clips], language="en", itn=False, batch_size=16)
    assert wer([t for _, t in clips], [r.text for r in res]) <= 0.1


def test_cli_transcribes_heldout(trained_gguf, heldout: list[tuple[Path, str]], tmp_path: Path) -> None:  # noqa: ANN001
    clips = [heldout[i] for i in CLI_CLIPS]
    out = subprocess.run(
        [sys.executable, "-m", "fun_asr.cli.transcribe", "-m", str(trained_gguf("q8_0")), "--device", "cpu",
         "-f", "json", "-o", str(tmp_path), "--quiet", *[str(p) for p, _ in clips]],
        capture_output=True, text=True, timeout=120,
    )
    assert out.returncode == 0, out.stderr
    for path, text in clips:
        doc = json.loads((tmp_path / (path.stem + ".json")).read_text())
        assert normalize_text(doc["text"]) == normalize_text(text), (path.name, doc["text"], text)
    txt = subprocess.run(
        [sys.executable, "-m", "fun_asr.cli.transcribe", "-m", str(trained_gguf("q8_0")), "--device", "cpu",
         "--quiet", str(clips[0][0])],
        capture_output=True, text=True, timeout=120,
    )
    assert txt.returncode == 0, txt.stderr
    assert normalize_text(txt.stdout) == normalize_text(clips[0][1])


def test_three_utterances_clip(tmp_path: Path) -> None:
    path, words = three_utterances_clip(tmp_path)
    x, rate = sf.read(str(path), dtype="float32")
    info = json.loads((tmp_path / "three_utterances.json").read_text())
    assert rate == 16000 and len(info["utterances"]) == 3 and words == info["words"]
    spans = [(u["start"], u["end"]) for u in info["utterances"]]
    assert all(a < b <= c for (a, b), (c, _) in zip(spans, spans[1:], strict=False))
    assert spans[-1][1] < len(x) / rate
    # the silences between the utterances are quiet (light noise only), the utterances are not
    gap = x[int(spans[0][1] * rate) + 1600 : int(spans[1][0] * rate)]
    assert np.sqrt(np.mean(gap**2)) < 0.01


_TOKENS_CODE = (
    "import json, sys, fun_asr\n"
    "s = fun_asr.Session(sys.argv[1], device='cpu', vad=None, threads=2)\n"
    "s.model.profiling = True\n"
    "out = [list(s.transcribe(p).segments[0].tokens) for p in sys.argv[2:]]\n"
    "kinds = sorted(s.model.profile())\n"
    "isa = (fun_asr._core.int8_gemm_isa(), fun_asr._core.amx_available())\n"
    "print(json.dumps({'tokens': out, 'kinds': kinds, 'int8_isa': isa[0], 'amx': isa[1]}))\n"
)


def _tokens_in_child(gguf: Path, clips: list[str], switches: dict[str, str | None]) -> dict:
    """_TOKENS_CODE in a child process with the kernel switches set (a value) or cleared (None)."""
    env = {k: v for k, v in os.environ.items() if k not in switches}
    env.update({k: v for k, v in switches.items() if v is not None})
    out = subprocess.run([sys.executable, "-c", _TOKENS_CODE, str(gguf), *clips], env=env, capture_output=True,
                         text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout.strip().splitlines()[-1])


@pytest.mark.skipif(fun_asr._core.matvec_isa() == "", reason="no decode kernels on this CPU")
@pytest.mark.parametrize("package", ["q8_0", "q4_k_m"])
def test_decode_kernels_give_the_same_tokens(package: str, trained_gguf, heldout: list[tuple[Path, str]]) -> None:  # noqa: ANN001
    """fun-asr's decode mat-vec kernels (csrc/kernels/matvec) against ggml's mul_mat everywhere
    (FUN_ASR_MATVEC=0), and the encoder's AMX GEMM against ggml's (FUN_ASR_AMX=0): same tokens on
    held-out clips, and the kernels really ran (the profile's MATVEC / GEMM_AMX nodes). The decoder's Q8_0
    matrices in the int8 GEMM's quads layout (where that kernel runs, VNNI or plain AVX2, without AMX;
    FUN_ASR_Q8_QUADS=0 keeps them plain for the comparison above): the same tokens again, every decode product
    in that GEMM."""
    clips = [str(p) for p, _ in heldout[:8]]

    def run(env_value: str | None, name: str = "FUN_ASR_MATVEC", quads: str | None = "0") -> dict:
        return _tokens_in_child(trained_gguf(package), clips, {"FUN_ASR_MATVEC": None, "FUN_ASR_AMX": None,
                                                              "FUN_ASR_Q8_QUADS": quads, name: env_value})

    ours, ggml = run(None), run("0")
    if package == "q8_0" and fun_asr._core.int8_gemm_isa() != "" and not fun_asr._core.amx_available():
        quads = run(None, quads=None)
        assert any(k.startswith("decode/GEMM_INT8/attn_q") for k in quads["kinds"]), quads["kinds"]  # q+k+v: one node
        assert any(k.startswith("decode/GEMM_INT8/token_embd") for k in quads["kinds"])  # (+ "/ADD_RMS_NORM")
        assert not any("/MATVEC/" in k for k in quads["kinds"]), quads["kinds"]
        assert quads["tokens"] == ours["tokens"]
    assert any("/MATVEC/" in k for k in ours["kinds"]), ours["kinds"]
    assert not any("/MATVEC/" in k for k in ggml["kinds"]), ggml["kinds"]
    if package == "q4_k_m" and fun_asr._core.matvec_isa() == "avx512vnni":  # the repacked Q4_K kernel ran too
        assert any(k.startswith("decode/MATVEC/attn_q") for k in ours["kinds"]), ours["kinds"]  # q+k+v: one node
    assert ours["tokens"] == ggml["tokens"]
    if fun_asr._core.amx_available():  # the encoder's AMX GEMM (Q8_0; Q4_K_M's Q4_K) against the path without
        assert any(k.startswith("encode/GEMM_AMX/") for k in ours["kinds"]), ours["kinds"]
        no_amx = run("0", "FUN_ASR_AMX")
        assert not any("GEMM_AMX" in k for k in no_amx["kinds"]), no_amx["kinds"]
        assert ours["tokens"] == no_amx["tokens"]


@pytest.mark.parametrize("package", ["f32", "q4_k_m"])
def test_fused_fsmn_memory_gives_the_same_tokens(package: str, trained_gguf, heldout: list[tuple[Path, str]]) -> None:  # noqa: ANN001
    """The encoder's fused FSMN memory op (csrc/kernels/fsmn_memory: one pass instead of transpose, pad,
    ssm_conv and two adds; equal to them to rounding) against the plain ggml graph (FUN_ASR_FSMN=ggml):
    the same tokens on every held-out clip, and each path really ran (the profile's SSM_CONV nodes)."""
    clips = [str(p) for p, _ in heldout]

    def run(fsmn: str | None) -> dict:
        return _tokens_in_child(trained_gguf(package), clips, {"FUN_ASR_FSMN": fsmn})

    fused, plain = run(None), run("ggml")
    assert "encode/SSM_CONV" in plain["kinds"] and "encode/SSM_CONV" not in fused["kinds"], (plain, fused)
    assert "encode/CUSTOM" in fused["kinds"], fused["kinds"]
    assert fused["tokens"] == plain["tokens"]


@pytest.mark.skipif(fun_asr._core.int8_gemm_isa() == "", reason="no AVX2: the int8 GEMM does not run on this CPU")
@pytest.mark.parametrize("package", ["q8_0", "q4_k_m"])
def test_int8_gemm_gives_the_same_tokens(package: str, trained_gguf, heldout: list[tuple[Path, str]]) -> None:  # noqa: ANN001
    """The int8 GEMM (csrc/kernels/gemm_avx2: the encoder's and adaptor's Q8_0 / Q4_K / Q6_K products and the
    prefill's Q8_0 ones, without AMX its Q4_K / Q6_K ones too; Q8_0 equal to ggml's to rounding, Q4_K / Q6_K with
    Q8_0 instead of Q8_K activations) against
    ggml's GEMMs (FUN_ASR_GEMM=0): the same tokens on every held-out clip; the plain AVX2 instructions
    (FUN_ASR_GEMM=avx2) give the VNNI ones' tokens; each path really ran (the profile's GEMM_INT8 nodes)."""
    if package == "q8_0" and fun_asr._core.amx_available():
        pytest.skip("AMX takes the Q8_0 products on this CPU")
    clips = [str(p) for p, _ in heldout]

    def run(gemm: str | None) -> dict:  # AMX off: it takes the encoder's Q4_K products where it runs
        return _tokens_in_child(trained_gguf(package), clips, {"FUN_ASR_GEMM": gemm, "FUN_ASR_MATVEC": None,
                                                              "FUN_ASR_AMX": "0"})

    ours, ggml = run(None), run("0")
    assert any(k.startswith("encode/GEMM_INT8/") for k in ours["kinds"]), ours["kinds"]
    # the prefill takes it for Q8_0, and without AMX for Q4_K / Q6_K too (docs/performance.md)
    no_amx = ours["int8_isa"] != "" and not ours["amx"]
    prefill_int8 = any(k.startswith("prefill/GEMM_INT8/") for k in ours["kinds"])
    assert prefill_int8 == (package == "q8_0" or no_amx), ours["kinds"]
    assert not any("GEMM_INT8" in k for k in ggml["kinds"]), ggml["kinds"]
    assert ours["tokens"] == ggml["tokens"]
    if fun_asr._core.int8_gemm_isa() != "avx2":
        assert run("avx2")["tokens"] == ours["tokens"]


@pytest.mark.skipif(fun_asr._core.matvec_isa() == "", reason="no AVX2: the attention kernel does not run here")
@pytest.mark.parametrize("package", ["f32", "q4_k_m"])
def test_attention_kernel_gives_the_same_tokens(package: str, trained_gguf, heldout: list[tuple[Path, str]]) -> None:  # noqa: ANN001
    """The encoder's attention kernel (csrc/kernels/attention; equal to ggml's flash attention to rounding)
    against ggml's (FUN_ASR_ATTN=ggml): the same tokens on every held-out clip, and each path really ran."""
    clips = [str(p) for p, _ in heldout]

    def run(attn: str | None) -> dict:
        return _tokens_in_child(trained_gguf(package), clips, {"FUN_ASR_ATTN": attn})

    ours, ggml = run(None), run("ggml")
    assert "encode/FLASH_ATTN_EXT" in ggml["kinds"] and "encode/FLASH_ATTN_EXT" not in ours["kinds"], (ours, ggml)
    assert ours["tokens"] == ggml["tokens"]


@pytest.mark.parametrize("package", ["q8_0", "q4_k_m"])
def test_batch_equals_one_by_one_on_the_trained_model(package: str, trained_gguf,  # noqa: ANN001
                                                      heldout: list[tuple[Path, str]]) -> None:
    """transcribe_batch gives transcribe's tokens with every kernel this CPU runs (AMX prefill, decode
    mat-vecs): clips of different lengths, so prefills of different sizes share a batch."""
    s = fun_asr.Session(trained_gguf(package), device="cpu", vad=None, threads=2)
    clips = [str(p) for p, _ in heldout[:10]]
    single = [list(s.transcribe(c).segments[0].tokens) for c in clips]
    batched = [list(r.segments[0].tokens) for r in s.transcribe_batch(clips, batch_size=8)]
    assert batched == single
