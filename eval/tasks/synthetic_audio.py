"""Held-out synthetic sounds (data_recipes.synthetic, kind "audio"): how many beeps, is the second tone higher.

For models that hear (Nemotron 3 Nano Omni). Same record format and scoring as `synthetic_docs` (see there: exact
match after `normalize_exact`, per-family accuracy beside its chance level), with one audio part per record:
`"content": [{"type": "audio", "audio": "media/x.wav"}]` (`vl eval make-data --out DIR --tasks synthetic_audio` ->
`DIR/audio_test.jsonl`). Records carry the audio tokens the model saw (`tokens.audio`) beside the vision counts.
"""

from __future__ import annotations

from eval.tasks.synthetic_docs import SyntheticDocs


class SyntheticAudio(SyntheticDocs):
    name = "synthetic_audio"
    reference = "project-own held-out set (data_recipes.synthetic, split test); no external harness"
    dataset = "`vl eval make-data --out DIR` -> DIR/audio_test.jsonl (data_recipes.synthetic, split test)"
    media_kind = "audio"
    made_by = "audio"
