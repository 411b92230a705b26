"""The demo model's shell scripts, with stand-ins for `vl` and python that record their arguments:
scripts/train_demo_evs.sh (the five EVS fine-tunes in order, each from the one before, a rerun skips the finished)
and scripts/ship_demo.sh (eval, exports, sweeps, a second run, then the card and ship, each on the right folders).

train_demo_evs.sh is run with VL pointing at a stand-in that records its arguments and writes what a finished
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


RECORDER = """#!/usr/bin/env bash
echo "$(basename "$0") $*" >> "$CALLS"
[ "$1" = - ] && cat > /dev/null   # python reading a script from stdin
exit 0
"""


def test_ship_demo_evaluates_exports_sweeps_and_ships_in_order(tmp_path):
    for name in ("vl", "python"):
        (tmp_path / name).write_text(RECORDER)
        (tmp_path / name).chmod(0o755)
    env = os.environ | {"VL": str(tmp_path / "vl"), "PY": str(tmp_path / "python"), "CALLS": str(tmp_path / "calls"),
                        "HELDOUT": "H", "DEST": "D"}
    def ship(*args):
        out = subprocess.run(["bash", str(ROOT / "scripts/ship_demo.sh"), *args], env=env, capture_output=True,
                             text=True, timeout=60)
        assert out.returncode == 0, out.stderr
        return (tmp_path / "calls").read_text().splitlines()

    ship("R", "7", "S")
    sweep = "--task synthetic_video --data H/{c}/video_test.jsonl --out R/evs_{c} --batch-size 8 --no-progress " \
            "--resume --sweep video_pruning_rate=0,0.5,0.75,0.9"
    assert (tmp_path / "calls").read_text().splitlines() == [
        "python -m data_recipes.demo_eval --model R/model --n 7 --out R/eval",
        "vl quantize --format fp8 --model R/model --out R/fp8 --overwrite --no-progress",
        "python -m data_recipes.demo_eval --model R/fp8 --n 7 --out R/eval_fp8",
        "vl quantize --format nvfp4 --model R/model --out R/nvfp4 --overwrite --no-progress",
        "python -m data_recipes.demo_eval --model R/nvfp4 --n 7 --out R/eval_nvfp4",
        "python - H R/model",
        "vl eval --model R/model " + sweep.format(c="video64"),
        "vl eval --model R/model " + sweep.format(c="video8"),
        "python -m data_recipes.demo_eval --model S/model --n 7 --out S/eval",
        "python -m data_recipes.demo_eval --model R/model --n 7 --out R/eval --results R/eval/results.json "
        "--quant-results fp8=R/eval_fp8/results.json,nvfp4=R/eval_nvfp4/results.json "
        "--sweeps R/evs_video64,R/evs_video8 --second-run S --ship D --run R",
    ]
    (tmp_path / "calls").unlink()
    calls = ship("R")  # no second run: nothing evaluated for it, no reproducibility flag
    assert calls[0] == "python -m data_recipes.demo_eval --model R/model --n 100 --out R/eval" and len(calls) == 9
    assert calls[-1].endswith("--sweeps R/evs_video64,R/evs_video8 --ship D --run R")
