"""WER and CER with FunASR-style text normalisation (jiwer computes the edit distances).

Normalisation (:func:`normalize`), applied to both sides:

1. Unicode NFKC: full-width letters, digits and spaces become half-width (``ＡＢＣ　１２３`` ->
   ``ABC 123``), compatibility forms are unified (half-width katakana -> full-width);
2. lower case (English and other cased scripts);
3. punctuation and symbols (Unicode categories P* and S*) removed: apostrophes are dropped inside
   words (``it's`` -> ``its``), every other mark becomes a space (``hello,world`` -> two words);
4. runs of white space collapsed.

Tokens (:func:`tokens`): every CJK character (Han, kana, Hangul syllables) is one token; other text is
split at white space into words. So Chinese and Japanese are scored per character, English per word,
and mixed text (``我用FunASR`` -> ``我 用 funasr``) with CJK characters and Latin words as tokens (what
FunASR's ``compute_wer`` calls the mixed error rate).

``wer`` = word-level (token-level) edit distance / reference tokens; ``cer`` = character-level edit
distance over the tokens' characters, white space excluded / reference characters.
"""

from __future__ import annotations

import json
import os
import unicodedata
from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path

APOSTROPHES = frozenset("'’‘`´ʼ")


def is_cjk(ch: str) -> bool:
    """A character scored on its own: Han ideographs, hiragana, katakana, Hangul syllables/jamo."""
    o = ord(ch)
    return (0x4E00 <= o <= 0x9FFF or 0x3400 <= o <= 0x4DBF or 0x20000 <= o <= 0x2FA1F or 0xF900 <= o <= 0xFAFF
            or 0x3040 <= o <= 0x30FF or 0x31F0 <= o <= 0x31FF or 0x3005 <= o <= 0x3007
            or 0xAC00 <= o <= 0xD7AF or 0x1100 <= o <= 0x11FF or 0x3130 <= o <= 0x318F)


def normalize(text: str | None) -> str:
    """NFKC, lower case, punctuation/symbols removed, white space collapsed (see the module doc)."""
    if not text:
        return ""
    text = unicodedata.normalize("NFKC", text).lower()
    out = []
    for ch in text:
        cat = unicodedata.category(ch)
        if ch in APOSTROPHES:
            continue
        if cat[0] in "PS":  # (the prolonged sound mark ー is a letter, Lm: it stays)
            out.append(" ")
        elif cat[0] in "ZC":
            out.append(" ")
        else:
            out.append(ch)
    return " ".join("".join(out).split())


def tokens(text: str | None) -> list[str]:
    """The scored tokens of a text after :func:`normalize`: CJK characters one by one, other words whole."""
    result: list[str] = []
    for word in normalize(text).split():
        current = ""
        for ch in word:
            if is_cjk(ch):
                if current:
                    result.append(current)
                    current = ""
                result.append(ch)
            else:
                current += ch
        if current:
            result.append(current)
    return result


@dataclass
class Score:
    """Edit counts of one (reference, hypothesis) pair, or of a whole corpus (added up)."""

    ref_words: int = 0
    word_errors: int = 0
    substitutions: int = 0
    deletions: int = 0
    insertions: int = 0
    ref_chars: int = 0
    char_errors: int = 0

    @property
    def wer(self) -> float | None:
        """Token error rate; None when the reference is empty."""
        return self.word_errors / self.ref_words if self.ref_words else None

    @property
    def cer(self) -> float | None:
        return self.char_errors / self.ref_chars if self.ref_chars else None

    def __add__(self, other: Score) -> Score:
        return Score(*(a + b for a, b in zip(asdict(self).values(), asdict(other).values(), strict=True)))

    def to_dict(self) -> dict[str, float | int | None]:
        d: dict[str, float | int | None] = {"wer": _round(self.wer), "cer": _round(self.cer)}
        d.update(asdict(self))
        return d


def _round(x: float | None) -> float | None:
    return None if x is None else round(x, 6)


def score(reference: str | None, hypothesis: str | None) -> Score:
    """Scores one hypothesis against its reference (both normalised here)."""
    import jiwer

    ref, hyp = tokens(reference), tokens(hypothesis)
    ref_chars, hyp_chars = "".join(ref), "".join(hyp)
    s = Score(ref_words=len(ref), ref_chars=len(ref_chars))
    if not ref or not hyp:  # jiwer refuses empty references: all insertions, or all deletions
        s.insertions = len(hyp) if not ref else 0
        s.deletions = len(ref) if not hyp else 0
        s.word_errors = s.insertions + s.deletions
        s.char_errors = len(hyp_chars) if not ref else len(ref_chars)
        return s
    w = jiwer.process_words(" ".join(ref), " ".join(hyp))
    s.substitutions, s.deletions, s.insertions = w.substitutions, w.deletions, w.insertions
    s.word_errors = w.substitutions + w.deletions + w.insertions
    c = jiwer.process_characters(ref_chars, hyp_chars)
    s.char_errors = c.substitutions + c.deletions + c.insertions
    return s


def wer(reference: str, hypothesis: str) -> float | None:
    return score(reference, hypothesis).wer


def cer(reference: str, hypothesis: str) -> float | None:
    return score(reference, hypothesis).cer


@dataclass
class ItemResult:
    id: str
    reference: str
    hypothesis: str
    score: Score
    error: str | None = None  # the hypothesis failed (its text is empty)


@dataclass
class Report:
    """Corpus WER/CER plus the per-item table. ``missing``: reference ids without a hypothesis (not
    scored); ``extra``: hypothesis ids without a reference."""

    items: list[ItemResult]
    missing: list[str] = field(default_factory=list)
    extra: list[str] = field(default_factory=list)

    @property
    def total(self) -> Score:
        t = Score()
        for it in self.items:
            t = t + it.score
        return t

    def summary(self) -> dict:
        t = self.total
        return {"items": len(self.items), "failed": sum(1 for it in self.items if it.error),
                "missing": len(self.missing), "extra": len(self.extra), **t.to_dict()}

    def describe(self) -> str:
        t = self.total
        wer_s = "n/a" if t.wer is None else f"{100 * t.wer:.2f}%"
        cer_s = "n/a" if t.cer is None else f"{100 * t.cer:.2f}%"
        line = (f"WER {wer_s} ({t.word_errors}/{t.ref_words} tokens: {t.substitutions} sub, {t.deletions} del, "
                f"{t.insertions} ins), CER {cer_s} ({t.char_errors}/{t.ref_chars} chars), {len(self.items)} items")
        failed = sum(1 for it in self.items if it.error)
        if failed:
            line += f", {failed} failed (scored as empty)"
        if self.missing:
            line += f", {len(self.missing)} without hypothesis (not scored)"
        if self.extra:
            line += f", {len(self.extra)} without reference (not scored)"
        return line

    def write_table(self, path: str | os.PathLike[str], overwrite: bool = True) -> None:
        """Per-item TSV: id, wer, cer, errors, reference tokens, error, reference, hypothesis. Written whole or
        not at all; an existing file is replaced only with ``overwrite`` (ExistingOutputError otherwise)."""
        write_table(self.items, path, overwrite)


TABLE_HEADER = "id\twer\tcer\tword_errors\tref_words\tchar_errors\tref_chars\terror\treference\thypothesis\n"


def write_table(items: Iterable[ItemResult], path: str | os.PathLike[str], overwrite: bool = True) -> None:
    def clean(s: str | None) -> str:
        return " ".join((s or "").split())

    lines = [TABLE_HEADER]
    for it in items:
        s = it.score
        lines.append("\t".join([it.id, _fmt(s.wer), _fmt(s.cer), str(s.word_errors), str(s.ref_words),
                                str(s.char_errors), str(s.ref_chars), clean(it.error), clean(it.reference),
                                clean(it.hypothesis)]) + "\n")
    from fun_asr.outputs import write_atomic

    write_atomic(path, "".join(lines), overwrite=overwrite)


def _fmt(x: float | None) -> str:
    return "" if x is None else f"{x:.4f}"


def evaluate(references: Mapping[str, str], hypotheses: Mapping[str, str],
             errors: Mapping[str, str | None] | None = None) -> Report:
    """Scores every reference id that has a hypothesis (a failed one, listed in ``errors``, counts
    as an empty text); the per-item table is in reference order."""
    items = []
    missing = []
    for key, ref in references.items():
        if key not in hypotheses:
            missing.append(key)
            continue
        err = (errors or {}).get(key)
        hyp = "" if err else hypotheses[key]
        items.append(ItemResult(key, ref, hyp, score(ref, hyp), err))
    extra = [k for k in hypotheses if k not in references]
    return Report(items, missing, extra)


# -- reading transcripts ----------------------------------------------------------------------------

class TextSourceError(ValueError):
    """A transcript file or folder that cannot be read; says what is accepted."""


ACCEPTED = ("a fun-asr-batch output folder, a JSONL file (one object per line with 'id' and 'text'), or a "
            "Kaldi text file ('<id> <text>' per line)")


def load_texts(source: str | os.PathLike[str]) -> tuple[dict[str, str], dict[str, str | None]]:
    """id -> text, and id -> error (failed items), from a fun-asr-batch output folder (its JSONL
    shards), a JSONL file, or a Kaldi ``text`` file (``<id> <text>``). Paths may be fsspec URLs."""
    s = os.fspath(source)
    if "://" not in s and Path(s).is_dir():
        from fun_asr.jobs.records import read_results

        records = read_results(s)
        if not records:
            raise TextSourceError(f"{s}: no results in this folder (expected fun-asr-batch shards *.jsonl)")
        return ({k: r.get("text") or "" for k, r in records.items()},
                {k: r.get("error") for k, r in records.items() if r.get("error")})
    text = _read_text(s)
    lower = s.lower()
    if lower.endswith((".jsonl", ".json", ".ndjson")):
        return _parse_jsonl(text, s)
    return _parse_kaldi_text(text, s), {}


def _read_text(path: str) -> str:
    try:
        if "://" in path:
            import fsspec

            with fsspec.open(path, "rt", encoding="utf-8") as f:
                return f.read()
        return Path(path).read_text("utf-8")
    except FileNotFoundError:
        raise TextSourceError(f"{path}: no such file; expected {ACCEPTED}") from None
    except UnicodeDecodeError as exc:
        raise TextSourceError(f"{path}: not UTF-8 text ({exc.reason}); expected {ACCEPTED}") from None


def _parse_jsonl(text: str, name: str) -> tuple[dict[str, str], dict[str, str | None]]:
    texts: dict[str, str] = {}
    errors: dict[str, str | None] = {}
    for n, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        try:
            obj = json.loads(line)
        except json.JSONDecodeError as exc:
            raise TextSourceError(f"{name}:{n}: not JSON ({exc.msg}); expected {ACCEPTED}") from None
        if not isinstance(obj, dict) or "id" not in obj:
            raise TextSourceError(f"{name}:{n}: a JSON object with 'id' and 'text' is expected")
        key = str(obj["id"])
        texts[key] = str(obj.get("text") or "")
        if obj.get("error"):
            errors[key] = str(obj["error"])
    return texts, errors


def parse_kaldi_text(text: str) -> dict[str, str]:
    """Kaldi ``text``: ``<utterance-id> <transcript>`` per line (a line with only the id: empty text)."""
    return _parse_kaldi_text(text, "text")


def _parse_kaldi_text(text: str, name: str) -> dict[str, str]:
    out: dict[str, str] = {}
    for line in text.splitlines():
        line = line.strip()
        if not line:
            continue
        parts = line.split(maxsplit=1)
        out[parts[0]] = parts[1] if len(parts) > 1 else ""
    return out


def compare(hypothesis: str | os.PathLike[str], reference: str | os.PathLike[str]) -> Report:
    """Scores one transcript set against another (e.g. a Q4_K_M run against an F16 run)."""
    hyp, errors = load_texts(hypothesis)
    ref, ref_errors = load_texts(reference)
    for key in ref_errors:  # a failed reference item has no reference text: do not score it
        ref.pop(key, None)
    return evaluate(ref, hyp, errors)


__all__ = ["ItemResult", "Report", "Score", "TextSourceError", "compare", "cer", "evaluate", "is_cjk", "load_texts",
           "normalize", "parse_kaldi_text", "score", "tokens", "wer", "write_table"]
