"""What a chat request gives back: the stream's events, the stats, the final result (shared by the engine, the one
generation loop in vl/runtime/batch.py, the remote engine and the server)."""

from __future__ import annotations

from dataclasses import dataclass, field, fields


@dataclass
class Event:
    kind: str  # "reasoning" | "answer"
    text: str


def _in_process(default=None):
    """A field for callers in this process only (tensors, records): left out of `as_dict`, so `vl chat --json`
    and logs never print megabytes of pixels."""
    return field(default=default, repr=False, compare=False, metadata={"in_process": True})


@dataclass(slots=True)  # slots: an attribute not declared here is an AttributeError, not a silent extra
class Stats:
    """One request's counts and timings. Every field is declared here; a new one needs its line (and reaches
    `vl chat --json` by itself unless it is in-process only). `RemoteEngine` leaves at None what its server does
    not report."""

    prompt_tokens: int = 0  # tokens the LLM prefilled (after token reduction)
    vision_tokens_before: int = 0  # vision placeholder tokens before token reduction (skipped blank tiles included)
    vision_tokens_after: int = 0  # vision tokens the LLM saw after token reduction
    new_tokens: int = 0  # tokens generated, reasoning included
    time_to_first_token_s: float = 0.0  # from the request's start to its first generated token
    decode_tokens_per_s: float = 0.0  # generated tokens after the first, per second of decoding
    total_s: float = 0.0  # the whole request, media processing included
    peak_memory_bytes: int = 0  # CUDA: max allocated in this call; CPU: the process's peak RSS so far
    vision_cache_hits: int = 0  # media items whose tile vectors came from the engine's vision cache
    audio_tokens: int = 0  # audio placeholder tokens the LLM saw (models that hear: Nemotron 3 Nano Omni)
    # seconds per stage of this request: "media" (decode and preprocess), "vision" (tower, projector, reduction,
    # merge), "audio" (audio encoder and projector), "prefill" (its prefill call, shared by the rows that joined
    # together), "decode" (first token to the end); the stages before the first token add up to about its time
    stages_s: dict = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)  # what was reduced, clamped or skipped, in words
    reductions: list[dict] = field(default_factory=list)  # one record per token reduction applied (its `info`)
    # --- in process only: what the app draws (vl/runtime/engine.py, ui/runner.py); not in `as_dict` ---------------
    vision_keep: object = _in_process()  # (n_placeholders,) bool tensor | None: which vision tokens survived
    media_items: list = _in_process()  # [MediaInfo] of the request's media | None (UIEngine only)
    pixel_values: object = _in_process()  # (num_tiles, 3, S, S) tiles the vision tower saw | None (UIEngine only)

    def as_dict(self) -> dict:
        """Every reported field (all but the in-process ones), by name."""
        return {f.name: getattr(self, f.name) for f in fields(self) if not f.metadata.get("in_process")}


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
