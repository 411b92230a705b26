"""A deterministic stand-in model for runner tests (nanochat's mock-engine pattern): no weights, instant.

It answers from the prompt: a question containing `ANSWER=x` is answered `x` (so scores are not all 0),
anything else gets `no idea`. Faults are injected by words in the question: HANG sleeps (per-item timeout),
CRASH kills the worker process, BADINPUT raises a typed input error, FLAKY fails transiently the first
`flaky_failures` times. `fail_rate` adds seeded random transient failures to any call (row E4).
Token counts are fake but follow the settings: 16 vision tokens per media part, times (1 - EVS rate).
"""

from __future__ import annotations

import os
import random
import re
import time
from collections import Counter

from eval.backend import Generation, TransientError
from vl.errors import CorruptMediaError

FACTS = {"path": "/fake/model", "weights_digest": "w0", "config_digest": "c0", "files_digest": "f0",
         "dtype": "float32", "precision": "float32", "max_num_tiles": 12, "video_pruning_rate": 0.0}


def prompt_of(conversation) -> str:
    content = conversation[-1]["content"]
    return " ".join(p["text"] for p in content if p.get("type") == "text")


def media_count(conversation) -> int:
    return sum(1 for p in conversation[-1]["content"] if p.get("type") != "text")


class FakeBackend:
    def __init__(self, fail_rate: float = 0.0, seed: int = 0, delay_s: float = 0.0, flaky_failures: int = 1,
                 think: bool = False):
        self.rng = random.Random(seed)
        self.fail_rate, self.delay_s, self.flaky_failures, self.think = fail_rate, delay_s, flaky_failures, think
        self.calls = 0
        self.items = Counter()  # prompt -> conversations generated (successfully or not)
        self.batches: list[int] = []

    def info(self) -> dict:
        return {"pid": os.getpid()}

    def generate(self, conversations, settings):
        self.calls += 1
        self.batches.append(len(conversations))
        out = []
        for conv in conversations:
            text = prompt_of(conv)
            self.items[text] += 1
            if self.delay_s:
                time.sleep(self.delay_s)
            if "HANG" in text:
                time.sleep(3600)
            if "CRASH" in text:
                os._exit(1)
            if "BADINPUT" in text:
                raise CorruptMediaError(f"injected bad input in {text[:40]!r}")
            if "FLAKY" in text and self.items[text] <= self.flaky_failures:
                raise TransientError("injected flaky failure")
            if self.fail_rate and self.rng.random() < self.fail_rate:
                raise TransientError("injected transient failure")
            m = re.search(r"ANSWER=(\w+)", text)
            answer = m.group(1) if m else "no idea"
            raw = f"thinking about it</think>{answer}" if self.think else answer
            vision = 16 * media_count(conv)
            kept = round(vision * (1 - (settings.video_pruning_rate or 0.0)))
            out.append(Generation(raw, "stop", False, len(text.split()) + kept, vision, kept, 1))
        return out

    def close(self):
        pass


def make_fake(**kwargs) -> FakeBackend:
    """Factory for ProcessBackend tests (runs in the worker)."""
    return FakeBackend(**kwargs)
