"""Packing examples into forward passes under a padded-token budget, and collating them into tensors.

The examples of one optimizer step are packed first-fit-decreasing by length into micro-batches whose
padded size (rows x longest row) stays within `max_tokens`, so each forward pass does about the same
work and little of it is padding (`efficiency` reports real / padded tokens). Rows are right-padded:
the model is causal (attention and the Mamba scan only look back), so pad positions after a row's last
real token change nothing before it and need no attention mask; their labels are IGNORE.

Why not concatenate several conversations into one row (as LLM pre-training does)? Nemotron-H has
no per-segment reset: attention would need a block-diagonal mask and the Mamba state and conv window
a reset at each boundary, which the model's forward does not take. Concatenating without them would let
one sample read another's image, which inference never does. Budget packing keeps samples separate.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from data_recipes.formatting import IGNORE, Example
from vl.errors import ConfigError
from vl.modeling.vlm import MediaSpan


class SequenceTooLongError(ConfigError):
    """An example longer than the recipe's `max_seq_len`: raise the limit or shorten the sample."""

    code = "sequence_too_long"


@dataclass
class Batch:
    input_ids: torch.Tensor  # (B, T) long, right-padded with pad_id
    labels: torch.Tensor  # (B, T) long, IGNORE at prompt and pad positions
    pixel_values: torch.Tensor | None  # (N, 3, S, S), rows' tiles in row order
    media: list[MediaSpan]  # spans in the same order as the <image> runs of input_ids, row by row
    lengths: list[int]  # real tokens per row
    families: list[str]
    tile_targets: list[dict] | None = None  # per tile, in pixel_values order (data_recipes/vision_targets.py)

    @property
    def num_tokens(self) -> int:
        return sum(self.lengths)

    @property
    def real_positions(self) -> torch.Tensor:
        """(B, T) bool: True at each row's real tokens, False at its right padding."""
        return torch.arange(self.input_ids.shape[1], device=self.input_ids.device) < torch.tensor(
            self.lengths, device=self.input_ids.device)[:, None]

    @property
    def num_target_tokens(self) -> int:
        return int((self.labels[:, 1:] != IGNORE).sum())  # the positions a next-token loss scores


def pack(lengths: Sequence[int], max_tokens: int, max_seq_len: int | None = None) -> list[list[int]]:
    """Indices grouped so that len(group) * max(length in group) <= max_tokens (a longer single example
    gets a group of its own). First-fit decreasing on length; groups come back longest first, and the
    result is a pure function of the inputs."""
    if max_tokens < 1:
        raise ConfigError(f"max_tokens must be >= 1, found {max_tokens}")
    order = sorted(range(len(lengths)), key=lambda i: (-lengths[i], i))
    groups: list[list[int]] = []
    widths: list[int] = []  # the longest row of each group: the first one placed, since lengths fall
    for i in order:
        n = lengths[i]
        if max_seq_len is not None and n > max_seq_len:
            raise SequenceTooLongError(f"an example has {n} tokens, more than max_seq_len={max_seq_len}; raise "
                                       f"Packing.max_seq_len or use fewer frames/pages")
        for g, width in enumerate(widths):
            if (len(groups[g]) + 1) * width <= max_tokens:
                groups[g].append(i)
                break
        else:
            groups.append([i])
            widths.append(n)
    return groups


def efficiency(lengths: Sequence[int], groups: Sequence[Sequence[int]]) -> float:
    """Real tokens / padded tokens over all groups (1.0 = no padding)."""
    padded = sum(len(g) * max(lengths[i] for i in g) for g in groups if g)
    return sum(lengths[i] for g in groups for i in g) / padded if padded else 1.0


def collate(examples: Sequence[Example], pad_id: int) -> Batch:
    """Right-pad `examples` into one batch; tiles are concatenated in row order, like their placeholders."""
    if not examples:
        raise ConfigError("collate needs at least one example")
    width = max(len(e) for e in examples)
    ids = torch.full((len(examples), width), pad_id, dtype=torch.long)
    labels = torch.full((len(examples), width), IGNORE, dtype=torch.long)
    for r, e in enumerate(examples):
        ids[r, :len(e)] = e.input_ids
        labels[r, :len(e)] = e.labels
    tiles = [e.pixel_values for e in examples if e.pixel_values is not None]
    targets = None
    if all("tile_targets" in e.meta for e in examples):
        targets = [t for e in examples for t in e.meta["tile_targets"]]
    return Batch(ids, labels, torch.cat(tiles) if tiles else None, [m for e in examples for m in e.media],
                 [len(e) for e in examples], [e.family for e in examples], targets)
