"""Mamba-2 state-space duality (SSD) in pure PyTorch: the reference twin of the mamba-ssm kernels.

Follows the chunked algorithm of Dao & Gu, "Transformers are SSMs" (arXiv 2405.21060, §6, listing
"ssd_minimal"), written group-aware: B and C are shared by the `h/g` heads of a group, so the C·Bᵀ scores
are computed once per group instead of once per head, and nothing is `repeat_interleave`d to heads.

Shapes: b batch, t time, h heads = g groups × r heads per group, p head dim, n state size.
All arithmetic is fp32; the state is fp32.
"""

from __future__ import annotations

import torch


def _decay_matrix(acs: torch.Tensor) -> torch.Tensor:
    """exp(acs[i] - acs[j]) for i >= j, else 0. acs: (..., l) within-chunk cumulative sums of dt·A.

    Without autograd the difference is formed in fp32 from the chunk's own cumulative sums, as the mamba-ssm
    kernels and transformers' PyTorch path do. When gradients flow it is formed in float64: the gradient of
    the exponent of nearby positions (a small difference of two large sums) needs the headroom; in fp32 some
    of dt's gradients drift by 5% with real-model dt·A (tests/modeling/test_mamba_kernels.py).
    Exponents are clamped at -80: below it exp gives < 2e-35, an absolute change no fp32 output can show,
    while a denormal or underflowing exp costs 5-13x a normal one on CPU (with real dt and A most of a
    chunk's pairs decay that far).
    """
    wide = acs.double() if acs.requires_grad else acs
    diff = (wide[..., :, None] - wide[..., None, :]).float()  # (..., l, l)
    l = acs.shape[-1]
    upper = torch.ones(l, l, dtype=torch.bool, device=acs.device).triu(1)
    return diff.clamp_(min=-80.0).masked_fill_(upper, -torch.inf).exp_()


def ssd_chunked(x, dt, A, B, C, chunk_size: int, initial_state=None):
    """Chunked SSD scan.

    x (b, t, h, p), dt (b, t, h) already softplus-ed and clamped, A (h,) negative, B and C (b, t, g, n),
    initial_state (b, h, p, n) or None. Returns y (b, t, h, p) without the D skip, and the final state.
    """
    b, t, h, p = x.shape
    g, n = B.shape[2], B.shape[3]
    r = h // g
    pad = (-t) % chunk_size
    dt = dt.float()  # x, B and C stay in their dtype until their first fp32 use (bf16 x fp32 promotes exactly)
    if pad:  # zero dt on padded steps: no decay, no input, so the final state is unaffected
        x = torch.nn.functional.pad(x, (0, 0, 0, 0, 0, pad))
        dt = torch.nn.functional.pad(dt, (0, 0, 0, pad))
        B = torch.nn.functional.pad(B, (0, 0, 0, 0, 0, pad))
        C = torch.nn.functional.pad(C, (0, 0, 0, 0, 0, pad))
    c, l = (t + pad) // chunk_size, chunk_size

    a = (dt * A.float()).view(b, c, l, g, r).permute(0, 1, 3, 4, 2)  # (b, c, g, r, l)
    acs = torch.cumsum(a, dim=-1)  # (b, c, g, r, l)
    f32 = dict(dtype=torch.float32, memory_format=torch.contiguous_format)  # widen and lay out in one pass
    Bc = B.view(b, c, l, g, n).transpose(2, 3).to(**f32)  # (b, c, g, l, n)
    Cc = C.view(b, c, l, g, n).transpose(2, 3).to(**f32)  # (b, c, g, l, n)
    # x·dt in the two layouts the products want: per group (l, r·p) blocks for the state products, per head
    # (l, p) blocks for the within-chunk product
    xdt = (x * dt[..., None]).view(b, c, l, g, r, p).transpose(2, 3).contiguous()  # (b, c, g, l, r, p)
    xg = xdt.transpose(3, 4).contiguous()  # (b, c, g, r, l, p)

    # 1. within-chunk outputs, all chunks at once: a masked, decayed "attention" C·Bᵀ over the chunk
    scores = Cc @ Bc.transpose(-1, -2)  # (b, c, g, l, s)
    y = (_decay_matrix(acs) * scores[:, :, :, None]) @ xg  # (b, c, g, r, l, p)

    # 2-4. chunk by chunk (a short sequential loop over c; each step's tensors are cache-sized). The state is
    # kept transposed, Sᵀ (n, r·p) per group, so both of its products are plain per-group matmuls (B and C
    # are shared by the r heads of a group and never copied to them): read the carried state out at the
    # chunk's positions through C (decayed by exp(acs)), then carry it to the chunk's end: decay it and add
    # Bᵀ @ (x·dt·exp(acs_end - acs)).
    decay_to_end = torch.exp(acs[..., -1:] - acs).transpose(-1, -2)[..., None]  # (b, c, g, l, r, 1)
    decay_in = torch.exp(acs).transpose(-1, -2)[..., None]  # (b, c, g, l, r, 1)
    chunk_decay = torch.exp(acs[..., -1]).view(b, c, g, 1, r, 1)
    state = None  # Sᵀ (b, g, n, r, p)
    if initial_state is not None:
        state = initial_state.float().view(b, g, r, p, n).permute(0, 1, 4, 2, 3).contiguous()
    for k in range(c):
        if state is not None:
            y_in = (Cc[:, k] @ state.view(b, g, n, r * p)).view(b, g, l, r, p).mul_(decay_in[:, k])
            y[:, k].add_(y_in.transpose(2, 3))
        contrib = (Bc[:, k].transpose(-1, -2) @ (xdt[:, k] * decay_to_end[:, k]).view(b, g, l, r * p))
        contrib = contrib.view(b, g, n, r, p)
        state = contrib if state is None else contrib.add_(state * chunk_decay[:, k])
    state = state.permute(0, 1, 3, 4, 2)  # (b, g, r, p, n)

    y = y.permute(0, 1, 4, 2, 3, 5).reshape(b, c * l, h, p)[:, :t]
    return y, state.reshape(b, h, p, n)


def ssd_step(state, x, dt, A, B, C):
    """One recurrence step, updating `state` in place.

    state (b, h, p, n) fp32 (or the config's `mamba_ssm_cache_dtype`), x (b, h, p), dt (b, h), A (h,), B and C
    (b, g, n). Returns y (b, h, p) fp32 (without the D skip): S <- exp(dt·A)·S + dt·x⊗B ; y = S·C. Heads are viewed
    as (groups, heads per group) so B and C broadcast without being copied to every head.
    """
    b, h, p = x.shape
    g, n = B.shape[1], B.shape[2]
    dt = dt.float()
    s = state.view(b, g, h // g, p, n)
    s.mul_(torch.exp(dt * A.float()).view(b, g, h // g, 1, 1))
    s.add_((x.float() * dt[..., None]).view(b, g, h // g, p, 1) * B.float().view(b, g, 1, 1, n))
    return (s.float() @ C.float().view(b, g, 1, n, 1)).view(b, h, p)  # a bf16 / fp16 state read out in fp32


def ssd_sequential(x, dt, A, B, C, initial_state=None):
    """The plain recurrence, one step at a time: the oracle that `ssd_chunked` is tested against."""
    b, t, h, p = x.shape
    n = B.shape[-1]
    state = (initial_state.float().clone() if initial_state is not None
             else x.new_zeros(b, h, p, n, dtype=torch.float32))
    ys = [ssd_step(state, x[:, i], dt[:, i], A, B[:, i], C[:, i]) for i in range(t)]
    return torch.stack(ys, dim=1), state
