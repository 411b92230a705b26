#!/usr/bin/env bash
# The documented way to (re)build the shipped demo model, one resumable command (~4.7 h on the
# 2-core build CPU):
#   1. `vl train-demo --recipe demo` into RUN_DIR (3600 steps from scratch, data_recipes/train.py);
#   2. scripts/train_demo_evs.sh: the five EVS fine-tunes from it into RUN_DIR/evs (3480 steps);
#   3. scripts/ship_demo.sh on the last of them: held-out eval in both reasoning modes, FP8 / NVFP4 exports with
#      `vl quantize` and their eval, EVS sweeps, then model, card and every run's history into DEST (vl/demo).
# A finished run is not trained again, so the same command continues an interrupted build.
# Usage: scripts/train_demo.sh [RUN_DIR=runs/demo] [N_PER_FAMILY=100] [SECOND_RUN_DIR]
#   SECOND_RUN_DIR: a second build (the same command into another folder, with DEST elsewhere so it does not ship
#   over the first), evaluated and compared in the card's reproducibility section:
#     DEST=runs/demo_repro/shipped scripts/train_demo.sh runs/demo_repro
#     scripts/train_demo.sh runs/demo 100 runs/demo_repro
# Env: DEST (default vl/demo), HELDOUT (default runs/heldout), both passed on to scripts/ship_demo.sh.
set -euo pipefail
cd "$(dirname "$0")/.."
RUN=${1:-runs/demo}
N=${2:-100}
SECOND=${3:-}
VL=${VL:-.venv/bin/vl}
export OMP_WAIT_POLICY=PASSIVE  # idle OpenMP threads must not spin on a shared 2-core CPU (train.py says why)

if ! grep -q '"finished": true' "$RUN/summary.json" 2>/dev/null; then  # model/ is written at every checkpoint
  "$VL" train-demo --recipe demo --out "$RUN" --no-progress
fi
BASE=$RUN/model scripts/train_demo_evs.sh "$RUN/evs"
scripts/ship_demo.sh "$RUN/evs/settle" "$N" ${SECOND:+"$SECOND/evs/settle"}
