"""Held-out synthetic clips of the demo model (data_recipes.synthetic, kind "video").

Same record format and scoring as `synthetic_docs` (see there), with one video part per record:
`"content": [{"type": "video", "video": "media/x.mp4"}]`, plus `fps` / `num_frames` kept as fields
(`vl eval make-data --out DIR` -> `DIR/video_test.jsonl`). The frame sampling used at eval
time is a runner setting and belongs in the run header.
"""

from __future__ import annotations

from eval.tasks.synthetic_docs import SyntheticDocs


class SyntheticVideo(SyntheticDocs):
    name = "synthetic_video"
    reference = "project-own held-out set (data_recipes.synthetic, split test); no external harness"
    dataset = "`vl eval make-data --out DIR` -> DIR/video_test.jsonl (data_recipes.synthetic, split test)"
    media_kind = "video"
    made_by = "video"
