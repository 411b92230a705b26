#!/usr/bin/env bash
# The EVS fine-tune chain that made the shipped demo model (step 2 of scripts/train_demo.sh): five
# `vl train-demo` runs, each starting from the one before, from the from-scratch demo model (recipe "demo", BASE):
#   evs_where -> evs_where again (same data stream) -> evs_pruned -> evs_pruned --seed 3 -> evs_settle
# (3480 steps, ~3 h on the 2-core build CPU). Every run resumes from its checkpoint, so the same command again
# continues an interrupted chain; a finished run is not trained again. Training is deterministic for one CPU type
# and thread count: run into a second folder and compare its log.jsonl losses or weights with the first.
# Usage: [BASE=runs/demo/model] scripts/train_demo_evs.sh [RUN_DIR=runs/demo_evs]    (the model: RUN_DIR/settle/model)
set -euo pipefail
cd "$(dirname "$0")/.."
RUN=${1:-runs/demo_evs}
VL=${VL:-.venv/bin/vl}
export OMP_WAIT_POLICY=PASSIVE  # idle OpenMP threads must not spin on a shared 2-core CPU (train.py says why)

prev=${BASE:-runs/demo/model}
if [ ! -f "$prev/config.json" ]; then
  echo "train_demo_evs.sh: no model at BASE=$prev: the chain starts from the from-scratch demo model" \
       "(\`vl train-demo --recipe demo --out runs/demo\`, or all of it: scripts/train_demo.sh)" >&2
  exit 2
fi
run() {  # run NAME RECIPE [train-demo flags...]
  local name=$1 recipe=$2
  shift 2
  # finished = the run's summary says so (model/ is also written at every checkpoint, so its presence proves nothing)
  if ! grep -q '"finished": true' "$RUN/$name/summary.json" 2>/dev/null; then
    "$VL" train-demo --recipe "$recipe" --init-from "$prev" --out "$RUN/$name" --no-progress "$@"
  fi
  prev=$RUN/$name/model
}
run where evs_where
run where2 evs_where
run pruned evs_pruned
run pruned2 evs_pruned --seed 3
run settle evs_settle
echo "model: $prev"
