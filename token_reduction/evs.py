"""Efficient Video Sampling (EVS): drop video tokens that barely changed since the previous frame.

Follows docs/format.md §10.1 (vLLM `vllm/multimodal/evs.py`
`compute_retention_mask` / `compute_retained_tokens_count`; the HF remote `evs.py` and transformers'
`nemotron_h_omni.compute_retention_mask` are the same algorithm; arXiv 2510.14624):

    dis[0]  = 255                                  # the first frame is always kept whole
    dis[t]  = 1 - cos(E[t, p], E[t-1, p])          # same spatial position p, after the projector
    K       = max(tpf, int(T * tpf * (1 - q)))     # q = video_pruning_rate, the fraction pruned
    keep    = top-K of dis by a stable descending sort; kept tokens stay in (t, h, w) order

The dissimilarity is computed in the dtype of the projector outputs, as the references do, so the
mask is bit-identical to theirs in bf16 too (where rounding creates many ties, broken by position).
EVS saves LLM prefill only: the encoder has already run on every frame. Frames may end with 0 tokens.
The Nemotron-H LLM has no positional encoding, so dropping positions needs no position fix-up (docs/format.md §7.4).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import torch
import torch.nn.functional as F

from token_reduction.protocol import Reduction, ReductionError, Stage, TokenLayout, check_fraction, reduction_from_mask

FIRST_FRAME_DISSIMILARITY = 255.0  # larger than any 1 - cos (at most 2), so frame 0 sorts first


def _check_frames(frames: int, tokens_per_frame: int) -> None:
    if isinstance(frames, bool) or not isinstance(frames, int) or frames < 0:
        raise ReductionError(f"EVS: expected a non-negative int number of frames, found {frames!r}")
    if frames == 0:
        raise ReductionError("EVS: expected a video with at least one frame, found 0 frames; check the video decoder")
    if isinstance(tokens_per_frame, bool) or not isinstance(tokens_per_frame, int) or tokens_per_frame < 1:
        raise ReductionError(f"EVS: expected a positive int tokens_per_frame, found {tokens_per_frame!r}")


def retained_count(frames: int, tokens_per_frame: int, q: float) -> int:
    """K, the number of video tokens EVS keeps; known before the encoder runs.

    The processor uses it to size the prompt (e.g. 128 frames x 256 tokens at q=0.75 -> 8192).
    Same integer arithmetic as vLLM's `compute_retained_tokens_count`: `int((T * tpf) * (1 - q))`.
    """
    q = check_fraction("video_pruning_rate", q)
    _check_frames(frames, tokens_per_frame)
    return max(tokens_per_frame, int(frames * tokens_per_frame * (1 - q)))


def frame_dissimilarity(tokens: torch.Tensor, layout: TokenLayout) -> torch.Tensor:
    """`(T, tpf)` EVS scores: 255 for the first frame, `1 - cos` to the same position one frame back."""
    frames = tokens.reshape(layout.groups, layout.tokens_per_group, tokens.shape[-1])  # (T, tpf, D)
    similarity = F.cosine_similarity(frames[1:], frames[:-1], dim=-1)  # (T-1, tpf)
    first = torch.full_like(frames[:1, :, 0], FIRST_FRAME_DISSIMILARITY)  # (1, tpf)
    return torch.cat([first, 1 - similarity], dim=0)  # (T, tpf)


def evs(tokens: torch.Tensor, layout: TokenLayout, q: float) -> Reduction:
    """Apply EVS at pruning rate `q` in [0, 1) to one video's projector outputs `(T * tpf, D)`."""
    q = check_fraction("video_pruning_rate", q)
    layout.check_tokens(tokens)
    _check_frames(layout.groups, layout.tokens_per_group)
    if layout.thumbnail is not None:
        raise ReductionError(
            f"EVS: expected a video layout (no thumbnail), found thumbnail={layout.thumbnail}; "
            f"use TokenLayout.video(frames)"
        )
    if not bool(torch.isfinite(tokens).all()):
        raise ReductionError("EVS: expected finite projector outputs, found NaN or Inf; the vision tower diverged")
    num_keep = retained_count(layout.groups, layout.tokens_per_group, q)
    dissimilarity = frame_dissimilarity(tokens, layout).reshape(-1)  # (T * tpf,)
    order = torch.argsort(dissimilarity, descending=True, stable=True)
    keep = torch.zeros(layout.num_tokens, dtype=torch.bool, device=tokens.device)
    keep[order[:num_keep]] = True
    per_frame = keep.view(layout.groups, layout.tokens_per_group).sum(-1)  # (T,)
    info = {
        "method": "evs",
        "q": q,
        "frames": layout.groups,
        "tokens_per_frame": layout.tokens_per_group,
        "frames_emptied": int((per_frame == 0).sum()),
        "frames_whole": int((per_frame == layout.tokens_per_group).sum()),
    }
    return reduction_from_mask(tokens, keep, layout, "post_projector", info)


@dataclass(frozen=True)
class EVS:
    """EVS as a `Reducer`; `q` is `video_pruning_rate` (0 = off)."""

    q: float = 0.0
    name: ClassVar[str] = "evs"
    stage: ClassVar[Stage] = "post_projector"

    def __post_init__(self):
        check_fraction("video_pruning_rate", self.q)

    def retained_count(self, frames: int, tokens_per_frame: int = 256) -> int:
        return retained_count(frames, tokens_per_frame, self.q)

    def __call__(self, tokens: torch.Tensor, layout: TokenLayout) -> Reduction:
        return evs(tokens, layout, self.q)
