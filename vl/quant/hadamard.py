"""Random Hadamard transform (RHT) on 16-element blocks, as an NVFP4 quantization-error experiment.

TransformerEngine's NVFP4 recipe (`NVFP4BlockScaling`; arXiv 2509.25149) rotates 16x16 blocks with a
random-sign Hadamard matrix before quantizing, to spread outliers across a block. A rotation R applied
to the input blocks of W and of x leaves the product unchanged:  (W R^T)(R x) = W x.

This is *not* part of the released checkpoint format (the NVFP4-QAD inference format is the plain 1-D
layout, docs/format.md §11.5), so export never applies it; `nvfp4_weight_error` lets one measure whether it would
help on given weights (see tests/quant/test_hadamard.py for the figures on Gaussian and Student-t weights).
"""

from __future__ import annotations

import torch

from vl.quant.nvfp4 import BLOCK, dequantize_nvfp4, quantize_nvfp4


def hadamard_matrix(n: int = BLOCK) -> torch.Tensor:
    """Orthonormal Sylvester Hadamard matrix (n, n), n a power of two."""
    if n < 1 or n & (n - 1):
        raise ValueError(f"hadamard_matrix: expected a power of two, found {n}")
    h = torch.ones(1, 1)
    while h.shape[0] < n:
        h = torch.cat([torch.cat([h, h], 1), torch.cat([h, -h], 1)], 0)
    return h / n**0.5


def random_hadamard(n: int = BLOCK, seed: int = 0) -> torch.Tensor:
    """H @ diag(random signs): orthonormal, deterministic for a seed."""
    g = torch.Generator().manual_seed(seed)
    signs = torch.randint(0, 2, (n,), generator=g).float() * 2 - 1
    return hadamard_matrix(n) * signs  # scales columns


def rotate_blocks(x: torch.Tensor, r: torch.Tensor) -> torch.Tensor:
    """x (..., K), K % n == 0 -> each n-block b of the last dim becomes r @ b."""
    n = r.shape[0]
    if x.shape[-1] % n:
        raise ValueError(f"rotate_blocks: last dim {x.shape[-1]} is not divisible by {n}")
    xb = x.float().reshape(*x.shape[:-1], x.shape[-1] // n, n)
    return (xb @ r.T).reshape(x.shape)


def nvfp4_weight_error(w: torch.Tensor, rht: bool = False, block_2d: bool = False, seed: int = 0) -> float:
    """Relative Frobenius error ||W - deq(q(W))|| / ||W|| of NVFP4, optionally with RHT on input blocks
    (rotated, quantized, dequantized, rotated back) and/or 16x16 2-D block scales."""
    w = w.float()
    r = random_hadamard(BLOCK, seed)
    src = rotate_blocks(w, r) if rht else w
    deq = dequantize_nvfp4(*quantize_nvfp4(src, block_2d=block_2d))
    if rht:
        deq = rotate_blocks(deq, r.T)  # r orthonormal: inverse = transpose
    return float((deq - w).norm() / w.norm())
