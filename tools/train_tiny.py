#!/usr/bin/env python3
"""Trains a tiny Fun-ASR-Nano that hears: synthetic speech (espeak-ng) of a 20-word vocabulary,
exactly our architecture (Transformers' ``fun_asr_nano`` modules) and FunASR's semantics, on CPU.

    python tools/train_tiny.py all --work WORK            # data + train + export + eval (resumable)
    python tools/train_tiny.py data|train|export|eval --work WORK [options]

Needs the test extra (torch 2.13 CPU, transformers 5.23) and espeak-ng (``apt-get install espeak-ng``).
See docs/trained_model.md for the recipe, the exact command that regenerated the committed artifact
(tests/data/tiny_trained), the training curve and the WER table.

- Data (``make_recordings``): recordings of 1-3 utterances of 1-4 words from WORDS joined by 0.2-1.5 s pauses,
  270 espeak-ng voices (VOICES: 9 English accents x 30 variants; one voice per recording or one per utterance),
  110-230 wpm, pitch 20-80, word gap 0-40 ms, resampled to 16 kHz (soxr), 0.05-0.6 s of silence either side,
  peak -1..-35 dBFS; 40 % digitally clean (exact zeros around the words), the rest white / pink / brown noise
  10-40 dB below the speech (``add_noise``); every choice from numpy with a fixed seed; no recording's transcript is
  a held-out clip's multi-word transcript. The held-out clips (``make_recipes``, HELDOUT_VOICES) are the committed ones.
- Features: ``fun_asr.audio.frontend`` (x32768 Kaldi fbank, LFR 7/6): exactly what the package computes.
- Model: ``FunAsrNanoForConditionalGeneration`` with ``model_config()``; the adaptor and encoder
  attend with the padding mask (sdpa with the mask set on every sub-config), the FSMN masks padding.
- Sequence (FunASR): prompt before the audio, the first ``fake_token_len(T_lfr)`` adaptor rows, prompt
  after the audio, the transcript; cross entropy on the transcript tokens and ``<|im_end|>``.
- Speed: the token embedding rows that the prompt and the transcripts use are trainable; every other
  row stays at its seeded random value (``embedding_base``). The output softmax (tied weights) runs
  over the used rows plus a fresh sample of 2048 frozen rows each step (sampled softmax); evaluation
  and the package decode over the full 151,936-entry vocabulary.
"""

from __future__ import annotations

import argparse
import io
import json
import math
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))
sys.path.insert(0, str(ROOT / "tools"))

from make_random_checkpoint import (  # noqa: E402
    CHAT_TEMPLATE,
    EOS_IDS,
    QWEN_FIRST_SPECIAL_ID,
    QWEN_SPECIAL_TOKENS,
    TOKENIZER_CORPUS,
)
from trained_model import (  # noqa: E402
    ARTIFACT,
    EMBEDDING_KEY,
    HELDOUT,
    PLAIN_FILES,
    SAMPLE_RATE,
    WORDS,
    add_noise,
    embedding_base,
    full_tokenizer_json,
    trained_checkpoint,
    wer,
)

# The held-out clips' voices (tests/data/tiny_trained/heldout): 6 English accents x 8 variants.
HELDOUT_VOICES = [f"{base}{variant}" for base in ("en", "en-us", "en-gb", "en-gb-scotland", "en-029", "en-gb-x-rp")
                  for variant in ("", "+m1", "+m3", "+m5", "+f1", "+f2", "+f3", "+f4")]
# Training voices: 9 English accents x 30 human-sounding variants (espeak-ng's own voices/!v), 270 in all.
VOICE_BASES = ("en", "en-us", "en-gb", "en-gb-scotland", "en-029", "en-gb-x-rp", "en-gb-x-gbclan",
               "en-gb-x-gbcwmd", "en-us-nyc")
VOICE_VARIANTS = ("", "+m1", "+m2", "+m3", "+m4", "+m5", "+m6", "+m7", "+m8", "+f1", "+f2", "+f3", "+f4", "+f5",
                  "+klatt", "+klatt2", "+klatt3", "+klatt4", "+Andy", "+Annie", "+Alicia", "+Michael", "+benjamin",
                  "+david", "+ed", "+john", "+linda", "+paul", "+robert", "+steph")
VOICES = [f"{base}{variant}" for base in VOICE_BASES for variant in VOICE_VARIANTS]
# Never trained, for tools/eval_unseen_voices.py: espeak-ng's other voice variants (espeak-ng --voices=variant).
UNSEEN_VARIANTS = ("+adam", "+Alex", "+Andrea", "+belinda", "+caleb", "+Gene", "+Jacky", "+Lee", "+max", "+Mike",
                   "+quincy", "+norbert", "+travis", "+victor", "+shelby", "+edward2")
NOISE_KINDS = ("none", "white", "pink", "brown")
NOISE_WEIGHTS = (0.4, 0.3, 0.2, 0.1)
EMBEDDING_SEED = 20260101
EMBEDDING_STD = 0.02
TRAIN_SEED = 1
HELDOUT_SEED = 2
# The prompt variants trained (language, itn): FunASR's default first.
PROMPTS = [(None, True), ("en", True), (None, False), ("en", False)]
PROMPT_WEIGHTS = [0.7, 0.1, 0.1, 0.1]


def model_config() -> dict[str, Any]:
    """Widths are multiples of 256 wherever a matrix's input dimension is free (so Q4_K/Q6_K apply);
    the encoder's 560-wide first layer (the frontend) and the adaptor FFN's 64 (= decoder width / 4,
    required by the config) are not."""
    return dict(
        audio_config=dict(
            model_type="fun_asr_nano_encoder", hidden_size=256, num_attention_heads=4, intermediate_size=256,
            num_hidden_layers=4, num_timestamp_prediction_layers=1, num_mel_bins=80, num_stacked_frames=7,
            fsmn_kernel_size=11, max_position_embeddings=2049, hidden_dropout=0.0, attention_dropout=0.0,
        ),
        adaptor_config=dict(
            hidden_size=256, num_attention_heads=4, intermediate_size=64, num_hidden_layers=2,
            projector_hidden_size=256,
        ),
        text_config=dict(
            model_type="qwen3", hidden_size=256, intermediate_size=256, num_hidden_layers=2,
            num_attention_heads=4, num_key_value_heads=2, head_dim=64, vocab_size=151936,
            rope_parameters={"rope_type": "default", "rope_theta": 1000000.0}, rms_norm_eps=1e-6,
            max_position_embeddings=4096, tie_word_embeddings=True,
        ),
    )


# --- tokenizer ----------------------------------------------------------------------------------

def tokenizer_base_json() -> str:
    """make_random_checkpoint's byte-level BPE, with the 20 words (alone and after a space) in the
    corpus so that each is one token; Qwen's special tokens at Qwen's ids. Without the filler rows
    (``trained_model.full_tokenizer_json`` adds them)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    corpus = list(TOKENIZER_CORPUS)
    for w in WORDS:
        corpus += [" ".join([w] * 8)] * 40
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=700, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  show_progress=False)
    tok.train_from_iterator(corpus, trainer)
    data = json.loads(tok.to_str())
    data["added_tokens"] = [
        {"id": QWEN_FIRST_SPECIAL_ID + i, "content": t, "single_word": False, "lstrip": False,
         "rstrip": False, "normalized": False, "special": True}
        for i, t in enumerate(QWEN_SPECIAL_TOKENS)
    ]
    return json.dumps(data, ensure_ascii=False)


class Text:
    """Prompt and transcript token ids, through the same tokenizer and prompt code as fun_asr.Session."""

    def __init__(self, tokenizer_json: str) -> None:
        from fun_asr.asr.prompt import PromptSpec
        from fun_asr.asr.tokenizer import TextTokenizer

        self.tok = TextTokenizer(tokenizer_json)
        self.spec = json.loads((ROOT / "model_specs" / "fun_asr_nano.json").read_text("utf-8"))
        self.prompt = PromptSpec.from_dict(self.spec["prompt"])
        self.im_end = self.tok.encode("<|im_end|>")[0]
        assert self.im_end == EOS_IDS[0]
        for w in WORDS:
            for form in (w, " " + w):
                if len(self.tok.encode(form)) != 1:
                    raise SystemExit(f"tokenizer: {form!r} is not one token")

    def prompt_ids(self, language: str | None, itn: bool) -> tuple[list[int], list[int]]:
        from fun_asr.asr.prompt import prompt_text

        name = None if language is None else self.spec["languages"][language]["prompt_name"]
        before, after = prompt_text(self.prompt, name, itn, [])
        return self.tok.encode(before), self.tok.encode(after)

    def target_ids(self, text: str) -> list[int]:
        return self.tok.encode(text) + [self.im_end]

    def used_ids(self) -> list[int]:
        ids: set[int] = set(EOS_IDS)
        for lang, itn in PROMPTS:
            b, a = self.prompt_ids(lang, itn)
            ids.update(b + a)
        for w in WORDS:
            ids.update(self.tok.encode(w) + self.tok.encode(" " + w))
        return sorted(ids)


# --- data ---------------------------------------------------------------------------------------

def make_recipes(n: int, seed: int) -> list[dict[str, Any]]:
    """The held-out clips' recipe (one utterance of 1-4 words, HELDOUT_VOICES, light white noise)."""
    rng = np.random.default_rng(seed)
    out = []
    for i in range(n):
        words = [WORDS[k] for k in rng.integers(0, len(WORDS), size=int(rng.integers(1, 5)))]
        out.append(dict(
            index=i, text=" ".join(words), voice=HELDOUT_VOICES[int(rng.integers(len(HELDOUT_VOICES)))],
            speed=int(rng.integers(130, 191)), pitch=int(rng.integers(30, 71)), gap=int(rng.integers(0, 5)),
            lead=round(float(rng.uniform(0.05, 0.5)), 3), tail=round(float(rng.uniform(0.05, 0.5)), 3),
            peak_db=round(float(rng.uniform(-20.0, -1.0)), 2), snr_db=round(float(rng.uniform(15.0, 40.0)), 2),
            noise_seed=int(rng.integers(1 << 31)),
        ))
    return out


def make_recordings(n: int, seed: int, exclude: set[str] = frozenset()) -> list[dict[str, Any]]:
    """The training recipe: recordings of 1 (70 %), 2 (20 %) or 3 (10 %) utterances of 1-4 words joined by
    0.2-1.5 s pauses (the same voice, or each its own: a conversation), any of VOICES at 110-230 wpm, pitch
    20-80; 0.05-0.6 s of silence either side; peak -1..-35 dBFS; digitally clean (40 %: exact zeros between
    the words) or white / pink / brown noise 10-40 dB below the speech. A recording whose transcript is in
    `exclude` (the held-out ones) is drawn again."""
    rng = np.random.default_rng(seed)
    out: list[dict[str, Any]] = []
    while len(out) < n:
        count = int(rng.choice([1, 2, 3], p=[0.7, 0.2, 0.1]))
        same_voice = bool(rng.random() < 0.5)
        voice = VOICES[int(rng.integers(len(VOICES)))]
        utterances = []
        for _ in range(count):
            words = [WORDS[k] for k in rng.integers(0, len(WORDS), size=int(rng.integers(1, 5)))]
            utterances.append(dict(
                text=" ".join(words), voice=voice if same_voice else VOICES[int(rng.integers(len(VOICES)))],
                speed=int(rng.integers(110, 231)), pitch=int(rng.integers(20, 81)), gap=int(rng.integers(0, 5)),
            ))
        r = dict(
            index=len(out), text=" ".join(u["text"] for u in utterances), utterances=utterances,
            pauses=[round(float(rng.uniform(0.2, 1.5)), 3) for _ in range(count - 1)],
            lead=round(float(rng.uniform(0.05, 0.6)), 3), tail=round(float(rng.uniform(0.05, 0.6)), 3),
            peak_db=round(float(rng.uniform(-35.0, -1.0)), 2),
            noise=str(rng.choice(NOISE_KINDS, p=NOISE_WEIGHTS)), snr_db=round(float(rng.uniform(10.0, 40.0)), 2),
            noise_seed=int(rng.integers(1 << 31)),
        )
        if r["text"] not in exclude:
            out.append(r)
    return out


def espeak(text: str, voice: str, speed: int, pitch: int, gap: int) -> np.ndarray:
    """espeak-ng speech at 16 kHz (soxr), float64, its own level."""
    import soundfile as sf
    import soxr

    cmd = ["espeak-ng", "-v", voice, "-s", str(speed), "-p", str(pitch), "-g", str(gap), "--stdout", text]
    wav = subprocess.run(cmd, check=True, capture_output=True).stdout
    x, rate = sf.read(io.BytesIO(wav), dtype="float64")
    return soxr.resample(x, rate, SAMPLE_RATE)


def synth_clean(r: dict[str, Any]) -> np.ndarray:
    """A held-out recipe: espeak-ng -> 16 kHz, silences either side, peak level -> int16 (the clean clip)."""
    x = espeak(r["text"], r["voice"], r["speed"], r["pitch"], r["gap"])
    x = x / max(np.abs(x).max(), 1e-9) * 10.0 ** (r["peak_db"] / 20.0)
    x = np.concatenate([np.zeros(int(r["lead"] * SAMPLE_RATE)), x, np.zeros(int(r["tail"] * SAMPLE_RATE))])
    return np.clip(np.round(x * 32767.0), -32768, 32767).astype(np.int16)


def synth_recording(r: dict[str, Any]) -> np.ndarray:
    """A training recipe -> int16 at 16 kHz: the utterances with their pauses and silences, levelled to the
    peak, then its noise (``add_noise``, none for "none")."""
    parts = [np.zeros(int(r["lead"] * SAMPLE_RATE))]
    for k, u in enumerate(r["utterances"]):
        if k:
            parts.append(np.zeros(int(r["pauses"][k - 1] * SAMPLE_RATE)))
        x = espeak(u["text"], u["voice"], u["speed"], u["pitch"], u["gap"])
        parts.append(x / max(np.abs(x).max(), 1e-9))  # each voice at the same peak before the recording's level
    parts.append(np.zeros(int(r["tail"] * SAMPLE_RATE)))
    x = np.concatenate(parts) * 10.0 ** (r["peak_db"] / 20.0)
    clean = np.clip(np.round(x * 32767.0), -32768, 32767).astype(np.int16)
    if r["noise"] == "none":
        return clean
    return add_noise(clean, r["snr_db"], r["noise_seed"], r["noise"])


def clip_features(r: dict[str, Any]) -> np.ndarray:
    """A training recipe -> int16 audio -> float [-1, 1] -> fun_asr.audio.frontend.fbank (80 mel, x32768)."""
    from fun_asr.audio.frontend import FrontendConfig, fbank

    return fbank(synth_recording(r).astype(np.float32) / 32768.0, FrontendConfig()).astype(np.float16)


def cmd_data(work: Path, n_train: int, n_heldout: int, procs: int) -> None:
    """The held-out clips (work/heldout: the committed ones, else made anew) and the training features
    (work/train_fbank.npy + offsets) of recordings whose transcripts are not held-out ones."""
    import multiprocessing as mp

    work.mkdir(parents=True, exist_ok=True)
    heldout = work / "heldout"
    if not (heldout / "manifest.json").exists():
        _heldout_data(heldout, n_heldout)
    held = json.loads((heldout / "manifest.json").read_text("utf-8"))
    exclude = {e["text"] for e in held if len(e["text"].split()) > 1}
    if not (work / "train_fbank.npy").exists():
        recipes = make_recordings(n_train, TRAIN_SEED, exclude)
        t0 = time.time()
        with mp.get_context("fork").Pool(procs) as pool:
            feats = []
            for i, f in enumerate(pool.imap(clip_features, recipes, chunksize=64)):
                feats.append(f)
                if (i + 1) % 2000 == 0:
                    print(f"data: {i + 1}/{n_train} recordings, {time.time() - t0:.0f} s", flush=True)
        lengths = np.array([f.shape[0] for f in feats], np.int64)
        np.save(work / "train_offsets.npy", np.concatenate([[0], np.cumsum(lengths)]))
        (work / "train_recipes.json").write_text(json.dumps(recipes), "utf-8")
        np.save(work / "train_fbank.tmp.npy", np.concatenate(feats))
        os.replace(work / "train_fbank.tmp.npy", work / "train_fbank.npy")
        print(f"data: {n_train} training recordings, {lengths.sum() / 100 / 3600:.2f} h, {time.time() - t0:.0f} s")


def _heldout_data(heldout: Path, n_heldout: int) -> None:
    """The held-out clips: the committed ones (tests/data/tiny_trained/heldout, their recipes in the artifact's
    manifest) when present; else the first `n_heldout` of the held-out recipe (seed HELDOUT_SEED) whose
    multi-word transcripts are not in the first training recipe (make_recipes(30000, TRAIN_SEED)), as the
    committed ones were chosen."""
    import soundfile as sf

    heldout.mkdir(parents=True, exist_ok=True)
    committed = ARTIFACT / "manifest.json"
    if committed.is_file() and HELDOUT.is_dir():
        entries = json.loads(committed.read_text("utf-8"))["heldout"]
        if all((HELDOUT / e["file"]).is_file() for e in entries):
            for e in entries[:n_heldout]:
                shutil.copyfile(HELDOUT / e["file"], heldout / e["file"])
            (heldout / "manifest.json").write_text(json.dumps(entries[:n_heldout], indent=1), "utf-8")
            print(f"data: {min(n_heldout, len(entries))} committed held-out clips")
            return
    entries = []
    train_texts = {r["text"] for r in make_recipes(30000, TRAIN_SEED) if len(r["text"].split()) > 1}
    for r in make_recipes(n_heldout * 4, HELDOUT_SEED):  # multi-word transcripts never in that training set
        if len(r["text"].split()) > 1 and r["text"] in train_texts:
            continue
        clean = synth_clean(r)
        name = f"h{len(entries):03d}.flac"
        sf.write(str(heldout / name), clean, SAMPLE_RATE, subtype="PCM_16")
        entries.append({"file": name, "text": r["text"], "snr_db": r["snr_db"], "noise_seed": r["noise_seed"],
                        "recipe": r})
        if len(entries) == n_heldout:
            break
    (heldout / "manifest.json").write_text(json.dumps(entries, indent=1), "utf-8")
    size = sum(p.stat().st_size for p in heldout.glob("*.flac"))
    print(f"data: {len(entries)} held-out clips, {size / 1e6:.2f} MB FLAC")


# --- model --------------------------------------------------------------------------------------

def build_model(cfg: dict[str, Any]):  # noqa: ANN201
    from transformers import FunAsrNanoConfig, FunAsrNanoForConditionalGeneration

    config = FunAsrNanoConfig(**cfg)
    model = FunAsrNanoForConditionalGeneration._from_config(config, attn_implementation="sdpa")
    for sub in (model.config, model.config.audio_config, model.config.adaptor_config, model.config.text_config,
                model.model.multi_modal_projector.config, model.model.audio_tower.config):
        if sub._attn_implementation != "sdpa":  # None would attend over the padding
            raise RuntimeError("attention implementation not set on every sub-config")
    return model


class Batcher:
    """LFR features (fun_asr.audio.frontend.lfr on the stored fbank) in length-bucketed batches."""

    def __init__(self, work: Path, text: Text, batch: int, seed: int) -> None:
        self.fbank = np.load(work / "train_fbank.npy", mmap_mode="r")
        self.offsets = np.load(work / "train_offsets.npy")
        self.recipes = json.loads((work / "train_recipes.json").read_text("utf-8"))
        self.text = text
        self.batch = batch
        self.rng = np.random.default_rng(seed)
        self.prompts = [text.prompt_ids(lang, itn) for lang, itn in PROMPTS]
        self.targets = [text.target_ids(r["text"]) for r in self.recipes]
        self.words = [[WORDS.index(w) + 1 for w in r["text"].split()] for r in self.recipes]  # CTC labels
        self.queue: list[np.ndarray] = []

    def _refill(self) -> None:
        n = len(self.recipes)
        order = self.rng.permutation(n)
        lengths = np.diff(self.offsets)
        group = self.batch * 50
        batches = []
        for g in range(0, n, group):
            idx = order[g : g + group]
            idx = idx[np.argsort(lengths[idx], kind="stable")]
            batches += [idx[k : k + self.batch] for k in range(0, len(idx), self.batch)]
        self.queue = [batches[i] for i in self.rng.permutation(len(batches))]

    def lfr(self, i: int) -> np.ndarray:
        from fun_asr.audio.frontend import lfr

        return lfr(np.asarray(self.fbank[self.offsets[i] : self.offsets[i + 1]], np.float32), 7, 6)

    def next(self) -> dict[str, Any]:
        if not self.queue:
            self._refill()
        idx = self.queue.pop()
        feats = [self.lfr(int(i)) for i in idx]
        kinds = self.rng.choice(len(PROMPTS), size=len(idx), p=PROMPT_WEIGHTS)
        return {"feats": feats, "prompts": [self.prompts[k] for k in kinds],
                "targets": [self.targets[int(i)] for i in idx], "words": [self.words[int(i)] for i in idx]}


class Tiny:
    """The model plus the embedding split into trainable used rows and frozen seeded rows."""

    def __init__(self, cfg: dict[str, Any], used: list[int]) -> None:
        import torch

        self.torch = torch
        self.model = build_model(cfg)
        tc = cfg["text_config"]
        self.vocab, self.dim = tc["vocab_size"], tc["hidden_size"]
        base = torch.from_numpy(embedding_base(self.vocab, self.dim, EMBEDDING_SEED, EMBEDDING_STD))
        self.base = base  # frozen
        self.used = torch.tensor(used, dtype=torch.long)
        self.remap = torch.full((self.vocab,), -1, dtype=torch.long)
        self.remap[self.used] = torch.arange(len(used))
        self.emb_used = torch.nn.Parameter(base[self.used].clone())
        unused = torch.ones(self.vocab, dtype=torch.bool)
        unused[self.used] = False
        self.unused = torch.nonzero(unused)[:, 0]
        # Auxiliary word-level CTC heads (training only, not in the checkpoint): one on the encoder output
        # (FunASR's own model has a CTC branch there too), one on the spliced adaptor rows (teaches the
        # rows to carry the words in order, which the decoder then reads).
        self.ctc_head = torch.nn.Linear(cfg["audio_config"]["hidden_size"], len(WORDS) + 1)
        self.row_ctc_head = torch.nn.Linear(cfg["adaptor_config"]["hidden_size"], len(WORDS) + 1)
        emb = self.model.model.language_model.embed_tokens
        emb.weight.requires_grad_(False)
        with torch.no_grad():
            emb.weight.copy_(base)

    def params(self) -> list[Any]:
        """The checkpoint's trainable parameters (the embedding's used rows are `emb_used`)."""
        return [p for n, p in self.model.named_parameters() if n != EMBEDDING_KEY and p.requires_grad]

    def audio_rows(self, feats: list[np.ndarray], with_encoder: bool = False):  # noqa: ANN201
        """Encoder + adaptor over the padded batch; the first fake_token_len rows of each clip."""
        from fun_asr.audio.frontend import fake_token_len

        torch = self.torch
        T = max(f.shape[0] for f in feats)
        x = torch.zeros(len(feats), T, feats[0].shape[1])
        mask = torch.zeros(len(feats), T, dtype=torch.long)
        for b, f in enumerate(feats):
            x[b, : f.shape[0]] = torch.from_numpy(f)
            mask[b, : f.shape[0]] = 1
        m = self.model.model
        enc = m.audio_tower(input_features=x, input_features_mask=mask).last_hidden_state
        adp = m.multi_modal_projector(enc, mask)
        rows = [adp[b, : fake_token_len(f.shape[0])] for b, f in enumerate(feats)]
        return (rows, enc) if with_encoder else rows

    def aux_params(self) -> list[Any]:
        return [*self.ctc_head.parameters(), *self.row_ctc_head.parameters()]

    def check_padding(self, feats: list[np.ndarray]) -> float:
        """Max difference between the audio rows of clips encoded in one padded batch and one by one
        (the padding mask must make them equal)."""
        with self.torch.no_grad():
            was = self.model.training
            self.model.eval()
            batched = self.audio_rows(feats)
            worst = max(float((r - self.audio_rows([f])[0]).abs().max()) for r, f in zip(batched, feats, strict=True))
            self.model.train(was)
        return worst

    def embed(self, ids: list[int]):  # noqa: ANN201
        return self.emb_used[self.remap[self.torch.tensor(ids, dtype=self.torch.long)]]

    def loss(self, batch: dict[str, Any], n_neg: int, gen: Any, ctc_weight: float) -> tuple[Any, Any, int, int]:
        """(total loss, decoder cross entropy, correct target tokens, target tokens)."""
        torch = self.torch
        rows, enc = self.audio_rows(batch["feats"], with_encoder=True)
        seqs, tgt_pos, tgt_ids = [], [], []
        for b, (r, (before, after), target) in enumerate(zip(rows, batch["prompts"], batch["targets"], strict=True)):
            seq = torch.cat([self.embed(before), r, self.embed(after), self.embed(target[:-1])])
            start = len(before) + r.shape[0] + len(after) - 1
            seqs.append(seq)
            tgt_pos += [(b, start + k) for k in range(len(target))]
            tgt_ids += target
        S = max(s.shape[0] for s in seqs)
        x = torch.zeros(len(seqs), S, self.dim)
        am = torch.zeros(len(seqs), S, dtype=torch.long)
        for b, s in enumerate(seqs):
            x[b, : s.shape[0]] = s
            am[b, : s.shape[0]] = 1
        h = self.model.model.language_model(inputs_embeds=x, attention_mask=am).last_hidden_state
        pos = torch.tensor(tgt_pos)
        hs = h[pos[:, 0], pos[:, 1]]
        neg = self.unused[torch.randint(len(self.unused), (n_neg,), generator=gen)]
        cand = torch.cat([self.emb_used, self.base[neg]])
        logits = hs @ cand.T
        labels = self.remap[torch.tensor(tgt_ids)]
        ce = torch.nn.functional.cross_entropy(logits, labels)
        correct = int((logits.argmax(-1) == labels).sum())
        total = ce
        if ctc_weight > 0:
            words = batch["words"]
            labels_cat = torch.tensor([w for ws in words for w in ws])
            label_lens = torch.tensor([len(ws) for ws in words])
            logp = torch.log_softmax(self.ctc_head(enc), dim=-1).transpose(0, 1)  # T, B, C
            ctc = torch.nn.functional.ctc_loss(logp, labels_cat, torch.tensor([f.shape[0] for f in batch["feats"]]),
                                               label_lens, blank=0, reduction="mean", zero_infinity=True)
            padded = torch.nn.utils.rnn.pad_sequence(rows, batch_first=True)
            logp_rows = torch.log_softmax(self.row_ctc_head(padded), dim=-1).transpose(0, 1)
            row_ctc = torch.nn.functional.ctc_loss(logp_rows, labels_cat, torch.tensor([r.shape[0] for r in rows]),
                                                   label_lens, blank=0, reduction="mean", zero_infinity=True)
            total = ce + ctc_weight * (ctc + row_ctc)
        return total, ce, correct, len(tgt_ids)

    def full_embedding(self):  # noqa: ANN201
        e = self.base.clone()
        e[self.used] = self.emb_used.detach()
        return e

    def sync_embedding(self) -> None:
        with self.torch.no_grad():
            self.model.model.language_model.embed_tokens.weight.copy_(self.full_embedding())

    @staticmethod
    def greedy(model: Any, feats: np.ndarray, before: list[int], after: list[int], stop: list[int],
               max_new: int = 16) -> list[int]:
        """Reference greedy decoding with the HF modules and the full vocabulary (no padding)."""
        import torch

        from fun_asr.audio.frontend import fake_token_len

        with torch.no_grad():
            m = model.model
            x = torch.from_numpy(feats)[None]
            mask = torch.ones(1, feats.shape[0], dtype=torch.long)
            enc = m.audio_tower(input_features=x, input_features_mask=mask).last_hidden_state
            rows = m.multi_modal_projector(enc, mask)[0, : fake_token_len(feats.shape[0])]
            emb = m.language_model.embed_tokens
            seq = torch.cat([emb(torch.tensor(before)), rows, emb(torch.tensor(after))])
            out: list[int] = []
            for _ in range(max_new):
                h = m.language_model(inputs_embeds=seq[None]).last_hidden_state[0, -1]
                tok = int(torch.argmax(model.lm_head(h)))
                out.append(tok)
                if tok in stop:
                    break
                seq = torch.cat([seq, emb(torch.tensor([tok]))])
            return out


def heldout_eval(model: Any, text: Text, work: Path, limit: int | None = None,
                 noisy: bool = True) -> tuple[float, list[str]]:
    """WER of greedy decoding with the HF modules on the held-out clips as the package reads them: with their
    recorded light noise (`noisy`), or as the clean FLACs (exact zeros around the speech)."""
    from fun_asr.audio.frontend import FrontendConfig, features

    entries = json.loads((work / "heldout" / "manifest.json").read_text("utf-8"))[:limit]
    before, after = text.prompt_ids(None, True)
    refs, hyps = [], []
    model.eval()
    import soundfile as sf

    for e in entries:
        clean, _ = sf.read(str(work / "heldout" / e["file"]), dtype="int16")
        audio = add_noise(clean, e["snr_db"], e["noise_seed"]) if noisy else clean
        toks = Tiny.greedy(model, features(audio.astype(np.float32) / 32768.0, FrontendConfig()), before, after,
                           EOS_IDS)
        refs.append(e["text"])
        hyps.append(text.tok.decode([t for t in toks if t not in EOS_IDS]).strip())
    model.train()
    return wer(refs, hyps), hyps


# --- training -----------------------------------------------------------------------------------

def cmd_train(work: Path, steps: int, batch: int, lr: float, warmup: int, threads: int, eval_every: int,
              n_neg: int, max_minutes: float, ctc_weight: float) -> None:
    import torch

    torch.set_num_threads(threads)
    torch.manual_seed(TRAIN_SEED)
    tok_json = full_tokenizer_json(tokenizer_base_json())
    text = Text(tok_json)
    used = text.used_ids()
    cfg = model_config()
    tiny = Tiny(cfg, used)
    params = tiny.params()
    decay = [p for p in params if p.ndim >= 2]
    no_decay = [p for p in params if p.ndim < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.01}, {"params": no_decay, "weight_decay": 0.0},
                             {"params": [tiny.emb_used, *tiny.aux_params()], "weight_decay": 0.0}],
                            lr=lr, betas=(0.9, 0.98), eps=1e-8)

    def lr_at(step: int) -> float:
        if step < warmup:
            return lr * (step + 1) / warmup
        t = min(1.0, (step - warmup) / max(1, steps - warmup))
        return lr * (0.02 + 0.98 * 0.5 * (1 + math.cos(math.pi * t)))

    def ctc_at(step: int) -> float:  # auxiliary CTC weight: ctc_weight, fading to 0 at 60 % of the run
        return ctc_weight * max(0.0, 1.0 - step / (0.6 * steps))

    batcher = Batcher(work, text, batch, TRAIN_SEED)
    gen = torch.Generator().manual_seed(TRAIN_SEED)
    state_path = work / "train_state.pt"
    log_path = work / "train_log.jsonl"
    step, elapsed = 0, 0.0
    if state_path.exists():
        st = torch.load(state_path, weights_only=False)
        tiny.model.load_state_dict(st["model"], strict=False)
        tiny.ctc_head.load_state_dict(st["ctc_head"])
        tiny.row_ctc_head.load_state_dict(st["row_ctc_head"])
        with torch.no_grad():
            tiny.emb_used.copy_(st["emb_used"])
        opt.load_state_dict(st["opt"])
        step, elapsed = st["step"], st["elapsed"]
        batcher.rng.bit_generator.state = st["batcher_rng"]
        batcher.queue = st["queue"]
        gen.set_state(st["gen"])
        print(f"train: resumed at step {step} ({elapsed / 60:.1f} min)")
    worst = tiny.check_padding([batcher.lfr(i) for i in range(8)])
    if worst > 1e-4:
        raise SystemExit(f"train: padded and unpadded audio rows differ by {worst:g}: the padding mask is not applied")
    n_params = sum(p.numel() for p in params)
    print(f"train: {n_params / 1e6:.2f} M trainable non-embedding parameters + {len(used)} embedding rows; "
          f"{len(batcher.recipes)} clips, batch {batch}, {steps} steps", flush=True)

    def save() -> None:
        sd = {k: v for k, v in tiny.model.state_dict().items() if k not in (EMBEDDING_KEY, "lm_head.weight")}
        torch.save({"model": sd, "emb_used": tiny.emb_used.detach().clone(), "ctc_head": tiny.ctc_head.state_dict(),
                    "row_ctc_head": tiny.row_ctc_head.state_dict(),
                    "opt": opt.state_dict(), "step": step,
                    "elapsed": elapsed, "batcher_rng": batcher.rng.bit_generator.state, "queue": batcher.queue,
                    "gen": gen.get_state(), "used": used, "config": cfg}, work / "train_state.tmp.pt")
        os.replace(work / "train_state.tmp.pt", state_path)

    tiny.model.train()
    run_start = time.time()
    acc_loss, acc_correct, acc_n, acc_steps = 0.0, 0, 0, 0
    while step < steps:
        t0 = time.time()
        for g in opt.param_groups:
            g["lr"] = lr_at(step)
        loss, ce, correct, n = tiny.loss(batcher.next(), n_neg, gen, ctc_at(step))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_([*params, tiny.emb_used, *tiny.aux_params()], 1.0)
        opt.step()
        step += 1
        elapsed += time.time() - t0
        acc_loss += ce.item()
        acc_correct += correct
        acc_n += n
        acc_steps += 1
        last = step == steps or (max_minutes and (time.time() - run_start) / 60 >= max_minutes)
        if step % 50 == 0 or last:
            print(f"step {step} loss {acc_loss / acc_steps:.4f} tok_acc {acc_correct / max(acc_n, 1):.3f} "
                  f"lr {lr_at(step):.2e} {elapsed / step:.2f} s/step {elapsed / 60:.1f} min", flush=True)
            rec = {"step": step, "loss": acc_loss / acc_steps, "tok_acc": acc_correct / max(acc_n, 1),
                   "minutes": elapsed / 60}
            if step % eval_every == 0 or last:
                tiny.sync_embedding()
                t1 = time.time()
                w, _ = heldout_eval(tiny.model, text, work)
                wc, _ = heldout_eval(tiny.model, text, work, noisy=False)
                rec["heldout_wer"], rec["heldout_wer_clean"] = w, wc
                print(f"  held-out WER {w:.4f} noisy, {wc:.4f} clean ({time.time() - t1:.0f} s)", flush=True)
            with log_path.open("a") as f:
                f.write(json.dumps(rec) + "\n")
            acc_loss, acc_correct, acc_n, acc_steps = 0.0, 0, 0, 0
        if step % 200 == 0 or last:
            save()
        if last:
            break


# --- export -------------------------------------------------------------------------------------

def trained_model_from_state(work: Path):  # noqa: ANN201
    import torch

    st = torch.load(work / "train_state.pt", weights_only=False)
    tiny = Tiny(st["config"], st["used"])
    tiny.model.load_state_dict(st["model"], strict=False)
    with torch.no_grad():
        tiny.emb_used.copy_(st["emb_used"])
    tiny.sync_embedding()
    return tiny, st


def cmd_export(work: Path, out: Path) -> None:
    """The artifact (out) and the full checkpoint it rebuilds (work/checkpoint), checked equal."""
    import torch
    from safetensors.numpy import save_file
    from transformers import GenerationConfig

    tiny, st = trained_model_from_state(work)
    model = tiny.model.eval()
    with torch.no_grad():  # the canonical model: every matrix rounded to F16 (as stored)
        for name, p in model.named_parameters():
            if p.ndim == 2 and name != EMBEDDING_KEY:
                p.copy_(p.to(torch.float16).to(torch.float32))
    model.generation_config = GenerationConfig(eos_token_id=EOS_IDS, pad_token_id=EOS_IDS[1], max_new_tokens=512,
                                               do_sample=False)
    ckpt = work / "checkpoint"
    if ckpt.exists():
        shutil.rmtree(ckpt)
    model.save_pretrained(ckpt)
    base_json = tokenizer_base_json()
    (ckpt / "tokenizer.json").write_text(full_tokenizer_json(base_json), "utf-8")
    (ckpt / "tokenizer_config.json").write_text(json.dumps({
        "tokenizer_class": "Qwen2Tokenizer", "model_max_length": 131072, "eos_token": "<|im_end|>",
        "pad_token": "<|endoftext|>", "bos_token": None, "add_prefix_space": False, "errors": "replace",
    }, indent=2), "utf-8")
    (ckpt / "chat_template.jinja").write_text(CHAT_TEMPLATE, "utf-8")
    (ckpt / "preprocessor_config.json").write_text(json.dumps({
        "feature_extractor_type": "FunAsrNanoFeatureExtractor", "sampling_rate": 16000, "feature_size": 80,
        "num_mel_bins": 80, "lfr_m": 7, "lfr_n": 6, "padding_value": 0.0, "return_attention_mask": True,
        "processor_class": "FunAsrNanoProcessor",
    }, indent=2), "utf-8")

    from safetensors.numpy import load_file

    saved = load_file(str(ckpt / "model.safetensors"))
    used = np.array(st["used"], np.int64)
    stored: dict[str, np.ndarray] = {}
    for name, t in saved.items():
        if name == EMBEDDING_KEY:
            continue
        stored[name] = t.astype(np.float16) if t.ndim == 2 else t
    stored["trained_rows.ids"] = used
    stored["trained_rows.weight"] = np.ascontiguousarray(saved[EMBEDDING_KEY][used])
    heldout_out = HELDOUT if out == ARTIFACT else out / "heldout"  # the clips stay with the tests
    if heldout_out.exists():
        shutil.rmtree(heldout_out)
    heldout_out.mkdir(parents=True)
    out.mkdir(parents=True, exist_ok=True)
    for name in (*PLAIN_FILES, "tokenizer.base.json", "manifest.json", "weights.safetensors"):
        (out / name).unlink(missing_ok=True)  # the model's files; anything else there (the FSMN-VAD) stays
    save_file(stored, str(out / "weights.safetensors"))
    for name in PLAIN_FILES:
        shutil.copyfile(ckpt / name, out / name)
    (out / "tokenizer.base.json").write_text(base_json, "utf-8")
    heldout = json.loads((work / "heldout" / "manifest.json").read_text("utf-8"))
    for e in heldout:
        shutil.copyfile(work / "heldout" / e["file"], heldout_out / e["file"])
    n_emb = tiny.vocab * tiny.dim
    man = {
        "description": "Tiny Fun-ASR-Nano trained by tools/train_tiny.py; rebuild with "
                       "fun_asr.model.demo.build_checkpoint()",
        "embedding": {"vocab": tiny.vocab, "dim": tiny.dim, "seed": EMBEDDING_SEED, "std": EMBEDDING_STD,
                      "generator": "numpy.random.default_rng(seed).standard_normal((vocab, dim), float32) * std",
                      "trained_rows": len(used)},
        "parameters": {"non_embedding": int(sum(t.size for k, t in saved.items() if k != EMBEDDING_KEY)),
                       "embedding": n_emb},
        "training": {"steps": st["step"], "minutes": round(st["elapsed"] / 60, 1)},
        "heldout": [{k: e[k] for k in ("file", "text", "snr_db", "noise_seed", "recipe")} for e in heldout],
    }
    import hashlib

    man["embedding"]["sha256"] = hashlib.sha256(saved[EMBEDDING_KEY].astype(np.float32).tobytes()).hexdigest()
    (out / "manifest.json").write_text(json.dumps(man, indent=1), "utf-8")
    # The rebuild must reproduce the checkpoint bit for bit.
    rebuilt = trained_checkpoint(work / "rebuilt", out)
    again = load_file(str(rebuilt / "model.safetensors"))
    assert set(again) == set(saved), sorted(set(again) ^ set(saved))
    for name, t in saved.items():
        if not np.array_equal(again[name], t.astype(np.float32)):
            raise SystemExit(f"export: rebuilt {name} differs from the trained checkpoint")
    for name in (*PLAIN_FILES, "tokenizer.json"):
        if (rebuilt / name).read_bytes() != (ckpt / name).read_bytes():
            raise SystemExit(f"export: rebuilt {name} differs")
    size = sum(p.stat().st_size for p in out.iterdir() if p.is_file())
    print(f"export: {out} ({size / 1e6:.2f} MB), rebuilt checkpoint identical; "
          f"{man['parameters']['non_embedding'] / 1e6:.2f} M non-embedding parameters")


# --- evaluation with the package ----------------------------------------------------------------

def cmd_eval(work: Path, artifact: Path, types: list[str], threads: int, check_hf: int) -> None:
    """WER per package type and held-out condition with fun_asr (checkpoint rebuilt from the artifact, converted
    with fun_asr.convert with the demo's FSMN-VAD embedded, as ``-m demo`` builds it): clean, noisy, and
    multi-utterance recordings through the VAD (trained_model.condition_wers); greedy tokens of the HF modules vs.
    the package on the first clips."""
    import fun_asr
    from fun_asr.model.demo import vad_dir
    from trained_model import condition_wers, heldout_clips

    ckpt = trained_checkpoint(work / "eval_checkpoint", artifact)
    clips = heldout_clips(work / "eval_clips", artifact)
    results: dict[str, Any] = {}
    for typ in types:
        gguf = work / f"tiny-trained-{typ}.gguf"
        t0 = time.time()
        fun_asr.convert(ckpt, gguf, typ, progress=False, overwrite=True, vad_model=vad_dir(artifact))
        conv_s = time.time() - t0
        s = fun_asr.Session(gguf, device="cpu", threads=threads, progress=False)
        t0 = time.time()
        per = condition_wers(s, merged=True)
        results[typ] = {"conditions": per, "seconds": time.time() - t0, "convert_s": conv_s,
                        "size_mb": gguf.stat().st_size / 1e6}
        print(f"eval {typ}: WER clean {per['clean']['wer'] * 100:.2f} %, noisy {per['noisy']['wer'] * 100:.2f} %, "
              f"multi-utterance through the VAD {per['multi']['wer'] * 100:.2f} % ({per['multi']['segments']} "
              f"segments), with 0.3-1 s pauses {per['merged']['wer'] * 100:.2f} % ({per['merged']['segments']} "
              f"segments) ({results[typ]['seconds']:.1f} s, {results[typ]['size_mb']:.1f} MB)", flush=True)
        for cond, v in per.items():
            for r, h in v["errors"][:5]:
                print(f"    {cond}: ref {r!r} hyp {h!r}")
    if check_hf:
        import torch

        from reference import load_reference

        m = load_reference(ckpt)
        text = Text((ckpt / "tokenizer.json").read_text("utf-8"))
        before, after = text.prompt_ids(None, True)
        s = fun_asr.Session(work / "tiny-trained-f32.gguf", device="cpu", threads=threads, progress=False)
        same = 0
        for p, _ in clips[:check_hf]:
            r = s.transcribe(str(p), vad=False)  # the whole clip, as the HF loop decodes it
            from fun_asr.audio.decode import decode_audio
            from fun_asr.audio.frontend import FrontendConfig, features

            x, _ = decode_audio(str(p), None, str(p))
            with torch.no_grad():
                ref = Tiny.greedy(m, features(x, FrontendConfig()), before, after, EOS_IDS)
            same += ref == r.segments[0].tokens
        print(f"eval: HF greedy tokens == package F32 tokens on {same}/{check_hf} clips")
        results["hf_token_agreement"] = [same, check_hf]
    (work / "eval.json").write_text(json.dumps(results, indent=1), "utf-8")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("command", choices=["data", "train", "export", "eval", "all"])
    ap.add_argument("--work", type=Path, required=True, help="work folder (features, training state, checkpoint)")
    ap.add_argument("--out", type=Path, default=ARTIFACT, help=f"artifact folder (default {ARTIFACT})")
    ap.add_argument("--clips", type=int, default=30000, help="training recordings")
    ap.add_argument("--heldout", type=int, default=60, help="held-out clips")
    ap.add_argument("--procs", type=int, default=2, help="processes for the data")
    ap.add_argument("--steps", type=int, default=5000)
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--lr", type=float, default=2e-3)
    ap.add_argument("--warmup", type=int, default=200)
    ap.add_argument("--negatives", type=int, default=2048, help="sampled frozen rows per step")
    ap.add_argument("--ctc", type=float, default=0.5, help="auxiliary encoder CTC weight at the start (fades to 0)")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--eval-every", type=int, default=1000)
    ap.add_argument("--max-minutes", type=float, default=0.0, help="stop (and save) after this long; 0 = no limit")
    ap.add_argument("--types", default="f32,f16,q8_0,q4_k_m")
    ap.add_argument("--check-hf", type=int, default=10, help="clips whose HF and package tokens are compared")
    a = ap.parse_args()
    if a.command in ("data", "all"):
        cmd_data(a.work, a.clips, a.heldout, a.procs)
    if a.command in ("train", "all"):
        cmd_train(a.work, a.steps, a.batch, a.lr, a.warmup, a.threads, a.eval_every, a.negatives, a.max_minutes,
                  a.ctc)
    if a.command in ("export", "all"):
        cmd_export(a.work, a.out)
    if a.command in ("eval", "all"):
        cmd_eval(a.work, a.out, a.types.split(","), a.threads, a.check_hf)


if __name__ == "__main__":
    main()
