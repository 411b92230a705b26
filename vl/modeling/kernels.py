"""Fast-path selection for the Mamba-2 mixer (in the manner of nanochat's `flash_attention.py`).

One API, two implementations: the pure-PyTorch reference (`ssd_ref`, the CPU default and the test oracle)
and the mamba-ssm / causal-conv1d CUDA kernels, used only on CUDA tensors when those packages import.
Tests force either with `override("ref" | "fast")`.
"""

from __future__ import annotations

import contextlib
import functools
import logging

import torch

from vl.modeling import ssd_ref

log = logging.getLogger(__name__)
_override: str | None = None
# The chunked scan is exact for any chunk length; the config's `chunk_size` is the kernels' tiling. On the
# reference path shorter chunks are cheaper (the within-chunk work grows with the chunk length, the carried
# state does not): 32 measured fastest on CPU at 2k tokens (vl bench / notes in the README).
REF_CHUNK = 32


@functools.cache
def _fast_ops():
    """mamba-ssm's Triton SSD kernels (required for the fast path) and causal-conv1d's CUDA conv (optional:
    without it the conv stays on PyTorch, which is cheap next to the scan)."""
    try:
        from mamba_ssm.ops.triton.selective_state_update import selective_state_update
        from mamba_ssm.ops.triton.ssd_combined import mamba_chunk_scan_combined
    except Exception as exc:  # noqa: BLE001 - any import failure means "not available"
        log.info("mamba-ssm kernels unavailable (%s); using the PyTorch reference", exc)
        return None
    ops = dict(scan=mamba_chunk_scan_combined, step=selective_state_update, conv=None)
    try:
        from causal_conv1d import causal_conv1d_fn

        ops["conv"] = causal_conv1d_fn
    except Exception:  # noqa: BLE001
        log.info("causal-conv1d unavailable; the Mamba conv runs in PyTorch")
    return ops


def fast_available() -> bool:
    return torch.cuda.is_available() and _fast_ops() is not None


@contextlib.contextmanager
def override(impl: str | None):
    """Force "ref" or "fast" inside the block (tests); None restores automatic choice."""
    global _override
    if impl not in (None, "ref", "fast"):
        raise ValueError(f"override expects 'ref', 'fast' or None, got {impl!r}")
    if impl == "fast" and not fast_available():
        raise RuntimeError("the fast Mamba kernels need CUDA and mamba-ssm (the [gpu] extra)")
    old, _override = _override, impl
    try:
        yield
    finally:
        _override = old


def use_fast(x: torch.Tensor) -> bool:
    if _override is not None:
        return _override == "fast"
    return x.is_cuda and _fast_ops() is not None


def causal_conv(x, weight, bias, conv_state=None):
    """Depthwise causal conv + SiLU over time. x (b, t, c) time-major; weight (c, k); conv_state (b, c, k-1) or
    None. Returns (b, t, c).

    With a state, the state holds the previous k-1 inputs and is updated in place to the last k-1.
    On the reference path the conv is k shifted multiply-adds in the time-major layout the projections
    produce: no transposed copies, and 2-4x faster on CPU than `conv1d`'s depthwise kernel.
    """
    k = weight.shape[-1]
    if conv_state is None and use_fast(x) and _fast_ops()["conv"] is not None:
        return _fast_ops()["conv"](x.transpose(1, 2), weight, bias, activation="silu").transpose(1, 2)
    t = x.shape[1]
    if t == 1 and conv_state is not None:  # decode: a dot product per channel
        window = torch.cat([conv_state.to(x.dtype), x.transpose(1, 2)], dim=-1)  # (b, c, k)
        conv_state.copy_(window[..., 1:])
        out = (window * weight).sum(-1)[:, None]
        return torch.nn.functional.silu(out if bias is None else out + bias)
    out = _shifted_conv(x, weight, bias)
    if conv_state is not None:  # the first k-1 outputs again, over the real history instead of zeros
        hist = conv_state.transpose(1, 2).to(x.dtype)  # (b, k-1, c): the inputs at times -(k-1) .. -1
        head = torch.cat([hist, x[:, :k - 1]], dim=1)
        out[:, :k - 1] = _shifted_conv(head, weight, bias)[:, k - 1:]
        conv_state.copy_(torch.cat([hist, x[:, -(k - 1):]], dim=1)[:, -(k - 1):].transpose(1, 2))
    return torch.nn.functional.silu(out, inplace=True)


def _shifted_conv(x, weight, bias):
    """out[i] = bias + sum_j weight[:, j] * x[i - (k-1) + j], zeros before the start; x (b, t, c)."""
    k, t = weight.shape[-1], x.shape[1]
    out = x * weight[:, k - 1] if bias is None else torch.addcmul(bias.to(x.dtype), x, weight[:, k - 1])
    for s in range(1, min(k, t)):  # shift s: row i reads x[i - s]
        out[:, s:].addcmul_(x[:, :t - s], weight[:, k - 1 - s])
    return out


def ssd_scan(x, dt, A, B, C, chunk_size, initial_state=None):
    """Chunked scan -> (y, final_state); see `ssd_ref.ssd_chunked` for shapes."""
    if use_fast(x):
        y, final = _fast_ops()["scan"](
            x.contiguous(), dt.contiguous(), A, B.contiguous(), C.contiguous(), chunk_size,
            initial_states=initial_state, return_final_states=True,
        )
        return y.float(), final.float()
    return ssd_ref.ssd_chunked(x, dt, A, B, C, min(chunk_size, REF_CHUNK), initial_state)


def ssd_step(state, x, dt, A, B, C):
    """One recurrence step in place; see `ssd_ref.ssd_step`."""
    return ssd_ref.ssd_step(state, x, dt, A, B, C)
