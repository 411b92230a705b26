"""The losses of `vl train-demo` (data_recipes/train.py): next-token cross entropy over assistant tokens (EVS-pruned
clips as at inference when a stage asks), the tower probes' auxiliary losses, and their sum per forward pass scaled
so that a step's passes add up to the step's mean."""

from __future__ import annotations

import torch

from data_recipes.formatting import IGNORE
from data_recipes.packing import Batch
from data_recipes.vision_targets import position_loss, probe_loss


def token_loss_sum(model, batch: Batch, tile_vectors=None, video_pruning_rate: float = 0.0) -> torch.Tensor:
    """Summed next-token cross entropy over the batch's assistant tokens (tiles encoded here unless given).

    With `video_pruning_rate` > 0 the clips' tokens are EVS-pruned as at inference (`NemotronVL.reduce`) and
    each row keeps only its surviving positions, labels alongside, right-padded again (a causal LM: pads
    after a row's last token change nothing before it)."""
    if not video_pruning_rate:
        embeds, _, _ = model.prepare_inputs(batch.input_ids, batch.pixel_values, batch.media,
                                            tile_vectors=tile_vectors, video_pruning_rate=0.0)
        labels = batch.labels
    else:
        from vl.modeling.vlm import VisionInputs, compact_rows

        if tile_vectors is None:
            tile_vectors = model.encode_tiles(batch.pixel_values)
        vision = model.reduce(tile_vectors, batch.media, video_pruning_rate)
        full, _ = model.merge(batch.input_ids, VisionInputs(vision.vectors))
        keep = model.kept_positions(batch.input_ids, vision) & batch.real_positions
        embeds, _ = compact_rows(full, keep)
        labels, _ = compact_rows(batch.labels, keep, fill=IGNORE)
    logits = model.language_model(inputs_embeds=embeds).logits
    return torch.nn.functional.cross_entropy(logits[:, :-1].reshape(-1, logits.shape[-1]),
                                             labels[:, 1:].reshape(-1), ignore_index=IGNORE, reduction="sum")


def batch_loss(model, probe, batch: Batch, stage, n_target: int, n_tiles: int, video_pruning_rate: float = 0.0):
    """The stage's loss for one forward pass, scaled so the passes of a step add up to the step's mean:
    LM loss per assistant token of the step, plus aux_weight x probe loss weighted by this pass's tile share.
    `video_pruning_rate` prunes the clips' tokens for the LM only (`Stage.video_pruning_rates`)."""
    lm = aux = None
    vectors = model.encode_tiles(batch.pixel_values) if batch.pixel_values is not None else None
    total = 0.0
    if stage.objective == "vlm":
        lm = token_loss_sum(model, batch, vectors, video_pruning_rate) / max(n_target, 1)
        total = total + lm
    weight = stage.probe_weight
    if weight > 0 and vectors is not None and batch.tile_targets is not None:
        aux, stats = probe_loss(probe, vectors, batch.tile_targets)
        aux = aux * vectors.shape[0] / max(n_tiles, 1)
        total = total + weight * aux
    else:
        stats = {}
    if stage.position_weight > 0 and vectors is not None:
        pos, pos_stats = position_loss(probe, vectors)
        pos = pos * vectors.shape[0] / max(n_tiles, 1)
        total = total + stage.position_weight * pos
        aux = pos if aux is None else aux + pos
        stats = stats | pos_stats
    return total, lm, aux, stats


def probe_pass_loss(model, probe, batch: Batch, stage):
    """The tower-only examples' probe loss at the stage's probe weight (aux_weight; 1 for "vision")."""
    aux, stats = probe_loss(probe, model.encode_tiles(batch.pixel_values), batch.tile_targets)
    return stage.probe_weight * aux, aux, stats
