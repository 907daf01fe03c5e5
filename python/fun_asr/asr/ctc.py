"""CTC forced alignment and token timestamps, as FunASR 1.4.16 gives them (numpy, no torch).

FunASR (``funasr/models/fun_asr_nano/model.py`` ``inference_llm``) times the LLM's text with its CTC head:

1. ``text = re.sub(r"\\s+", " ", response.replace("/sil", " "))`` where ``response`` is the decoded LLM
   output (special tokens skipped) -- :func:`funasr_text`;
2. ``targets = ctc_tokenizer.encode(text)``: the SenseVoice tiktoken BPE, special-token strings encoded
   as plain text -- :class:`CtcTokenizer`;
3. ``torchaudio.functional.forced_align(log_probs, targets, blank)``: the Viterbi path of the CTC trellis
   (one label per encoder frame) -- :func:`forced_align`, the same recursion, comparisons and tie-breaking
   as torchaudio's CPU kernel, in float32;
4. the path grouped into runs of one label (``itertools.groupby``), blanks dropped; each run is one
   token with ``start_time`` = first frame, ``end_time`` = last frame + 1, ``score`` = the run's largest
   probability (rounded to 3 places); times x 60 ms (``frame * 6 * 10 / 1000`` s) -- :func:`align`.

Any failure (empty text, more targets than frames allow) gives no timestamps, as FunASR's
``forced_align`` wrapper returns ``[]``.

    tok = CtcTokenizer.from_metadata(meta)              # GGUF metadata: fun_asr_nano.ctc.tokenizer.*
    words = align(model.ctc_logprobs(features), funasr_text(raw_text), tok, blank_id=info["ctc"]["blank_id"])

    aligner = CtcAligner.from_model(model, meta)        # None without a CTC head (info()["ctc"]["reason"])
    words = aligner.words(model, features, raw_text, offset_ms=segment_start_ms)
"""

from __future__ import annotations

import base64
import json
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from itertools import groupby
from typing import Any

import numpy as np

from fun_asr.asr.confidence import spoken, word_probabilities
from fun_asr.notices import Notice

__all__ = ["CtcAligner", "CtcTokenizer", "TokenTime", "align", "align_ids", "align_segments", "draft_text",
           "forced_align", "funasr_text", "funasr_text_origin", "greedy_ids", "merge_labels"]


@dataclass(frozen=True)
class TokenTime:
    """One aligned CTC token. ``text`` is the token decoded on its own (a partial UTF-8 sequence shows
    as U+FFFD, as FunASR's tiktoken decode gives it); frames count 60 ms encoder frames from the start
    of the features; ``start_ms``/``end_ms`` = frames x frame_ms."""

    text: str
    token_id: int
    start_frame: int
    end_frame: int  # exclusive
    start_ms: int
    end_ms: int
    score: float  # the run's largest probability, rounded to 3 places (FunASR's "score")

    @property
    def start(self) -> float:
        """Seconds (FunASR's start_time)."""
        return self.start_ms / 1000.0

    @property
    def end(self) -> float:
        return self.end_ms / 1000.0

    def to_dict(self) -> dict[str, Any]:
        return {"token": self.text, "start_time": self.start, "end_time": self.end, "score": self.score}


def funasr_text(response: str) -> str:
    """FunASR's ``result["text"]`` from the decoded LLM output: ``/sil`` -> space, whitespace runs -> one
    space (not stripped). This is the text FunASR aligns."""
    return re.sub(r"\s+", " ", response.replace("/sil", " "))


def funasr_text_origin(response: str) -> tuple[str, list[int]]:
    """:func:`funasr_text` of ``response`` and, for each of its characters, the position in ``response`` of the
    character it came from (a collapsed run of white space: its first)."""
    chars: list[str] = []
    origin: list[int] = []
    i = 0
    while i < len(response):
        if response.startswith("/sil", i) or response[i].isspace():
            start = i
            while i < len(response) and (response.startswith("/sil", i) or response[i].isspace()):
                i += 4 if response.startswith("/sil", i) else 1
            chars.append(" ")
            origin.append(start)
        else:
            chars.append(response[i])
            origin.append(i)
            i += 1
    return "".join(chars), origin


# -- the CTC tokenizer (tiktoken-compatible BPE) --------------------------------------------------

class CtcTokenizer:
    """The CTC vocabulary: tiktoken-style byte-level BPE (``ranks``: token bytes -> id; special tokens
    after them). ``encode`` is tiktoken's ``encode(text, disallowed_special=())`` as FunASR's
    SenseVoiceTokenizer calls it: the pre-tokenizer regex splits the text, and each piece is one token
    when it is in the vocabulary, else byte-pair merged by lowest rank (leftmost first on ties)."""

    def __init__(self, ranks: dict[bytes, int], pattern: str, specials: list[str] | None = None) -> None:
        from tokenizers import Regex, pre_tokenizers

        self.ranks = ranks
        self.pattern = pattern
        self._split = pre_tokenizers.Split(Regex(pattern), behavior="isolated", invert=False)
        self.decoder: dict[int, bytes] = {i: b for b, i in ranks.items()}
        self.n_ranks = len(ranks)
        self.specials = list(specials or [])
        for k, s in enumerate(self.specials):
            self.decoder[self.n_ranks + k] = s.encode("utf-8")
        self._cache: dict[str, list[int]] = {}

    @property
    def vocab_size(self) -> int:
        return self.n_ranks + len(self.specials)

    @classmethod
    def from_tiktoken(cls, text: str, pattern: str, specials: list[str] | None = None) -> CtcTokenizer:
        ranks = {}
        for line in text.splitlines():
            if line:
                tok, rank = line.split()
                ranks[base64.b64decode(tok)] = int(rank)
        return cls(ranks, pattern, specials)

    @classmethod
    def from_metadata(cls, meta: dict[str, Any]) -> CtcTokenizer:
        """From the GGUF metadata (``fun_asr_nano.ctc.tokenizer.{type,pattern,ranks,specials}``)."""
        k = "fun_asr_nano.ctc.tokenizer."
        if k + "ranks" not in meta:
            reason = meta.get("fun_asr_nano.ctc.unavailable", "the model has no CTC tokenizer")
            raise ValueError(f"no CTC tokenizer in this model: {reason}")
        if meta.get(k + "type", "tiktoken") != "tiktoken":
            raise ValueError(f"CTC tokenizer type {meta[k + 'type']!r} is not supported (accepted: tiktoken)")
        specials = json.loads(meta[k + "specials"]) if k + "specials" in meta else []
        return cls.from_tiktoken(meta[k + "ranks"], meta[k + "pattern"], specials)

    def _bpe(self, piece: bytes) -> list[int]:
        tok = self.ranks.get(piece)
        if tok is not None:
            return [tok]
        # tiktoken's byte-pair merge: parts are byte boundaries; merge the adjacent pair of lowest rank
        parts = list(range(len(piece) + 1))
        ranks = self.ranks
        big = 1 << 62

        def rank_at(i: int) -> int:
            if i + 2 < len(parts):
                return ranks.get(piece[parts[i]:parts[i + 2]], big)
            return big

        pair = [rank_at(i) for i in range(len(parts) - 1)]
        while len(parts) > 2:
            best, i = min((r, i) for i, r in enumerate(pair[:-1])) if len(pair) > 1 else (big, -1)
            if best == big:
                break
            del parts[i + 1]
            del pair[i + 1]
            pair[i] = rank_at(i)
            if i > 0:
                pair[i - 1] = rank_at(i - 1)
        out = []
        for a, b in zip(parts[:-1], parts[1:], strict=True):
            t = ranks.get(piece[a:b])
            if t is None:
                raise ValueError(f"CTC vocabulary has no token for bytes {piece[a:b]!r} (single bytes must all be "
                                 "tokens)")
            out.append(t)
        return out

    def encode(self, text: str) -> list[int]:
        ids: list[int] = []
        for piece, _ in self._split.pre_tokenize_str(text):
            cached = self._cache.get(piece)
            if cached is None:
                cached = self._bpe(piece.encode("utf-8"))
                if len(self._cache) < 100_000:
                    self._cache[piece] = cached
            ids.extend(cached)
        return ids

    def decode(self, ids: list[int]) -> str:
        """tiktoken's decode (bytes joined, invalid UTF-8 replaced by U+FFFD); like FunASR's
        SenseVoiceTokenizer.decode, timestamp tokens (``<|0.00|>`` ...) are dropped."""
        first_ts = self.n_ranks + self.specials.index("<|0.00|>") if "<|0.00|>" in self.specials else None
        out = b"".join(self.decoder.get(int(i), b"") for i in ids if first_ts is None or int(i) < first_ts)
        return out.decode("utf-8", errors="replace")


# -- forced alignment -----------------------------------------------------------------------------

def forced_align(log_probs: np.ndarray, targets: list[int] | np.ndarray, blank: int) -> tuple[np.ndarray, np.ndarray]:
    """The most likely CTC path that emits ``targets``: (labels [T] int64, log-prob of each frame's label [T]).

    torchaudio.functional.forced_align (CPU kernel, batch 1) step for step: alphas over the 2L+1
    states in float32, a state window [start, end) that keeps the path able to finish, back-pointers 0/1/2
    chosen by ``x2 > x1 and x2 > x0`` -> 2, elif ``x1 > x0`` -> 1, else 0; the path ends in the last
    label or the final blank, whichever scores higher (the blank on a tie). Raises ValueError where
    torchaudio raises (too many targets for the frames, blank among the targets, ids out of range)."""
    lp = np.ascontiguousarray(log_probs, dtype=np.float32)
    if lp.ndim != 2:
        raise ValueError(f"log_probs must be [T, vocab], got shape {lp.shape}")
    tg = np.asarray(targets, dtype=np.int64).reshape(-1)
    T, V = lp.shape
    L = int(tg.shape[0])
    if L == 0:
        raise ValueError("targets is empty")
    if not 0 <= blank < V:
        raise ValueError(f"blank {blank} outside [0, {V})")
    if (tg == blank).any():
        raise ValueError("targets contain the blank index")
    if tg.max() >= V or tg.min() < 0:
        raise ValueError("targets values must be in [0, vocab)")
    R = int(np.count_nonzero(tg[1:] == tg[:-1]))
    if T < L + R:
        raise ValueError(f"targets length is too long for CTC: {T} frames, {L} targets, {R} repeats")
    S = 2 * L + 1
    neg = np.float32(-np.inf)
    labels = np.full(S, blank, dtype=np.int64)
    labels[1::2] = tg
    # x2 (skip the blank before a label) is allowed at odd states i >= 3 whose label differs from the previous label
    skip_ok = np.zeros(S, dtype=bool)
    skip_ok[3::2] = tg[1:] != tg[:-1]
    emit = lp[:, labels]  # [T, S]
    back = np.full((T, S), -1, dtype=np.int8)
    alpha = np.full(S, neg, dtype=np.float32)
    start = 0 if T - (L + R) > 0 else 1
    end = 1 if S == 1 else 2
    alpha[start:end] = emit[0, start:end]
    for t in range(1, T):
        if T - t <= L + R:
            if start % 2 == 1 and tg[start // 2] != tg[start // 2 + 1]:
                start += 1
            start += 1
        if t <= L + R:
            if end % 2 == 0 and end < 2 * L and tg[end // 2 - 1] != tg[end // 2]:
                end += 1
            end += 1
        prev = alpha
        alpha = np.full(S, neg, dtype=np.float32)
        lo = start
        if start == 0:
            alpha[0] = prev[0] + emit[t, 0]
            back[t, 0] = 0
            lo = 1
        if lo < end:
            idx = np.arange(lo, end)
            x0 = prev[idx]
            x1 = prev[idx - 1]
            x2 = np.where(skip_ok[idx], prev[np.maximum(idx - 2, 0)], neg)
            c2 = (x2 > x1) & (x2 > x0)
            c1 = ~c2 & (x1 > x0)
            best = np.where(c2, x2, np.where(c1, x1, x0))
            back[t, lo:end] = np.where(c2, 2, np.where(c1, 1, 0)).astype(np.int8)
            alpha[lo:end] = best + emit[t, idx]
    state = S - 1 if alpha[S - 1] > alpha[S - 2] else S - 2
    path = np.empty(T, dtype=np.int64)
    for t in range(T - 1, -1, -1):
        path[t] = labels[state]
        state -= int(back[t, state])
    return path, lp[np.arange(T), path]


def align_ids(log_probs: np.ndarray, targets: list[int], blank: int, frame_ms: int = 60,
              tokenizer: CtcTokenizer | None = None, offset_ms: int = 0) -> list[TokenTime]:
    """Token runs of the forced path of ``targets`` (FunASR's forced_align in tools/utils.py): [] when the
    alignment is impossible (as FunASR, which swallows the error). ``offset_ms`` is added to the times
    (frames stay relative to the log-probs)."""
    try:
        path, scores = forced_align(log_probs, targets, blank)
    except ValueError:
        return []
    probs = np.exp(scores).tolist()
    out = []
    frame = 0
    for label, group in groupby(path.tolist()):
        n = len(list(group))
        if label != blank:
            score = round(max(probs[frame:frame + n]), 3)
            text = tokenizer.decode([label]) if tokenizer is not None else ""
            out.append(TokenTime(text, int(label), frame, frame + n, offset_ms + frame * frame_ms,
                                 offset_ms + (frame + n) * frame_ms, score))
        frame += n
    return out


def align(log_probs: np.ndarray, text: str, tokenizer: CtcTokenizer, blank_id: int,
          frame_ms: int = 60, offset_ms: int = 0) -> list[TokenTime]:
    """Per-token times of ``text`` (FunASR's ``result["text"]``; see :func:`funasr_text`) on the CTC
    log-probabilities ``[T, vocab]`` of one segment (``Model.ctc_logprobs``): FunASR 1.4.16's
    ``timestamps``. Times count from the segment's first feature frame, plus ``offset_ms``."""
    return align_ids(log_probs, tokenizer.encode(text), blank_id, frame_ms, tokenizer, offset_ms)


class CtcAligner:
    """What a transcriber needs for token timestamps: the CTC tokenizer, the blank id, the frame length."""

    def __init__(self, tokenizer: CtcTokenizer, blank_id: int, frame_ms: int = 60) -> None:
        self.tokenizer, self.blank_id, self.frame_ms = tokenizer, int(blank_id), int(frame_ms)

    @classmethod
    def from_model(cls, model: Any, meta: dict[str, Any]) -> CtcAligner | None:
        """From a loaded ``_core.Model`` and its metadata (``fun_asr.model.native.model_metadata``); None when the
        model has no CTC head (``model.info()["ctc"]["reason"]`` says why)."""
        info = model.info()["ctc"]
        if not info["available"]:
            return None
        return cls(CtcTokenizer.from_metadata(meta), info["blank_id"], info.get("frame_ms", 60))

    def align_text(self, log_probs: np.ndarray, response: str, offset_ms: int = 0) -> list[TokenTime]:
        """Times of the LLM's decoded output ``response`` (special tokens skipped, *not* stripped): FunASR
        aligns ``funasr_text(response)``."""
        return align(log_probs, funasr_text(response), self.tokenizer, self.blank_id, self.frame_ms, offset_ms)

    def words(self, model: Any, features: np.ndarray, response: str, offset_ms: int = 0) -> list[TokenTime]:
        """One segment: the CTC head on its LFR features (``model.ctc_logprobs``), then :meth:`align_text`."""
        return self.align_text(model.ctc_logprobs(np.ascontiguousarray(features, dtype=np.float32)), response,
                               offset_ms)


def greedy_ids(log_probs: np.ndarray, blank: int) -> list[int]:
    """FunASR's CTC greedy text ids (argmax per frame, repeats merged, blanks dropped): its ``ctc_text``
    is ``tokenizer.decode(greedy_ids(...)).replace("<|nospeech|>", "")``."""
    return merge_labels(np.asarray(log_probs).argmax(axis=-1), blank)


def merge_labels(labels: np.ndarray, blank: int) -> list[int]:
    """Per-frame CTC labels -> the label sequence: repeats merged, blanks dropped."""
    best = np.asarray(labels).reshape(-1)
    if best.size == 0:
        return []
    keep = np.ones(best.shape[0], dtype=bool)
    keep[1:] = best[1:] != best[:-1]
    return [int(x) for x in best[keep] if x != blank]


_SPECIAL = re.compile(r"<\|[^|<>]*\|>")


def draft_text(labels: np.ndarray, blank: int, tokenizer: CtcTokenizer) -> str:
    """The CTC greedy transcript of one segment from each frame's most likely label (``Model.ctc_greedy``):
    repeats merged, blanks dropped, decoded, special tokens (``<|nospeech|>``, ``<|en|>``, ...) removed and
    white space collapsed. Speculative decoding's draft: it is only ever verified, never trusted."""
    return re.sub(r"\s+", " ", _SPECIAL.sub(" ", tokenizer.decode(merge_labels(labels, blank)))).strip()


def align_segments(aligner: CtcAligner, logprobs: Callable[[np.ndarray], np.ndarray], item: Any,
                   text_of: Callable[[list[int]], str], token_bytes: Callable[[int], bytes] | None = None,
                   stop_ids: Sequence[int] = ()) -> None:
    """Word (CTC token) timestamps of a recording's decoded segments: FunASR 1.4.16's forced alignment of the
    LLM's text (``text_of(segment.tokens)``, not stripped) on the CTC head's posteriors (``logprobs`` of each
    segment's encoder output, kept in ``item.enc_out`` since it was encoded: no second encoder pass), into
    ``segment.words``. A segment with text whose alignment fails (FunASR then has no times either) keeps
    ``words == []`` and the recording gets ``word_timestamps_failed``; its subtitle is one segment-level cue.
    With ``token_bytes`` (the decoder tokenizer's) each word also gets the decoder's ``probability`` of the tokens
    that spell it (:func:`fun_asr.asr.confidence.word_probabilities`). The kept encoder outputs are released."""

    for si, enc in item.enc_out.items():
        seg = item.segments[si]
        times = aligner.align_text(logprobs(enc), text_of(seg.tokens), offset_ms=int(round(seg.start * 1000)))
        seg.words = [{"word": t.text, "start": t.start, "end": t.end, "score": t.score} for t in times]
        tokens, lps = spoken(seg.tokens, seg.token_logprobs, stop_ids)
        if token_bytes is not None and lps is not None and seg.words:
            word_probabilities(seg.words, [aligner.tokenizer.decoder.get(t.token_id, b"") for t in times], tokens,
                               lps, token_bytes, funasr_text_origin)
        if seg.text.strip() and not any(w["word"].strip() for w in seg.words):
            item.warnings.append(Notice(
                "word_timestamps_failed",
                f"{item.source}: segment {seg.start:.2f}-{seg.end:.2f} s: the forced alignment of its text "
                "on the CTC head failed, so it has segment-level times only (one subtitle cue)"))
    item.enc_out.clear()
