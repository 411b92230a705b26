"""InfographicVQA validation: ANLS (docs/eval_scoring.md §2-§3; LE tasks/infovqa/infovqa_val.yaml).

Same scorer and prompt as DocVQA; LE prints a 0-1 mean. Test is submission-only.
"""

from __future__ import annotations

from eval.tasks.docvqa import DocVQAVal


class InfoVQAVal(DocVQAVal):
    name = "infovqa_val"
    reference = "lmms-eval infovqa_val (validation)"
    dataset = "lmms-lab-encoder/DocVQA config InfographicVQA, split validation"
    category_fields = ("answer_type",)  # optional in records
