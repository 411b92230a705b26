"""DocVQA validation: ANLS (docs/eval_scoring.md §2-§3; LE tasks/docvqa/docvqa_val.yaml).

LE prints `anls` as a 0-1 mean (VK multiplies by 100). The test split is submission-only in LE and
has no local score, so only validation is registered.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from eval.metrics import anls
from eval.tasks import Task


class DocVQAVal(Task):
    name = "docvqa_val"
    reference = "lmms-eval docvqa_val (validation)"
    dataset = "lmms-lab-encoder/DocVQA config DocVQA, split validation"
    metric = "anls"
    scale = "0-1"
    post_prompt = "\nAnswer the question using a single word or phrase."
    max_new_tokens = 32
    category_fields = ("question_types",)  # optional in records: a list per question in the dataset
    id_keys = ("questionId", "question_id", "id")

    def score_record(self, record: Mapping[str, Any]) -> dict:
        return {"score": anls(record["prediction"], record["answers"])}
