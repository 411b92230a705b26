#!/usr/bin/env bash
# The documented way to (re)build the shipped demo model from scratch (issue 7):
#   train (data_recipes/train.py, recipe "demo") -> held-out eval in both reasoning modes -> FP8 / NVFP4
#   exports with `vl quantize` and their eval -> copy model + card + figures into vl/demo.
# Usage: scripts/train_demo.sh [RUN_DIR=runs/demo] [N_PER_FAMILY=100]
# Reproducibility check (the model card's section): a second run that does not ship, then the card again with it:
#   DEST=/tmp/unshipped scripts/train_demo.sh runs/demo_repro 100
#   .venv/bin/python -m data_recipes.demo_eval --model runs/demo/model --n 100 --out runs/demo/eval \
#     --results runs/demo/eval/results.json --quant-results fp8=runs/demo/eval_fp8/results.json,nvfp4=runs/demo/eval_nvfp4/results.json \
#     --ship vl/demo --run runs/demo --second-run runs/demo_repro
# A partial check (its losses only) when a whole second run does not fit: stop the second run early, e.g.
#   .venv/bin/vl train-demo --recipe demo --out runs/demo_repro --fresh --max-minutes 12   (then the same card command)
set -euo pipefail
cd "$(dirname "$0")/.."
RUN=${1:-runs/demo}
N=${2:-100}
VL=${VL:-.venv/bin/vl}
PY=${PY:-.venv/bin/python}
export OMP_WAIT_POLICY=PASSIVE  # idle OpenMP threads must not spin on a shared 2-core CPU (train.py says why)

"$VL" train-demo --recipe demo --out "$RUN" --fresh
"$PY" -m data_recipes.demo_eval --model "$RUN/model" --n "$N" --out "$RUN/eval"
for fmt in fp8 nvfp4; do
  "$VL" quantize --format "$fmt" --model "$RUN/model" --out "$RUN/$fmt" --overwrite --no-progress
  "$PY" -m data_recipes.demo_eval --model "$RUN/$fmt" --n "$N" --out "$RUN/eval_$fmt"
done
"$PY" -m data_recipes.demo_eval --model "$RUN/model" --n "$N" --out "$RUN/eval" --results "$RUN/eval/results.json" \
  --quant-results "fp8=$RUN/eval_fp8/results.json,nvfp4=$RUN/eval_nvfp4/results.json" --ship "${DEST:-vl/demo}" --run "$RUN"
