"""Which vision tokens of each tile reached the LLM, drawn on the tile: the document twin of the video tab's EVS chart.

After the projector a tile is a `side x side` grid of tokens (pixel shuffle keeps the patch grid's row-major
order; token (r, c) covers the tile's square (r, c) of size S/side). Redundant-token pruning
(token_reduction/redundant_tokens.py) drops some of them; `Stats.vision_keep` holds the keep mask over every
placeholder of the prompt, in the order of `pixel_values`. A dropped token's square is washed out in grey, so
what the model still sees stays readable. Blank tiles skipped before the encoder never became tokens at all;
they are counted in the caption line and the stats, not drawn.
"""

from __future__ import annotations

import numpy as np
import torch
from PIL import Image

WASH = np.array([205, 205, 205], dtype=np.float32)  # the grey a dropped token's square is blended towards


def keep_grids(keep: torch.Tensor | None, num_tiles: int, tokens_per_tile: int) -> list[np.ndarray] | None:
    """The keep mask (num_tiles * tokens_per_tile,) -> one (side, side) bool grid per tile; None when nothing
    was reduced."""
    if keep is None:
        return None
    side = int(round(tokens_per_tile ** 0.5))
    if side * side != tokens_per_tile or keep.numel() != num_tiles * tokens_per_tile:
        raise ValueError(f"keep mask of {keep.numel()} tokens does not fit {num_tiles} tiles of {tokens_per_tile}")
    return list(keep.detach().cpu().bool().view(num_tiles, side, side).numpy())


def draw_kept(tile: Image.Image, grid: np.ndarray, strength: float = 0.75) -> Image.Image:
    """`tile` with the squares of dropped tokens washed out (blended `strength` of the way to grey)."""
    arr = np.asarray(tile.convert("RGB"), dtype=np.float32)
    h, w = arr.shape[:2]
    rows, cols = grid.shape
    ys = (np.arange(h) * rows // h)[:, None]
    xs = (np.arange(w) * cols // w)[None, :]
    dropped = ~grid[ys, xs]  # (h, w)
    arr[dropped] = arr[dropped] * (1 - strength) + WASH * strength
    # a thin outline around each dropped square keeps the grid readable on white pages
    first_row = (np.arange(h) * rows) % h < rows  # the first pixel row of each token's square
    first_col = (np.arange(w) * cols) % w < cols
    edge = dropped & (first_row[:, None] | first_col[None, :])
    arr[edge] = arr[edge] * 0.5 + np.array([150, 150, 150], dtype=np.float32) * 0.5
    return Image.fromarray(arr.round().clip(0, 255).astype(np.uint8))


def kept_counts(grids: list[np.ndarray]) -> list[int]:
    return [int(g.sum()) for g in grids]
