"""Attention in bf16 on AMX tiles (`csrc/attention.cpp`): the vision towers' self-attention, whose twin is torch's
`scaled_dot_product_attention` on the same tensors.

torch's CPU flash attention ran a ViT-H block's attention (1032 tokens, 16 heads of 80 channels) at ~0.3 TFLOP/s,
bounded by its softmax passes rather than its products: a quarter of the tower's time (docs/benchmarks.md, "The
vision tower on the CPU"). The C++ kernel computes each block of 16 queries' whole row of scores on tiles, the
softmax in float32 over the row, and P V on tiles (docs/attention_cpu.md). Numbers: torch's within bf16 rounding
of the probabilities and outputs (tests/kernels/test_attention_cpu.py).

`relative_attention(qu, qv, k, v, r)` is the same kernel with Transformer-XL's relative-position term, as Omni's
audio encoder (Parakeet) computes it: the term's product is one more tile product per block of queries, added to
the scores in place, where the module's torch path materialises it per block of 1024 queries (docs/audio.md).

`attention(q, k, v)` runs it where it applies (CPU bf16 tensors, no autograd being recorded, a CPU with AMX-BF16
and the tile state granted) and returns None elsewhere, for the caller to run torch's. `VL_ATTENTION_KERNEL` = auto
(default) | off; portable builds no tile path, so it means torch's too.
"""

from __future__ import annotations

import ctypes
import functools
import logging

import torch

from vl.kernels import loader

log = logging.getLogger(__name__)

SOURCE = loader.CSRC / "attention.cpp"
_i, _l, _p, _f = ctypes.c_int, ctypes.c_long, ctypes.c_void_p, ctypes.c_float
FUNCTIONS = {"vl_attention_tiles": ([], _i),
             "vl_attention": ([_i] * 4 + [_p, _l, _l, _l] * 3 + [_f, _p, _i], _i),
             "vl_rel_attention": ([_i] * 4 + [_p, _l, _l, _l] * 4 + [_p, _l, _l, _p, _f, _p, _i], _i)}


@functools.cache
def _load(mode: str) -> tuple[loader.Library | None, str]:
    lib, why = loader.load(SOURCE, mode, "VL_ATTENTION_KERNEL", "the C++ attention",
                           functools.partial(loader.Library, functions=FUNCTIONS))
    if lib is not None and not lib.lib.vl_attention_tiles():
        return None, "no AMX-BF16 tiles here (CPU or kernel permission)"
    return lib, why


def library() -> loader.Library | None:
    lib, why = _load(loader.mode("VL_ATTENTION_KERNEL"))
    if lib is None:
        _say_once(why)
    return lib


@functools.cache
def _say_once(why: str) -> None:
    log.info("vl.kernels: the vision towers' attention runs torch's scaled_dot_product_attention (%s)", why)


def status() -> str:
    """One line for logs and benches: which attention the CPU towers use here."""
    lib, why = _load(loader.mode("VL_ATTENTION_KERNEL"))
    return f"C++ AMX attention ({lib.path.name})" if lib is not None else f"torch's sdpa ({why})"


def applies(*xs: torch.Tensor) -> bool:
    """CPU bf16 tensors with contiguous channels and no autograd graph being recorded."""
    return (all(x.device.type == "cpu" and x.dtype == torch.bfloat16 and x.ndim == 4 and x.stride(3) == 1
                for x in xs)
            and not (torch.is_grad_enabled() and any(x.requires_grad for x in xs))
            and not torch.compiler.is_compiling())


def _run(name: str, tensors, extra: tuple, scale: float | None) -> torch.Tensor | None:
    """Call the library's `name` on (B, L, H, D) `tensors` (pointer and batch / position / head strides each), then
    `extra`, the scale (default 1/sqrt(D)), the output and the thread count -> the output, or None."""
    lib = library()
    if lib is None:
        return None
    b, length, h, d = tensors[0].shape
    out = torch.empty(b, length, h, d, dtype=torch.bfloat16)
    args = [b, length, h, d]
    for x in tensors:
        args += [x.data_ptr(), x.stride(0), x.stride(1), x.stride(2)]
    scale = d**-0.5 if scale is None else float(scale)
    rc = getattr(lib.lib, name)(*args, *extra, scale, out.data_ptr(), torch.get_num_threads())
    return out if rc == 0 else None


def attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float | None = None) -> torch.Tensor | None:
    """softmax(scale q k^T) v per batch row and head, unmasked: q, k, v (B, L, H, D) bf16 views (channels
    contiguous, any other strides) -> (B, L, H, D) contiguous bf16; None where the kernel does not apply here."""
    if not applies(q, k, v) or q.shape != k.shape or k.shape != v.shape or q.shape[3] % 2 or 0 in q.shape:
        return None
    return _run("vl_attention", (q, k, v), (), scale)


def relative_attention(qu: torch.Tensor, qv: torch.Tensor, k: torch.Tensor, v: torch.Tensor, r: torch.Tensor,
                       scale: float | None = None, keys: list[int] | None = None) -> torch.Tensor | None:
    """softmax(scale (qu k^T + qv r_shift^T)) v per batch row and head, with query i and key j taking row
    (L - 1) - (i - j) of `r`: qu, qv, k, v (B, L, H, D) and r (2L - 1, H, D) bf16 views (channels contiguous) ->
    (B, L, H, D) contiguous bf16; None where the kernel does not apply here. `keys`: per batch row, the keys
    [0, keys[b]) every query of the row attends to (1 .. L; None: all), the rest of the row masked out."""
    shape = qu.shape
    if (not applies(qu, qv, k, v, r[None]) or qv.shape != shape or k.shape != shape or v.shape != shape
            or shape[3] % 2 or 0 in shape or r.shape != (2 * shape[1] - 1, shape[2], shape[3])
            or (keys is not None and (len(keys) != shape[0] or not all(1 <= n <= shape[1] for n in keys)))):
        return None
    counts = None if keys is None else (ctypes.c_int * shape[0])(*(int(n) for n in keys))
    return _run("vl_rel_attention", (qu, qv, k, v), (r.data_ptr(), r.stride(0), r.stride(1), counts), scale)
