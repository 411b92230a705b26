"""What a chat request gives back: the stream's events, the stats, the final result (shared by the engine, the one
generation loop in vl/runtime/batch.py, the remote engine and the server)."""

from __future__ import annotations

from dataclasses import dataclass, field, fields


@dataclass
class Event:
    kind: str  # "reasoning" | "answer"
    text: str


@dataclass
class Stats:
    prompt_tokens: int = 0  # tokens the LLM prefilled (after token reduction)
    vision_tokens_before: int = 0
    vision_tokens_after: int = 0
    new_tokens: int = 0
    time_to_first_token_s: float = 0.0
    decode_tokens_per_s: float = 0.0
    total_s: float = 0.0
    peak_memory_bytes: int = 0  # CUDA: max allocated in this call; CPU: the process's peak RSS so far
    vision_cache_hits: int = 0
    notes: list[str] = field(default_factory=list)
    reductions: list[dict] = field(default_factory=list)

    def as_dict(self) -> dict:
        return {f.name: getattr(self, f.name) for f in fields(self)}  # not what a caller attached (tensors)


@dataclass
class ChatResult:
    text: str  # the whole completion as generated (reasoning, `</think>`, answer)
    reasoning: str
    answer: str
    token_ids: list[int]
    stats: Stats
    finish_reason: str  # "stop" | "length" | "stop_string" | "cancelled" | "timeout"
    reasoning_truncated: bool = False  # generation ended inside the think block: no answer


class ChatStream:
    """Iterator of `Event`s; `.result` holds the `ChatResult` once the iteration has finished."""

    def __init__(self, gen):
        self._gen, self.result = gen, None

    def __iter__(self):
        self.result = yield from self._gen
        return self.result
