"""OCRBench v1 (1000 questions): substring correctness per category (docs/eval_scoring.md §5;
LE tasks/ocrbench/utils.py, VK OCRBench.evaluate).

LE headline `ocrbench_accuracy` = correct / 1000, ALWAYS 1000 (a `--limit` run is understated; kept,
and `accuracy_over_scored` is given beside it, labelled). LE's module-level score dict that
double-counts when aggregated twice in one process is NOT ported: that is a harness bug, not a
scoring rule, and re-scoring here is a pure function. VK's "Final Score" (0-1000) and per-group sums
are given under "vk_style_totals" (computed from the LE-scored items: VK itself does not fold
full-width characters, which rarely matters). OCRBench v2 is a different benchmark and is not covered.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from eval.data import Item
from eval.metrics import ocrbench_correct
from eval.tasks import RecordError, Task

RECOGNITION = ("Regular Text Recognition", "Irregular Text Recognition", "Artistic Text Recognition",
               "Handwriting Recognition", "Digit String Recognition", "Non-Semantic Text Recognition")
OTHER = ("Scene Text-centric VQA", "Doc-oriented VQA", "Key Information Extraction",
         "Handwritten Mathematical Expression Recognition")
QUESTION_TYPES = RECOGNITION + OTHER
TOTALS = {**{t: 50 for t in RECOGNITION}, "Scene Text-centric VQA": 200, "Doc-oriented VQA": 200,
          "Key Information Extraction": 200, "Handwritten Mathematical Expression Recognition": 100}
LE_DIVISOR = 1000


class OCRBench(Task):
    name = "ocrbench"
    reference = "lmms-eval ocrbench (test)"
    dataset = "echo840/OCRBench, split test"
    metric = "ocrbench_accuracy"
    scale = "0-1"
    max_new_tokens = 128
    record_fields = ("question_type", "dataset")

    def prompt_text(self, item: Item) -> str:
        return item.question.strip()  # LE: no pre/post prompt, question stripped

    def score_record(self, record: Mapping[str, Any]) -> dict:
        if record["question_type"] not in TOTALS:
            raise RecordError(f"ocrbench: record {record['id']!r}: unknown question_type "
                              f"{record['question_type']!r}; expected one of {list(QUESTION_TYPES)}")
        hme = record["dataset"] == "HME100k"  # LE keys the math rule on the source dataset name
        return {"score": 1.0 if ocrbench_correct(record["prediction"], record["answers"], hme=hme) else 0.0}

    def aggregate(self, records: Sequence[Mapping[str, Any]], results: Sequence[Mapping[str, Any]]) -> dict:
        correct = dict.fromkeys(QUESTION_TYPES, 0)
        count = dict.fromkeys(QUESTION_TYPES, 0)
        for record, result in zip(records, results):
            correct[record["question_type"]] += int(result["score"])
            count[record["question_type"]] += 1
        final = sum(correct.values())
        recognition = sum(correct[t] for t in RECOGNITION)
        return {
            "score": final / LE_DIVISOR,
            "correct": final,
            "accuracy_over_scored": final / len(results) if results else 0.0,
            "categories": {"question_type": {t: {"score": correct[t] / count[t] if count[t] else 0.0,
                                                 "correct": correct[t], "n": count[t], "total": TOTALS[t]}
                                             for t in QUESTION_TYPES}},
            "vk_style_totals": {"Final Score": final, "Final Score Norm": final / 10, "Text Recognition": recognition,
                   "Scene Text-centric VQA": correct["Scene Text-centric VQA"],
                   "Doc-oriented VQA": correct["Doc-oriented VQA"],
                   "Key Information Extraction": correct["Key Information Extraction"],
                   "Handwritten Mathematical Expression Recognition":
                       correct["Handwritten Mathematical Expression Recognition"]},
        }
