"""The checkpoint's own tokenizer.json (embedded in the GGUF), through the `tokenizers` library."""

from __future__ import annotations

import re
import unicodedata

from tokenizers import Tokenizer

from fun_asr.asr.prompt import Run


def _byte_level_alphabet() -> dict[str, int]:
    """The byte-level BPE's alphabet (GPT-2's, which Qwen's tokenizer uses): each byte is written as one
    printable character, itself where it is printable Latin-1 (33-126, 161-172, 174-255), else code point 256 +
    its rank among the others. Character -> byte."""
    printable = [*range(33, 127), *range(161, 173), *range(174, 256)]
    others = [b for b in range(256) if b not in set(printable)]
    table = {chr(b): b for b in printable}
    table.update({chr(256 + k): b for k, b in enumerate(others)})
    return table


class TextTokenizer:
    def __init__(self, tokenizer_json: str) -> None:
        self._tok = Tokenizer.from_str(tokenizer_json)
        added = {tok.content: tid for tid, tok in self._tok.get_added_tokens_decoder().items() if tok.content}
        self._added = added
        self._added_re = re.compile("|".join(re.escape(t) for t in sorted(added, key=len, reverse=True))) \
            if added else None
        self._special = {tid for tid, tok in self._tok.get_added_tokens_decoder().items() if tok.special}
        decoder = self._tok.decoder
        self._byte_level = decoder is not None and type(decoder).__name__ == "ByteLevel"
        self._alphabet = _byte_level_alphabet() if self._byte_level else {}
        self._bytes: dict[int, bytes] = {}

    def token_bytes(self, token_id: int) -> bytes:
        """The UTF-8 bytes a token stands for in decoded text (a piece of a character where the byte-level BPE
        splits one; b"" for a special token, which decoding skips)."""
        got = self._bytes.get(token_id)
        if got is None:
            if token_id in self._special:
                got = b""
            elif token_id in self._added.values() or not self._byte_level:
                got = self._tok.decode([token_id], skip_special_tokens=True).encode("utf-8")
            else:
                piece = self._tok.id_to_token(token_id) or ""
                got = bytes(self._alphabet[c] for c in piece if c in self._alphabet)
            if len(self._bytes) < 1 << 20:
                self._bytes[token_id] = got
        return got

    def encode(self, text: str) -> list[int]:
        """Token ids of trusted text: added tokens written in it (<|im_start|>, ...) map to their ids."""
        return self._tok.encode(text, add_special_tokens=False).ids

    def encode_plain(self, text: str) -> list[int]:
        """Token ids of user text: always ordinary text, never an added or special token (``<|im_end|>`` in
        it is the characters ``<``, ``|``, ``im``, ...). Equal to :meth:`encode` for text without them: the
        same normalizer, pre-tokenizer and BPE model, only the added-token matching is skipped."""
        if not text:
            return []
        norm = self._tok.normalizer.normalize_str(text) if self._tok.normalizer is not None else text
        pieces = self._tok.pre_tokenizer.pre_tokenize_str(norm) if self._tok.pre_tokenizer is not None \
            else [(norm, (0, len(norm)))]
        return [t.id for piece, _ in pieces for t in self._tok.model.tokenize(piece)]

    def encode_runs(self, runs: list[Run]) -> list[int]:
        """Token ids of a prompt given as (text, trusted) runs: added tokens are recognised in trusted runs
        only; the text between them (trusted and user text together) is encoded as one plain string, so
        that tokens merge across a run boundary exactly as when the whole prompt is one string."""
        ids: list[int] = []
        pending: list[str] = []
        for text, trusted in runs:
            if not trusted or self._added_re is None:
                pending.append(text)
                continue
            pos = 0
            for m in self._added_re.finditer(text):
                pending.append(text[pos : m.start()])
                ids += self.encode_plain("".join(pending))
                pending = []
                ids.append(self._added[m.group()])
                pos = m.end()
            pending.append(text[pos:])
        return ids + self.encode_plain("".join(pending))

    def punctuation_ids(self, vocab_size: int) -> list[int]:
        """Ids of the tokens that are nothing but punctuation (and white space): ``，`` ``。`` ``,`` ``?`` ...,
        what a CTC transcript (normalized targets) leaves out. One pass over the vocabulary (~0.2 s for Qwen's)."""
        texts = self._tok.decode_batch([[i] for i in range(vocab_size)], skip_special_tokens=False)
        return [i for i, t in enumerate(texts) if t.strip() and "\ufffd" not in t
                and all(c.isspace() or unicodedata.category(c).startswith("P") for c in t)]

    def decode(self, ids: list[int]) -> str:
        return self._tok.decode(ids, skip_special_tokens=True)
