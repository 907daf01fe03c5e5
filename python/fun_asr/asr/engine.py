"""The model behind a Session: the loaded GGUF and its prompt, and the two ways audio reaches the decoder.

- a recording's segments (:meth:`Engine._encode` each as it is cut, then :meth:`Engine._decode` all of them,
  ``batch_size`` at a time, longest first), and their word timestamps (:meth:`Engine._align`);
- one segment decoded alone, with a forced answer start (:meth:`Engine._decode_audio`: the streams').

Both share the prompt prefix's K/V (the prefix cache) and, where a segment is decoded alone, the CTC head's
greedy transcript as the draft of lossless speculative decoding.
"""

from __future__ import annotations

import json
import logging
import sys
import threading
import time
from contextlib import AbstractContextManager
from pathlib import Path

import numpy as np

from fun_asr.asr.confidence import spoken, token_words
from fun_asr.asr.ctc import CtcAligner, align_segments, draft_text
from fun_asr.asr.cutting import CutItem
from fun_asr.asr.interrupts import RunningCalls
from fun_asr.asr.language import language_prompt_name
from fun_asr.asr.options import TranscribeOptions
from fun_asr.asr.progress import progress_bar
from fun_asr.asr.prompt import PromptSpec, prompt_runs
from fun_asr.asr.tokenizer import TextTokenizer
from fun_asr.audio.frontend import FrontendConfig, fake_token_len, features, lfr
from fun_asr.model.native import load_model, model_metadata
from fun_asr.model.vocab import languages_for
from fun_asr.vad.frontend import num_fbank_frames

log = logging.getLogger("fun_asr")

# Segments per continuous-batching window, in multiples of the batch size: each window's decoder inputs are put
# together at once (bounded memory), and a window's last steps run with fewer sequences while it drains.
CONTINUOUS_WINDOW = 16


class Engine:
    """A loaded model (``path``, on ``device`` with ``threads``) with its tokenizer, prompt, spec and
    frontend. One engine can be used from several threads; its model runs one call at a time (``_lock``)."""

    def __init__(self, path: Path, device: str, threads: int) -> None:
        self.path = path
        self.model = load_model(path, device=device, threads=threads)
        self.threads = threads
        meta = model_metadata(path)
        missing = [k for k in ("tokenizer.huggingface.json", "fun_asr_nano.prompt", "fun_asr_nano.model_spec")
                   if k not in meta]
        if missing:
            raise ValueError(f"{path}: model has no {', '.join(missing)}; re-convert it with fun-asr-convert")
        self.metadata = meta
        self.tokenizer = TextTokenizer(meta["tokenizer.huggingface.json"])
        self.prompt = PromptSpec.from_dict(json.loads(meta["fun_asr_nano.prompt"]))
        self.spec = json.loads(meta["fun_asr_nano.model_spec"])
        # Fun-ASR-Nano or Fun-ASR-MLT-Nano (31 languages): the checkpoint says which table applies
        self.language_table = str(meta.get("fun_asr_nano.language_table") or "nano")
        self.spec["languages"] = languages_for(self.spec, self.language_table)
        self.frontend = FrontendConfig.from_spec(self.spec)
        info = self.model.info()
        self.stop_ids: list[int] = list(info["decoder"]["eos_token_ids"])
        self.max_segment_seconds = info["encoder"]["max_frames"] * self.frontend.seconds_per_lfr_frame
        self.context_length = int(info["decoder"]["max_positions"])
        self.vocab_size = int(info["decoder"]["vocab"])
        self._lock = threading.RLock()  # (re-entered by recordings that join a running batch: Arrivals)
        self._calls = RunningCalls(self.model.interrupt, self.model.clear_interrupt)  # for interrupt()
        self.prefix_cache = True  # reuse the prompt prefix's K/V across segments (token for token the same)
        # Segments encoded in one packed pass when recordings are transcribed in batches (batch_size > 1), at
        # most this many (and batch_size): where the device gains from it (info()["caps"]["packed_encoding"]: a
        # GPU), else 1 (the CPU, where one pass per segment is faster). Either way each segment's encoder output
        # is the same (bit for bit on the CPU).
        self.encoder_pack = int(self.model.max_packed_sequences) if info["caps"]["packed_encoding"] else 1
        self._prefix_ids: tuple[int, ...] = ()
        self.aligner = CtcAligner.from_model(self.model, meta)  # None: no CTC head, no word timestamps
        self.ctc_reason = None if self.aligner else str(info["ctc"].get("reason") or "no CTC head")
        # A segment decoded alone takes its CTC greedy transcript (re-tokenized) as the draft of lossless
        # speculative decoding: the same tokens as without it, fewer decoder passes where the two agree. The CTC
        # head runs on the kept encoder output only when the segment is decoded alone. False: never.
        self.ctc_drafts = self.aligner is not None
        if self.aligner is not None:  # its transcript has no punctuation: greedy's commas must not misalign it
            self.model.draft_skip = self.tokenizer.punctuation_ids(self.vocab_size)  # ~0.2 s, once
        self._told_no_ctc = False
        # every token's log-probability, computed beside the greedy choice (Segment.token_logprobs)
        self.model.token_logprobs = True

    def prompt_ids(self, opts: TranscribeOptions) -> tuple[list[int], list[int]]:
        lang_name = language_prompt_name(self.spec, opts.language)  # a name the model lacks: as written (FunASR)
        before, after = prompt_runs(self.prompt, lang_name, opts.itn, list(opts.hotwords))
        return self.tokenizer.encode_runs(before), self.tokenizer.encode_runs(after)

    def _decode_audio(self, samples: np.ndarray, opts: TranscribeOptions, forced: list[int],
                      max_new_tokens: int, draft: list[int] | None = None) -> tuple[list[int], str, dict[str, float]]:
        """16 kHz samples as one segment (no VAD, no cutting): features -> encoder -> greedy decoding with the
        prompt of ``opts``, the answer forced to start with the token ids ``forced`` (FunASR's ``prev_text``).
        Returns the new tokens (stop ids removed), the stop reason and timings (``encode_ms``,
        ``decode_ms``; with a draft also ``decode_passes``, ``draft_proposed``, ``draft_accepted``). With
        ``forced`` empty the tokens are those ``transcribe(samples, vad=False)`` gives a recording of at most
        ``segment_seconds``. ``draft``: tokens the answer probably continues with (a stream's previous decode):
        lossless speculative decoding, the same tokens as without it (Model.generate_batch)."""
        with self.interruptible():
            return self._decode_one(samples, opts, forced, max_new_tokens, draft)

    def _decode_one(self, samples: np.ndarray, opts: TranscribeOptions, forced: list[int],
                    max_new_tokens: int, draft: list[int] | None) -> tuple[list[int], str, dict[str, float]]:
        t0 = time.perf_counter()
        feats = features(np.ascontiguousarray(samples, np.float32), self.frontend)
        if feats.shape[0] == 0:  # shorter than one 25 ms frame: nothing to hear
            return [], "empty", {"encode_ms": 0.0, "decode_ms": 0.0}
        before, after = self.prompt_ids(opts)
        stop = [] if opts.ignore_eos else self.stop_ids
        with self._lock:
            if not draft and self._ctc_drafting():  # no draft given: the segment's CTC greedy transcript
                out, enc = self.model.encode_keep_encoder(feats)
                draft = self._ctc_draft(enc)
                del enc
            else:
                out = self.model.encode(feats)
            rows = out[: fake_token_len(feats.shape[0], self.prompt.fake_token_halvings)]
            prefix = self.model.embed(before)
            parts = [prefix, rows, self.model.embed(after)]
            if forced:
                parts.append(self.model.embed(list(forced)))
            t1 = time.perf_counter()
            self._use_prefix(before, prefix)
            (tokens, reason), = self.model.generate_batch([np.ascontiguousarray(np.concatenate(parts))],
                                                          max_new_tokens, stop, repetition_guard=opts.repetition_guard,
                                                          draft=list(draft) if draft else None)
            gen = self.model.last_generation()
        t2 = time.perf_counter()
        timings = {"encode_ms": (t1 - t0) * 1e3, "decode_ms": (t2 - t1) * 1e3}
        for key in ("decode_passes", "draft_proposed", "draft_accepted"):
            timings[key] = float(gen[key])
        return [t for t in tokens if t not in self.stop_ids], reason, timings

    def interrupt(self) -> bool:
        """Stops the running transcriptions (:meth:`fun_asr.Session.interrupt` says how)."""
        return self._calls.interrupt()

    def interruptible(self) -> AbstractContextManager[None]:
        """A block that counts as one running transcription (:meth:`fun_asr.Session.interruptible`)."""
        return self._calls.running()

    def _encode(self, item: CutItem, a: int, b: int, opts: TranscribeOptions,
                jobs: list[tuple[CutItem, int, np.ndarray]], waiting: list[int]) -> None:
        """The features of samples [a, b) of the recording (its last segment) through the encoder: its
        adaptor rows join ``jobs`` (``waiting`` counts the bytes held for decoding)."""
        segment = self._segment_features(item, a, b)
        if segment is not None:
            self._encode_segments([segment], opts, jobs, waiting)

    def _segment_features(self, item: CutItem, a: int, b: int) -> tuple[CutItem, int, np.ndarray] | None:
        """(item, segment index, LFR features) of samples [a, b), the recording's last segment; None when the
        segment is a tail shorter than one 25 ms frame (nothing to hear)."""
        si = len(item.segments) - 1
        t0 = time.perf_counter()
        feats = self._features(item, a, b)
        item.timings["frontend_ms"] += (time.perf_counter() - t0) * 1e3
        return (item, si, feats) if feats.shape[0] else None

    def _encode_segments(self, segments: list[tuple[CutItem, int, np.ndarray]], opts: TranscribeOptions,
                         jobs: list[tuple[CutItem, int, np.ndarray]], waiting: list[int]) -> None:
        """Segments' features through the encoder (Model.encode_batch: several in packed passes, each segment's
        rows those it gets alone). Their adaptor rows join ``jobs``; the encoder
        output stays for the CTC head where a segment needs it (word timestamps, or the CTC draft in case it is
        decoded alone: the head runs later, only if needed, without a second encoder pass). A pass's time is
        shared among its segments by frames."""
        stamps = opts.word_timestamps and self.aligner is not None
        keeps = [stamps or (item.draft is None and self._ctc_drafting()) for item, _, _ in segments]
        t0 = time.perf_counter()
        with self._lock:  # (one segment: encode()'s own graph)
            outs = self.model.encode_batch([f for _, _, f in segments], keep_encoder=any(keeps))
        ms = (time.perf_counter() - t0) * 1e3
        frames = sum(f.shape[0] for _, _, f in segments)
        for (item, si, feats), out, keep in zip(segments, outs, keeps, strict=True):
            if isinstance(out, tuple):
                out, enc = out
                if keep:
                    item.enc_out[si] = enc
                    waiting[0] += enc.nbytes
            rows = out[: fake_token_len(feats.shape[0], self.prompt.fake_token_halvings)].copy()  # not a view
            item.timings["encode_ms"] += ms * feats.shape[0] / frames
            jobs.append((item, si, rows))
            waiting[0] += rows.nbytes

    def _ctc_drafting(self) -> bool:
        """Whether a segment without a draft of its own gets its CTC greedy transcript as one: a CTC head,
        ``ctc_drafts`` on, and the model taking drafts (``draft_max`` > 0, flash attention)."""
        return (self.ctc_drafts and self.aligner is not None and self.model.draft_max > 0
                and bool(self.model.flash_attn))

    def _ctc_draft(self, encoder_output: np.ndarray) -> list[int]:
        """The CTC head's greedy transcript of a segment (from its encoder output), as decoder token ids: the
        draft that the decoder verifies (never trusted: a wrong one costs a pass)."""
        assert self.aligner is not None
        try:
            labels = self.model.ctc_greedy(encoder_output)
        except (ValueError, RuntimeError, MemoryError) as exc:  # no draft is only slower: decode without one
            log.debug("no CTC draft: %s", exc)
            return []
        return self.tokenizer.encode_plain(draft_text(labels, self.aligner.blank_id, self.aligner.tokenizer))

    def _use_prefix(self, before: list[int], prefix: np.ndarray) -> None:
        """The system prompt + instruction's K/V, computed once and reused by every segment's prefill
        (under the lock: another transcription may have set its own since)."""
        if self.prefix_cache and tuple(before) != self._prefix_ids:
            self._prefix_ids = ()  # until set: an interrupted set_prefix leaves none
            self.model.set_prefix(prefix)
            self._prefix_ids = tuple(before)
        elif not self.prefix_cache and self._prefix_ids:
            self.model.clear_prefix()
            self._prefix_ids = ()

    def _features(self, item: CutItem, a: int, b: int) -> np.ndarray:
        """LFR features of samples [a, b): sliced from the recording's fbank when the segment starts on a
        frame boundary (identical to computing them on the slice: Kaldi frames are independent), else
        computed on the slice (FunASR cuts the audio at the segment and runs the frontend on it)."""
        shift = int(round(self.frontend.sample_rate * self.frontend.frame_shift_ms / 1000))
        if item.fbank is not None and a % shift == 0:
            k = a // shift
            count = num_fbank_frames(b - a)
            if k + count <= len(item.fbank):
                return lfr(item.fbank[k : k + count], self.frontend.lfr_m, self.frontend.lfr_n)
        return features(item.samples[a:b], self.frontend)

    def _decode(self, jobs: list[tuple[CutItem, int, np.ndarray]], opts: TranscribeOptions, batch_size: int,
                progress: bool, raise_errors: bool, prefix: np.ndarray | None = None,
                suffix: np.ndarray | None = None) -> None:
        """Greedy decoding of every segment, at most `batch_size` at a time; fills the Segments in place.
        With batch_size > 1 the model batches continuously (Model.generate_batch's max_active): when a segment
        ends, the next one's prefill joins the running steps, over windows of CONTINUOUS_WINDOW x batch_size
        segments (their decoder inputs are put together per window). A window that fails is retried one segment
        at a time so that only the bad one fails. Segments are taken longest first (FunASR sorts VAD segments by
        length before batching them); results land in their own Segment, so order is kept.
        With ``prefix``/``suffix`` (the prompt's embeddings) the jobs hold only the audio rows, and each
        chunk's decoder inputs are put together when it is decoded."""
        stop = [] if opts.ignore_eos else self.stop_ids
        if batch_size > 1:
            jobs = sorted(jobs, key=lambda j: -j[2].shape[0])  # the prompt's length is the same for all
        bar = progress_bar(progress, None, "decoding", "tok")
        window = batch_size * CONTINUOUS_WINDOW if batch_size > 1 else 1
        for k in range(0, len(jobs), window):
            chunk = jobs[k : k + window]
            done = [0]

            def on_step(produced: int, active: int, done: list[int] = done) -> None:
                bar.update(produced - done[0])
                done[0] = produced

            inputs = [j[2] if prefix is None else np.ascontiguousarray(np.concatenate([prefix, j[2], suffix]))
                      for j in chunk]
            draft, ctc_ms = self._chunk_draft(chunk, opts)
            try:
                results = self.model.generate_batch(inputs, opts.max_new_tokens, stop,
                                                    repetition_guard=opts.repetition_guard, on_step=on_step,
                                                    draft=draft, max_active=batch_size if len(chunk) > 1 else 0)
            except (ValueError, RuntimeError, MemoryError):
                if raise_errors or len(chunk) == 1:
                    if len(chunk) == 1 and not raise_errors:
                        chunk[0][0].fail(sys.exc_info()[1])
                        continue
                    raise
                for job in chunk:  # find the bad one; the others decode as they would have
                    self._decode([job], opts, 1, False, False, prefix, suffix)
                continue
            del inputs
            self._fill_chunk(chunk, results, bool(draft), ctc_ms)
        bar.close()

    def _chunk_draft(self, chunk: list[tuple[CutItem, int, np.ndarray]], opts: TranscribeOptions
                     ) -> tuple[list[int] | None, float]:
        """(the draft a chunk is decoded with, the ms its CTC transcript took). A segment decoded alone verifies
        its recording's draft, else its CTC greedy transcript (the model takes drafts for one sequence: in a
        batch, the batch already shares each step's weight reads)."""
        lone = chunk[0][0].draft if len(chunk) == 1 else None
        ctc_ms = 0.0
        kept = chunk[0][0].enc_out.get(chunk[0][1]) if len(chunk) == 1 and lone is None else None
        if kept is not None and self._ctc_drafting():
            t0 = time.perf_counter()
            lone = self._ctc_draft(kept)  # the caller holds the lock
            ctc_ms = (time.perf_counter() - t0) * 1e3
        del kept
        if not opts.word_timestamps:  # nothing else needs the kept encoder outputs
            for j in chunk:
                j[0].enc_out.pop(j[1], None)
        return ([t for t in lone if t not in self.stop_ids] or None if lone else None), ctc_ms

    def _fill_chunk(self, chunk: list[tuple[CutItem, int, np.ndarray]], results: list[tuple[list[int], str]],
                    drafted: bool, ctc_ms: float) -> None:
        """A decoded chunk's segments filled in, with their share of its timings (and draft counts)."""
        stats = self.model.last_generation()
        logprobs = self.model.last_token_logprobs() or [[] for _ in results]
        for (item, si, _), (tokens, reason), lps in zip(chunk, results, logprobs, strict=True):
            self._fill_segment(item, si, tokens, reason, lps)
            item.timings["prefill_ms"] += stats["prefill_ms"] / len(chunk)
            item.timings["decode_ms"] += stats["decode_ms"] / len(chunk)
            if ctc_ms:
                item.timings["ctc_draft_ms"] = item.timings.get("ctc_draft_ms", 0.0) + ctc_ms
            if drafted:
                for key in ("decode_passes", "draft_proposed", "draft_accepted"):
                    item.draft_stats[key] = item.draft_stats.get(key, 0) + int(stats[key])

    def _fill_segment(self, item: CutItem, si: int, tokens: list[int], reason: str, logprobs: list[float]) -> None:
        """A decoded segment's tokens, their log-probabilities, stop reason and text into its Segment."""
        seg = item.segments[si]
        seg.tokens, seg.stop_reason = tokens, reason
        if logprobs and len(logprobs) != len(tokens):
            raise RuntimeError(f"the decoder gave {len(logprobs)} log-probabilities for {len(tokens)} tokens")
        # (none where the model's token_logprobs was turned off)
        seg.token_logprobs = [float(x) for x in logprobs] if logprobs or not tokens else None
        seg.text = self.tokenizer.decode([t for t in tokens if t not in self.stop_ids]).strip()
        seg.truncated, seg.repetition = reason == "max_new_tokens", reason == "repetition"

    def _align(self, items: list[CutItem]) -> None:
        """Word (CTC token) timestamps of every decoded segment (:func:`fun_asr.asr.ctc.align_segments`, the
        head on each segment's encoder output, kept since it was encoded). Without a CTC head: segment times
        only, logged once per engine (every result carries the ``word_timestamps_unavailable`` warning)."""
        if self.aligner is None:
            if not self._told_no_ctc:
                self._told_no_ctc = True
                log.warning("word timestamps unavailable: %s; segment-level times only", self.ctc_reason)
            return
        for item in items:
            t0 = time.perf_counter()
            align_segments(self.aligner, self.model.ctc_logprobs_encoded, item, self._text_of,
                           self.tokenizer.token_bytes, self.stop_ids)
            item.timings["align_ms"] = item.timings.get("align_ms", 0.0) + (time.perf_counter() - t0) * 1e3

    def _token_words(self, item: CutItem) -> None:
        """Each decoded segment's text as words with the decoder's probability (Segment.token_words)."""
        for seg in item.segments:
            tokens, logprobs = spoken(seg.tokens, seg.token_logprobs, self.stop_ids)
            if logprobs is not None:
                seg.token_words = token_words(tokens, logprobs, self.tokenizer.token_bytes)

    def _text_of(self, tokens: list[int]) -> str:
        """Decoded token ids, stop ids left out, not stripped (what FunASR aligns)."""
        return self.tokenizer.decode([t for t in tokens if t not in self.stop_ids])
