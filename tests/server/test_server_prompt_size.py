"""A prompt too long for the context is refused before it is tokenized (vl/processing/processor.py,
`check_prompt_size`): a token of the tokenizer covers at most its longest vocabulary entry's characters, so text
longer than context x that many characters cannot fit. Counted, not timed: a tokenizer wrapper counts every
character it is handed. Through the `vl serve` app in this process (a multi-MB text body is a typed 400
`context_length`, nothing of it tokenized, memory flat, a short request answered alongside), and through the
text-only processor, which every front end shares with the server.
"""

from __future__ import annotations

import random
import threading

import httpx
import psutil
import pytest

from helpers import DEMO, in_process_server

pytestmark = pytest.mark.skipif(not (DEMO / "config.json").is_file(), reason="the demo model is not shipped here")


class CountingTokenizer:
    """The tokenizer, counting the characters of every text it is asked to tokenize."""

    def __init__(self, tokenizer):
        self.__dict__.update(_tok=tokenizer, chars=0, calls=0)

    def __call__(self, text, *args, **kwargs):
        self.__dict__["calls"] += 1
        self.__dict__["chars"] += sum(map(len, text)) if isinstance(text, list) else len(text)
        return self._tok(text, *args, **kwargs)

    def __getattr__(self, name):
        return getattr(self._tok, name)


@pytest.fixture(scope="module")
def engine():
    from vl.runtime.engine import Engine

    return Engine.from_pretrained(str(DEMO))


def test_the_bound_is_the_longest_token_and_holds_on_random_text(engine):
    from vl.processing.processor import max_chars_per_token

    tok = engine.tokenizer
    k = max_chars_per_token(tok)
    longest = max(len(t) for t in tok.get_vocab())
    assert k == longest, (k, longest)
    rng = random.Random(0)
    pieces = list(tok.get_vocab()) + ["<SPECIAL_11>", " ", "\n", "é", "日本", "🙂", "aaaa", "    "]
    for _ in range(200):
        text = "".join(rng.choice(pieces) for _ in range(rng.randint(1, 60)))
        n = len(tok(text, add_special_tokens=False)["input_ids"])
        assert n * k >= len(text), (text, n, k)  # no token covered more than k characters


def test_a_long_prompt_is_refused_before_tokenizing_in_every_processor(engine):
    from vl.errors import ContextLengthError
    from vl.processing.processor import Processor
    from vl.processing.text_processor import TextProcessor

    ctx = engine.context_length
    counting = CountingTokenizer(engine.tokenizer)
    proc = Processor(counting, engine.processor.config)
    text_only = TextProcessor(counting)
    bound = ctx * proc.chars_per_token
    for p in (proc, text_only):
        with pytest.raises(ContextLengthError, match="at least .* tokens"):
            p([{"role": "user", "content": "x" * (bound + 1)}], context_length=ctx)
        with pytest.raises(ContextLengthError):
            p([{"role": "user", "content": "word " * 400_000}], context_length=ctx)  # 2 MB
    assert counting.calls == 0 and counting.chars == 0
    # under the bound the prompt is tokenized, at most bound characters (plus the template's own)
    out = proc([{"role": "user", "content": "y " * (bound // 2 - 100)}], context_length=ctx)
    assert out.input_ids.shape[1] > 0 and counting.chars <= bound


def test_a_multi_megabyte_prompt_is_a_400_with_nothing_tokenized_and_flat_memory(engine):
    from vl.processing.processor import Processor
    from vl.runtime.engine import Engine

    counting = CountingTokenizer(engine.tokenizer)
    counted = Engine(engine.model, Processor(counting, engine.processor.config))
    text = "the quick brown fox jumps over the lazy dog. " * 180_000  # 8 MB
    me = psutil.Process()
    with in_process_server(counted, max_body_bytes=64 << 20) as (base, sched):
        short = {"model": "vl", "max_tokens": 4, "temperature": 0, "messages": [{"role": "user", "content": "hi"}]}
        assert httpx.post(base + "/v1/chat/completions", json=short, timeout=60).status_code == 200
        before_chars, base_rss = counting.chars, me.memory_info().rss
        peak, done, answers = [base_rss], threading.Event(), {}

        def watch():
            while not done.is_set():
                peak[0] = max(peak[0], me.memory_info().rss)
                done.wait(0.01)

        def long():
            answers["long"] = httpx.post(base + "/v1/chat/completions", timeout=120, json={
                "model": "vl", "max_tokens": 4, "messages": [{"role": "user", "content": text}]})

        threads = [threading.Thread(target=watch), threading.Thread(target=long)]
        for t in threads:
            t.start()
        answers["short"] = httpx.post(base + "/v1/chat/completions", json=short, timeout=120)  # alongside
        threads[1].join(120)
        done.set()
        threads[0].join()
        r = answers["long"]
        assert r.status_code == 400 and r.json()["error"]["code"] == "context_length", r.text[:300]
        assert "characters" in r.json()["error"]["message"]
        assert answers["short"].status_code == 200
        assert counting.chars - before_chars < 1000  # only the short request's prompt was tokenized
        assert peak[0] - base_rss < 400 << 20, (peak[0] - base_rss) >> 20  # tokenizing it all took GBs
        assert sched.snapshot()["waiting"] == 0
