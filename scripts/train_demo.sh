#!/usr/bin/env bash
# The documented way to (re)build the shipped demo model from scratch (issue 7):
#   train (data_recipes/train.py, recipe "demo"), then scripts/ship_demo.sh: held-out eval in both reasoning modes,
#   FP8 / NVFP4 exports with `vl quantize` and their eval, EVS sweeps, copy model + card + figures into vl/demo.
# Usage: scripts/train_demo.sh [RUN_DIR=runs/demo] [N_PER_FAMILY=100]
# Reproducibility check (the model card's section): a second run, then the card again with it:
#   .venv/bin/vl train-demo --recipe demo --out runs/demo_repro --fresh
#   scripts/ship_demo.sh runs/demo 100 runs/demo_repro
# A partial check (its losses only) when a whole second run does not fit: stop the second run early, e.g.
#   .venv/bin/vl train-demo --recipe demo --out runs/demo_repro --fresh --max-minutes 12   (then the same ship command)
set -euo pipefail
cd "$(dirname "$0")/.."
RUN=${1:-runs/demo}
N=${2:-100}
VL=${VL:-.venv/bin/vl}
export OMP_WAIT_POLICY=PASSIVE  # idle OpenMP threads must not spin on a shared 2-core CPU (train.py says why)

"$VL" train-demo --recipe demo --out "$RUN" --fresh
scripts/ship_demo.sh "$RUN" "$N"
