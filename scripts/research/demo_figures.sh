#!/usr/bin/env bash
# Token-reduction and eval figures on the shipped demo model, one run each:
#  - EVS sweep on 64-frame held-out clips (q = 0, 0.5, 0.75, 0.9): accuracy, vision tokens, time to first token;
#  - 10-page held-out documents: blank-tile skipping and document-wide redundant-token pruning (0 to 0.9);
#  - items/s on the 8-frame video and the document test sets, batch 1 against batch 8.
# Writes under OUT (default runs/figures): each run's summary.json/.md, and sweep.md/.png per sweep.
# Usage: scripts/research/demo_figures.sh [OUT=runs/figures] [N_VIDEO=40] [N_DOCS=40]   (the README's figures: runs/figures 200 200)
set -euo pipefail
cd "$(dirname "$0")/../.."
OUT=${1:-runs/figures}
NV=${2:-40}
ND=${3:-40}
VL=${VL:-.venv/bin/vl}
PY=${PY:-.venv/bin/python}
export OMP_WAIT_POLICY=PASSIVE
MODEL=${MODEL:-vl/demo}
TILE=$("$PY" -c "import json,sys; print(json.load(open(sys.argv[1] + '/config.json'))['force_image_size'])" "$MODEL")

"$PY" - "$OUT" "$NV" "$ND" "$TILE" <<'PYEOF'
import sys
from pathlib import Path
from data_recipes.synthetic import export_split, families
out, nv, nd, tile = Path(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
def once(d, **kw):
    if not any((out / d).glob("*_test.jsonl")):
        export_split(out_dir=out / d, **kw)
once("video64", kind="video", split="test", n=nv, tile_size=tile, num_frames=64, fps=2.0)
once("doc10", kind="document", split="test", n=nd, tile_size=tile, families=["doc_multipage"], min_pages=10, max_pages=10)
once("video8", kind="video", split="test", n=nv, tile_size=tile, num_frames=8, fps=2.0)
once("docs", kind="document", split="test", n=nd, tile_size=tile)
PYEOF

"$VL" eval --model "$MODEL" --task synthetic_video --data "$OUT/video64/video_test.jsonl" --out "$OUT/evs64" --no-progress \
  --sweep video_pruning_rate=0,0.5,0.75,0.9
"$VL" eval --model "$MODEL" --task synthetic_docs --data "$OUT/doc10/document_test.jsonl" --out "$OUT/doc10_blank" --no-progress \
  --sweep skip_blank_tiles=off,on
"$VL" eval --model "$MODEL" --task synthetic_docs --data "$OUT/doc10/document_test.jsonl" --out "$OUT/doc10_prune" --no-progress \
  --sweep token_pruning_rate=0,0.5,0.75,0.8,0.9
for b in 1 8; do
  "$VL" eval --model "$MODEL" --task synthetic_video --data "$OUT/video8/video_test.jsonl" --out "$OUT/video8_b$b" --batch-size "$b" --no-progress
  "$VL" eval --model "$MODEL" --task synthetic_docs --data "$OUT/docs/document_test.jsonl" --out "$OUT/docs_b$b" --batch-size "$b" --no-progress
done
