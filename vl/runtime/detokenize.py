"""Incremental detokenization for streaming (the prefix/read-offset scheme of TGI and vLLM).

Decoding token by token breaks multi-byte characters and byte-level merges; decoding the whole sequence
every step is quadratic. Keep a short window: emit the text that decoding [prefix:] adds beyond decoding
[prefix:read], unless it ends in an incomplete character.
"""

from __future__ import annotations


class IncrementalDecoder:
    def __init__(self, tokenizer, skip_special_tokens: bool = False):
        self.tokenizer, self.skip = tokenizer, skip_special_tokens
        self.ids: list[int] = []
        self.prefix = self.read = 0

    def _decode(self, ids):
        return self.tokenizer.decode(ids, skip_special_tokens=self.skip)

    def push(self, token_id: int) -> str:
        self.ids.append(int(token_id))
        before = self._decode(self.ids[self.prefix:self.read])
        after = self._decode(self.ids[self.prefix:])
        if len(after) > len(before) and not after.endswith("\ufffd"):
            new = after[len(before):]
            self.prefix, self.read = self.read, len(self.ids)
            return new
        return ""

    def flush(self) -> str:
        """Whatever is still held back (an incomplete character at the very end)."""
        before = self._decode(self.ids[self.prefix:self.read])
        after = self._decode(self.ids[self.prefix:])
        self.prefix = self.read = len(self.ids)
        return after[len(before):]
