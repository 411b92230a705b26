"""Re-score a predictions JSONL offline: `vl eval score --task TASK --predictions FILE.jsonl`; compare two on the
same items: `vl eval compare --task TASK BASE.jsonl OTHER.jsonl` (e.g. a BF16 and an FP8 checkpoint's runs).

A predictions record is one JSON object per line with at least `id`, `prediction` (the answer text
after post-processing) and `answers` (a list), plus the task's own fields (e.g. OCRBench
`question_type` and `dataset`, Video-MME `options`/`duration`/..., MLVU `task_type`). Runner records
may also carry `status` ("ok" | "error" | "timeout" ...) and `error_class`: a record whose status is
not "ok" scores 0 and stays in the denominator (an error is a result too, docs/reliability_policy.md
section 5). Records are append-only, so when an id occurs more than once the LAST record wins. When no record is
"ok" there is no score (`"score": null` and a `note`): nothing was answered.

The summary is printed as JSON; the headline is under "score" on the scale the reference harness
prints (see each task's `scale`: "0-1" for ANLS / relaxed / VQA accuracy / OCRBench, "percent" for
Video-MME and MLVU), per-category numbers under "categories".
"""

from __future__ import annotations

import argparse
import json
import sys
from collections import Counter
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from eval.tasks import RecordError, Task, get_task, task_names
from vl.errors import InputError, VLError


class PredictionsFormatError(InputError):
    code = "bad_predictions"


def read_predictions(path: str | Path) -> list[dict]:
    """All records of a predictions JSONL, in file order. A line that is not a JSON object is an error
    naming the line (a half-written last line is repaired by resuming the run, not by the scorer)."""
    records = []
    with open(path, encoding="utf-8") as f:
        for lineno, line in enumerate(f, start=1):
            if not line.strip():
                continue
            try:
                record = json.loads(line)
            except json.JSONDecodeError as e:
                raise PredictionsFormatError(f"{path}:{lineno}: invalid JSON ({e.msg}); if the run was "
                                             "interrupted, resume it to redo that item") from e
            if not isinstance(record, dict):
                raise PredictionsFormatError(f"{path}:{lineno}: expected a JSON object, found "
                                             f"{type(record).__name__}")
            records.append(record)
    return records


def latest_per_id(records: Iterable[Mapping[str, Any]]) -> tuple[list[Mapping[str, Any]], int]:
    """One record per id (the last one), in order of first appearance; also how many were replaced."""
    latest: dict[str, Mapping[str, Any]] = {}
    replaced = 0
    for record in records:
        if "id" not in record:
            raise RecordError(f"a record lacks 'id'; found keys {sorted(record)}")
        key = str(record["id"])
        replaced += key in latest
        latest[key] = record
    return list(latest.values()), replaced


def _is_ok(record: Mapping[str, Any]) -> bool:
    return record.get("status", "ok") == "ok"


def score_records(task: Task, records: Sequence[Mapping[str, Any]], postprocess: bool = False) -> list[dict]:
    """Per-item results, aligned with `records`."""
    results = []
    for record in records:
        if not _is_ok(record):
            missing = [f for f in task.record_fields if f not in record]
            if missing:
                raise RecordError(f"{task.name}: error record {record['id']!r} lacks {missing}; the runner "
                                  "must copy the task fields into error records too")
            results.append(task.error_result(record))
            continue
        if postprocess and isinstance(record.get("prediction"), str):
            record = {**record, "prediction": task.postprocess(record["prediction"])}
        task.check_record(record)
        results.append(task.score_record(record))
    return results


def summarize(task: Task | str, records: Iterable[Mapping[str, Any]], postprocess: bool = False) -> dict:
    """The task summary for a set of predictions records (the runner reuses this).

    `postprocess=True` applies the task's answer post-processing (reasoning stripping) to each
    prediction first, for files that hold raw generations.
    """
    task = get_task(task) if isinstance(task, str) else task
    unique, replaced = latest_per_id(records)
    results = score_records(task, unique, postprocess=postprocess)
    aggregate = task.aggregate(unique, results)
    statuses = Counter(str(r.get("status", "ok")) for r in unique)
    error_classes = Counter(str(r.get("error_class", r.get("status"))) for r in unique if not _is_ok(r))
    head = task.header()
    summary = {
        "task": task.name,
        "harness": head["harness"],
        "reference": task.reference,
        "metric": task.metric,
        "scale": task.scale,
        "score": aggregate.pop("score"),
        "n": len(unique),
        "n_ok": statuses.get("ok", 0),
        "n_error": len(unique) - statuses.get("ok", 0),
        "errors_by_class": dict(sorted(error_classes.items())),
        "duplicate_records_replaced": replaced,
        "postprocessed": postprocess,
    }
    if not summary["n_ok"]:  # nothing was answered: 0.0 would read as a model that got everything wrong
        summary["score"] = None
        summary["note"] = (f"no answers: none of the {len(unique)} items was answered "
                           f"({', '.join(f'{k} {v}' for k, v in summary['errors_by_class'].items()) or 'no records'}); "
                           "nothing to score")
        return summary
    summary.update(aggregate)
    return summary


def paired_change(task: Task, base: list[dict], other: list[dict], n_boot: int = 1000, seed: int = 0) -> dict | None:
    """Headline score of `other` minus that of `base`, both on the items the two share (by id), with a 95%
    bootstrap interval that resamples items, the same ones on both sides (a paired comparison: what an item
    costs is measured on that item). Also each side's headline on the shared items, `n_differ` (items whose own
    score differs) and how many ids only one side holds. None when no item is shared. The headline is the task's
    own aggregate (a plain or a macro mean), recomputed on every resample."""
    a = {str(r["id"]): r for r in latest_per_id(base)[0]}
    b = {str(r["id"]): r for r in latest_per_id(other)[0]}
    ids = sorted(a.keys() & b.keys())
    if not ids:
        return None
    rec_a, rec_b = [a[i] for i in ids], [b[i] for i in ids]
    res_a, res_b = score_records(task, rec_a), score_records(task, rec_b)

    def headline(records, results, idx) -> float:
        return task.aggregate([records[i] for i in idx], [results[i] for i in idx])["score"]

    def change(idx) -> float:
        return headline(rec_b, res_b, idx) - headline(rec_a, res_a, idx)

    n = len(ids)
    rng = np.random.default_rng(seed)
    boots = [change(rng.integers(0, n, n)) for _ in range(n_boot)]
    low, high = np.percentile(boots, [2.5, 97.5])
    every = range(n)
    return {"base_score": headline(rec_a, res_a, every), "other_score": headline(rec_b, res_b, every),
            "change": change(every), "low": float(low), "high": float(high), "n": n,
            "n_differ": sum(x["score"] != y["score"] for x, y in zip(res_a, res_b)),
            "only_in_base": len(a.keys() - b.keys()), "only_in_other": len(b.keys() - a.keys())}


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="vl eval score", description="Re-score a predictions JSONL and print "
                                     "the summary as JSON (headline under 'score', harness scale).")
    parser.add_argument("--task", required=True, help=f"one of: {', '.join(task_names())}")
    parser.add_argument("--predictions", required=True, type=Path, help="predictions JSONL (id, prediction, "
                        "answers, task fields)")
    parser.add_argument("--postprocess", action="store_true", help="strip reasoning blocks from each "
                        "prediction first (for files holding raw generations)")
    return parser


def _print_json_or_error(work: Callable[[], Mapping[str, Any]]) -> int:
    """Print what `work` returns as JSON (exit 0), or a missing file / typed error as one line on stderr (exit 2)."""
    try:
        result = work()
    except FileNotFoundError as e:
        print(f"error [not_found]: no predictions file {e.filename}", file=sys.stderr)
        return 2
    except VLError as e:
        print(f"error [{e.code}]: {e}", file=sys.stderr)
        return 2
    print(json.dumps(result, indent=2, ensure_ascii=False))
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    return _print_json_or_error(lambda: summarize(get_task(args.task), read_predictions(args.predictions),
                                                  postprocess=args.postprocess))


def compare_main(argv: Sequence[str] | None = None) -> int:
    """`vl eval compare`: OTHER's headline minus BASE's on the items both hold, with the paired interval, as JSON."""
    parser = argparse.ArgumentParser(prog="vl eval compare", description="Compare two predictions JSONLs of one "
                                     "task on the items both hold: the headline of each, OTHER minus BASE, and a 95% "
                                     "paired bootstrap interval, printed as JSON.")
    parser.add_argument("--task", required=True, help=f"one of: {', '.join(task_names())}")
    parser.add_argument("base", type=Path, help="predictions JSONL compared against")
    parser.add_argument("other", type=Path, help="predictions JSONL whose change is reported")
    parser.add_argument("--boot", type=int, default=1000, help="bootstrap resamples (default 1000)")
    args = parser.parse_args(argv)
    if args.boot < 1:
        parser.error(f"--boot must be >= 1, found {args.boot}")

    def compare() -> dict:
        task = get_task(args.task)
        result = paired_change(task, read_predictions(args.base), read_predictions(args.other), n_boot=args.boot)
        if result is None:
            raise PredictionsFormatError(f"{args.base} and {args.other} share no item id; nothing to compare")
        return {"task": task.name, "metric": task.metric, "scale": task.scale, "base": str(args.base),
                "other": str(args.other), **result}

    return _print_json_or_error(compare)


if __name__ == "__main__":
    raise SystemExit(main())
