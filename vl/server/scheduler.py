"""Admission and batching: a bounded queue in front of one engine worker thread.

Requests wait in a queue of at most `max_queue`; one more is refused at once with `QueueFullError` (429),
as TGI's `try_acquire` and SGLang's `--max-queued-requests` do, so no client waits unboundedly. The worker
takes the oldest request plus every waiting request that can share its batch (same sampling parameters; a
seeded sampled request runs alone so that its seed means what it says), up to `max_batch`, and runs them
through `Engine.stream_batch` (vl/runtime/batch.py), whose rows equal single runs. While the batch decodes,
requests that arrive and share its key join it between steps (continuous batching), as rows leave. A request that fails to
prepare fails alone; a request whose client went away is dropped from the queue, or stops decoding at its
next token; a request past its deadline ends with `DecodeTimeoutError` (504). A batch that fails as a whole (a
fault in a step or a prefill, not one request's own error) does not take its rows down with it: each row that has
not streamed anything yet is run again alone, so only a row that fails alone fails.

Preparation runs ahead (`prepare_workers` threads): a waiting request's media are decoded, tiled and its prompt
tokenized (`Engine.process`, which calls no model) while the engine decodes others, at most `lookahead` requests
ahead (their pixels wait in memory). The worker takes only requests whose media are ready, so a long document
being rendered never pauses the running batch, and the requests that join together have their tiles encoded in
one vision-tower call and are prefilled in one call (vl/runtime/batch.py, vl/runtime/vision_batch.py).
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import threading
import time
from collections import deque
from dataclasses import dataclass, field

from vl.errors import DecodeTimeoutError, QueueFullError, ServerUnavailableError, VLError
from vl.processing.progress import Work
from vl.runtime.batch import ChatRequest, Processed
from vl.runtime.engine import Engine
from vl.runtime.sampling import SamplingParams

log = logging.getLogger("vl.server")


@dataclass(eq=False)
class Job:
    request: ChatRequest
    params: SamplingParams
    loop: asyncio.AbstractEventLoop = field(repr=False)
    out: asyncio.Queue = field(default_factory=asyncio.Queue, repr=False)  # Event | ChatResult | VLError, then None
    cancel: threading.Event = field(default_factory=threading.Event, repr=False)
    enqueued: float = field(default_factory=time.monotonic)
    stream: bool = True  # False: only the result is delivered (no cross-thread wake-up per token)
    state: str = "new"  # "new" -> "processing" -> "ready" (its media are processed: `processed` is set)
    processed: object = field(default=None, repr=False)  # Processed | VLError (tiles: no repr of tensors)
    started_mono: float | None = None  # time.monotonic() when its processing began
    request_id: str = ""  # the HTTP request's id (vl/server/edge.py), for log lines

    def __post_init__(self):
        self.request.cancel = self.cancel

    def deliver(self, item) -> None:
        try:
            self.loop.call_soon_threadsafe(self.out.put_nowait, item)
        except RuntimeError:  # its event loop is closed (the server stopped): nobody reads this job any more
            self.cancel.set()


def batch_key(params: SamplingParams):
    """Requests with equal keys may share a batch (every sampling field but a greedy request's unused seed);
    None: this request runs alone."""
    if not params.greedy and params.seed is not None:
        return None
    return dataclasses.replace(params, seed=None)


class Scheduler:
    def __init__(self, engine, *, max_batch: int = 8, max_queue: int = 64, batch_window_s: float = 0.0,
                 prepare_workers: int = 1, lookahead: int | None = None):
        if max_batch < 1 or max_queue < 0 or prepare_workers < 0:
            raise ValueError(f"max_batch must be >= 1, max_queue >= 0 and prepare_workers >= 0, found {max_batch}, "
                             f"{max_queue}, {prepare_workers}")
        self.engine, self.max_batch, self.max_queue, self.batch_window_s = engine, max_batch, max_queue, batch_window_s
        self.lookahead = max(1, 2 * max_batch if lookahead is None else lookahead)
        # an engine whose `prepare` is specialised (the app's) keeps its own path: its media are prepared inline
        self.prepare_ahead = prepare_workers > 0 and getattr(type(engine), "prepare", None) is Engine.prepare
        self._waiting: deque[Job] = deque()
        self._cond = threading.Condition()
        self._running = 0
        self._closed = False
        self.served = self.refused = self.batches = self.joined = 0
        self._thread = threading.Thread(target=self._work, name="vl-serve-engine", daemon=True)
        self._thread.start()
        self._preparers = [threading.Thread(target=self._prepare_loop, name=f"vl-serve-prepare-{k}", daemon=True)
                           for k in range(prepare_workers if self.prepare_ahead else 0)]
        for t in self._preparers:
            t.start()

    # --- the event-loop side -----------------------------------------------------------------------
    def submit(self, job: Job) -> None:
        with self._cond:
            if self._closed:
                raise ServerUnavailableError("the server is shutting down; retry against another replica")
            # an idle engine takes the oldest waiting request as soon as its media are ready: it is not queued
            queued = len(self._waiting) - (self._running == 0)
            if queued >= self.max_queue:
                self.refused += 1
                raise QueueFullError(f"the queue is full ({len(self._waiting)} waiting, {self._running} running, "
                                     f"--max-queue {self.max_queue}); retry later")
            self._waiting.append(job)
            self._cond.notify_all()

    def withdraw(self, job: Job) -> None:
        """The client went away: drop the job if it still waits, else stop it at its next token."""
        job.cancel.set()
        with self._cond:
            # a membership test first (jobs compare by identity): `deque.remove` of a job that is no longer
            # waiting -- every finished request comes here -- would format the job's repr into its ValueError
            if job in self._waiting:
                self._waiting.remove(job)
                self._cond.notify_all()  # room ahead for the preparers
                job.deliver(None)  # whoever still reads its answer learns that none comes

    def snapshot(self) -> dict:
        with self._cond:
            return {"waiting": len(self._waiting), "running": self._running, "max_queue": self.max_queue,
                    "max_batch": self.max_batch, "served": self.served, "refused": self.refused,
                    "batches": self.batches, "joined": self.joined}

    def close(self) -> None:
        with self._cond:
            self._closed = True
            waiting, self._waiting = list(self._waiting), deque()
            self._cond.notify_all()
        for job in waiting:
            job.deliver(ServerUnavailableError("the server is shutting down"))
            job.deliver(None)

    # --- preparation, ahead of the worker --------------------------------------------------------------
    def _ready_to_take(self, job: Job) -> bool:
        return job.state == "ready" or not self.prepare_ahead

    def _prepare_loop(self) -> None:
        while True:
            with self._cond:
                while True:
                    if self._closed:
                        return
                    ahead = sum(j.state != "new" for j in self._waiting)
                    job = next((j for j in self._waiting if j.state == "new"), None)
                    if job is not None and ahead < self.lookahead:
                        break
                    self._cond.wait()
                job.state, job.started_mono = "processing", time.monotonic()
            result = self._process(job)
            with self._cond:
                job.processed, job.state = result, "ready"
                self._cond.notify_all()

    def _process(self, job: Job):
        """`Engine.process` for one request -> `Processed`, or the error it fails with (delivered by the worker)."""
        req, t0 = job.request, time.perf_counter()
        try:
            inputs, stats = self.engine.process(req.messages, req.options, work=Work(req.cancel, req.progress))
            return Processed(inputs, stats, t0)
        except VLError as e:
            return e
        except Exception as e:  # noqa: BLE001 - a bug: this request fails, the server keeps serving
            log.exception("preparing a request failed")
            return VLError(f"preparing the request failed ({type(e).__name__}); the server keeps serving")

    def _processed(self, jobs: dict):
        """The batch's `processed` hook: a taken job's processing result (done inline if nobody did it)."""
        def get(request: ChatRequest) -> Processed:
            job = jobs[id(request)]
            if job.state != "ready":
                job.started_mono, job.processed, job.state = time.monotonic(), self._process(job), "ready"
            if isinstance(job.processed, BaseException):
                raise job.processed
            return job.processed
        return get

    # --- the worker --------------------------------------------------------------------------------
    def _take(self) -> list[Job] | None:
        with self._cond:
            while not self._closed and not any(self._ready_to_take(j) for j in self._waiting):
                self._cond.wait()
            if self._closed:
                return None
            first = next(j for j in self._waiting if self._ready_to_take(j))
            self._waiting.remove(first)  # it holds the engine from now on: it no longer waits
            self._running = 1
            self._cond.notify_all()  # room ahead for the preparers
        key = batch_key(first.params)
        if key is not None and self.max_batch > 1 and self.batch_window_s > 0:
            time.sleep(self.batch_window_s)  # let requests sent together arrive together
        batch = [first]
        with self._cond:
            if key is not None:
                batch += self._same_key(key, self.max_batch - 1)
            self._running = len(batch)
        return batch

    def _same_key(self, key, room: int) -> list[Job]:
        """Up to `room` waiting jobs, oldest first, that share `key` and are ready (hold the lock)."""
        taken = []
        for job in list(self._waiting):
            if len(taken) >= room:
                break
            if batch_key(job.params) == key and self._ready_to_take(job):
                self._waiting.remove(job)
                taken.append(job)
        if taken:
            self._cond.notify_all()  # room ahead for the preparers
        return taken

    def _work(self) -> None:
        while True:
            batch = self._take()
            if batch is None:
                return
            try:
                self._run(batch)
            finally:
                with self._cond:
                    self._running = 0

    def _ready(self, jobs: list[Job]) -> list[Job]:
        """Jobs still wanted and within their deadline (time in the queue counts); the others are answered."""
        now = time.monotonic()
        live = []
        for job in jobs:
            timeout = job.request.timeout_s
            if job.cancel.is_set():
                job.deliver(None)
                continue
            if timeout is not None:
                left = timeout - (now - job.enqueued)
                if left <= 0:
                    job.deliver(DecodeTimeoutError(f"the request waited {now - job.enqueued:.1f} s in the queue, "
                                                   f"past this server's limit of {timeout:g} s; retry later"))
                    job.deliver(None)
                    continue
                # its clock runs from when its work began (processing ahead, or now), so the deadline stays
                # `timeout` after its arrival
                began = job.started_mono if self.prepare_ahead and job.started_mono is not None else now
                job.request.timeout_s = timeout - (began - job.enqueued)
            live.append(job)
        return live

    def _joiners(self, key, live: list[Job], by_request: dict):
        """Between decode steps: waiting jobs that share the batch's key (and whose media are ready) join it,
        up to `max_batch`."""
        def more(running: int):
            if key is None:
                return []
            with self._cond:
                taken = self._same_key(key, self.max_batch - running)
                self._running = running + len(taken)
            jobs = self._ready(taken)
            self.joined += len(jobs)
            live.extend(jobs)
            by_request.update((id(j.request), j) for j in jobs)
            return [j.request for j in jobs]
        return more

    def _run(self, batch: list[Job]) -> None:
        live = self._ready(batch)
        if live:
            self._decode(live, retry=len(live) > 1)

    def _decode(self, live: list[Job], retry: bool) -> None:
        """Decode `live` as one batch. If the batch fails as a whole, its rows that have streamed nothing are
        run again one by one when `retry` (the others get the error): a row that fails alone fails alone."""
        self.batches += 1
        params = live[0].params
        ended, streamed = set(), set()
        by_request = {id(j.request): j for j in live}
        kw = {"processed": self._processed(by_request)} if self.prepare_ahead else {}
        try:
            for i, item in self.engine.stream_batch([j.request for j in live], params, raise_errors=False,
                                                    more=self._joiners(batch_key(params), live, by_request), **kw):
                is_event = hasattr(item, "kind")
                if not is_event:  # a ChatResult or an error: this request is over
                    ended.add(i)
                    self.served += 1
                    with self._cond:
                        self._running = len(live) - len(ended)
                if live[i].stream or not is_event:
                    live[i].deliver(item)
                    streamed.add(i)
                if not is_event:
                    live[i].deliver(None)
        except Exception as e:  # noqa: BLE001 - a fault of the batch (a bug, the device): the server keeps serving
            if not isinstance(e, VLError):
                log.exception("a batch of %d request(s) failed", len(live))
            error = e if isinstance(e, VLError) else VLError(f"generation failed ({type(e).__name__}); the server "
                                                             "keeps serving")
            rest = [job for i, job in enumerate(live) if i not in ended]
            again = [job for i, job in enumerate(live) if i not in ended and i not in streamed] if retry else []
            self._fail([job for job in rest if job not in again], error)
            for job in again:
                if self._restart(job):
                    self._decode([job], retry=False)

    def _restart(self, job: Job) -> bool:
        """Make a job of a failed batch ready to run alone (its media processed again, its deadline kept)."""
        timeout = job.request.timeout_s
        if timeout is not None:
            left = timeout - (time.monotonic() - (job.started_mono or job.enqueued))
            if left <= 0:
                job.deliver(DecodeTimeoutError(f"the request's batch failed and no time of its limit of {timeout:g} "
                                               "s is left to run it again"))
                job.deliver(None)
                return False
            job.request.timeout_s = left
        job.state, job.processed, job.started_mono = "new", None, None
        with self._cond:
            self._running = 1
        return True

    @staticmethod
    def _fail(jobs, error) -> None:
        for job in jobs:
            job.deliver(error)
            job.deliver(None)
