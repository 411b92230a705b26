"""vl/runtime/batch.py: requests with their own options decoded together equal the same requests run alone
(token budget, stop strings, reasoning budget, thinking), a cancelled row stops alone, and a request that cannot
be prepared fails alone. The tiny random model never stops by itself, so every row runs to its own limit."""

import threading

import pytest
from PIL import Image

from tiny_models import make_tiny_vl_dir
from vl.errors import ContextLengthError
from vl.runtime.batch import ChatRequest
from vl.runtime.engine import ChatResult, Engine
from vl.runtime.sampling import SamplingParams


@pytest.fixture(scope="module")
def engine(tmp_path_factory):
    return Engine.from_pretrained(make_tiny_vl_dir(tmp_path_factory.mktemp("tiny_vl")))


def msgs(color="red"):
    return [{"role": "user", "content": [{"type": "image", "image": Image.new("RGB", (150, 90), color)},
                                         {"type": "text", "text": "What is this?"}]}]


def single(engine, r: ChatRequest) -> ChatResult:
    return engine.chat(r.messages, max_new_tokens=r.max_new_tokens, thinking=r.thinking,
                       reasoning_budget=r.reasoning_budget, stop=r.stop)


def test_rows_with_their_own_options_equal_single_runs(engine):
    full = engine.chat(msgs("blue"), max_new_tokens=20)
    requests = [ChatRequest(msgs("red"), max_new_tokens=5),
                ChatRequest(msgs("blue"), max_new_tokens=20, stop=[full.text[6:9]]),
                ChatRequest([{"role": "user", "content": "left right"}], max_new_tokens=12, thinking=False),
                ChatRequest(msgs("green"), max_new_tokens=16, thinking=True, reasoning_budget=4)]
    events, results, order = {}, {}, []
    for i, item in engine.stream_batch(requests, SamplingParams()):
        if isinstance(item, ChatResult):
            results[i] = item
            order.append(i)
        else:
            events.setdefault(i, []).append(item)
    for i, r in enumerate(requests):
        want = single(engine, r)
        got = results[i]
        assert (got.token_ids, got.text, got.finish_reason) == (want.token_ids, want.text, want.finish_reason)
        streamed = "".join(e.text for e in events.get(i, []) if e.kind == "answer")
        assert streamed == got.answer
    assert results[1].finish_reason == "stop_string" and len(results[0].token_ids) == 5
    assert order[0] == 0  # the shortest row is handed out first, not when the batch ends


def test_a_cancelled_row_stops_alone_and_a_bad_one_fails_alone(engine):
    flag = threading.Event()
    requests = [ChatRequest(msgs("red"), max_new_tokens=30, cancel=flag),
                ChatRequest(msgs("blue"), max_new_tokens=10),
                ChatRequest([{"role": "user", "content": "x " * (engine.context_length + 5)}], max_new_tokens=4)]
    out = {}
    for i, item in engine.stream_batch(requests, SamplingParams()):
        if i == 0 and not flag.is_set():
            flag.set()
        if not hasattr(item, "kind"):
            out[i] = item
    assert out[0].finish_reason == "cancelled" and len(out[0].token_ids) < 30
    assert out[1].token_ids == engine.chat(msgs("blue"), max_new_tokens=10).token_ids
    assert isinstance(out[2], ContextLengthError)
