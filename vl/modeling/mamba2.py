"""Mamba-2 mixer of Nemotron-H (`M` layers).

Follows the Mamba-2 block (Dao & Gu 2024) as Nemotron-H uses it (docs/format.md §7.3; transformers
`NemotronHMamba2Mixer`; vLLM `MambaMixer2`): in_proj split [z | x | B | C | dt], causal depthwise conv +
SiLU over xBC only, dt = softplus(dt + dt_bias) clamped to `time_step_limit` (default (0, inf): no clamp,
as the kernels and vLLM), A = -exp(A_log) in fp32, chunked SSD scan for prefill and the one-step
recurrence for decode, D skip, gated grouped RMSNorm (gate before norm), out_proj.

Padding (left-padded batches): positions with mask 0 contribute nothing to the conv window or the state.
"""

from __future__ import annotations

import math

import torch
from torch import nn

from vl.config import LMConfig
from vl.modeling import kernels
from vl.modeling.norms import GatedRMSNorm, gated_rms_norm

# Above this many elements of x (16 MiB in fp32) a prefill without autograd runs a block of groups at a time
# (`Mamba2Mixer._prefill_in_group_blocks`).
BLOCK_ELEMENTS = 1 << 22


class Mamba2Mixer(nn.Module):
    def __init__(self, cfg: LMConfig):
        super().__init__()
        self.n_heads, self.head_dim = cfg.mamba_num_heads, cfg.mamba_head_dim
        self.n_groups, self.d_state = cfg.n_groups, cfg.ssm_state_size
        self.d_inner, self.conv_dim = cfg.mamba_d_inner, cfg.mamba_conv_dim
        self.chunk_size = cfg.chunk_size
        self.dt_limit = cfg.time_step_limit
        self.in_proj = nn.Linear(cfg.hidden_size, cfg.mamba_in_proj_dim, bias=cfg.use_bias)
        self.conv1d = nn.Conv1d(self.conv_dim, self.conv_dim, cfg.conv_kernel, groups=self.conv_dim,
                                bias=cfg.use_conv_bias)
        self.dt_bias = nn.Parameter(torch.ones(self.n_heads))
        self.A_log = nn.Parameter(torch.log(torch.arange(1, self.n_heads + 1, dtype=torch.float32)))
        self.D = nn.Parameter(torch.ones(self.n_heads))
        self.norm = GatedRMSNorm(self.d_inner, self.n_groups, cfg.layer_norm_epsilon)
        self.out_proj = nn.Linear(self.d_inner, cfg.hidden_size, bias=cfg.use_bias)

    def forward(self, h, state=None, mask=None):
        """h (b, t, d); state: a `MambaState` (conv, ssm) updated in place, or None; mask (b, t) or None."""
        b, t, _ = h.shape
        zxbcdt = self.in_proj(h)
        z, xbc, dt = zxbcdt.split([self.d_inner, self.conv_dim, self.n_heads], dim=-1)
        if mask is not None:
            xbc = xbc * mask[..., None].to(xbc.dtype)
        xbc = kernels.causal_conv(xbc, self.conv1d.weight[:, 0], self.conv1d.bias,
                                  state.conv if state is not None else None)
        if mask is not None:
            xbc = xbc * mask[..., None].to(xbc.dtype)
        x, B, C = xbc.split([self.d_inner, self.n_groups * self.d_state, self.n_groups * self.d_state], dim=-1)

        dt = nn.functional.softplus(dt.float() + self.dt_bias.float())  # (b, t, h)
        if self.dt_limit != (0.0, math.inf):
            dt = dt.clamp(*self.dt_limit)
        A = -torch.exp(self.A_log.float())
        x = x.reshape(b, t, self.n_heads, self.head_dim)
        B = B.reshape(b, t, self.n_groups, self.d_state)
        C = C.reshape(b, t, self.n_groups, self.d_state)

        if state is not None and t == 1:
            y = kernels.ssd_step(state.ssm, x[:, 0], dt[:, 0], A, B[:, 0], C[:, 0])[:, None]
        elif not torch.is_grad_enabled() and not kernels.use_fast(x) and x.numel() > BLOCK_ELEMENTS:
            y = self._prefill_in_group_blocks(x, dt, A, B, C, z, state, h.dtype)
            del z, x, B, C, xbc, zxbcdt  # the projection's output is not needed past the norm
            return self.out_proj(y)
        else:
            y, final = kernels.ssd_scan(x, dt, A, B, C, self.chunk_size,
                                        state.ssm if state is not None else None)
            if state is not None:
                state.ssm.copy_(final)
        y = torch.addcmul(y, x, self.D.float()[:, None])  # the D skip, x widened on the fly; (b, t, h, p)
        y = self.norm(y.reshape(b, t, self.d_inner), z)
        return self.out_proj(y.to(h.dtype))

    def _prefill_in_group_blocks(self, x, dt, A, B, C, z, state, dtype):
        """A long prefill without autograd on the reference scan, a block of whole groups at a time: scan, D
        skip and gated norm (whose groups are the scan's), written into one output in the model's dtype. The
        same numbers as the path above; what changes is memory: the 12B model's 2k-token prefill made ~0.5 GB
        of fp32 copies of all 128 heads at once, one group of 16 heads makes ~70 MB (docs/quant_cpu_kernels.md)."""
        b, t, h, p = x.shape
        r = h // self.n_groups
        step = max(1, BLOCK_ELEMENTS // (b * t * r * p))
        out = torch.empty(b, t, self.d_inner, dtype=dtype, device=x.device)
        for g0 in range(0, self.n_groups, step):
            g1 = min(self.n_groups, g0 + step)
            heads, chans = slice(g0 * r, g1 * r), slice(g0 * r * p, g1 * r * p)
            ssm = state.ssm[:, heads] if state is not None else None
            y, final = kernels.ssd_scan(x[:, :, heads], dt[:, :, heads], A[heads], B[:, :, g0:g1], C[:, :, g0:g1],
                                        self.chunk_size, ssm)
            if ssm is not None:
                ssm.copy_(final)
            y.addcmul_(x[:, :, heads], self.D.float()[heads, None])  # in place; x widened on the fly
            out[..., chans] = gated_rms_norm(y.view(b, t, -1), z[..., chans], self.norm.weight[chans], g1 - g0,
                                             self.norm.eps)
        return out
