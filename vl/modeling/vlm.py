"""Nemotron Nano V2 VL: tiles -> RADIO -> pixel shuffle -> mlp1 -> token reduction -> merge -> Nemotron-H.

Follows the reference composition (HF remote `NemotronH_Nano_VL_V2.forward`, vLLM `nano_nemotron_vl.py`):
projected tile vectors replace the embeddings at the `<image>` placeholder positions, in order, with one
masked scatter. Token reduction (EVS for videos) runs between the projector and the merge; pruned
placeholder positions are dropped from the sequence (frame headers and `<img>`/`</img>` stay), which needs
no position fix-up because the LLM has no positional encoding.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from itertools import accumulate

import torch
from torch import nn

from token_reduction import EVS, RedundantTokenPruner, ReductionError, TokenLayout
from vl.config import VLConfig
from vl.errors import ConfigError, InputError
from vl.modeling.nemotron_h import CausalLMOutput, NemotronHForCausalLM
from vl.modeling.projector import VisionProjector
from vl.modeling.radio import RadioEncoder, vit_dims


@dataclass(frozen=True)
class MediaSpan:
    """One image (its tiles, thumbnail last) or one video (one tile per frame), in placeholder order."""

    kind: str  # "image" | "video"
    num_tiles: int


@dataclass
class VisionInputs:
    """What the merge needs: the vectors for every placeholder, and which placeholders survive."""

    vectors: torch.Tensor  # (n_placeholders, d_llm)
    keep: torch.Tensor | None = None  # (n_placeholders,) bool, None = keep all
    counts: list[torch.Tensor] = field(default_factory=list)  # per reduced item: kept tokens per frame / tile
    info: list[dict] = field(default_factory=list)  # what each reducer removed


def compact_rows(x: torch.Tensor, keep: torch.Tensor, fill=0, left: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """Each row of `x` (b, t, ...) reduced to its `keep` (b, t) positions, in order, and padded with `fill` to
    the longest kept row, on the left (batched generation) or the right (training). -> (out, lengths (b,))."""
    lengths = keep.sum(1)
    t = int(lengths.max())
    out = x.new_full((x.shape[0], t, *x.shape[2:]), fill)
    for i, n in enumerate(lengths.tolist()):
        if left:
            out[i, t - n:] = x[i, keep[i]]
        else:
            out[i, :n] = x[i, keep[i]]
    return out, lengths


class NemotronVL(nn.Module):
    keep_in_fp32 = NemotronHForCausalLM.keep_in_fp32

    def __init__(self, cfg: VLConfig):
        super().__init__()
        self.config = cfg
        dim, depth, heads, mlp_dim = vit_dims(cfg.vision.model)
        if dim != cfg.vit_hidden_size:
            raise ConfigError(f"vit_hidden_size={cfg.vit_hidden_size} but {cfg.vision.model} is {dim} wide")
        self.vision = RadioEncoder(dim, depth, heads, mlp_dim, patch_size=cfg.vision.patch_size,
                                   cpe_max_size=cfg.vision.cpe_max_size,
                                   num_prefix_tokens=cfg.vision.num_prefix_tokens)
        self.projector = VisionProjector(dim, cfg.projector_hidden_size, cfg.lm.hidden_size, cfg.downsample_ratio,
                                         cfg.ps_version, eps=cfg.lm.layer_norm_epsilon)
        self.language_model = NemotronHForCausalLM(cfg.lm)
        # tiles per vision-tower call (None: 4 in bf16 on a CPU, else 16): bounds the tower's activation memory. In
        # bf16 on a CPU 4 were also the fastest (a 13-tile page of the 12B tower, 2 threads: 1.00 s per tile against
        # 1.11 in calls of 8 and 1.20 in one call: docs/benchmarks.md), and there a tile's last bits depend on its
        # call's size anyway (oneDNN's blocking); in fp32 (MKL) calls of up to 16 tiles give each tile the same bits
        # whatever else is in the call (tests/runtime/test_vision_batch.py), which a 1-tile call would not.
        self.micro_batch: int | None = None

    @property
    def lm_config(self):
        return self.config.lm

    # --- vision side ------------------------------------------------------------------------------
    def encode_tiles(self, pixel_values: torch.Tensor) -> torch.Tensor:
        """(N, 3, S, S) normalised tiles -> (N, tokens_per_tile, d_llm), in micro-batches."""
        s = self.config.force_image_size
        if pixel_values.ndim != 4 or tuple(pixel_values.shape[1:]) != (3, s, s):
            raise InputError(f"pixel_values: expected (num_tiles, 3, {s}, {s}) tiles, found "
                             f"{tuple(pixel_values.shape)}")
        grid = (self.config.grid, self.config.grid)
        tower_dtype = self.vision.patch_generator.embedder.weight.dtype
        bf16_cpu = pixel_values.device.type == "cpu" and tower_dtype == torch.bfloat16
        mb = self.micro_batch or (4 if bf16_cpu else 16)
        outs = []
        for start in range(0, pixel_values.shape[0], mb):
            feats = self.vision.forward_features(pixel_values[start:start + mb])
            outs.append(self.projector(feats, grid))
        return torch.cat(outs) if outs else pixel_values.new_zeros(0, self.config.tokens_per_tile,
                                                                   self.config.lm.hidden_size)

    def reduce(self, tile_vectors: torch.Tensor, media: list[MediaSpan] | None,
               video_pruning_rate: float | None = None, token_pruning_rate: float = 0.0) -> VisionInputs:
        """Token reduction between the projector and the merge: EVS per video (rate from the call, else the
        checkpoint's `video_pruning_rate`) and, when asked, redundant-token pruning over all the request's
        images at once, as one document (`TokenLayout.document`: one budget, thumbnails protected)."""
        n, tpt, d = tile_vectors.shape
        flat = tile_vectors.reshape(n * tpt, d)
        q = self.config.video_pruning_rate if video_pruning_rate is None else video_pruning_rate
        active = {"video": q > 0, "image": token_pruning_rate > 0}
        if not media or not any(active[m.kind] for m in media):
            return VisionInputs(flat)
        if sum(m.num_tiles for m in media) != n:
            raise InputError(f"media spans describe {sum(m.num_tiles for m in media)} tiles but {n} were given")
        side = int(round(tpt ** 0.5))
        try:
            evs, pruner = EVS(q), RedundantTokenPruner(rate=token_pruning_rate)
        except ReductionError as exc:
            raise InputError(str(exc)) from None
        spans = [slice(a, a + m.num_tiles * tpt) for a, m in
                 zip(accumulate((m.num_tiles * tpt for m in media), initial=0), media)]  # placeholder rows
        items = []  # (reducer, placeholder rows, layout) per reduced item: each video, all images together
        if active["video"]:
            items += [(evs, rows, TokenLayout.video(m.num_tiles, side, side))
                      for rows, m in zip(spans, media) if m.kind == "video"]
        pages = [(rows, m.num_tiles) for rows, m in zip(spans, media) if m.kind == "image"]
        if active["image"] and pages:
            rows = torch.cat([torch.arange(r.start, r.stop, device=flat.device) for r, _ in pages])
            items.append((pruner, rows, TokenLayout.document([tiles for _, tiles in pages], side, side)))
        keep = torch.ones(n * tpt, dtype=torch.bool, device=flat.device)
        counts, info = [], []
        for reducer, rows, layout in items:
            try:
                red = reducer(flat[rows], layout)
            except ReductionError as exc:
                raise InputError(str(exc)) from None
            keep[rows] = red.keep
            counts.append(red.counts)
            info.append(red.info)
        return VisionInputs(flat, keep, counts, info)

    # --- merge -----------------------------------------------------------------------------------------
    def merge(self, input_ids: torch.Tensor, vision: VisionInputs | None, attention_mask=None):
        """Embeddings with vision vectors at the `<image>` positions; pruned positions dropped.

        Returns (inputs_embeds (b, t', d), attention_mask (b, t') or None).
        """
        embeds = self.language_model.embed(input_ids)
        placeholder = input_ids == self.config.tokens.img_context_id  # (b, t)
        n_slots = int(placeholder.sum())
        n_vec = 0 if vision is None else vision.vectors.shape[0]
        if n_slots != n_vec:
            raise InputError(f"the prompt has {n_slots} image placeholder tokens but the images/videos give {n_vec} "
                             f"vectors; build inputs with the processor so the counts match")
        if n_vec == 0:
            return embeds, attention_mask
        embeds = embeds.masked_scatter(placeholder[..., None], vision.vectors.to(embeds.dtype))
        if vision.keep is None or bool(vision.keep.all()):
            return embeds, attention_mask
        keep_pos = self.kept_positions(input_ids, vision)
        if attention_mask is not None:
            keep_pos &= attention_mask.bool()
        out, lengths = compact_rows(embeds, keep_pos, left=True)
        t = out.shape[1]
        mask = (torch.arange(t, device=out.device) >= t - lengths[:, None]).long()
        return out, (mask if bool((lengths != t).any()) or attention_mask is not None else None)

    def kept_positions(self, input_ids: torch.Tensor, vision: VisionInputs | None) -> torch.Tensor:
        """(b, t) bool: the sequence positions that token reduction keeps (every text position, and the
        placeholders whose vectors survive)."""
        keep = torch.ones_like(input_ids, dtype=torch.bool)
        if vision is not None and vision.keep is not None:
            keep[input_ids == self.config.tokens.img_context_id] = vision.keep.to(input_ids.device)
        return keep

    def prepare_inputs(self, input_ids, pixel_values=None, media=None, attention_mask=None,
                       video_pruning_rate=None, tile_vectors=None, token_pruning_rate: float = 0.0):
        """input_ids + tiles -> (inputs_embeds, attention_mask, VisionInputs). `tile_vectors` (precomputed
        `encode_tiles` output, e.g. from a cache) skips the vision tower."""
        vision = None
        if tile_vectors is None and pixel_values is not None and pixel_values.shape[0] > 0:
            tile_vectors = self.encode_tiles(pixel_values)
        if tile_vectors is not None:
            vision = self.reduce(tile_vectors, media, video_pruning_rate, token_pruning_rate)
        embeds, attention_mask = self.merge(input_ids, vision, attention_mask)
        return embeds, attention_mask, vision

    def forward(self, input_ids=None, pixel_values=None, attention_mask=None, cache=None, input_pos=None,
                logits_to_keep: int = 0, media: list[MediaSpan] | None = None, video_pruning_rate=None,
                inputs_embeds=None) -> CausalLMOutput:
        if inputs_embeds is None:
            inputs_embeds, attention_mask, _ = self.prepare_inputs(input_ids, pixel_values, media, attention_mask,
                                                                   video_pruning_rate)
        return self.language_model(inputs_embeds=inputs_embeds, cache=cache, input_pos=input_pos,
                                   attention_mask=attention_mask, logits_to_keep=logits_to_keep)
