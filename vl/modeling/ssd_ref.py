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

    The difference is formed in float64 so that long chunks with large |cumsum| lose no precision
    (the exponent of nearby positions is a small difference of two large numbers).
    """
    acs64 = acs.double()
    diff = (acs64[..., :, None] - acs64[..., None, :]).float()  # (..., l, l)
    l = acs.shape[-1]
    causal = torch.ones(l, l, dtype=torch.bool, device=acs.device).tril()
    return torch.exp(diff.masked_fill(~causal, -torch.inf))


def ssd_chunked(x, dt, A, B, C, chunk_size: int, initial_state=None):
    """Chunked SSD scan.

    x (b, t, h, p), dt (b, t, h) already softplus-ed and clamped, A (h,) negative, B and C (b, t, g, n),
    initial_state (b, h, p, n) or None. Returns y (b, t, h, p) without the D skip, and the final state.
    """
    b, t, h, p = x.shape
    g, n = B.shape[2], B.shape[3]
    r = h // g
    pad = (-t) % chunk_size
    x, dt, B, C = (v.float() for v in (x, dt, B, C))
    if pad:  # zero dt on padded steps: no decay, no input, so the final state is unaffected
        x = torch.nn.functional.pad(x, (0, 0, 0, 0, 0, pad))
        dt = torch.nn.functional.pad(dt, (0, 0, 0, pad))
        B = torch.nn.functional.pad(B, (0, 0, 0, 0, 0, pad))
        C = torch.nn.functional.pad(C, (0, 0, 0, 0, 0, pad))
    c, l = (t + pad) // chunk_size, chunk_size

    xdt = (x * dt[..., None]).view(b, c, l, g, r, p)
    a = (dt * A.float()).view(b, c, l, g, r).permute(0, 1, 3, 4, 2)  # (b, c, g, r, l)
    acs = torch.cumsum(a, dim=-1)  # (b, c, g, r, l)
    Bc = B.view(b, c, l, g, n).permute(0, 1, 3, 2, 4)  # (b, c, g, l, n)
    Cc = C.view(b, c, l, g, n).permute(0, 1, 3, 2, 4)  # (b, c, g, l, n)
    xg = xdt.permute(0, 1, 3, 4, 2, 5)  # (b, c, g, r, l, p)

    # 1. within-chunk outputs: a masked, decayed "attention" C·Bᵀ over positions of the chunk
    scores = Cc @ Bc.transpose(-1, -2)  # (b, c, g, l, s)
    y = (scores[:, :, :, None] * _decay_matrix(acs)) @ xg  # (b, c, g, r, l, p)

    # 2. each chunk's contribution to the state at its end
    decay_to_end = torch.exp(acs[..., -1:] - acs)  # (b, c, g, r, l)
    xd = (xg * decay_to_end[..., None]).transpose(-1, -2).reshape(b, c, g, r * p, l)
    chunk_states = (xd @ Bc).view(b, c, g, r, p, n)  # (b, c, g, r, p, n)

    # 3 + 4. carry the state across chunks (a short sequential recurrence over c); the state carried into
    # chunk k reaches each of its positions decayed by exp(acs) and read out through C
    chunk_decay = torch.exp(acs[..., -1])  # (b, c, g, r)
    decay_in = torch.exp(acs)  # (b, c, g, r, l)
    state = initial_state.float().view(b, g, r, p, n) if initial_state is not None else None
    for k in range(c):
        if state is None:  # nothing carried into the first chunk
            state = chunk_states[:, k].clone()
            continue
        y[:, k] += (Cc[:, k, :, None] @ state.transpose(-1, -2)) * decay_in[:, k, ..., None]
        state = state * chunk_decay[:, k, ..., None, None] + chunk_states[:, k]

    y = y.permute(0, 1, 4, 2, 3, 5).reshape(b, c * l, h, p)[:, :t]
    return y, state.reshape(b, h, p, n)


def ssd_step(state, x, dt, A, B, C):
    """One recurrence step, updating `state` in place.

    state (b, h, p, n) fp32, x (b, h, p), dt (b, h), A (h,), B and C (b, g, n). Returns y (b, h, p) fp32
    (without the D skip): S <- exp(dt·A)·S + dt·x⊗B ; y = S·C. Heads are viewed as (groups, heads per group)
    so B and C broadcast without being copied to every head.
    """
    b, h, p = x.shape
    g, n = B.shape[1], B.shape[2]
    dt = dt.float()
    s = state.view(b, g, h // g, p, n)
    s.mul_(torch.exp(dt * A.float()).view(b, g, h // g, 1, 1))
    s.add_((x.float() * dt[..., None]).view(b, g, h // g, p, 1) * B.float().view(b, g, 1, 1, n))
    return (s @ C.float().view(b, g, 1, n, 1)).view(b, h, p)


def ssd_sequential(x, dt, A, B, C, initial_state=None):
    """The plain recurrence, one step at a time: the oracle that `ssd_chunked` is tested against."""
    b, t, h, p = x.shape
    n = B.shape[-1]
    state = (initial_state.float().clone() if initial_state is not None
             else x.new_zeros(b, h, p, n, dtype=torch.float32))
    ys = [ssd_step(state, x[:, i], dt[:, i], A, B[:, i], C[:, i]) for i in range(t)]
    return torch.stack(ys, dim=1), state
