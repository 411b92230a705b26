"""The incremental detokenizer: its text equals the tokenizer's own `decode`, whichever call it makes."""

import functools
import random
from pathlib import Path

import pytest
from transformers import AutoTokenizer

from data_recipes.tokenizer import build_tokenizer
from vl.runtime.detokenize import IncrementalDecoder

DEMO = Path(__file__).resolve().parents[2] / "vl" / "demo"
CORPUS = ["Total due: 1 234,50 € — naïve café, 東京 and 🙂 in one line.", "<think>so</think> The answer is 42."] * 8


@functools.cache
def _tokenizers():
    demo = AutoTokenizer.from_pretrained(str(DEMO))
    trained = build_tokenizer(CORPUS, vocab_size=400)  # byte-level: multi-byte characters span several ids
    return {"demo": demo, "byte-level": trained}


def _streamed(decoder: IncrementalDecoder, ids: list[int]) -> tuple[str, list[str]]:
    pieces = [decoder.push(i) for i in ids]
    pieces.append(decoder.flush())
    return "".join(pieces), pieces


@pytest.mark.parametrize("name", ["demo", "byte-level"])
@pytest.mark.parametrize("skip", [False, True])
def test_backend_calls_give_the_text_decode_gives(name, skip):
    tok = _tokenizers()[name]
    assert tok.clean_up_tokenization_spaces is False
    assert IncrementalDecoder(tok, skip)._decode.func == tok._tokenizer.decode  # the backend is called directly

    def wrapped():
        dec = IncrementalDecoder(tok, skip)
        dec._decode = lambda ids: tok.decode(ids, skip_special_tokens=skip)
        return dec

    rng = random.Random(0)
    samples = [tok(CORPUS[0] + CORPUS[1])["input_ids"]] + [
        [rng.randrange(len(tok)) for _ in range(60)] for _ in range(20)]
    for ids in samples:
        text, pieces = _streamed(IncrementalDecoder(tok, skip), ids)
        assert (text, pieces) == _streamed(wrapped(), ids)
        assert text == tok.decode(ids, skip_special_tokens=skip)


def test_a_tokenizer_that_cleans_up_spaces_keeps_decode():
    tok = build_tokenizer(CORPUS, vocab_size=400)
    tok.clean_up_tokenization_spaces = True
    dec = IncrementalDecoder(tok)
    assert dec._decode.func == tok.decode
    ids = tok("a , b .")["input_ids"]
    assert _streamed(dec, ids)[0] == tok.decode(ids)


def test_a_decode_replaced_on_the_instance_is_the_one_called():
    tok = build_tokenizer(CORPUS, vocab_size=400)
    tok.decode = lambda ids, skip_special_tokens=False: "".join(f"[{i}]" for i in ids)
    dec = IncrementalDecoder(tok)
    assert dec.push(5) == "[5]" and dec.push(7) == "[7]"
