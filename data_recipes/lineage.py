"""The training runs behind a model: the from-scratch run it started as and the fine-tunes after it, oldest first.

A fine-tune's recipe.json names the model it started from (`init_from`): either another run's `model/` (a run
directory holds recipe.json, summary.json and log.jsonl beside it) or a shipped model directory (vl/demo), which
keeps its own history in the files `demo_eval.ship` writes there: train_recipe.json and train_summary.json (the
from-scratch run) and train_lineage.json (the fine-tunes after it, when there were any).
"""

from __future__ import annotations

import json
from pathlib import Path

from vl.errors import ConfigError

RECIPE, SUMMARY, LINEAGE = "train_recipe.json", "train_summary.json", "train_lineage.json"


def _read(path: Path) -> dict:
    if not path.is_file():
        raise ConfigError(f"{path}: missing; a model's training history needs it (data_recipes/lineage.py)")
    return json.loads(path.read_text())


def runs(run_dir) -> tuple[list[Path], Path | None]:
    """(run directories from the oldest to `run_dir`, each started from the one before, and the shipped model
    directory the oldest started from; None when the oldest trained from scratch)."""
    chain, run = [], Path(run_dir)
    while True:
        if run in chain:
            raise ConfigError(f"{run}: its recipe.json's init_from chain loops back to itself")
        chain.insert(0, run)
        start = _read(run / "recipe.json").get("init_from")
        if not start:
            return chain, None
        start = Path(start)
        if start.name == "model" and (start.parent / "recipe.json").is_file():
            run = start.parent
        else:
            return chain, start


def _entry(run: Path) -> dict:
    summary = _read(run / "summary.json")
    if not summary.get("finished"):
        raise ConfigError(f"{run}: its training stopped early ({summary.get('steps')} of "
                          f"{summary.get('total_steps')} steps); resume it before using its model")
    return {"run": str(run), "recipe": _read(run / "recipe.json"), "summary": summary}


def of_shipped(model_dir) -> dict:
    """The history `record` gives, of a shipped model directory (from the files `demo_eval.ship` wrote there)."""
    model_dir = Path(model_dir)
    tuned = _read(model_dir / LINEAGE)["fine_tunes"] if (model_dir / LINEAGE).is_file() else []
    base = {"recipe": _read(model_dir / RECIPE), "summary": _read(model_dir / SUMMARY), "dir": str(model_dir)}
    return {"base": base, "fine_tunes": tuned}


def record(run_dir) -> dict:
    """{"base": {"recipe", "summary", "dir"}, "fine_tunes": [{"run", "recipe", "summary"}, ...]}: the from-scratch
    run (`dir`: its run folder, or the shipped model folder that keeps its files) and every fine-tune after it that
    made `run_dir`'s model, oldest first."""
    chain, shipped = runs(run_dir)
    if shipped is not None:
        history = of_shipped(shipped)
        # The folder may since have been shipped over with a model made by this very chain (a fine-tune of vl/demo
        # shipped into vl/demo): what the chain started from is then the folder's history before its first run.
        listed = [Path(t["run"]).resolve() for t in history["fine_tunes"]]
        if chain[0].resolve() in listed:
            history["fine_tunes"] = history["fine_tunes"][:listed.index(chain[0].resolve())]
    else:
        first = _entry(chain.pop(0))
        history = {"base": {"recipe": first["recipe"], "summary": first["summary"], "dir": first["run"]},
                   "fine_tunes": []}
    return history | {"fine_tunes": history["fine_tunes"] + [_entry(r) for r in chain]}


def loss_rows(run_dirs) -> list[dict]:
    """The log rows of consecutive runs as one curve: steps numbered on from the run before."""
    from data_recipes.train_log import read_log

    rows, offset = [], 0
    for run in run_dirs:
        part = read_log(Path(run) / "log.jsonl")
        rows += [r | {"step": r["step"] + offset} for r in part]
        offset += part[-1]["step"] if part else 0
    return rows
