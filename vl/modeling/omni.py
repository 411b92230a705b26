"""Nemotron 3 Nano Omni: images, video tubelets and audio merged at their placeholders into Nemotron-H.

Follows transformers' `NemotronH_Omni_Reasoning_V3` (models/nemotron_h_omni/modeling_nemotron_h_omni.py), the
reference the parity tests run against; docs/format.md §3.7 lists what differs from Nano V2 VL:
- an image is one native-resolution patch grid (h x w patches of 16 px, sides multiples of the pixel-shuffle
  factor), given as flattened patches `(total_patches, 3*p*p)` with `image_grid_hw`; each image attends only to
  itself in the RADIO tower (`RadioEncoder.forward_patches`);
- a video is a stack of tubelets `(num_videos, num_tubelets, T*3, H, W)`, T consecutive frames on the channel
  axis, embedded by the tower's `video_embedder`; EVS (token_reduction, one tubelet per group) drops the tubelet
  tokens least changed since the previous tubelet, and the dropped placeholder positions leave the sequence;
- with MTP layers in the LM (`num_nextn_predict_layers > 0`) the tower's patch features pass a final LayerNorm
  before the pixel shuffle (`vision_final_layernorm`);
- pixel shuffle and `mlp1` as in V2, except that the projector norm's epsilon is fixed at 1e-5;
- audio: mel features -> Parakeet (FastConformer) encoder, subsampling x8 -> `audio_projector` (RMSNorm ->
  Linear -> ReLU² -> Linear, biases per config) at the `<so_embedding>` placeholders. Only each clip's real
  positions are kept: the subsampled length of `mask.sum + 1` frames, the reference's count
  (vl/modeling/parakeet.py `omni_embedding_lengths`).
Image and video placeholders are both the image token (the reference tells them apart by which input carries
the pixels); one prompt may hold both when `media_order` says which item comes first.
Plain maths: nothing here samples, caches, places or loads.
"""

from __future__ import annotations

from typing import NamedTuple

import torch
from torch import nn

from token_reduction import EVS, ReductionError, TokenLayout
from vl.config.omni import OmniConfig
from vl.errors import InputError
from vl.modeling.nemotron_h import CausalLMOutput, NemotronHForCausalLM
from vl.modeling.norms import RMSNorm
from vl.modeling.parakeet import ParakeetEncoder, omni_embedding_lengths
from vl.modeling.projector import SquaredReLU, VisionProjector
from vl.modeling.radio import RadioEncoder
from vl.modeling.vlm import compact_rows

PROJECTOR_EPS = 1e-5  # transformers' Omni projector norm: a constructor default, not read from the config


class Merged(NamedTuple):
    inputs_embeds: torch.Tensor  # (b, t', d)
    attention_mask: torch.Tensor | None  # (b, t'), or None when every row is whole
    keep: torch.Tensor | None  # (n_placeholders,) bool over the image-token positions; None: all kept
    reductions: list[dict]  # one EVS record per video (token_reduction's `info`: method, q, counts, ...)


class AudioProjector(nn.Module):
    """`sound_projection`: RMSNorm -> Linear -> ReLU² -> Linear; parameter names are the checkpoint's."""

    def __init__(self, in_dim: int, hidden_dim: int, out_dim: int, bias: bool, eps: float = PROJECTOR_EPS):
        super().__init__()
        self.norm = RMSNorm(in_dim, eps=eps)
        self.linear1 = nn.Linear(in_dim, hidden_dim, bias=bias)
        self.act = SquaredReLU()
        self.linear2 = nn.Linear(hidden_dim, out_dim, bias=bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.linear2(self.act(self.linear1(self.norm(x))))


class NemotronOmni(nn.Module):
    keep_in_fp32 = NemotronHForCausalLM.keep_in_fp32

    def __init__(self, cfg: OmniConfig):
        super().__init__()
        self.config = cfg
        v = cfg.vision
        self.vision = RadioEncoder(v.hidden_size, v.num_hidden_layers, v.num_attention_heads, v.mlp_dim,
                                   patch_size=v.patch_size, cpe_max_size=v.max_img_size,
                                   num_prefix_tokens=v.num_prefix_tokens,
                                   video_temporal_patch_size=v.video_temporal_patch_size, layer_scale=v.layer_scale)
        self.vision_final_layernorm = (nn.LayerNorm(v.hidden_size, eps=v.layer_norm_eps) if cfg.vision_final_norm
                                       else nn.Identity())
        self.projector = VisionProjector(v.hidden_size, cfg.projector_hidden_size, cfg.lm.hidden_size,
                                         cfg.downsample_ratio, eps=PROJECTOR_EPS)
        self.audio_encoder = self.audio_projector = None  # no audio_config: no audio branch
        if cfg.audio is not None:
            a = cfg.audio
            self.audio_encoder = ParakeetEncoder(a)
            self.audio_projector = AudioProjector(a.hidden_size, a.projection_hidden_size, cfg.lm.hidden_size,
                                                  a.projection_bias)
        self.language_model = NemotronHForCausalLM(cfg.lm)
        # tubelets per vision-tower call: bounds activation memory, not results (at the released widths, bf16, 2
        # CPU threads, 16 tubelets of 384 x 672 px: peak +0.63 GiB at 16 per call, +0.38 GiB at 4, same time)
        self.micro_batch = 4

    @property
    def lm_config(self):
        return self.config.lm

    # --- encoders -----------------------------------------------------------------------------------------
    def _project(self, features: torch.Tensor, grid: tuple[int, int]) -> torch.Tensor:
        """Tower features (N, h*w, D) -> [final LayerNorm] -> pixel shuffle -> mlp1: (N, h*w/k², d_llm)."""
        return self.projector(self.vision_final_layernorm(features), grid)

    def encode_images(self, pixel_values: torch.Tensor, image_grid_hw: torch.Tensor) -> list[torch.Tensor]:
        """Flattened patches (total_patches, 3*p*p) of images with grids `image_grid_hw` (num_images, 2), in
        placeholder order -> one (h*w/k², d_llm) tensor per image."""
        grids = [tuple(int(x) for x in g) for g in torch.as_tensor(image_grid_hw).reshape(-1, 2).tolist()]
        sizes = [h * w for h, w in grids]
        if pixel_values.ndim != 2 or sum(sizes) != pixel_values.shape[0]:
            raise InputError(f"pixel_values: expected (total_patches, 3*p*p) patches, {sum(sizes)} of them for the "
                             f"grids {grids}, found shape {tuple(pixel_values.shape)}; build images with the Omni "
                             "image processor")
        k = self.config.merge_size
        bad = [g for g in grids if g[0] % k or g[1] % k or min(g) < 1]
        if bad:
            raise InputError(f"image_grid_hw: grid sides must be positive multiples of the pixel-shuffle factor {k}; "
                             f"found {bad}")
        return [self._project(self.vision.forward_patches(patches, grid)[None], grid)[0]
                for patches, grid in zip(pixel_values.split(sizes), grids)]

    def encode_videos(self, pixel_values_videos: torch.Tensor) -> list[torch.Tensor]:
        """Tubelets (num_videos, num_tubelets, T*3, H, W) -> one (num_tubelets * tokens_per_tubelet, d_llm) tensor
        per video, tubelets in order; the tower runs `micro_batch` tubelets at a time."""
        t = self.config.video_temporal_patch_size
        if pixel_values_videos.ndim != 5 or pixel_values_videos.shape[2] != 3 * t:
            raise InputError(f"pixel_values_videos: expected (num_videos, num_tubelets, {3 * t}, H, W) tubelets of "
                             f"{t} frames, found shape {tuple(pixel_values_videos.shape)}; build videos with the Omni "
                             "video processor")
        num_videos, num_tubelets, _, height, width = pixel_values_videos.shape
        grid = self.vision.grid_size(height, width)
        k = self.config.merge_size
        if grid[0] % k or grid[1] % k:
            raise InputError(f"pixel_values_videos: a {height}x{width} frame is a {grid[0]}x{grid[1]} patch grid; its "
                             f"sides must be multiples of the pixel-shuffle factor {k}")
        flat = pixel_values_videos.flatten(0, 1)  # (V*N, T*3, H, W)
        out = [self._project(self.vision.forward_features(flat[s:s + self.micro_batch]), grid)
               for s in range(0, flat.shape[0], self.micro_batch)]
        vectors = torch.cat(out)  # (V*N, tokens_per_tubelet, d_llm)
        return list(vectors.reshape(num_videos, -1, vectors.shape[-1]))

    def encode_audio(self, input_features: torch.Tensor, input_features_mask: torch.Tensor | None = None):
        """Mel features (clips, frames, n_mels) [+ mask (clips, frames)] -> the clips' real positions, clip after
        clip: (n_audio_tokens, d_llm)."""
        if self.audio_encoder is None:
            raise InputError("input_features: this checkpoint has no audio branch (its config.json has no "
                             "audio_config); send images, videos or text only")
        bins = self.config.audio.num_mel_bins
        if input_features.dim() != 3 or input_features.shape[-1] != bins:
            raise InputError(f"input_features: expected (clips, frames, {bins}) mel features (this audio encoder's "
                             f"num_mel_bins), got {tuple(input_features.shape)}")
        dtype = self.audio_projector.linear1.weight.dtype  # the branch's compute dtype, as the reference casts
        hidden, _ = self.audio_encoder(input_features.to(dtype), input_features_mask)  # (B, T', D)
        embeds = self.audio_projector(hidden)  # (B, T', d_llm)
        if input_features_mask is None:
            return embeds.reshape(-1, embeds.shape[-1])
        lengths = omni_embedding_lengths(input_features_mask, self.config.audio).to(embeds.device)  # (B,)
        keep = torch.arange(embeds.shape[1], device=embeds.device)[None] < lengths[:, None]
        return embeds[keep]  # (n_audio_tokens, d_llm)

    # --- merge ----------------------------------------------------------------------------------------------
    def _in_order(self, images, videos, media_order):
        """The image and video vectors in placeholder order, and which of them are video tokens."""
        images, videos = images or [], videos or []
        if media_order is None:
            if images and videos:
                raise InputError("a prompt with both images and videos needs media_order (the kind of each item in "
                                 "prompt order): both fill <image> placeholders")
            media_order = ["image"] * len(images) + ["video"] * len(videos)
        if sorted(media_order) != sorted(["image"] * len(images) + ["video"] * len(videos)):
            raise InputError(f"media_order {list(media_order)} does not list the {len(images)} images and "
                             f"{len(videos)} videos given")
        queues = {"image": iter(images), "video": iter(videos)}
        items = [(kind, next(queues[kind])) for kind in media_order]
        return items

    def embed_inputs(self, input_ids: torch.Tensor, pixel_values=None, image_grid_hw=None, pixel_values_videos=None,
                     input_features=None, input_features_mask=None, attention_mask=None, video_pruning_rate=None,
                     media_order=None):
        """input_ids + media -> (inputs_embeds (b, t', d), attention_mask (b, t') or None): the encoders, then
        `merge`."""
        images = self.encode_images(pixel_values, image_grid_hw) if pixel_values is not None else None
        videos = self.encode_videos(pixel_values_videos) if pixel_values_videos is not None else None
        audio = self.encode_audio(input_features, input_features_mask) if input_features is not None else None
        layout = None if pixel_values_videos is None else self.video_layout(pixel_values_videos.shape)
        merged = self.merge(input_ids, images, videos, audio, layout, attention_mask, video_pruning_rate, media_order)
        return merged.inputs_embeds, merged.attention_mask

    def video_layout(self, shape) -> tuple[int, int, int]:
        """(tubelets, token rows, token cols) of videos whose tubelet tensor has `shape` (V, N, T*3, H, W)."""
        h, w = (s // self.config.merge_size for s in self.vision.grid_size(*shape[-2:]))
        return int(shape[1]), h, w

    def merge(self, input_ids: torch.Tensor, images=None, videos=None, audio=None, video_layout=None,
              attention_mask=None, video_pruning_rate=None, media_order=None):
        """Encoded media -> `Merged`: vision vectors at the image-token positions (images and tubelets in
        placeholder order), audio vectors (n_audio, d) at the audio-token positions, and the placeholders EVS prunes
        dropped (rows left-padded to the longest when they differ). `video_layout`: `video_layout(...)` of the
        videos."""
        embeds = self.language_model.embed(input_ids)
        tokens = self.config.tokens
        items = self._in_order(images, videos, media_order)
        placeholder = (input_ids == tokens.image_token_id) if tokens.image_token_id is not None else None
        n_slots = 0 if placeholder is None else int(placeholder.sum())
        n_vec = sum(v.shape[0] for _, v in items)
        if n_slots != n_vec:
            raise InputError(f"the prompt has {n_slots} image placeholder tokens (id {tokens.image_token_id}) but the "
                             f"images/videos give {n_vec} vectors; build inputs with the processor so the counts match")
        keep, reductions = None, []
        if n_vec:
            embeds = embeds.masked_scatter(placeholder[..., None], torch.cat([v for _, v in items]).to(embeds.dtype))
            keep, reductions = self._evs_keep(items, video_layout, video_pruning_rate)
        if audio is not None:
            slots = input_ids == tokens.audio_token_id if tokens.audio_token_id is not None else None
            n_audio = 0 if slots is None else int(slots.sum())
            if n_audio != audio.shape[0]:
                raise InputError(f"the prompt has {n_audio} audio placeholder tokens (id {tokens.audio_token_id}) but "
                                 f"the audio gives {audio.shape[0]} vectors; build inputs with the processor")
            embeds = embeds.masked_scatter(slots[..., None], audio.to(embeds.dtype))
        if keep is None or bool(keep.all()):
            return Merged(embeds, attention_mask, None, reductions)
        positions = torch.ones_like(input_ids, dtype=torch.bool)
        positions[placeholder] = keep
        if attention_mask is not None:
            positions &= attention_mask.bool()
        out, lengths = compact_rows(embeds, positions, left=True)
        t = out.shape[1]
        mask = (torch.arange(t, device=out.device) >= t - lengths[:, None]).long()
        return Merged(out, mask if bool((lengths != t).any()) or attention_mask is not None else None, keep, reductions)

    def _evs_keep(self, items, video_layout, video_pruning_rate) -> tuple[torch.Tensor | None, list[dict]]:
        """((n_placeholders,) bool over the image-token positions | None, one EVS record per video): images kept
        whole, each video through EVS at rate q (the call's, else the checkpoint's `video_pruning_rate`), one
        tubelet per EVS group."""
        q = self.config.video_pruning_rate if video_pruning_rate is None else video_pruning_rate
        if q <= 0 or video_layout is None:
            return None, []
        num_tubelets, h, w = video_layout
        parts, infos = [], []
        try:
            evs = EVS(q)
            for kind, v in items:
                if kind == "video":
                    reduced = evs(v, TokenLayout.video(num_tubelets, h, w))
                    parts.append(reduced.keep)
                    infos.append(reduced.info)
                else:
                    parts.append(torch.ones(v.shape[0], dtype=torch.bool, device=v.device))
        except ReductionError as exc:
            raise InputError(str(exc)) from None
        return torch.cat(parts), infos

    def forward(self, input_ids=None, pixel_values=None, image_grid_hw=None, pixel_values_videos=None,
                input_features=None, input_features_mask=None, attention_mask=None, cache=None, input_pos=None,
                logits_to_keep: int = 0, video_pruning_rate=None, media_order=None,
                inputs_embeds=None) -> CausalLMOutput:
        if inputs_embeds is None:
            inputs_embeds, attention_mask = self.embed_inputs(
                input_ids, pixel_values, image_grid_hw, pixel_values_videos, input_features, input_features_mask,
                attention_mask, video_pruning_rate, media_order)
        return self.language_model(inputs_embeds=inputs_embeds, cache=cache, input_pos=input_pos,
                                   attention_mask=attention_mask, logits_to_keep=logits_to_keep)
