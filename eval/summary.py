"""The summary of a finished run: scores, token and timing statistics, counts, and its Markdown rendering.

`build_summary` turns the merged final records into `summary.json`'s content; `summary_markdown` into
`summary.md` (the run header, per-category scores, tokens, time). `code_versions` records what produced it.
"""

from __future__ import annotations

import json
import platform
import subprocess
import sys
from collections import defaultdict
from importlib.metadata import version
from pathlib import Path
from typing import Any

from eval.score import summarize
from eval.tasks import Task


def code_versions() -> dict:
    out = {"python": platform.python_version()}
    for name in ("torch", "transformers"):
        mod = sys.modules.get(name)
        out[name] = getattr(mod, "__version__", None) if mod else None
    try:
        out["nemotron-vl"] = version("nemotron-vl")
    except Exception:  # noqa: BLE001 - not installed as a distribution
        out["nemotron-vl"] = None
    try:
        repo = Path(__file__).resolve().parent.parent
        out["git_commit"] = subprocess.run(["git", "-C", str(repo), "rev-parse", "HEAD"], capture_output=True,
                                           text=True, timeout=5).stdout.strip() or None
    except (OSError, subprocess.SubprocessError):
        out["git_commit"] = None
    return out


def _token_stats(records: list[dict]) -> dict:
    ok = [r["tokens"] for r in records if r.get("status") == "ok" and r.get("tokens")]
    out: dict[str, Any] = {"items": len(ok)}
    for key in ("prompt", "vision_before", "vision_after", "audio", "new"):
        values = [t.get(key, 0) for t in ok]
        if any(v is None for v in values):  # a backend that does not report it (a remote server)
            out[key] = {"total": None, "mean": None, "note": "not reported by the backend"}
            continue
        total = sum(values)
        out[key] = {"total": total, "mean": round(total / len(ok), 3) if ok else None}
    before, after = out["vision_before"]["total"], out["vision_after"]["total"]
    out["vision_kept_fraction"] = round(after / before, 6) if before else None
    ttft = [(r.get("timing") or {}).get("ttft_s") for r in records if r.get("status") == "ok"]
    ttft = [t for t in ttft if t is not None]
    out["time_to_first_token_s"] = {"mean": round(sum(ttft) / len(ttft), 4) if ttft else None,
                                    "note": "timing: differs between runs (not in the fingerprint)"}
    return out


def build_summary(task: Task, records: list[dict], header: dict, missing: list[str]) -> dict:
    scores = summarize(task, records)
    statuses = defaultdict(int)
    for r in records:
        statuses[r.get("status", "ok")] += 1
    return {
        "header": header,
        "scores": scores,
        "tokens": _token_stats(records),
        "counts": {"items": len(records) + len(missing), "ok": statuses.get("ok", 0),
                   "error": statuses.get("error", 0), "timeout": statuses.get("timeout", 0),
                   "unavailable": sum(r.get("error_class") == "unavailable" for r in records),
                   "missing": len(missing), "missing_ids": missing[:20], "complete": not missing,
                   "errors_by_class": scores.get("errors_by_class", {})},
    }


def _fmt(v) -> str:
    if isinstance(v, float):
        return f"{v:.4f}"
    return "" if v is None else str(v)


def summary_markdown(summary: dict) -> str:
    h, s, t, c, run = summary["header"], summary["scores"], summary["tokens"], summary["counts"], summary.get("run", {})
    if s["score"] is None:
        lines = [f"# {h['task']}: {s['metric']}: no answers, nothing to score ({h['harness']})", "", s["note"], ""]
    else:
        lines = [f"# {h['task']}: {s['metric']} = {_fmt(s['score'])} ({s['scale']} scale, {h['harness']})", ""]
    unanswered = c.get("unavailable", 0)
    lines += [f"{c['ok']} ok, {c['error']} errors, {c['timeout']} timeouts, {c['missing']} missing of "
              f"{c['items']} items" + ("" if c["complete"] else " (INCOMPLETE: resume the run)")
              + (f"; {unanswered} not answered by the server (unavailable: resume the run)" if unanswered else ""),
              ""]
    if run.get("stopped"):
        lines += [f"The run stopped early: {run['stopped']}.", ""]
    if c["errors_by_class"]:
        lines += ["Errors by class: " + ", ".join(f"{k} {v}" for k, v in c["errors_by_class"].items()), ""]
    lines += ["## Run header", "", "| field | value |", "|---|---|"]
    for key in ("reference", "dataset", "data", "split", "limit", "pre_prompt", "prompt_suffix", "max_new_tokens",
                "max_new_tokens_source", "reasoning_mode", "fps", "max_frames", "max_num_tiles", "evs_rate",
                "precision", "device_type", "seeds", "model", "fingerprint"):
        lines.append(f"| {key} | {json.dumps(h.get(key), ensure_ascii=False)} |")
    categories = s.get("categories") or {}
    for name, values in categories.items():
        lines += ["", f"## Per {name}", "", "| value | score | n |", "|---|---|---|"]
        for value, entry in values.items():
            lines.append(f"| {value} | {_fmt(entry.get('score'))} | {entry.get('n')} |")
    extra = {k: v for k, v in s.items() if k not in ("task", "harness", "reference", "metric", "scale", "score",
                                                      "categories", "errors_by_class", "note")
             and not isinstance(v, dict)}
    if extra:
        lines += ["", "## Other numbers", "", "| key | value |", "|---|---|"]
        lines += [f"| {k} | {_fmt(v)} |" for k, v in extra.items()]
    lines += ["", "## Tokens (per ok item)", "", "| tokens | mean | total |", "|---|---|---|"]
    for key in ("prompt", "vision_before", "vision_after", "audio", "new"):
        lines.append(f"| {key} | {_fmt(t[key]['mean'])} | {t[key]['total']} |")
    lines.append(f"| vision kept fraction | {_fmt(t['vision_kept_fraction'])} | |")
    if run:
        lines += ["", "## Time", "", f"{run.get('items_run')} items run in {run.get('wall_s')} s "
                  f"({run.get('items_per_s')} items/s) on {run.get('world_size')} process(es), batch "
                  f"{run.get('batch_size')}, device {run.get('device')}; retries {run.get('retries')}, batch splits "
                  f"{run.get('batch_splits')}, worker restarts {run.get('worker_restarts')}."]
    return "\n".join(lines) + "\n"
