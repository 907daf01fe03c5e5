"""Several segments through the encoder in one packed pass (Model.encode_batch): every sequence's frames side by
side, attention and the FSMN memory per sequence.

Each segment's adaptor rows (and kept encoder output) must be bit for bit those of its own pass, on every
package type and on both ways the graph can be built (fun-asr's CPU ops; ggml's flash attention and SSM_CONV,
the nodes a GPU runs), whichever pass ran before (a kept encoder output must not be memory that ggml's
allocator planned for reuse in an earlier graph of the same node count). A Session that packs its segments
(encoder_pack > 1, as on a GPU) must give the transcripts, word timestamps and failures of one that does not."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from fun_asr import _core
from gpu import CUDA_BOUND, GPU_DEVICES

# lengths in LFR frames: one frame, a few, a 30 s segment's worth and odd sizes between
LENGTHS = [1, 3, 17, 100, 240, 8, 55]


def _compare(path: str, lengths: list[int]) -> dict[str, bool]:
    model = _core.load_gguf(path, device="cpu", threads=2)
    rng = np.random.default_rng(0)
    width = model.info()["encoder"]["input_size"]
    feats = [rng.standard_normal((n, width)).astype(np.float32) for n in lengths]
    packed = model.encode_batch(feats)
    kept = model.encode_batch(feats, keep_encoder=True)
    out = {"rows": True, "kept": True}
    for f, rows, (rows_k, enc) in zip(feats, packed, kept, strict=True):
        alone, (alone_k, enc_alone) = model.encode(f), model.encode_keep_encoder(f)
        out["rows"] &= rows.shape == alone.shape and np.array_equal(rows, alone)
        out["kept"] &= np.array_equal(rows_k, alone_k) and np.array_equal(enc, enc_alone)
    return out


@pytest.mark.parametrize("package", ["f32", "f16", "q8_0", "q4_k_m"])
def test_packed_encoder_pass_equals_one_pass_per_segment(package: str, tiny_gguf) -> None:  # noqa: ANN001
    assert _compare(str(tiny_gguf(package)), LENGTHS) == {"rows": True, "kept": True}


CHILD = r"""
import json, sys
sys.path.insert(0, sys.argv[3])
from test_packed_encoding import _compare
print(json.dumps(_compare(sys.argv[1], json.loads(sys.argv[2]))))
"""


@pytest.mark.parametrize("package", ["f32", "q8_0"])
def test_packed_pass_on_the_generic_nodes(package: str, tiny_gguf) -> None:  # noqa: ANN001
    """FUN_ASR_ATTN=ggml FUN_ASR_FSMN=ggml: the encoder's attention as ggml's flash attention and the FSMN memory
    as ggml's nodes, per sequence on views of the packed tensor and joined again (what another device runs):
    the same bits as one pass per segment. (The kernel choice is made once per process: a subprocess.)"""
    env = dict(os.environ, FUN_ASR_ATTN="ggml", FUN_ASR_FSMN="ggml")
    out = subprocess.run([sys.executable, "-c", CHILD, str(tiny_gguf(package)), json.dumps(LENGTHS),
                          str(Path(__file__).parent)], env=env, capture_output=True, text=True, check=True)
    assert json.loads(out.stdout.strip().splitlines()[-1]) == {"rows": True, "kept": True}


def test_encode_batch_checks_its_input(tiny_gguf) -> None:  # noqa: ANN001
    model = _core.load_gguf(str(tiny_gguf("f32")), device="cpu", threads=1)
    width = model.info()["encoder"]["input_size"]
    assert model.encode_batch([]) == []
    assert model.max_packed_sequences >= 1
    good = np.zeros((4, width), np.float32)
    for bad, msg in ((np.zeros((0, width), np.float32), r"features\[1\] is empty"),
                     (np.zeros((3, width + 1), np.float32), r"features\[1\] must have"),
                     (np.full((3, width), np.nan, np.float32), r"features\[1\] contains NaN")):
        with pytest.raises(ValueError, match=msg):
            model.encode_batch([good, bad])
    too_long = model.info()["encoder"]["max_frames"] + 1
    with pytest.raises(ValueError, match="position table allows at most"):
        model.encode_batch([good, np.zeros((too_long, width), np.float32)])
    assert model.info()["caps"]["packed_encoding"] is False  # the CPU: one pass per segment is faster


@pytest.mark.filterwarnings("ignore::fun_asr.notices.RecordingFailedWarning")  # the empty input, on purpose
def test_session_packing_segments_gives_the_same_results(ctc_demo, three: Path) -> None:  # noqa: ANN001
    """transcribe_batch over recordings with several VAD segments each (and a bad one), word timestamps on:
    packed encoder passes (as on a GPU) give the same transcripts, tokens and word times as one pass per
    segment, and the bad recording fails alone."""
    import fun_asr
    from trained_model import heldout_clips
    from vad_fixture import fsmn_vad_dir

    session = fun_asr.Session(str(ctc_demo["f32"]), device="cpu", vad="fsmn", vad_model=fsmn_vad_dir(),
                              progress=False)
    assert session.encoder_pack == 1  # the CPU's choice
    import soundfile as sf

    clips = [sf.read(str(p), dtype="float32")[0] for p, _ in heldout_clips(Path(ctc_demo["f32"]).parent / "clips")[:3]]
    speech = sf.read(str(three), dtype="float32")[0]
    inputs = [speech, clips[0], np.zeros(0, np.float32), clips[1], speech, clips[2]]
    names = [f"input {i}" for i in range(len(inputs))]
    kw = {"sample_rate": 16000, "batch_size": 4, "word_timestamps": True, "language": "en", "names": names}
    alone = session.transcribe_batch(inputs, **kw)
    passes: list[int] = []
    encode_segments = session.engine._encode_segments

    def spy(segments, *args, **kwargs):  # noqa: ANN001, ANN002, ANN003, ANN202
        passes.append(len(segments))
        return encode_segments(segments, *args, **kwargs)

    session.engine._encode_segments = spy  # type: ignore[method-assign]
    session.encoder_pack = 3
    packed = session.transcribe_batch(inputs, **kw)
    assert max(passes) == 3 and sum(passes) == sum(len(r.segments) for r in packed if r.ok)
    assert sum(r.ok for r in packed) == 5 and not packed[2].ok and packed[2].error == alone[2].error
    for a, b in zip(alone, packed, strict=True):
        assert [s.tokens for s in a.segments] == [s.tokens for s in b.segments]
        assert [s.words for s in a.segments] == [s.words for s in b.segments] and a.text == b.text
    assert len(packed[0].segments) == 3 and packed[0].text  # three utterances: three segments, heard


@pytest.mark.parametrize("device", GPU_DEVICES)
def test_packed_encoder_pass_on_a_gpu(device: str, tiny_gguf) -> None:  # noqa: ANN001
    """On a GPU (where the Session packs: caps packed_encoding) a packed pass meets one pass per segment within the
    GPU's bound (ggml's CUDA products round a different column count differently); more segments than one graph
    holds (ggml's generic nodes: ~50 tensors per layer and segment) take several passes."""
    model = _core.load_gguf(str(tiny_gguf("f16")), device=device, threads=2)
    assert model.info()["caps"]["packed_encoding"] is True
    rng = np.random.default_rng(0)
    width = model.info()["encoder"]["input_size"]
    feats = [rng.standard_normal((n, width)).astype(np.float32) for n in LENGTHS]
    for f, packed in zip(feats, model.encode_batch(feats), strict=True):
        alone = model.encode(f)
        np.testing.assert_allclose(packed, alone, rtol=CUDA_BOUND, atol=CUDA_BOUND * np.abs(alone).max())
    many = [rng.standard_normal((int(n), width)).astype(np.float32)
            for n in rng.integers(1, 12, size=2 * model.max_packed_sequences + 1)]
    out = model.encode_batch(many)
    for i in (0, model.max_packed_sequences, len(many) - 1):
        alone = model.encode(many[i])
        np.testing.assert_allclose(out[i], alone, rtol=CUDA_BOUND, atol=CUDA_BOUND * np.abs(alone).max())
