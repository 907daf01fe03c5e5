"""How sure the recognizer is: per token, per word and per segment, from the log-probability the decoder gave each
token it took (``Model.token_logprobs``: log softmax of the logits row at the greedy choice, computed beside it).

- :func:`avg_logprob`: the mean over a segment's tokens, its end-of-text token included (Whisper's
  ``avg_logprob``, which counts its own end token the same way);
- :func:`compression_ratio`: Whisper's definition on the segment's text (UTF-8 bytes over their zlib-compressed
  length): a looping, repetitive text compresses well and scores high (Whisper treats > 2.4 as failed);
- :func:`token_words`: the segment's text as words (a word starts at white space; a CJK character is a word of its
  own; punctuation joins the word before it), each with the mean probability of the tokens it is made of
  (faster-whisper's word ``probability``);
- :func:`word_probabilities`: the same probability for the CTC head's timed words, through the bytes both
  spell;
- :func:`token_logprobs`: OpenAI's ``include[]=logprobs`` entries ``{token, logprob, bytes}``.

The segment's ``no_speech_prob`` comes from the VAD, not from here (:mod:`fun_asr.asr.cutting`).
"""

from __future__ import annotations

import codecs
import math
import unicodedata
import zlib
from collections.abc import Callable, Sequence
from typing import Any

from fun_asr.asr.language import is_cjk

TokenBytes = Callable[[int], bytes]


def compression_ratio(text: str) -> float:
    """Whisper's compression ratio of ``text``: its UTF-8 length over its zlib-compressed length (0.0 when
    empty)."""
    data = text.encode("utf-8")
    return len(data) / len(zlib.compress(data)) if data else 0.0


def avg_logprob(logprobs: Sequence[float] | None) -> float | None:
    """The mean log-probability of a segment's tokens (None when it has none)."""
    if not logprobs:
        return None
    return math.fsum(logprobs) / len(logprobs)


def mean_logprob(segments: Sequence[Any]) -> float | None:
    """The mean log-probability over every token of ``segments`` (None when none has any): a transcript's, or a
    streamed sentence's, ``avg_logprob``."""
    every = [lp for s in segments for lp in (s.token_logprobs or [])]
    return avg_logprob(every)


def spoken(tokens: Sequence[int], logprobs: Sequence[float] | None, stop_ids: Sequence[int]
           ) -> tuple[list[int], list[float] | None]:
    """A segment's tokens without its stop tokens, and their log-probabilities (None where it has none)."""
    if logprobs is None:
        return [t for t in tokens if t not in stop_ids], None
    kept = [(t, lp) for t, lp in zip(tokens, logprobs, strict=True) if t not in stop_ids]
    return [t for t, _ in kept], [lp for _, lp in kept]


def _spans(tokens: Sequence[int], token_bytes: TokenBytes) -> tuple[bytes, list[tuple[int, int]]]:
    """The tokens' bytes joined and each token's byte span in them."""
    out, spans, at = [], [], 0
    for t in tokens:
        b = token_bytes(int(t))
        out.append(b)
        spans.append((at, at + len(b)))
        at += len(b)
    return b"".join(out), spans


def _mean_probability(logprobs: Sequence[float], first: int, last: int) -> float:
    return sum(math.exp(lp) for lp in logprobs[first : last + 1]) / (last + 1 - first)


def _tokens_over(spans: list[tuple[int, int]], a: int, b: int) -> tuple[int, int] | None:
    """The first and last token whose byte span meets [a, b) (None when none does)."""
    hit = [i for i, (s, e) in enumerate(spans) if s < b and a < e]
    return (hit[0], hit[-1]) if hit else None


def _is_punctuation(ch: str) -> bool:
    return unicodedata.category(ch)[0] in "PS"


def _decoded(data: bytes) -> tuple[str, list[int]]:
    """``data`` decoded as UTF-8 (invalid bytes as U+FFFD, as ``bytes.decode(errors="replace")``) and each
    character's byte offset, plus the end."""
    dec = codecs.getincrementaldecoder("utf-8")("replace")
    chars: list[str] = []
    offsets: list[int] = []
    done = 0  # bytes behind the characters so far (the decoder may hold the start of the next one)
    for i in range(len(data)):
        out = dec.decode(data[i : i + 1])
        consumed = i + 1 - len(dec.getstate()[0])
        for j, ch in enumerate(out):  # (an invalid sequence's U+FFFD may come out with the character after it)
            if j == 0:
                at = done
            elif j == len(out) - 1 and ch != "\ufffd":
                at = consumed - len(ch.encode("utf-8"))
            else:
                at = min(done + j, consumed - 1)
            chars.append(ch)
            offsets.append(at)
        if out:
            done = consumed
    for ch in dec.decode(b"", final=True):
        chars.append(ch)
        offsets.append(done)
    offsets.append(len(data))
    return "".join(chars), offsets


def split_words(text: str) -> list[str]:
    """``text`` as words that join to it: a word starts at white space (which it keeps in front) or at a CJK
    character (each its own word, as is the word after one); punctuation joins the word before it."""
    words: list[str] = []
    for ch in text:
        cur = words[-1] if words else None
        if cur is None:
            words.append(ch)
        elif ch.isspace():
            if cur.isspace():
                words[-1] += ch
            else:
                words.append(ch)
        elif _is_punctuation(ch) or cur.isspace():
            words[-1] += ch
        elif is_cjk(ch) or any(is_cjk(c) for c in cur):
            words.append(ch)
        else:
            words[-1] += ch
    if len(words) > 1 and words[-1].isspace():  # trailing white space: the last word's
        tail = words.pop()
        words[-1] += tail
    return words


def token_words(tokens: Sequence[int], logprobs: Sequence[float], token_bytes: TokenBytes) -> list[dict[str, Any]]:
    """The text the tokens spell, as words ``{"word", "probability"}`` (faster-whisper's shape: a word keeps the
    white space before it, so the words joined are the text; :func:`split_words`). ``probability``: the mean of
    exp(logprob) over the tokens that spell any of its bytes. ``tokens`` and ``logprobs`` pair up (stop tokens
    left out)."""
    if len(tokens) != len(logprobs):
        raise ValueError(f"{len(tokens)} tokens but {len(logprobs)} log-probabilities")
    data, spans = _spans(tokens, token_bytes)
    text, offsets = _decoded(data)
    out, at = [], 0
    for w in split_words(text):
        a, b = offsets[at], offsets[at + len(w)]
        at += len(w)
        hit = _tokens_over(spans, a, b)
        if hit is not None:
            out.append({"word": w, "probability": round(_mean_probability(logprobs, *hit), 4)})
    return out


def word_probabilities(words: list[dict[str, Any]], word_bytes: Sequence[bytes], tokens: Sequence[int],
                       logprobs: Sequence[float], token_bytes: TokenBytes, aligned_text: Callable[[str], tuple[
                           str, list[int]]]) -> None:
    """Gives each CTC-timed word (``words``, spelled by ``word_bytes``: the CTC tokens' bytes, which join to the
    aligned text) a ``probability``: the mean of exp(logprob) over the decoder tokens that spell the same bytes.
    ``aligned_text(response)`` is the text the CTC head aligned and, per character, the position in ``response``
    it came from. Words whose bytes cannot be traced keep no probability."""
    data, spans = _spans(tokens, token_bytes)
    response, r_offsets = _decoded(data)
    aligned, origin = aligned_text(response)
    if aligned.encode("utf-8") != b"".join(word_bytes):
        return
    # each byte of the aligned text -> the character it belongs to
    char_of: list[int] = []
    for i, ch in enumerate(aligned):
        char_of += [i] * len(ch.encode("utf-8"))
    at = 0
    for w, wb in zip(words, word_bytes, strict=True):
        a, b = at, at + len(wb)
        at = b
        if a >= b:
            continue
        first, last = origin[char_of[a]], origin[char_of[b - 1]]
        hit = _tokens_over(spans, r_offsets[first], r_offsets[last + 1])
        if hit is not None:
            w["probability"] = round(_mean_probability(logprobs, *hit), 4)


def token_logprobs(tokens: Sequence[int], logprobs: Sequence[float], token_bytes: TokenBytes
                   ) -> list[dict[str, Any]]:
    """OpenAI's ``logprobs`` entries: ``{"token", "logprob", "bytes"}`` per token (its text, its UTF-8 bytes as a
    list of ints; a token that ends inside a character shows U+FFFD in ``token``, its bytes as they are)."""
    out = []
    for t, lp in zip(tokens, logprobs, strict=True):
        b = token_bytes(int(t))
        out.append({"token": b.decode("utf-8", errors="replace"), "logprob": float(lp), "bytes": list(b)})
    return out


__all__ = ["avg_logprob", "compression_ratio", "mean_logprob", "split_words", "spoken", "token_logprobs", "token_words",
           "word_probabilities"]
