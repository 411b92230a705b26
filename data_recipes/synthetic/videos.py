"""Synthetic clips with known answers: motion direction, colour, order, flash counting, timing.

Each clip is `num_frames` (8-64) square frames of `tile_size` px over a static background with a little
grey furniture, so the only change between frames is the event asked about (as in MLVU's needle/order/
count types, at toy scale). `video_direction`, `video_order`, `video_flash` and `video_when` cannot be
answered from any single frame: the answer lives in how frames differ over time.

Clips are meant to be read back with every frame kept (sampling at the clip's own fps; 64 frames is
below the model's 128-frame cap): a one-frame flash or an appearance time would be lost to subsampling.
`video_when` answers with the frame time that the prompt's frame header shows for the first frame in
which the object is visible, `frame_time_str(k, fps)` (common.py).

Each generator is `gen(seed, index, *, tile_size=128, num_frames=8, fps=2.0) -> Sample`, pure.
"""

from __future__ import annotations

from PIL import Image, ImageDraw

from vl.errors import ConfigError

from .common import (
    COLOURS,
    GREY,
    SHAPES,
    Sample,
    balanced_class,
    check_clip,
    check_tile_size,
    draw_shape,
    frame_time_str,
    pick,
    rng_for,
    sample_id,
)

DIRECTIONS = ("left", "right", "up", "down")
BACKGROUNDS = [(250, 250, 250), (236, 240, 246), (246, 240, 228), (232, 244, 232)]
MAX_FLASHES = 4


def _sample(family, seed, index, question, answer, reasoning, chance, cls, n_classes, frames, fps,
            **meta) -> Sample:
    meta.update(family=family, seed=seed, index=index, class_index=cls, n_classes=n_classes)
    return Sample(
        id=sample_id(family, seed, index),
        family=family,
        kind="video",
        question=question,
        answer=answer,
        reasoning=reasoning,
        chance=chance,
        media=frames,
        fps=float(fps),
        metadata=meta,
    )


def _background(rng, S: int) -> Image.Image:
    """Flat light background with one or two pale grey blocks that never move."""
    bg = Image.new("RGB", (S, S), BACKGROUNDS[int(rng.integers(len(BACKGROUNDS)))])
    draw = ImageDraw.Draw(bg)
    for _ in range(int(rng.integers(1, 3))):
        x, y = (int(v) for v in rng.integers(0, int(0.8 * S), size=2))
        w, h = (int(v) for v in rng.integers(int(0.08 * S), int(0.2 * S), size=2))
        draw.rectangle([x, y, x + w, y + h], fill=(215, 215, 215))
    return bg


def _render(bg: Image.Image, objects) -> Image.Image:
    """One frame: the background plus `objects`, each (shape, rgb, cx, cy, r), drawn in order."""
    frame = bg.copy()
    draw = ImageDraw.Draw(frame)
    for shape, rgb, cx, cy, r in objects:
        draw_shape(draw, shape, cx, cy, r, rgb)
    return frame


def _place(rng, S: int, r: float, avoid=(), min_dist: float = 0.0, tries: int = 200):
    """A centre keeping the shape inside the frame and at least `min_dist` from each `avoid` point."""
    for _ in range(tries):
        x, y = (float(v) for v in rng.uniform(r + 2, S - r - 2, size=2))
        if all((x - ax) ** 2 + (y - ay) ** 2 >= min_dist**2 for ax, ay in avoid):
            return x, y
    raise ConfigError(f"could not place a shape of radius {r:.1f} in a {S} px frame; use a larger tile_size")


def _setup(fam, seed, index, tile_size, num_frames, fps, n_classes):
    S = check_tile_size(tile_size)
    check_clip(num_frames, fps)
    return S, rng_for(seed, fam, index), balanced_class(seed, fam, index, n_classes)


def _side(pos: float, S: int, axis: str) -> str:
    third = "left" if pos < S / 3 else "right" if pos > 2 * S / 3 else "middle"
    if axis == "y":
        third = {"left": "top", "right": "bottom", "middle": "middle"}[third]
    return third


def video_direction(seed: int, index: int, *, tile_size: int = 128, num_frames: int = 8,
                    fps: float = 2.0) -> Sample:
    """One shape crosses at least half the frame left, right, up or down; maybe a static distractor."""
    fam = "video_direction"
    S, rng, cls = _setup(fam, seed, index, tile_size, num_frames, fps, len(DIRECTIONS))
    direction = DIRECTIONS[cls]
    r = 0.1 * S
    colour, shape = pick(rng, tuple(COLOURS)), pick(rng, SHAPES)
    start = float(rng.uniform(r + 2, 0.3 * S))
    end = float(rng.uniform(0.7 * S, S - r - 2))
    if direction in ("left", "up"):
        start, end = S - start, S - end
    across = float(rng.uniform(r + 2, S - r - 2))
    horizontal = direction in ("left", "right")
    bg = _background(rng, S)
    static = []
    if rng.integers(2):  # a distractor that does not move, off the mover's path
        d_colour, d_shape = pick(rng, tuple(COLOURS), exclude=(colour,)), pick(rng, SHAPES)
        for _ in range(50):
            d_across = float(rng.uniform(r + 2, S - r - 2))
            if abs(d_across - across) > 2.4 * r:
                d_along = float(rng.uniform(r + 2, S - r - 2))
                xy = (d_along, d_across) if horizontal else (d_across, d_along)
                static = [(d_shape, COLOURS[d_colour], xy[0], xy[1], r)]
                break
    frames, track = [], []
    for i in range(num_frames):
        along = start + (end - start) * i / (num_frames - 1)
        x, y = (along, across) if horizontal else (across, along)
        track.append((x, y))
        frames.append(_render(bg, static + [(shape, COLOURS[colour], x, y, r)]))
    axis = "x" if horizontal else "y"
    reasoning = f"the {colour} {shape} starts {_side(start, S, axis)} and ends {_side(end, S, axis)}"
    return _sample(fam, seed, index, f"Which way does the {colour} {shape} move?", direction, reasoning,
                   1 / len(DIRECTIONS), cls, len(DIRECTIONS), frames, fps, track=track, colour=colour,
                   shape=shape, distractor=bool(static))


def video_colour(seed: int, index: int, *, tile_size: int = 128, num_frames: int = 8,
                 fps: float = 2.0) -> Sample:
    """A coloured shape appears part-way through and stays; a grey shape may sit there from the start."""
    fam = "video_colour"
    names = tuple(COLOURS)
    S, rng, cls = _setup(fam, seed, index, tile_size, num_frames, fps, len(names))
    colour, shape = names[cls], pick(rng, SHAPES)
    r = 0.11 * S
    k = int(rng.integers(1, num_frames))
    x, y = _place(rng, S, r)
    static = []
    if rng.random() < 0.7:
        gx, gy = _place(rng, S, r, avoid=[(x, y)], min_dist=2.3 * r)
        static = [(pick(rng, SHAPES), GREY, gx, gy, r)]
    bg = _background(rng, S)
    frames = [_render(bg, static + ([(shape, COLOURS[colour], x, y, r)] if i >= k else [])) for i in range(num_frames)]
    return _sample(fam, seed, index, "What colour is the shape that appears?", colour,
                   f"a {colour} {shape} appears in frame {k + 1}", 1 / len(names), cls, len(names), frames, fps,
                   appear_frame=k, center=(x, y), shape=shape)


def video_order(seed: int, index: int, *, tile_size: int = 128, num_frames: int = 8,
                fps: float = 2.0) -> Sample:
    """Two shapes (different shape and colour) appear at different frames and stay; which came first?
    The answer names the object as the question does ("orange triangle"); chance is 1/2 because the
    question names both candidates. (Answering with the shape alone made /no_think find the first object
    by its colour, the feature a frame's tokens hold best, and then map colour to shape through the
    question in the same forward pass: the 3600-step demo model reached 66% that way, 94% with the trace.)"""
    fam = "video_order"
    S, rng, cls = _setup(fam, seed, index, tile_size, num_frames, fps, 2)
    r = 0.11 * S
    shapes = pick(rng, SHAPES, k=2)
    colours = pick(rng, tuple(COLOURS), k=2)
    k1, k2 = sorted(int(v) for v in rng.choice(range(1, num_frames), size=2, replace=False))
    p1 = _place(rng, S, r)
    p2 = _place(rng, S, r, avoid=[p1], min_dist=2.4 * r)
    bg = _background(rng, S)
    frames = []
    for i in range(num_frames):
        objs = [(shapes[0], COLOURS[colours[0]], *p1, r)] if i >= k1 else []
        objs += [(shapes[1], COLOURS[colours[1]], *p2, r)] if i >= k2 else []
        frames.append(_render(bg, objs))
    first, second = f"{colours[0]} {shapes[0]}", f"{colours[1]} {shapes[1]}"
    a, b = (first, second) if cls == 0 else (second, first)  # cls: is the answer named first?
    return _sample(fam, seed, index, f"Which appears first, the {a} or the {b}?", first,
                   f"the {first} appears in frame {k1 + 1}, the {second} in frame {k2 + 1}", 0.5, cls, 2,
                   frames, fps, appear_frames=(k1, k2), centers=(p1, p2), shapes=shapes, colours=colours)


def video_flash(seed: int, index: int, *, tile_size: int = 128, num_frames: int = 8,
                fps: float = 2.0) -> Sample:
    """A lamp (grey ring) lights for single, never adjacent frames, 1-4 times; count the flashes."""
    fam = "video_flash"
    S, rng, cls = _setup(fam, seed, index, tile_size, num_frames, fps, MAX_FLASHES)
    count = cls + 1
    # `count` non-adjacent frames: choose slots among num_frames - count + 1, then spread by one each.
    slots = sorted(int(v) for v in rng.choice(num_frames - count + 1, size=count, replace=False))
    lit = [s + j for j, s in enumerate(slots)]
    r = 0.13 * S
    x, y = _place(rng, S, r)
    colour = pick(rng, tuple(COLOURS))
    bg = _background(rng, S)
    ImageDraw.Draw(bg).ellipse((x - r, y - r, x + r, y + r), outline=GREY, width=max(1, S // 48))
    frames = [_render(bg, [("circle", COLOURS[colour], x, y, r)] if i in lit else []) for i in range(num_frames)]
    return _sample(fam, seed, index, "How many times does the light flash?", str(count),
                   ("lit in frames " if count > 1 else "lit in frame ") + ", ".join(str(i + 1) for i in lit), 1 / MAX_FLASHES, cls, MAX_FLASHES,
                   frames, fps, lit_frames=lit, center=(x, y))


def video_when(seed: int, index: int, *, tile_size: int = 128, num_frames: int = 8,
               fps: float = 2.0) -> Sample:
    """The red circle appears at frame k >= 1 and stays; a circle of another colour may appear at a
    different frame. The answer is frame k's time as the prompt's frame header writes it."""
    fam = "video_when"
    S, rng, cls = _setup(fam, seed, index, tile_size, num_frames, fps, num_frames - 1)
    k = cls + 1
    r = 0.1 * S
    p = _place(rng, S, r)
    objs_at = [[] for _ in range(num_frames)]
    distractor = None
    if rng.random() < 0.6:
        dk = int(pick(rng, range(num_frames), exclude=(k,)))
        dp = _place(rng, S, r, avoid=[p], min_dist=2.4 * r)
        d_colour = pick(rng, tuple(COLOURS), exclude=("red", "orange", "purple"))  # clearly not red
        distractor = {"frame": dk, "colour": d_colour, "center": dp}
        for i in range(dk, num_frames):
            objs_at[i].append(("circle", COLOURS[d_colour], *dp, r))
    for i in range(k, num_frames):
        objs_at[i].append(("circle", COLOURS["red"], *p, r))
    bg = _background(rng, S)
    frames = [_render(bg, objs) for objs in objs_at]
    t = frame_time_str(k, fps)
    return _sample(fam, seed, index, "When does the red circle appear?", t,
                   f"the red circle first shows in frame {k + 1}, at {t} seconds", 1 / (num_frames - 1), cls,
                   num_frames - 1, frames, fps, appear_frame=k, center=p, distractor=distractor)


def _when_classes(num_frames: int = 8, fps: float = 2.0, **_):
    return [frame_time_str(k, fps) for k in range(1, num_frames)]


_CLIP = ("num_frames", "fps")
# name -> (generator, answer classes given options, options it takes beyond tile_size)
VIDEO_FAMILIES = {
    "video_direction": (video_direction, lambda **o: list(DIRECTIONS), _CLIP),
    "video_colour": (video_colour, lambda **o: list(COLOURS), _CLIP),
    "video_order": (video_order, lambda **o: [f"{c} {s}" for c in COLOURS for s in SHAPES], _CLIP),
    "video_flash": (video_flash, lambda **o: [str(c) for c in range(1, MAX_FLASHES + 1)], _CLIP),
    "video_when": (video_when, _when_classes, _CLIP),
}
