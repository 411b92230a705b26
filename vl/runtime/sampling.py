"""Sampling as pure functions of logits (nanochat / gpt-fast style): no model, no state but a torch.Generator.

Order of operations matches transformers' default logits-processor order: repetition penalty, then
temperature, then top-k, then top-p; greedy when temperature == 0.
"""

from __future__ import annotations

from dataclasses import dataclass, fields

import torch

from vl.errors import GenerationOptionError


@dataclass(frozen=True)
class SamplingParams:
    temperature: float = 0.0  # 0 = greedy
    top_k: int = 0  # 0 = off
    top_p: float = 1.0  # 1 = off
    repetition_penalty: float = 1.0  # 1 = off (CTRL-style: divide positive logits, multiply negative ones)
    seed: int | None = None

    def __post_init__(self):
        if not (isinstance(self.temperature, (int, float)) and self.temperature >= 0):
            raise GenerationOptionError(f"temperature must be >= 0, found {self.temperature!r}")
        if not (isinstance(self.top_k, int) and self.top_k >= 0):
            raise GenerationOptionError(f"top_k must be an int >= 0, found {self.top_k!r}")
        if not (isinstance(self.top_p, (int, float)) and 0 < self.top_p <= 1):
            raise GenerationOptionError(f"top_p must be in (0, 1], found {self.top_p!r}")
        if not (isinstance(self.repetition_penalty, (int, float)) and self.repetition_penalty > 0):
            raise GenerationOptionError(f"repetition_penalty must be > 0, found {self.repetition_penalty!r}")

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


def apply_repetition_penalty(logits, seen_ids, penalty: float):
    """logits (b, v); seen_ids (b, n) token ids already in the sequence (prompt and output)."""
    if penalty == 1.0 or seen_ids.numel() == 0:
        return logits
    picked = logits.gather(1, seen_ids)
    picked = torch.where(picked > 0, picked / penalty, picked * penalty)
    return logits.scatter(1, seen_ids, picked)


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


def sample(logits, params: SamplingParams, seen_ids=None, generator: torch.Generator | None = None):
    """logits (b, v) fp32 -> next ids (b,)."""
    if logits.dtype is not torch.float32:
        logits = logits.float()
    if seen_ids is not None:
        logits = apply_repetition_penalty(logits, seen_ids, params.repetition_penalty)
    if params.greedy:
        return logits.argmax(-1)
    logits = top_p_filter(top_k_filter(logits / params.temperature, params.top_k), params.top_p)
    probs = logits.softmax(-1)
    return torch.multinomial(probs, 1, generator=generator).squeeze(-1)
