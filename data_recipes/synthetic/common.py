"""Shared pieces of the synthetic generators: the `Sample` record, seeding, colours, fonts, shapes.

Every generator is a pure function of `(seed, index)` plus explicit options: its random stream is a
NumPy `SeedSequence([seed, family_id, index])` (family ids are CRC32s of the family name, not Python's
salted `hash`), so a sample never depends on global state, on call order, or on other samples.
Answer classes are balanced by construction: within each block of `n_classes` consecutive indices of a
family, every class is the answer exactly once (`balanced_class`).

Frame times come from `vl.processing.video.frame_timestamps` with the reference convention, the same call
the processor makes (the Nano V2 VL rule, docs/format.md §9.3: `t_i = i * int(1000 / fps) / 1000`),
written with two decimals as the frame header writes them.
"""

from __future__ import annotations

import functools
import zlib
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from PIL import Image, ImageDraw, ImageFont

from vl.errors import ConfigError
from vl.processing.video import frame_timestamps

# Strong, well separated hues; names are the canonical answers of the colour questions.
COLOURS: dict[str, tuple[int, int, int]] = {
    "red": (220, 30, 30),
    "green": (20, 150, 40),
    "blue": (30, 70, 225),
    "yellow": (235, 195, 0),
    "purple": (135, 40, 175),
    "orange": (245, 125, 0),
}
INK = (20, 20, 20)  # text colour
GREY = (150, 150, 150)  # furniture and filler; never an answer colour
PAPER = [(255, 255, 255), (250, 246, 234), (240, 242, 245), (246, 250, 240)]  # page backgrounds
SHAPES = ("circle", "square", "triangle")

MIN_TILE, MAX_TILE = 32, 1024
MIN_FRAMES, MAX_FRAMES = 8, 64


@dataclass(frozen=True)
class Sample:
    """One question with a known answer about one document or clip.

    `media` holds PIL RGB images: the pages of a document (1..10) or the frames of a clip (for a sound, one float32
    waveform at 16 kHz, data_recipes/synthetic/audio.py); `fps` is
    set for clips only (frame i is shown at `frame_time_str(i, fps)`). `answer` is the short canonical
    string the scorer compares against; `reasoning` a few words for the /think block; `chance` the
    accuracy of uniform guessing over the family's answer classes for this question.
    """

    id: str
    family: str
    kind: str  # "document" | "video" | "audio"
    question: str
    answer: str
    reasoning: str
    chance: float
    media: list[Image.Image]
    fps: float | None = None
    metadata: dict[str, Any] = field(default_factory=dict)

    @property
    def num_frames(self) -> int:
        return len(self.media) if self.kind == "video" else 0

    @property
    def num_pages(self) -> int:
        return len(self.media) if self.kind == "document" else 0


def family_id(family: str) -> int:
    return zlib.crc32(family.encode("utf-8"))


def rng_for(seed: int, family: str, index: int) -> np.random.Generator:
    """The private random stream of sample `index` of `family` under `seed`."""
    if seed < 0 or index < 0:
        raise ConfigError(f"seed and index must be >= 0; found seed={seed}, index={index}")
    return np.random.default_rng(np.random.SeedSequence([seed, family_id(family), index]))


def balanced_class(seed: int, family: str, index: int, n_classes: int) -> int:
    """Class of sample `index`: a fresh permutation of the classes per block of `n_classes` indices."""
    block, slot = divmod(index, n_classes)
    perm = np.random.default_rng(
        np.random.SeedSequence([seed, family_id(family), block, 0xBA1A])
    ).permutation(n_classes)
    return int(perm[slot])


def sample_id(family: str, seed: int, index: int) -> str:
    return f"{family}/s{seed}/i{index}"


def frame_time(frame_index: int, fps: float) -> float:
    """Seconds at which frame `frame_index` (0-based) is shown, by the prompt's frame-header rule."""
    return frame_timestamps([frame_index], fps, "reference")[0]


def frame_time_str(frame_index: int, fps: float) -> str:
    return f"{frame_time(frame_index, fps):.2f}"


def check_tile_size(tile_size: int) -> int:
    if not isinstance(tile_size, int) or tile_size % 2 or not MIN_TILE <= tile_size <= MAX_TILE:
        raise ConfigError(
            f"tile_size must be an even int in [{MIN_TILE}, {MAX_TILE}] (yuv420p needs even sides); "
            f"found {tile_size!r}. Use 64 or 128 for the demo model."
        )
    return tile_size


def check_clip(num_frames: int, fps: float) -> None:
    if not isinstance(num_frames, int) or not MIN_FRAMES <= num_frames <= MAX_FRAMES:
        raise ConfigError(f"num_frames must be an int in [{MIN_FRAMES}, {MAX_FRAMES}]; found {num_frames!r}")
    if not fps > 0 or fps > 120:
        raise ConfigError(f"fps must be in (0, 120]; found {fps!r}")


@functools.lru_cache(maxsize=64)
def font(size: int) -> ImageFont.FreeTypeFont:
    """Pillow's bundled scalable font (no download); sizes below 6 px are unreadable, so clamp."""
    return ImageFont.load_default(size=max(6, int(size)))


def text_size(text: str, size: int) -> tuple[int, int]:
    left, top, right, bottom = font(size).getbbox(text)
    return right - left, bottom - top


def hairline(page: int) -> int:
    """The width of a thin line on a `page`-px page: about 1% of it, at least 1 px (1 px at the demo's 96).

    Widths, like everything else on a page, are relative to the page, so a page rendered large and resized
    to the model's tile looks like one rendered at the tile size.
    """
    return max(1, round(page / 96))


def text_stroke(size: int, page: int) -> int:
    """Stroke width for `size`-px text on a `page`-px page: a hairline for text of at least 14.5% of the
    page, none for smaller text (it would blot); at 96 px, 1 px from 14 px text up."""
    return hairline(page) if size >= 0.145 * page else 0


def draw_text(draw: ImageDraw.ImageDraw, xy: tuple[int, int], text: str, size: int, fill=INK, *,
              page: int) -> tuple:
    """Draws `text` with its ink box's top-left at `xy` on a `page`-px page; returns the box with the stroke."""
    f = font(size)
    left, top, _, _ = f.getbbox(text)
    stroke = text_stroke(size, page)
    pos = (xy[0] - left, xy[1] - top)
    draw.text(pos, text, font=f, fill=fill, stroke_width=stroke, stroke_fill=fill)
    w, h = text_size(text, size)
    return (xy[0], xy[1], xy[0] + w + 2 * stroke, xy[1] + h + 2 * stroke)


def new_page(size: int, rng: np.random.Generator) -> Image.Image:
    return Image.new("RGB", (size, size), PAPER[int(rng.integers(len(PAPER)))])


def star_points(cx: float, cy: float, r: float) -> list[tuple[float, float]]:
    """Five-pointed star, inner radius 0.45 r, first point up."""
    pts = []
    for k in range(10):
        rad = r if k % 2 == 0 else 0.45 * r
        ang = -np.pi / 2 + k * np.pi / 5
        pts.append((cx + rad * np.cos(ang), cy + rad * np.sin(ang)))
    return pts


def draw_shape(draw: ImageDraw.ImageDraw, shape: str, cx: float, cy: float, r: float, fill) -> None:
    """Filled shape of half-size `r` centred at (cx, cy)."""
    box = (cx - r, cy - r, cx + r, cy + r)
    if shape == "circle":
        draw.ellipse(box, fill=fill)
    elif shape in ("square", "box"):
        draw.rectangle(box, fill=fill)
    elif shape == "triangle":
        draw.polygon([(cx, cy - r), (cx + r, cy + r), (cx - r, cy + r)], fill=fill)
    elif shape == "star":
        draw.polygon(star_points(cx, cy, r), fill=fill)
    else:
        raise ConfigError(f"unknown shape {shape!r}; expected one of {SHAPES + ('star', 'box')}")


def pick(rng: np.random.Generator, options, k: int | None = None, exclude=()):
    """Uniform choice from `options` minus `exclude`; `k` distinct items when given."""
    pool = [o for o in options if o not in exclude]
    if k is None:
        return pool[int(rng.integers(len(pool)))]
    return [pool[i] for i in rng.permutation(len(pool))[:k]]
