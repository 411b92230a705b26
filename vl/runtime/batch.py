"""The one generation loop behind `Engine.chat`, `Engine.chat_batch` and the OpenAI-compatible server.

Each conversation of a batch is a `ChatRequest` with its own limits: token budget, stop strings, reasoning
budget, a cancel flag (a client that went away) and a deadline. The rows are prefilled together, left-padded
(a batch equals its singles: tests/runtime/test_engine.py), and decoded step by step; a row that ends early
is marked finished in `generate_steps` so it stops counting, and its result is handed out at once rather than
when the slowest row of the batch is done. This follows the per-sequence state of continuous-batching
servers (vLLM's `Request`/`SequenceGroup`, TGI's `Entry`), reduced to batches formed at admission.
"""

from __future__ import annotations

import resource
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

import torch

from vl.errors import GenerationOptionError, StoppedError, VLError
from vl.processing.chat import ThinkSplitter, split_reasoning
from vl.processing.progress import Work
from vl.runtime.detokenize import IncrementalDecoder
from vl.runtime.generate import check_lengths, generate_steps, left_pad, left_pad_embeds
from vl.runtime.reasoning import ReasoningBudget
from vl.runtime.sampling import SamplingParams

PROCESSOR_KEYS = ("max_num_tiles", "fps", "max_frames", "pages", "pdf_scale", "context_length", "reserved_tokens",
                  "add_generation_prompt", "skip_blank_tiles")


@dataclass
class ChatRequest:
    """One conversation and the options that belong to it alone (sampling is shared by the batch)."""

    messages: list
    max_new_tokens: int = 256
    thinking: bool | None = None
    reasoning_budget: int | None = None
    stop: list[str] = field(default_factory=list)
    video_pruning_rate: float | None = None
    token_pruning_rate: float = 0.0
    cancel: threading.Event | None = None
    timeout_s: float | None = None  # from the start of the batch (prepare included)
    processor: dict = field(default_factory=dict)  # PROCESSOR_KEYS
    progress: Callable[[str, int, int], None] | None = None  # (what, done, total) while media are read

    def validate(self) -> "ChatRequest":
        unknown = sorted(set(self.processor) - set(PROCESSOR_KEYS))
        if unknown:
            raise GenerationOptionError(f"unknown option(s) {unknown}; sampling: temperature, top_p, top_k, "
                                        f"repetition_penalty, seed; processing: {', '.join(PROCESSOR_KEYS)}")
        budget = self.reasoning_budget
        if budget is not None and (not isinstance(budget, int) or isinstance(budget, bool) or budget < 0):
            raise GenerationOptionError(f"reasoning_budget must be an int >= 0, found {budget!r}")
        n = self.max_new_tokens
        if not isinstance(n, int) or isinstance(n, bool) or n < 1:
            raise GenerationOptionError(f"max_new_tokens must be a positive integer, found {n!r}")
        if self.timeout_s is not None and not self.timeout_s > 0:
            raise GenerationOptionError(f"timeout_s must be > 0 seconds, found {self.timeout_s!r}")
        return self


class _Row:
    """Decoding state of one request inside a batch."""

    def __init__(self, index, request, embeds, inputs, stats, tokenizer, t0):
        self.index, self.request, self.embeds, self.inputs, self.stats = index, request, embeds, inputs, stats
        self.opened = inputs.prompt.prompt_opened_think
        self.budget = (None if request.reasoning_budget is None
                       else ReasoningBudget(tokenizer, request.reasoning_budget, self.opened))
        self.splitter, self.decoder = ThinkSplitter(self.opened), IncrementalDecoder(tokenizer)
        self.ids: list[int] = []
        self.text, self.finish, self.first = "", "length", None
        self.deadline = None if request.timeout_s is None else t0 + request.timeout_s
        self.done = False

    def push(self, tok: int, stop_ids) -> list:
        """One generated token -> events; sets `done` and `finish` when the row ends here."""
        self.first = self.first or time.perf_counter()
        if tok in stop_ids:
            self.finish, self.done = "stop", True
            return []
        self.ids.append(tok)
        piece = self.decoder.push(tok)
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
        if self.first and len(self.ids) > 1:
            s.decode_tokens_per_s = (len(self.ids) - 1) / max(end - self.first, 1e-9)
        s.peak_memory_bytes = (torch.cuda.max_memory_allocated() if torch.cuda.is_available()
                               else resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024)
        if self.budget is not None and self.budget.forced:
            s.notes.append(f"reasoning cut at the budget of {self.request.reasoning_budget} tokens")
        from vl.runtime.engine import ChatResult

        return events, ChatResult(self.text, reasoning, answer, self.ids, s, self.finish, truncated)


def run_batch(engine, requests: list[ChatRequest], params: SamplingParams, *,
              raise_errors: bool = True) -> Iterator[tuple[int, object]]:
    """Yields `(i, Event)` while request i generates and `(i, ChatResult)` once it has ended; a request that
    cannot be prepared (bad media, too long) yields `(i, VLError)` when `raise_errors` is false, else the error
    is raised before any decoding. Holds the engine's lock throughout."""
    from vl.runtime.engine import Event

    for r in requests:
        r.validate()
    with engine._lock:
        t0 = time.perf_counter()
        if torch.cuda.is_available():
            torch.cuda.reset_peak_memory_stats()
        rows = []
        for i, req in enumerate(requests):
            try:
                embeds, inputs, stats = engine.prepare(req.messages, thinking=req.thinking,
                                                       video_pruning_rate=req.video_pruning_rate,
                                                       token_pruning_rate=req.token_pruning_rate,
                                                       work=Work(req.cancel, req.progress), **req.processor)
                check_lengths(int(embeds.shape[1]), req.max_new_tokens, engine.context_length)
            except StoppedError:  # stopped before the first token: nothing was generated
                from vl.runtime.engine import ChatResult, Stats

                stats = Stats(total_s=time.perf_counter() - t0, notes=["stopped before the answer began"])
                yield i, ChatResult("", "", "", [], stats, "cancelled")
                continue
            except VLError as e:
                if raise_errors:
                    raise
                yield i, e
                continue
            rows.append(_Row(i, req, embeds, inputs, stats, engine.tokenizer, t0))
        for group in _fitting_groups(rows, engine.context_length):
            for i, item in _decode_group(engine, group, params, t0):
                yield i, (Event(*item) if isinstance(item, tuple) else item)


def _fitting_groups(rows: list[_Row], context_length: int) -> list[list[_Row]]:
    """Consecutive rows whose padded length plus the largest token budget fits the context (each row fits
    alone: check_lengths ran on it)."""
    groups: list[list[_Row]] = []
    for row in rows:
        g = groups[-1] if groups else None
        if g is not None:
            t = max([r.embeds.shape[1] for r in g] + [row.embeds.shape[1]])
            n = max([r.request.max_new_tokens for r in g] + [row.request.max_new_tokens])
            if t + n <= context_length:
                g.append(row)
                continue
        groups.append([row])
    return groups


def _decode_group(engine, rows: list[_Row], params: SamplingParams, t0: float):
    if len(rows) == 1:
        embeds, mask, ctx = rows[0].embeds, None, rows[0].inputs.input_ids
    else:
        embeds, mask = left_pad_embeds([r.embeds[0] for r in rows])
        ctx, _ = left_pad([r.inputs.input_ids[0] for r in rows])
    finished = [False] * len(rows)
    steps = generate_steps(engine.lm, inputs_embeds=embeds, attention_mask=mask,
                           max_new_tokens=max(r.request.max_new_tokens for r in rows), params=params,
                           stop_ids=engine.stop_ids, prefill_chunk=engine.prefill_chunk,
                           controllers=[r.budget for r in rows], context_length=engine.context_length,
                           context_ids=ctx, decode=engine.decode, finished=finished)
    try:
        for ev in steps:
            for j, tok in enumerate(ev.tokens):
                row = rows[j]
                if tok is None or row.done:
                    continue
                for kind, text in row.push(tok, engine.stop_ids):
                    yield row.index, (kind, text)
                if row.done:
                    finished[j] = True
                    yield from _close(row, t0)
            for j, row in enumerate(rows):  # a cancel that came while the step ran ends its row now
                if not row.done and row.request.cancel is not None and row.request.cancel.is_set():
                    row.finish, row.done, finished[j] = "cancelled", True, True
                    yield from _close(row, t0)
    finally:
        steps.close()
    for row in rows:
        if not row.done:
            row.done = True
            yield from _close(row, t0)


def _close(row: _Row, t0: float):
    events, result = row.close(t0)
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
