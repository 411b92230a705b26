"""The demo model's shell scripts, with stand-ins for `vl` and python that record their arguments:
scripts/train_demo_evs.sh (the five EVS fine-tunes in order, each from the one before, a rerun skips the finished),
scripts/ship_demo.sh (eval, exports, sweeps, a second run, then the card and ship, each on the right folders) and
scripts/train_demo.sh (the from-scratch run, the chain from it, the ship of its last run).

The `vl` stand-in records its arguments and, for `train-demo`, writes what a finished run leaves (model/ and a
summary.json saying finished), so the wiring is checked without minutes of training a step."""

import os
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
FAKE_VL = """#!/usr/bin/env bash
echo "$(basename "$0") $*" >> "$CALLS"
[ "$1" = train-demo ] || exit 0
while [ $# -gt 0 ]; do [ "$1" = --out ] && out=$2; shift; done
mkdir -p "$out/model" && touch "$out/model/model.safetensors" "$out/model/config.json"
printf '{\\n "recipe": "x",\\n "finished": true\\n}\\n' > "$out/summary.json"
"""
RECORDER = """#!/usr/bin/env bash
echo "$(basename "$0") $*" >> "$CALLS"
[ "$1" = - ] && cat > /dev/null   # python reading a script from stdin
exit 0
"""


def _env(tmp_path, **extra):
    for name, text in (("vl", FAKE_VL), ("python", RECORDER)):
        (tmp_path / name).write_text(text)
        (tmp_path / name).chmod(0o755)
    return os.environ | {"VL": str(tmp_path / "vl"), "PY": str(tmp_path / "python"),
                         "CALLS": str(tmp_path / "calls.txt")} | extra


def _script(tmp_path, name, *args, env=None, ok=True):
    out = subprocess.run(["bash", str(ROOT / "scripts" / name), *map(str, args)], env=env or _env(tmp_path),
                         capture_output=True, text=True, timeout=60)
    assert (out.returncode == 0) == ok, out.stderr
    return out


def _base(tmp_path):
    (tmp_path / "base").mkdir(exist_ok=True)
    (tmp_path / "base" / "config.json").write_text("{}")
    return tmp_path / "base"


def _run(tmp_path, run_dir):
    return _script(tmp_path, "train_demo_evs.sh", run_dir, env=_env(tmp_path, BASE=str(_base(tmp_path)))).stdout


def test_the_chain_runs_in_order_each_from_the_last_and_resumes(tmp_path):
    run = tmp_path / "chain"
    assert _run(tmp_path, run).strip() == f"model: {run}/settle/model"
    calls = (tmp_path / "calls.txt").read_text().splitlines()
    assert calls == [
        f"vl train-demo --recipe evs_where --init-from {tmp_path}/base --out {run}/where --no-progress",
        f"vl train-demo --recipe evs_where --init-from {run}/where/model --out {run}/where2 --no-progress",
        f"vl train-demo --recipe evs_pruned --init-from {run}/where2/model --out {run}/pruned --no-progress",
        f"vl train-demo --recipe evs_pruned --init-from {run}/pruned/model --out {run}/pruned2 --no-progress --seed 3",
        f"vl train-demo --recipe evs_settle --init-from {run}/pruned2/model --out {run}/settle --no-progress",
    ]
    from data_recipes.registry import RECIPES

    assert all(c.split()[3] in RECIPES for c in calls)  # every recipe the chain names exists
    # interrupted runs: train-demo writes model/ at every checkpoint too, so only the summary tells a finished run
    (run / "pruned2/summary.json").write_text('{\n "recipe": "evs_pruned",\n "finished": false\n}\n')
    (run / "settle/summary.json").unlink()
    _run(tmp_path, run)
    assert (tmp_path / "calls.txt").read_text().splitlines()[5:] == calls[3:]


def test_ship_demo_evaluates_exports_sweeps_and_ships_in_order(tmp_path):
    env = _env(tmp_path, HELDOUT="H", DEST="D")

    def ship(*args):
        _script(tmp_path, "ship_demo.sh", *args, env=env)
        return (tmp_path / "calls.txt").read_text().splitlines()

    ship("R", "7", "S")
    sweep = "--task synthetic_video --data H/{c}/video_test.jsonl --out R/evs_{c} --batch-size 8 --no-progress " \
            "--resume --sweep video_pruning_rate=0,0.5,0.75,0.9"
    assert (tmp_path / "calls.txt").read_text().splitlines() == [
        "python scripts/demo_eval.py --model R/model --n 7 --out R/eval",
        "vl quantize --format fp8 --model R/model --out R/fp8 --overwrite --no-progress",
        "python scripts/demo_eval.py --model R/fp8 --n 7 --out R/eval_fp8",
        "vl quantize --format nvfp4 --model R/model --out R/nvfp4 --overwrite --no-progress",
        "python scripts/demo_eval.py --model R/nvfp4 --n 7 --out R/eval_nvfp4",
        "python - H R/model",
        "vl eval --model R/model " + sweep.format(c="video64"),
        "vl eval --model R/model " + sweep.format(c="video8"),
        "python scripts/demo_eval.py --model S/model --n 7 --out S/eval",
        "python scripts/demo_eval.py --model R/model --n 7 --out R/eval --results R/eval/results.json "
        "--quant-results fp8=R/eval_fp8/results.json,nvfp4=R/eval_nvfp4/results.json "
        "--sweeps R/evs_video64,R/evs_video8 --second-run S --ship D --run R",
    ]
    (tmp_path / "calls.txt").unlink()
    calls = ship("R")  # no second run: nothing evaluated for it, no reproducibility flag
    assert calls[0] == "python scripts/demo_eval.py --model R/model --n 100 --out R/eval" and len(calls) == 9
    assert calls[-1].endswith("--sweeps R/evs_video64,R/evs_video8 --ship D --run R")


def test_the_chain_needs_its_base(tmp_path):
    out = _script(tmp_path, "train_demo_evs.sh", tmp_path / "chain", env=_env(tmp_path, BASE=str(tmp_path / "nope")),
                  ok=False)
    assert out.returncode == 2 and "no model at BASE=" in out.stderr and "--recipe demo" in out.stderr
    assert not (tmp_path / "calls.txt").exists()


def test_train_demo_trains_the_base_then_the_chain_then_ships_the_last(tmp_path):
    env = _env(tmp_path, HELDOUT="H", DEST="D")
    _script(tmp_path, "train_demo.sh", tmp_path / "r", "7", "S", env=env)
    calls = (tmp_path / "calls.txt").read_text().splitlines()
    r = tmp_path / "r"
    assert calls[0] == f"vl train-demo --recipe demo --out {r} --no-progress"
    assert calls[1] == f"vl train-demo --recipe evs_where --init-from {r}/model --out {r}/evs/where --no-progress"
    assert [c.split()[3] for c in calls[1:6]] == ["evs_where", "evs_where", "evs_pruned", "evs_pruned", "evs_settle"]
    assert calls[6] == f"python scripts/demo_eval.py --model {r}/evs/settle/model --n 7 --out {r}/evs/settle/eval"
    assert calls[-1].endswith(f"--second-run S/evs/settle --ship D --run {r}/evs/settle")
    (tmp_path / "calls.txt").unlink()
    _script(tmp_path, "train_demo.sh", r, env=env)  # all trained: nothing trains again; ships without a second run
    calls = (tmp_path / "calls.txt").read_text().splitlines()
    assert not any("train-demo" in c for c in calls) and calls[-1].endswith(f"--ship D --run {r}/evs/settle")


def test_the_chain_is_the_shipped_models_fine_tunes(tmp_path):
    """vl/demo's card says scripts/train_demo.sh rebuilds it: the chain's runs are the shipped fine-tunes, in order,
    and today's recipes with the chain's flags are the recipes those runs trained with (init_from aside: a path)."""
    import json
    from dataclasses import asdict

    from data_recipes.registry import get_recipe

    run = tmp_path / "chain"
    _run(tmp_path, run)
    shipped = json.loads((ROOT / "vl/demo/train_lineage.json").read_text())["fine_tunes"]
    calls = (tmp_path / "calls.txt").read_text().splitlines()
    assert len(calls) == len(shipped) == 5
    for call, tune in zip(calls, shipped):
        args = call.split()
        recipe = get_recipe(args[3])
        if "--seed" in args:
            recipe = recipe.replace(seed=int(args[args.index("--seed") + 1]))
        want = json.loads(json.dumps(asdict(recipe), default=str))
        assert {**want, "init_from": None} == {**tune["recipe"], "init_from": None}, call
