"""vLLM's `ignore_eos` and `min_tokens` through `vl serve` on the shipped demo model, driven by the official
`openai` client (vl/options.py declares them; vl/runtime/decode_batch.py applies them per row).

The demo model ends its answers by itself well before the budgets used here, so each option visibly changes
the answer: `ignore_eos` runs to exactly `max_tokens`, `min_tokens` runs past the natural end. Answers equal
`Engine.chat` greedy with the same option, streamed or not, reasoning split included; rows with different
settings batched together equal their single runs.
"""

from __future__ import annotations

import threading

import pytest

from helpers import DEMO, data_uri, free_port, in_process_server, png_bytes, start_serve, stop, wait_health

openai = pytest.importorskip("openai", reason="the openai client is a [dev] extra: pip install openai")
pytestmark = pytest.mark.skipif(not (DEMO / "config.json").is_file(), reason="the demo model is not shipped here")

QUESTION = "What colour is the picture?"


@pytest.fixture(scope="module")
def engine():
    from vl.runtime.engine import Engine

    return Engine.from_pretrained(str(DEMO))


@pytest.fixture(scope="module")
def client(tmp_path_factory):
    port = free_port()
    proc = start_serve(port, log_path=tmp_path_factory.mktemp("serve") / "serve.log")
    base = f"http://127.0.0.1:{port}"
    try:
        wait_health(base, proc)
        yield openai.OpenAI(base_url=base + "/v1", api_key="unused", max_retries=0, timeout=120)
    finally:
        stop(proc)


def question(colour="green"):
    """(our messages, the OpenAI messages) for one image question."""
    text = {"type": "text", "text": QUESTION}
    ours = [{"role": "user", "content": [{"type": "image", "image": png_bytes(colour)}, text]}]
    theirs = [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": data_uri(png_bytes(colour),
                                                                                                "image/png")}},
                                           text]}]
    return ours, theirs


def ask(client, messages, max_tokens, thinking, stream=False, model="demo", **extra):
    return client.chat.completions.create(model=model, messages=messages, max_tokens=max_tokens, temperature=0,
                                          stream=stream, **({"stream_options": {"include_usage": True}} if stream
                                                            else {}),
                                          extra_body={"chat_template_kwargs": {"enable_thinking": thinking}, **extra})


def streamed(chunks):
    deltas = [c.choices[0].delta for c in chunks if c.choices]
    reasoning = "".join(d.model_extra.get("reasoning_content") or "" for d in deltas)
    return reasoning, "".join(d.content or "" for d in deltas), chunks[-1].usage


@pytest.mark.parametrize("thinking", [False, True])
def test_ignore_eos_runs_to_max_tokens_and_equals_engine_chat(engine, client, thinking):
    ours, theirs = question()
    natural = engine.chat(ours, max_new_tokens=48, thinking=thinking)
    assert natural.finish_reason == "stop" and natural.stats.new_tokens < 48  # it would stop by itself
    ref = engine.chat(ours, max_new_tokens=48, thinking=thinking, ignore_eos=True)
    assert ref.stats.new_tokens == 48 and ref.finish_reason == "length"
    assert ref.token_ids[:natural.stats.new_tokens] == natural.token_ids  # the same answer, then on past the end
    r = ask(client, theirs, 48, thinking, ignore_eos=True)
    m = r.choices[0].message
    assert r.usage.completion_tokens == 48 and r.choices[0].finish_reason == "length"
    assert m.content == ref.answer and m.model_extra["reasoning_content"] == (ref.reasoning or None)
    assert "<|im_end|>" not in m.content  # the end token it went past adds no text
    if thinking:  # the split still holds: the same reasoning, and no raw tag in the answer after it
        assert ref.reasoning and ref.reasoning == natural.reasoning and "</think>" not in m.content
    reasoning, content, usage = streamed(list(ask(client, theirs, 48, thinking, stream=True, ignore_eos=True)))
    assert (reasoning, content, usage.completion_tokens) == (ref.reasoning, ref.answer, 48)


def test_min_tokens_masks_the_end_token(engine, client):
    ours, theirs = question()
    natural = engine.chat(ours, max_new_tokens=64, thinking=False)
    n = natural.stats.new_tokens + 6
    assert natural.finish_reason == "stop" and n < 64
    ref = engine.chat(ours, max_new_tokens=64, thinking=False, min_tokens=n)
    assert ref.stats.new_tokens >= n and ref.token_ids[:natural.stats.new_tokens] == natural.token_ids
    r = ask(client, theirs, 64, False, min_tokens=n)
    assert r.usage.completion_tokens == ref.stats.new_tokens >= n
    assert r.choices[0].message.content == ref.answer
    assert r.choices[0].finish_reason == ("stop" if ref.finish_reason == "stop" else "length")
    zero = ask(client, theirs, 64, False, min_tokens=0)  # the default: nothing changes
    assert zero.choices[0].message.content == natural.answer


def _error(call):
    with pytest.raises(openai.APIStatusError) as info:
        call()
    return info.value.status_code, info.value.body.get("code"), info.value.body.get("message", "")


@pytest.mark.parametrize("extra, max_tokens, says", [
    ({"min_tokens": 9}, 8, "min_tokens=9 is above max_new_tokens"),
    ({"min_tokens": -1}, 8, "min_tokens must be an integer >= 0"),
    ({"min_tokens": 2.5}, 8, "min_tokens must be an integer"),
    ({"min_tokens": "3"}, 8, "min_tokens must be an integer"),
    ({"ignore_eos": "yes"}, 8, "ignore_eos must be true or false"),
    ({"ignore_eos": 1}, 8, "ignore_eos must be true or false"),
])
def test_bad_values_are_400(client, extra, max_tokens, says):
    _, theirs = question()
    status, code, message = _error(lambda: ask(client, theirs, max_tokens, False, **extra))
    assert (status, code) == (400, "bad_generation_option") and says in message, message


def test_batched_rows_keep_their_own_settings(engine):
    """Rows with and without `ignore_eos` / `min_tokens`, sent together and decoded as one batch, equal their
    single runs."""
    settings = [{"ignore_eos": True}, {}, {"min_tokens": 30}, {"ignore_eos": True, "thinking": True},
                {"thinking": True}]
    colours = ["red", "green", "blue", "red", "green"]
    refs = []
    for colour, s in zip(colours, settings):
        ours, _ = question(colour)
        refs.append(engine.chat(ours, max_new_tokens=40, **{"thinking": False, **s}))
    assert {r.finish_reason for r in refs} == {"stop", "length"}  # some end by themselves, some run on
    with in_process_server(engine, max_batch=8, batch_window_s=0.3) as (base, sched):
        c = openai.OpenAI(base_url=base + "/v1", api_key="unused", max_retries=0, timeout=60)
        start, got = threading.Barrier(len(settings)), [None] * len(settings)

        def one(i):
            _, theirs = question(colours[i])
            extra = {k: v for k, v in settings[i].items() if k != "thinking"}
            start.wait()
            r = ask(c, theirs, 40, settings[i].get("thinking", False), model="vl", **extra)
            got[i] = (r.choices[0].message.model_extra["reasoning_content"], r.choices[0].message.content,
                      r.usage.completion_tokens)

        threads = [threading.Thread(target=one, args=(i,)) for i in range(len(settings))]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
        assert got == [(r.reasoning or None, r.answer, r.stats.new_tokens) for r in refs]
        assert sched.batches == 1, "the requests sent together should have been one batch"
