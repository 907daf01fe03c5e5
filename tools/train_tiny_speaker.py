#!/usr/bin/env python3
"""Trains a tiny CAM++ speaker-embedding model (FunASR's ``CAMPPlus`` class) on synthetic espeak-ng
speakers, on CPU, and writes it in the ModelScope/FunASR layout of iic/speech_campplus_sv_zh-cn_16k-common.

    python tools/train_tiny_speaker.py all --work WORK          # data + train + export + eval (resumable)
    python tools/train_tiny_speaker.py data|train|export|eval --work WORK [options]

Needs the test extra (torch 2.13 CPU, funasr 1.4.16) and espeak-ng. The recipe and the figures are in
docs/diarization.md; the diarization check is tools/eval_diarization.py.

- Speakers: every TRAIN_VARIANT of tests/speaker_fixture.py (75 espeak-ng variants) at PITCH_BANDS
  (2 pitch bands) = 150 training speakers; each utterance picks one of TRAIN_BASES (accent) at random,
  so the embedding does not key on accent. Per utterance: pitch +-4, speed (speaker's 130-190) +-12,
  word gap 0-30 ms, 1-6 of the 20 WORDS (tests/speaker_fixture.turn_words), trimmed of silence, peak
  -1..-20 dBFS, white noise 15-40 dB below the speech (tests/trained_model.add_noise).
- Windows (1.5 s, FunASR's sv_chunk window): "filled" windows = one speaker's utterances joined by
  0-0.1 s of silence, randomly cropped (what a long turn gives; without padding the net learns much
  faster), and from 40 % of the steps on, a growing share (50 % from 70 %) of single-utterance windows:
  a random crop, or the whole utterance zero-padded to 1.5 s as sv_chunk pads a short turn.
- Features: ``funasr.models.campplus.utils.extract_feature`` (Kaldi fbank 80, mean over the window off),
  on float samples in [-1, 1].
- Model: ``CAMPPlus(**MODEL_CONF)``; AAM-softmax (ArcFace) head, scale 20, margin 0 for the first 40 % of
  the steps, ramped to 0.2 by 70 %; Adam, warmup + cosine; bf16 autocast on CPU for the forward (weights F32).
- Export: the eval-mode state_dict in F32 (BatchNorm running statistics included) with
  ``torch.save`` (zip), ``config.yaml`` (``model: CAMPPlus``, ``model_conf``), ``configuration.json``
  (``file_path_metas``), ``meta.json`` (voices, held-out voices, training, EER) and README.md.
- Eval: speaker-verification EER on 1.5 s windows of held-out speakers (2 per HELDOUT_FAMILY, on
  HELDOUT_BASES), cosine scoring of all window pairs; also over the pairs of different families only.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))

from speaker_fixture import (  # noqa: E402
    HELDOUT_BASES,
    HELDOUT_FAMILIES,
    HELDOUT_VARIANTS,
    SAMPLE_RATE,
    TRAIN_BASES,
    TRAIN_VARIANTS,
    add_noise,
    installed_variants,
    synth,
    turn_words,
)

ARTIFACT = ROOT / "tests" / "data" / "tiny_speaker"
MODEL_CONF: dict[str, Any] = dict(feat_dim=80, embedding_size=128, growth_rate=12, bn_size=2, init_channels=64,
                                  config_str="batchnorm-relu", memory_efficient=True, output_level="segment")
PITCH_BANDS = (32, 64)  # speaker pitch centres (+-6 per speaker, +-4 per utterance)
WINDOW_S = 1.5  # FunASR's sv_chunk seg_dur
DATA_SEED = 11
TRAIN_SEED = 12
HELDOUT_SEED = 13
AAM_SCALE = 20.0
AAM_MARGIN = 0.2
RAMP = (0.4, 0.7)  # margin and single-utterance share: 0 until 40 % of the steps, full from 70 %
SINGLE_SHARE = 0.5  # share of single-utterance windows (short ones zero-padded, as sv_chunk pads) at the end
WEIGHTS_FILE = "campplus_cn_common.bin"


def quiet_funasr() -> None:
    """funasr prints install hints on import; silence them (stdout/stderr only during the import)."""
    import contextlib
    import io

    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
        import funasr.models.campplus.model  # noqa: F401
        import funasr.models.campplus.utils  # noqa: F401


# --- data ---------------------------------------------------------------------------------------

def train_speakers(seed: int) -> list[dict[str, Any]]:
    rng = np.random.default_rng(seed)
    out = []
    for v in TRAIN_VARIANTS:
        for band in PITCH_BANDS:
            out.append(dict(variant=v, pitch=int(band + rng.integers(-6, 7)), speed=int(rng.integers(130, 191))))
    return out


def heldout_speakers(seed: int, per_family: int = 2) -> list[dict[str, Any]]:
    """Two speakers per held-out family (different variants where the family has several), on different
    held-out bases and pitch apart."""
    rng = np.random.default_rng(seed)
    out = []
    for fam in HELDOUT_FAMILIES:
        bases = rng.choice(len(HELDOUT_BASES), size=per_family, replace=False)
        pitches = rng.choice([30, 45, 60, 72], size=per_family, replace=False)
        variants = rng.permutation(len(fam))
        for k, (b, p) in enumerate(zip(bases, pitches, strict=True)):
            out.append(dict(variant=fam[int(variants[k % len(fam)])], base=HELDOUT_BASES[int(b)],
                            pitch=int(p + rng.integers(-3, 4)), speed=int(rng.integers(135, 186))))
    return out


def utterance_recipes(speakers: list[dict[str, Any]], per_speaker: int, seed: int,
                      bases: tuple[str, ...] | None) -> list[dict[str, Any]]:
    rng = np.random.default_rng(seed)
    out = []
    for k in range(per_speaker):
        for s, spk in enumerate(speakers):
            base = spk["base"] if bases is None else bases[int(rng.integers(len(bases)))]
            out.append(dict(
                speaker=s, base=base, variant=spk["variant"], text=" ".join(turn_words(rng)),
                pitch=int(np.clip(spk["pitch"] + rng.integers(-4, 5), 0, 99)),
                speed=int(spk["speed"] + rng.integers(-12, 13)), gap=int(rng.integers(0, 4)),
                peak_db=round(float(rng.uniform(-20.0, -1.0)), 2), snr_db=round(float(rng.uniform(15.0, 40.0)), 2),
                noise_seed=int(rng.integers(1 << 31)), take=k,
            ))
    return out


def render(r: dict[str, Any]) -> np.ndarray:
    """Recipe -> noisy int16 utterance (trimmed speech, noise over it)."""
    x = synth(r["base"], r["variant"], r["text"], r["pitch"], r["speed"], r["gap"]) * 10.0 ** (r["peak_db"] / 20)
    clean = np.clip(np.round(x * 32767.0), -32768, 32767).astype(np.int16)
    return add_noise(clean, r["snr_db"], r["noise_seed"])


def write_set(work: Path, name: str, recipes: list[dict[str, Any]], procs: int) -> None:
    if (work / f"{name}_pcm.npy").exists():
        return
    import multiprocessing as mp

    t0 = time.time()
    if procs > 1:
        with mp.get_context("fork").Pool(procs) as pool:
            clips = list(pool.imap(render, recipes, chunksize=32))
    else:
        clips = []
        for i, r in enumerate(recipes):
            clips.append(render(r))
            if (i + 1) % 2000 == 0:
                print(f"data {name}: {i + 1}/{len(recipes)} ({time.time() - t0:.0f} s)", flush=True)
    lengths = np.array([c.shape[0] for c in clips], np.int64)
    np.save(work / f"{name}_offsets.npy", np.concatenate([[0], np.cumsum(lengths)]))
    (work / f"{name}_recipes.json").write_text(json.dumps(recipes), "utf-8")
    np.save(work / f"{name}_pcm.tmp.npy", np.concatenate(clips))
    os.replace(work / f"{name}_pcm.tmp.npy", work / f"{name}_pcm.npy")
    print(f"data {name}: {len(recipes)} utterances, {lengths.sum() / SAMPLE_RATE / 3600:.2f} h, "
          f"{time.time() - t0:.0f} s", flush=True)


def cmd_data(work: Path, per_speaker: int, heldout_per_speaker: int, procs: int) -> None:
    work.mkdir(parents=True, exist_ok=True)
    have = installed_variants()
    missing = [v for v in (*TRAIN_VARIANTS, *HELDOUT_VARIANTS) if v not in have]
    if missing:
        raise SystemExit(f"data: this espeak-ng lacks the variants {missing}")
    spk = train_speakers(DATA_SEED)
    write_set(work, "train", utterance_recipes(spk, per_speaker, DATA_SEED, TRAIN_BASES), procs)
    held = heldout_speakers(HELDOUT_SEED)
    write_set(work, "heldout", utterance_recipes(held, heldout_per_speaker, HELDOUT_SEED, None), procs)
    (work / "speakers.json").write_text(json.dumps({"train": spk, "heldout": held}, indent=1), "utf-8")


class Clips:
    """The stored utterances of one set (int16 PCM, offsets, recipes)."""

    def __init__(self, work: Path, name: str) -> None:
        self.pcm = np.load(work / f"{name}_pcm.npy", mmap_mode="r")
        self.offsets = np.load(work / f"{name}_offsets.npy")
        self.recipes = json.loads((work / f"{name}_recipes.json").read_text("utf-8"))
        self.labels = np.array([r["speaker"] for r in self.recipes], np.int64)

    def __len__(self) -> int:
        return len(self.recipes)

    def audio(self, i: int) -> np.ndarray:
        return np.asarray(self.pcm[self.offsets[i]: self.offsets[i + 1]], np.float32) / 32768.0


def filled_window(clips: Clips, pool: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """1.5 s of one speaker's speech: utterances from ``pool`` joined by 0-0.1 s of silence until the
    window is full, then a random 1.5 s crop (no padding: what a long turn gives)."""
    n = int(WINDOW_S * SAMPLE_RATE)
    parts, have = [], 0
    while have < n:
        x = clips.audio(int(rng.choice(pool)))
        parts += [x, np.zeros(int(rng.integers(0, SAMPLE_RATE // 10)), np.float32)]
        have += x.shape[0]
    return random_window(np.concatenate(parts), rng)


def random_window(x: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    n = int(WINDOW_S * SAMPLE_RATE)
    if x.shape[0] <= n:
        return np.pad(x, (0, n - x.shape[0]))
    s = int(rng.integers(0, x.shape[0] - n + 1))
    return x[s: s + n]


def sv_windows(x: np.ndarray) -> list[np.ndarray]:
    """FunASR's sv_chunk windows of one segment (1.5 s, shift 0.75 s, last aligned to the end, padded)."""
    from funasr.models.campplus.utils import sv_chunk

    return [c[2].astype(np.float32) for c in sv_chunk([[0.0, x.shape[0] / SAMPLE_RATE, x]])]


def features(windows: list[np.ndarray]):  # noqa: ANN201
    import torch
    from funasr.models.campplus.utils import extract_feature

    feats, _, _ = extract_feature([torch.from_numpy(np.ascontiguousarray(w, np.float32)) for w in windows])
    return feats.to(torch.float32)


def build_model(conf: dict[str, Any], train: bool = False):  # noqa: ANN201
    from funasr.models.campplus.model import CAMPPlus

    c = dict(conf)
    if train:
        c["memory_efficient"] = False  # no activation checkpointing: faster, same weights
    return CAMPPlus(**c)


class AAMSoftmax:
    """Additive angular margin softmax (ArcFace): logits s * cos(theta + m) for the target class."""

    def __init__(self, dim: int, n_classes: int, scale: float) -> None:
        import torch

        self.weight = torch.nn.Parameter(torch.empty(n_classes, dim))
        torch.nn.init.xavier_normal_(self.weight)
        self.scale = scale

    def logits(self, emb, labels, margin: float):  # noqa: ANN001, ANN201
        import torch
        import torch.nn.functional as F

        cos = F.linear(F.normalize(emb), F.normalize(self.weight)).clamp(-1 + 1e-7, 1 - 1e-7)
        if margin > 0:
            sin = torch.sqrt(1.0 - cos * cos)
            phi = cos * math.cos(margin) - sin * math.sin(margin)
            phi = torch.where(cos > math.cos(math.pi - margin), phi, cos - math.sin(math.pi - margin) * margin)
            one_hot = F.one_hot(labels, cos.shape[1]).to(cos.dtype)
            cos = one_hot * phi + (1.0 - one_hot) * cos
        return cos * self.scale


# --- training -----------------------------------------------------------------------------------

def cmd_train(work: Path, steps: int, batch: int, lr: float, warmup: int, eval_every: int, bf16: bool,
              stage: int = 1, ramp_at: tuple[float, float] = RAMP) -> None:
    """Stage 1 from scratch (train_state.pt); stage 2 starts from stage 1's weights (model and AAM head,
    a fresh optimizer and schedule, margin and single-utterance share full from ``ramp_at``) and writes
    train_state2.pt."""
    import torch
    import torch.nn.functional as F

    torch.set_num_threads(1)
    torch.manual_seed(TRAIN_SEED)
    clips = Clips(work, "train")
    n_spk = int(clips.labels.max()) + 1
    model = build_model(MODEL_CONF, train=True)
    head = AAMSoftmax(MODEL_CONF["embedding_size"], n_spk, AAM_SCALE)
    params = [*model.parameters(), head.weight]
    opt = torch.optim.Adam(params, lr=lr)
    rng = np.random.default_rng(TRAIN_SEED)
    held = heldout_windows(work, limit=240)
    pools = [np.nonzero(clips.labels == k)[0] for k in range(n_spk)]

    def lr_at(step: int) -> float:
        if step < warmup:
            return lr * (step + 1) / warmup
        t = min(1.0, (step - warmup) / max(1, steps - warmup))
        return lr * (0.01 + 0.99 * 0.5 * (1 + math.cos(math.pi * t)))

    def ramp(step: int, top: float) -> float:  # 0 until ramp_at[0] of the steps, `top` from ramp_at[1]
        a, b = ramp_at[0] * steps, ramp_at[1] * steps
        return top * min(1.0, max(0.0, (step - a) / max(1.0, b - a)))

    def margin_at(step: int) -> float:  # plain softmax first, then the margin ramps in
        return ramp(step, AAM_MARGIN)

    suffix = "" if stage == 1 else str(stage)
    state_path, log_path = work / f"train_state{suffix}.pt", work / f"train_log{suffix}.jsonl"
    step, elapsed = 0, 0.0
    if stage > 1 and not state_path.exists():
        st = torch.load(work / "train_state.pt", weights_only=False)
        if st["step"] < st["hparams"]["steps"]:
            raise SystemExit("train: stage 1 has not finished")
        model.load_state_dict(st["model"])
        with torch.no_grad():
            head.weight.copy_(st["head"])
        rng = np.random.default_rng([TRAIN_SEED, stage])
        print(f"train: stage {stage} from stage 1 ({st['step']} steps, {st['elapsed'] / 60:.1f} min)", flush=True)
    if state_path.exists():
        st = torch.load(state_path, weights_only=False)
        model.load_state_dict(st["model"])
        with torch.no_grad():
            head.weight.copy_(st["head"])
        opt.load_state_dict(st["opt"])
        step, elapsed = st["step"], st["elapsed"]
        rng.bit_generator.state = st["rng"]
        torch.set_rng_state(st["torch_rng"])
        print(f"train: resumed at step {step} ({elapsed / 60:.1f} min)", flush=True)
    n_params = sum(p.numel() for p in model.parameters())
    print(f"train: CAMPPlus {MODEL_CONF} ({n_params / 1e6:.3f} M parameters), {n_spk} speakers, {len(clips)} "
          f"utterances; batch {batch}, {steps} steps, lr {lr}, bf16 {bf16}", flush=True)

    def save() -> None:
        torch.save({"model": model.state_dict(), "head": head.weight.detach().clone(), "opt": opt.state_dict(),
                    "step": step, "elapsed": elapsed, "rng": rng.bit_generator.state,
                    "torch_rng": torch.get_rng_state(), "conf": MODEL_CONF, "n_speakers": n_spk,
                    "hparams": {"steps": steps, "batch": batch, "lr": lr, "warmup": warmup, "bf16": bf16,
                                "ramp": list(ramp_at)}, "stage": stage},
                   work / "train_state.tmp.pt")
        os.replace(work / "train_state.tmp.pt", state_path)

    acc_loss, acc_correct, acc_n = 0.0, 0, 0
    model.train()
    while step < steps:
        t0 = time.time()
        for g in opt.param_groups:
            g["lr"] = lr_at(step)
        idx = rng.integers(0, len(clips), size=batch)
        p_single = ramp(step, SINGLE_SHARE)
        x = features([random_window(clips.audio(int(i)), rng) if rng.random() < p_single
                      else filled_window(clips, pools[int(clips.labels[i])], rng) for i in idx])
        labels = torch.from_numpy(clips.labels[idx])
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
            emb = model(x)
        logits = head.logits(emb.float(), labels, margin_at(step))
        loss = F.cross_entropy(logits, labels)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 5.0)
        opt.step()
        step += 1
        elapsed += time.time() - t0
        acc_loss += loss.item()
        acc_correct += int((logits.argmax(1) == labels).sum())
        acc_n += batch
        if step % 25 == 0 or step == steps:
            rec: dict[str, Any] = {"step": step, "loss": acc_loss / (acc_n / batch), "acc": acc_correct / acc_n,
                                   "lr": lr_at(step), "margin": margin_at(step), "single": ramp(step, SINGLE_SHARE),
                                   "minutes": elapsed / 60}
            msg = (f"step {step} loss {rec['loss']:.3f} acc {rec['acc']:.3f} lr {rec['lr']:.2e} m {rec['margin']:.2f} "
                   f"{elapsed / step:.2f} s/step {elapsed / 60:.1f} min")
            if step % eval_every == 0 or step == steps:
                model.eval()
                rec["heldout_eer"] = eer_of(model, *held)["eer"]
                model.train()
                msg += f"  held-out EER {rec['heldout_eer'] * 100:.2f} % ({len(held[1])} windows)"
            print(msg, flush=True)
            with log_path.open("a") as f:
                f.write(json.dumps(rec) + "\n")
            acc_loss, acc_correct, acc_n = 0.0, 0, 0
        if step % 100 == 0 or step == steps:
            save()


# --- evaluation ---------------------------------------------------------------------------------

def heldout_windows(work: Path, limit: int | None = None) -> tuple[list[np.ndarray], np.ndarray, np.ndarray]:
    """sv_chunk windows of the held-out utterances: (windows, speaker label, family index)."""
    quiet_funasr()
    clips = Clips(work, "heldout")
    n = len(clips) if limit is None else min(limit, len(clips))
    wins, labels, variants = [], [], []
    for i in range(n):
        r = clips.recipes[i]
        for w in sv_windows(clips.audio(i)):
            wins.append(w)
            labels.append(r["speaker"])
            variants.append(next(k for k, fam in enumerate(HELDOUT_FAMILIES) if r["variant"] in fam))
    return wins, np.array(labels), np.array(variants)


def embed(model, windows: list[np.ndarray], batch: int = 64) -> np.ndarray:  # noqa: ANN001
    import torch

    out = []
    with torch.no_grad():
        for k in range(0, len(windows), batch):
            out.append(model(features(windows[k: k + batch])).numpy())
    return np.concatenate(out)


def eer_of(model, windows: list[np.ndarray], labels: np.ndarray, variants: np.ndarray) -> dict[str, Any]:  # noqa: ANN001
    """Equal error rate of cosine scores over all window pairs; also with the non-target trials restricted
    to different families (the diarization case: a conversation's speakers come from distinct families)."""
    from sklearn.metrics import roc_curve

    e = embed(model, windows)
    e = e / np.linalg.norm(e, axis=1, keepdims=True)
    s = e @ e.T
    iu = np.triu_indices(len(labels), 1)
    scores, same = s[iu], (labels[:, None] == labels[None, :])[iu]
    diff_variant = (variants[:, None] != variants[None, :])[iu]

    def eer(sc: np.ndarray, y: np.ndarray) -> tuple[float, float]:
        fpr, tpr, thr = roc_curve(y, sc)
        fnr = 1 - tpr
        k = int(np.nanargmin(np.abs(fnr - fpr)))
        return float((fpr[k] + fnr[k]) / 2), float(thr[k])

    all_eer, all_thr = eer(scores, same)
    keep = same | diff_variant
    dv_eer, _ = eer(scores[keep], same[keep])
    return {"eer": all_eer, "threshold": all_thr, "eer_diff_family": dv_eer, "windows": len(labels),
            "target_trials": int(same.sum()), "nontarget_trials": int((~same).sum()),
            "mean_target_cos": float(scores[same].mean()), "mean_nontarget_cos": float(scores[~same].mean())}


def load_artifact(out: Path):  # noqa: ANN201
    import torch
    import yaml

    quiet_funasr()
    cfg = yaml.safe_load((out / "config.yaml").read_text("utf-8"))
    model = build_model(cfg["model_conf"])
    model.load_state_dict(torch.load(out / WEIGHTS_FILE, map_location="cpu", weights_only=True))
    return model.eval()


def cmd_eval(work: Path, out: Path) -> dict[str, Any]:
    import torch

    torch.set_num_threads(1)
    model = load_artifact(out)
    res = eer_of(model, *heldout_windows(work))
    print(f"eval: held-out EER {res['eer'] * 100:.2f} % (threshold cos {res['threshold']:.3f}), different-family "
          f"EER {res['eer_diff_family'] * 100:.2f} %; {res['windows']} windows, {res['target_trials']} target / "
          f"{res['nontarget_trials']} non-target trials; mean cos target {res['mean_target_cos']:.3f}, "
          f"non-target {res['mean_nontarget_cos']:.3f}", flush=True)
    meta_path = out / "meta.json"
    meta = json.loads(meta_path.read_text("utf-8"))
    meta["heldout_verification"] = {k: (round(v, 4) if isinstance(v, float) else v) for k, v in res.items()}
    meta_path.write_text(json.dumps(meta, indent=1) + "\n", "utf-8")
    return res


# --- export -------------------------------------------------------------------------------------

CONFIG_YAML = """\
# Tiny CAM++ trained by tools/train_tiny_speaker.py on synthetic espeak-ng speakers (tests only).
# Layout of ModelScope's iic/speech_campplus_sv_zh-cn_16k-common (FunASR's CAMPPlus).
model: CAMPPlus
model_conf:
{conf}
"""


def yaml_value(v: Any) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, str):
        return f"'{v}'"
    return str(v)


def cmd_export(work: Path, out: Path) -> None:
    import collections

    import torch

    stages = [torch.load(work / name, weights_only=False) for name in ("train_state.pt", "train_state2.pt")
              if (work / name).exists()]
    st = stages[-1]
    model = build_model(st["conf"])
    model.load_state_dict(st["model"])
    model.eval()
    sd = collections.OrderedDict((k, v.detach().clone().contiguous().to(torch.float32)
                                  if v.is_floating_point() else v.detach().clone().contiguous())
                                 for k, v in model.state_dict().items())
    out.mkdir(parents=True, exist_ok=True)
    for p in out.iterdir():
        if p.is_file():
            p.unlink()
    torch.save(sd, out / WEIGHTS_FILE)
    conf = "\n".join(f"    {k}: {yaml_value(v)}" for k, v in st["conf"].items())
    (out / "config.yaml").write_text(CONFIG_YAML.format(conf=conf), "utf-8")
    (out / "configuration.json").write_text(json.dumps({
        "framework": "pytorch", "task": "speaker-verification", "model": {"type": "funasr"},
        "pipeline": {"type": "funasr-pipeline"},
        "file_path_metas": {"init_param": WEIGHTS_FILE, "config": "config.yaml"},
    }, indent=4) + "\n", "utf-8")
    speakers = json.loads((work / "speakers.json").read_text("utf-8"))
    espeak = subprocess.run(["espeak-ng", "--version"], capture_output=True, text=True).stdout
    espeak = espeak.split("  Data at")[0].strip()
    log_name = "train_log.jsonl" if len(stages) == 1 else "train_log2.jsonl"
    log = [json.loads(line) for line in (work / log_name).read_text("utf-8").splitlines()]
    minutes = round(sum(x["elapsed"] for x in stages) / 60, 1)
    meta = {
        "description": "Tiny CAM++ (FunASR CAMPPlus) trained by tools/train_tiny_speaker.py on espeak-ng speakers; "
                       "for tests only (not a real speaker model)",
        "model_conf": st["conf"],
        "parameters": int(sum(v.numel() for v in sd.values() if v.is_floating_point())),
        "espeak_ng": espeak,
        "features": "funasr.models.campplus.utils.extract_feature: Kaldi fbank 80 (dither 0) minus its mean; "
                    "input float samples in [-1, 1], 16 kHz",
        "training": {"steps": sum(x["step"] for x in stages), "minutes": minutes, "speakers": st["n_speakers"],
                     "final_loss": round(log[-1]["loss"], 4), "final_train_acc": round(log[-1]["acc"], 4),
                     "aam": {"scale": AAM_SCALE, "margin": AAM_MARGIN}, "window_s": WINDOW_S,
                     "single_share": SINGLE_SHARE, "optimizer": "Adam, warmup + cosine, one CPU thread",
                     "stages": [{**x.get("hparams", {}), "minutes": round(x["elapsed"] / 60, 1)} for x in stages],
                     "seeds": {"data": DATA_SEED, "train": TRAIN_SEED, "heldout": HELDOUT_SEED}},
        "train_voices": {"bases": list(TRAIN_BASES), "variants": list(TRAIN_VARIANTS),
                         "pitch_bands": list(PITCH_BANDS)},
        "heldout_voices": {"bases": list(HELDOUT_BASES), "variant_families": [list(f) for f in HELDOUT_FAMILIES],
                           "verification_speakers": speakers["heldout"]},
    }
    (out / "meta.json").write_text(json.dumps(meta, indent=1) + "\n", "utf-8")
    (out / "README.md").write_text(README.format(
        conf=", ".join(f"{k}={v}" for k, v in st["conf"].items()), steps=meta["training"]["steps"],
        minutes=meta["training"]["minutes"], n_spk=st["n_speakers"], n_train_var=len(TRAIN_VARIANTS),
        n_bands=len(PITCH_BANDS), train_bases=", ".join(TRAIN_BASES), heldout_bases=", ".join(HELDOUT_BASES),
        heldout_variants="; ".join(", ".join(f) for f in HELDOUT_FAMILIES), espeak=espeak), "utf-8")
    # The written file must load back, tensors only, into FunASR's class and give the same embeddings.
    again = load_artifact(out)
    x = features([np.random.default_rng(0).standard_normal(24000).astype(np.float32) * 0.1])
    with torch.no_grad():
        a, b = model(x), again(x)
    if not torch.equal(a, b):
        raise SystemExit("export: reloaded model differs")
    size = sum(p.stat().st_size for p in out.iterdir() if p.is_file())
    print(f"export: {out} ({size / 1e6:.2f} MB), {meta['parameters'] / 1e6:.3f} M parameters", flush=True)


README = """\
# tiny_speaker: a tiny CAM++ trained on synthetic speakers (tests only)

FunASR's `CAMPPlus` trained by `tools/train_tiny_speaker.py` ({steps} steps, {minutes} min on one CPU
thread) on {n_spk} espeak-ng speakers: {n_train_var} voice variants x {n_bands} pitch bands, each utterance
in one of the accents {train_bases}.

- `config.yaml`: `model: CAMPPlus`, `model_conf` ({conf})
- `configuration.json`: `file_path_metas` (init_param, config), as ModelScope's
  `iic/speech_campplus_sv_zh-cn_16k-common`; `funasr.AutoModel(model=<this folder>)` loads it
- `campplus_cn_common.bin`: `torch.save` of the eval-mode state_dict (F32, BatchNorm statistics included)
- `meta.json`: voice lists, training figures, held-out speaker-verification EER

Held out (never in training; tests/speaker_fixture.py builds its conversations from these only, one
variant per family and speaker):

- accents: {heldout_bases}
- variants, by family: {heldout_variants}

Synthesised with {espeak}. docs/diarization.md has the recipe and the diarization error rates.
"""


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("command", choices=["data", "train", "export", "eval", "all"])
    ap.add_argument("--work", type=Path, required=True, help="work folder (clips, training state)")
    ap.add_argument("--out", type=Path, default=ARTIFACT, help=f"artifact folder (default {ARTIFACT})")
    ap.add_argument("--per-speaker", type=int, default=80, help="training utterances per speaker")
    ap.add_argument("--heldout-per-speaker", type=int, default=12, help="held-out utterances per speaker")
    ap.add_argument("--procs", type=int, default=1, help="processes for the data")
    ap.add_argument("--steps", type=int, default=850)
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--lr", type=float, default=3e-3)
    ap.add_argument("--warmup", type=int, default=40)
    ap.add_argument("--stage2-steps", type=int, default=600, help="stage 2 (from stage 1's weights); 0 = none")
    ap.add_argument("--stage2-lr", type=float, default=1e-3)
    ap.add_argument("--stage2-warmup", type=int, default=20)
    ap.add_argument("--eval-every", type=int, default=250)
    ap.add_argument("--no-bf16", action="store_true", help="train in F32 (about 2x slower on CPU)")
    a = ap.parse_args()
    if a.command in ("data", "all"):
        cmd_data(a.work, a.per_speaker, a.heldout_per_speaker, a.procs)
    if a.command in ("train", "all"):
        quiet_funasr()
        cmd_train(a.work, a.steps, a.batch, a.lr, a.warmup, a.eval_every, not a.no_bf16)
        if a.stage2_steps > 0:
            cmd_train(a.work, a.stage2_steps, a.batch, a.stage2_lr, a.stage2_warmup, a.eval_every, not a.no_bf16,
                      stage=2, ramp_at=(0.0, 0.0))
    if a.command in ("export", "all"):
        quiet_funasr()
        cmd_export(a.work, a.out)
    if a.command in ("eval", "all"):
        cmd_eval(a.work, a.out)


if __name__ == "__main__":
    main()
