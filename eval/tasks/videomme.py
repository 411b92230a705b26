"""Video-MME (multiple choice A-D, no subtitles): docs/eval_scoring.md §7; LE tasks/videomme.

Prompt: LE `videomme_doc_to_text` (the "subtitles" wording is in the harness even without subtitles;
the blank line comes from the post_prompt's leading newline). Extraction: LE's current
`extract_mcq_answer` with choices A-D; the headline is LE's micro accuracy in percent. The old
first-letter rule (old LE, VK without a judge) is reported beside it, labelled, only so VK / older
LE numbers can be reproduced. Frame count / fps are runner settings and go in the run header.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from eval.data import Item, MediaRef, resolve_media_path, row_to_item
from eval.metrics import mcq_extract_le, mcq_first_letter_old
from eval.tasks import RecordError, Task, category_means, mean_score

OPTION_PROMPT = ("Select the best answer to the following multiple-choice question based on the video and the "
                 "subtitles. Respond with only the letter (A, B, C, or D) of the correct option.")
CHOICES = ("A", "B", "C", "D")


class VideoMME(Task):
    name = "videomme"
    reference = "lmms-eval videomme (test)"
    dataset = "lmms-eval/Video-MME, split test; videos at <media_root>/data/<videoID>.mp4"
    metric = "videomme_perception_score"
    scale = "percent"
    media_kind = "video"
    post_prompt = "\nAnswer with the option's letter from the given choices directly."
    max_new_tokens = 16
    record_fields = ("options", "duration", "domain", "sub_category", "task_type")
    category_fields = ("duration", "domain", "sub_category", "task_type")
    id_keys = ("question_id", "id")

    def item_from_row(self, row: Mapping[str, Any], index: int, media_root: str | os.PathLike) -> Item:
        item = row_to_item(row, index, media_root, id_keys=self.id_keys)
        if item.media or row.get("videoID") is None:
            return item
        # LE looks for data/<videoID>.mp4, then .MP4, then .mkv; a missing file fails at decode time
        # as a per-item error instead of stopping the run.
        names = [f"data/{row['videoID']}{ext}" for ext in (".mp4", ".MP4", ".mkv")]
        name = next((n for n in names if (Path(media_root) / n).exists()), names[0])
        ref = MediaRef("video", path=resolve_media_path(name, media_root), name=name)
        return Item(item.id, item.question, item.answers, (ref,), item.fields)

    def prompt_text(self, item: Item) -> str:
        options = item.fields.get("options")
        if not isinstance(options, list) or not options:
            raise RecordError(f"videomme: item {item.id!r}: expected 'options' as a list like "
                              f"['A. ...', 'B. ...'], found {options!r}")
        question = item.question + "\n" + "\n".join(str(o) for o in options)
        return OPTION_PROMPT + "\n" + question + "\n" + self.post_prompt

    def score_record(self, record: Mapping[str, Any]) -> dict:
        gold = record["answers"][0]
        extracted = mcq_extract_le(record["prediction"], list(CHOICES))
        old = mcq_first_letter_old(record["prediction"])
        return {"score": 1.0 if extracted.lower() == gold.lower() else 0.0, "extracted": extracted,
                "score_first_letter_rule": 1.0 if old.lower() == gold.lower() else 0.0, "extracted_old": old}

    def error_result(self, record: Mapping[str, Any]) -> dict:
        return {"score": 0.0, "error": True, "extracted": "", "score_first_letter_rule": 0.0, "extracted_old": ""}

    def aggregate(self, records: Sequence[Mapping[str, Any]], results: Sequence[Mapping[str, Any]]) -> dict:
        old = [{"score": r["score_first_letter_rule"]} for r in results]
        return {"score": 100.0 * mean_score(results),
                "categories": category_means(records, results, self.category_fields, scale=100.0),
                "first_letter_rule_score": 100.0 * mean_score(old),
                "first_letter_rule_note": "old LE / VK extraction without a judge; not the headline"}
