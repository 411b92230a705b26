"""Nemotron 3 Nano Omni against transformers' `NemotronH_Omni_Reasoning_V3` on the same random weights (fp32).

Our model is `vl.load_pretrained` of the directory transformers' `save_pretrained` wrote (the released layout), so
every test here is also a loading test. Images and videos come from transformers' own Omni image and video
processors; audio features (mel frames with a padding mask) are made by hand, the model does not care where they
come from. The error bound is relative to the logits' scale: max |ours - theirs| <= 1e-5 * max |theirs|.
"""

import numpy as np
import pytest
import torch
from PIL import Image

import vl
from omni_adapter import AUD, IMG, TINY_TEXT, hf_omni
from vl.errors import InputError
from vl.modeling.omni import NemotronOmni
from vl.modeling.parakeet import omni_embedding_lengths

RTOL = 1e-5
NORM = dict(norm_mean=[0.48145466, 0.4578275, 0.40821073], norm_std=[0.26862954, 0.26130258, 0.27577711])


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    ref = hf_omni()
    d = tmp_path_factory.mktemp("omni")
    ref.save_pretrained(d)
    return ref, vl.load_pretrained(d)


def rel_err(mine, theirs) -> float:
    assert mine.shape == theirs.shape
    assert theirs.abs().max() > 1.0  # the random model says something
    return float((mine - theirs).abs().max() / theirs.abs().max())


def images(*sizes):
    """transformers' Omni image processor on random images of the given (height, width): native-resolution grids."""
    from transformers.models.nemotron_h_omni.image_processing_nemotron_h_omni import (
        NemotronH_Omni_Reasoning_V3ImageProcessor,
    )

    rng = np.random.default_rng(0)
    pics = [Image.fromarray(rng.integers(0, 256, (h, w, 3), dtype=np.uint8)) for h, w in sizes]
    out = NemotronH_Omni_Reasoning_V3ImageProcessor(min_num_patches=16, max_num_patches=64, max_model_len=64)(
        pics, return_tensors="pt")
    return out["pixel_values"], out["image_grid_hw"]


def video(frames=5, height=40, width=70):
    """transformers' Omni video processor: frames resized near 24 patches, packed into tubelets of 2 (the last
    padded with a copy of the final frame when the count is odd)."""
    from transformers.models.nemotron_h_omni.video_processing_nemotron_h_omni import (
        NemotronH_Omni_Reasoning_V3VideoProcessor,
    )

    rng = np.random.default_rng(1)
    clip = torch.from_numpy(rng.integers(0, 256, (frames, 3, height, width), dtype=np.uint8))
    vp = NemotronH_Omni_Reasoning_V3VideoProcessor(video_target_num_patches=24, do_sample_frames=False, **NORM)
    return vp([clip], return_tensors="pt")["pixel_values_videos"]  # (1, tubelets, 6, H, W)


def audio(lengths=(100, 61), mels=16):
    """Padded mel frames and their mask as the Parakeet feature extractor lays them out: the STFT gives one frame
    more than the mask counts (1 + L // hop frames, mask L // hop), which the reference's `mask.sum + 1` relies on."""
    feats = torch.randn(len(lengths), max(lengths) + 1, mels)
    mask = torch.zeros(len(lengths), max(lengths) + 1, dtype=torch.long)
    for i, n in enumerate(lengths):
        mask[i, :n] = 1
    return feats, mask


def image_run(grid):
    h, w = grid
    return [10] + [IMG] * (h * w // 4) + [11]


def video_runs(pixel_values_videos):
    n, h, w = pixel_values_videos.shape[1], *(s // 16 for s in pixel_values_videos.shape[-2:])
    return sum(([12, 10] + [IMG] * (h * w // 4) + [11] for _ in range(n)), [])


def audio_run(count):
    return [20] + [AUD] * count + [21]


@torch.no_grad()
def test_image_prompt_matches_transformers(pair):
    ref, ours = pair
    pv, grids = images((50, 90), (70, 40), (33, 33))
    assert len({tuple(g) for g in grids.tolist()}) > 1  # differing native grids in one call
    ids = torch.tensor([[3, 4] + sum((image_run(g) + [5] for g in grids.tolist()), []) + [6, 7]])
    theirs = ref(input_ids=ids, pixel_values=pv, image_grid_hw=grids).logits
    mine = ours(ids, pixel_values=pv, image_grid_hw=grids).logits
    assert rel_err(mine, theirs) <= RTOL


@pytest.mark.parametrize("q", [0.0, 0.5])
@torch.no_grad()
def test_video_prompt_matches_transformers(pair, q):
    """Tubelets through the video embedder; at q = 0.5 EVS drops the same placeholder positions as the reference."""
    ref, ours = pair
    pvv = video()
    assert pvv.shape[1] == 3  # 5 frames -> 3 tubelets, the last one padded
    ids = torch.tensor([[3] + video_runs(pvv) + [6, 7]])
    ref.video_pruning_rate = q
    try:
        theirs = ref(input_ids=ids, pixel_values_videos=pvv).logits
    finally:
        ref.video_pruning_rate = 0.0
    mine = ours(ids, pixel_values_videos=pvv, video_pruning_rate=q).logits
    if q:
        assert theirs.shape[1] < ids.shape[1]  # EVS removed positions
    assert rel_err(mine, theirs) <= RTOL


@torch.no_grad()
def test_audio_prompt_matches_transformers(pair):
    """Two clips of different lengths in one padded batch: only each clip's real positions reach the prompt."""
    ref, ours = pair
    feats, mask = audio()
    counts = omni_embedding_lengths(mask, ours.config.audio).tolist()
    ids = torch.tensor([[3] + audio_run(counts[0]) + [5] + audio_run(counts[1]) + [6]])
    theirs = ref(input_ids=ids, input_features=feats, input_features_mask=mask).logits
    mine = ours(ids, input_features=feats, input_features_mask=mask).logits
    assert rel_err(mine, theirs) <= RTOL


@torch.no_grad()
def test_mixed_prompts_match_transformers(pair):
    """Image + audio, and video + audio with EVS on (the reference takes images and videos in separate calls)."""
    ref, ours = pair
    feats, mask = audio((80,))
    n = omni_embedding_lengths(mask, ours.config.audio).tolist()[0]
    pv, grids = images((50, 90))
    ids = torch.tensor([[3] + image_run(grids[0].tolist()) + [5] + audio_run(n) + [6]])
    theirs = ref(input_ids=ids, pixel_values=pv, image_grid_hw=grids, input_features=feats,
                 input_features_mask=mask).logits
    mine = ours(ids, pixel_values=pv, image_grid_hw=grids, input_features=feats, input_features_mask=mask).logits
    assert rel_err(mine, theirs) <= RTOL

    pvv = video(frames=6)
    ids = torch.tensor([[3] + video_runs(pvv) + [5] + audio_run(n) + [6]])
    ref.video_pruning_rate = 0.4
    try:
        theirs = ref(input_ids=ids, pixel_values_videos=pvv, input_features=feats, input_features_mask=mask).logits
    finally:
        ref.video_pruning_rate = 0.0
    mine = ours(ids, pixel_values_videos=pvv, input_features=feats, input_features_mask=mask,
                video_pruning_rate=0.4).logits
    assert rel_err(mine, theirs) <= RTOL


@torch.no_grad()
def test_images_and_videos_in_one_prompt_follow_media_order(pair):
    """Both fill <image> placeholders: with `media_order` each item's vectors land on its own runs (the video's
    tubelets where the video is), and the logits equal the prompt whose video placeholders get the same vectors
    through embeddings; without it the call is refused."""
    _, ours = pair
    pv, grids = images((50, 90))
    pvv = video(frames=4)
    ids = torch.tensor([[3] + video_runs(pvv) + [5] + image_run(grids[0].tolist()) + [6]])
    with pytest.raises(InputError, match="media_order"):
        ours(ids, pixel_values=pv, image_grid_hw=grids, pixel_values_videos=pvv)
    got = ours(ids, pixel_values=pv, image_grid_hw=grids, pixel_values_videos=pvv,
               media_order=["video", "image"]).logits
    vectors = torch.cat(ours.encode_videos(pvv) + ours.encode_images(pv, grids))
    embeds = ours.language_model.embed(ids).masked_scatter((ids == IMG)[..., None], vectors)
    torch.testing.assert_close(got, ours(inputs_embeds=embeds).logits, rtol=0, atol=0)


def test_placeholder_count_mismatch_is_a_typed_error(pair):
    _, ours = pair
    pv, grids = images((50, 90))
    ids = torch.tensor([[3] + image_run(grids[0].tolist())[:-2] + [6]])
    with pytest.raises(InputError, match="image placeholder tokens"):
        ours(ids, pixel_values=pv, image_grid_hw=grids)
    feats, mask = audio((80,))
    with pytest.raises(InputError, match="audio placeholder tokens"):
        ours(torch.tensor([[3] + audio_run(2) + [6]]), input_features=feats, input_features_mask=mask)


def test_tower_refuses_pixels_it_cannot_take(pair):
    _, ours = pair
    with pytest.raises(InputError, match="tubelets of 2 frames"):
        ours.encode_videos(torch.randn(1, 2, 3, 64, 64))  # frames not packed into tubelets
    with pytest.raises(InputError, match="multiples of the pixel-shuffle factor"):
        ours.encode_images(torch.randn(15, 768), torch.tensor([[3, 5]]))
    bins = ours.config.audio.num_mel_bins  # another width would be reshaped into other frames, silently
    with pytest.raises(InputError, match=f"expected \\(clips, frames, {bins}\\) mel features"):
        ours.encode_audio(torch.randn(1, 80, 5 * bins))


@torch.no_grad()
def test_directory_without_audio_config_builds_no_audio_branch(tmp_path):
    """No audio_config (and no MTP layers: no vision final norm): our model has neither, like the reference."""
    text = {**TINY_TEXT, "num_nextn_predict_layers": 0}
    ref = hf_omni(text=text, audio=None, seed=3)
    ref.save_pretrained(tmp_path)
    ours = vl.load_pretrained(tmp_path)
    assert ours.audio_encoder is None and ours.audio_projector is None
    assert isinstance(ours.vision_final_layernorm, torch.nn.Identity) and ref.vision_final_layernorm is None
    assert not any(n.startswith(("audio", "vision_final")) for n in ours.state_dict())
    pv, grids = images((50, 90))
    ids = torch.tensor([[3] + image_run(grids[0].tolist()) + [6]])
    assert rel_err(ours(ids, pixel_values=pv, image_grid_hw=grids).logits,
                   ref(input_ids=ids, pixel_values=pv, image_grid_hw=grids).logits) <= RTOL
    feats, mask = audio((40,))
    with pytest.raises(InputError, match="no audio branch"):
        ours(torch.tensor([[3, 20, AUD, 21]]), input_features=feats, input_features_mask=mask)


def test_every_parameter_gets_a_gradient(pair):
    """Contract: image, video and audio paths all reach the loss (nothing built and left unused)."""
    _, loaded = pair
    model = NemotronOmni(loaded.config)
    model.load_state_dict(loaded.state_dict())
    pv, grids = images((50, 90))
    pvv = video(frames=4)
    feats, mask = audio((80,))
    n = omni_embedding_lengths(mask, model.config.audio).tolist()[0]
    ids = torch.tensor([[3] + image_run(grids[0].tolist()) + video_runs(pvv) + audio_run(n) + [6]])
    out = model(ids, pixel_values=pv, image_grid_hw=grids, pixel_values_videos=pvv, input_features=feats,
                input_features_mask=mask, media_order=["image", "video"])
    assert torch.isfinite(out.logits).all()
    out.logits.square().mean().backward()
    # cls/register rows feed the patches only through attention; every tensor must be touched
    missing = [n for n, p in model.named_parameters() if p.grad is None or not p.grad.abs().sum() > 0]
    assert not missing, missing


# --- the released widths, few layers ----------------------------------------------------------------------------
RELEASED_VISION = dict(model_type="radio", hidden_size=1280, num_hidden_layers=1, num_attention_heads=16,
                       mlp_ratio=4.0, patch_size=16, max_img_size=2048, num_cls_tokens=2, num_registers=2,
                       video_temporal_patch_size=2)
RELEASED_TEXT = dict(TINY_TEXT, hidden_size=2688, hybrid_override_pattern="M*E", num_attention_heads=32,
                     num_key_value_heads=2, head_dim=128, intermediate_size=1856, mamba_num_heads=64,
                     mamba_head_dim=64, n_groups=8, ssm_state_size=128, chunk_size=128, n_routed_experts=4,
                     num_experts_per_tok=2, moe_intermediate_size=1856, moe_shared_expert_intermediate_size=3712,
                     num_nextn_predict_layers=1)
RELEASED_AUDIO = dict(hidden_size=1024, num_hidden_layers=1, num_attention_heads=8, intermediate_size=4096,
                      num_mel_bins=128, conv_kernel_size=9, subsampling_conv_channels=256, projection_hidden_size=4096,
                      projection_bias=False)


@torch.no_grad()
def test_released_widths_with_one_layer_each_match_transformers(tmp_path):
    """The widths of Nemotron 3 Nano Omni 30B-A3B (vl/config/omni.py `omni_30b_a3b`: ViT-H 1280 x 16 heads, the
    projector at 20480, the LLM's 2688 with its Mamba, attention and MoE widths, Parakeet 1024 x 8 heads and its
    4096-wide projector) with one layer of each kind and 4 experts (the count does not change a layer's maths):
    an image + audio prompt and a video + audio prompt with EVS, the same relative bound."""
    ref = hf_omni(vision=RELEASED_VISION, text=RELEASED_TEXT, audio=RELEASED_AUDIO, projector_hidden_size=20480,
                  vision_hidden_size=1280)
    ref.save_pretrained(tmp_path)
    ours = vl.load_pretrained(tmp_path)
    assert ours.config.lm.hidden_size == 2688 and ours.config.projector_hidden_size == 20480
    feats, mask = audio((60,), mels=128)
    n = omni_embedding_lengths(mask, ours.config.audio).tolist()[0]
    pv, grids = images((40, 60))
    ids = torch.tensor([[3] + image_run(grids[0].tolist()) + [5] + audio_run(n) + [6]])
    theirs = ref(input_ids=ids, pixel_values=pv, image_grid_hw=grids, input_features=feats,
                 input_features_mask=mask).logits
    mine = ours(ids, pixel_values=pv, image_grid_hw=grids, input_features=feats, input_features_mask=mask).logits
    assert rel_err(mine, theirs) <= RTOL
    pvv = video(frames=4)
    ids = torch.tensor([[3] + video_runs(pvv) + [5] + audio_run(n) + [6]])
    ref.video_pruning_rate = 0.5
    theirs = ref(input_ids=ids, pixel_values_videos=pvv, input_features=feats, input_features_mask=mask).logits
    mine = ours(ids, pixel_values_videos=pvv, input_features=feats, input_features_mask=mask,
                video_pruning_rate=0.5).logits
    assert rel_err(mine, theirs) <= RTOL
