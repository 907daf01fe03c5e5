#!/usr/bin/env python3
"""Trains a CTC head for the tiny trained model (the `-m demo` model), so that tests and benchmarks can
judge what needs a CTC head that hears: CTC drafts for speculative decoding, word timestamps.

The demo model is a Hugging Face layout checkpoint and has no CTC head (the HF port has none). FunASR's own
checkpoints carry one (``ctc_decoder`` + ``ctc.ctc_lo`` over the encoder output, SenseVoice tiktoken
vocabulary). This trains that head on the frozen demo encoder: ``ctc_decoder`` with ``n_layer`` 0
(linear1 -> ReLU -> linear2; FunASR's Transformer adaptor class with no blocks) and ``ctc_lo``, CTC loss on
the transcripts tokenized by a SenseVoice-style tiktoken vocabulary (the 256 bytes + BPE merges learned on the
20 words, then the SenseVoice special tokens, blank = the last id, as in the release).

    python tools/train_tiny_ctc.py all --work WORK [--clips 4000] [--steps 3000] [--threads 2]

writes ``tests/data/tiny_trained/ctc_head.safetensors`` + ``ctc_head.json`` (the trained head, F16, only the
vocabulary rows the transcripts use; the others are regenerated as zero weights with a large negative bias)
which ``tests/trained_ctc.py`` adds to a demo package (``demo_with_ctc``). Needs torch and espeak-ng.
The training clips come from another seed than the demo's training and held-out sets.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))
sys.path.insert(0, str(ROOT / "tools"))

from make_funasr_checkpoint import make_tiktoken_vocab  # noqa: E402
from train_tiny import make_recordings, synth_recording  # noqa: E402
from trained_ctc import ARTIFACT_JSON, ARTIFACT_WEIGHTS, demo_gguf, tokenizer  # noqa: E402
from trained_model import WORDS  # noqa: E402

CTC_SEED = 3  # the demo's training clips use seed 1, its held-out clips seed 2
PROJ = 256  # ctc_decoder.linear1 width (the release: 2048 over a 512-wide encoder)


def learn_ranks(n_merges: int) -> list[bytes]:
    """Byte-level BPE on the 20 words written alone: 256 bytes, then merges by pair frequency
    (tools/make_funasr_checkpoint.py's learner on this corpus) until each word is one token. No merge joins a
    space to a word, so " five" is " " + "five": a word is the same label wherever it stands, and the head
    emits a space label at each word's start, which for the first word ``draft_text`` strips (a head that sees
    one frame at a time cannot tell the first word of a recording from a later one)."""
    return make_tiktoken_vocab(n_merges, list(WORDS))


def _clip(r: dict[str, Any]) -> np.ndarray:
    return synth_recording(r)


def cmd_data(work: Path, clips: int, procs: int) -> None:
    """Encoder outputs of the demo model (the package's own encoder, F32) for `clips` new clips."""
    import fun_asr

    work.mkdir(parents=True, exist_ok=True)
    if (work / "ctc_enc.npz").exists():
        return
    recipes = make_recordings(clips, CTC_SEED)
    t0 = time.time()
    with mp.get_context("fork").Pool(procs) as pool:
        audio = list(pool.imap(_clip, recipes, chunksize=32))
    print(f"data: {clips} clips synthesized, {time.time() - t0:.0f} s", flush=True)
    from fun_asr.audio.frontend import features

    s = fun_asr.Session(str(demo_gguf(work, "f32")), device="cpu", vad=None, progress=False)
    encs = []
    for x in audio:
        f = features(x.astype(np.float32) / 32768.0, s.frontend)
        encs.append(s.model.encode_keep_encoder(f)[1].astype(np.float16))
    lengths = np.array([e.shape[0] for e in encs], np.int64)
    np.savez(work / "ctc_enc.npz", enc=np.concatenate(encs), offsets=np.concatenate([[0], np.cumsum(lengths)]),
             texts=np.array([r["text"] for r in recipes]))
    print(f"data: encoder outputs of {clips} clips ({lengths.sum()} frames), {time.time() - t0:.0f} s", flush=True)


def cmd_train(work: Path, steps: int, batch: int, threads: int, n_merges: int) -> None:
    import torch

    torch.manual_seed(0)
    torch.set_num_threads(threads)
    ranks = learn_ranks(n_merges)
    tok = tokenizer(ranks)
    data = np.load(work / "ctc_enc.npz")
    enc, offsets, texts = data["enc"], data["offsets"], [str(t) for t in data["texts"]]
    targets = [tok.encode(t) for t in texts]
    vocab = tok.vocab_size
    blank = vocab - 1
    d = enc.shape[1]
    head = torch.nn.Sequential(torch.nn.Linear(d, PROJ), torch.nn.ReLU(), torch.nn.Linear(PROJ, d),
                               torch.nn.Linear(d, vocab))
    opt = torch.optim.AdamW(head.parameters(), lr=2e-3, weight_decay=0.01)
    sched = torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=2e-3, total_steps=steps, pct_start=0.1)
    rng = np.random.default_rng(0)
    n = len(texts)
    t0 = time.time()
    for step in range(steps):
        idx = rng.choice(n, size=batch, replace=False)
        xs = [torch.from_numpy(enc[offsets[i]:offsets[i + 1]].astype(np.float32)) for i in idx]
        lens = torch.tensor([x.shape[0] for x in xs])
        x = torch.nn.utils.rnn.pad_sequence(xs, batch_first=True)
        logp = torch.log_softmax(head(x), dim=-1).transpose(0, 1)
        ys = [torch.tensor(targets[i]) for i in idx]
        loss = torch.nn.functional.ctc_loss(logp, torch.cat(ys), lens, torch.tensor([len(y) for y in ys]),
                                            blank=blank, zero_infinity=True)
        opt.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(head.parameters(), 1.0)
        opt.step()
        sched.step()
        if step % 200 == 0 or step == steps - 1:
            print(f"train: step {step} loss {loss.item():.4f} {time.time() - t0:.0f} s", flush=True)
    used = sorted({t for ts in targets for t in ts} | {blank})
    lin1, lin2, lo = head[0], head[2], head[3]
    from safetensors.numpy import save_file

    save_file({
        "ctc_decoder.linear1.weight": lin1.weight.detach().numpy().astype(np.float16),
        "ctc_decoder.linear1.bias": lin1.bias.detach().numpy().astype(np.float16),
        "ctc_decoder.linear2.weight": lin2.weight.detach().numpy().astype(np.float16),
        "ctc_decoder.linear2.bias": lin2.bias.detach().numpy().astype(np.float16),
        "ctc.ctc_lo.weight.used_rows": lo.weight.detach().numpy()[used].astype(np.float16),
        "ctc.ctc_lo.bias.used_rows": lo.bias.detach().numpy()[used].astype(np.float16),
    }, str(ARTIFACT_WEIGHTS))
    import base64

    ARTIFACT_JSON.write_text(json.dumps({
        "ranks": [base64.b64encode(r).decode() for r in ranks], "used_rows": used, "vocab": vocab, "blank": blank,
        "proj": PROJ, "unused_bias": -30.0, "clips": n, "steps": steps, "batch": batch, "seed": CTC_SEED,
    }, indent=1), "utf-8")
    print(f"export: {ARTIFACT_WEIGHTS} ({ARTIFACT_WEIGHTS.stat().st_size} bytes), {ARTIFACT_JSON}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("command", choices=["data", "train", "all"])
    ap.add_argument("--work", type=Path, required=True)
    ap.add_argument("--clips", type=int, default=4000)
    ap.add_argument("--steps", type=int, default=3000)
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--merges", type=int, default=120,
                    help="most BPE merges (the learner stops once every word is one token: 46)")
    a = ap.parse_args()
    if a.command in ("data", "all"):
        cmd_data(a.work, a.clips, a.threads)
    if a.command in ("train", "all"):
        cmd_train(a.work, a.steps, a.batch, a.threads, a.merges)


if __name__ == "__main__":
    main()
