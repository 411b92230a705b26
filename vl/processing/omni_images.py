"""Untrusted images -> native-resolution patch sequences, as Nemotron 3 Nano Omni wants (no 512 px tiles).

Follows transformers' `nemotron_h_omni` image processor (docs/format.md, "Omni processing"): each image keeps a
patch grid close to its own, scaled into [`min_num_patches`, `max_num_patches`] patches of `patch_size` pixels,
both sides rounded to multiples of the pixel-shuffle factor; the image is resized to exactly that grid (bicubic
with antialiasing, on float32 so that the overshoot is kept), normalised per channel, and cut into patches in
row-major order, each patch flattened channel-major as `(C, p, p)`. The images of one call share one budget
derived from the context length. Decoding, caps and typed errors are those of images.py (`load_image`).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F
from PIL import Image

from vl.errors import ConfigError, MediaError, item_names, naming
from vl.processing.images import load_image
from vl.processing.limits import DEFAULT_LIMITS, MediaLimits


class ImageAspectError(MediaError):
    """The image is so thin that no patch grid inside the budget has a side of at least one patch."""
    code = "image_aspect"


def _positive_int(value, name: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ConfigError(f"{name} must be a positive int, found {value!r}")
    return value


def merge_factor(downsample_ratio: float) -> int:
    """Patches per side that pixel shuffle merges into one token (0.5 -> 2); the ratio must invert exactly."""
    ratio = downsample_ratio
    if isinstance(ratio, bool) or not isinstance(ratio, (int, float)) or not 0 < ratio <= 1:
        raise ConfigError(f"downsample_ratio must be in (0, 1], found {downsample_ratio!r}")
    merge = round(1 / downsample_ratio)
    if abs(merge * downsample_ratio - 1) > 1e-9:
        raise ConfigError(f"1 / downsample_ratio must be an integer, found {downsample_ratio!r}")
    return merge


def check_norm(norm_mean, norm_std) -> tuple[tuple[float, ...], tuple[float, ...]]:
    mean, std = tuple(float(v) for v in norm_mean), tuple(float(v) for v in norm_std)
    if len(mean) != 3 or len(std) != 3 or any(s <= 0 for s in std):
        raise ConfigError(f"norm_mean/norm_std must be 3 values each, std > 0; found {norm_mean}, {norm_std}")
    return mean, std


@dataclass(frozen=True)
class OmniImageConfig:
    """The image processor's knobs (transformers' names). `norm_mean`/`norm_std` come from the checkpoint."""
    norm_mean: tuple[float, float, float]
    norm_std: tuple[float, float, float]
    patch_size: int = 16
    downsample_ratio: float = 0.5
    min_num_patches: int = 1024
    max_num_patches: int = 13312  # 0: no cap but the context's
    max_model_len: int = 16384  # the language model's context: caps the patches of all images of one call

    def __post_init__(self):
        mean, std = check_norm(self.norm_mean, self.norm_std)
        object.__setattr__(self, "norm_mean", mean)
        object.__setattr__(self, "norm_std", std)
        _positive_int(self.patch_size, "patch_size")
        _positive_int(self.min_num_patches, "min_num_patches")
        _positive_int(self.max_model_len, "max_model_len")
        cap = self.max_num_patches
        if isinstance(cap, bool) or not isinstance(cap, int) or cap < 0:
            raise ConfigError(f"max_num_patches must be an int >= 0 (0: no cap), found {self.max_num_patches!r}")
        merge_factor(self.downsample_ratio)

    @property
    def merge(self) -> int:
        return merge_factor(self.downsample_ratio)


def patch_budget(num_images: int, config: OmniImageConfig) -> int:
    """The most patches any one image of a call may have: the context (less 4 tokens for the image's start, end
    and the turn around it), in pre-shuffle patches, clamped into [min_num_patches, max_num_patches]; never less
    than min_num_patches per image."""
    merge = config.merge
    budget = max((config.max_model_len - 4) * merge**2, config.min_num_patches * num_images)
    if config.max_num_patches:
        budget = min(budget, config.max_num_patches)
    return max(budget, config.min_num_patches)


def _start_side(pixels: int, patch_size: int) -> int:
    """The image's own grid side before scaling: one patch more than fit whole, except for an exact even multiple
    (the reference writes `round(pixels / patch + 0.5)`, and Python rounds .5 to even)."""
    whole, rest = divmod(pixels, patch_size)
    return whole if rest == 0 and whole % 2 == 0 else whole + 1


def patch_grid(height: int, width: int, *, patch_size: int, merge: int, min_patches: int,
               max_patches: int) -> tuple[int, int]:
    """(rows, cols) of the patch grid for a `height` x `width` image: the image's own grid, shrunk (never grown) by
    one factor to at most `max_patches`, grown to at least `min_patches` when the cap allows it, then each side
    moved to a multiple of `merge`: up when the grid stays within `max_patches`, else down (never below `merge`)."""
    rows, cols = _start_side(height, patch_size), _start_side(width, patch_size)
    shrink = min(math.sqrt(max_patches / (rows * cols)), 1.0)
    rows, cols = math.floor(shrink * rows), math.floor(shrink * cols)
    if rows == 0 or cols == 0:
        raise ImageAspectError(f"the image is {width}x{height} pixels: at most {max_patches} patches of "
                               f"{patch_size} px leave a side of zero patches; crop or pad it to a less extreme "
                               "aspect ratio")
    if max_patches > min_patches and rows * cols < min_patches:
        grow = math.sqrt(min_patches / (rows * cols))
        rows, cols = math.ceil(grow * rows), math.ceil(grow * cols)
    if rest := rows % merge:
        rows = rows + merge - rest if (rows + merge - rest) * cols <= max_patches else max(merge, rows - rest)
    if rest := cols % merge:
        cols = cols + merge - rest if rows * (cols + merge - rest) <= max_patches else max(merge, cols - rest)
    return rows, cols


def resize_float(pixels: torch.Tensor, height: int, width: int) -> torch.Tensor:
    """uint8 or float (..., 3, H, W) -> float32 (..., 3, height, width): bicubic, antialiased when shrinking, on
    float32 so the overshoot past 0..255 is kept (PIL's bicubic on uint8 would clip it)."""
    x = pixels.to(torch.float32)
    if tuple(x.shape[-2:]) == (height, width):
        return x
    lead = x.shape[:-3]
    x = F.interpolate(x.reshape(-1, *x.shape[-3:]), size=(height, width), mode="bicubic", align_corners=False,
                      antialias=True)
    return x.reshape(*lead, *x.shape[-3:])


def normalize_float(pixels: torch.Tensor, norm_mean, norm_std) -> torch.Tensor:
    """float (..., 3, H, W) in 0..255 -> `(x - 255 mean) / (255 std)`: the rescale folded into the statistics, as
    the reference image processor computes it."""
    mean = torch.tensor(norm_mean, dtype=torch.float32) * 255.0
    std = torch.tensor(norm_std, dtype=torch.float32) * 255.0
    return (pixels - mean.view(3, 1, 1)) / std.view(3, 1, 1)


def to_patches(image: torch.Tensor, patch_size: int) -> torch.Tensor:
    """(C, H, W) -> (H/p * W/p, C * p * p): patches row-major, each laid out (C, p, p)."""
    c, h, w = image.shape
    rows, cols = h // patch_size, w // patch_size
    x = image.reshape(c, rows, patch_size, cols, patch_size).permute(1, 3, 0, 2, 4)  # (rows, cols, C, p, p)
    return x.reshape(rows * cols, c * patch_size * patch_size)


@dataclass
class OmniImage:
    pixel_values: torch.Tensor  # (rows * cols, 3 * p * p) float32
    grid: tuple[int, int]  # (rows, cols) in patches
    image_size: tuple[int, int]  # (width, height) after EXIF orientation
    num_tokens: int  # placeholders it fills: rows * cols / merge**2

    @property
    def num_patches(self) -> int:
        return int(self.pixel_values.shape[0])


def _chw_uint8(image) -> torch.Tensor:
    """RGB PIL image or (H, W, 3) uint8 array -> (3, H, W) uint8 tensor."""
    a = np.asarray(image)
    if a.dtype != np.uint8 or a.ndim != 3 or a.shape[-1] != 3:
        raise ValueError(f"expected RGB uint8 pixels (H, W, 3), found {a.dtype} {a.shape}")
    return torch.from_numpy(np.array(a, copy=True)).permute(2, 0, 1)  # PIL's arrays are read-only


def preprocess_omni_images(images: Sequence, config: OmniImageConfig) -> list[OmniImage]:
    """Decoded RGB images (PIL or (H, W, 3) uint8) of one call -> one `OmniImage` each, sharing the call's budget."""
    budget = patch_budget(len(images), config)
    p, merge = config.patch_size, config.merge
    out = []
    for image in images:
        pixels = _chw_uint8(image)  # (3, H, W)
        height, width = pixels.shape[-2:]
        rows, cols = patch_grid(height, width, patch_size=p, merge=merge, min_patches=config.min_num_patches,
                                max_patches=budget)
        x = normalize_float(resize_float(pixels, rows * p, cols * p), config.norm_mean, config.norm_std)
        out.append(OmniImage(to_patches(x, p), (rows, cols), (int(width), int(height)), rows * cols // merge**2))
    return out


def load_omni_images(sources: Sequence, config: OmniImageConfig, *, limits: MediaLimits = DEFAULT_LIMITS,
                     isolate: bool = False) -> list[OmniImage]:
    """Untrusted images (bytes, local paths, file objects or PIL images) of one call -> `OmniImage`s. Every cap of
    images.py holds before a pixel is decoded; `isolate=True` decodes in a sandbox worker. The resize to the patch
    grid runs here, on the decoded picture (the grid depends on the call's other images). Of several images, the one
    that fails is named in the error ("image 2 of 3: ...")."""
    decoded: list[Image.Image] = []
    for s, name in zip(sources, item_names(["image"] * len(sources))):
        with naming(name):
            decoded.append(load_image(s, limits, isolate=isolate))
    return preprocess_omni_images(decoded, config)
