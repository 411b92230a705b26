"""fp32 matrix products with many rows on the CPU: oneDNN where torch's default BLAS (MKL) runs a slow path.

torch's x86 wheels multiply fp32 matrices with MKL, and MKL picks its AVX-512 kernels only on Intel CPUs: on
this project's AMD EPYC runner (Zen 5, AVX-512, 1 thread, torch 2.14) `F.linear` reached 84-93 GFLOP/s on
prefill shapes (2048 x 1024 @ 1024 x 3072 and the like), where oneDNN, the library torch already ships for its
16-bit GEMMs, reached 156-219 GFLOP/s on the same products (docs/benchmarks.md, "fp32 GEMM").

Batch invariance: a row's result must not depend on the other rows of the call (tiles encoded together equal
tiles encoded alone; batched prefill equals single runs). oneDNN's fp32 GEMM gives a row the same bits for every
row count from 2 up (measured over 2-300 rows on five layer shapes, tests/kernels/test_cpu_gemm.py), but a one-row call
takes a GEMV path with other sums, as does switching library at some row count. So every fp32 product goes
through oneDNN once it is chosen, and a one-row product is computed as two copies of the row.

`linear(x, w, b)` is `F.linear` through oneDNN (`torch.ops.mkldnn._linear_pointwise`, the op torch's own
compiler emits for CPU linears) when all of these hold, else plain `F.linear`:
- the CPU is an x86 one whose vendor is not Intel and torch uses MKL (`auto`), or `VL_CPU_GEMM=onednn`;
  `VL_CPU_GEMM=blas` turns it off;
- fp32 operands on the CPU, nothing recording gradients (the op has no backward), not while compiling.
Same float32 products; sums in oneDNN's order instead of MKL's (fp32 accumulation-order differences).

Row counts: oneDNN builds one GEMM primitive per operand shape and keeps up to 1024 of them (~0.65 MiB each at
the Omni MoE's expert shapes on an AMX CPU, more at a prefill chunk's). A MoE prefill multiplies every expert by as
many rows as tokens chose it, a different count almost every time, and a server's prompts end their prefill on
chunks of every length, so the cache filled with one primitive per count (~0.6 GiB after a long Omni prefill,
docs/checkpoints.md "A request's own memory"). Products of more than ROW_MULTIPLE rows therefore run on
`rounded_rows(rows)` rows, zero rows appended and their outputs dropped: a multiple of 16 (on AMX, 16-row tiles:
almost no extra arithmetic), and above 512 rows a multiple of 1/ROW_BUCKETS of the power of two below (under 1/32
extra rows), so a shape has 95 counts between 17 and 2048 rows. A row's bits are those of the padded call: for
fp32 the same as unpadded (above); oneDNN's bf16 kernels give a row different sums at different row counts whether
or not it pads, so a 16-bit product is no more batch-dependent than before.
"""

from __future__ import annotations

import functools
import logging
import platform

import torch
import torch.nn.functional as F

from vl.kernels import switches

log = logging.getLogger(__name__)


def _cpu_vendor() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("vendor_id"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor()  # Windows: "... AuthenticAMD" / "... GenuineIntel"


@functools.cache
def native_16bit(dtype: torch.dtype) -> bool:
    """Whether this CPU has native GEMM instructions for `dtype` (AVX512-BF16 or AMX for bf16, AMX-FP16 for fp16)."""
    cpu = torch.cpu
    if dtype == torch.bfloat16:
        return bool(cpu._is_avx512_bf16_supported() or cpu._is_amx_tile_supported())
    if dtype == torch.float16:
        return bool(cpu._is_amx_fp16_supported())
    return True


@functools.cache
def use_onednn() -> bool:
    """Whether many-row fp32 products go through oneDNN in this process (see the module docstring)."""
    choice = switches.get("VL_CPU_GEMM")
    if choice == "blas":
        return False
    if not (torch.backends.mkldnn.is_available() and hasattr(torch.ops.mkldnn, "_linear_pointwise")):
        return False
    if choice == "onednn":
        return True
    x86 = platform.machine().lower() in ("x86_64", "amd64")
    vendor = _cpu_vendor()
    return x86 and torch.backends.mkl.is_available() and "GenuineIntel" not in vendor and bool(vendor)

ROW_MULTIPLE = 16  # many-row oneDNN products run on a rounded row count (see "Row counts" above)
ROW_BUCKETS = 32  # row counts per doubling above 512: the extra rows are under 1/ROW_BUCKETS of the product


def rounded_rows(rows: int) -> int:
    """The row count a product of `rows` rows runs on: `rows` up to ROW_MULTIPLE, else rounded up to a multiple of
    ROW_MULTIPLE, or of 1/ROW_BUCKETS of its power of two where that is larger."""
    if rows <= ROW_MULTIPLE:
        return rows
    step = max(ROW_MULTIPLE, 1 << max(rows.bit_length() - ROW_BUCKETS.bit_length(), 0))
    return -(-rows // step) * step


def _padded(x2: torch.Tensor, rows: int, target: int) -> torch.Tensor:
    """x2 (rows, k) with zero rows appended up to `target` rows (x2 itself when that is rows)."""
    if target == rows:
        return x2
    out = x2.new_zeros(target, x2.shape[1])
    out[:rows] = x2
    return out


def padded_rows(x2: torch.Tensor) -> torch.Tensor:
    """x2 (rows, k) on the CPU with zero rows appended up to `rounded_rows(rows)`, for a caller that multiplies the
    same rows by several weights: `linear` then runs on them as they are, and the copy is made once (for 1831 rows
    of 20480 inputs one copy costs about half of a 1024-output bf16 product)."""
    return _padded(x2, x2.shape[0], rounded_rows(x2.shape[0])) if x2.device.type == "cpu" else x2


def linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """`F.linear(x, weight, bias)`, through oneDNN where `use_onednn()` and the operands qualify; CPU products that
    oneDNN runs (fp32 ones routed here, native 16-bit ones) run on `rounded_rows(rows)` rows."""
    k = weight.shape[-1]
    rows = x.numel() // k if k else 0
    cpu = x.device.type == "cpu" and weight.device.type == "cpu"
    plain = not (torch.is_grad_enabled() and any(t is not None and t.requires_grad for t in (x, weight, bias))) \
        and not torch.compiler.is_compiling()
    if (rows and cpu and plain and x.dtype == torch.float32 and weight.dtype == torch.float32
            and (bias is None or bias.dtype == torch.float32) and use_onednn()):
        x2 = x.reshape(rows, k)
        if rows == 1:  # the many-row kernel's sums, not the GEMV path's (see "Batch invariance" above)
            x2 = torch.cat([x2, x2])
        x2 = _padded(x2, rows, rounded_rows(rows))
        y = torch.ops.mkldnn._linear_pointwise(x2, weight, bias, "none", [], "")[:rows]
        return y.reshape(*x.shape[:-1], weight.shape[0])
    target = rounded_rows(rows)
    if (target != rows and cpu and plain and x.dtype == weight.dtype
            and x.dtype in (torch.bfloat16, torch.float16) and native_16bit(x.dtype)):
        y = F.linear(_padded(x.reshape(rows, k), rows, target), weight, bias)[:rows]
        return y.reshape(*x.shape[:-1], weight.shape[0])
    return F.linear(x, weight, bias)
