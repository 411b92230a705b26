"""The token-level batch that rows join and leave between decode steps (continuous batching).

vLLM's scheduler and TGI's router keep decoding while requests come and go: a request that arrives while
others decode is prefilled and its row joins the running batch at the next step, and a row that ends leaves at
once, so the batch never waits for its longest answer and never decodes dead rows. Here the rows share one
`HybridCache`; joining and leaving rebuild it with `HybridCache.repack` (vl/runtime/cache.py): Mamba state is
per row and has no length, and the attention layers have no positional encoding, so a row's keys are placed
right-aligned at the batch's current length with the columns to their left masked (docs/server.md,
"Batching"). A row's tokens therefore equal its single run, whatever joins or leaves around it.

Each row keeps its own end rules: the ids that end it (the batch's stop ids, or none: vLLM's `ignore_eos`) and a
minimum length before which the batch's stop ids are masked out of its logits (vLLM's `min_tokens`, whose
logits processor does the same), so rows with different settings share a batch and equal their single runs.

A group that joins while rows decode is prefilled a chunk at a time between the running rows' tokens
(Sarathi-Serve's chunked prefill), so a long prompt delays each running row's next token by one chunk instead of by
its whole prefill. Where the step is the fused CPU one and the group is one unpadded row, its chunk rides inside the
step (Sarathi-Serve's mixed batch): the chunk's tokens are extra rows of the step's products, so one pass over the
weights serves both, and its Mamba recurrence and attention run on its own cache (vl/runtime/cpu/decode.py
`run_step`; the running rows' bits do not change). The ride's default chunk is as many tokens as keep the step
within `RIDE_SHARE` more than the running rows' own step, both measured as the batch goes (a chunk token costs more
the longer its prompt already is), and at most fills the step to the rows it takes in one pass
(`default_ride_chunk`: 32 where every product is a dense bf16 one on AMX tiles, fewer where products cost per
row). Otherwise the chunk (`mix_chunk` tokens, `default_mix_chunk` by default) is a call of its own before the step;
a chunk before the prompt's last then only fills the cache (`cache_only`: no LM head, which reads the whole vocabulary's rows, and no layers after the last
Mamba / attention one). The group's rows enter at the step its last chunk runs. A chunked prefill equals a one-shot
prefill up to the order of float32 sums (tests/runtime/test_mixed_prefill.py, tests/runtime/cpu/test_mixed_step.py);
a group no longer than `mix_chunk` (default `default_mix_chunk`), one that joins an idle batch, or one left alone
because every running row ended, is prefilled at once (nobody waits).

Fixed-shape compiled steps ("compiled", "cuda-graphs") are captured for one cache shape: there the batch is
formed once (`elastic` is False), rows that end stay as masked rows until the last one ends, and nothing joins.
"""

from __future__ import annotations

import time

import torch

from vl.errors import GenerationOptionError
from vl.runtime.cache import HybridCache
from vl.runtime.decode_step import (_bucket, decode_mode, decode_step, default_mix_chunk, default_prefill_chunk,
                                   default_ride_chunk)
from vl.runtime.sampling import SamplingParams, apply_logit_bias, apply_repetition_penalty, draw

ELASTIC_MODES = ("fused", "modules", "static")
RIDE_SHARE = 0.6  # a riding chunk may add this share of the running rows' step (their gap stays under 2x)
POSITIONS_IN_PYTHON = ("fused", "modules")  # the other modes keep a fixed-shape cache and a tensor position


class _Seq:
    """One row: its key (the caller's name for it), token budget, controller, context, generated ids, the ids
    that end it (None: the batch's) and how many tokens come before a stop id may (`min_tokens`)."""

    __slots__ = ("key", "budget", "controller", "context", "history", "ended", "stops", "min_tokens")

    def __init__(self, key, budget: int, controller, context: list[int], stops: frozenset | None = None,
                 min_tokens: int = 0):
        self.key, self.budget, self.controller, self.context = key, budget, controller, context
        self.stops, self.min_tokens = stops, min_tokens
        self.history: list[int] = []
        self.ended: str | None = None  # "stop" (a stop id), "length" (its budget), "caller" (`finish`)

    def remaining(self) -> int:
        return self.budget - len(self.history)


class _Prefill:
    """A joining group's prompt, prefilled a chunk per step into its own cache: ids (k, t) or embeddings (k, t, d),
    the left-padding mask, how many positions are done, and the seconds spent so far."""

    __slots__ = ("cache", "input_ids", "inputs_embeds", "mask", "length", "done", "seqs", "logits", "seconds")

    def __init__(self, cache, input_ids, inputs_embeds, mask, seqs):
        self.cache, self.input_ids, self.inputs_embeds, self.mask, self.seqs = (cache, input_ids, inputs_embeds,
                                                                                mask, seqs)
        x = input_ids if inputs_embeds is None else inputs_embeds
        self.length, self.done, self.logits, self.seconds = x.shape[1], 0, None, 0.0


class DecodeBatch:
    """Rows that decode together. `join` prefills new rows (together, left-padded); `step` decodes one token
    for every running row, first letting ended rows leave and joined rows enter, and returns `{key: token}`;
    `finish(key)` ends a row from outside (a stop string, a cancel, a deadline)."""

    def __init__(self, lm, *, params: SamplingParams = SamplingParams(), stop_ids=(), prefill_chunk: int | None = None,
                 context_length: int | None = None, decode: str = "fused", mix_chunk: int | None = None):
        decode = decode_mode(decode)  # "eager" warns and reads as "fused"; an unknown mode is refused
        self.lm, self.params, self.decode = lm, params, decode
        self.context_length = context_length or lm.config.max_position_embeddings
        self.step_fn = decode_step(lm, decode)
        self.static = decode not in POSITIONS_IN_PYTHON
        self.elastic = decode in ELASTIC_MODES
        self.stop = frozenset(int(s) for s in stop_ids)
        if prefill_chunk is not None and prefill_chunk < 1:
            raise GenerationOptionError(f"prefill_chunk must be >= 1, found {prefill_chunk}")
        self.prefill_chunk = prefill_chunk
        if mix_chunk is not None and mix_chunk < 0:
            raise GenerationOptionError(f"mix_chunk must be >= 0 (0: a joining prompt is prefilled at once), found "
                                        f"{mix_chunk}")
        self.mix_chunk = mix_chunk  # None: default_mix_chunk of the model's device
        if getattr(lm.config, "vocab_size", None):
            params.check_vocab(lm.config.vocab_size)  # a bad logit_bias id fails here, before any row decodes
        self.gen = torch.Generator(device="cpu")
        if params.seed is not None:
            self.gen.manual_seed(params.seed)
        else:
            self.gen.seed()
        self.cache: HybridCache | None = None
        self.seqs: list[_Seq] = []  # one per cache row
        self.logits = None  # (rows, vocab) to sample from at the next step, when nothing is to be fed
        self.feed = None  # (rows,) the last sampled tokens, fed at the next step
        self.pending: list[tuple[HybridCache, torch.Tensor, list[_Seq]]] = []  # prefilled, not yet merged
        self.prefilling: list[_Prefill] = []  # joined while rows decode: a chunk per step, oldest first
        self.prefill_s: dict = {}  # key -> seconds its group's prefill took (read and removed by the caller)
        self.pos = None  # fixed-shape steps: the next position as a 0-d tensor
        self.started = False
        self._usual_s = None  # the running rows' fused step alone, seconds (moving average)
        self._token_s = None  # what a riding chunk's token adds to it, seconds (moving average)

    # --- who is in ---------------------------------------------------------------------------------
    def live(self) -> list:
        """Keys of the rows that have not ended (running or joined, not yet merged)."""
        return [s.key for s in self._all() if s.ended is None]

    def _all(self):
        yield from self.seqs
        for _, _, seqs in self.pending:
            yield from seqs
        for job in self.prefilling:
            yield from job.seqs

    def fits(self, prompt_lengths: list[int], budgets: list[int]) -> bool:
        """Whether rows with these prompt lengths and token budgets may join now: the padded length plus the
        largest remaining budget stays within the context (each row alone fits), so the cache stays bounded."""
        if not self.elastic and (self.started or self.pending or self.seqs):
            return False
        live = [s for s in self._all() if s.ended is None]
        lengths = list(prompt_lengths) + [c.length for c, _, _ in self.pending] + [j.length for j in self.prefilling]
        if self.cache is not None and any(s.ended is None for s in self.seqs):
            lengths.append(self.cache.length + (self.feed is not None))  # the next step adds a position
        rooms = list(budgets) + [s.remaining() for s in live]
        return max(lengths) + max(rooms) <= self.context_length

    # --- joining -----------------------------------------------------------------------------------
    @torch.no_grad()
    def join(self, keys: list, budgets: list[int], *, input_ids=None, inputs_embeds=None, attention_mask=None,
             contexts: list[list[int]] | None = None, controllers: list | None = None,
             ignore_eos: list[bool] | None = None, min_tokens: list[int] | None = None) -> None:
        """Prefill rows now ((k, t) ids or (k, t, d) embeddings, left-padded with `attention_mask`); they take
        their first token at the next `step`. `contexts[i]`: the ids the repetition penalty counts as seen.
        `ignore_eos[i]`: no stop id ends row i (its budget, or the caller, does); `min_tokens[i]`: the stop ids are
        masked out of row i's logits until it has that many tokens."""
        x = input_ids if inputs_embeds is None else inputs_embeds
        k, t = x.shape[0], x.shape[1]
        if not (len(keys) == len(budgets) == k):
            raise GenerationOptionError(f"{len(keys)} keys and {len(budgets)} budgets for {k} rows")
        if not self.elastic and (self.started or self.pending or self.seqs):
            raise GenerationOptionError(f"rows cannot join a running batch under decode={self.decode!r}")
        cfg, device = self.lm.config, x.device
        dtype = inputs_embeds.dtype if inputs_embeds is not None else self.lm.backbone.embeddings.weight.dtype
        alone = not self.seqs and not self.pending and not self.prefilling  # the cache is this group's: give it
        # its decode room now
        room = max(budgets) + 1
        capacity = (_bucket(t + room) if self.static else t + room) if alone else t
        cache = HybridCache(cfg, k, capacity, dtype=dtype, device=device)
        if alone and self.decode == "cuda-graphs":
            for tensor in cache.tensors():
                torch._dynamo.mark_static_address(tensor)
        seqs = [_Seq(key, int(n), None if controllers is None else controllers[i],
                     [] if contexts is None else list(contexts[i]),
                     frozenset() if ignore_eos is not None and ignore_eos[i] else None,
                     0 if min_tokens is None else int(min_tokens[i]))
                for i, (key, n) in enumerate(zip(keys, budgets))]
        job = _Prefill(cache, input_ids, inputs_embeds, attention_mask, seqs)
        if self._running() and self._mix_chunk(device) and t > self._mix_chunk(device):
            self.prefilling.append(job)  # a chunk per step from the next one on (`_prefill_some`)
            return
        self._prefill(job, t)
        if alone:
            self.cache, self.seqs, self.logits, self.feed = cache, seqs, job.logits, None
            self._reset_pos()
        else:
            self.pending.append((cache, job.logits, seqs))

    def _running(self) -> bool:
        return any(s.ended is None for s in self.seqs)

    def _mix_chunk(self, device) -> int:
        return default_mix_chunk(device) if self.mix_chunk is None else self.mix_chunk

    def _prefill(self, job: _Prefill, tokens: int) -> None:
        """Run `tokens` more positions of a group's prompt, in calls of at most `prefill_chunk`; when the prompt is
        done, `job.logits` holds each row's last logits and `prefill_s` the seconds it took."""
        x = job.input_ids if job.inputs_embeds is None else job.inputs_embeds
        chunk = self.prefill_chunk or default_prefill_chunk(x.device, self.lm.config, x.shape[0])
        end = min(job.length, job.done + tokens)
        t0 = time.perf_counter()
        for start in range(job.done, end, chunk):
            part = slice(start, min(start + chunk, end))
            last = part.stop == job.length  # only the prompt's last chunk needs logits (the others fill the cache)
            out = self.lm(input_ids=None if job.inputs_embeds is not None else job.input_ids[:, part],
                          inputs_embeds=None if job.inputs_embeds is None else job.inputs_embeds[:, part],
                          cache=job.cache, attention_mask=None if job.mask is None else job.mask[:, part],
                          logits_to_keep=1, cache_only=not last)
            if last:
                job.logits = out.logits[:, -1]
        self._advanced(job, end, time.perf_counter() - t0)

    def _advanced(self, job: _Prefill, done: int, seconds: float) -> None:
        job.done, job.seconds = done, job.seconds + seconds
        if job.done == job.length:
            job.input_ids = job.inputs_embeds = job.mask = None  # the cache holds the prompt from now on
            self.prefill_s.update((s.key, job.seconds) for s in job.seqs)

    def _prefill_some(self) -> None:
        """Before a step: the oldest group runs one chunk while rows decode (every group runs to its end when none
        does: nobody waits); finished groups wait to be merged."""
        running = self._running()
        for job in list(self.prefilling):
            self._prefill(job, self._mix_chunk(job.cache.valid.device) if running else job.length)
            self._if_done(job)
            if running:
                break

    def _if_done(self, job: _Prefill) -> None:
        if job.done == job.length:
            self.prefilling.remove(job)
            self.pending.append((job.cache, job.logits, job.seqs))

    # --- a joining prompt's chunk inside the step --------------------------------------------------
    def _rider(self) -> _Prefill | None:
        """The group whose next chunk rides along with this step (one forward for both: the fused CPU step
        takes the chunk's tokens as extra rows of its products, vl/runtime/cpu/decode.py `run_step`), or None:
        the chunk and the step are two calls. It rides when rows decode this step, the step is the fused one, and
        the oldest group is one unpadded row whose embeddings are in the model dtype."""
        mix = getattr(self.step_fn, "mix", None)
        if not self.prefilling or mix is None or self.feed is None or not self._running() or self.mix_chunk == 0:
            return None
        job = self.prefilling[0]
        if job.cache.batch_size != 1 or (job.mask is not None and not bool(job.mask.all())):
            return None
        if job.inputs_embeds is not None and job.inputs_embeds.dtype != self.lm.backbone.embeddings.weight.dtype:
            return None
        return job

    def _ride_tokens(self) -> int:
        """The default chunk that rides with this step: as many tokens as keep the step within RIDE_SHARE more than
        the running rows' own step (both measured as the batch goes: a chunk's tokens cost more as its prompt grows,
        its attention reading every key before them), and no more than fill the step to the rows it takes in one
        pass (`default_ride_chunk`). Which tokens ride together does not change a bit of the joiner's cache
        (tests/runtime/cpu/test_mixed_step.py), so the sizes may follow the clock."""
        most = default_ride_chunk(len(self.seqs), self.step_fn.ride_rows)
        if self._usual_s is None or not self._token_s:
            return most
        return max(1, min(most, int(RIDE_SHARE * self._usual_s / self._token_s)))

    def _ride(self, job: _Prefill, tok) -> torch.Tensor | None:
        """One step of the running rows with `job`'s next chunk inside -> their logits, or None (nothing done). The
        joiner's prefill seconds count the steps it rode in (its chunk and the running rows' tokens together)."""
        n = self.mix_chunk or self._ride_tokens()
        part = slice(job.done, min(job.length, job.done + n))
        last = part.stop == job.length
        t0 = time.perf_counter()
        x = self.lm.embed(job.input_ids[0, part]) if job.inputs_embeds is None else job.inputs_embeds[0, part]
        logits = self.step_fn.mix(tok, self.cache, x, job.cache, last)
        if logits is None:
            return None
        if last:
            job.logits, logits = logits[-1:], logits[:-1]
        seconds = time.perf_counter() - t0
        if self._usual_s is not None:  # what a token of the chunk added to the step
            self._token_s = _ema(self._token_s, max(seconds - self._usual_s, 0.0) / (part.stop - part.start))
        self._advanced(job, part.stop, seconds)
        self._if_done(job)
        return logits

    def finish(self, key) -> None:
        for s in self._all():
            if s.key == key and s.ended is None:
                s.ended = "caller"

    def ended(self, key) -> str | None:
        for s in self._all():
            if s.key == key:
                return s.ended
        return None

    def states(self) -> dict:
        """`{key: ended}` for every row in the batch (None: still running), in one pass."""
        return {s.key: s.ended for s in self._all()}

    # --- one step ----------------------------------------------------------------------------------
    @torch.no_grad()
    def step(self) -> dict | None:
        """Decode one token for every running row -> `{key: token}`; None once no row is left."""
        if not any(s.ended is None for s in self._all()):
            return None
        self.started = True
        logits = self.logits
        if self.feed is not None and self.elastic:
            self._leave()
        rider = None
        if self.prefilling:
            self.prefilling = [j for j in self.prefilling if any(s.ended is None for s in j.seqs)]
            rider = self._rider()
            if rider is None and self.prefilling:
                self._prefill_some()
        if self.feed is not None:
            if self.seqs:
                feed = self.feed
                if not (feed.is_cpu and self.cache.valid.is_cpu):  # (a CPU cache needs no call: ~30 us cold)
                    feed = feed.to(self.cache.valid.device)
                logits = None if rider is None else self._ride(rider, feed[:, None])
                if logits is None:
                    if rider is not None:
                        self._prefill_some()  # the fused step could not take the chunk: two calls
                    t0 = time.perf_counter()
                    logits = self.step_fn(feed[:, None], self.cache, self.pos)
                    self._usual_s = _ema(self._usual_s, time.perf_counter() - t0)
                if self.static:
                    self.pos.add_(1)
                    self.cache.length += 1  # the fixed-shape step does not count positions
            self.feed = None
        if self.pending:
            logits = self._merge(logits)
        self.logits = None
        logits = apply_logit_bias(logits, self.params.logit_bias)  # before the penalty, as vLLM's sampler
        if self.params.repetition_penalty != 1.0:
            logits = logits.clone()
            for i, s in enumerate(self.seqs):
                seen = torch.tensor([s.context + s.history], dtype=torch.long, device=logits.device)
                logits[i:i + 1] = apply_repetition_penalty(logits[i:i + 1], seen, self.params.repetition_penalty)
        logits = self._mask_early_stops(logits)
        nxt = draw(logits, self.params, self.gen)
        if not nxt.is_cpu:
            nxt = nxt.cpu()
        toks = nxt.tolist()  # one conversion, not one tensor index per row
        out = {}
        for i, s in enumerate(self.seqs):
            if s.ended is not None:  # a masked row (fixed-shape batches only): fed, never reported
                continue
            tok = toks[i]
            if s.controller is not None:
                forced = s.controller.next_forced(s.history)
                if forced is not None and forced != tok:
                    tok = nxt[i] = forced  # the forced token is what the row is fed next
                s.controller.observe(tok)
            s.history.append(tok)
            out[s.key] = tok
            if tok in (self.stop if s.stops is None else s.stops):
                s.ended = "stop"
            elif not s.remaining():
                s.ended = "length"
        self.feed = nxt
        return out

    def _mask_early_stops(self, logits):
        """Rows short of their `min_tokens` cannot take a stop id now: its logits become -inf before sampling or
        argmax (vLLM's MinTokensLogitsProcessor)."""
        rows = [i for i, s in enumerate(self.seqs) if s.ended is None and len(s.history) < s.min_tokens]
        if not rows or not self.stop:
            return logits
        logits = logits.clone()
        ids = torch.tensor(sorted(t for t in self.stop if t < logits.shape[-1]), dtype=torch.long,
                           device=logits.device)
        logits[torch.tensor(rows, device=logits.device)[:, None], ids[None, :]] = -torch.inf
        return logits

    def _room(self, seqs) -> int:
        return max((s.remaining() for s in seqs if s.ended is None), default=0) + 1

    def _leave(self) -> None:
        """Rows that ended leave the cache (and the columns only they used go with them)."""
        keep = [i for i, s in enumerate(self.seqs) if s.ended is None]
        if len(keep) == len(self.seqs):
            return
        if not keep:
            self.cache, self.seqs, self.feed = None, [], None
            return
        seqs = [self.seqs[i] for i in keep]
        self.cache = HybridCache.repack([(self.cache, keep)], self._room(seqs), bucket=self._bucketing())
        self.seqs, self.feed = seqs, self.feed[keep]
        self._reset_pos()

    def _merge(self, logits):
        """Joined rows enter after the running ones; their prefill logits give their first token."""
        parts = [(self.cache, list(range(len(self.seqs))))] if self.seqs else []
        parts += [(c, list(range(len(seqs)))) for c, _, seqs in self.pending]
        seqs = self.seqs + [s for _, _, group in self.pending for s in group]
        self.cache = HybridCache.repack(parts, self._room(seqs), bucket=self._bucketing())
        logits = torch.cat(([logits] if self.seqs else []) + [lg for _, lg, _ in self.pending])
        self.seqs, self.pending = seqs, []
        self._reset_pos()
        return logits

    def _bucketing(self):
        return _bucket if self.static else None

    def _reset_pos(self):
        if self.static and self.cache is not None:
            self.pos = torch.tensor(self.cache.length, device=self.cache.valid.device)


def _ema(old: float | None, new: float, keep: float = 0.5) -> float:
    return new if old is None else keep * old + (1 - keep) * new
