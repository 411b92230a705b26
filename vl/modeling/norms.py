"""RMSNorm variants used across the model (Nemotron-H, the projector): weight used as-is (no +1 offset),
statistics in fp32 as the reference does (transformers `NemotronHRMSNorm`, Megatron)."""

from __future__ import annotations

import torch
from torch import nn


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """fp32 statistics and weight multiply, result in the input dtype: x·rsqrt(mean(x²)+eps)·w, the same
    products as the reference, through torch's fused op (fewer dispatches per decode step)."""
    return nn.functional.rms_norm(x.float(), (x.shape[-1],), weight.float(), eps).to(x.dtype)


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float = 1e-5):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x):
        return rms_norm(x, self.weight, self.eps)


class GatedRMSNorm(nn.Module):
    """Mamba-2's output norm with `norm_before_gate=False`: y·silu(z), then RMS-normalised per group of
    `dim / n_groups` channels, then scaled. Output is fp32; the caller casts once before `out_proj`."""

    def __init__(self, dim: int, n_groups: int, eps: float = 1e-5):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.n_groups = n_groups
        self.eps = eps

    def forward(self, y, z):
        return gated_rms_norm(y, z, self.weight, self.n_groups, self.eps)


def gated_rms_norm(y, z, weight, n_groups: int, eps: float):
    """`GatedRMSNorm` as a function (the Mamba prefill applies it a block of groups at a time). Two full-size
    temporaries (the gate product and the normalised output), the statistics through a norm reduction: 4x faster
    than `rms_norm` over the group view on a 2k-token prefill. Without autograd the gate's fp32 copy and the
    gate product are overwritten in place."""
    record = torch.is_grad_enabled()
    gate = z.float()
    y = nn.functional.silu(gate, inplace=gate is not z and not record).mul_(y.float())
    shape = y.shape
    group = shape[-1] // n_groups
    yg = y.view(*shape[:-1], n_groups, group)
    rstd = torch.rsqrt(torch.linalg.vector_norm(yg, dim=-1, keepdim=True).square() / group + eps)
    out = yg * rstd if record else yg.mul_(rstd)
    return out.view(shape).mul_(weight.float())
