"""The one interface every token reducer speaks: `(tokens, layout) -> Reduction`.

Uniform interfaces across variants (timm's `forward_features`; docs/design.md §4): EVS for video and the
document reducers take the same inputs and return the same record, so the VL model applies any of
them between the projector and the placeholder merge with one code path, and one contract test
covers all of them (tests/token_reduction/test_reducer_contract.py).

Two stages exist:
- "post_projector": `tokens` are one item's projector outputs `(groups * height * width, D)` in
  (group, row, col) order; the keep mask is per token.
- "pre_encoder": `tokens` are one image's tiles `(groups, C, S, S)`; the keep mask is per tile and
  a kept tile later yields `height * width` LLM tokens.
In both, `counts[g]` is the number of LLM tokens group g contributes after reduction, which is what
the prompt needs (per-frame headers for video, `<image>` runs for pages).

Rules every reducer keeps: strength 0 is the identity, kept rows stay in their original order,
the result is a pure function of the inputs (stable sorts, no randomness), and
`reduction.tokens == tokens[reduction.keep]`.

This package is pure tensor code and never imports `vl` (docs/design.md §1, import direction); its one
error type, `ReductionError`, is a `ValueError` that the `vl` layer maps to its `InputError`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol, runtime_checkable

import torch

Stage = Literal["pre_encoder", "post_projector"]


class ReductionError(ValueError):
    """Bad arguments to a reducer (rate out of range, shapes that do not match the layout, ...).

    The message says what was expected, what was found and what to do. `vl` maps this to
    `vl.errors.InputError` (it is raised only for caller-controlled values)."""

    code = "bad_token_reduction"


@dataclass(frozen=True)
class TokenLayout:
    """How one item's tokens are grouped: `groups` frames or tiles of `height x width` tokens.

    `thumbnail` is the index of a page's global thumbnail tile (the last tile when an image has more
    than one tile, docs/format.md §4.2), or None (videos, single-tile images). `protected` lists more groups
    of that kind: the thumbnails of a multi-page document laid out as one item (`document`). Reducers
    never remove a protected group (`protected_groups`).
    """

    groups: int
    height: int
    width: int
    thumbnail: int | None = None
    protected: tuple[int, ...] = ()

    def __post_init__(self):
        for name in ("groups", "height", "width"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 0:
                raise ReductionError(f"TokenLayout.{name}: expected a non-negative int, found {value!r}")
        if self.height == 0 or self.width == 0:
            raise ReductionError(
                f"TokenLayout: expected a token grid of at least 1x1, found {self.height}x{self.width}"
            )
        if self.thumbnail is not None and not (0 <= self.thumbnail < self.groups):
            raise ReductionError(
                f"TokenLayout.thumbnail: expected an index in [0, {self.groups}) or None, found {self.thumbnail!r}"
            )
        if not isinstance(self.protected, tuple) or not all(
            isinstance(g, int) and not isinstance(g, bool) and 0 <= g < self.groups for g in self.protected
        ):
            raise ReductionError(
                f"TokenLayout.protected: expected a tuple of group indices in [0, {self.groups}), found "
                f"{self.protected!r}"
            )

    @classmethod
    def video(cls, frames: int, height: int = 16, width: int = 16) -> TokenLayout:
        """One 512x512 tile per frame -> a 16x16 token grid per frame (docs/format.md §9.2)."""
        return cls(frames, height, width, None)

    @classmethod
    def page(cls, tiles: int, height: int = 16, width: int = 16, has_thumbnail: bool | None = None) -> TokenLayout:
        """An image or PDF page cut into `tiles` tiles. The thumbnail is last and exists iff there is
        more than one tile (docs/format.md §4.2); pass `has_thumbnail=False` for `use_thumbnail=False`."""
        if has_thumbnail is None:
            has_thumbnail = tiles > 1
        return cls(tiles, height, width, tiles - 1 if has_thumbnail and tiles > 0 else None)

    @classmethod
    def document(
        cls, tiles_per_page: list[int], height: int = 16, width: int = 16, has_thumbnail: bool | None = None
    ) -> TokenLayout:
        """Several pages (or images) as one item, pages in order: `groups` = all their tiles, and the
        thumbnail of every page that has one (its last tile, as in `page`) protected. A document-scope
        reducer then sees the whole document at once (one budget, one notion of "background")."""
        protected, start = [], 0
        for tiles in tiles_per_page:
            if not isinstance(tiles, int) or isinstance(tiles, bool) or tiles < 1:
                raise ReductionError(f"TokenLayout.document: expected tile counts >= 1 per page, found {tiles_per_page!r}")
            thumbnail = cls.page(tiles, height, width, has_thumbnail).thumbnail  # the one thumbnail rule
            if thumbnail is not None:
                protected.append(start + thumbnail)
            start += tiles
        return cls(start, height, width, None, tuple(protected))

    @property
    def protected_groups(self) -> tuple[int, ...]:
        """Groups no reducer may remove: the thumbnail and the `protected` ones, ascending."""
        extra = () if self.thumbnail is None else (self.thumbnail,)
        return tuple(sorted(set(self.protected + extra)))

    @property
    def tokens_per_group(self) -> int:
        return self.height * self.width

    @property
    def num_tokens(self) -> int:
        return self.groups * self.tokens_per_group

    def check_tokens(self, tokens: torch.Tensor) -> None:
        """Post-projector input: `(groups * height * width, D)`."""
        if not isinstance(tokens, torch.Tensor) or tokens.dim() != 2:
            found = tuple(tokens.shape) if isinstance(tokens, torch.Tensor) else type(tokens).__name__
            raise ReductionError(f"expected projector outputs of shape (N, D), found {found}")
        if tokens.shape[0] != self.num_tokens:
            raise ReductionError(
                f"expected {self.num_tokens} tokens ({self.groups} groups x {self.height}x{self.width}), "
                f"found {tokens.shape[0]}; pass the layout of exactly this item"
            )
        if not tokens.is_floating_point():
            raise ReductionError(f"expected floating-point projector outputs, found dtype {tokens.dtype}")

    def check_tiles(self, tiles: torch.Tensor) -> None:
        """Pre-encoder input: `(groups, C, S, S)` pixel tiles."""
        if not isinstance(tiles, torch.Tensor) or tiles.dim() != 4:
            found = tuple(tiles.shape) if isinstance(tiles, torch.Tensor) else type(tiles).__name__
            raise ReductionError(f"expected pixel tiles of shape (num_tiles, C, S, S), found {found}")
        if tiles.shape[0] != self.groups:
            raise ReductionError(
                f"expected {self.groups} tiles to match the layout, found {tiles.shape[0]}; "
                f"pass the layout of exactly this image"
            )


@dataclass(frozen=True)
class Reduction:
    """What a reducer returns.

    tokens: the kept rows, `tokens[keep]`, in original order.
    keep:   bool `(N,)` over the rows of the input (tokens post-projector, tiles pre-encoder).
    counts: long `(groups,)`, LLM tokens each group contributes after reduction (may be 0).
    info:   small JSON-able dict of plain Python values saying what was removed (stats / UI).
    """

    tokens: torch.Tensor
    keep: torch.Tensor
    counts: torch.Tensor
    info: dict[str, Any] = field(default_factory=dict)

    @property
    def num_kept(self) -> int:
        """LLM tokens left (sum of counts)."""
        return int(self.counts.sum())

    @property
    def num_removed(self) -> int:
        """LLM tokens saved relative to no reduction."""
        return int(self.info.get("tokens_total", self.num_kept)) - self.num_kept


@runtime_checkable
class Reducer(Protocol):
    """A reducer is a small frozen dataclass holding its settings and called per item."""

    name: str
    stage: Stage

    def __call__(self, tokens: torch.Tensor, layout: TokenLayout) -> Reduction: ...


def reduction_from_mask(
    tokens: torch.Tensor, keep: torch.Tensor, layout: TokenLayout, stage: Stage, info: dict[str, Any]
) -> Reduction:
    """Assemble a `Reduction` from a keep mask; the one place counts and totals are derived."""
    keep = keep.to(device=tokens.device, dtype=torch.bool)
    if stage == "post_projector":
        counts = keep.view(layout.groups, layout.tokens_per_group).sum(-1)  # (groups,)
    else:
        counts = keep.long() * layout.tokens_per_group  # (groups,)
    counts = counts.long()
    info = dict(info)
    info.setdefault("tokens_total", layout.num_tokens)
    info.setdefault("tokens_kept", int(counts.sum()))
    info.setdefault("tokens_removed", layout.num_tokens - int(counts.sum()))
    info.setdefault("counts", counts.tolist())
    return Reduction(tokens=tokens[keep], keep=keep, counts=counts, info=info)


def check_fraction(name: str, value: float, *, upper_inclusive: bool = False) -> float:
    """A rate in [0, 1) (or [0, 1] with `upper_inclusive`); anything else is a `ReductionError`."""
    ok = not isinstance(value, bool) and isinstance(value, (int, float)) and math.isfinite(value)
    ok = ok and 0.0 <= value and (value <= 1.0 if upper_inclusive else value < 1.0)
    if not ok:
        interval = "[0, 1]" if upper_inclusive else "[0, 1)"
        raise ReductionError(
            f"{name}: expected a number in {interval} (the fraction of tokens pruned; 0 turns reduction off), "
            f"found {value!r}"
        )
    return float(value)
