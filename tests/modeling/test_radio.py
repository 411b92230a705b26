"""RADIO encoder: numerics against transformers' RadioModel, CPE (N10), flatten order, contract checks, and the fused
CPU block path against timm's modules."""

import copy

import pytest
import torch
import torch.nn.functional as F

from vl.errors import ConfigError
from vl.modeling import radio
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


# --- the fused CPU block path (oneDNN products with bias / GELU / residual post-ops, AMX attention) ----------------

def _skip_unless_fused(enc, x):
    assert enc.fused_cpu  # the default
    with torch.inference_mode():
        reason = radio.fused_cpu_off(enc, x)
    if reason is not None:
        pytest.skip(f"the fused CPU path does not apply on this machine: {reason}")


@pytest.fixture
def count_fused(monkeypatch):
    """Counts fused_block calls, so a test knows which path ran."""
    calls = []
    real = radio.fused_block

    def counting(block, x, packed=False):
        calls.append(x.shape)
        return real(block, x, packed)

    monkeypatch.setattr(radio, "fused_block", counting)
    return calls


def layer_scale_encoder() -> RadioEncoder:
    torch.manual_seed(1)
    enc = RadioEncoder(DIM, DEPTH, HEADS, MLP, patch_size=PATCH, cpe_max_size=CPE_MAX, num_prefix_tokens=K,
                       layer_scale=True)
    with torch.no_grad():
        for name, p in enc.named_parameters():
            p.copy_(torch.randn_like(p) * 0.2 + (1.0 if name.endswith(("norm1.weight", "norm2.weight", "gamma")) else 0))
    return enc.eval()


@pytest.mark.parametrize("make", [tiny_encoder, layer_scale_encoder], ids=["plain", "layer_scale"])
@pytest.mark.parametrize("shape", [(1, 13, DIM), (3, 29, DIM)])
def test_fused_block_equals_the_timm_block_in_fp32(make, shape):
    """The twin test at its sharpest: fp32, where only oneDNN's summation order separates the two."""
    enc = make()
    if not radio._onednn():
        pytest.skip("torch was built without oneDNN")
    x = torch.randn(*shape)
    with torch.inference_mode():
        for block in enc.blocks:
            want = block(x)
            got = radio.fused_block(block, x)
            torch.testing.assert_close(got, want, atol=1e-5 * want.abs().max().item(), rtol=0)
            x = want


def _bf16_errors(enc32, pixels, fused: bool):
    enc = copy.deepcopy(enc32).to(torch.bfloat16)
    enc.fused_cpu = fused
    with torch.inference_mode():
        want = enc32.forward_features(pixels)
        got = enc.forward_features(pixels).float()
    err = (got - want).abs()
    return err.max().item(), err.mean().item()


@pytest.mark.parametrize("hw", [(32, 32), (48, 80)])
def test_bf16_default_is_the_fused_path_within_bf16_noise(count_fused, hw):
    enc32 = tiny_encoder()
    pixels = torch.randn(2, 3, *hw)
    _skip_unless_fused(copy.deepcopy(enc32).to(torch.bfloat16), pixels.bfloat16())
    plain_max, plain_mean = _bf16_errors(enc32, pixels, fused=False)
    assert not count_fused
    fused_max, fused_mean = _bf16_errors(enc32, pixels, fused=True)
    assert len(count_fused) == DEPTH  # every block went through the fused path
    assert plain_max > 0  # bf16 rounds: the comparison has something to measure
    assert fused_max <= 1.5 * plain_max and fused_mean <= 1.25 * plain_mean, (fused_max, plain_max, fused_mean,
                                                                                plain_mean)


def test_fused_path_off_reasons_and_the_modules_run(count_fused):
    enc32 = tiny_encoder()
    enc = copy.deepcopy(enc32).to(torch.bfloat16)
    pixels = torch.randn(1, 3, 32, 32)
    _skip_unless_fused(enc, pixels.bfloat16())
    x = pixels.bfloat16()
    assert "autograd" in radio.fused_cpu_off(enc, x)  # grad mode on, parameters require grad
    with torch.inference_mode():
        assert "float32" in radio.fused_cpu_off(enc32, pixels)  # fp32 keeps the modules (and transformers' bits)
        enc32.forward_features(pixels)
        enc.fused_cpu = False
        assert "fused_cpu = False" in radio.fused_cpu_off(enc, x)
        enc.forward_features(pixels)
        enc.fused_cpu = True
        enc.blocks[1].attn.fused_attn = False
        assert "unfused attention" in radio.fused_cpu_off(enc, x)
        enc.forward_features(pixels)
        enc.blocks[1].attn.fused_attn = True
        assert not count_fused
        assert radio.fused_cpu_off(enc, x) is None
        enc.forward_features(pixels)
    assert len(count_fused) == DEPTH
    out = enc.forward_features(pixels)  # training-style call: the modules, with a graph
    assert out.requires_grad and len(count_fused) == DEPTH


@pytest.mark.parametrize("packed", [True, False], ids=["packed", "per_call"])
def test_fused_weights_follow_replaced_and_changed_weights(packed):
    """A call, an error, weights loaded in place, a parameter replaced: each call answers for the weights it sees,
    with the packed weights kept (opt-in `pack_weights`) as with the weights reordered per call (the default)."""
    enc = tiny_encoder().to(torch.bfloat16)
    enc.pack_weights = packed
    other = copy.deepcopy(enc)
    with torch.no_grad():
        for p in other.parameters():
            p.mul_(-0.5)
    pixels = torch.randn(2, 3, 32, 40)
    _skip_unless_fused(enc, pixels.bfloat16())

    def plain(e):
        e.fused_cpu = False
        try:
            return e.forward_features(pixels)
        finally:
            e.fused_cpu = True

    with torch.inference_mode():
        first = enc.forward_features(pixels)
        with pytest.raises(TileShapeError):
            enc.forward_features(torch.randn(1, 3, 30, 32))
        torch.testing.assert_close(enc.forward_features(pixels), first, atol=0, rtol=0)  # same after an error
        want = other.forward_features(pixels)
    with torch.no_grad():
        enc.load_state_dict(other.state_dict())  # copied in place: same tensors, new version
    with torch.inference_mode():
        torch.testing.assert_close(enc.forward_features(pixels), want, atol=0, rtol=0)
        assert (want.float() - first.float()).abs().max() > 1.0
    # a new Parameter object for one weight: the fused path packs the new one
    enc.blocks[0].mlp.fc1.weight = torch.nn.Parameter(torch.zeros_like(enc.blocks[0].mlp.fc1.weight))
    with torch.inference_mode():
        got = enc.forward_features(pixels)
        scale = plain(enc).float().abs().max().item()
        torch.testing.assert_close(got.float(), plain(enc).float(), atol=0.05 * scale, rtol=0)
        assert (got.float() - want.float()).abs().max() > 0.1 * scale


def test_forward_patches_and_tiles_take_the_same_fused_path(count_fused):
    """Omni's native-resolution images (flattened patches) and V2 tiles are one computation in bf16 as well."""
    enc = tiny_encoder().to(torch.bfloat16)
    pixels = torch.randn(1, 3, 24, 40)
    _skip_unless_fused(enc, pixels.bfloat16())
    with torch.inference_mode():
        tiles = enc.forward_features(pixels)[0]
        patches = enc.forward_patches(image_to_patches(pixels, PATCH)[0], (3, 5))
    assert len(count_fused) == 2 * DEPTH
    torch.testing.assert_close(patches, tiles, atol=0, rtol=0)


def test_packed_and_per_call_weights_give_the_same_bits():
    """`pack_weights` only keeps oneDNN's reordered copy: the products, and so the tower's output, are the same."""
    enc = tiny_encoder().to(torch.bfloat16)
    pixels = torch.randn(2, 3, 32, 40)
    _skip_unless_fused(enc, pixels.bfloat16())
    with torch.inference_mode():
        per_call = enc.forward_features(pixels)
        enc.pack_weights = True
        torch.testing.assert_close(enc.forward_features(pixels), per_call, atol=0, rtol=0)


def test_the_fused_path_runs_the_tile_attention_where_the_cpu_has_it(monkeypatch):
    """Each fused block's attention goes to vl/kernels/attention.py; where it answers (AMX) its output is used, and
    the tower stays within bf16 noise of timm's modules either way (the kernel's own twin test:
    tests/kernels/test_attention_cpu.py)."""
    from vl.kernels import attention

    enc32 = tiny_encoder()
    pixels = torch.randn(2, 3, 32, 32)
    _skip_unless_fused(copy.deepcopy(enc32).to(torch.bfloat16), pixels.bfloat16())
    answered = []
    real = attention.attention

    def spy(q, k, v, scale=None):
        out = real(q, k, v, scale)
        answered.append(out is not None)
        return out

    monkeypatch.setattr(attention, "attention", spy)
    fused_max, fused_mean = _bf16_errors(enc32, pixels, fused=True)
    plain_max, plain_mean = _bf16_errors(enc32, pixels, fused=False)
    assert len(answered) == DEPTH and len(set(answered)) == 1
    assert answered[0] == (attention.library() is not None)  # the kernel ran exactly where it is available
    assert fused_max <= 1.5 * plain_max and fused_mean <= 1.25 * plain_mean, (fused_max, plain_max, fused_mean,
                                                                                plain_mean)


def test_hooks_on_a_block_run_on_the_fused_path_and_hooks_on_its_layers_send_it_to_the_modules(count_fused):
    """The fused path calls none of a block's layers: a block's own forward hooks run around it (as `block(x)` runs
    them, a replaced output included), and a hook on one of its layers sends the tower to timm's modules, which
    call it."""
    enc = tiny_encoder().to(torch.bfloat16)
    pixels = torch.randn(1, 3, 32, 32)
    _skip_unless_fused(enc, pixels.bfloat16())
    x = pixels.bfloat16()
    calls = []
    with torch.inference_mode():
        want = enc.forward_features(pixels)
        pre = enc.blocks[0].register_forward_pre_hook(lambda m, args: calls.append("pre"))
        post = enc.blocks[0].register_forward_hook(lambda m, args, out: calls.append("post") or out * 0)
        assert radio.fused_cpu_off(enc, x) is None
        zeroed = enc.forward_features(pixels)  # block 0's output replaced by zeros: the later blocks see them
        assert calls == ["pre", "post"] and len(count_fused) == 2 * DEPTH
        assert not torch.equal(zeroed, want)
        pre.remove(), post.remove()
        layer = enc.blocks[1].mlp.fc2.register_forward_hook(lambda m, args, out: calls.append("fc2"))
        assert "hooks on a block's layers" in radio.fused_cpu_off(enc, x)
        enc.forward_features(pixels)
        assert calls[-1] == "fc2" and len(count_fused) == 2 * DEPTH  # the modules ran, and the layer's hook
        layer.remove()
        torch.testing.assert_close(enc.forward_features(pixels), want, atol=0, rtol=0)
