"""Pixel shuffle v2 (N9) and the mlp1 projector: hand formulas and transformers' nemotron_h_omni."""

import pytest
import torch

from vl.errors import ConfigError, InputError
from vl.modeling.projector import (
    RMSNorm,
    VisionProjector,
    build_mlp1,
    patch_tokens_to_llm,
    pixel_shuffle_v2,
)


@pytest.mark.parametrize("rows,cols", [(4, 4), (4, 6), (6, 2), (32, 32)])
def test_pixel_shuffle_v2_on_arange(rows, cols):
    """N9: token (i, j) = concat(f[2i,2j], f[2i,2j+1], f[2i+1,2j], f[2i+1,2j+1]) exactly, row-major."""
    n, c = 2, 3
    f = torch.arange(n * rows * cols * c).reshape(n, rows, cols, c)
    out = pixel_shuffle_v2(f)
    assert out.shape == (n, rows // 2, cols // 2, 4 * c)
    for b in range(n):
        for i in range(rows // 2):
            for j in range(cols // 2):
                expect = torch.cat([f[b, 2 * i, 2 * j], f[b, 2 * i, 2 * j + 1], f[b, 2 * i + 1, 2 * j], f[b, 2 * i + 1, 2 * j + 1]])
                assert torch.equal(out[b, i, j], expect), (b, i, j)


def test_token_order_through_projector_function_is_row_major():
    """Flattened token t = i * W' + j carries the (i, j) block, checked through patch_tokens_to_llm."""
    h, w, c = 4, 6, 2
    tokens = torch.arange(h * w * c, dtype=torch.float32).reshape(1, h * w, c)
    out = patch_tokens_to_llm(tokens, (h, w), torch.nn.Identity())  # (1, 6, 8)
    grid = tokens.reshape(h, w, c)
    for i in range(h // 2):
        for j in range(w // 2):
            t = i * (w // 2) + j
            expect = torch.cat([grid[2 * i, 2 * j], grid[2 * i, 2 * j + 1], grid[2 * i + 1, 2 * j], grid[2 * i + 1, 2 * j + 1]])
            assert torch.equal(out[0, t], expect)


def test_refuses_other_ps_versions_and_ratios():
    with pytest.raises(ConfigError, match="ps_version"):
        VisionProjector(8, 16, 8, ps_version="v1")
    with pytest.raises(ConfigError, match="ps_version"):
        patch_tokens_to_llm(torch.randn(1, 16, 8), (4, 4), torch.nn.Identity(), ps_version="v1")
    with pytest.raises(ConfigError, match="downsample_ratio"):
        VisionProjector(8, 16, 8, downsample_ratio=0.3)
    with pytest.raises(InputError):
        pixel_shuffle_v2(torch.randn(1, 5, 4, 3))
    with pytest.raises(InputError):
        patch_tokens_to_llm(torch.randn(1, 15, 8), (4, 4), torch.nn.Identity())


def test_mlp1_key_names_and_shapes():
    proj = VisionProjector(vit_dim=12, hidden_dim=40, llm_dim=20)
    shapes = {k: tuple(v.shape) for k, v in proj.state_dict().items()}
    assert shapes == {"mlp1.0.weight": (48,), "mlp1.1.weight": (40, 48), "mlp1.3.weight": (20, 40)}
    assert proj.mlp1[0].eps == 1e-5
    assert build_mlp1(8, 16, 4, eps=1e-6)[0].eps == 1e-6


def _random_projector(vit_dim=16, hidden=40, llm=24, eps=1e-5):
    proj = VisionProjector(vit_dim, hidden, llm, eps=eps)
    with torch.no_grad():
        for p in proj.parameters():
            p.copy_(torch.randn_like(p) * 0.3)
    return proj.eval()


def test_projector_matches_hand_formula():
    proj = _random_projector(eps=1e-5)
    tokens = torch.randn(3, 6 * 4, 16)
    got = proj(tokens, (6, 4))  # (3, 6, 24)
    w0, w1, w3 = (proj.state_dict()[f"mlp1.{i}.weight"] for i in (0, 1, 3))
    x = tokens.reshape(3, 3, 2, 2, 2, 16).permute(0, 1, 3, 2, 4, 5).reshape(3, 6, 64)  # [TL, TR, BL, BR]
    x = w0 * x / torch.sqrt(x.pow(2).mean(-1, keepdim=True) + 1e-5)
    want = torch.relu(x @ w1.T).pow(2) @ w3.T
    torch.testing.assert_close(got, want, atol=1e-4, rtol=1e-4)


def test_rmsnorm_computes_in_fp32_and_uses_weight_as_is():
    norm = RMSNorm(64, eps=1e-5)
    with torch.no_grad():
        norm.weight.copy_(torch.randn(64))
    x = torch.randn(5, 64) * 30
    xb = x.to(torch.bfloat16)
    want = (norm.weight * xb.float() * torch.rsqrt(xb.float().pow(2).mean(-1, keepdim=True) + 1e-5)).to(torch.bfloat16)
    assert torch.equal(norm(xb), want)
    zero_w = RMSNorm(64)
    with torch.no_grad():
        zero_w.weight.zero_()
    assert torch.equal(zero_w(x), torch.zeros_like(x))  # no "+1" offset on the weight


@pytest.fixture(scope="module")
def omni_model():
    from transformers.models.nemotron_h_omni.configuration_nemotron_h_omni import NemotronH_Omni_Reasoning_V3_Config
    from transformers.models.nemotron_h_omni.modeling_nemotron_h_omni import NemotronH_Omni_Reasoning_V3

    cfg = NemotronH_Omni_Reasoning_V3_Config(
        vision_config=dict(hidden_size=16, num_hidden_layers=1, num_attention_heads=2, patch_size=8,
                           max_img_size=64, num_cls_tokens=2, num_registers=2, video_temporal_patch_size=2),
        text_config=dict(hidden_size=24, num_hidden_layers=2, hybrid_override_pattern="M-", vocab_size=64,
                         num_attention_heads=2, num_key_value_heads=1, head_dim=12, intermediate_size=32,
                         mamba_num_heads=4, mamba_head_dim=6, n_groups=1, ssm_state_size=8),
        vision_hidden_size=16, projector_hidden_size=40, image_token_id=5,
    )
    model = NemotronH_Omni_Reasoning_V3(cfg).eval()
    assert model.vision_final_layernorm is None  # no MTP layers: V2-style, no extra norm before the shuffle
    return model


@pytest.mark.parametrize("grid", [(4, 4), (4, 6), (8, 2)])
def test_composed_equals_transformers_nemotron_h_omni(omni_model, grid):
    proj = _random_projector(16, 40, 24)
    w = proj.state_dict()
    omni_model.multi_modal_projector.load_state_dict(
        {"layer_norm.weight": w["mlp1.0.weight"], "linear_1.weight": w["mlp1.1.weight"], "linear_2.weight": w["mlp1.3.weight"]}
    )
    assert omni_model.multi_modal_projector.layer_norm.variance_epsilon == proj.mlp1[0].eps
    h, wd = grid
    tokens = torch.randn(3, h * wd, 16)
    with torch.no_grad():
        ours = patch_tokens_to_llm(tokens, grid, proj.mlp1)
        theirs = omni_model.project_vision_features(tokens, h, wd)
    assert ours.shape == (3, h * wd // 4, 24)
    torch.testing.assert_close(ours, theirs, atol=1e-4, rtol=1e-4)


def test_every_parameter_gets_a_gradient_and_no_nan():
    proj = _random_projector().train()
    tokens = torch.randn(2, 16, 16, requires_grad=True)
    out = proj(tokens, (4, 4))
    assert torch.isfinite(out).all()
    out.square().mean().backward()
    for name, p in proj.named_parameters():
        assert p.grad is not None and torch.isfinite(p.grad).all() and p.grad.abs().sum() > 0, name
    assert tokens.grad is not None and torch.isfinite(tokens.grad).all()
