"""The model spec's language tables (which variant a checkpoint uses) and the vocabulary of a FunASR
checkpoint's CTC head: the SenseVoice-style tiktoken ranks file and its special tokens, checked and turned into
the GGUF keys ``fun_asr_nano.ctc.tokenizer.*``."""

from __future__ import annotations

import base64
import json
from pathlib import Path
from typing import Any

from fun_asr.model.checkpoint import CheckpointError
from fun_asr.model.funasr_config import local_path, lookup, section
from fun_asr.model.hparams import CtcParams
from fun_asr.model.spec import load_spec


def language_table(spec: dict[str, Any], sources: list[str], config: dict[str, Any] | None = None) -> str:
    """The language variant (``model_specs`` ``language_tables.variants`` key: ``nano`` or ``mlt_nano``)
    for a checkpoint: an explicit ``language_table`` in its config, else the first variant whose
    pattern occurs in one of ``sources`` (repo ids, hub names, folder names; case-insensitive)."""
    tables = spec["language_tables"]
    variants = tables["variants"]
    explicit = (config or {}).get("language_table")
    if isinstance(explicit, str):
        if explicit not in variants:
            raise CheckpointError(f"config: language_table {explicit!r} is not one of {', '.join(variants)}")
        return explicit
    for name, v in variants.items():
        for pat in v.get("patterns", []):
            if any(pat.lower() in s.lower() for s in sources if s):
                return name
    return tables["default"]


def languages_for(spec: dict[str, Any], variant: str | None) -> dict[str, Any]:
    """The languages table (code -> names, prompt_name, join) of a variant; None / unknown -> the default."""
    tables = spec.get("language_tables")
    if not tables:
        return spec["languages"]
    v = tables["variants"].get(variant or tables["default"]) or tables["variants"][tables["default"]]
    return spec[v["table"]]


def expand_specials(recipe: dict[str, Any], num_languages: int) -> list[str]:
    """The special tokens of a SenseVoice-style tiktoken vocabulary, in id order (model spec recipe)."""
    out: list[str] = []
    for item in recipe["specials"]:
        if isinstance(item, str):
            out.append(item)
        elif "each" in item:
            values = list(recipe[item["each"]])
            if item.get("limit") == "num_languages":
                values = values[:num_languages]
            out += [item["format"].replace("{}", str(v)) for v in values]
        else:
            a, b = item["range"]
            scale = item.get("scale")
            for i in range(a, b):
                out.append(item["format"].format(i * scale if scale is not None else i))
    return out


def read_tiktoken_ranks(path: Path) -> str:
    """The text of a tiktoken BPE file (``base64 rank`` per line), checked: ranks are 0..n-1, each once,
    and every single byte is a token (tiktoken's byte-pair merge needs them)."""
    try:
        text = path.read_text("ascii")
    except (OSError, UnicodeDecodeError) as exc:
        raise CheckpointError(f"{path}: cannot read the CTC vocabulary ({exc})") from None
    ranks: set[int] = set()
    singles = 0
    for no, line in enumerate(text.splitlines(), 1):
        if not line:
            continue
        parts = line.split()
        if len(parts) != 2 or not parts[1].isdigit():
            raise CheckpointError(f"{path}:{no}: expected 'base64-token rank'")
        try:
            tok = base64.b64decode(parts[0], validate=True)
        except ValueError:
            raise CheckpointError(f"{path}:{no}: token is not base64") from None
        ranks.add(int(parts[1]))
        singles += len(tok) == 1
    n = len(ranks)
    if n == 0 or max(ranks) != n - 1:
        raise CheckpointError(f"{path}: ranks must be 0..n-1, each once ({n} distinct ranks, largest "
                              f"{max(ranks, default=-1)})")
    if singles < 256:
        raise CheckpointError(f"{path}: only {singles} of the 256 single-byte tokens are in the vocabulary")
    return text



def ctc_tokenizer(conf: dict[str, Any], root: Path, metas: dict[str, Any],
                   params: CtcParams) -> tuple[dict[str, Any] | None, str | None]:
    """The CTC tokenizer's GGUF keys (``fun_asr_nano.ctc.tokenizer.*``) from config.yaml's recipe and the tiktoken
    file the folder ships; else (None, why there are no timestamps)."""
    ds = section(conf, "dataset_conf")
    name = conf.get("ctc_tokenizer", ds.get("ctc_tokenizer"))
    tconf = conf.get("ctc_tokenizer_conf", ds.get("ctc_tokenizer_conf")) or {}
    recipes = load_spec()["ctc"]["tokenizers"]
    if name not in recipes:
        return None, (f"config.yaml: ctc_tokenizer {name!r} is not supported (accepted: {', '.join(recipes)}); "
                      "no timestamps")
    recipe = recipes[name]
    vocab = (local_path(root, lookup(metas, "dataset_conf.ctc_tokenizer_conf.vocab_path"))
             or local_path(root, lookup(metas, "ctc_tokenizer_conf.vocab_path"))
             or local_path(root, tconf.get("vocab_path"))
             or local_path(root, recipe["vocab_file"]))
    if vocab is None:
        found = sorted(root.glob("*.tiktoken"))
        vocab = found[0] if len(found) == 1 else None
    if vocab is None or not vocab.is_file():
        return None, (f"{root}: the CTC head is complete but its vocabulary ({recipe['vocab_file']}, "
                      f"ctc_tokenizer_conf.vocab_path {tconf.get('vocab_path')!r}) is not in the folder; no timestamps")
    if not tconf.get("is_multilingual", True):
        return None, "config.yaml: ctc_tokenizer_conf.is_multilingual false (the GPT-2 vocabulary) is not supported"
    ranks = read_tiktoken_ranks(vocab)
    specials = expand_specials(recipe, int(tconf.get("num_languages", 8749)))
    k = "fun_asr_nano.ctc.tokenizer."
    return {
        k + "type": recipe["format"],
        k + "name": name,
        k + "pattern": recipe["pattern"],
        k + "ranks": ranks,
        k + "specials": json.dumps(specials, ensure_ascii=False),
        k + "source": vocab.name,
    }, None

