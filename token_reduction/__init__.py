"""Token reduction: pure tensor functions that shrink what the LLM reads, applied per item.

Every reducer maps `(tokens, layout) -> Reduction(tokens, keep, counts, info)` (see `protocol`):
- `EVS` (video, after the projector): Efficient Video Sampling, docs/format.md §10.
- `BlankTileSkipper` (documents, before the encoder): whitespace tiles are never encoded.
- `RedundantTokenPruner` (documents, after the projector): near-duplicate / background tokens dropped.
This package never imports `vl`; `vl` maps `ReductionError` to its `InputError`.
"""

from token_reduction.blank_tiles import BlankTileSkipper, skip_blank_tiles, tile_ink_fraction
from token_reduction.evs import EVS, evs, frame_dissimilarity, retained_count
from token_reduction.protocol import Reducer, Reduction, ReductionError, TokenLayout
from token_reduction.redundant_tokens import RedundantTokenPruner, prune_redundant_tokens

__all__ = [
    "EVS",
    "BlankTileSkipper",
    "RedundantTokenPruner",
    "Reducer",
    "Reduction",
    "ReductionError",
    "TokenLayout",
    "evs",
    "frame_dissimilarity",
    "prune_redundant_tokens",
    "retained_count",
    "skip_blank_tiles",
    "tile_ink_fraction",
]
