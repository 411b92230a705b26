"""RADIO encoder: numerics against transformers' RadioModel, CPE (N10), flatten order, contract checks."""

import pytest
import torch
import torch.nn.functional as F

from vl.errors import ConfigError
from vl.modeling.radio import (
    RadioEncoder,
    TileShapeError,
    cropped_pos_embed,
    encode_tiles,
    image_to_patches,
    vit_dims,
)

# tiny tower: width 64, 2 blocks, 4 heads, MLP 256, patch 8, CPE table 12 x 12, K = 2 cls + 3 registers
DIM, DEPTH, HEADS, MLP, PATCH, CPE_MAX, K = 64, 2, 4, 256, 8, 96, 5


def tiny_encoder() -> RadioEncoder:
    torch.manual_seed(0)
    enc = RadioEncoder(DIM, DEPTH, HEADS, MLP, patch_size=PATCH, cpe_max_size=CPE_MAX, num_prefix_tokens=K)
    with torch.no_grad():  # random everything, biases and norms included, so no term can hide
        for p in enc.parameters():
            p.copy_(torch.randn_like(p) * 0.2)
        for name, p in enc.named_parameters():
            if name.endswith(("norm1.weight", "norm2.weight")):
                p.add_(1.0)
    return enc.eval()


def transformers_twin(enc: RadioEncoder):
    """transformers RadioModel with our weights (q/k/v split from the fused qkv), eager attention."""
    from transformers.models.radio.configuration_radio import RadioConfig
    from transformers.models.radio.modeling_radio import RadioModel

    cfg = RadioConfig(
        hidden_size=DIM, num_hidden_layers=DEPTH, num_attention_heads=HEADS, mlp_ratio=MLP / DIM,
        patch_size=PATCH, max_img_size=CPE_MAX, num_cls_tokens=2, num_registers=K - 2, summary_idxs=[0, 1],
    )
    cfg._attn_implementation = "eager"
    ref = RadioModel(cfg)
    ref.make_preprocessor_external()  # the VLM normalises in the processor
    sd = enc.state_dict()
    mapped = {
        "embeddings.patch_projection.weight": sd["patch_generator.embedder.weight"],
        "embeddings.position_embedding": sd["patch_generator.pos_embed"],
        "embeddings.cls_register_token": sd["patch_generator.cls_token.token"],
    }
    for i in range(DEPTH):
        src, dst = f"blocks.{i}.", f"encoder.layer.{i}."
        for part in ("norm1", "norm2", "mlp.fc1", "mlp.fc2"):
            for t in ("weight", "bias"):
                mapped[f"{dst}{part}.{t}"] = sd[f"{src}{part}.{t}"]
        for t in ("weight", "bias"):
            q, k, v = sd[f"{src}attn.qkv.{t}"].chunk(3, dim=0)
            mapped.update({f"{dst}attention.q_proj.{t}": q, f"{dst}attention.k_proj.{t}": k,
                           f"{dst}attention.v_proj.{t}": v, f"{dst}attention.o_proj.{t}": sd[f"{src}attn.proj.{t}"]})
    missing, unexpected = ref.load_state_dict(mapped, strict=False)
    assert not unexpected
    assert all("layer_scale" in m or m == "summary_idxs" for m in missing), missing  # LayerScale = 1.0
    return ref.eval()


@pytest.fixture(scope="module")
def pair():
    enc = tiny_encoder()
    return enc, transformers_twin(enc)


# square, non-square both ways, smaller than / equal to / larger than the 12 x 12 CPE table
@pytest.mark.parametrize("hw", [(32, 32), (32, 64), (80, 48), (96, 96), (120, 40), (160, 160)])
def test_matches_transformers_radio(pair, hw):
    enc, ref = pair
    pixels = torch.randn(2, 3, *hw)
    with torch.no_grad():
        ours = enc.forward_features(pixels)
        theirs = ref(pixels).features
    assert ours.shape == (2, (hw[0] // PATCH) * (hw[1] // PATCH), DIM)
    torch.testing.assert_close(ours, theirs, atol=1e-4, rtol=1e-4)


def test_sdpa_equals_plain_attention(pair):
    enc, _ = pair
    pixels = torch.randn(2, 3, 32, 48)
    with torch.no_grad():
        fused = enc.forward_features(pixels)
        for b in enc.blocks:
            b.attn.fused_attn = False
        try:
            plain = enc.forward_features(pixels)
        finally:
            for b in enc.blocks:
                b.attn.fused_attn = True
    torch.testing.assert_close(fused, plain, atol=1e-5, rtol=1e-5)


def test_patch_flatten_order_channel_row_col():
    p = 4
    pixels = torch.arange(2 * 3 * 8 * 12, dtype=torch.float32).reshape(2, 3, 8, 12)
    patches = image_to_patches(pixels, p)  # (2, 2*3, 48)
    assert patches.shape == (2, 6, 3 * p * p)
    for b in range(2):
        for py in range(2):
            for px in range(3):  # patches row-major over the grid
                expect = pixels[b, :, py * p : (py + 1) * p, px * p : (px + 1) * p].reshape(-1)  # (c, yy, xx)
                assert torch.equal(patches[b, py * 3 + px], expect)


def test_cpe_128_to_32_uses_align_corners_false():
    """N10: 128 x 128 table -> 32 x 32 grid equals bilinear align_corners=False, not True."""
    d = 8
    table = torch.randn(1, 128 * 128, d)
    got = cropped_pos_embed(table, (32, 32))  # (1, 1024, d)
    grid = table.reshape(1, 128, 128, d).permute(0, 3, 1, 2)
    want = F.interpolate(grid, size=(32, 32), mode="bilinear", align_corners=False).flatten(2).transpose(1, 2)
    other = F.interpolate(grid, size=(32, 32), mode="bilinear", align_corners=True).flatten(2).transpose(1, 2)
    torch.testing.assert_close(got, want, atol=0, rtol=0)
    assert (got - other).abs().max() > 1e-2


def test_cpe_non_square_resizes_to_max_side_then_crops_top_left():
    d = 3
    table = torch.randn(1, 12 * 12, d)
    got = cropped_pos_embed(table, (4, 10)).reshape(4, 10, d)
    grid = table.reshape(1, 12, 12, d).permute(0, 3, 1, 2)
    square = F.interpolate(grid, size=(10, 10), mode="bilinear", align_corners=False)[0].permute(1, 2, 0)
    torch.testing.assert_close(got, square[:4, :10], atol=0, rtol=0)


def test_prefix_tokens_have_no_position_and_positions_precede_them(pair):
    enc, _ = pair
    gen = enc.patch_generator
    pixels = torch.randn(1, 3, 24, 40)
    with torch.no_grad():
        seq = gen(pixels)  # (1, K + 15, D)
        patches = gen.embedder(image_to_patches(pixels, PATCH)) + cropped_pos_embed(gen.pos_embed, (3, 5))
    assert seq.shape == (1, K + 15, DIM)
    assert torch.equal(seq[0, :K], gen.cls_token.token)
    torch.testing.assert_close(seq[:, K:], patches, atol=0, rtol=0)
    assert enc.num_prefix_tokens == K


def test_encode_tiles_micro_batches_equal_one_batch(pair):
    enc, _ = pair
    tiles = torch.randn(7, 3, 32, 32)
    with torch.no_grad():
        whole = enc.forward_features(tiles)
        for mb in (1, 3, 7, 50):
            torch.testing.assert_close(encode_tiles(enc, tiles, micro_batch=mb), whole, atol=1e-5, rtol=1e-5)
    with pytest.raises(ConfigError):
        encode_tiles(enc, tiles, micro_batch=0)


def test_state_dict_keys_match_checkpoint_layout():
    enc = RadioEncoder(32, 2, 2, 64, patch_size=8, cpe_max_size=64, num_prefix_tokens=3)
    keys = set(enc.state_dict())
    want = {"patch_generator.embedder.weight", "patch_generator.pos_embed", "patch_generator.cls_token.token"}
    for i in range(2):
        for part in ("norm1", "attn.qkv", "attn.proj", "norm2", "mlp.fc1", "mlp.fc2"):
            want |= {f"blocks.{i}.{part}.weight", f"blocks.{i}.{part}.bias"}
    assert keys == want
    sd = enc.state_dict()
    assert sd["patch_generator.embedder.weight"].shape == (32, 3 * 8 * 8)
    assert sd["patch_generator.pos_embed"].shape == (1, 8 * 8, 32)
    assert sd["patch_generator.cls_token.token"].shape == (3, 32)
    assert sd["blocks.0.mlp.fc1.weight"].shape == (64, 32)
    assert enc.blocks[0].norm1.eps == 1e-6


def test_every_parameter_gets_a_gradient_and_no_nan():
    enc = tiny_encoder().train()
    out = enc.forward_features(torch.randn(2, 3, 24, 32))
    assert torch.isfinite(out).all()
    out.square().mean().backward()
    for name, p in enc.named_parameters():
        assert p.grad is not None and torch.isfinite(p.grad).all() and p.grad.abs().sum() > 0, name


def test_bf16_weights_take_fp32_pixels():
    enc = tiny_encoder().to(torch.bfloat16)
    with torch.no_grad():
        out = enc.forward_features(torch.randn(1, 3, 32, 32))
    assert out.dtype == torch.bfloat16 and torch.isfinite(out).all()


@pytest.mark.parametrize("shape", [(3, 32, 32), (1, 1, 32, 32), (1, 3, 30, 32), (1, 3, 32, 4)])
def test_bad_tile_shapes_are_typed_errors(pair, shape):
    enc, _ = pair
    with pytest.raises(TileShapeError):
        enc.forward_features(torch.randn(*shape))


def test_vit_dims_from_timm_registry_and_radio_names():
    assert vit_dims("vit_huge_patch16_224") == (1280, 32, 16, 5120)  # RADIO-registered name, 12B tower
    assert vit_dims("vit_huge_patch14_224") == (1280, 32, 16, 5120)  # timm's own ViT-H agrees
    assert vit_dims("vit_tiny_patch16_224") == (192, 12, 3, 768)
    assert vit_dims("vit_base_patch16_224") == (768, 12, 12, 3072)
    enc = RadioEncoder.from_timm_name("vit_tiny_patch16_224", patch_size=16, cpe_max_size=64, num_prefix_tokens=1)
    assert (enc.embed_dim, len(enc.blocks), enc.blocks[0].attn.num_heads) == (192, 12, 3)


def test_vit_dims_refuses_unknown_and_unsupported_names():
    with pytest.raises(ConfigError, match="vit_nonexistent"):
        vit_dims("vit_nonexistent_patch16_224")
    with pytest.raises(ConfigError, match="LayerScale"):
        vit_dims("vit_small_patch14_dinov2")  # timm ViT with LayerScale: not a RADIO tower


def test_bad_geometry_is_config_error():
    with pytest.raises(ConfigError):
        RadioEncoder(32, 1, 2, 64, patch_size=16, cpe_max_size=100, num_prefix_tokens=1)
    with pytest.raises(ConfigError):
        RadioEncoder(30, 1, 4, 64, patch_size=16, cpe_max_size=64, num_prefix_tokens=1)
