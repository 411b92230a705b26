"""Incremental detokenization for streaming (the prefix/read-offset scheme of TGI and vLLM).

Decoding token by token breaks multi-byte characters and byte-level merges; decoding the whole sequence
every step is quadratic. Keep a short window: emit the text that decoding [prefix:] adds beyond decoding
[prefix:read], unless it ends in an incomplete character.

That is two decodes per generated token per row: through transformers' `decode` they cost ~5 us each (argument
conversion and options around the Rust call), through the `tokenizers` backend ~2 us. The backend is called
directly where it returns what `decode` returns: a transformers fast tokenizer whose `decode` and `_decode` are
the stock ones and whose clean-up of tokenization spaces is off (as for the Nemotron tokenizers); anything else
keeps `decode` (tests/runtime/test_detokenize.py compares the two).
"""

from __future__ import annotations

import functools


class IncrementalDecoder:
    def __init__(self, tokenizer, skip_special_tokens: bool = False):
        self._decode = _decoder(tokenizer, skip_special_tokens)
        self.ids: list[int] = []
        self.prefix = self.read = 0

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


def _decoder(tokenizer, skip: bool):
    """`ids -> text` as `tokenizer.decode(ids, skip_special_tokens=skip)` returns it."""
    backend = getattr(tokenizer, "_tokenizer", None)
    own = vars(tokenizer) if hasattr(tokenizer, "__dict__") else {}
    if backend is not None and _stock_decode(type(tokenizer)) and not ({"decode", "_decode"} & own.keys()) \
            and not getattr(tokenizer, "clean_up_tokenization_spaces", True):
        return functools.partial(backend.decode, skip_special_tokens=skip)
    return functools.partial(tokenizer.decode, skip_special_tokens=skip)


@functools.cache
def _stock_decode(cls) -> bool:
    try:
        from transformers.tokenization_utils_tokenizers import TokenizersBackend
    except ImportError:  # another transformers layout: keep its decode
        return False
    return (getattr(cls, "_decode", None) is TokenizersBackend._decode
            and getattr(cls, "decode", None) is TokenizersBackend.decode)
