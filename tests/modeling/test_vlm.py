"""The composed VL model against transformers' nemotron_h_omni (same RADIO, shuffle, projector, merge),
and the Nano V2 VL checkpoint adapter both ways."""

import json

import pytest
import torch
from safetensors.torch import load_file, save_file

import vl
from tiny_models import randomize_
from vl.checkpoint.files import save_tensors
from vl.checkpoint.nano_vl import save_pretrained
from omni_adapter import omni_config_to_nano_vl, omni_state_dict_to_nano_vl
from vl.config import tiny_vl
from vl.errors import CheckpointError, UnsafeCheckpointError
from vl.modeling.radio import image_to_patches
from vl.modeling.vlm import MediaSpan, NemotronVL

IMG = 299  # <image> id of the tiny configs
S, P = 64, 16  # tile size and patch: 4x4 patches -> 2x2 = 4 tokens per tile


def tiny_omni():
    from transformers.models.nemotron_h_omni.configuration_nemotron_h_omni import NemotronH_Omni_Reasoning_V3_Config
    from transformers.models.nemotron_h_omni.modeling_nemotron_h_omni import NemotronH_Omni_Reasoning_V3

    vision = dict(model_type="radio", hidden_size=192, num_hidden_layers=12, num_attention_heads=3, mlp_ratio=4.0,
                  patch_size=P, max_img_size=128, num_cls_tokens=2, num_registers=2, video_temporal_patch_size=2,
                  norm_mean=[0.5, 0.4, 0.3], norm_std=[0.2, 0.25, 0.3])
    text = dict(model_type="nemotron_h", vocab_size=300, hidden_size=64, hybrid_override_pattern="M*-M",
                num_attention_heads=4, num_key_value_heads=2, head_dim=16, intermediate_size=96, mamba_num_heads=8,
                mamba_head_dim=16, n_groups=2, ssm_state_size=16, chunk_size=16)
    cfg = NemotronH_Omni_Reasoning_V3_Config(vision_config=vision, text_config=text, force_image_size=S,
                                             projector_hidden_size=96, vision_hidden_size=192, image_token_id=IMG,
                                             video_temporal_patch_size=2)
    cfg._attn_implementation = "eager"
    cfg.vision_config._attn_implementation = "eager"
    cfg.text_config._attn_implementation = "eager"
    torch.manual_seed(0)
    model = NemotronH_Omni_Reasoning_V3(cfg).eval()
    randomize_(model, seed=1)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "layer_scale" in name:
                p.fill_(1.0)  # V2 has no LayerScale
            elif name.startswith("vision_model") and p.dim() > 1:
                p.mul_(0.5)  # keep 12 random blocks well-conditioned
    model.config.vision_config.vit_name = "vit_tiny_patch16_224"  # (192, 12, 3, 768)
    return model


@pytest.fixture(scope="module")
def omni_pair(tmp_path_factory):
    ref = tiny_omni()
    d = tmp_path_factory.mktemp("from_omni")
    save_tensors(omni_state_dict_to_nano_vl(ref.state_dict()), d)
    (d / "config.json").write_text(json.dumps(omni_config_to_nano_vl(ref.config)))
    return ref, vl.load_pretrained(d), d


def prompt(n_tiles_per_image):
    ids = [3, 4]
    for n in n_tiles_per_image:
        ids += [10] + [IMG] * (4 * n) + [11, 5]
    return torch.tensor([ids])


@torch.no_grad()
def test_vl_forward_equals_transformers_omni(omni_pair):
    ref, ours, _ = omni_pair
    tiles = torch.randn(5, 3, S, S)  # an image of 3 tiles and one of 2, in placeholder order
    ids = prompt([3, 2])
    patches = image_to_patches(tiles, P).reshape(-1, 3 * P * P)  # (c, row, col) flatten, as RADIO
    grid = torch.tensor([[S // P, S // P]] * 5)
    theirs = ref(input_ids=ids, pixel_values=patches, image_grid_hw=grid).logits
    mine = ours(ids, tiles).logits
    assert theirs.abs().max() > 1.0
    assert (theirs - mine).abs().max() <= 1e-4


def test_save_load_round_trip_is_exact_and_idempotent(omni_pair, tmp_path):
    _, ours, _ = omni_pair
    save_pretrained(ours, tmp_path / "a")
    again = vl.load_pretrained(tmp_path / "a")
    save_pretrained(again, tmp_path / "b")
    for f in ("config.json",):
        assert (tmp_path / "a" / f).read_text() == (tmp_path / "b" / f).read_text()
    a, b = load_file(tmp_path / "a/model.safetensors"), load_file(tmp_path / "b/model.safetensors")
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    for (ka, va), (kb, vb) in zip(ours.state_dict().items(), again.state_dict().items()):
        assert ka == kb and torch.equal(va, vb)
    keys = set(a)
    assert "mlp1.1.weight" in keys and "language_model.backbone.embeddings.weight" in keys
    assert "vision_model.radio_model.model.patch_generator.cls_token.token" in keys
    assert "vision_model.radio_model.input_conditioner.norm_mean" in keys


def _edit(d, fn):
    t = load_file(d / "model.safetensors")
    fn(t)
    save_file(t, d / "model.safetensors")


@pytest.fixture()
def saved(tmp_path):
    torch.manual_seed(0)
    return save_pretrained(NemotronVL(tiny_vl()).eval(), tmp_path / "tiny")


def test_missing_projector_tensor_is_refused(saved):
    _edit(saved, lambda t: t.pop("mlp1.3.weight"))
    with pytest.raises(CheckpointError, match=r"missing tensor 'projector.mlp1.3.weight'"):
        vl.load_pretrained(saved)


def test_wrong_vision_shape_is_refused(saved):
    key = "vision_model.radio_model.model.blocks.3.mlp.fc1.weight"
    _edit(saved, lambda t: t.__setitem__(key, torch.zeros(700, 192)))
    with pytest.raises(CheckpointError, match=rf"'{key}': expected shape \[768, 192\], found \[700, 192\]"):
        vl.load_pretrained(saved)


def test_normalisation_buffers_must_agree_with_config(saved):
    cfg = json.loads((saved / "config.json").read_text())
    cfg["norm_mean"] = [0.485, 0.456, 0.406]
    (saved / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(CheckpointError, match="input_conditioner.norm_mean"):
        vl.load_pretrained(saved)
    del cfg["norm_mean"], cfg["norm_std"]  # absent: RADIO's default, which these buffers hold
    (saved / "config.json").write_text(json.dumps(cfg))
    assert vl.load_pretrained(saved).config.norm_std == pytest.approx(tiny_vl().norm_std, abs=1e-7)


def test_cls_register_count_comes_from_the_tensor(saved):
    key = "vision_model.radio_model.model.patch_generator.cls_token.token"
    _edit(saved, lambda t: t.__setitem__(key, torch.randn(7, 192)))
    assert vl.load_pretrained(saved).vision.num_prefix_tokens == 7


def test_auto_map_with_malicious_code_never_runs(saved, tmp_path):
    marker = tmp_path / "pwned"
    cfg = json.loads((saved / "config.json").read_text())
    cfg["auto_map"] = {"AutoModel": "modeling.NemotronH_Nano_VL_V2", "AutoConfig": "configuration.C"}
    (saved / "config.json").write_text(json.dumps(cfg))
    for f in ("modeling.py", "configuration.py"):
        (saved / f).write_text(f"open({str(marker)!r}, 'w').write('x')\n")
    vl.load_pretrained(saved)  # a known architecture loads natively; its remote code is ignored
    cfg["model_type"] = cfg["architectures"][0] = "SomethingElse"
    (saved / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(UnsafeCheckpointError, match="remote code is never executed"):
        vl.load_pretrained(saved)
    assert not marker.exists()


@torch.no_grad()
def test_micro_batching_does_not_change_results(saved):
    model = vl.load_pretrained(saved)
    tiles = torch.randn(5, 3, S, S)
    model.micro_batch = 16
    big = model.encode_tiles(tiles)
    model.micro_batch = 2
    assert torch.allclose(big, model.encode_tiles(tiles), atol=1e-5)
    model.micro_batch = None  # the default: 16 tiles per tower call in fp32, 4 in bf16 on a CPU
    sizes = []
    real = model.vision.forward_features
    model.vision.forward_features = lambda x: sizes.append(x.shape[0]) or real(x)
    assert torch.equal(big, model.encode_tiles(tiles)) and sizes == [5]
    model.to(torch.bfloat16)
    got = model.encode_tiles(tiles.bfloat16())
    assert sizes == [5, 4, 1] and (got.float() - big).abs().max() <= 0.05 * big.abs().max()


@torch.no_grad()
def test_placeholder_count_mismatch_is_a_clear_error(saved):
    model = vl.load_pretrained(saved)
    with pytest.raises(Exception, match="8 image placeholder tokens but the images/videos give 12"):
        model(prompt([2]), torch.randn(3, 3, S, S))


@torch.no_grad()
def test_evs_pruned_forward_equals_hand_pruned_input(saved):
    """EVS end to end: the pruned forward equals an unpruned forward of the hand-shortened sequence."""
    from token_reduction import EVS, TokenLayout

    model = vl.load_pretrained(saved)
    frames = torch.randn(6, 3, S, S)
    frames[3] = frames[2]  # a static frame: EVS should drop (most of) it
    ids = [3]
    for _ in range(6):
        ids += [20, 10] + [IMG] * 4 + [11]
    ids = torch.tensor([ids + [5]])
    out = model(ids, frames, media=[MediaSpan("video", 6)], video_pruning_rate=0.5).logits
    vectors = model.encode_tiles(frames).reshape(-1, 64)
    keep = EVS(0.5)(vectors, TokenLayout.video(6, 2, 2)).keep
    assert 0 < int(keep.sum()) < 24
    slot = ids[0] == IMG
    drop = torch.zeros_like(slot)
    drop[slot] = ~keep
    embeds = model.language_model.embed(ids).masked_scatter(slot[None, :, None], vectors)
    hand = model.language_model(inputs_embeds=embeds[:, ~drop]).logits
    assert out.shape == hand.shape
    assert (out - hand).abs().max() <= 1e-5


@torch.no_grad()
def test_document_pruning_spans_all_pages_and_leaves_videos_alone(saved):
    """Redundant-token pruning sees the request's images as one document (one budget, every page's thumbnail
    protected); a video between the pages is untouched at q=0; the forward equals the hand-pruned one."""
    from token_reduction import RedundantTokenPruner, TokenLayout

    model = vl.load_pretrained(saved)
    blank = torch.full((3, S, S), 0.8)
    page_a = torch.stack([blank, blank, torch.randn(3, S, S)])  # 2 tiles + thumbnail (last)
    page_b = torch.stack([blank])  # one tile, no thumbnail
    video = torch.randn(2, 3, S, S)
    tiles = torch.cat([page_a, video, page_b])
    media = [MediaSpan("image", 3), MediaSpan("video", 2), MediaSpan("image", 1)]
    ids = prompt([3, 2, 1])
    vectors = model.encode_tiles(tiles).reshape(-1, 64)  # 6 tiles x 4 tokens
    pages = torch.cat([vectors[:12], vectors[20:]])
    expected = RedundantTokenPruner(rate=0.5)(pages, TokenLayout.document([3, 1], 2, 2))
    vision = model.reduce(model.encode_tiles(tiles), media, video_pruning_rate=0.0, token_pruning_rate=0.5)
    assert torch.equal(vision.keep[:12], expected.keep[:12]) and torch.equal(vision.keep[20:], expected.keep[12:])
    assert vision.keep[12:20].all(), "the video was pruned at q=0"
    assert vision.keep[8:12].all(), "page A's thumbnail was pruned"
    removed = int((~vision.keep).sum())
    assert 0 < removed == expected.info["tokens_removed"] and vision.info == [expected.info]
    # one budget for the document: page A's 8 blank tokens and page B's 4 are all candidates for its 6 drops
    # (which of the tied blank tokens go depends on the last bits of their scores, so that is not asserted)
    assert expected.info["candidates"] == 12 and removed == int(0.5 * 12)

    embeds, _, _ = model.prepare_inputs(ids, tiles, media, video_pruning_rate=0.0, token_pruning_rate=0.5)
    out = model.language_model(inputs_embeds=embeds).logits
    slot = ids[0] == IMG
    drop = torch.zeros_like(slot)
    drop[slot] = ~vision.keep
    embeds = model.language_model.embed(ids).masked_scatter(slot[None, :, None], vectors)
    hand = model.language_model(inputs_embeds=embeds[:, ~drop]).logits
    assert out.shape == hand.shape and (out - hand).abs().max() <= 1e-5
