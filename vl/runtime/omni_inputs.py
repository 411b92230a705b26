"""A Nemotron 3 Nano Omni prompt's media through the encoders and into the LLM's input embeddings, for the engine.

The Omni processor (vl/processing/omni_processor.py) hands over native-resolution image patches, video tubelets and
audio mel features; the model (vl/modeling/omni.py) encodes them and merges them at their placeholders. Here each
item goes through the engine's encoder cache on its own (an image, a video, the request's audio clips together), so a
follow-up question about the same video does not run the vision tower again, and the vision and audio encoders are
timed apart (`Stats.stages_s`).
"""

from __future__ import annotations

import time

import torch

from vl.errors import NoAudioError
from vl.runtime.cpu import encoder_pages
from vl.runtime.placement import execution_device
from vl.runtime.results import Stats


def embed_omni(model, inputs, video_pruning_rate=None, cache=None, stats: Stats | None = None) -> torch.Tensor:
    """`OmniInputs` of one prompt -> inputs_embeds (1, t', d) with EVS applied. `cache`: a `VisionCache`
    (vl/runtime/engine.py) or None."""
    lm = model.language_model
    device, dtype = execution_device(model), lm.backbone.embeddings.weight.dtype
    stats = stats if stats is not None else Stats()
    ids = inputs.input_ids.to(device)

    def cached(tensor, kind, encode):
        return encode() if cache is None else cache.get(tensor, kind, encode, stats)

    t0 = time.perf_counter()
    images = videos = layout = audio = None
    with encoder_pages.in_memory(model, encoder_pages.VISION) as vision:
        if inputs.pixel_values is not None:
            grids = [tuple(int(x) for x in g) for g in inputs.image_grid_hw.tolist()]
            patches = inputs.pixel_values.split([h * w for h, w in grids])
            images = [cached(p, f"omni-image:{h}x{w}", vision.wrap(
                lambda p=p, g=(h, w): model.encode_images(p.to(device, dtype), torch.tensor([g]))[0]))
                for p, (h, w) in zip(patches, grids)]
        if inputs.pixel_values_videos is not None:
            tubelets = inputs.pixel_values_videos  # cast to the tower's dtype a micro-batch at a time, by the tower
            videos = [cached(v, "omni-video",
                             vision.wrap(lambda v=v: model.encode_videos(v[None].to(device))[0]))
                      for v in tubelets]
            layout = model.video_layout(tubelets.shape)
    t1 = time.perf_counter()
    if inputs.input_features is not None:
        if model.audio_encoder is None:
            raise NoAudioError("this checkpoint has no audio encoder (its config.json has no audio_config); send "
                             "images, videos or text only")
        feats, mask = inputs.input_features, inputs.input_features_mask
        lengths = [] if mask is None else mask.sum(-1).tolist()
        with encoder_pages.in_memory(model, encoder_pages.AUDIO) as sound:
            audio = cached(feats, f"omni-audio:{lengths}", sound.wrap(
                lambda: model.encode_audio(feats.to(device), None if mask is None else mask.to(device))))
    t2 = time.perf_counter()
    merged = model.merge(ids, images, videos, audio, layout, None, video_pruning_rate, inputs.media_order)
    t3 = time.perf_counter()
    before = sum(i.num_tokens for i in inputs.items if i.kind != "audio")
    stats.vision_tokens_before = before
    stats.vision_tokens_after = before - (int(ids.shape[1]) - int(merged.inputs_embeds.shape[1]))
    stats.audio_tokens = sum(i.num_tokens for i in inputs.items if i.kind == "audio")
    stats.reductions = list(merged.reductions)
    stats.vision_keep = merged.keep
    stats.prompt_tokens = int(merged.inputs_embeds.shape[1])
    if images is not None or videos is not None:
        stats.stages_s["vision"] = stats.stages_s.get("vision", 0.0) + (t1 - t0) + (t3 - t2)
    if audio is not None:
        stats.stages_s["audio"] = stats.stages_s.get("audio", 0.0) + (t2 - t1)
    return merged.inputs_embeds
