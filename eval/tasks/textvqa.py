"""TextVQA validation: VQA accuracy over 10 answers (docs/eval_scoring.md §6; LE tasks/textvqa).

LE prompt quirk kept: `question.capitalize()` lowercases everything after the first character. OCR
tokens are off (LE default). LE prints `exact_match` as a 0-1 mean. The LE task sets no
max_new_tokens (the wrapper default applies), so this project pins one and records it.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from eval.data import Item
from eval.metrics import vqa_accuracy
from eval.tasks import Task


class TextVQAVal(Task):
    name = "textvqa_val"
    reference = "lmms-eval textvqa_val (validation)"
    dataset = "lmms-lab-encoder/textvqa, split validation"
    metric = "exact_match"
    scale = "0-1"
    post_prompt = "\nAnswer the question using a single word or phrase."
    max_new_tokens = 32
    max_new_tokens_source = "pinned by this project (LE textvqa sets none; wrapper default otherwise)"
    id_keys = ("question_id", "id")

    def prompt_text(self, item: Item) -> str:
        return f"{self.pre_prompt}{item.question.capitalize()}{self.post_prompt}"

    def score_record(self, record: Mapping[str, Any]) -> dict:
        return {"score": vqa_accuracy(record["prediction"], record["answers"])}
