"""Native encoder/adaptor/decoder against the Transformers 5.23 modules on tiny random checkpoints."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

import fun_asr
from gpu import DEVICES, bound_on
from reference import ReferenceDecoder, load_reference, reference_stages, rel_max_abs

T_LFR = [1, 2, 7, 50, 183]
STOP = [151645, 151643]


def features(T: int, seed: int = 0) -> np.ndarray:
    # log-mel-like values (FunASR feeds log fbank of x32768 audio: roughly 0..25)
    rng = np.random.default_rng(seed)
    return (rng.standard_normal((T, 560)) * 3 + 8).astype(np.float32)


@pytest.fixture(scope="module")
def ref_f32(tiny_f32: Path):  # noqa: ANN201
    return load_reference(tiny_f32)


@pytest.fixture(scope="module")
def ref_f16(tiny_f32: Path):  # noqa: ANN201
    return load_reference(tiny_f32, round_to=torch.float16)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("T", T_LFR)
@pytest.mark.parametrize("package,bound", [("f32", 1e-4), ("f16", 2e-3)])
def test_stages_match_transformers(T: int, package: str, bound: float, device: str, tiny_gguf, ref_f32,  # noqa: ANN001
                                   ref_f16) -> None:  # noqa: ANN001
    model = fun_asr.load_model(tiny_gguf(package), device=device)
    bound = bound_on(device, bound)
    x = features(T, seed=T)
    ref = reference_stages(ref_f32 if package == "f32" else ref_f16, x)
    ours = model.debug_stages(x)
    required = ["enc.out", "adp.proj.out", "adp.blk.0.out", "adp.out"] + [f"enc.blk.{i}.out" for i in range(4)]
    for name in required:
        assert name in ours and name in ref, name
        assert ours[name].shape == ref[name].shape, name
        err = rel_max_abs(ours[name], ref[name])
        assert err <= bound, f"{package} T={T} {name}: relative max-abs {err:.2e} > {bound}"
    enc = model.encode(x)
    np.testing.assert_array_equal(enc, ours["adp.out"])
    assert rel_max_abs(enc, ref["adp.out"]) <= bound


def _decoder_input(ref: ReferenceDecoder, model: fun_asr._core.Model, n_audio: int = 9) -> np.ndarray:
    ids = [151644, 8, 9, 10, 151645, 198, 151644, 11, 12]
    audio = model.encode(features(n_audio, seed=5))
    return np.ascontiguousarray(np.concatenate([ref.embed(ids), audio, ref.embed([151645, 198])]), dtype=np.float32)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("package,bound", [("f32", 1e-4), ("f16", 2e-3)])
def test_prefill_and_steps_match_transformers(package: str, bound: float, device: str, tiny_gguf, ref_f32,  # noqa: ANN001
                                              ref_f16) -> None:  # noqa: ANN001
    ref = ReferenceDecoder(ref_f32 if package == "f32" else ref_f16)
    model = fun_asr.load_model(tiny_gguf(package), device=device)
    bound = bound_on(device, bound)
    emb = _decoder_input(ref, model)
    ours, theirs = model.prefill(emb), ref.prefill(emb)
    assert rel_max_abs(ours, theirs) <= bound
    assert model.n_past == emb.shape[0]
    for _ in range(3):
        tok = int(np.argmax(theirs))
        assert int(np.argmax(ours)) == tok
        ours, theirs = model.step(tok), ref.step(tok)
        assert rel_max_abs(ours, theirs) <= bound


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("package", ["f32", "f16"])
def test_generate_matches_transformers_greedy(package: str, device: str, tiny_gguf, ref_f32, ref_f16) -> None:  # noqa: ANN001
    if device == "cuda" and package == "f32":
        pytest.skip("F32 on CUDA is TF32 arithmetic (gpu.CUDA_BOUND): this random model's near-ties flip "
                    "(the H200 run: token 40 of 40); the F16 package is compared token for token")
    ref = ReferenceDecoder(ref_f32 if package == "f32" else ref_f16)
    model = fun_asr.load_model(tiny_gguf(package), device=device)
    emb = _decoder_input(ref, model)
    theirs = ref.greedy(emb, 40, STOP)
    ours = model.generate(emb, 40, STOP)
    assert ours == theirs
    assert len(ours) >= 32 or ours[-1] in STOP
    assert len(set(ours)) > 3, "degenerate reference: tokens should vary"


@pytest.mark.parametrize("device", DEVICES)
def test_cache_equals_full_recompute(device: str, tiny_gguf) -> None:  # noqa: ANN001
    model = fun_asr.load_model(tiny_gguf("f32"), device=device)
    emb = model.embed([151644, 20, 21, 22, 23])
    logits = model.prefill(emb)
    seq = []
    for _ in range(4):
        tok = int(np.argmax(logits))
        seq.append(tok)
        logits = model.step(tok)
    full = model.prefill(np.concatenate([emb, model.embed(seq)]))
    # on a GPU a step (one column) and a prefill (several) take different kernels (gpu.GPU_BOUNDS)
    assert rel_max_abs(logits, full) <= bound_on(device, 1e-5)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("package,min_cos,min_agree", [("q8_0", 0.999, 0.75), ("q4_k_m", 0.9, 0.5)])
def test_quantized_close(package: str, min_cos: float, min_agree: float, device: str, tiny_gguf, ref_f32,  # noqa: ANN001
                         capsys) -> None:  # noqa: ANN001
    ref = ReferenceDecoder(ref_f32)
    model = fun_asr.load_model(tiny_gguf(package), device=device)
    emb = _decoder_input(ref, model)
    ours, theirs = model.prefill(emb), ref.prefill(emb)
    cos = float(ours @ theirs / (np.linalg.norm(ours) * np.linalg.norm(theirs)))
    rel = rel_max_abs(ours, theirs)
    # Greedy agreement under teacher forcing: both follow the reference's tokens.
    agree, n = 0, 32
    for _ in range(n):
        tok = int(np.argmax(theirs))
        agree += int(np.argmax(ours)) == tok
        ours, theirs = model.step(tok), ref.step(tok)
    with capsys.disabled():
        print(f"\n[{package} {device}] prefill logits cosine {cos:.5f}, rel max-abs {rel:.3e}, "
              f"teacher-forced greedy agreement {agree}/{n}")
    assert cos >= min_cos
    if device == "cuda" and package == "q4_k_m":
        # ggml's CUDA kernels quantize the activations per 32 values (Q8_1), the CPU's per 256 (Q8_K): on
        # this random model, whose Q4_K logits are barely informative (cosine ~0.95), the teacher-forced
        # agreement is noise (the H200: 22/32 and 15/32 in two runs, the CPU 22/32).
        min_agree = 0.4
    assert agree / n >= min_agree


def test_hf_directory_equals_gguf(tiny_f32: Path, tiny_bf16: Path, tiny_gguf, tmp_path: Path) -> None:  # noqa: ANN001
    from_dir = fun_asr.load_model(tiny_f32)
    from_gguf = fun_asr.load_model(tiny_gguf("f32"))
    assert not from_dir.info()["weights_mmapped"] and from_gguf.info()["weights_mmapped"]
    x = features(30, seed=3)
    np.testing.assert_array_equal(from_dir.encode(x), from_gguf.encode(x))
    emb = from_gguf.embed([151644, 5, 6, 7])
    np.testing.assert_array_equal(from_dir.prefill(emb), from_gguf.prefill(emb))
    assert from_dir.generate(emb, 8, STOP) == from_gguf.generate(emb, 8, STOP)
    # BF16 directory (sharded) == its BF16 -> F32 GGUF? Different arithmetic; only check it runs sane.
    bf = fun_asr.load_model(tiny_bf16)
    assert bf.info()["tensor_types"]["blk.0.attn_q.weight"] == "bf16"
    assert np.isfinite(bf.encode(x)).all()


def test_info(tiny_gguf) -> None:  # noqa: ANN001
    model = fun_asr.load_model(tiny_gguf("q4_k_m"), threads=2)
    info = model.info()
    assert info["encoder"]["n_layers"] == 4 and info["decoder"]["n_kv_heads"] == 2
    assert info["decoder"]["eos_token_ids"] == STOP
    assert info["tensor_types"]["token_embd.weight"] == "q6_K"
    assert info["backend"] == "CPU" and info["threads"] == 2 and info["weight_bytes"] > 0


@pytest.mark.parametrize("device", DEVICES)
def test_bad_inputs(device: str, tiny_gguf, tmp_path: Path) -> None:  # noqa: ANN001
    model = fun_asr.load_model(tiny_gguf("f32"), device=device)
    with pytest.raises(ValueError, match="560 columns"):
        model.encode(np.zeros((5, 80), np.float32))
    with pytest.raises(TypeError, match="float32"):
        model.encode(np.zeros((5, 560)))
    with pytest.raises(ValueError, match="2 dimensions"):
        model.encode(np.zeros(560, np.float32))
    with pytest.raises(ValueError, match="empty"):
        model.encode(np.zeros((0, 560), np.float32))
    with pytest.raises(ValueError, match="NaN"):
        model.encode(np.full((3, 560), np.nan, np.float32))
    with pytest.raises(ValueError, match="at most 2048"):
        model.encode(np.zeros((2049, 560), np.float32))
    with pytest.raises(IndexError, match="outside the vocabulary"):
        model.embed([151936])
    with pytest.raises(IndexError, match="outside the vocabulary"):
        model.embed([-1])
    with pytest.raises(ValueError, match="empty"):
        model.embed([])
    with pytest.raises(ValueError, match="256 columns"):
        model.prefill(np.zeros((3, 100), np.float32))
    with pytest.raises(IndexError):
        model.step(10**6)
    with pytest.raises(ValueError, match="max_new_tokens"):
        model.generate(np.zeros((2, 256), np.float32), 0, STOP)
    fresh = fun_asr.load_model(tiny_gguf("f32"), device=device)
    with pytest.raises(RuntimeError, match="prefill"):
        fresh.step(5)
    with pytest.raises(ValueError, match="unknown device 'tpu'"):
        fun_asr.load_model(tiny_gguf("f32"), device="tpu")
    with pytest.raises(FileNotFoundError):
        fun_asr.load_model(tmp_path / "missing.gguf")


@pytest.mark.parametrize("device", DEVICES)
def test_corrupt_gguf(device: str, tiny_gguf, tmp_path: Path) -> None:  # noqa: ANN001
    data = tiny_gguf("q8_0").read_bytes()
    junk = tmp_path / "junk.gguf"
    junk.write_bytes(b"not a gguf file at all" * 10)
    with pytest.raises(RuntimeError, match="not a valid GGUF"):
        fun_asr.load_model(junk, device=device)
    cut = tmp_path / "cut.gguf"
    cut.write_bytes(data[: len(data) // 2])
    with pytest.raises(RuntimeError, match="truncated|not a valid GGUF"):
        fun_asr.load_model(cut, device=device)
    empty = tmp_path / "empty.gguf"
    empty.write_bytes(b"")
    with pytest.raises(RuntimeError):
        fun_asr.load_model(empty, device=device)
