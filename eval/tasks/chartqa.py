"""ChartQA test: relaxed accuracy (docs/eval_scoring.md §4; LE tasks/chartqa/utils.py).

LE scores the single `answer` against the generation with no strip (surrounding whitespace breaks
`%` handling and the string fallback) and prints `relaxed_overall` as a 0-1 mean, plus
`relaxed_human_split` (type == "human_test") and `relaxed_augmented_split` (every other type).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from eval.metrics import relaxed_correctness
from eval.tasks import RecordError, Task, category_means, mean_score


class ChartQA(Task):
    name = "chartqa"
    reference = "lmms-eval chartqa (test)"
    dataset = "lmms-lab-encoder/ChartQA, split test"
    metric = "relaxed_overall"
    scale = "0-1"
    post_prompt = "\nAnswer the question with a single word."
    max_new_tokens = 16
    record_fields = ("type",)
    category_fields = ("type",)

    def score_record(self, record: Mapping[str, Any]) -> dict:
        if len(record["answers"]) != 1:
            raise RecordError(f"chartqa: record {record['id']!r}: LE scores a single `answer`, found "
                              f"{len(record['answers'])} answers; store exactly one")
        return {"score": 1.0 if relaxed_correctness(record["prediction"], record["answers"][0]) else 0.0}

    def aggregate(self, records: Sequence[Mapping[str, Any]], results: Sequence[Mapping[str, Any]]) -> dict:
        human = [r for rec, r in zip(records, results) if rec["type"] == "human_test"]
        augmented = [r for rec, r in zip(records, results) if rec["type"] != "human_test"]
        return {"score": mean_score(results),
                "relaxed_human_split": mean_score(human) if human else None,
                "relaxed_augmented_split": mean_score(augmented) if augmented else None,
                "categories": category_means(records, results, self.category_fields)}
