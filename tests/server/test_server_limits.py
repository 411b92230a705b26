"""The server's protective behaviour, on the `vl serve` app in this process over the demo model: API key (401),
body cap (413), full queue (429), shutting down (503), time limit (504), a client that disconnects mid-stream
(its slot is freed), 8 concurrent clients against a queue of 4, and batching (answers equal single runs; a
bad request in a batch fails alone).

"endless" is the demo model with its stop tokens switched off, so a generation runs exactly as long as
max_tokens says: the tests that need a long request get one without depending on what the model says.
"""

from __future__ import annotations

import json
import threading
import time
from contextlib import contextmanager

import httpx
import pytest

from helpers import DEMO, data_uri, in_process_server, never_stopping, paced, png_bytes

openai = pytest.importorskip("openai", reason="the openai client is a [dev] extra: pip install openai")
pytestmark = pytest.mark.skipif(not (DEMO / "config.json").is_file(), reason="the demo model is not shipped here")

HELLO = [{"role": "user", "content": "hello"}]


@pytest.fixture(scope="module")
def engine():
    from vl.runtime.engine import Engine

    return Engine.from_pretrained(str(DEMO))


@pytest.fixture(scope="module")
def endless(engine):
    return never_stopping(engine)


def client_for(base, key="unused"):
    return openai.OpenAI(base_url=base + "/v1", api_key=key, max_retries=0, timeout=60)


def wait_idle(sched, timeout_s: float = 120) -> bool:
    """Whether the scheduler's running count reached 0 (polled; the timeout only guards against a hang)."""
    end = time.monotonic() + timeout_s
    while sched.snapshot()["running"] and time.monotonic() < end:
        time.sleep(0.02)
    return sched.snapshot()["running"] == 0


def post(base, body, **kw):
    return httpx.post(base + "/v1/chat/completions", json={"model": "vl", **body}, timeout=60, **kw)


@contextmanager
def decoding_stream(base, body):
    """A streamed request read until its first token (it is decoding) -> (the rest of its lines, the lines read)."""
    with httpx.Client(timeout=60) as h, h.stream("POST", base + "/v1/chat/completions", json=body) as r:
        lines, chunks = r.iter_lines(), []
        while sum(x.startswith("data:") for x in chunks) < 2:  # the role chunk, then a token
            chunks.append(next(lines))
        yield lines, chunks


def at_once(fn, n: int) -> None:
    """fn(0) .. fn(n - 1) on threads of their own, started together; returns when they are done."""
    threads = [threading.Thread(target=fn, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)


def streamed_text(chunks) -> str:
    deltas = [ch["delta"] for x in chunks if x.startswith("data:") and "[DONE]" not in x
              for ch in json.loads(x[5:])["choices"]]
    return "".join((d.get("reasoning_content") or "") + (d.get("content") or "") for d in deltas)


def test_api_key_401_and_body_cap_413(engine):
    with in_process_server(engine, api_key="s3cret", max_body_bytes=4096) as (base, _):
        with pytest.raises(openai.AuthenticationError) as info:
            client_for(base, "wrong").models.list()
        assert info.value.status_code == 401 and info.value.body["code"] == "invalid_api_key"
        assert httpx.get(base + "/v1/models").status_code == 401  # no header at all
        assert httpx.get(base + "/health").status_code == 200  # health stays open (for load balancers)
        ok = client_for(base, "s3cret")
        assert [m.id for m in ok.models.list().data] == ["vl"]
        big = {"type": "image_url", "image_url": {"url": data_uri(png_bytes(size=(800, 800)) * 4, "image/png")}}
        r = post(base, {"messages": [{"role": "user", "content": [big]}]},
                 headers={"Authorization": "Bearer s3cret"})
        assert r.status_code == 413 and r.json()["error"]["code"] == "request_too_large"
        assert ok.chat.completions.create(model="vl", messages=HELLO, max_tokens=2, temperature=0).choices


def test_timeout_is_504_streamed_or_not(endless):
    from vl.server.request import Ceilings

    with paced(endless) as steps, in_process_server(endless, ceilings=Ceilings(request_timeout_s=0.5)) as (
            base, sched):
        c = client_for(base)
        with pytest.raises(openai.APIStatusError) as info:
            c.chat.completions.create(model="vl", messages=HELLO, max_tokens=4000, temperature=0)
        assert info.value.status_code == 504 and info.value.body["code"] == "decode_timeout"
        assert wait_idle(sched)
        cut = len(steps)
        assert cut < 4000, "the time limit did not end the decode"  # 4000 tokens are 4000 forwards (>= 4 s paced)
        with pytest.raises(openai.APIError, match="limit"):
            for _ in c.chat.completions.create(model="vl", messages=HELLO, max_tokens=4000, temperature=0,
                                               stream=True):
                pass
        assert wait_idle(sched)  # the worker winds the batch up
        assert len(steps) - cut < 4000, "the time limit did not end the streamed decode"


def test_disconnect_mid_stream_frees_the_slot(endless):
    with paced(endless) as steps, in_process_server(endless, max_batch=1, max_queue=0) as (base, sched):
        body = {"messages": HELLO, "max_tokens": 4000, "temperature": 0, "stream": True}
        with httpx.Client(timeout=60) as h:
            with h.stream("POST", base + "/v1/chat/completions", json={"model": "vl", **body}) as r:
                assert r.status_code == 200
                lines = 0
                for line in r.iter_lines():
                    lines += line.startswith("data:")
                    if lines >= 5:
                        break
            assert sched.snapshot()["running"] == 1  # 4000 paced tokens take >= 4 s: it is still generating
        assert wait_idle(sched), "the slot was not freed"
        assert len(steps) < 4000, "the generation went on after its client left"  # it ran all 4000 tokens
        r = post(base, {"messages": HELLO, "max_tokens": 3, "temperature": 0})  # max_queue 0: only an idle server
        assert r.status_code == 200, r.text


def test_eight_clients_against_a_queue_of_four(endless):
    with in_process_server(endless, max_batch=1, max_queue=4) as (base, sched):
        c = client_for(base)
        start, outcomes = threading.Barrier(8), [None] * 8

        def one(i):
            start.wait()
            try:
                r = c.chat.completions.create(model="vl", messages=HELLO, max_tokens=40, temperature=0)
                outcomes[i] = ("served", r.usage.completion_tokens)
            except openai.APIStatusError as e:
                outcomes[i] = ("refused", e.status_code, e.body.get("code"))

        threads = [threading.Thread(target=one, args=(i,)) for i in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(120)
        assert not any(t.is_alive() for t in threads), "a client hung"
        served = [o for o in outcomes if o[0] == "served"]
        refused = [o for o in outcomes if o[0] == "refused"]
        assert len(served) + len(refused) == 8
        assert all(o[1] == 40 for o in served)
        assert refused and all(o[1:] in ((429, "queue_full"), (503, "unavailable")) for o in refused)
        assert len(served) >= 5  # one running and four waiting were always admitted
        snap = sched.snapshot()
        assert snap["waiting"] == 0 and snap["running"] == 0 and snap["refused"] == len(refused)
        assert c.chat.completions.create(model="vl", messages=HELLO, max_tokens=3, temperature=0).choices


def test_shutting_down_is_503(engine):
    with in_process_server(engine) as (base, sched):
        sched.close()
        r = post(base, {"messages": HELLO, "max_tokens": 2})
        assert r.status_code == 503 and r.json()["error"]["code"] == "unavailable"


def test_batched_requests_equal_single_runs_and_a_bad_one_fails_alone(engine):
    colours = ["red", "green", "blue"]
    refs = [engine.chat([{"role": "user", "content": [{"type": "image", "image": png_bytes(c)},
                                                      {"type": "text", "text": "What colour?"}]}],
                        max_new_tokens=12, thinking=False) for c in colours]
    with in_process_server(engine, max_batch=8, batch_window_s=0.3) as (base, sched):
        c = client_for(base)
        start, answers = threading.Barrier(4), [None] * 4

        def one(i):
            if i < 3:
                part = {"type": "image_url", "image_url": {"url": data_uri(png_bytes(colours[i]), "image/png")}}
            else:  # corrupt PNG: fails in its own row
                part = {"type": "image_url", "image_url": {"url": data_uri(b"\x89PNG\r\n\x1a\nbroken", "image/png")}}
            start.wait()
            try:
                r = c.chat.completions.create(model="vl", max_tokens=12, temperature=0,
                                              messages=[{"role": "user", "content": [part, {"type": "text",
                                                                                          "text": "What colour?"}]}],
                                              extra_body={"chat_template_kwargs": {"enable_thinking": False}})
                answers[i] = r.choices[0].message.content
            except openai.APIStatusError as e:
                answers[i] = (e.status_code, e.body["code"])

        at_once(one, 4)
        assert answers[:3] == [r.answer for r in refs]
        assert answers[3][0] == 400 and answers[3][1] in ("corrupt_media", "bad_media")
        assert sched.batches == 1, "the four requests sent together should have been one batch"


def test_requests_arriving_during_a_batch_join_it(endless):
    """Continuous batching: requests sent while a long answer decodes join its batch between steps, finish
    before it, and every answer equals its single run."""
    prompts = [[{"role": "user", "content": w}] for w in ("red", "left right up", "count the stars please")]
    refs = [endless.chat(m, max_new_tokens=6, thinking=False).answer for m in prompts]
    long_ref = "".join(e.text for e in endless.chat(HELLO, max_new_tokens=300, thinking=False, stream=True))
    with in_process_server(endless, max_batch=8, batch_window_s=0) as (base, sched):
        c = client_for(base)
        body = {"model": "vl", "messages": HELLO, "max_tokens": 300, "temperature": 0, "stream": True,
                "chat_template_kwargs": {"enable_thinking": False}}
        answers, done_at = [None] * 3, [None] * 3
        with decoding_stream(base, body) as (lines, chunks):

            def one(i):
                got = c.chat.completions.create(model="vl", messages=prompts[i], max_tokens=6, temperature=0,
                                                extra_body={"chat_template_kwargs": {"enable_thinking": False}})
                answers[i], done_at[i] = got.choices[0].message.content, sched.snapshot()["running"]

            at_once(one, 3)
            chunks += list(lines)
        text = streamed_text(chunks)
        assert answers == refs
        assert text == long_ref
        assert sched.joined >= 1 and sched.batches < 4, (sched.joined, sched.batches)
        assert all(n >= 1 for n in done_at)  # the long answer was still running when each short one was done


def test_a_long_prompt_rides_into_a_running_stream_twice_next_to_a_bad_request(endless, monkeypatch):
    """Twice, through the `openai` SDK: while a streamed answer decodes, a long prompt (longer than the default
    chunk) and a request with a corrupt image arrive; the prompt's chunks ride inside the running row's fused steps
    (vl/runtime/decode_batch.py), the bad request fails alone with a 400, and both answers equal their single
    runs. The fused step is slowed by 2 ms (a wrapper, not a forward hook: a hook would send the steps through the
    modules) so that the stream outlasts the join on any machine."""
    from vl.runtime.cpu import decode as cpu_decode

    long_prompt = [{"role": "user", "content": "left right up down red green blue yellow " * 12}]
    long_ref = endless.chat(long_prompt, max_new_tokens=8, thinking=False).answer
    stream_ref = "".join(e.text for e in endless.chat(HELLO, max_new_tokens=400, thinking=False, stream=True))
    rides, real = [], cpu_decode.run_step

    def slowed(lm, lib, tok, cache, plan=None, chunk=None):
        time.sleep(0.002)
        out = real(lm, lib, tok, cache, plan, chunk)
        if chunk is not None:
            rides.append(out is not None)
        return out

    monkeypatch.setattr(cpu_decode, "run_step", slowed)
    bad = {"type": "image_url", "image_url": {"url": data_uri(b"\x89PNG\r\n\x1a\nbroken", "image/png")}}
    with in_process_server(endless, max_batch=8, batch_window_s=0) as (base, sched):
        c = client_for(base)
        for _ in range(2):
            before = len(rides)
            body = {"model": "vl", "messages": HELLO, "max_tokens": 400, "temperature": 0, "stream": True,
                    "chat_template_kwargs": {"enable_thinking": False}}
            answers = [None, None]
            with decoding_stream(base, body) as (lines, chunks):

                def one(i):
                    try:
                        got = c.chat.completions.create(
                            model="vl", max_tokens=8, temperature=0,
                            messages=long_prompt if i == 0 else [{"role": "user", "content": [
                                bad, {"type": "text", "text": "What colour?"}]}],
                            extra_body={"chat_template_kwargs": {"enable_thinking": False}})
                        answers[i] = got.choices[0].message.content
                    except openai.APIStatusError as e:
                        answers[i] = (e.status_code, e.body["code"])

                at_once(one, 2)
                chunks += list(lines)
            text = streamed_text(chunks)
            assert answers[0] == long_ref and answers[1][0] == 400, answers
            assert text == stream_ref
            assert len(rides) - before >= 2 and all(rides[before:]), rides[before:]  # it rode, in several steps
