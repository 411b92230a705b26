"""Blank-tile skipping: the ink statistic, the thumbnail / last-tile rules, raw vs normalized input."""

import pytest
import torch

from token_reduction import BlankTileSkipper, ReductionError, TokenLayout, skip_blank_tiles, tile_ink_fraction

CLIP_MEAN = (0.48145466, 0.4578275, 0.40821073)
CLIP_STD = (0.26862954, 0.26130258, 0.27577711)


def _page(contents: list[str], size: int = 64, seed: int = 0) -> torch.Tensor:
    """Float [0, 1] tiles: 'white', 'noisy' (paper texture + JPEG-like noise), 'text' (dark strokes),
    'glyph' (one 6x8 dark character), 'grey' (uniform non-white)."""
    gen = torch.Generator().manual_seed(seed)
    tiles = []
    for kind in contents:
        tile = torch.ones(3, size, size) * 0.97
        if kind == "noisy":
            tile = tile + 0.02 * torch.randn(3, size, size, generator=gen)
        elif kind == "text":
            for row in range(4, size - 4, 8):
                tile[:, row : row + 3, 4 : size - 6] = 0.1
        elif kind == "glyph":
            tile[:, 10:18, 20:26] = 0.05
        elif kind == "grey":
            tile = torch.full((3, size, size), 0.6)
        elif kind != "white":
            raise AssertionError(kind)
        tiles.append(tile.clamp(0, 1))
    return torch.stack(tiles)  # (n, 3, S, S)


def test_ink_fraction_counts_pixels_exactly():
    tiles = _page(["white", "white"])
    tiles[1, :, 0:2, 0:5] = 0.0  # 10 ink pixels
    tiles[1, 0, 5, 5] = 0.97 - 0.09  # below ink_delta in one channel: not ink
    ink = tile_ink_fraction(tiles, ink_delta=0.1)
    assert ink.tolist() == [0.0, 10 / 64**2]


def test_blank_tiles_removed_content_and_thumbnail_kept():
    tiles = _page(["white", "text", "noisy", "glyph", "grey", "white"])  # last = thumbnail
    layout = TokenLayout.page(6)
    out = skip_blank_tiles(tiles, layout, max_ink_fraction=1e-3)
    assert out.keep.tolist() == [False, True, False, True, False, True]
    assert out.info["tiles_removed"] == [0, 2, 4]
    assert out.info["blank_thumbnail_kept"] is True
    assert out.num_removed == 3 * 256 and out.info["tokens_removed"] == 768
    assert out.counts.tolist() == [0, 256, 0, 256, 0, 256]
    assert torch.equal(out.tokens, tiles[out.keep])


def test_raw_uint8_and_normalized_inputs_agree():
    tiles = _page(["white", "text", "noisy", "glyph", "white"], seed=3)
    layout = TokenLayout.page(5)
    as_float = skip_blank_tiles(tiles, layout, max_ink_fraction=1e-3)
    as_uint8 = skip_blank_tiles((tiles * 255).round().to(torch.uint8), layout, max_ink_fraction=1e-3)
    mean, std = torch.tensor(CLIP_MEAN).view(3, 1, 1), torch.tensor(CLIP_STD).view(3, 1, 1)
    normalized = (tiles - mean) / std
    as_normalized = skip_blank_tiles(normalized, layout, max_ink_fraction=1e-3, pixel_std=CLIP_STD)
    assert as_float.keep.tolist() == as_uint8.keep.tolist() == as_normalized.keep.tolist() == [
        False, True, False, True, True
    ]
    # normalized tiles without pixel_std are refused instead of being misread as raw pixels
    with pytest.raises(ReductionError, match="pixel_std"):
        skip_blank_tiles(normalized, layout)


def test_default_threshold_at_full_tile_size_keeps_a_single_character():
    tiles = _page(["white", "glyph", "white"], size=512)
    out = BlankTileSkipper()(tiles, TokenLayout.page(3))
    assert out.keep.tolist() == [False, True, True]
    assert out.info["ink_fraction"][1] == pytest.approx(48 / 512**2, abs=1e-6)


def test_an_image_never_vanishes():
    single = skip_blank_tiles(_page(["white"]), TokenLayout.page(1), max_ink_fraction=0.5)
    assert single.keep.tolist() == [True] and single.info["blank_image_kept_first_tile"] is True
    no_thumb = skip_blank_tiles(_page(["white"] * 3), TokenLayout.page(3, has_thumbnail=False), max_ink_fraction=0.5)
    assert no_thumb.keep.tolist() == [True, False, False]


def test_zero_threshold_is_identity():
    tiles = _page(["white", "grey", "white"])
    out = skip_blank_tiles(tiles, TokenLayout.page(3), max_ink_fraction=0.0)
    assert out.keep.all() and torch.equal(out.tokens, tiles) and out.info["tiles_removed"] == []


def test_bad_inputs_are_typed_errors():
    tiles = _page(["white", "white"])
    with pytest.raises(ReductionError, match="expected 3 tiles"):
        skip_blank_tiles(tiles, TokenLayout.page(3))
    with pytest.raises(ReductionError, match="num_tiles, C, S, S"):
        skip_blank_tiles(tiles[0], TokenLayout.page(2))
    with pytest.raises(ReductionError, match=r"\[0, 1\]"):
        skip_blank_tiles(tiles, TokenLayout.page(2), max_ink_fraction=1.5)
    with pytest.raises(ReductionError, match="ink_delta"):
        skip_blank_tiles(tiles, TokenLayout.page(2), ink_delta=-0.1)
    with pytest.raises(ReductionError, match="pixel_std"):
        skip_blank_tiles(tiles, TokenLayout.page(2), pixel_std=(0.2, 0.2))
    with pytest.raises(ReductionError, match="uint8"):
        skip_blank_tiles((tiles * 255).to(torch.uint8), TokenLayout.page(2), pixel_std=CLIP_STD)
    bad = tiles.clone()
    bad[0, 0, 0, 0] = float("nan")
    with pytest.raises(ReductionError):
        skip_blank_tiles(bad, TokenLayout.page(2))
    with pytest.raises(ReductionError, match="thumbnail"):
        TokenLayout(2, 16, 16, thumbnail=2)
