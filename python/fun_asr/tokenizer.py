"""The checkpoint's own tokenizer.json (embedded in the GGUF), through the `tokenizers` library."""

from __future__ import annotations

from tokenizers import Tokenizer


class TextTokenizer:
    def __init__(self, tokenizer_json: str) -> None:
        self._tok = Tokenizer.from_str(tokenizer_json)

    def encode(self, text: str) -> list[int]:
        """Token ids of `text`; special tokens written in it (<|im_start|>, ...) map to their ids."""
        return self._tok.encode(text, add_special_tokens=False).ids

    def decode(self, ids: list[int]) -> str:
        return self._tok.decode(ids, skip_special_tokens=True)
