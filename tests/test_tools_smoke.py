"""The benchmark harness runs in smoke mode (tiny model, one repeat) so it cannot rot. No timing asserted."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

TOOLS = Path(__file__).resolve().parents[1] / "tools"


def test_bench_smoke(tmp_path: Path) -> None:
    out = tmp_path / "bench.md"
    r = subprocess.run([sys.executable, str(TOOLS / "bench.py"), "--smoke", "--work", str(tmp_path / "w"),
                        "--out", str(out), "--profile", "--wer"], capture_output=True, text=True, timeout=900)
    assert r.returncode == 0, r.stdout + r.stderr
    table = out.read_text()
    needles = ("Per-node profile", "encode/", "WER per type", "| transformers | 5 |", "| q8_0 | 5 |",
               "bandwidth limit", "matmul", "Peak RSS", "Batching", "best case", "1 thread:",
               "Ceiling on this machine", "Where the batch's time goes")
    for needle in needles:
        assert needle in table, needle
    # --contention (same work folder: the tiny checkpoint and package are reused)
    out = tmp_path / "contention.md"
    r = subprocess.run([sys.executable, str(TOOLS / "bench.py"), "--smoke", "--contention", "--work",
                        str(tmp_path / "w"), "--out", str(out)], capture_output=True, text=True, timeout=900)
    assert r.returncode == 0, r.stdout + r.stderr
    table = out.read_text()
    for needle in ("| transformers F32 |", "| fun-asr q8_0 | 1 |", "| fun-asr q8_0 | 0 (auto) |", "busy",
                   "GOMP_SPINCOUNT="):
        assert needle in table, needle


def test_decoder_macs_per_token_counts_every_decoder_matrix_and_the_output(tiny_gguf) -> None:  # noqa: ANN001
    """The batch ceiling's decode work: one step of one sequence, from the model's own dimensions."""
    import fun_asr
    from bench import decoder_macs_per_token

    path = tiny_gguf("q8_0")
    dec = fun_asr.load_model(path, threads=1).info()["decoder"]
    d, q, kv = dec["d_model"], dec["n_heads"] * dec["head_dim"], dec["n_kv_heads"] * dec["head_dim"]
    per_layer = d * q + 2 * d * kv + q * d + 3 * d * dec["ffn"]
    assert decoder_macs_per_token(path) == dec["n_layers"] * per_layer + dec["vocab"] * d


def test_bench_gpu_harness_smoke(tmp_path: Path) -> None:
    """The GPU benchmark's harness (tools/gpu_check.sh runs it with --device cuda), here on the CPU."""
    out = tmp_path / "gpu.md"
    r = subprocess.run([sys.executable, str(TOOLS / "bench.py"), "--smoke", "--gpu", "--device", "cpu", "--work",
                        str(tmp_path / "w"), "--out", str(out)], capture_output=True, text=True, timeout=900)
    assert r.returncode == 0, r.stdout + r.stderr
    table = out.read_text()
    for needle in ("| q8_0 | 1 |", "| q8_0 | 3 |", "tokens equal to CPU", "4/4 |", "3 clips of 5-29.5 s",
                   "host argmax s"):
        assert needle in table, needle


def test_bench_ctc_draft_smoke(tmp_path: Path) -> None:
    r = subprocess.run([sys.executable, str(TOOLS / "bench_ctc_draft.py"), "--smoke", "--work", str(tmp_path)],
                       capture_output=True, text=True, timeout=900)
    assert r.returncode == 0, r.stdout + r.stderr
    for needle in ("| q8_0 | plain |", "| q4_k_m | CTC, wrong |", "| q8_0 | CTC, matching |", "CTC, no punctuation",
                   "| decoder passes | draft kept |"):
        assert needle in r.stdout, needle


def test_bench_stream_smoke(tiny_gguf, tmp_path: Path) -> None:  # noqa: ANN001
    from vad_fixture import fsmn_vad_dir

    out = tmp_path / "stream.md"
    r = subprocess.run([sys.executable, str(TOOLS / "bench_stream.py"), "--model", str(tiny_gguf("q8_0")),
                        "--vad-model", str(fsmn_vad_dir()), "--streams", "2", "--seconds", "8", "--max-new-tokens", "3",
                        "--threads", "1", "--out", str(out)], capture_output=True, text=True, timeout=900)
    assert r.returncode == 0, r.stdout + r.stderr
    table = out.read_text()
    assert "| tiny-q8_0.gguf | 2 | on | on | on |" in table  # drafts, interrupt, speculate
    assert "| close p95 | close (real time) p50 | p95 | final p50 | final p95 |" in table
    assert "| decodes with a draft | draft tokens kept | partials decoded / skipped (interrupted) |" in table


def test_bench_vad_smoke(tmp_path: Path) -> None:
    from vad_fixture import fsmn_vad_dir

    out = tmp_path / "vad.md"
    r = subprocess.run([sys.executable, str(TOOLS / "bench.py"), "--vad-only", "--vad-model", str(fsmn_vad_dir()),
                        "--repeats", "1", "--vad-seconds", "60", "--out", str(out)], capture_output=True, text=True,
                       timeout=900)
    assert r.returncode == 0, r.stdout + r.stderr
    table = out.read_text()
    assert "**VAD alone**" in table and "× real time" in table


def test_bench_batch_split_smoke(tmp_path: Path) -> None:
    """`bench.py --batch-split` (tools/gpu_check.sh runs it on the GPU): continuous batching's throughput per batch
    size with each clip's own token count, a decode step's split, and packed encoder passes against one pass per
    clip, here on the tiny model and the CPU."""
    out = tmp_path / "batch.md"
    r = subprocess.run([sys.executable, str(TOOLS / "bench.py"), "--smoke", "--batch-split", "--types", "q8_0",
                        "--work", str(tmp_path / "w"), "--out", str(out)], capture_output=True, text=True, timeout=900)
    assert r.returncode == 0, r.stdout + r.stderr
    table = out.read_text()
    for needle in ("| q8_0 | 1 |", "| q8_0 | 3 |", "| q8_0 | 64 |", "slot moves", "host share", "6 clips of 5-29.5 s",
                   "graphs built per step", "packed s"):
        assert needle in table, needle
    assert "| yes |" in table and "| NO |" not in table  # packed encoder passes: every clip's own bits
