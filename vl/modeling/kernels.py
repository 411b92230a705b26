"""Fast-path selection for the Mamba-2 mixer (in the manner of nanochat's `flash_attention.py`).

One API over the implementations: the pure-PyTorch reference (`ssd_ref`, the test oracle, and what runs whenever
an autograd graph is recorded), the C++ chunked scan for CPU prefill (`vl.kernels.ssd_scan`, the CPU default without
autograd), and the mamba-ssm / causal-conv1d CUDA kernels, used only on CUDA tensors when those packages import.
Tests force the reference or the CUDA kernels with `override("ref" | "fast")`.
"""

from __future__ import annotations

import contextlib
import functools
import logging

import torch

from vl.kernels import ssd_scan as ssd_cpp  # the C++ scan (a name apart from `ssd_scan` below)
from vl.modeling import ssd_ref

log = logging.getLogger(__name__)
_override: str | None = None
# The chunked scan is exact for any chunk length; the config's `chunk_size` is the kernels' tiling. On the
# CPU paths shorter chunks are cheaper (the within-chunk work grows with the chunk length, the carried state's does
# not): 32 measured fastest at 2k tokens for the reference (vl bench) and, with 16 about as fast, for the C++ scan
# (docs/benchmarks.md, "SSD scan in C++").
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
    produce: no transposed copies, and 2-4x faster on CPU than `conv1d`'s depthwise kernel. When no autograd
    graph is being recorded, x itself is overwritten with the output (see `_conv_in_place`).
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
    hist = None if conv_state is None else conv_state.transpose(1, 2).to(x.dtype, copy=True)  # at -(k-1) .. -1
    if conv_state is not None:  # the last k-1 inputs, taken before anything is overwritten
        conv_state.copy_(torch.cat([hist, x[:, -(k - 1):]], dim=1)[:, -(k - 1):].transpose(1, 2))
    # (k, c): each tap's weights contiguous, so the products vectorize (4x faster than strided columns)
    taps, bias_x = weight.t().contiguous(), None if bias is None else bias.to(x.dtype)
    if _no_graph(x, weight, bias):
        return _conv_in_place(x, taps, bias_x, hist)
    out = _shifted_conv(x, taps, bias_x)
    if hist is not None:  # the first k-1 outputs again, over the real history instead of zeros
        out[:, :k - 1] = _shifted_conv(torch.cat([hist, x[:, :k - 1]], dim=1), taps, bias_x)[:, k - 1:]
    return torch.nn.functional.silu(out, inplace=True)


def _shifted_conv(x, taps, bias, out=None):
    """out[i] = bias + sum_j taps[j] * x[i - (k-1) + j], zeros before the start; x (b, t, c), taps (k, c) (the
    conv weight transposed), bias (c,) in x's dtype or None. `out`: an optional (b, t, c) buffer to write into."""
    k, t = taps.shape[0], x.shape[1]
    out = torch.mul(x, taps[k - 1], out=out) if bias is None else torch.addcmul(bias, x, taps[k - 1], out=out)
    for s in range(1, min(k, t)):  # shift s: row i reads x[i - s]
        out[:, s:].addcmul_(x[:, :t - s], taps[k - 1 - s])
    return out


def _conv_in_place(x, taps, bias, hist=None, block: int = 128):
    """The same conv + SiLU written over x itself, `block` time steps at a time from the last block back to
    the first: a block's output needs inputs from the k-1 steps before it, which are still unwritten, so
    nothing is copied but the block in hand. No full-size temporary (on a 2k-token prefill a fresh 30 MB
    output costs more in page faults than the conv's arithmetic) and each block's work stays in cache.
    Same products in the same order as `_shifted_conv` (taps and bias as there). hist (b, k-1, c) or None."""
    k, t = taps.shape[0], x.shape[1]
    buf = x.new_empty(x.shape[0], min(block, t) + k - 1, x.shape[2])  # one block's output, reused
    for a in range(((t - 1) // block) * block, -1, -block):
        e = min(a + block, t)
        if a >= k - 1:
            src = x[:, a - (k - 1):e]
        else:  # the first block reads the history (or zeros) before time 0
            before = hist if hist is not None else x.new_zeros(x.shape[0], k - 1, x.shape[2])
            src = torch.cat([before[:, before.shape[1] - (k - 1 - a):], x[:, :e]], dim=1)
        out = _shifted_conv(src, taps, bias, buf[:, :src.shape[1]])[:, k - 1:]
        x[:, a:e] = torch.nn.functional.silu(out, inplace=True)
    return x


def ssd_scan(x, dt, A, B, C, chunk_size, initial_state=None):
    """Chunked scan -> (y, final_state); see `ssd_ref.ssd_chunked` for shapes."""
    if use_fast(x):
        y, final = _fast_ops()["scan"](
            x.contiguous(), dt.contiguous(), A, B.contiguous(), C.contiguous(), chunk_size,
            initial_states=initial_state, return_final_states=True,
        )
        return y.float(), final.float()
    chunk = min(chunk_size, REF_CHUNK)
    if _override != "ref" and _no_graph(x, dt, A, B, C, initial_state) and ssd_cpp.applies(x, B, C):
        lib = ssd_cpp.library()
        if lib is not None:
            return ssd_cpp.ssd_chunked(x, dt, A, B, C, chunk, initial_state, lib)
    return ssd_ref.ssd_chunked(x, dt, A, B, C, chunk, initial_state)


def _no_graph(*tensors) -> bool:
    """No autograd graph is recorded through these tensors (the C++ scan has no backward)."""
    return not torch.is_grad_enabled() or not any(v is not None and v.requires_grad for v in tensors)


def ssd_step(state, x, dt, A, B, C):
    """One recurrence step in place; see `ssd_ref.ssd_step`."""
    return ssd_ref.ssd_step(state, x, dt, A, B, C)
