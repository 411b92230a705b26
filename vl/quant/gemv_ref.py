"""The pure-torch twins of the FP8 / NVFP4 GEMV kernels of vl/kernels/gemv.py (csrc/quant_gemv.cpp): dequantize
to float32 (rounded to bf16 as the bf16 reference's weight is), then one float32 product. The tests' oracle
(tests/kernels/test_cpu_gemv.py); what the kernel computes up to the order of the float32 additions."""

from __future__ import annotations

import torch

from vl.quant.fp8 import dequantize_fp8
from vl.quant.nvfp4 import dequantize_nvfp4


def fp8_gemv_ref(x: torch.Tensor, w8: torch.Tensor, scale: torch.Tensor, round_bf16: bool) -> torch.Tensor:
    w = dequantize_fp8(w8, scale, torch.float32)
    if round_bf16:
        w = w.to(torch.bfloat16).float()
    return x.float() @ w.t()


def nvfp4_gemv_ref(x: torch.Tensor, packed: torch.Tensor, block_scale: torch.Tensor, global_scale: torch.Tensor,
                   round_bf16: bool) -> torch.Tensor:
    w = dequantize_nvfp4(packed, block_scale, global_scale, torch.float32)
    if round_bf16:
        w = w.to(torch.bfloat16).float()
    return x.float() @ w.t()
