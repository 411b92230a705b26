"""Random weights with O(1) activations, for benchmarks and tests that have no checkpoint to load.

Works on our modules and on transformers' Nemotron-H alike (the parameter names are the same): N(0, 1/fan_in)
matrices, norms near 1, and the SSM parameters in their usual ranges. dt_bias is drawn so that softplus(dt)
stays far above transformers' `time_step_min` clamp (1e-3), which the reference applies in its PyTorch path
and the kernels, vLLM and we do not: parity tests must not depend on that clamp.
"""

from __future__ import annotations

import math

import torch
from torch import nn


@torch.no_grad()
def randomize_(model: nn.Module, seed: int = 0, generator: torch.Generator | None = None) -> nn.Module:
    """Overwrite every parameter (and the MoE routers' score-correction biases) in place; returns `model`."""
    g = generator or torch.Generator().manual_seed(seed)
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
            p.copy_(torch.randn(p.shape, generator=g) / math.sqrt(p.shape[-1]))
    for name, b in model.named_buffers():
        if name.endswith("e_score_correction_bias"):
            b.copy_(0.1 * torch.randn(b.shape, generator=g))
    return model
