"""Preparation ahead (vl/server/scheduler.py): a waiting request's media are processed on a preparation thread
while the engine decodes, so a request that is slow to prepare never pauses the running batch nor holds up a
quicker request behind it, and every answer still equals its single run. On the `vl serve` app in this process
over the demo model with its stop tokens off ("endless": a generation runs exactly max_tokens)."""

from __future__ import annotations

import json
import threading
import time

import httpx
import pytest

from helpers import DEMO, in_process_server, paced

pytestmark = pytest.mark.skipif(not (DEMO / "config.json").is_file(), reason="the demo model is not shipped here")

SLOW_S = 1.5


@pytest.fixture(scope="module")
def slow_engine():
    from vl.runtime.engine import Engine

    class SlowToPrepare(Engine):
        """Processing a conversation that says "slow" takes SLOW_S longer (a long PDF, say)."""

        def process(self, messages, *args, **kw):
            if "slow" in json.dumps(messages, default=str):
                time.sleep(SLOW_S)
            return super().process(messages, *args, **kw)

    base = Engine.from_pretrained(str(DEMO))
    e = SlowToPrepare(base.model, base.processor)
    e.stop_ids = set()
    return e


def ask(base, text, max_tokens):
    body = {"model": "vl", "messages": [{"role": "user", "content": text}], "max_tokens": max_tokens,
            "temperature": 0, "chat_template_kwargs": {"enable_thinking": False}}
    r = httpx.post(base + "/v1/chat/completions", json=body, timeout=120)
    r.raise_for_status()
    return r.json()["choices"][0]["message"]["content"], time.monotonic()


def test_a_request_slow_to_prepare_pauses_neither_the_batch_nor_a_quick_request(slow_engine):
    refs = {t: slow_engine.chat([{"role": "user", "content": t}], max_new_tokens=5, thinking=False).answer
            for t in ("slow one", "quick one")}
    with paced(slow_engine), in_process_server(slow_engine, max_batch=8, batch_window_s=0, prepare_workers=2) as (
            base, sched):
        body = {"model": "vl", "messages": [{"role": "user", "content": "hello"}], "max_tokens": 4000,
                "temperature": 0, "stream": True, "chat_template_kwargs": {"enable_thinking": False}}
        got, arrivals = {}, []
        with httpx.Client(timeout=120) as h, h.stream("POST", base + "/v1/chat/completions", json=body) as r:
            lines = r.iter_lines()
            next(lines)  # the long answer is decoding
            sent = time.monotonic()
            threads = [threading.Thread(target=lambda t=t: got.__setitem__(t, ask(base, t, 5)))
                       for t in ("slow one", "quick one")]
            for t in threads:
                t.start()
                time.sleep(0.05)
            for line in lines:  # the long answer's tokens while the slow request is being prepared
                arrivals.append(time.monotonic())
                if arrivals[-1] > sent + SLOW_S or not any(t.is_alive() for t in threads):
                    break
            for t in threads:
                t.join(120)
        assert {t: a for t, (a, _) in got.items()} == refs
        assert got["quick one"][1] < got["slow one"][1], "the quick request waited for the slow one"
        during = [t for t in arrivals if sent + 0.2 < t < sent + SLOW_S - 0.2]
        assert during, "the running batch stopped decoding while a request was being prepared"
        assert sched.joined >= 2


def test_withdrawing_a_finished_request_formats_nothing():
    """Every request's handler withdraws its job when it ends (a no-op once the worker took it). That must not
    format the job: its processed media are tensors, and printing them cost the event loop ~8 ms per request
    (cProfile of the docs benchmark) when `deque.remove` put the job's repr into the ValueError it raised."""
    import asyncio

    from vl.runtime.batch import ChatRequest
    from vl.runtime.sampling import SamplingParams
    from vl.server.scheduler import Job, Scheduler

    class Unprintable:
        def __repr__(self):
            raise AssertionError("the job was formatted")

    sched, loop = Scheduler(object(), prepare_workers=0), asyncio.new_event_loop()
    try:
        job = Job(ChatRequest([{"role": "user", "content": "hi"}]), SamplingParams(), loop)
        job.processed = Unprintable()
        sched.withdraw(job)  # it is not waiting: nothing to remove
        assert job.cancel.is_set() and sched.snapshot()["waiting"] == 0
        repr(job)  # a log line that prints a job leaves its tiles out too
    finally:
        sched.close()
        loop.close()
