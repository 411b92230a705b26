"""scripts/train_demo_evs.sh: the five EVS fine-tunes in order, each from the one before, and a rerun skips the finished.

The script is run with VL pointing at a stand-in that records its arguments and writes what a finished
`vl train-demo` leaves (model/ and a summary.json saying finished), so the chain's wiring is checked without minutes
of training a step."""

import os
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
FAKE_VL = """#!/usr/bin/env bash
echo "$*" >> "$CALLS"
while [ $# -gt 0 ]; do [ "$1" = --out ] && out=$2; shift; done
mkdir -p "$out/model" && touch "$out/model/model.safetensors"
printf '{\n "recipe": "x",\n "finished": true\n}\n' > "$out/summary.json"
"""


def _run(tmp_path, run_dir):
    fake = tmp_path / "vl"
    fake.write_text(FAKE_VL)
    fake.chmod(0o755)
    env = os.environ | {"VL": str(fake), "CALLS": str(tmp_path / "calls.txt")}
    out = subprocess.run(["bash", str(ROOT / "scripts/train_demo_evs.sh"), str(run_dir)], env=env,
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    return out.stdout


def test_the_chain_runs_in_order_each_from_the_last_and_resumes(tmp_path):
    run = tmp_path / "chain"
    assert _run(tmp_path, run).strip() == f"model: {run}/settle/model"
    calls = (tmp_path / "calls.txt").read_text().splitlines()
    assert calls == [
        f"train-demo --recipe evs_where --init-from vl/demo --out {run}/where --no-progress",
        f"train-demo --recipe evs_where --init-from {run}/where/model --out {run}/where2 --no-progress",
        f"train-demo --recipe evs_pruned --init-from {run}/where2/model --out {run}/pruned --no-progress",
        f"train-demo --recipe evs_pruned --init-from {run}/pruned/model --out {run}/pruned2 --no-progress --seed 3",
        f"train-demo --recipe evs_settle --init-from {run}/pruned2/model --out {run}/settle --no-progress",
    ]
    from data_recipes.recipes import RECIPES

    assert all(c.split()[2] in RECIPES for c in calls)  # every recipe the chain names exists
    # interrupted runs: train-demo writes model/ at every checkpoint too, so only the summary tells a finished run
    (run / "pruned2/summary.json").write_text('{\n "recipe": "evs_pruned",\n "finished": false\n}\n')
    (run / "settle/summary.json").unlink()
    _run(tmp_path, run)
    assert (tmp_path / "calls.txt").read_text().splitlines()[5:] == calls[3:]
