"""Held-out synthetic documents of the demo model (data_recipes.synthetic, kind "document").

No reference harness: this is the project's own check that the shipped demo model learned its
families. Record format (one JSON object per line, what `vl eval make-data --out DIR` writes to
`DIR/document_test.jsonl` through `data_recipes.synthetic.export_split`; media paths are relative to the
JSONL's folder):

    {"id": "...", "family": "doc_total", "question": "What is the total?", "answer": "42",
     "content": [{"type": "image", "image": "media/x.png"}]          # or "pdf": "media/x.pdf"
     "chance": 0.01, ...}                                            # extra keys are kept as fields

`answers` (a list) may replace `answer`; `image` / `images` / `pdf` / `video` columns work too.
Scoring: exact match after `eval.metrics.normalize_exact` (NFKC, lowercase, whitespace collapsed,
surrounding punctuation/quotes dropped) against any answer. Headline: accuracy 0-1 over all items;
per-family accuracy beside the family's chance level; the macro mean over families is labelled.
The prompt is the question verbatim (no suffix), so it matches the training format.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from eval.metrics import exact_match
from eval.tasks import Task, category_means, mean_score


class SyntheticDocs(Task):
    name = "synthetic_docs"
    reference = "project-own held-out set (data_recipes.synthetic, split test); no external harness"
    dataset = "`vl eval make-data --out DIR` -> DIR/document_test.jsonl (data_recipes.synthetic, split test)"
    made_by = "document"
    metric = "exact_match_normalized"
    scale = "0-1"
    max_new_tokens = 32
    max_new_tokens_source = "pinned by this project"
    record_fields = ("family",)
    category_fields = ("family",)

    def prediction_record(self, item, prediction: str, **extra: Any) -> dict:
        record = super().prediction_record(item, prediction, **extra)
        if "chance" in item.fields:
            record["chance"] = item.fields["chance"]
        return record

    def score_record(self, record: Mapping[str, Any]) -> dict:
        return {"score": exact_match(record["prediction"], record["answers"])}

    def aggregate(self, records: Sequence[Mapping[str, Any]], results: Sequence[Mapping[str, Any]]) -> dict:
        categories = category_means(records, results, self.category_fields)
        for family, entry in categories["family"].items():
            chances = [r["chance"] for r in records if r.get("family") == family and r.get("chance") is not None]
            entry["chance"] = sum(chances) / len(chances) if chances else None
        families = categories["family"].values()
        return {"score": mean_score(results), "categories": categories,
                "macro_over_families": sum(e["score"] for e in families) / len(families) if families else 0.0}
