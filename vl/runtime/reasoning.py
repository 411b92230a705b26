"""Reasoning budget: a client-side logits override, as NVIDIA NIM's "thinking budget" does it (docs/format.md §8.4).

Count the tokens generated inside the think block; once the budget is spent, allow a small grace to finish
the current line, then force the tokens of `</think>` so the model continues with its answer.
"""

from __future__ import annotations

from vl.processing.chat import THINK_CLOSE


class ReasoningBudget:
    def __init__(self, tokenizer, budget: int, prompt_opened_think: bool, grace: float = 0.1, min_grace: int = 4):
        self.tokenizer, self.budget = tokenizer, int(budget)
        self.grace = max(min_grace, int(grace * budget))
        self.in_reasoning = prompt_opened_think
        self.count = 0
        self.queue: list[int] = []
        self.forced = False  # whether the budget actually cut the reasoning
        self._recent: list[int] = []

    def _tail(self, history, n=6) -> str:
        return self.tokenizer.decode(history[-n:]) if history else ""

    def next_forced(self, history: list[int]) -> int | None:
        if self.queue:
            return self.queue.pop(0)
        if not self.in_reasoning or self.count < self.budget:
            return None
        tail = self._tail(history)
        at_line_start = not history or tail.endswith("\n")
        if at_line_start or self.count >= self.budget + self.grace:
            text = ("" if at_line_start else "\n") + THINK_CLOSE + "\n\n"
            self.queue = list(self.tokenizer.encode(text, add_special_tokens=False))
            self.forced = True
            return self.queue.pop(0)
        return None

    def observe(self, token_id: int):
        if not self.in_reasoning:
            return
        self.count += 1
        self._recent = (self._recent + [token_id])[-8:]
        if THINK_CLOSE in self.tokenizer.decode(self._recent):
            self.in_reasoning = False
