"""Blank-tile skipping: do not encode document tiles that are only whitespace.

A 12-tile page costs 13 x 256 = 3328 LLM tokens (docs/format.md §4.2), and on typical documents many
tiles are margins or empty bottoms of pages. Unlike EVS this acts *before* the vision encoder, so a
skipped tile saves ViT + projector compute as well as LLM prefill, and the processor knows the
token count up front (it simply emits 256 fewer `<image>` placeholders per skipped tile).

Statistic (training free, one pass over the pixels, documented so results are reproducible):
    dominant colour  m_c  = median of channel c over the tile (lower median, deterministic)
    ink pixel             = a pixel whose largest per-channel |x_c - m_c| exceeds `ink_delta`
                            (in [0, 1] pixel units; 0.1 ~ 25 of 255 levels, above JPEG noise and
                            paper texture, below any printed glyph)
    ink fraction          = ink pixels / all pixels
    blank                 = ink fraction < `max_ink_fraction` (strict, so 0 turns skipping off)
The default 1e-4 removes a 512x512 tile only when fewer than 27 of its 262144 pixels are ink,
so a tile holding a single printed character stays. The median, not the mean, is the reference
colour so a few dark pixels cannot drag it toward "ink".

Rules: the thumbnail (last tile of a multi-tile image) always stays, so the global view of the page
survives; an image without a thumbnail keeps at least its first tile, so no image vanishes from the
prompt. Both rules are reported in `info`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import ClassVar

import torch

from token_reduction.protocol import Reduction, ReductionError, Stage, TokenLayout, check_fraction, reduction_from_mask


def _raw_deviation_scale(tiles: torch.Tensor, pixel_std: tuple[float, ...] | None) -> torch.Tensor:
    """Per-channel factor that maps a difference of `tiles` values to [0, 1] pixel units."""
    channels = tiles.shape[1]
    if tiles.dtype == torch.uint8:
        if pixel_std is not None:
            raise ReductionError("blank tiles: got uint8 tiles and pixel_std; uint8 tiles are raw, drop pixel_std")
        return torch.full((channels,), 1 / 255)
    if not tiles.is_floating_point():
        raise ReductionError(f"blank tiles: expected uint8 or floating-point tiles, found dtype {tiles.dtype}")
    if pixel_std is None:
        lo, hi = float(tiles.min()), float(tiles.max())
        if lo < 0.0 or hi > 1.0:
            raise ReductionError(
                f"blank tiles: float tiles without pixel_std must hold raw pixels in [0, 1], found values in "
                f"[{lo:.3g}, {hi:.3g}]; for normalized tiles pass pixel_std=config norm_std"
            )
        return torch.ones(channels)
    if len(pixel_std) != channels or not all(isinstance(s, (int, float)) and s > 0 for s in pixel_std):
        raise ReductionError(
            f"blank tiles: expected pixel_std as {channels} positive numbers (the normalization std), found {pixel_std!r}"
        )
    return torch.tensor([float(s) for s in pixel_std])  # (x - mean) / std differences times std = raw units


def tile_ink_fraction(
    tiles: torch.Tensor, ink_delta: float = 0.1, pixel_std: tuple[float, ...] | None = None
) -> torch.Tensor:
    """`(num_tiles,)` fraction of pixels that differ from the tile's median colour by more than `ink_delta`.

    `tiles` are `(num_tiles, C, S, S)`, either raw (uint8, or float in [0, 1]) or normalized with
    `(x - mean) / std`, in which case pass `pixel_std` so `ink_delta` keeps its raw-pixel meaning.
    """
    if tiles.dim() != 4 or tiles.shape[0] == 0:
        raise ReductionError(f"blank tiles: expected (num_tiles >= 1, C, S, S), found {tuple(tiles.shape)}")
    scale = _raw_deviation_scale(tiles, pixel_std).to(tiles.device).view(1, -1, 1, 1)  # (1, C, 1, 1)
    x = tiles.float()  # (n, C, S, S)
    if not bool(torch.isfinite(x).all()):
        raise ReductionError("blank tiles: expected finite pixel values, found NaN or Inf")
    dominant = x.flatten(2).median(dim=-1).values  # (n, C)
    deviation = ((x - dominant[..., None, None]).abs() * scale).amax(dim=1)  # (n, S, S)
    return (deviation > ink_delta).float().mean(dim=(-2, -1))  # (n,)


def skip_blank_tiles(
    tiles: torch.Tensor,
    layout: TokenLayout,
    max_ink_fraction: float = 1e-4,
    ink_delta: float = 0.1,
    pixel_std: tuple[float, ...] | None = None,
) -> Reduction:
    """Decide which tiles of one image to encode; `layout.height * layout.width` tokens per tile (256)."""
    check_fraction("max_ink_fraction", max_ink_fraction, upper_inclusive=True)
    if isinstance(ink_delta, bool) or not isinstance(ink_delta, (int, float)) or not (0 <= ink_delta < 1):
        raise ReductionError(f"blank tiles: expected ink_delta in [0, 1) raw pixel units, found {ink_delta!r}")
    layout.check_tiles(tiles)
    if layout.groups == 0:
        raise ReductionError("blank tiles: expected an image with at least one tile, found 0 tiles")
    ink = tile_ink_fraction(tiles, ink_delta, pixel_std)  # (n,)
    blank = ink < max_ink_fraction  # (n,)
    kept_as_thumbnail = kept_first_tile = False
    if layout.thumbnail is not None and bool(blank[layout.thumbnail]):
        blank[layout.thumbnail] = False
        kept_as_thumbnail = True
    if bool(blank.all()):
        blank[0] = False
        kept_first_tile = True
    keep = ~blank
    removed = torch.nonzero(blank).flatten().tolist()
    info = {
        "method": "blank_tiles",
        "max_ink_fraction": float(max_ink_fraction),
        "ink_delta": float(ink_delta),
        "ink_fraction": [round(float(v), 6) for v in ink],
        "tiles_total": layout.groups,
        "tiles_removed": removed,
        "tokens_per_tile": layout.tokens_per_group,
        "blank_thumbnail_kept": kept_as_thumbnail,
        "blank_image_kept_first_tile": kept_first_tile,
    }
    return reduction_from_mask(tiles, keep, layout, "pre_encoder", info)


@dataclass(frozen=True)
class BlankTileSkipper:
    """Blank-tile skipping as a `Reducer` (stage "pre_encoder"); `max_ink_fraction=0` is off."""

    max_ink_fraction: float = 1e-4
    ink_delta: float = 0.1
    pixel_std: tuple[float, ...] | None = None
    name: ClassVar[str] = "blank_tiles"
    stage: ClassVar[Stage] = "pre_encoder"

    def __post_init__(self):
        check_fraction("max_ink_fraction", self.max_ink_fraction, upper_inclusive=True)
        if not isinstance(self.ink_delta, (int, float)) or not math.isfinite(self.ink_delta):
            raise ReductionError(f"blank tiles: expected a finite ink_delta, found {self.ink_delta!r}")

    def __call__(self, tiles: torch.Tensor, layout: TokenLayout) -> Reduction:
        return skip_blank_tiles(tiles, layout, self.max_ink_fraction, self.ink_delta, self.pixel_std)
