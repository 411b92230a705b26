"""MLVU multiple choice (docs/eval_scoring.md §8; LE tasks/mlvu, VK vlmeval/dataset/mlvu.py).

Prompt: the dataset question (it already lists the options) + `\\nOnly give the best option.\\nBest
option: (`; the open parenthesis primes a letter. Extraction: LE `extract_mcq_answer` (A-D); correct
iff the letter equals the gold answer (case-sensitive). Headline: LE's MACRO mean of per-type
accuracies in percent over the fixed type list, dividing by 7 (dev) / 9 (test) even when a type
has no items. The micro "M-Avg" (VK style, what MLVU papers report) is computed from the same
records and labelled; the two can differ by several points.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from typing import Any

from eval.data import Item, MediaRef, resolve_media_path, row_to_item
from eval.metrics import macro_accuracy, mcq_extract_le, micro_accuracy
from eval.tasks import RecordError, Task

CHOICES = ("A", "B", "C", "D")


class MLVUDev(Task):
    name = "mlvu_dev"
    reference = "lmms-eval mlvu_dev (split test of sy1998/MLVU_dev)"
    dataset = "sy1998/MLVU_dev, split test; videos at <media_root>/<video_name>"
    metric = "mlvu_percetion_score"  # sic, the harness name
    scale = "percent"
    media_kind = "video"
    post_prompt = "\nOnly give the best option.\nBest option: ("
    max_new_tokens = 16
    record_fields = ("task_type",)
    types: tuple[str, ...] = ("anomaly_reco", "count", "ego", "needle", "order", "plotQA", "topic_reasoning")

    def item_from_row(self, row: Mapping[str, Any], index: int, media_root: str | os.PathLike) -> Item:
        item = row_to_item(row, index, media_root, id_keys=self.id_keys)
        if item.media or row.get("video_name") is None:
            return item
        ref = MediaRef("video", path=resolve_media_path(str(row["video_name"]), media_root),
                       name=str(row["video_name"]))
        return Item(item.id, item.question, item.answers, (ref,), item.fields)

    def score_record(self, record: Mapping[str, Any]) -> dict:
        if record["task_type"] not in self.types:
            raise RecordError(f"{self.name}: record {record['id']!r}: unknown task_type "
                              f"{record['task_type']!r}; expected one of {list(self.types)}")
        extracted = mcq_extract_le(record["prediction"], list(CHOICES))
        return {"score": 1.0 if extracted == record["answers"][0] else 0.0, "extracted": extracted}

    def error_result(self, record: Mapping[str, Any]) -> dict:
        return {"score": 0.0, "error": True, "extracted": ""}

    def aggregate(self, records: Sequence[Mapping[str, Any]], results: Sequence[Mapping[str, Any]]) -> dict:
        counts = {t: [0, 0] for t in self.types}
        for record, result in zip(records, results):
            counts[record["task_type"]][0] += int(result["score"])
            counts[record["task_type"]][1] += 1
        pairs = {t: (c, n) for t, (c, n) in counts.items()}
        return {"score": macro_accuracy(pairs, self.types),
                "averaging": f"macro over {len(self.types)} fixed task types (LE); empty types count as 0",
                "m_avg_micro": micro_accuracy(pairs),
                "m_avg_micro_note": "VK-style pooled accuracy over the same records; not the headline",
                "categories": {"task_type": {t: {"score": 100.0 * c / n if n else 0.0, "correct": c, "n": n}
                                             for t, (c, n) in pairs.items()}}}


class MLVUTest(MLVUDev):
    name = "mlvu_test"
    reference = "lmms-eval mlvu_test"
    dataset = "MLVU test split as loaded by lmms-eval mlvu_test.yaml"
    types = ("anomaly_reco", "count", "ego", "needleQA", "order", "plotQA", "sportsQA", "topic_reasoning",
             "tutorialQA")
