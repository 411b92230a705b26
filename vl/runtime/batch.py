"""The one generation loop behind `Engine.chat`, `Engine.chat_batch`, the OpenAI-compatible server and the
transformers pipeline's `generate` (vl/hf/model.py).

Each conversation of a batch is a `ChatRequest` with its own limits: token budget, stop strings, reasoning budget,
end-of-sequence rules (`ignore_eos`, `min_tokens`, as vLLM's), a cancel flag (a client that went away) and a
deadline. The rows are prefilled together, left-padded (a batch equals its singles: tests/runtime/test_engine.py),
and decoded step by step in a `DecodeBatch` (vl/runtime/decode_batch.py). A row that ends leaves the batch at once
and its result is handed out then, not when the slowest row is done; between steps, requests the caller hands over
(`more`) are prepared, prefilled and join the running batch (continuous batching). This follows the per-sequence
state of continuous-batching servers (vLLM's `Request`/`SequenceGroup`, TGI's `Entry`).

A request's prompt is chat messages (the processor builds it) or a `Tokenized` prompt that a processor already
built (the transformers pipeline hands those to `generate`).
"""

from __future__ import annotations

import logging
import resource
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import torch

from vl.errors import GenerationOptionError, StoppedError, VLError
from vl.options import RequestOptions
from vl.processing.reasoning_text import ThinkSplitter, split_reasoning
from vl.processing.progress import Work
from vl.runtime.cpu import encoder_pages
from vl.runtime.detokenize import IncrementalDecoder
from vl.runtime.decode_batch import DecodeBatch
from vl.runtime.generate import check_lengths, left_pad_embeds
from vl.runtime.reasoning import ReasoningBudget
from vl.runtime.results import ChatResult, Event, Stats
from vl.runtime.sampling import SamplingParams
from vl.runtime.vision_batch import GroupVision

log = logging.getLogger("vl.runtime")

@dataclass
class Tokenized:
    """A prompt already built by the processor: its ids, its tiles in placeholder order and the media spans."""

    input_ids: torch.Tensor  # (1, t)
    pixel_values: torch.Tensor | None  # (num_tiles, 3, S, S)
    media: list  # MediaSpan per media item
    opened_think: bool  # the completion starts inside <think> (vl.processing.chat.opens_think)


class ChatRequest:
    """One conversation with the options that belong to it alone (sampling and the stop ids are shared by the batch;
    whether they end this row, `ignore_eos`, and from when, `min_tokens`, are its own): its prompt (chat messages,
    or a `Tokenized` prompt), its `RequestOptions` (vl/options.py, checked when built), stop strings, a cancel flag
    (a client that went away), a deadline, a progress callback and a per-token callback. Option keywords
    (`max_new_tokens=5`, `video_pruning_rate=0.5`, ...) are read over `options`."""

    def __init__(self, messages: list | Tokenized, options: RequestOptions | None = None, *, stop=(),
                 cancel: threading.Event | None = None, timeout_s: float | None = None,
                 progress: Callable[[str, int, int], None] | None = None,
                 on_token: Callable[[int], None] | None = None, **option_kwargs):
        self.messages = messages
        self.options = RequestOptions.from_kwargs(options, **option_kwargs) if option_kwargs else (
            options or RequestOptions())
        self.stop = list(stop or [])
        self.cancel = cancel
        self.timeout_s = timeout_s  # from the start of its work (prepare included)
        self.progress = progress  # (what, done, total) while media are read
        self.on_token = on_token  # each generated id as it comes, the stop id included
        if timeout_s is not None and not timeout_s > 0:
            raise GenerationOptionError(f"timeout_s must be > 0 seconds, found {timeout_s!r}")

    @property
    def max_new_tokens(self) -> int:
        return self.options.max_new_tokens

    @property
    def thinking(self) -> bool | None:
        return self.options.thinking

    @property
    def reasoning_budget(self) -> int | None:
        return self.options.reasoning_budget


class _Row:
    """Decoding state of one request inside a batch."""

    def __init__(self, index, request, embeds, inputs, stats, tokenizer, t0):
        self.index, self.request, self.embeds, self.inputs, self.stats = index, request, embeds, inputs, stats
        self.opened = inputs.opened_think
        self.budget = (None if request.reasoning_budget is None
                       else ReasoningBudget(tokenizer, request.reasoning_budget, self.opened))
        self.splitter, self.decoder = ThinkSplitter(self.opened), IncrementalDecoder(tokenizer)
        self.ids: list[int] = []
        self.text, self.finish, self.first = "", "length", None
        self.t0 = t0  # when this request's work began (the batch's start, or its own admission)
        self.deadline = None if request.timeout_s is None else t0 + request.timeout_s
        self.done = False

    def push(self, tok: int, stopped: bool, stop_ids=frozenset()) -> list:
        """One generated token -> events; sets `done` and `finish` when the row ends here. `stopped`: the batch
        ended the row on this token (a stop id). A stop id that did not end it (`ignore_eos`) counts as a token
        but adds no text, as vLLM's default `skip_special_tokens` leaves it out; stop strings are looked for from
        the `min_tokens`-th token on, as vLLM's stop checker does."""
        self.first = self.first or time.perf_counter()
        if stopped:
            self.finish, self.done = "stop", True
            return []
        self.ids.append(tok)
        events = []
        if tok not in stop_ids:
            piece = self.decoder.push(tok)
            if len(self.ids) >= self.request.options.min_tokens:
                hit = _find_stop(self.text + piece, self.request.stop, len(self.text))
                if hit is not None:
                    piece, self.finish = (self.text + piece)[:hit][len(self.text):], "stop_string"
            self.text += piece
            events = self.splitter.feed(piece)
        if self.finish == "stop_string":
            self.done = True
        elif self.request.cancel is not None and self.request.cancel.is_set():
            self.finish, self.done = "cancelled", True
        elif self.deadline is not None and time.perf_counter() > self.deadline:
            self.finish, self.done = "timeout", True
        elif len(self.ids) >= self.request.max_new_tokens:
            self.finish, self.done = "length", True
        return events

    def close(self, t0: float):
        """-> (last events, ChatResult)."""
        events = []
        if self.finish != "stop_string":
            tail = self.decoder.flush()
            self.text += tail
            events += self.splitter.feed(tail)
        events += self.splitter.finish()
        end = time.perf_counter()
        reasoning, answer, truncated = split_reasoning(self.text, self.opened)
        s = self.stats
        s.new_tokens, s.total_s = len(self.ids), end - t0
        s.time_to_first_token_s = (self.first or end) - t0
        if self.first:
            s.stages_s["decode"] = end - self.first
        if self.first and len(self.ids) > 1:
            s.decode_tokens_per_s = (len(self.ids) - 1) / max(end - self.first, 1e-9)
        s.peak_memory_bytes = (torch.cuda.max_memory_allocated() if torch.cuda.is_available()
                               else resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024)
        if self.budget is not None and self.budget.forced:
            s.notes.append(f"reasoning cut at the budget of {self.request.reasoning_budget} tokens")
        return events, ChatResult(self.text, reasoning, answer, self.ids, s, self.finish, truncated)


def run_batch(engine, requests: list[ChatRequest], params: SamplingParams, *, raise_errors: bool = True,
              more: Callable[[int], list[ChatRequest]] | None = None,
              stop_ids=None,
              processed: Callable[[ChatRequest], Processed] | None = None) -> Iterator[tuple[int, object]]:
    """Yields `(i, Event)` while request i generates and `(i, ChatResult)` once it has ended; a request that
    cannot be prepared (bad media, too long), or whose own code fails while it decodes (its token callback), yields
    `(i, VLError)` when `raise_errors` is false and the other rows go on, else the error is raised. Holds the
    engine's lock throughout.

    `more(running)`, when given, is asked between decode steps for requests to join the running batch
    (`running`: how many requests are in it now; the caller keeps its own limit); they are numbered on from
    `len(requests)` in the order given, prefilled, and decode alongside the others from the next step
    (continuous batching, vl/runtime/decode_batch.py). Rows that end leave the batch at once. `stop_ids`: the
    ids that end a row (default: the engine's).

    `processed(request)`, when given, returns the request's media already processed (`Engine.process`, run
    off this thread by the caller: a server's preparation pool) or raises its error; then the requests that
    join together are encoded in one vision-tower call (vl/runtime/vision_batch.py) as well as prefilled in
    one call. Without it each request goes through `engine.prepare` on its own."""
    with engine._lock:
        try:
            t0 = time.perf_counter()
            if torch.cuda.is_available():
                torch.cuda.reset_peak_memory_stats()
            waiting: list[_Row] = []  # prepared, not yet in the batch (they did not fit in the context with it)
            if processed is None:
                for i, req in enumerate(requests):
                    row = yield from _prepare(engine, i, req, t0, raise_errors)
                    if row is not None:
                        waiting.append(row)
            else:
                waiting += yield from _prepare_group(engine, list(enumerate(requests)), processed, raise_errors)
            batch, rows, count = None, {}, len(requests)
            while waiting or rows:
                if batch is None or not batch.live():
                    batch = DecodeBatch(engine.lm, params=params,
                                        stop_ids=engine.stop_ids if stop_ids is None else stop_ids,
                                        prefill_chunk=engine.prefill_chunk, context_length=engine.context_length,
                                        decode=engine.decode, mix_chunk=getattr(engine, "mix_chunk", None))
                if more is not None and batch.elastic and rows:
                    joining = more(len(rows) + len(waiting))
                    if processed is not None:
                        waiting += yield from _prepare_group(engine, list(enumerate(joining, count)), processed,
                                                             False)
                        count += len(joining)
                    for req in joining if processed is None else ():
                        row = yield from _prepare(engine, count, req, time.perf_counter(), False)
                        count += 1
                        if row is not None:
                            waiting.append(row)
                group = _fitting(batch, waiting)
                if group:
                    _join(engine, batch, group)
                    rows.update((r.index, r) for r in group)
                    waiting = waiting[len(group):]
                if not rows:
                    continue
                for i, item in _step(engine, batch, rows, raise_errors):
                    yield i, (Event(*item) if isinstance(item, tuple) else item)
        finally:
            encoder_pages.after_requests(engine.model)  # release mode: the heap back before the next request


def _prepare(engine, i: int, req: ChatRequest, t0: float, raise_errors: bool):
    """-> a `_Row` ready to join, or None after yielding `(i, VLError)`."""
    try:
        embeds, inputs, stats = engine.prepare(req.messages, req.options, work=Work(req.cancel, req.progress))
        check_lengths(int(embeds.shape[1]), req.max_new_tokens, engine.context_length)
    except StoppedError:  # stopped before the first token: nothing was generated
        stats = Stats(total_s=time.perf_counter() - t0, notes=["stopped before the answer began"])
        yield i, ChatResult("", "", "", [], stats, "cancelled")
        return None
    except VLError as e:
        if raise_errors:
            raise
        yield i, e
        return None
    return _Row(i, req, embeds, inputs, stats, engine.tokenizer, t0)


@dataclass
class Processed:
    """A request's media, processed before it reached the engine's thread (`Engine.process`)."""

    inputs: object  # ProcessedInputs
    stats: Stats
    started: float  # time.perf_counter() when its work began: its statistics count from here


def _prepare_group(engine, items: list[tuple[int, ChatRequest]], processed, raise_errors: bool):
    """Requests whose media were processed elsewhere -> `_Row`s, their tiles encoded in one vision-tower call.
    A request that failed (its processing, or its own merge) yields `(i, VLError)` alone; returns the rows."""
    ready = []
    for i, req in items:
        t0 = time.perf_counter()
        try:
            got = processed(req)
            ready.append((i, req, got))
        except StoppedError:
            yield i, ChatResult("", "", "", [], Stats(total_s=time.perf_counter() - t0,
                                                      notes=["stopped before the answer began"]), "cancelled")
        except VLError as e:
            if raise_errors:
                raise
            yield i, e
    vision = None
    if len(ready) > 1:
        try:
            vision = GroupVision(engine, [got.inputs for _, _, got in ready])
        except VLError:  # one request's tiles spoil the group's call: each is encoded on its own below
            vision = None
    rows = []
    for i, req, got in ready:
        try:
            embeds = engine.embed(got.inputs, got.stats, req.options, work=Work(req.cancel, req.progress),
                                  vision_cache=vision)
            check_lengths(int(embeds.shape[1]), req.max_new_tokens, engine.context_length)
        except StoppedError:
            yield i, ChatResult("", "", "", [], Stats(total_s=time.perf_counter() - got.started,
                                                      notes=["stopped before the answer began"]), "cancelled")
            continue
        except VLError as e:
            if raise_errors:
                raise
            yield i, e
            continue
        rows.append(_Row(i, req, embeds, got.inputs, got.stats, engine.tokenizer, got.started))
    return rows


def _fitting(batch: DecodeBatch, waiting: list[_Row]) -> list[_Row]:
    """The longest run of waiting rows, oldest first, that may join the batch together now."""
    group: list[_Row] = []
    for row in waiting:
        cand = group + [row]
        if not batch.fits([int(r.embeds.shape[1]) for r in cand], [r.request.max_new_tokens for r in cand]):
            break
        group = cand
    return group


def _join(engine, batch: DecodeBatch, group: list[_Row]) -> None:
    """Prefill a group together (left-padded; a batch equals its singles: tests/runtime/test_engine.py); while
    other rows decode, the batch runs it a chunk per step (vl/runtime/decode_batch.py) and its rows' prefill time
    is read when their first token comes."""
    if len(group) == 1:
        embeds, mask = group[0].embeds, None
    else:
        embeds, mask = left_pad_embeds([r.embeds[0] for r in group])
    for r in group:
        r.embeds = None  # the cache holds the prompt from now on
    batch.join([r.index for r in group], [r.request.max_new_tokens for r in group], inputs_embeds=embeds,
               attention_mask=mask, contexts=[r.inputs.input_ids[0].tolist() for r in group],
               controllers=[r.budget for r in group], ignore_eos=[r.request.options.ignore_eos for r in group],
               min_tokens=[r.request.options.min_tokens for r in group])


def _step(engine, batch: DecodeBatch, rows: dict, raise_errors: bool = True):
    """One decode step: events of every row, and the results of the rows that ended. A row whose own code fails
    (its token callback, its detokenizing or stop strings) ends alone with `(i, VLError)` unless `raise_errors`;
    the other rows go on."""
    out = batch.step() or {}
    states = batch.states()  # rows that end below leave `rows` at once: later lookups never need them
    for i, tok in out.items():
        row = rows[i]
        if i in batch.prefill_s:  # its first token: its prompt's prefill is done
            row.stats.stages_s["prefill"] = batch.prefill_s.pop(i)
        try:
            if row.request.on_token is not None:
                row.request.on_token(tok)
            events = row.push(tok, states[i] == "stop", batch.stop)
        except Exception as e:
            if raise_errors:
                raise
            batch.finish(i)
            del rows[i]
            if not isinstance(e, VLError):
                log.exception("request %d of a batch failed while decoding; the others go on", i)
            yield i, e if isinstance(e, VLError) else VLError(f"this request failed while decoding "
                                                              f"({type(e).__name__}); the others in its batch go on")
            continue
        for kind, text in events:
            yield i, (kind, text)
        if row.done:
            batch.finish(i)
            del rows[i]
            yield from _close(row)
    for i, row in list(rows.items()):
        # a cancel or a deadline that came while the step ran ends its row now; a row the batch ended (its
        # budget) ends here too
        if row.request.cancel is not None and row.request.cancel.is_set():
            row.finish, row.done = "cancelled", True
        elif row.deadline is not None and time.perf_counter() > row.deadline:
            row.finish, row.done = "timeout", True
        elif states.get(i, "gone") is not None:
            row.done = True
        if row.done:
            batch.finish(i)
            del rows[i]
            yield from _close(row)


def _close(row: _Row):
    events, result = row.close(row.t0)
    for kind, text in events:
        yield row.index, (kind, text)
    yield row.index, result


def _find_stop(text: str, stops: list[str], searched_upto: int) -> int | None:
    """Index where the earliest stop string starts, looking only at text not already searched."""
    best = None
    for s in stops:
        if not s:
            continue
        i = text.find(s, max(0, searched_upto - len(s) + 1))
        if i != -1 and (best is None or i < best):
            best = i
    return best
