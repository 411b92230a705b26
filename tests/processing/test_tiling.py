"""vl/processing/images.py tiling (docs/format.md §4.2) and normalization (§4.1), compared with references.

What is compared:
- `find_grid` against (a) the §4.2 pseudocode written out literally below, with its Python-set candidate order,
  and (b) transformers' `got_ocr2.get_optimal_tiled_canvas`, the same InternVL algorithm, on a table of sizes
  (ties, 1x1, 32x32, extreme panoramas) and a sweep;
- pixel values of `preprocess_image` against `GotOcr2ImageProcessorPil` (PIL bicubic, same as ours: must
  match exactly) and `GotOcr2ImageProcessor` (torchvision bicubic+antialias on tensors: within 2/255 per pixel).
transformers' `nemotron_h_omni` image processor is *not* compared: it implements the Omni model's dynamic
patch-budget resize, not the V2 tiling.
"""

import functools
import os
import sys

import numpy as np
import pytest
import torch
from PIL import Image

sys.path.insert(0, os.path.dirname(__file__))
from media_fixtures import encode, noise_image  # noqa: E402

from vl.errors import ConfigError  # noqa: E402
from vl.processing.images import find_grid, normalize, preprocess_image, tile_uint8  # noqa: E402

CLIP_MEAN, CLIP_STD = (0.48145466, 0.4578275, 0.40821073), (0.26862954, 0.26130258, 0.27577711)


# --- tiling (§4.2) ---------------------------------------------------------------------------------------


@functools.lru_cache(maxsize=None)
def _reference_ratios(max_num_tiles):
    return sorted(
        {(i, j) for n in range(1, max_num_tiles + 1) for i in range(1, n + 1) for j in range(1, n + 1)
         if 1 <= i * j <= max_num_tiles},
        key=lambda g: g[0] * g[1],
    )


def _reference_grid(width, height, max_num_tiles, tile_size=512):
    """§4.2 pseudocode, literally, including its set-ordered candidates."""
    ar, best, best_diff = width / height, (1, 1), float("inf")
    for i, j in _reference_ratios(max_num_tiles):
        d = abs(ar - i / j)
        if d < best_diff:
            best, best_diff = (i, j), d
        elif d == best_diff and width * height > 0.5 * tile_size * tile_size * i * j:
            best = (i, j)
    return best


_TABLE = [
    # (W, H, max_tiles, expected (cols, rows)) — ties marked
    (1, 1, 12, (1, 1)), (32, 32, 12, (1, 1)),
    (1024, 1024, 12, (2, 2)),  # tie (1,1)/(2,2)/(3,3): area 1.05M > 0.5*S^2*4 but not > 0.5*S^2*9
    (2048, 2048, 12, (3, 3)),  # same tie, larger area
    (1024, 512, 12, (2, 1)),  # tie (2,1)/(4,2): area too small for (4,2)
    (2048, 1024, 12, (4, 2)),  # tie (2,1)/(4,2): area large enough
    (1250, 1000, 12, (4, 3)),  # ties at d=0.25 then (4,3) strictly closer
    (2048, 1536, 12, (4, 3)), (1536, 2048, 12, (3, 4)), (1000, 600, 12, (3, 2)),
    (10000, 10, 12, (12, 1)), (10, 10000, 12, (1, 12)), (65535, 1, 12, (12, 1)), (1, 65535, 12, (1, 12)),
    (1920, 1080, 12, (4, 2)),  # tie (2,1)/(4,2) at d=0.222, area 2.07M > 0.5*S^2*8
    (1280, 720, 12, (2, 1)),  # same tie, area 0.92M too small for (4,2)
    (1080, 1920, 12, (2, 4)), (3000, 1000, 12, (6, 2)), (1000, 3000, 4, (1, 3)),
    (4000, 3000, 6, (3, 2)), (800, 600, 1, (1, 1)),
]


@pytest.mark.parametrize("w, h, m, expected", _TABLE)
def test_grid_table(w, h, m, expected):
    assert find_grid(w, h, m) == expected == _reference_grid(w, h, m)


def test_grid_equals_reference_and_transformers_on_a_sweep():
    from transformers.models.got_ocr2.image_processing_got_ocr2 import get_optimal_tiled_canvas

    sizes = [1, 31, 32, 256, 511, 512, 513, 768, 1000, 1024, 1280, 1536, 2048, 3000, 4096, 9000]
    for m in (1, 2, 4, 6, 9, 12):
        for w in sizes:
            for h in sizes:
                ours = find_grid(w, h, m)
                assert ours == _reference_grid(w, h, m), (w, h, m)
                assert ours == tuple(get_optimal_tiled_canvas((h, w), (512, 512), 1, m)), (w, h, m)


@pytest.mark.parametrize("w, h, m", [(1, 1, 12), (32, 32, 12), (1000, 600, 12), (10000, 10, 12), (900, 700, 1)])
def test_tile_count_and_thumbnail_rule(w, h, m):
    tiles, (cols, rows) = tile_uint8(noise_image(w, h), 64, m)
    assert tiles.shape[1:] == (64, 64, 3)
    assert tiles.shape[0] == cols * rows + (1 if cols * rows > 1 else 0)
    assert cols * rows <= m


def test_tiles_row_major_and_thumbnail_last():
    # 4 colored quadrants of a 2x2-grid image, and a thumbnail equal to a direct S x S resize
    im = Image.new("RGB", (128, 128))
    for k, color in enumerate([(255, 0, 0), (0, 255, 0), (0, 0, 255), (255, 255, 0)]):
        im.paste(color, ((k % 2) * 64, (k // 2) * 64, (k % 2) * 64 + 64, (k // 2) * 64 + 64))
    tiles, grid = tile_uint8(im, 64, 4)
    assert grid == (2, 2) and tiles.shape[0] == 5
    assert [tuple(t[32, 32]) for t in tiles[:4]] == [(255, 0, 0), (0, 255, 0), (0, 0, 255), (255, 255, 0)]
    np.testing.assert_array_equal(tiles[4], np.asarray(im.resize((64, 64), Image.Resampling.BICUBIC)))
    _, no_thumb_grid = tile_uint8(im, 64, 4, use_thumbnail=False)
    assert tile_uint8(im, 64, 4, use_thumbnail=False)[0].shape[0] == 4 and no_thumb_grid == (2, 2)


def test_normalization_uses_given_mean_std():
    im = Image.new("RGB", (16, 16), (255, 0, 51))
    out = preprocess_image(im, norm_mean=(0.5, 0.25, 0.1), norm_std=(0.5, 0.25, 0.2), tile_size=16)
    expected = torch.tensor([(1 - 0.5) / 0.5, (0 - 0.25) / 0.25, (0.2 - 0.1) / 0.2])
    torch.testing.assert_close(out.pixel_values[0, :, 3, 3], expected)
    assert out.pixel_values.dtype == torch.float32 and out.pixel_values.shape == (1, 3, 16, 16)
    assert out.pixel_values.is_contiguous()  # NCHW, not a channels-last view of the HWC pixels
    with pytest.raises(ConfigError):
        preprocess_image(im, norm_mean=(0.5, 0.5), norm_std=(1, 1, 1), tile_size=16)


def test_table_normalization_is_bit_identical_to_the_formula():
    pixels = np.random.default_rng(0).integers(0, 256, (2, 8, 8, 3), dtype=np.uint8)
    x = torch.from_numpy(pixels).permute(0, 3, 1, 2).float()
    mean, std = torch.tensor(CLIP_MEAN).view(1, 3, 1, 1), torch.tensor(CLIP_STD).view(1, 3, 1, 1)
    assert torch.equal(normalize(pixels, CLIP_MEAN, CLIP_STD), (x / 255.0 - mean) / std)


@pytest.mark.parametrize("size", [(1000, 600), (300, 200), (1024, 768), (64, 64)])
def test_pixels_match_transformers_got_ocr2(size):
    from PIL import ImageFilter
    from transformers.models.got_ocr2.image_processing_got_ocr2 import GotOcr2ImageProcessor
    from transformers.models.got_ocr2.image_processing_pil_got_ocr2 import GotOcr2ImageProcessorPil

    im = noise_image(*size).filter(ImageFilter.GaussianBlur(2))
    ours = preprocess_image(encode(im, "PNG"), norm_mean=CLIP_MEAN, norm_std=CLIP_STD)
    kwargs = dict(size={"height": 512, "width": 512}, crop_to_patches=True, min_patches=1, max_patches=12,
                  image_mean=CLIP_MEAN, image_std=CLIP_STD)
    pil = GotOcr2ImageProcessorPil(**kwargs)(images=[im], return_tensors="pt")["pixel_values"]
    torch.testing.assert_close(ours.pixel_values, pil, atol=1e-6, rtol=0)  # same PIL bicubic: identical
    tv = GotOcr2ImageProcessor(**kwargs)(images=[im], return_tensors="pt")["pixel_values"]
    assert tv.shape == ours.pixel_values.shape
    in_levels = (tv - ours.pixel_values).abs() * torch.tensor(CLIP_STD).view(1, 3, 1, 1) * 255
    assert in_levels.max() <= 2.01 and in_levels.mean() < 0.05
