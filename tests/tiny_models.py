"""Tiny random reference models built in-test (nothing is downloaded)."""

from __future__ import annotations

import math

import torch

LM_VARIANTS = {
    # every layer kind; chunk 16 so lengths cross chunk boundaries cheaply
    "hybrid": dict(hybrid_override_pattern="M*-M-*M-", chunk_size=16),
    "moe": dict(hybrid_override_pattern="ME*EM-", chunk_size=16, n_routed_experts=8, num_experts_per_tok=2,
                moe_intermediate_size=32, moe_shared_expert_intermediate_size=48, n_group=2, topk_group=1,
                routed_scaling_factor=2.5),
    "moe_latent": dict(hybrid_override_pattern="MEM*E", chunk_size=16, n_routed_experts=6, num_experts_per_tok=2,
                       moe_intermediate_size=24, moe_shared_expert_intermediate_size=40, moe_latent_size=32),
}


def hf_nemotron_config(**overrides):
    import transformers

    base = dict(vocab_size=128, hidden_size=64, num_attention_heads=4, num_key_value_heads=2, head_dim=16,
                intermediate_size=96, mamba_num_heads=8, mamba_head_dim=16, n_groups=2, ssm_state_size=16,
                conv_kernel=4, eos_token_id=2, pad_token_id=0, bos_token_id=1)
    base.update(overrides)
    return transformers.NemotronHConfig(**base)


@torch.no_grad()
def randomize_(model: torch.nn.Module, seed: int = 0):
    """Weights with O(1) activations, so that logit comparisons mean something.

    dt_bias is drawn so that softplus(dt) stays far above transformers' `time_step_min` clamp (1e-3),
    which the reference applies in its PyTorch path and the kernels/vLLM/we do not: parity tests must not
    depend on that clamp.
    """
    g = torch.Generator().manual_seed(seed)
    for name, p in model.named_parameters():
        if name.endswith("A_log"):
            p.copy_(torch.log(torch.rand(p.shape, generator=g) * 15 + 1))
        elif name.endswith("dt_bias"):
            p.copy_(torch.rand(p.shape, generator=g) * 3 - 2)
        elif name.endswith(".D"):
            p.copy_(torch.randn(p.shape, generator=g))
        elif p.dim() == 1:
            p.copy_(1 + 0.1 * torch.randn(p.shape, generator=g))
        else:
            fan_in = p.shape[-1]
            p.copy_(torch.randn(p.shape, generator=g) / math.sqrt(fan_in))
    for name, b in model.named_buffers():
        if name.endswith("e_score_correction_bias"):
            b.copy_(0.1 * torch.randn(b.shape, generator=g))
    return model


def save_hf_nemotron(tmp_path, variant="hybrid", seed=0, dtype=torch.float32, **overrides):
    """Build a random transformers NemotronHForCausalLM, save_pretrained it; return (dir, model)."""
    import transformers

    cfg = hf_nemotron_config(**{**LM_VARIANTS[variant], **overrides})
    torch.manual_seed(seed)
    model = randomize_(transformers.NemotronHForCausalLM(cfg), seed).eval().to(dtype)
    out = tmp_path / f"nh_{variant}_{seed}"
    model.save_pretrained(out)
    return out, model
