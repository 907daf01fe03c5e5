"""WER/CER with FunASR-style normalisation, on fixed examples computed by hand, and
fun-asr-eval comparing two outputs (batch folders, JSONL, Kaldi text)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from fun_asr.jobs.evaluate import compare, evaluate, load_texts, normalize, score, tokens


@pytest.mark.parametrize("text, want", [
    ("Hello, World! It's fine.", "hello world its fine"),
    ("ＡＢＣ　１２３，ｏｋ？", "abc 123 ok"),  # full-width letters, digits, space and punctuation
    ("今天天气很好。", "今天天气很好"),
    ("“引号”《书名》——破折号…", "引号 书名 破折号"),
    ("こんにちは、世界！", "こんにちは 世界"),
    ("ｺｰﾋｰ・ブレイク", "コーヒー ブレイク"),  # half-width katakana -> full width; the middle dot is punctuation
    ("state-of-the-art  C.E.O.", "state of the art c e o"),
    ("", ""),
])
def test_normalize(text: str, want: str) -> None:
    assert normalize(text) == want


def test_tokens_cjk_per_character_latin_per_word() -> None:
    assert tokens("今天天气很好。") == ["今", "天", "天", "气", "很", "好"]
    assert tokens("Hello, World!") == ["hello", "world"]
    assert tokens("こんにちは、世界！") == ["こ", "ん", "に", "ち", "は", "世", "界"]
    assert tokens("我用FunASR做ASR测试。") == ["我", "用", "funasr", "做", "asr", "测", "试"]
    assert tokens("안녕하세요 world") == ["안", "녕", "하", "세", "요", "world"]


# (reference, hypothesis, (word errors, reference tokens), (char errors, reference chars)), all by hand:
CASES = {
    # zh: one substituted character out of 6; punctuation does not count
    "zh": ("今天天气很好。", "今天天器很好", (1, 6), (1, 6)),
    # en: world -> word (1 of 4 words); characters: helloworlditsfine (17) -> one deletion
    "en": ("Hello, World! It's fine.", "hello word its fine", (1, 4), (1, 17)),
    # ja: は -> わ, one of 7 characters
    "ja": ("こんにちは、世界！", "こんにちわ世界", (1, 7), (1, 7)),
    # mixed: FunASR -> fun asr = one substitution + one insertion over 6 tokens; same 11 characters
    "mixed": ("我用FunASR做测试。", "我用 fun asr 做测试", (2, 6), (0, 11)),
    # zh with a deletion and an insertion: 我们去公园 -> 我去了公园 (们 deleted, 了 inserted): 2 of 5
    "zh2": ("我们去公园", "我去了公园", (2, 5), (2, 5)),
    # full-width and case are not errors
    "width": ("ＦＵＮ－ＡＳＲ　２０２５", "fun asr 2025", (0, 3), (0, 10)),
    # an empty hypothesis: every token deleted
    "empty_hyp": ("a b c", "", (3, 3), (3, 3)),
}


@pytest.mark.parametrize("name", list(CASES))
def test_scores_by_hand(name: str) -> None:
    ref, hyp, (we, rw), (ce, rc) = CASES[name]
    s = score(ref, hyp)
    assert (s.word_errors, s.ref_words, s.char_errors, s.ref_chars) == (we, rw, ce, rc)
    assert s.wer == pytest.approx(we / rw) and s.cer == pytest.approx(ce / rc)


def test_score_details_and_empty_reference() -> None:
    s = score("我用FunASR做测试", "我用 fun asr 做测试")
    assert (s.substitutions, s.deletions, s.insertions) == (1, 0, 1)
    s = score("", "hello there")
    assert s.wer is None and s.cer is None and s.insertions == 2 and s.word_errors == 2
    assert score("。", "").word_errors == 0


def test_corpus_totals_add_up_counts() -> None:
    refs = {k: v[0] for k, v in CASES.items()}
    hyps = {k: v[1] for k, v in CASES.items()}
    report = evaluate(refs, hyps)
    total = report.total
    assert total.word_errors == sum(v[2][0] for v in CASES.values()) == 10
    assert total.ref_words == sum(v[2][1] for v in CASES.values()) == 34
    assert total.wer == pytest.approx(10 / 34)
    assert total.char_errors == 8 and total.ref_chars == 59
    # a failed hypothesis counts as empty; ids without hypothesis are reported, not scored
    report = evaluate({"a": "one two", "b": "three", "c": "four"}, {"a": "one two", "b": "three", "x": "?"},
                      errors={"b": "b.wav: cannot decode audio"})
    assert report.missing == ["c"] and report.extra == ["x"]
    assert report.total.word_errors == 1 and report.total.ref_words == 3
    assert report.summary()["failed"] == 1


def _batch_dir(path: Path, texts: dict[str, str | None]) -> Path:
    """A fun-asr-batch output folder written by hand (None: a failed item)."""
    path.mkdir()
    lines = [json.dumps({"id": k, "audio": f"{k}.wav", "text": t or "", "error": None if t is not None else "broken"},
                        ensure_ascii=False) for k, t in texts.items()]
    (path / "shard-00000.jsonl").write_text("\n".join(lines[:2]) + "\n", "utf-8")
    (path / "shard-00001.jsonl").write_text("\n".join(lines[2:]) + "\n" + '{"id": "torn", "te', "utf-8")
    return path


def _eval(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "fun_asr.cli.evaluate", *args], capture_output=True, text=True,
                          timeout=120)


def test_fun_asr_eval_compares_two_outputs(tmp_path: Path) -> None:
    ref = {"zh": "今天天气很好。", "en": "Hello, World! It's fine.", "ja": "こんにちは、世界！",
           "mix": "我用FunASR做测试。"}
    f16 = _batch_dir(tmp_path / "f16", ref)
    q4 = _batch_dir(tmp_path / "q4", {"zh": "今天天器很好", "en": "hello word its fine", "ja": None,
                                      "mix": "我用 fun asr 做测试"})
    texts, errors = load_texts(q4)
    assert set(texts) == {"zh", "en", "ja", "mix"} and errors == {"ja": "broken"}  # the torn line is not a result
    report = compare(q4, f16)
    # zh 1/6, en 1/4, ja failed = 7 deletions of 7, mix 2/6
    assert (report.total.word_errors, report.total.ref_words) == (1 + 1 + 7 + 2, 6 + 4 + 7 + 6)
    r = _eval(str(q4), str(f16), "--json", "--table", str(tmp_path / "t.tsv"))
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    assert out["word_errors"] == 11 and out["ref_words"] == 23 and out["wer"] == pytest.approx(11 / 23, abs=1e-6)
    assert out["items"] == 4 and out["failed"] == 1
    rows = (tmp_path / "t.tsv").read_text("utf-8").splitlines()
    assert rows[0].split("\t")[:3] == ["id", "wer", "cer"] and len(rows) == 5
    assert rows[1].startswith("zh\t0.1667\t0.1667\t1\t6\t")
    # JSONL and Kaldi text files, and a missing id
    (tmp_path / "hyp.jsonl").write_text("".join(json.dumps({"id": k, "text": v}, ensure_ascii=False) + "\n"
                                                for k, v in {"zh": "今天天器很好", "en": "hello world"}.items()))
    (tmp_path / "text").write_text("zh 今天天气很好。\nen Hello, World! It's fine.\nja こんにちは\n", "utf-8")
    r = _eval(str(tmp_path / "hyp.jsonl"), str(tmp_path / "text"), "--worst", "1")
    assert r.returncode == 0, r.stderr
    # zh 1 of 6, en 2 deletions of 4 -> 3/10; ja not scored
    assert r.stdout.startswith("WER 30.00% (3/10 tokens: 1 sub, 2 del, 0 ins)"), r.stdout
    assert "1 without hypothesis" in r.stdout and "1 reference ids have no hypothesis" in r.stderr
    assert "\nen\tWER 50.0%" in r.stdout
    r = _eval(str(tmp_path / "nope.jsonl"), str(tmp_path / "text"))
    assert r.returncode == 2 and "no such file" in r.stderr


def test_worst_lists_only_items_with_errors(tmp_path: Path) -> None:
    """--worst N filled the list with perfect items (WER 0) when fewer than N had errors."""
    ref = _batch_dir(tmp_path / "ref", {"a": "one two three", "b": "four five", "c": "six", "d": "seven"})
    hyp = _batch_dir(tmp_path / "hyp", {"a": "one two tree", "b": "four five", "c": None, "d": "seven"})
    r = _eval(str(hyp), str(ref), "--worst", "10")
    assert r.returncode == 0, r.stderr
    listed = [line.split("\t")[0] for line in r.stdout.splitlines() if "\tWER " in line]
    assert listed == ["a", "c"], r.stdout  # c failed (1 deletion), a 1 substitution; b and d are perfect
    r = _eval(str(ref), str(ref), "--worst", "3")
    assert r.returncode == 0 and "\tWER " not in r.stdout and "no item has errors" in r.stderr
    r = _eval(str(hyp), str(ref), "--worst", "-1")
    assert r.returncode == 2 and "--worst must be 0 or more" in r.stderr
