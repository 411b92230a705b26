"""Redundant-token pruning for document pages, after the projector.

Document pages are mostly background: the projector outputs of whitespace positions are nearly the
same vector, and each one tells the LLM little beyond "empty here". This reducer drops such tokens
at a chosen rate, training free, in the same spirit as EVS (a similarity score, a stable top-k, kept
tokens in their original order) but comparing tokens within a page instead of across frames. It is
our own simple criterion, inspired by ToMe (arXiv 2210.09461, cosine similarity between token
features) and LLaVA-PruMerge (arXiv 2403.15388); it prunes and never merges, so every kept vector is
an unmodified projector output the LLM was trained on.

Scores, on L2-normalized projector outputs in float32 (higher = more redundant):
- "position" (the default): cosine similarity to the dominant vector of the token's own place in its tile, the
  per-dimension median over the prunable tiles of the tokens at that place, renormalized. A tower whose tokens
  carry where they are (a pretrained RADIO's position embedding survives its blocks; the demo model's EVS
  fine-tunes train it with a position loss) makes blank tokens at different places differ: on 8 held-out 10-page
  documents, the middle 80% of the shipped demo model's tokens have cosine 0.31-0.70 to the page-wide median
  (none reaches the 0.95 floor) and 0.97-1.0 to their place's median. With fewer
  than `MIN_TILES_PER_PLACE` prunable tiles a place has no majority to take a median of, and the page-wide
  "background" score is used instead.
- "background": cosine similarity to the page's dominant vector, the per-dimension median of the
  normalized tokens of the prunable tiles, renormalized. On a page that is mostly background the
  median sits in the background cluster; on a dense page it matches nothing closely and the
  similarity floor below leaves the page alone.
- "neighbour": the larger cosine similarity to the token on the left and the token above, within
  the same tile (the top-left token of a tile scores -inf). A uniform region keeps its first token.
Selection: candidates are prunable tokens with score >= `min_similarity`; the
`min(int(rate * prunable), candidates)` highest-scoring candidates are dropped (stable descending
sort, ties broken by position). `rate=0` is the identity. Thumbnail tiles (global views; every
protected group of the layout) are not prunable unless `protect_thumbnail=False`.

Scope: the item is whatever the layout describes. The VL model passes a request's pages together, as
one `TokenLayout.document` (vl/modeling/vlm.py), so the dominant vector and the budget are the
document's: pages of near-empty filler give up most of their tokens while a dense page keeps its own,
where pruning each page at the same rate would cut the dense page as deep as the empty ones. On
10-page held-out documents with the demo model, rate 0.8 keeps 18 of 90 vision tokens (two pages'
worth) with no loss of accuracy; page by page (the from-scratch model), rate 0.75 could only drop 54 (README,
token reduction).

The LLM has no positional encoding (docs/format.md §7.4), so dropping positions needs no fix-up; what the
model makes of pruned documents is an accuracy question the eval must answer (`vl eval`), not something
this module can promise.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import ClassVar, Literal

import torch
import torch.nn.functional as F

from token_reduction.protocol import Reduction, ReductionError, Stage, TokenLayout, check_fraction, reduction_from_mask

Criterion = Literal["position", "background", "neighbour"]
CRITERIA: tuple[str, ...] = ("position", "background", "neighbour")
MIN_TILES_PER_PLACE = 3  # "position": fewer prunable tiles than this and a place has no majority
NEVER = -math.inf  # the score of a token that may not be pruned


def _prunable(layout: TokenLayout, protect_thumbnail: bool, device: torch.device) -> torch.Tensor:
    prunable = torch.ones(layout.groups, layout.tokens_per_group, dtype=torch.bool, device=device)
    if protect_thumbnail and layout.protected_groups:
        prunable[list(layout.protected_groups)] = False
    return prunable.reshape(-1)  # (N,)


def background_scores(unit: torch.Tensor, prunable: torch.Tensor) -> torch.Tensor:
    """`(N,)` cosine similarity of each normalized token to the page's dominant (median) vector."""
    if not bool(prunable.any()):
        return torch.full(unit.shape[:1], NEVER, device=unit.device)
    dominant = F.normalize(unit[prunable].median(dim=0).values, dim=-1)  # (D,)
    return unit @ dominant  # (N,)


def places_have_majority(layout: TokenLayout, prunable: torch.Tensor) -> bool:
    """Whether enough whole tiles are prunable for the "position" criterion to take a median at each place."""
    return int(prunable.view(layout.groups, layout.tokens_per_group).all(-1).sum()) >= MIN_TILES_PER_PLACE


def position_scores(unit: torch.Tensor, layout: TokenLayout, prunable: torch.Tensor) -> torch.Tensor:
    """`(N,)` cosine similarity of each normalized token to the median of the prunable tokens at its place in
    the tile; the page-wide `background_scores` when fewer than `MIN_TILES_PER_PLACE` tiles are prunable."""
    tiles = prunable.view(layout.groups, layout.tokens_per_group).all(-1)  # (G,) whole tiles are (un)protected
    if not places_have_majority(layout, prunable):
        return background_scores(unit, prunable)
    grid = unit.view(layout.groups, layout.tokens_per_group, -1)  # (G, T, D)
    dominant = F.normalize(grid[tiles].median(dim=0).values, dim=-1)  # (T, D)
    return (grid * dominant).sum(-1).reshape(-1)  # (N,)


def neighbour_scores(unit: torch.Tensor, layout: TokenLayout) -> torch.Tensor:
    """`(N,)` max cosine similarity to the left and upper neighbour in the same tile."""
    grid = unit.view(layout.groups, layout.height, layout.width, -1)  # (G, H, W, D)
    scores = torch.full(grid.shape[:3], NEVER, device=unit.device)  # (G, H, W)
    left = (grid[:, :, 1:] * grid[:, :, :-1]).sum(-1)  # (G, H, W-1)
    scores[:, :, 1:] = torch.maximum(scores[:, :, 1:], left)
    up = (grid[:, 1:] * grid[:, :-1]).sum(-1)  # (G, H-1, W)
    scores[:, 1:] = torch.maximum(scores[:, 1:], up)
    return scores.reshape(-1)


def prune_redundant_tokens(
    tokens: torch.Tensor,
    layout: TokenLayout,
    rate: float,
    min_similarity: float = 0.95,
    criterion: Criterion = "position",
    protect_thumbnail: bool = True,
) -> Reduction:
    """Drop up to `rate` of one page's prunable projector outputs `(tiles * tpt, D)` that are redundant."""
    rate = check_fraction("document pruning rate", rate, upper_inclusive=True)
    _check_settings(min_similarity, criterion)
    layout.check_tokens(tokens)
    if not bool(torch.isfinite(tokens).all()):
        raise ReductionError("redundant tokens: expected finite projector outputs, found NaN or Inf")
    prunable = _prunable(layout, protect_thumbnail, tokens.device)  # (N,)
    num_prunable = int(prunable.sum())
    budget = int(rate * num_prunable)
    keep = torch.ones(layout.num_tokens, dtype=torch.bool, device=tokens.device)
    num_candidates = 0
    if budget > 0:
        unit = F.normalize(tokens.float(), dim=-1)  # (N, D)
        if criterion == "position":
            scores = position_scores(unit, layout, prunable)
        elif criterion == "background":
            scores = background_scores(unit, prunable)
        else:
            scores = neighbour_scores(unit, layout)
        candidate = prunable & (scores >= min_similarity)  # (N,)
        num_candidates = int(candidate.sum())
        scores = torch.where(candidate, scores, torch.full_like(scores, NEVER))
        order = torch.argsort(scores, descending=True, stable=True)
        keep[order[: min(budget, num_candidates)]] = False
    removed_per_tile = (~keep).view(layout.groups, layout.tokens_per_group).sum(-1)
    info = {
        "method": "redundant_tokens",
        "criterion": criterion,
        "rate": rate,
        "min_similarity": float(min_similarity),
        "prunable": num_prunable,
        "candidates": num_candidates,
        "removed_per_tile": removed_per_tile.tolist(),
        "note": floor_note(rate, layout.num_tokens, budget, num_candidates, num_prunable, min_similarity,
                           "background" if criterion == "position" and not places_have_majority(layout, prunable)
                           else criterion),
    }
    return reduction_from_mask(tokens, keep, layout, "post_projector", info)


def floor_note(rate: float, total: int, budget: int, candidates: int, prunable: int, min_similarity: float,
               criterion: str) -> str | None:
    """Why fewer tokens went than the rate asks, or None when the rate's budget was dropped in full: the
    similarity floor (`min_similarity`) keeps every token not that close to the background, so a rate can end
    up dropping nothing ("18 -> 18"), and a user who set it is owed the reason. `criterion`: the score that was
    used ("position" falls back to "background" without a majority of tiles per place)."""
    if candidates >= budget:
        return None
    kept = total - candidates
    return (f"redundant-token pruning {rate:g} kept {kept} of {total} tokens: the rate allows dropping {budget} of "
            f"the {prunable} prunable ones, but only {candidates} reach the similarity floor {min_similarity:g} "
            f"({SIMILAR_TO[criterion]}); the floor keeps tokens that differ from the background")


SIMILAR_TO = {"position": "cosine to the background at their place in the tile",
              "background": "cosine to the page's background",
              "neighbour": "cosine to their left or upper neighbour"}


def _check_settings(min_similarity: float, criterion: str) -> None:
    if (
        isinstance(min_similarity, bool)
        or not isinstance(min_similarity, (int, float))
        or not (-1.0 <= min_similarity <= 1.0)
    ):
        raise ReductionError(f"redundant tokens: expected min_similarity in [-1, 1] (a cosine), found {min_similarity!r}")
    if criterion not in CRITERIA:
        raise ReductionError(f"redundant tokens: expected criterion in {CRITERIA}, found {criterion!r}")


@dataclass(frozen=True)
class RedundantTokenPruner:
    """Redundant-token pruning as a `Reducer` (stage "post_projector"); `rate=0` is off."""

    rate: float = 0.0
    min_similarity: float = 0.95
    criterion: Criterion = "position"
    protect_thumbnail: bool = True
    name: ClassVar[str] = "redundant_tokens"
    stage: ClassVar[Stage] = "post_projector"

    def __post_init__(self):
        check_fraction("document pruning rate", self.rate, upper_inclusive=True)
        _check_settings(self.min_similarity, self.criterion)

    def __call__(self, tokens: torch.Tensor, layout: TokenLayout) -> Reduction:
        return prune_redundant_tokens(
            tokens, layout, self.rate, self.min_similarity, self.criterion, self.protect_thumbnail
        )
