"""16-bit matmuls on CPUs without native 16-bit GEMM: compute them in fp32 (a pass applied from outside).

A bf16 GEMM on a CPU without AVX512-BF16 or AMX (most laptops; an x86-64 AVX-512 build machine without
AVX512-BF16, where it was measured) runs through oneDNN's emulation at ~1/6 of the fp32 GEMM's speed: 1365 ms
against 220 ms for a 2048x1024 @ 1024x3072 product at 1 thread. So every `nn.Linear` with 16-bit weights that
sees enough rows (a prefill chunk, a batch of image tiles) upcasts its operands to fp32, multiplies, and rounds the
result back: the same arithmetic as a native bf16 GEMM (16-bit inputs, fp32 accumulation, one rounding of the
output), at fp32 speed. Weights stay 16-bit in memory; the fp32 copy of a weight is made per call, in blocks of
output rows so the temporary stays under ~32 MiB. Few rows (decode, which is bandwidth-bound and where 16-bit
weights are the faster read) keep the plain 16-bit product.
"""

from __future__ import annotations

import functools
import logging
import types

import torch
from torch import nn

from vl.kernels import gemm, switches
from vl.kernels.gemm import native_16bit
from vl.modeling.mlp import MLP
from vl.modeling.nemotron_h import NemotronHForCausalLM
from vl.kernels import gemv

log = logging.getLogger(__name__)

MIN_ROWS = 8  # below this many rows the per-call weight upcast costs more than the 16-bit GEMM it replaces
BLOCK_ELEMS = 8 * 1024 * 1024  # fp32 weight elements upcast at a time (32 MiB)


def linear_fp32(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    """F.linear of 16-bit operands computed in fp32, rounded once to x's dtype."""
    xf = x.float()
    step = max(1, BLOCK_ELEMS // weight.shape[1])
    parts = []
    for s in range(0, weight.shape[0], step):
        b = bias[s:s + step].float() if bias is not None else None
        parts.append(gemm.linear(xf, weight[s:s + step].float(), b).to(x.dtype))
    return parts[0] if len(parts) == 1 else torch.cat(parts, dim=-1)


def _forward(self: nn.Linear, x: torch.Tensor) -> torch.Tensor:
    if x.device.type == "cpu" and x.dtype == self.weight.dtype and x.numel() >= MIN_ROWS * x.shape[-1]:
        return linear_fp32(x, self.weight, self.bias)
    return nn.functional.linear(x, self.weight, self.bias)


def _cpu_linears(model: nn.Module):
    """The model's plain `nn.Linear`s (subclasses such as the quantized ones excluded) with weights on the CPU:
    what the passes below route."""
    for module in model.modules():
        if type(module) is nn.Linear and module.weight is not None and module.weight.device.type == "cpu":
            yield module


def upcast_16bit_matmuls(model: nn.Module) -> int:
    """Route the model's 16-bit CPU `nn.Linear`s through `linear_fp32` where this CPU lacks native 16-bit
    GEMM. Returns how many layers were routed (0 on fp32 models, GPUs, and CPUs with AVX512-BF16/AMX)."""
    n = 0
    for module in _cpu_linears(model):
        if module.weight.dtype in (torch.bfloat16, torch.float16) and not native_16bit(module.weight.dtype):
            module.forward = types.MethodType(_forward, module)
            n += 1
    return n


def _gemm_forward(self: nn.Linear, x: torch.Tensor) -> torch.Tensor:
    return gemm.linear(x, self.weight, self.bias)


def onednn_fp32_matmuls(model: nn.Module) -> int:
    """Route the model's fp32 CPU `nn.Linear`s through `vl.kernels.gemm.linear` where that picks oneDNN (x86 CPUs not
    made by Intel, on which torch's MKL runs fp32 GEMMs at half oneDNN's speed); decode-sized products still take
    the GEMV pass applied after this one. Returns how many layers were routed (0 where `gemm.use_onednn()` is
    False)."""
    if not gemm.use_onednn():
        return 0
    n = 0
    for module in _cpu_linears(model):
        if module.weight.dtype == torch.float32 and "forward" not in vars(module):
            module.forward = types.MethodType(_gemm_forward, module)
            n += 1
    return n


def bucket_llm_matmuls(model: nn.Module) -> int:
    """Route the 16-bit CPU `nn.Linear`s of the model's Nemotron-H LLM through `vl.kernels.gemm.linear` where this
    CPU multiplies 16-bit matrices natively (oneDNN), so that a prefill chunk runs on a rounded row count
    (`gemm.rounded_rows`): oneDNN keeps one GEMM primitive per row count, and a server's prompts of every length
    each left their last chunk's primitives behind (~5 MiB per new length at the 180m config's four shapes, up
    to its 1024-entry cache). The towers' Linears keep their own forward (their row counts repeat). Returns how
    many layers were routed."""
    n = 0
    for lm in [m for m in model.modules() if isinstance(m, NemotronHForCausalLM)]:
        for module in _cpu_linears(lm):
            dtype = module.weight.dtype
            if dtype in (torch.bfloat16, torch.float16) and native_16bit(dtype) and "forward" not in vars(module):
                module.forward = types.MethodType(_gemm_forward, module)
                n += 1
    return n


@functools.cache
def gemv_rows(dtype: torch.dtype) -> int:
    """Activation rows up to which a dense product takes the GEMV kernel. The kernel streams the weights once per
    `gemv.KERNEL_ROWS` rows; on CPUs with AMX, torch's bf16 GEMM (oneDNN's tile products) reads them once for
    all rows and is faster from 5 rows on (1.3-1.6x at 6-8 rows, 2.6-3.1x at 16: docs/quant_cpu_kernels.md,
    "Dense bf16 / fp32"), so bf16 products of more rows (a short prefill chunk) go to it there."""
    if dtype == torch.bfloat16 and torch.cpu._is_amx_tile_supported():
        return gemv.KERNEL_ROWS
    return gemv.MAX_ROWS


def _gemv_forward(self: nn.Linear, x: torch.Tensor) -> torch.Tensor:
    w = self.weight
    rows = x.numel() // w.shape[1] if w.shape[1] else 0
    grad = torch.is_grad_enabled() and (x.requires_grad or w.requires_grad)
    by_rows = transposed(w)
    if (0 < rows <= gemv_rows(w.dtype) and x.device.type == "cpu" and w.device.type == "cpu" and x.dtype == w.dtype
            and not torch.compiler.is_compiling() and not grad and (by_rows or w.is_contiguous())):
        kern = gemv.kernel()
        if kern is not None and (kern.dense_bf16 if w.dtype == torch.bfloat16 else kern.dense_fp32):
            x2 = x.reshape(rows, w.shape[1])
            y = kern.dense_t(x2.float().contiguous(), w.t()) if by_rows else kern.dense(x2.contiguous(), w)
            if self.bias is not None:
                y = y + self.bias.float()
            return y.to(x.dtype).reshape(*x.shape[:-1], w.shape[0])
    return self._vl_dense_forward(x)


def gemv_decode_linears(model: nn.Module) -> int:
    """Route few-row products (decode) of the model's bf16 / fp32 CPU `nn.Linear`s through the fused GEMV of
    `vl/kernels/gemv.py`, which reads the weights at memory speed (torch 2.14's CPU GEMV reads bf16 weights
    at ~5 GB/s on an AVX512 core). Same float32 accumulation, one rounding of the output, sums in another
    order. Many rows, autograd, compile tracing and CPUs without the kernel keep the layer's own forward.
    Returns how many layers were routed (0 where the kernel is unavailable)."""
    kern = gemv.kernel()
    if kern is None or not (kern.dense_bf16 or kern.dense_fp32):
        return 0
    n = 0
    for module in _cpu_linears(model):
        w = module.weight
        if ((w.dtype == torch.bfloat16 and kern.dense_bf16 or w.dtype == torch.float32 and kern.dense_fp32)
                and not hasattr(module, "_vl_dense_forward")):
            module._vl_dense_forward = module.forward  # the plain (or 16-bit-upcast) forward, for the other cases
            module.forward = types.MethodType(_gemv_forward, module)
            n += 1
    return n


def transposed(w: torch.Tensor) -> bool:
    """A 2-D weight laid out (K, N) in memory: the transpose of a contiguous tensor, as
    `transpose_relu2_down_proj` leaves a down_proj (the module still sees its (N, K) weight)."""
    return w.dim() == 2 and w.shape[0] > 1 and w.shape[1] > 1 and not w.is_contiguous() and w.t().is_contiguous()


def sparse_down_off() -> str | None:
    """Why `transpose_relu2_down_proj` leaves the weights as stored on this machine (None: it lays them out)."""
    if not switches.on("VL_SPARSE_DOWN"):
        return "VL_SPARSE_DOWN=off"
    kern = gemv.kernel()
    if kern is None or kern.isa != "avx512":
        return f"no AVX512 build of the CPU kernel ({gemv.status()})"
    return None


def sparse_down_status() -> str:
    """One line for `vl bench`'s header: how the ReLU^2 down_proj weights of CPU models are laid out."""
    why = sparse_down_off()
    return "as stored (" + why + ")" if why else "stored by input rows, zero inputs skipped in decode"


def transpose_relu2_down_proj(model: nn.Module) -> int:
    """Lay out the weights of the ReLU^2 MLPs' down_proj column by column ((K, N) in memory; the module still holds
    an (N, K) weight, now a transposed view, and every product with it gives the same numbers up to float32
    summation order). The input of that product is relu(up(x))^2: zero wherever up(x) <= 0, about half the
    entries for random weights and more in trained models. Stored by rows of the input dimension, a decode
    step skips the rows whose input is zero and reads that much less of the layer (vl_dense_t_gemv in
    vl/kernels/csrc/row_kernels.h; the fused step and the modules' GEMV path both use it); prefill's GEMMs
    take the transposed operand at the same speed. Plain bf16 / fp32 CPU Linears only (packed FP8 / NVFP4
    weights stay as stored), where the AVX512 kernel builds, not under accelerate hooks; `VL_SPARSE_DOWN=off`
    turns it off. Returns how many layers were laid out; a second call finds them done."""
    if sparse_down_off() is not None:
        return 0
    n = 0
    with torch.no_grad():
        for module in model.modules():
            if not (isinstance(module, MLP) and module.hidden_act == "relu2"):
                continue
            lin = module.down_proj
            w = lin.weight
            if (type(lin) is nn.Linear and w.device.type == "cpu" and w.dtype in (torch.bfloat16, torch.float32)
                    and w.is_contiguous() and min(w.shape) > 1 and not hasattr(lin, "_hf_hook")):
                lin.weight.data = w.t().contiguous().t()
                n += 1
    if n:
        log.info("vl: %d ReLU^2 down_proj weights stored by input row: decode skips the rows of zero inputs", n)
    return n
