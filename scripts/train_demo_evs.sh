#!/usr/bin/env bash
# The EVS fine-tune chain behind the README's `evs_settle` row (issue 8), as one command: five `vl train-demo`
# runs, each starting from the one before, from the shipped demo model (vl/demo, itself `scripts/train_demo.sh`):
#   evs_where -> evs_where again (same data stream) -> evs_pruned -> evs_pruned --seed 3 -> evs_settle
# (3480 steps, ~3 h on the 2-core build CPU). Every run resumes from its checkpoint, so the same command again
# continues an interrupted chain; a finished run is not trained again. Training is deterministic for one CPU type
# and thread count: run into a second folder and compare its log.jsonl losses or weights with the first.
# Usage: scripts/train_demo_evs.sh [RUN_DIR=runs/demo_evs]    (the model: RUN_DIR/settle/model)
set -euo pipefail
cd "$(dirname "$0")/.."
RUN=${1:-runs/demo_evs}
VL=${VL:-.venv/bin/vl}
export OMP_WAIT_POLICY=PASSIVE  # idle OpenMP threads must not spin on a shared 2-core CPU (train.py says why)

prev=${BASE:-vl/demo}
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
