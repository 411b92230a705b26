"""Task interface and registry for batch evaluation.

A task owns everything that is benchmark-specific and model-free (docs/eval_scoring.md §2): the
harness prompt (`pre_prompt + question + post_prompt`, no extra per-benchmark prompt hacks), the
user message it builds from an `Item` (media first, then text), answer post-processing (reasoning
stripping only, LE `strip_reasoning_tags`), the per-item score, the aggregation on the reference
harness's scale, and the record fields it needs. The runner stays generic:

    task = get_task("docvqa_val")
    for item in eval.data.load_items(path, task):
        raw = engine.chat(task.build_messages(item), **task.generation_kwargs()).text
        record = task.prediction_record(item, task.postprocess(raw))   # appended to predictions.jsonl
    summary = eval.score.summarize(task, records)

Tasks are looked up lazily by name so importing this package imports no task module.
"""

from __future__ import annotations

import abc
import importlib
import os
from collections import defaultdict
from collections.abc import Mapping, Sequence
from typing import Any, ClassVar

from eval.data import Item, row_to_item
from vl.errors import InputError
from vl.processing.reasoning_text import strip_reasoning

HARNESS = "lmms-eval@75571cf"  # docs/eval_scoring.md §0: primary harness, pinned


class UnknownTaskError(InputError):
    code = "unknown_task"


class RecordError(InputError):
    """A predictions record lacks a field the task's scorer needs, or has the wrong type."""

    code = "bad_record"


class Task(abc.ABC):
    """Base class; subclasses set the class attributes and implement `score_record` / `aggregate`."""

    name: ClassVar[str]
    reference: ClassVar[str]  # harness task and split the numbers are comparable to
    dataset: ClassVar[str]  # the dataset the reference harness loads (for the run header)
    metric: ClassVar[str]  # the harness metric name
    scale: ClassVar[str]  # "0-1" or "percent": how the harness prints the headline
    media_kind: ClassVar[str] = "image"
    pre_prompt: ClassVar[str] = ""
    post_prompt: ClassVar[str] = ""
    max_new_tokens: ClassVar[int]
    max_new_tokens_source: ClassVar[str] = "harness task YAML"
    record_fields: ClassVar[tuple[str, ...]] = ()  # task fields copied into, and required in, records
    category_fields: ClassVar[tuple[str, ...]] = ()  # per-category breakdowns (list values count per entry)
    id_keys: ClassVar[tuple[str, ...]] = ("id", "question_id", "questionId", "qid", "index")
    made_by: ClassVar[str | None] = None  # the project's own sets: the `vl eval make-data` kind that writes them

    def missing_data_hint(self) -> str:
        """What to do when --data does not exist: the command that writes this task's data, where there is one."""
        if self.made_by is None:
            return f"{self.name} reads a local copy of {self.dataset} (docs/eval_scoring.md §2)"
        return (f"write it with `vl eval make-data --out DIR` (DIR/{self.made_by}_test.jsonl is {self.name}'s "
                "file; --per-family N for a smaller set)")

    # --- items and prompts --------------------------------------------------------------------
    def item_from_row(self, row: Mapping[str, Any], index: int, media_root: str | os.PathLike) -> Item:
        return row_to_item(row, index, media_root, id_keys=self.id_keys)

    def prompt_text(self, item: Item) -> str:
        return f"{self.pre_prompt}{item.question}{self.post_prompt}"

    def build_messages(self, item: Item) -> list[dict]:
        """One user turn in the transformers/OpenAI shape (docs/design.md §2): media, then text.
        Embedded media are passed as bytes; the processor decodes them behind its limits."""
        content = [{"type": ref.kind, ref.kind: ref.value()} for ref in item.media]
        content.append({"type": "text", "text": self.prompt_text(item)})
        return [{"role": "user", "content": content}]

    def generation_kwargs(self) -> dict:
        """Greedy, at the harness budget (docs/eval_scoring.md §1)."""
        return {"max_new_tokens": self.max_new_tokens, "temperature": 0.0}

    def header(self) -> dict:
        """The task part of the run header (docs/eval_scoring.md §0)."""
        return {"harness": HARNESS, "task": self.name, "reference": self.reference, "dataset": self.dataset,
                "metric": self.metric, "scale": self.scale, "pre_prompt": self.pre_prompt,
                "post_prompt": self.post_prompt, "max_new_tokens": self.max_new_tokens,
                "max_new_tokens_source": self.max_new_tokens_source}

    # --- answers -------------------------------------------------------------------------------
    def postprocess(self, raw: str) -> str:
        """LE strip_reasoning_tags (drops complete think blocks, keeps text after a lone `</think>`,
        strips whitespace). Nothing else: further rewriting would be a logged variant."""
        return strip_reasoning(raw)

    def prediction_record(self, item: Item, prediction: str, **extra: Any) -> dict:
        """The predictions-JSONL record `score_record` reads back (plus whatever the runner adds)."""
        record = {"id": item.id, "prediction": prediction, "answers": list(item.answers)}
        for name in self.record_fields:
            if name not in item.fields:
                raise RecordError(f"{self.name}: item {item.id!r} lacks the field {name!r} the scorer needs; "
                                  f"found fields {sorted(item.fields)}")
            record[name] = item.fields[name]
        record.update(extra)
        return record

    def check_record(self, record: Mapping[str, Any]) -> None:
        for name in ("id", "prediction", "answers", *self.record_fields):
            if name not in record:
                raise RecordError(f"{self.name}: record {record.get('id')!r} lacks {name!r}; records need "
                                  f"id, prediction, answers{''.join(', ' + f for f in self.record_fields)}")
        if not isinstance(record["prediction"], str):
            raise RecordError(f"{self.name}: record {record['id']!r}: expected 'prediction' to be a string, "
                              f"found {type(record['prediction']).__name__}")
        answers = record["answers"]
        if not isinstance(answers, list) or not answers or not all(isinstance(a, str) for a in answers):
            raise RecordError(f"{self.name}: record {record['id']!r}: expected 'answers' to be a non-empty "
                              f"list of strings, found {answers!r}")

    # --- scoring -------------------------------------------------------------------------------
    @abc.abstractmethod
    def score_record(self, record: Mapping[str, Any]) -> dict:
        """Per-item result; always has "score" (what the harness averages or sums)."""

    def error_result(self, record: Mapping[str, Any]) -> dict:
        """An item whose generation failed scores 0 and stays in the denominator."""
        return {"score": 0.0, "error": True}

    def aggregate(self, records: Sequence[Mapping[str, Any]], results: Sequence[Mapping[str, Any]]) -> dict:
        """Default: mean of per-item scores (the harness 'mean' aggregation) plus per-category means."""
        return {"score": mean_score(results), "categories": category_means(records, results, self.category_fields)}


def mean_score(results: Sequence[Mapping[str, Any]]) -> float:
    return sum(r["score"] for r in results) / len(results) if results else 0.0


def category_means(records: Sequence[Mapping[str, Any]], results: Sequence[Mapping[str, Any]],
                   fields: Sequence[str], scale: float = 1.0) -> dict:
    """{field: {value: {"score": mean * scale, "n": count}}}; list-valued fields count once per entry."""
    out: dict[str, dict] = {}
    for name in fields:
        sums: dict[str, list[float]] = defaultdict(lambda: [0.0, 0])
        for record, result in zip(records, results):
            value = record.get(name)
            for v in value if isinstance(value, list) else [value]:
                if v is None:
                    continue
                sums[str(v)][0] += result["score"]
                sums[str(v)][1] += 1
        out[name] = {v: {"score": scale * s / n, "n": n} for v, (s, n) in sorted(sums.items())}
    return out


# name -> "module:Class"; aliases map the common short names to the reference split
_REGISTRY = {
    "docvqa_val": "eval.tasks.docvqa:DocVQAVal",
    "infovqa_val": "eval.tasks.infovqa:InfoVQAVal",
    "chartqa": "eval.tasks.chartqa:ChartQA",
    "textvqa_val": "eval.tasks.textvqa:TextVQAVal",
    "ocrbench": "eval.tasks.ocrbench:OCRBench",
    "videomme": "eval.tasks.videomme:VideoMME",
    "mlvu_dev": "eval.tasks.mlvu:MLVUDev",
    "mlvu_test": "eval.tasks.mlvu:MLVUTest",
    "synthetic_docs": "eval.tasks.synthetic_docs:SyntheticDocs",
    "synthetic_video": "eval.tasks.synthetic_video:SyntheticVideo",
    "synthetic_audio": "eval.tasks.synthetic_audio:SyntheticAudio",
}
_ALIASES = {"docvqa": "docvqa_val", "infovqa": "infovqa_val", "textvqa": "textvqa_val", "mlvu": "mlvu_dev",
            "video-mme": "videomme", "video_mme": "videomme"}


def task_names() -> list[str]:
    return sorted(_REGISTRY)


def get_task(name: str) -> Task:
    key = _ALIASES.get(name.lower(), name.lower())
    if key not in _REGISTRY:
        raise UnknownTaskError(f"unknown eval task {name!r}; expected one of {', '.join(task_names())}")
    module_name, class_name = _REGISTRY[key].split(":")
    return getattr(importlib.import_module(module_name), class_name)()
