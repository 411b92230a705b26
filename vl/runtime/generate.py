"""Token-level generation: chunked prefill into a static hybrid cache, then a decode loop.

The loop speaks tokens only (nanochat `engine.py`): it yields, per step, the new token of every row. It serves
`Engine.generate_ids` and the benchmarks' timing, which want no text; everything that answers prompts (chat, the
server, the transformers pipeline) goes through the one generation loop of vl/runtime/batch.py.
Per-row controllers may force tokens (the reasoning budget closes `</think>` this way); stop ids end a
row. Batched rows are left-padded, so Mamba states never see padding and results equal single runs.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass

import torch

from vl.errors import ContextLengthError, GenerationOptionError
from vl.runtime.decode_batch import DecodeBatch
from vl.runtime.decode_step import DECODE_MODES, decode_step, default_prefill_chunk  # noqa: F401 - re-exported
from vl.runtime.decode_step import decode_mode
from vl.runtime.sampling import SamplingParams


def left_pad(sequences: list[torch.Tensor], pad_id: int = 0):
    """1-D id tensors -> (ids (b, t), attention_mask (b, t)), left-padded."""
    t = max(len(s) for s in sequences)
    ids = torch.full((len(sequences), t), pad_id, dtype=torch.long)
    mask = torch.zeros(len(sequences), t, dtype=torch.long)
    for i, s in enumerate(sequences):
        if len(s):
            ids[i, t - len(s):], mask[i, t - len(s):] = s, 1
    return ids, mask


def left_pad_embeds(embeds: list[torch.Tensor]):
    """(t_i, d) embeddings -> ((b, t, d), attention_mask (b, t)), left-padded with zeros."""
    t = max(e.shape[0] for e in embeds)
    out = embeds[0].new_zeros(len(embeds), t, embeds[0].shape[-1])
    mask = torch.zeros(len(embeds), t, dtype=torch.long, device=out.device)
    for i, e in enumerate(embeds):
        out[i, t - e.shape[0]:], mask[i, t - e.shape[0]:] = e, 1
    return out, mask


@dataclass
class StepEvent:
    step: int
    tokens: list[int | None]  # new token per row; None once a row has finished
    finished: list[bool]


def check_lengths(prompt_len: int, max_new_tokens: int, context_length: int):
    if not isinstance(max_new_tokens, int) or isinstance(max_new_tokens, bool) or max_new_tokens < 1:
        raise GenerationOptionError(f"max_new_tokens must be a positive integer, found {max_new_tokens!r}")
    if prompt_len > context_length:
        raise ContextLengthError(f"the prompt has {prompt_len} tokens but the model's context is {context_length}; "
                                 f"shorten it (fewer pages, frames or tiles)")
    if prompt_len + max_new_tokens > context_length:
        raise ContextLengthError(f"the prompt has {prompt_len} tokens and max_new_tokens is {max_new_tokens}: "
                                 f"{prompt_len + max_new_tokens} exceeds the model's context of {context_length}; "
                                 f"lower max_new_tokens to at most {context_length - prompt_len}")


@torch.no_grad()
def generate_steps(lm, *, input_ids=None, inputs_embeds=None, attention_mask=None, max_new_tokens: int,
                   params: SamplingParams = SamplingParams(), stop_ids=(), prefill_chunk: int | None = None,
                   controllers: list | None = None, context_length: int | None = None, context_ids=None,
                   on_prefill_done: Callable[[], None] | None = None,
                   decode: str = "fused", finished: list[bool] | None = None) -> Iterator[StepEvent]:
    """Prefill then decode; yields one `StepEvent` per generated position.

    `lm` is a Nemotron-H LM (or anything with its forward signature and `.config`). `controllers[i]`, when
    given, has `.next_forced(row_ids) -> int | None` and `.observe(token_id)`; a forced token replaces the
    sampled one for that row. `context_ids` (b, n): the ids the repetition penalty counts as seen (defaults to
    input_ids; pass them when prefilling from embeddings). `decode`: see `decode_step`. `finished` (b,), when
    given, is the caller's own per-row flag list: setting a row's flag between steps ends that row (a client that
    went away, a stop string, the row's own token limit); the loop returns once every row has finished.
    """
    decode = decode_mode(decode, stacklevel=2)  # at the first next(), under no_grad's generator wrapper: the
    # warning blames the caller's loop
    x = input_ids if inputs_embeds is None else inputs_embeds
    b, t = x.shape[0], x.shape[1]
    check_lengths(t, max_new_tokens, context_length or lm.config.max_position_embeddings)
    if finished is None:
        finished = [False] * b
    elif len(finished) != b:
        raise GenerationOptionError(f"finished has {len(finished)} flags for a batch of {b} rows")
    batch = DecodeBatch(lm, params=params, stop_ids=stop_ids, prefill_chunk=prefill_chunk,
                        context_length=context_length, decode=decode)
    context_ids = input_ids if context_ids is None else context_ids
    contexts = (None if context_ids is None or params.repetition_penalty == 1.0
                else [row.tolist() for row in context_ids.cpu()])
    batch.join(list(range(b)), [max_new_tokens] * b, input_ids=input_ids, inputs_embeds=inputs_embeds,
               attention_mask=attention_mask, contexts=contexts, controllers=controllers)
    if on_prefill_done is not None:
        on_prefill_done()
    for step in range(max_new_tokens):
        for i in range(b):
            if finished[i]:
                batch.finish(i)
        out = batch.step()
        if out is None:
            return
        tokens: list[int | None] = [out.get(i) for i in range(b)]
        for i in out:
            if batch.ended(i) == "stop":
                finished[i] = True
        yield StepEvent(step, tokens, list(finished))
        if all(finished):
            return


def generate_ids(lm, input_ids, *, attention_mask=None, max_new_tokens: int = 32, stop_ids=(), decode: str = "fused",
                 **sampling):
    """Token level, no processor: -> new ids (b, n), rows that stopped early padded with their stop id."""
    decode = decode_mode(decode)
    params = SamplingParams.from_kwargs(**sampling)
    rows: list[list[int]] = [[] for _ in range(input_ids.shape[0])]
    for ev in generate_steps(lm, input_ids=input_ids, attention_mask=attention_mask, max_new_tokens=max_new_tokens,
                             params=params, stop_ids=stop_ids, decode=decode):
        for i, tok in enumerate(ev.tokens):
            if tok is not None:
                rows[i].append(tok)
    n = max(len(r) for r in rows)
    return torch.tensor([r + [r[-1]] * (n - len(r)) for r in rows], dtype=torch.long)
