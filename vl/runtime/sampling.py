"""Sampling as pure functions of logits (nanochat / gpt-fast style): no model, no state but a torch.Generator.

Order of operations follows vLLM's sampler (v1 `Sampler.forward`): the logit bias is added to the raw logits
(OpenAI's `logit_bias`), then the repetition penalty; greedy takes the argmax there (temperature == 0); a
sampled step divides by the temperature, then applies min-p (vLLM's `min_p`), top-k and top-p, in that order.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, fields

import torch

from vl.errors import GenerationOptionError

SEED_RANGE = (-(2**63), 2**64 - 1)  # what `torch.Generator.manual_seed` takes; anything else fails in the batch
LOGIT_BIAS_RANGE = (-100.0, 100.0)  # OpenAI's range for `logit_bias` values


@dataclass(frozen=True)
class SamplingParams:
    temperature: float = 0.0  # 0 = greedy
    top_k: int = 0  # 0 = off
    top_p: float = 1.0  # 1 = off
    repetition_penalty: float = 1.0  # 1 = off (CTRL-style: divide positive logits, multiply negative ones)
    seed: int | None = None
    min_p: float = 0.0  # 0 = off: keep tokens whose probability is at least min_p x the most likely one's
    logit_bias: tuple[tuple[int, float], ...] = ()  # (token id, added to its logit), sorted by id

    def __post_init__(self):
        if not (_number(self.temperature) and self.temperature >= 0):
            raise GenerationOptionError(f"temperature must be >= 0, found {self.temperature!r}")
        if not (_integer(self.top_k) and self.top_k >= 0):
            raise GenerationOptionError(f"top_k must be an int >= 0, found {self.top_k!r}")
        if not (_number(self.top_p) and 0 < self.top_p <= 1):
            raise GenerationOptionError(f"top_p must be in (0, 1], found {self.top_p!r}")
        if not (_number(self.repetition_penalty) and self.repetition_penalty > 0):
            raise GenerationOptionError(f"repetition_penalty must be > 0, found {self.repetition_penalty!r}")
        lo, hi = SEED_RANGE
        if self.seed is not None and not (_integer(self.seed) and lo <= self.seed <= hi):
            raise GenerationOptionError(f"seed must be an integer in [-2**63, 2**64 - 1] (what torch's generator "
                                        f"takes), found {self.seed!r}")
        if not (_number(self.min_p) and 0 <= self.min_p <= 1):
            raise GenerationOptionError(f"min_p must be in [0, 1], found {self.min_p!r}")
        bias = self.logit_bias
        if isinstance(bias, dict):  # {id: bias} as callers write it; kept as a sorted tuple (hashable, frozen)
            bias = tuple(sorted(bias.items(), key=lambda kv: kv[0] if _integer(kv[0]) else -1))
            object.__setattr__(self, "logit_bias", bias)
        blo, bhi = LOGIT_BIAS_RANGE
        for item in bias:
            if not (isinstance(item, tuple) and len(item) == 2 and _integer(item[0]) and item[0] >= 0
                    and _number(item[1]) and blo <= item[1] <= bhi):
                raise GenerationOptionError(f"logit_bias maps token ids (integers >= 0) to numbers in [-100, 100], "
                                            f"found {item!r}")
        if len({tid for tid, _ in bias}) != len(bias):
            raise GenerationOptionError("logit_bias names a token id twice")

    @classmethod
    def from_kwargs(cls, **kwargs) -> "SamplingParams":
        names = {f.name for f in fields(cls)}
        unknown = sorted(set(kwargs) - names)
        if unknown:
            raise GenerationOptionError(f"unknown sampling option(s) {unknown}; known: {sorted(names)}")
        return cls(**kwargs)

    @property
    def greedy(self) -> bool:
        return self.temperature == 0

    def check_vocab(self, vocab_size: int) -> None:
        """Token ids of `logit_bias` must index the model's logits."""
        bad = [tid for tid, _ in self.logit_bias if tid >= vocab_size]
        if bad:
            raise GenerationOptionError(f"logit_bias names token id(s) {bad[:5]} but this model's vocabulary has "
                                        f"{vocab_size} ids (0..{vocab_size - 1})")


def _number(x) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)


def _integer(x) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)


def apply_logit_bias(logits, bias: tuple[tuple[int, float], ...]):
    """logits (b, v) + the bias of each named id (every row), in float32."""
    if not bias:
        return logits
    logits = logits.float()
    ids = torch.tensor([tid for tid, _ in bias], dtype=torch.long, device=logits.device)
    values = torch.tensor([b for _, b in bias], dtype=logits.dtype, device=logits.device)
    if int(ids.max()) >= logits.shape[-1]:
        raise GenerationOptionError(f"logit_bias names token id {int(ids.max())} but the logits have "
                                    f"{logits.shape[-1]} ids")
    return logits.index_add(-1, ids, values.expand(logits.shape[0], -1))


def apply_repetition_penalty(logits, seen_ids, penalty: float):
    """logits (b, v); seen_ids (b, n) token ids already in the sequence (prompt and output)."""
    if penalty == 1.0 or seen_ids.numel() == 0:
        return logits
    picked = logits.gather(1, seen_ids)
    picked = torch.where(picked > 0, picked / penalty, picked * penalty)
    return logits.scatter(1, seen_ids, picked)


def min_p_filter(logits, p: float):
    """Keep tokens whose probability is at least p times the most likely token's (vLLM's `apply_min_p`)."""
    if p <= 0.0:
        return logits
    probs = logits.softmax(-1)
    floor = p * probs.amax(-1, keepdim=True)
    return logits.masked_fill(probs < floor, -torch.inf)


def top_k_filter(logits, k: int):
    if k <= 0 or k >= logits.shape[-1]:
        return logits
    kth = torch.topk(logits, k, dim=-1).values[..., -1:]
    return logits.masked_fill(logits < kth, -torch.inf)


def top_p_filter(logits, p: float):
    """Keep the smallest set of tokens whose probability mass reaches p (always at least one)."""
    if p >= 1.0:
        return logits
    sorted_logits, order = torch.sort(logits, descending=True, dim=-1)
    probs = sorted_logits.softmax(-1)
    drop = probs.cumsum(-1) - probs > p  # mass before this token already reaches p
    drop[..., 0] = False
    return logits.masked_fill(drop.scatter(-1, order, drop), -torch.inf)


def draw(logits, params: SamplingParams, generator: torch.Generator | None = None):
    """Processed logits (b, v) -> next ids (b,): argmax, or temperature, min-p, top-k, top-p and a draw (fp32)."""
    if logits.dtype is not torch.float32:
        logits = logits.float()
    if params.greedy:
        return logits.argmax(-1)
    logits = logits / params.temperature
    logits = top_p_filter(top_k_filter(min_p_filter(logits, params.min_p), params.top_k), params.top_p)
    probs = logits.softmax(-1)
    return torch.multinomial(probs, 1, generator=generator).squeeze(-1)


def sample(logits, params: SamplingParams, seen_ids=None, generator: torch.Generator | None = None):
    """logits (b, v) -> next ids (b,): the logit bias, the repetition penalty (when `seen_ids` is given), `draw`."""
    logits = apply_logit_bias(logits.float(), params.logit_bias)
    if seen_ids is not None:
        logits = apply_repetition_penalty(logits, seen_ids, params.repetition_penalty)
    return draw(logits, params, generator)
