#!/usr/bin/env python3
"""Speakers of short recordings: the speaker count and the turn labels that ``diarize=True`` gives with the
default clustering (``speaker_clustering="auto"``: agglomerative under 20 speaker windows) and with FunASR's
(``"funasr"``: one speaker under 20 windows), on synthetic conversations of held-out espeak-ng voices.

    python tools/eval_short_conversations.py [--turns 2,4,6,8,12,16,20,30] [--voices 1,2,3,4] [--seeds 3]
        [--first-seed 0] [--sweep 0.3,0.4,...] [--linkage average,complete] [--json OUT]

The whole pipeline of tests/test_diarization.py: the 20-word demo model behind the real FSMN-VAD
(tests/vad_fixture.py), the trained tiny CAM++ (tests/data/tiny_speaker, converted here), on
``speaker_fixture.make_short_conversation(seed, voices, turns)`` (turns of 2-6 words, pauses 0.8-2.0 s), ``--seeds``
conversations (seeds from ``--first-seed``) in every turns x voices cell (voices <= turns). A turn is labelled
right when the result's segment that overlaps it most has its speaker under the best one-to-one speaker mapping
(``speaker_fixture.turns_right``). The table gives, per cell, how many conversations got the right speaker count
with each clustering, and per row the share of turns labelled right.

``--sweep``: the agglomerative cut (``ahc_threshold``, mean cosine between two groups' windows) re-run on the
windows each recording's pipeline embedded, for each threshold (and ``--linkage`` method), scored on the
speaker timeline (``Transcription.speakers``); recordings of 20 windows or more are FunASR's clustering
whatever the threshold and are left out of the sweep.
"""

from __future__ import annotations

import argparse
import datetime
import json
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))

import speaker_fixture  # noqa: E402

SR = 16000
TINY_SPEAKER = ROOT / "tests" / "data" / "tiny_speaker"


def _ints(text: str) -> list[int]:
    return [int(v) for v in text.split(",") if v.strip()]


def _floats(text: str) -> list[float]:
    return [float(v) for v in text.split(",") if v.strip()]


def session(work: Path) -> Any:
    import fun_asr
    from fun_asr.converter.speaker import convert_speaker
    from vad_fixture import fsmn_vad_dir

    gguf = work / "tiny-campplus.gguf"
    convert_speaker(TINY_SPEAKER, gguf)
    return fun_asr.Session("demo", device="cpu", vad="fsmn", vad_model=fsmn_vad_dir(), progress=False,
                           speaker_model=gguf)


def score(ref: list, hyp: list) -> tuple[bool, int]:
    """(count right, turns right) of hypothesis turns ``[(start, end, speaker)]``."""
    return speaker_fixture.count_ok(ref, hyp), speaker_fixture.turns_right(ref, hyp)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--turns", default="2,4,6,8,12,16,20,30", help="turns per conversation (comma-separated)")
    ap.add_argument("--voices", default="1,2,3,4", help="voices per conversation (comma-separated)")
    ap.add_argument("--seeds", type=int, default=3, help="conversations per turns x voices cell")
    ap.add_argument("--first-seed", type=int, default=0, help="their seeds: FIRST.. FIRST+SEEDS-1")
    ap.add_argument("--sweep", default="", help="ahc_threshold values to re-cluster with (comma-separated)")
    ap.add_argument("--linkage", default="average", help="linkage methods for --sweep (comma-separated)")
    ap.add_argument("--json", type=Path, default=None, help="write every conversation's figures here")
    args = ap.parse_args(argv)
    from fun_asr.speakers import cluster as cl
    from fun_asr.speakers.diarize import RecordingSpeakers
    from fun_asr.speakers.timeline import speaker_timeline

    captured: list[tuple[np.ndarray, list[tuple[float, float]]]] = []
    label = RecordingSpeakers.label

    def capture(self: RecordingSpeakers, *given: Any, **named: Any) -> Any:
        emb = self.embeddings()
        order = sorted(range(len(self.windows)), key=lambda i: self.windows[i][0])
        captured.append((emb[order] if emb.shape[0] else emb, [self.windows[i] for i in order]))
        return label(self, *given, **named)

    RecordingSpeakers.label = capture  # type: ignore[method-assign]
    rows: list[dict[str, Any]] = []
    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp:
        s = session(Path(tmp))
        for turns in _ints(args.turns):
            for voices in _ints(args.voices):
                if voices > turns:
                    continue
                for seed in range(args.first_seed, args.first_seed + args.seeds):
                    x, ref = speaker_fixture.make_short_conversation(seed, voices, turns)
                    row: dict[str, Any] = {"seed": seed, "voices": voices, "turns": turns,
                                           "seconds": round(x.size / SR, 1)}
                    for mode in ("auto", "funasr"):
                        captured.clear()
                        r = s.transcribe(x, sample_rate=SR, diarize=True, speaker_clustering=mode)
                        hyp = [(g.start, g.end, f"S{g.speaker}") for g in r.segments if g.speaker is not None]
                        ok, right = score(ref, hyp)
                        row[mode] = {"found": r.num_speakers, "count_right": ok, "turns_right": right}
                    emb, windows = captured[-1]
                    row["windows"] = int(emb.shape[0])
                    if args.sweep and 1 < emb.shape[0] < cl.SMALL_WINDOWS:
                        row["sweep"] = {}
                        for method in args.linkage.split(","):
                            cl.AHC_LINKAGE = method
                            for thr in _floats(args.sweep):
                                labels = cl.cluster_speakers(emb, ahc_threshold=thr)
                                timeline = [(a, b, f"S{k}") for a, b, k in speaker_timeline(windows, labels)]
                                ok, right = score(ref, timeline)
                                row["sweep"][f"{method}@{thr:g}"] = {"count_right": ok, "turns_right": right}
                        cl.AHC_LINKAGE = "average"
                    rows.append(row)
                    print(f"{turns:2d} turns {voices} voices seed {seed}: {row['seconds']:5.1f} s, "
                          f"{row['windows']:2d} windows; auto found {row['auto']['found']} "
                          f"({row['auto']['turns_right']}/{turns} turns), funasr {row['funasr']['found']} "
                          f"({row['funasr']['turns_right']}/{turns})", flush=True)
    took = time.perf_counter() - t0
    print(f"\n{len(rows)} conversations in {took:.0f} s ({datetime.date.today()})\n")
    voices_list = _ints(args.voices)
    print("speaker count right, auto / funasr, of the conversations in each cell; turns labelled right, auto / "
          "funasr\n")
    print("| turns | windows | " + " | ".join(f"{v} voice{'s' if v > 1 else ''}" for v in voices_list)
          + " | turns right |")
    print("|---|---|" + "---|" * len(voices_list) + "---|")
    for turns in _ints(args.turns):
        line = [r for r in rows if r["turns"] == turns]
        if not line:
            continue
        cells = []
        for voices in voices_list:
            cell = [r for r in line if r["voices"] == voices]
            cells.append(f"{sum(r['auto']['count_right'] for r in cell)}/{len(cell)} · "
                         f"{sum(r['funasr']['count_right'] for r in cell)}/{len(cell)}" if cell else "—")
        total = sum(r["turns"] for r in line)
        right = [100 * sum(r[m]["turns_right"] for r in line) / total for m in ("auto", "funasr")]
        print(f"| {turns} | {min(r['windows'] for r in line)}–{max(r['windows'] for r in line)} | "
              + " | ".join(cells) + f" | {right[0]:.0f} % · {right[1]:.0f} % |")
    for group, keep in (("under 20 windows", lambda r: r["windows"] < 20), ("20 windows or more",
                                                                            lambda r: r["windows"] >= 20)):
        sel = [r for r in rows if keep(r)]
        if sel:
            line = [f"{group}: {len(sel)} conversations"]
            for mode in ("auto", "funasr"):
                line.append(f"{mode}: count right {sum(r[mode]['count_right'] for r in sel)}, all turns right "
                            f"{sum(r[mode]['turns_right'] == r['turns'] for r in sel)}, turns right "
                            f"{100 * sum(r[mode]['turns_right'] for r in sel) / sum(r['turns'] for r in sel):.1f} %")
            print("; ".join(line))
    swept = [r for r in rows if "sweep" in r]
    if swept:
        print(f"\nsweep over {len(swept)} conversations under 20 windows (timeline-scored):")
        print("| linkage @ threshold | count right | all turns right | turns right | count right, 1 voice |")
        print("|---|---|---|---|---|")
        total = sum(r["turns"] for r in swept)
        for key in swept[0]["sweep"]:
            one = [r for r in swept if r["voices"] == 1]
            print(f"| {key} | {sum(r['sweep'][key]['count_right'] for r in swept)} | "
                  f"{sum(r['sweep'][key]['turns_right'] == r['turns'] for r in swept)} | "
                  f"{100 * sum(r['sweep'][key]['turns_right'] for r in swept) / total:.1f} % | "
                  f"{sum(r['sweep'][key]['count_right'] for r in one)}/{len(one)} |")
    if args.json:
        args.json.write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
