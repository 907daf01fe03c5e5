#!/usr/bin/env python3
"""Diarization error rate of FunASR's own speaker pipeline (torch, FunASR 1.4.16) with a CAM++ model
(default: the tiny one, tests/data/tiny_speaker) on held-out synthetic conversations (tests/speaker_fixture).

    python tools/eval_diarization.py [--model DIR] [--n 24] [--vad oracle|fsmn] [--collar 0.25] [--json OUT]

Pipeline, as ``funasr.AutoModel(..., spk_model=...)`` runs it after the VAD:
speech segments -> ``sv_chunk`` (1.5 s windows, 0.75 s shift) -> ``extract_feature`` -> ``CAMPPlus`` (eval,
F32) -> ``ClusterBackend(merge_thr=0.78)`` -> ``postprocess`` -> [(start, end, speaker)].
Segments: ``oracle`` = the reference turns (each its own segment); ``fsmn`` = FunASR's FSMN-VAD on the real
weights (tests/vad_fixture.py; segments may then span speaker changes).
sklearn's k-means inside the spectral clustering draws from numpy's global RNG; it is seeded (0) before
every conversation so that the figures repeat.

Prints per conversation: speakers (reference / found), DER and its parts; then per speaker count and in
total: DER (summed errors / summed scored speech), mean DER and the share of conversations whose speaker
count is right. The collar is NIST's: +-collar seconds around every reference boundary are not scored.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))
sys.path.insert(0, str(ROOT / "tools"))

from speaker_fixture import SAMPLE_RATE, count_ok, der, eval_set, make_conversation, speaker_count  # noqa: E402

DEFAULT_MODEL = ROOT / "tests" / "data" / "tiny_speaker"


def load_model(model_dir: Path):  # noqa: ANN201
    """FunASR's CAMPPlus from a ModelScope-layout folder (config.yaml model_conf + the init_param weights)."""
    import torch
    import yaml

    from train_tiny_speaker import quiet_funasr

    quiet_funasr()
    from funasr.models.campplus.model import CAMPPlus

    cfg = yaml.safe_load((model_dir / "config.yaml").read_text("utf-8"))
    if cfg.get("model") != "CAMPPlus":
        raise SystemExit(f"{model_dir}/config.yaml: model is {cfg.get('model')!r}, expected CAMPPlus")
    meta = json.loads((model_dir / "configuration.json").read_text("utf-8"))
    weights = model_dir / meta["file_path_metas"]["init_param"]
    model = CAMPPlus(**cfg["model_conf"])
    model.load_state_dict(torch.load(weights, map_location="cpu", weights_only=True))
    return model.eval()


def diarize(model, samples: np.ndarray, segments_s: list[tuple[float, float]], merge_thr: float = 0.78,  # noqa: ANN001
            ) -> tuple[list[tuple[float, float, str]], int]:
    """FunASR's pipeline on the given speech segments; returns the hypothesis turns and the window count."""
    import torch
    from funasr.models.campplus.cluster_backend import ClusterBackend
    from funasr.models.campplus.utils import extract_feature, postprocess, sv_chunk

    vad_segments = []
    for st, ed in segments_s:
        a, b = int(st * SAMPLE_RATE), int(ed * SAMPLE_RATE)
        if b > a:
            vad_segments.append([a / SAMPLE_RATE, b / SAMPLE_RATE, samples[a:b]])
    chunks = sorted(sv_chunk(vad_segments), key=lambda c: c[0])
    embs = []
    with torch.no_grad():
        for k in range(0, len(chunks), 64):
            feats, _, _ = extract_feature([torch.from_numpy(c[2].astype(np.float32)) for c in chunks[k: k + 64]])
            embs.append(model(feats.to(torch.float32)))
    emb = torch.cat(embs).numpy()
    np.random.seed(0)  # sklearn k_means(random_state=None) inside SpectralCluster
    labels = ClusterBackend(merge_thr=merge_thr)(emb)
    out = postprocess(chunks, None, labels, emb)
    return [(float(st), float(ed), f"spk{int(lab)}") for st, ed, lab in out], len(chunks)


def speech_segments(kind: str, samples: np.ndarray, turns: list[tuple[float, float, str, str]]
                    ) -> list[tuple[float, float]]:
    if kind == "oracle":
        return [(a, b) for a, b, _, _ in turns]
    if kind == "fsmn":
        import funasr_ref
        from vad_fixture import fsmn_vad_dir

        return [(a / 1000.0, b / 1000.0) for a, b in funasr_ref.vad_segments(fsmn_vad_dir(), samples)]
    raise SystemExit(f"--vad {kind!r}: expected oracle or fsmn")


def evaluate(model_dir: Path, n: int, first_seed: int, vad: str, collar: float, merge_thr: float,
             verbose: bool = True) -> dict[str, Any]:
    import torch

    torch.set_num_threads(1)
    model = load_model(model_dir)
    rows = []
    t0 = time.time()
    for seed, n_spk in eval_set(n, first_seed):
        samples, ref = make_conversation(seed, n_spk)
        hyp, n_win = diarize(model, samples, speech_segments(vad, samples, ref), merge_thr)
        parts = der(ref, hyp, collar=collar, detail=True)
        row = {"seed": seed, "speakers": n_spk, "found": speaker_count(hyp), "count_ok": count_ok(ref, hyp),
               "seconds": round(samples.shape[0] / SAMPLE_RATE, 2), "turns": len(ref), "windows": n_win,
               "der": parts["diarization error rate"], "scored": parts["total"],
               "missed": parts["missed detection"], "false_alarm": parts["false alarm"],
               "confusion": parts["confusion"]}
        rows.append(row)
        if verbose:
            print(f"seed {seed}: {n_spk} speakers, found {row['found']}{'' if row['count_ok'] else ' (WRONG)'}; "
                  f"{row['seconds']:.1f} s, {row['turns']} turns, {n_win} windows; DER {row['der'] * 100:6.2f} % "
                  f"(miss {row['missed']:.2f} s, FA {row['false_alarm']:.2f} s, confusion {row['confusion']:.2f} s "
                  f"of {row['scored']:.2f} s)", flush=True)

    def summary(sel: list[dict[str, Any]]) -> dict[str, Any]:
        err = sum(r["missed"] + r["false_alarm"] + r["confusion"] for r in sel)
        tot = sum(r["scored"] for r in sel)
        return {"conversations": len(sel), "der": err / tot if tot else 0.0,
                "mean_der": float(np.mean([r["der"] for r in sel])),
                "count_accuracy": float(np.mean([r["count_ok"] for r in sel]))}

    by_n = {str(k): summary([r for r in rows if r["speakers"] == k]) for k in sorted({r["speakers"] for r in rows})}
    total = summary(rows)
    if verbose:
        for k, s in by_n.items():
            print(f"{k} speakers: {s['conversations']} conversations, DER {s['der'] * 100:.2f} % "
                  f"(mean {s['mean_der'] * 100:.2f} %), speaker count right {s['count_accuracy'] * 100:.0f} %")
        print(f"total: {total['conversations']} conversations, DER {total['der'] * 100:.2f} % "
              f"(mean {total['mean_der'] * 100:.2f} %), speaker count right {total['count_accuracy'] * 100:.0f} %; "
              f"vad {vad}, collar +-{collar} s, merge_thr {merge_thr}; {time.time() - t0:.0f} s")
    return {"model": str(model_dir), "vad": vad, "collar": collar, "merge_thr": merge_thr, "rows": rows,
            "by_speakers": by_n, "total": total}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", type=Path, default=DEFAULT_MODEL, help="CAM++ folder (ModelScope layout)")
    ap.add_argument("--n", type=int, default=24, help="conversations (speakers cycle 2, 3, 4)")
    ap.add_argument("--first-seed", type=int, default=1000)
    ap.add_argument("--vad", default="oracle", choices=["oracle", "fsmn"])
    ap.add_argument("--collar", type=float, default=0.25, help="seconds not scored each side of a boundary")
    ap.add_argument("--merge-thr", type=float, default=0.78, help="ClusterBackend merge_thr")
    ap.add_argument("--json", type=Path, help="write the figures here")
    a = ap.parse_args()
    res = evaluate(a.model, a.n, a.first_seed, a.vad, a.collar, a.merge_thr)
    if a.json:
        a.json.write_text(json.dumps(res, indent=1) + "\n", "utf-8")


if __name__ == "__main__":
    main()
