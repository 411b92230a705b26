"""What a request body may say, and that one request's values never fail the others (vl/server/request.py,
vl/runtime/sampling.py, vl/server/scheduler.py), driven by the official `openai` client against the `vl serve`
app in this process over the demo model.

- `min_p` and `logit_bias` are implemented (vLLM's order: bias, penalty, temperature, min-p, top-k, top-p) and
  checked against reference computations written here from their definitions;
- fields that would change the answer and are not implemented are refused by name (`unsupported_field`),
  unknown fields are refused as OpenAI refuses them (`unknown_field`), bookkeeping fields are accepted;
- `reasoning_effort` maps to the reasoning toggle;
- every sampling field is validated at the edge: 25 concurrent requests, one with a seed torch cannot take,
  that one gets 400 and the 24 others 200; a fault of a whole batch (its prefill) is retried row by row, so only
  the row that fails alone fails, and a row whose own code fails inside a batch ends alone.
"""

from __future__ import annotations

import math
import threading

import pytest
import torch

from helpers import DEMO, in_process_server

openai = pytest.importorskip("openai", reason="the openai client is a [dev] extra: pip install openai")
HELLO = [{"role": "user", "content": "hello"}]
OFF = {"chat_template_kwargs": {"enable_thinking": False}}
needs_demo = pytest.mark.skipif(not (DEMO / "config.json").is_file(), reason="the demo model is not shipped here")


# --- sampling against reference computations (no model) ------------------------------------------------------
def reference_min_p(logits: list[float], p: float) -> list[bool]:
    """Which tokens min-p keeps, from its definition: probability >= p x the largest probability."""
    z = sum(math.exp(x) for x in logits)
    probs = [math.exp(x) / z for x in logits]
    return [q >= p * max(probs) for q in probs]


def test_min_p_and_logit_bias_equal_their_definitions():
    from vl.runtime.sampling import SamplingParams, apply_logit_bias, min_p_filter, sample

    g = torch.Generator().manual_seed(1)
    logits = torch.randn(3, 50, generator=g) * 3
    for p in (0.0, 0.05, 0.3, 0.9, 1.0):
        kept = torch.isfinite(min_p_filter(logits, p))
        assert kept.tolist() == [reference_min_p(row.tolist(), p) for row in logits], p
    bias = {3: 100.0, 7: -2.5, 49: 0.25}
    biased = apply_logit_bias(logits, tuple(sorted(bias.items())))
    expected = logits.clone()
    for tid, b in bias.items():
        expected[:, tid] += b
    assert torch.equal(biased, expected)
    # a sampled draw: bias, temperature, min-p, then the multinomial over what is left (same generator state)
    params = SamplingParams(temperature=0.7, min_p=0.2, logit_bias=bias, seed=5)
    ref_logits = expected / 0.7
    keep = torch.tensor([reference_min_p(row.tolist(), 0.2) for row in ref_logits])
    ref_probs = ref_logits.masked_fill(~keep, -torch.inf).softmax(-1)
    for seed in range(20):
        got = sample(logits, params, generator=torch.Generator().manual_seed(seed))
        ref = torch.multinomial(ref_probs, 1, generator=torch.Generator().manual_seed(seed)).squeeze(-1)
        assert torch.equal(got, ref) and all(keep[i, t] for i, t in enumerate(got.tolist()))
    # greedy: the bias moves the argmax, min-p does not touch it
    assert sample(logits, SamplingParams(logit_bias={11: 100.0})).tolist() == [11, 11, 11]
    assert torch.equal(sample(logits, SamplingParams(min_p=0.9)), logits.argmax(-1))


@pytest.mark.parametrize("bad", [dict(seed=2**64), dict(seed=-(2**63) - 1), dict(seed=1.5), dict(min_p=1.5),
                                 dict(min_p=-0.1), dict(logit_bias={3: 101}), dict(logit_bias={-1: 1.0}),
                                 dict(logit_bias={3: float("nan")}), dict(temperature=-1)])
def test_sampling_params_refuse_what_would_fail_later(bad):
    from vl.errors import GenerationOptionError
    from vl.runtime.sampling import SEED_RANGE, SamplingParams

    with pytest.raises(GenerationOptionError):
        SamplingParams(**bad)
    for seed in SEED_RANGE:  # the ends of the range are what torch's generator takes
        torch.Generator().manual_seed(SamplingParams(seed=seed).seed)


# --- through the server ------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def engine():
    from vl.runtime.engine import Engine

    return Engine.from_pretrained(str(DEMO))


@pytest.fixture(scope="module")
def served(engine):
    with in_process_server(engine, max_batch=8, batch_window_s=0.3) as (base, sched):
        yield openai.OpenAI(base_url=base + "/v1", api_key="x", max_retries=0, timeout=120), sched


def ask(client, messages=HELLO, max_tokens=8, **kw):
    extra = {**OFF, **kw.pop("extra_body", {})}
    return client.chat.completions.create(model="vl", messages=messages, max_tokens=max_tokens,
                                          extra_body=extra, **kw)


def refused(call) -> tuple[int, str, str]:
    with pytest.raises(openai.APIStatusError) as info:
        call()
    return info.value.status_code, info.value.body["code"], info.value.body["message"]


@needs_demo
def test_logit_bias_and_min_p_change_the_answer_as_defined(engine, served):
    client, _ = served
    tok = engine.tokenizer
    target = min(i for t, i in tok.get_vocab().items() if t.isalpha() and len(t) >= 3)  # a plain word piece
    r = ask(client, max_tokens=6, temperature=0, extra_body={"logit_bias": {str(target): 100}, "ignore_eos": True})
    assert r.choices[0].message.content.strip() == tok.decode([target] * 6).strip()
    greedy = ask(client, max_tokens=12, temperature=0).choices[0].message.content
    # min_p = 1 keeps only the most likely token: a sampled answer at any temperature is the greedy one
    for seed in (1, 2, 3):
        got = ask(client, max_tokens=12, temperature=1.8, seed=seed, extra_body={"min_p": 1.0})
        assert got.choices[0].message.content == greedy, seed
    # and a bias against the greedy answer's first token changes it
    first = engine.chat(HELLO, max_new_tokens=1, thinking=False).token_ids[0]
    other = ask(client, max_tokens=12, temperature=0, extra_body={"logit_bias": {str(first): -100}})
    assert other.choices[0].message.content != greedy
    vocab = engine.lm.config.vocab_size
    for bias, says in (({str(vocab): 1}, "0..%d" % (vocab - 1)), ({"3": 101}, "[-100, 100]"),
                       ({"the": 1}, "token ids"), ([1, 2], "object")):
        status, code, message = refused(lambda: ask(client, extra_body={"logit_bias": bias}))
        assert (status, code) == (400, "bad_generation_option") and says in message, (bias, message)


@needs_demo
def test_fields_are_implemented_refused_by_name_or_accepted(served):
    client, _ = served
    for extra in ({"guided_json": {"type": "object"}}, {"best_of": 3}, {"n": 2}, {"use_beam_search": True},
                  {"response_format": {"type": "json_object"}}, {"logprobs": True}, {"top_logprobs": 2},
                  {"tools": [{"type": "function", "function": {"name": "f"}}]}, {"stop_token_ids": [5]},
                  {"skip_special_tokens": False}, {"frequency_penalty": 0.5}, {"modalities": ["text", "audio"]},
                  {"verbosity": "low"}):
        status, code, message = refused(lambda: ask(client, extra_body=extra))
        name = next(iter(extra))
        assert (status, code) == (400, "unsupported_field") and name in message, (extra, code, message)
    status, code, message = refused(lambda: ask(client, extra_body={"frobnicate": 1, "temprature": 0.5}))
    assert (status, code) == (400, "unknown_field") and "frobnicate" in message and "temprature" in message
    # neutral values of the unsupported fields and bookkeeping fields change nothing: accepted
    reference = ask(client, temperature=0).choices[0].message.content
    same = ask(client, temperature=0, user="u-1", metadata={"k": "v"}, store=False, service_tier="auto",
               extra_body={"best_of": 1, "n": 1, "logprobs": False, "skip_special_tokens": True, "tools": [],
                           "prediction": {"type": "content", "content": "x"}, "request_id": "r-1", "priority": 0,
                           "response_format": {"type": "text"}, "frequency_penalty": 0, "modalities": ["text"]})
    assert same.choices[0].message.content == reference


@needs_demo
def test_reasoning_effort_maps_to_the_reasoning_toggle(served):
    client, _ = served
    on = client.chat.completions.create(model="vl", messages=HELLO, max_tokens=24, temperature=0,
                                        extra_body={"chat_template_kwargs": {"enable_thinking": True}})
    off = client.chat.completions.create(model="vl", messages=HELLO, max_tokens=24, temperature=0,
                                         extra_body={"chat_template_kwargs": {"enable_thinking": False}})
    assert on.choices[0].message.model_extra.get("reasoning_content")  # the demo model reasons when on
    for effort, expected in (("none", off), ("minimal", off), ("low", on), ("medium", on), ("high", on)):
        got = client.chat.completions.create(model="vl", messages=HELLO, max_tokens=24, temperature=0,
                                             reasoning_effort=effort)
        assert got.choices[0].message.content == expected.choices[0].message.content, effort
        assert (got.choices[0].message.model_extra.get("reasoning_content")
                == expected.choices[0].message.model_extra.get("reasoning_content")), effort
    status, code, _ = refused(lambda: client.chat.completions.create(model="vl", messages=HELLO,
                                                                     reasoning_effort="extreme"))
    assert (status, code) == (400, "bad_generation_option")
    status, code, message = refused(lambda: client.chat.completions.create(
        model="vl", messages=HELLO, reasoning_effort="high",
        extra_body={"chat_template_kwargs": {"enable_thinking": False}}))
    assert (status, code) == (400, "bad_generation_option") and "reasoning_effort" in message


def _concurrently(n: int, one) -> list:
    start, out = threading.Barrier(n), [None] * n

    def run(i):
        start.wait()
        try:
            out[i] = one(i)
        except openai.APIStatusError as e:
            out[i] = (e.status_code, e.body.get("code"))

    threads = [threading.Thread(target=run, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(300)
    assert not any(t.is_alive() for t in threads), "a client hung"
    return out


@needs_demo
@pytest.mark.parametrize("temperature", [0.0, 0.8])
def test_one_bad_seed_among_25_concurrent_requests_fails_alone(served, temperature):
    client, _ = served

    def one(i):
        seed = 2**64 if i == 7 else i  # 2**64: one past what torch's generator takes
        r = ask(client, max_tokens=6, temperature=temperature, seed=seed)
        return 200, r.choices[0].finish_reason

    out = _concurrently(25, one)
    assert out[7] == (400, "bad_generation_option"), out[7]
    assert [o[0] for k, o in enumerate(out) if k != 7] == [200] * 24, out
    again = _concurrently(25, one)  # and the server is as it was: the same again
    assert again[7] == (400, "bad_generation_option") and [o[0] for o in again].count(200) == 24


@needs_demo
def test_a_batch_fault_fails_only_the_row_that_causes_it(engine, served):
    """A prefill that fails whenever one poisoned prompt is in it (a stand-in for a device fault one input
    triggers): the batch's other rows are run again alone and answered; the poisoned row alone fails."""
    from vl.options import RequestOptions

    client, sched = served
    poison = [{"role": "user", "content": "poison " * 9}]
    length = engine.process(poison, RequestOptions(thinking=False))[0].input_ids.shape[1]
    prompts = [[{"role": "user", "content": w}] for w in ("red", "green", "a blue sky", "hello there")]
    refs = [engine.chat(m, max_new_tokens=6, thinking=False).answer for m in prompts]
    assert all(engine.process(m, RequestOptions(thinking=False))[0].input_ids.shape[1] != length for m in prompts)

    def fault(module, args, kwargs):
        embeds, mask = kwargs.get("inputs_embeds"), kwargs.get("attention_mask")
        if embeds is None:
            return
        lengths = mask.sum(1).tolist() if mask is not None else [embeds.shape[1]] * embeds.shape[0]
        if length in lengths:
            raise RuntimeError("device fault")

    hook = engine.lm.register_forward_pre_hook(fault, with_kwargs=True)
    try:
        def one(i):
            r = ask(client, messages=poison if i == 4 else prompts[i % 4], max_tokens=6, temperature=0)
            return r.choices[0].message.content

        out = _concurrently(8, one)
    finally:
        hook.remove()
    assert out[4] == (500, "error"), out
    assert [out[i] for i in range(8) if i != 4] == [refs[i % 4] for i in range(8) if i != 4], out
    assert _concurrently(8, lambda i: ask(client, messages=prompts[i % 4], max_tokens=6,
                                          temperature=0).choices[0].message.content) == [refs[i % 4] for i in
                                                                                       range(8)]


@needs_demo
def test_a_row_whose_own_code_fails_ends_alone(engine):
    from vl.errors import VLError
    from vl.runtime.batch import ChatRequest
    from vl.runtime.results import ChatResult
    from vl.runtime.sampling import SamplingParams

    prompts = [[{"role": "user", "content": w}] for w in ("red", "green", "blue")]
    refs = [engine.chat(m, max_new_tokens=8, thinking=False) for m in prompts]

    def broken(tok):
        raise ValueError("the caller's token callback failed")

    requests = [ChatRequest(m, max_new_tokens=8, thinking=False, on_token=broken if i == 1 else None)
                for i, m in enumerate(prompts)]
    ends = {}
    for i, item in engine.stream_batch(requests, SamplingParams(), raise_errors=False):
        if isinstance(item, (ChatResult, VLError)):
            ends[i] = item
    assert isinstance(ends[1], VLError) and not isinstance(ends[1], ChatResult)
    assert [ends[0].token_ids, ends[2].token_ids] == [refs[0].token_ids, refs[2].token_ids]
    with pytest.raises(ValueError):  # a caller that wants errors raised still gets its own
        for _ in engine.stream_batch([ChatRequest(prompts[0], max_new_tokens=4, on_token=broken)], SamplingParams(),
                                     raise_errors=True):
            pass
