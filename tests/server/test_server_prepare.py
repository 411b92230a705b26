"""Preparation ahead (vl/server/scheduler.py): a waiting request's media are processed on a preparation thread
while the engine decodes, so a request that is slow to prepare never pauses the running batch nor holds up a
quicker request behind it, and every answer still equals its single run. On the `vl serve` app in this process
over the demo model with its stop tokens off ("endless": a generation runs exactly max_tokens)."""

from __future__ import annotations

import json
import threading
from types import SimpleNamespace

import httpx
import pytest

from helpers import DEMO, in_process_server, paced

pytestmark = pytest.mark.skipif(not (DEMO / "config.json").is_file(), reason="the demo model is not shipped here")

@pytest.fixture(scope="module")
def slow_engine():
    from vl.runtime.engine import Engine

    class SlowToPrepare(Engine):
        """Processing a conversation that says "slow" waits for the test's `release` once `gate` is set (a long
        PDF, say): the test decides when its preparation ends, not a clock."""

        gate = None  # SimpleNamespace(started=Event, release=Event) while a test holds the slow request

        def process(self, messages, *args, **kw):
            gate = self.gate
            if gate is not None and "slow" in json.dumps(messages, default=str):
                gate.started.set()
                assert gate.release.wait(120), "the test never released the slow request"
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
    return r.json()["choices"][0]["message"]["content"]


def test_a_request_slow_to_prepare_pauses_neither_the_batch_nor_a_quick_request(slow_engine):
    """While the slow request's preparation is held open, the engine keeps decoding (forward steps counted) and
    the quick request is answered in full; only then is the slow one let go. Events and step counts, no clock."""
    refs = {t: slow_engine.chat([{"role": "user", "content": t}], max_new_tokens=5, thinking=False).answer
            for t in ("slow one", "quick one")}
    gate = slow_engine.gate = SimpleNamespace(started=threading.Event(), release=threading.Event())
    try:
        with paced(slow_engine) as steps, in_process_server(slow_engine, max_batch=8, batch_window_s=0,
                                                   prepare_workers=2) as (base, sched):
            body = {"model": "vl", "messages": [{"role": "user", "content": "hello"}], "max_tokens": 4000,
                    "temperature": 0, "stream": True, "chat_template_kwargs": {"enable_thinking": False}}
            got = {}
            threads = {t: threading.Thread(target=lambda t=t: got.__setitem__(t, ask(base, t, 5)))
                       for t in ("slow one", "quick one")}
            with httpx.Client(timeout=120) as h, h.stream("POST", base + "/v1/chat/completions", json=body) as r:
                lines = r.iter_lines()
                next(lines)  # the long answer is decoding
                threads["slow one"].start()
                assert gate.started.wait(60), "the slow request was never prepared"
                held_at = len(steps)  # decoding steps from here on ran while the slow request was held
                threads["quick one"].start()
                for _ in lines:  # read the long answer as it streams
                    during = len(steps) - held_at
                    if during >= 20 and not threads["quick one"].is_alive():
                        break
                assert "quick one" in got, "the quick request waited for the slow one"
                assert during >= 20, "the running batch stopped decoding while a request was being prepared"
                assert "slow one" not in got
                gate.release.set()
                threads["slow one"].join(120)
        assert got == refs
        assert sched.joined >= 2
    finally:
        gate.release.set()
        slow_engine.gate = None


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
