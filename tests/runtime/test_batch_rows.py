"""vl/runtime/batch.py: requests with their own options decoded together equal the same requests run alone
(token budget, stop strings, reasoning budget, thinking), whether they start together or join the running batch
at a later step; a cancelled or timed-out row stops alone, and a request that cannot be prepared fails alone. The tiny random model never stops by itself, so every row runs to its own limit."""

import threading

import pytest
from PIL import Image

from tiny_models import make_tiny_vl_dir
import vl.runtime.batch as batch_module
from vl.errors import ContextLengthError
from vl.runtime.batch import ChatRequest
from vl.runtime.decode_batch import DecodeBatch
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
    full = engine.chat(msgs("blue"), max_new_tokens=20, thinking=True)
    requests = [ChatRequest(msgs("red"), max_new_tokens=5, thinking=True),
                ChatRequest(msgs("blue"), max_new_tokens=20, thinking=True, stop=[full.text[6:9]]),
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


def test_min_tokens_defers_stop_strings(engine):
    """vLLM's stop checker looks for stop strings only from the `min_tokens`-th token on; so does a row here."""
    full = engine.chat(msgs("blue"), max_new_tokens=20)
    stop = full.text[6:9]
    early = engine.chat(msgs("blue"), max_new_tokens=20, stop=[stop])
    assert early.finish_reason == "stop_string" and len(early.token_ids) < 15
    late = engine.chat(msgs("blue"), max_new_tokens=20, stop=[stop], min_tokens=15)
    assert len(late.token_ids) >= 15 and late.token_ids[:15] == full.token_ids[:15]
    assert late.text.startswith(full.text[:9])  # the stop string inside the first 15 tokens stayed in the answer


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


class _Recording(DecodeBatch):
    """A DecodeBatch that remembers how many rows each step decoded."""

    made: list = []

    def __init__(self, *a, **kw):
        super().__init__(*a, **kw)
        self.rows = []
        _Recording.made.append(self)

    def step(self):
        out = super().step()
        if out is not None:
            self.rows.append((len(self.seqs), len(out)))
        return out


def test_requests_joining_a_running_batch_equal_single_runs(engine, monkeypatch):
    """Continuous batching: rows join at different steps (an image, a text prompt longer than the running
    length, a short one), with their own stop strings, reasoning budgets and thinking, and leave at their own
    ends; each equals its single run and the batch never decodes a row that has ended."""
    full = engine.chat(msgs("blue"), max_new_tokens=20)
    monkeypatch.setattr(batch_module, "DecodeBatch", _Recording)
    _Recording.made = []
    first = [ChatRequest(msgs("red"), max_new_tokens=6), ChatRequest(msgs("yellow"), max_new_tokens=30)]
    later = {1: [ChatRequest([{"role": "user", "content": "left right up down red green " * 10}],
                             max_new_tokens=8, thinking=False)],
             3: [ChatRequest(msgs("blue"), max_new_tokens=20, stop=[full.text[6:9]]),
                 ChatRequest(msgs("green"), max_new_tokens=16, thinking=True, reasoning_budget=4)],
             9: [ChatRequest([{"role": "user", "content": "hi"}], max_new_tokens=5)]}
    calls = []

    def more(running):
        calls.append(running)
        return later.get(len(calls), [])

    requests = first + [r for k in sorted(later) for r in later[k]]
    results, events = {}, {}
    for i, item in engine.stream_batch(first, SamplingParams(), more=more):
        if isinstance(item, ChatResult):
            results[i] = item
        else:
            events.setdefault(i, []).append(item)
    made = list(_Recording.made)
    assert sorted(results) == list(range(len(requests)))
    for i, r in enumerate(requests):
        want, got = single(engine, r), results[i]
        assert (got.token_ids, got.text, got.finish_reason) == (want.token_ids, want.text, want.finish_reason), i
        assert "".join(e.text for e in events.get(i, []) if e.kind == "answer") == got.answer
    prompt = [results[i].stats.prompt_tokens for i in range(len(requests))]
    assert prompt[2] > max(prompt[:2]) + 1 and prompt[5] < max(prompt[:2])  # longer / shorter than the running length
    assert results[3].finish_reason == "stop_string"
    assert len(made) == 1, "every request should have joined the one running batch"
    rows = made[0].rows
    assert all(n == live for n, live in rows) and max(n for n, _ in rows) >= 4


def test_joined_rows_cancel_and_time_out_alone(engine):
    flag = threading.Event()
    joiners = [ChatRequest(msgs("blue"), max_new_tokens=20, cancel=flag),
               ChatRequest(msgs("green"), max_new_tokens=20, timeout_s=1e-6),
               ChatRequest(msgs("white"), max_new_tokens=7)]
    given = []

    def more(running):
        given.append(running)
        return joiners if len(given) == 2 else []

    out, seen = {}, {}
    for i, item in engine.stream_batch([ChatRequest(msgs("red"), max_new_tokens=16)], SamplingParams(), more=more):
        seen[i] = seen.get(i, 0) + 1
        if i == 1 and seen[i] == 3:
            flag.set()
        if isinstance(item, ChatResult):
            out[i] = item
    assert out[1].finish_reason == "cancelled" and 0 < len(out[1].token_ids) < 20
    assert out[2].finish_reason == "timeout" and len(out[2].token_ids) == 1
    for i, (m, n) in {0: ("red", 16), 1: ("blue", 20), 2: ("green", 20), 3: ("white", 7)}.items():
        want = engine.chat(msgs(m), max_new_tokens=n).token_ids
        assert out[i].token_ids == want[:len(out[i].token_ids)], i
    assert out[0].token_ids == engine.chat(msgs("red"), max_new_tokens=16).token_ids
    assert out[3].token_ids == engine.chat(msgs("white"), max_new_tokens=7).token_ids
