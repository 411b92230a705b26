#!/usr/bin/env bash
# Evaluate a trained demo-model run and ship it with its card (the end of scripts/train_demo.sh; also how an EVS
# fine-tune chain from scripts/train_demo_evs.sh is shipped):
#   held-out eval in both reasoning modes -> FP8 / NVFP4 exports with `vl quantize` and their eval -> EVS sweeps
#   (q = 0, 0.5, 0.75, 0.9) on 200 64-frame and 500 8-frame held-out clips -> [a second run's eval] -> copy the
#   model, its training history and the card into DEST (vl/demo).
# Usage: scripts/ship_demo.sh RUN_DIR [N_PER_FAMILY=100] [SECOND_RUN_DIR]
#   SECOND_RUN_DIR: the same training run again (for a fine-tune: the last run of a second chain), evaluated here
#   and compared in the card's reproducibility section.
# Env: DEST (default vl/demo), HELDOUT (where the held-out clips are written once, default runs/heldout).
set -euo pipefail
cd "$(dirname "$0")/.."
RUN=${1:?usage: scripts/ship_demo.sh RUN_DIR [N_PER_FAMILY] [SECOND_RUN_DIR]}
N=${2:-100}
SECOND=${3:-}
VL=${VL:-.venv/bin/vl}
PY=${PY:-.venv/bin/python}
HELDOUT=${HELDOUT:-runs/heldout}
export OMP_WAIT_POLICY=PASSIVE  # idle OpenMP threads must not spin on a shared 2-core CPU (train.py says why)

"$PY" scripts/demo_eval.py --model "$RUN/model" --n "$N" --out "$RUN/eval"
for fmt in fp8 nvfp4; do
  "$VL" quantize --format "$fmt" --model "$RUN/model" --out "$RUN/$fmt" --overwrite --no-progress
  "$PY" scripts/demo_eval.py --model "$RUN/$fmt" --n "$N" --out "$RUN/eval_$fmt"
done
"$PY" - "$HELDOUT" "$RUN/model" <<'PYEOF'
import json, sys
from pathlib import Path
from data_recipes.synthetic import export_split
out, tile = Path(sys.argv[1]), json.loads((Path(sys.argv[2]) / "config.json").read_text())["force_image_size"]
for name, n, frames in (("video64", 200, 64), ("video8", 500, 8)):
    if not (out / name / "video_test.jsonl").is_file():
        export_split(kind="video", split="test", n=n, out_dir=out / name, tile_size=tile, num_frames=frames, fps=2.0)
PYEOF
sweeps=
for clips in video64 video8; do
  "$VL" eval --model "$RUN/model" --task synthetic_video --data "$HELDOUT/$clips/video_test.jsonl" \
    --out "$RUN/evs_$clips" --batch-size 8 --no-progress --resume --sweep video_pruning_rate=0,0.5,0.75,0.9
  sweeps=${sweeps:+$sweeps,}$RUN/evs_$clips
done
second=()
if [ -n "$SECOND" ]; then
  "$PY" scripts/demo_eval.py --model "$SECOND/model" --n "$N" --out "$SECOND/eval"
  second=(--second-run "$SECOND")
fi
"$PY" scripts/demo_eval.py --model "$RUN/model" --n "$N" --out "$RUN/eval" --results "$RUN/eval/results.json" \
  --quant-results "fp8=$RUN/eval_fp8/results.json,nvfp4=$RUN/eval_nvfp4/results.json" --sweeps "$sweeps" \
  "${second[@]}" --ship "${DEST:-vl/demo}" --run "$RUN"
