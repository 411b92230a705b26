"""Fused dequantize + dot for weight-only FP8 / NVFP4 decode on the CPU, and the dense few-row products.

A decode step multiplies every weight by one token: it is bound by the bytes it reads. Dequantizing a packed
layer per call (the reference path) writes and re-reads a full float copy, so the packed formats ran several
times slower than BF16. The kernel (`csrc/quant_gemv.cpp`, over the row kernels of `csrc/row_kernels.h`) reads the
packed bytes once and rebuilds each weight in registers, bit for bit the float32 weight the reference builds
(rounded to bfloat16 when the activations are bf16, as the reference's `dequantized_weight(bf16)` is); only the
order of the float32 additions differs. Its twins are `vl/quant/gemv_ref.py` (FP8 / NVFP4) and `F.linear` (dense);
torch's CPU offers no usable alternative (docs/quant_cpu_kernels.md).

The kernel is plain C++ with no torch headers, so it compiles in ~2 s: at first use (`vl.load_pretrained`
of a quantized checkpoint triggers it) it is built into the per-CPU cache of vl/kernels/loader.py and loaded with
ctypes. Where it cannot be built or loaded, one log line says why and the reference path runs.
`VL_QUANT_KERNEL` = auto (default) | portable (the plain C++ path, no AVX512 intrinsics) | off (reference).
Same pattern as nanochat `flash_attention.py`: one API, the fast or the reference path at run time, tests
can force either.
"""

from __future__ import annotations

import ctypes
import functools
import logging
from pathlib import Path

import torch

from vl.kernels import loader, switches

log = logging.getLogger(__name__)

SOURCE = loader.CSRC / "quant_gemv.cpp"
MAX_ROWS = 16  # up to this many activation rows use the kernel (decode, small batches); more rows: dequantize + GEMM
TILE_MAX_ROWS = 512  # the same for NVFP4 rows on AMX tiles (docs/quant_cpu_kernels.md, "NVFP4 rows on AMX tiles")
KERNEL_ROWS = 4  # rows per kernel call (register budget); more rows are sent in groups
SCALE_KIND = {"tensor": 0, "channel": 1, "block": 2}
_p, _i, _f = ctypes.c_void_p, ctypes.c_int, ctypes.c_float


class Kernel(loader.Library):
    """The loaded library: `fp8(...)` and `nvfp4(...)` on float32 rows, `dense(...)` and `dense_t(...)`."""

    functions = {"vl_fp8_gemv": ([_p, _i, _i, _p, _i, _p, _i, _i, _i, _p, _i], None),
                 "vl_nvfp4_gemv": ([_p, _i, _i, _p, _p, _f, _i, _i, _i, _i, _p, _i], None),
                 "vl_packed_tiles": ([], _i),
                 "vl_gemv_bf16_dot": ([], _i),
                 "vl_dense_gemv": ([_p, _i, _i, _p, _i, _i, _p, _i], None),
                 "vl_dense_bf16_native": ([], _i),
                 "vl_dense_t_gemv": ([_p, _i, _i, _p, _i, _i, _p, _i], None),
                 "vl_nvfp4_loop": ([], _i),
                 "vl_nvfp4_gemv_group": ([_i, _p, _i, _i, _p, _p, _p, _i, _i, _i, _i, _p, _i], None),
                 "vl_fp8_gemv_group": ([_i, _p, _i, _i, _p, _i, _p, _i, _i, _i, _p, _i], None),
                 "vl_nvfp4_expand": ([_p, _p, _f, _i, _i, _i, _i, _p, _i], None),
                 "vl_fp8_expand": ([_p, _p, _i, _i, _i, _i, _i, _i, _p, _i], None)}

    def __init__(self, path: Path):
        super().__init__(path)
        lib = self.lib
        self.bf16_dot = bool(lib.vl_gemv_bf16_dot())  # FP8 with bf16 activations takes them as bf16
        self.dense_bf16 = bool(lib.vl_dense_bf16_native())
        # the NVFP4 loop bf16 activations take (docs/quant_cpu_kernels.md, "Why two loops for bf16 activations")
        self.nvfp4_loop = {2: "vdpbf16ps table", 1: "vpermps + fma", 0: "portable"}[lib.vl_nvfp4_loop()]
        self.dense_fp32 = self.isa == "avx512"  # the portable fp32 loop is no faster than torch's
        self.packed_tiles = bool(lib.vl_packed_tiles())  # NVFP4 rows can take AMX tiles (bf16 activations)

    def fp8(self, x: torch.Tensor, w8: torch.Tensor, scale: torch.Tensor, kind: str, round_bf16: bool):
        """x (M, K) contiguous (float32, or bfloat16 with round_bf16), w8 (N, K) float8_e4m3fn, scale float32
        contiguous -> (M, N) float32. round_bf16: each weight rounded to bf16, as the bf16 reference's."""
        return self.fp8_layer(w8, scale, kind)(x, round_bf16)

    def nvfp4(self, x: torch.Tensor, packed: torch.Tensor, block_scale: torch.Tensor, global_scale: float,
              round_bf16: bool):
        """x (M, K) contiguous (float32, or bfloat16 with round_bf16), packed (N, K/2) uint8, block_scale (N, K/16)
        e4m3 -> (M, N) float32. round_bf16: each weight rounded to bf16, as the bf16 reference's."""
        return self.nvfp4_layer(packed, block_scale, global_scale)(x, round_bf16)

    def fp8_layer(self, w8: torch.Tensor, scale: torch.Tensor, kind: str):
        """`fp8` with the layer's pointers bound once: -> call(x, round_bf16). The caller keeps the tensors alive
        and unchanged while it uses the call (QuantizedLinear re-binds when a tensor or its version changes)."""
        f, wp, n, sp, kd = self.lib.vl_fp8_gemv, w8.data_ptr(), w8.shape[0], scale.data_ptr(), SCALE_KIND[kind]
        return self._packed(n, (w8, scale), lambda xr, rows, k, x_bf16, r16, yr, threads, tiles: f(
            xr, rows, k, wp, n, sp, kd, r16, x_bf16, yr, threads))

    def nvfp4_layer(self, packed: torch.Tensor, block_scale: torch.Tensor, global_scale: float):
        """`nvfp4` with the layer's pointers bound once: -> call(x, round_bf16) (as `fp8_layer`). With bf16
        activations on AMX tiles, `tile_from()` (read here) picks by the row count alone which rows take tiles."""
        f, wp, bp, gs, n = (self.lib.vl_nvfp4_gemv, packed.data_ptr(), block_scale.data_ptr(), float(global_scale),
                            packed.shape[0])
        least = tile_from() if self.packed_tiles else 0
        return self._packed(n, (packed, block_scale), lambda xr, rows, k, x_bf16, r16, yr, threads, tiles: f(
            xr, rows, k, wp, bp, gs, n, r16, x_bf16, tiles, yr, threads), tiles_from=least)

    def _group_rows(self, x: torch.Tensor, rows: list[int], round_bf16: bool):
        """The activations as a group call reads them: (x_bf16, a pointer per group to its row, the tensor those
        pointers point into, which the caller keeps alive for the call)."""
        x_bf16 = round_bf16 and self.bf16_dot
        x = x.to(torch.bfloat16 if x_bf16 else torch.float32).contiguous()
        base, stride = x.data_ptr(), x.shape[1] * x.element_size()
        return x_bf16, (ctypes.c_void_p * len(rows))(*(base + r * stride for r in rows)), x

    def nvfp4_group(self, x: torch.Tensor, rows: list[int], weights, block_scales, global_scales, n: int,
                    round_bf16: bool) -> torch.Tensor:
        """G NVFP4 layers of one shape (n, K) in one kernel call, one activation row each: group g multiplies row
        `rows[g]` of x (R, K) by layer g (weights / block_scales: G data pointers, global_scales: G floats)
        -> (G, n) float32. Row g equals `nvfp4(x[rows[g]], ...)` of layer g bit for bit; the threads wake once for
        all G (a MoE layer's routed experts of one token, vl/quant/experts.py)."""
        g, k = len(rows), x.shape[1]
        x_bf16, xs, x = self._group_rows(x, rows, round_bf16)
        y = torch.empty(g, n, dtype=torch.float32)
        self.lib.vl_nvfp4_gemv_group(g, xs, 1, k,
                                     (ctypes.c_void_p * g)(*weights), (ctypes.c_void_p * g)(*block_scales),
                                     (ctypes.c_float * g)(*global_scales), n, int(round_bf16), int(x_bf16), 0,
                                     y.data_ptr(), torch.get_num_threads())
        return y

    def fp8_group(self, x: torch.Tensor, rows: list[int], weights, scales, kind: str, n: int,
                  round_bf16: bool) -> torch.Tensor:
        """G FP8 layers of one shape (n, K) and scale kind, one activation row each, as `nvfp4_group`: weights and
        scales are G data pointers (E4M3 (n, K) bytes; float32 scales as `fp8` takes them) -> (G, n) float32, row g
        bit for bit `fp8(x[rows[g]], ...)` of layer g."""
        g, k = len(rows), x.shape[1]
        x_bf16, xs, x = self._group_rows(x, rows, round_bf16)
        y = torch.empty(g, n, dtype=torch.float32)
        self.lib.vl_fp8_gemv_group(g, xs, 1, k,
                                   (ctypes.c_void_p * g)(*weights), n, (ctypes.c_void_p * g)(*scales),
                                   SCALE_KIND[kind], int(round_bf16), int(x_bf16), y.data_ptr(),
                                   torch.get_num_threads())
        return y

    def nvfp4_expand(self, packed: torch.Tensor, block_scale: torch.Tensor, global_scale: float, r0: int, r1: int,
                     dtype: torch.dtype) -> torch.Tensor:
        """Rows r0:r1 of an NVFP4 layer (packed (N, K/2) uint8, block_scale (N, K/16) e4m3, both contiguous) as a
        (r1 - r0, K) float32 / bfloat16 tensor, bit for bit `dequantize_nvfp4(...)[r0:r1].to(dtype)`."""
        k = packed.shape[1] * 2
        out = torch.empty(r1 - r0, k, dtype=dtype)
        self.lib.vl_nvfp4_expand(packed.data_ptr(), block_scale.data_ptr(), float(global_scale), k, r0, r1,
                                 int(dtype == torch.bfloat16), out.data_ptr(), torch.get_num_threads())
        return out

    def fp8_expand(self, w8: torch.Tensor, scale: torch.Tensor, kind: str, r0: int, r1: int,
                   dtype: torch.dtype) -> torch.Tensor:
        """Rows r0:r1 of an E4M3 layer (w8 (N, K), scale float32 contiguous as `fp8` takes it) as a (r1 - r0, K)
        float32 / bfloat16 tensor, bit for bit `dequantize_fp8(...)[r0:r1].to(dtype)`, NaN codes included."""
        n, k = w8.shape
        out = torch.empty(r1 - r0, k, dtype=dtype)
        self.lib.vl_fp8_expand(w8.data_ptr(), scale.data_ptr(), SCALE_KIND[kind], n, k, r0, r1,
                               int(dtype == torch.bfloat16), out.data_ptr(), torch.get_num_threads())
        return out

    def _packed(self, n: int, tensors: tuple, call, tiles_from: int = 0):
        """The row loop shared by the packed formats: activations as the kernel takes them (bf16 when it rounds
        weights to bf16 and has a bf16 dot product, else float32), KERNEL_ROWS rows per kernel call. `tensors`:
        what the bound pointers point into, kept alive by the returned call. tiles_from > 0 (NVFP4 on AMX): calls
        of at least that many bf16 rows take tiles, all rows in one call (the kernel rebuilds each weight once per call:
        row_kernels.h nvfp4_rows_amx_many)."""
        bf16_dot = self.bf16_dot

        def run(x: torch.Tensor, round_bf16: bool, _keep=tensors) -> torch.Tensor:
            m, k = x.shape
            x_bf16 = round_bf16 and bf16_dot
            x = x.to(torch.bfloat16 if x_bf16 else torch.float32).contiguous()
            y = torch.empty(m, n, dtype=torch.float32)
            threads = torch.get_num_threads()
            tiles = int(x_bf16 and 0 < tiles_from <= m)
            step = m if tiles else KERNEL_ROWS  # tiles: one call, which rebuilds each weight once for all rows
            for r in range(0, m, step):
                call(x[r].data_ptr(), min(step, m - r), k, int(x_bf16), int(round_bf16), y[r].data_ptr(), threads,
                     tiles)
            return y

        def max_rows(round_bf16: bool) -> int:
            """The most rows this layer's kernel takes before dequantize + GEMM is the faster."""
            return TILE_MAX_ROWS if round_bf16 and bf16_dot and tiles_from else MAX_ROWS

        run.max_rows = max_rows
        return run

    def dense(self, x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        """x (M, K), w (N, K), both bf16 or both float32, contiguous -> (M, N) float32 (float32 accumulation)."""
        m, k = x.shape
        n = w.shape[0]
        y = torch.empty(m, n, dtype=torch.float32)
        threads = torch.get_num_threads()
        for r in range(0, m, KERNEL_ROWS):
            self.lib.vl_dense_gemv(x[r].data_ptr(), min(KERNEL_ROWS, m - r), k, w.data_ptr(), n,
                                   int(w.dtype == torch.bfloat16), y[r].data_ptr(), threads)
        return y

    def dense_t(self, x: torch.Tensor, wt: torch.Tensor) -> torch.Tensor:
        """x (M, K) float32 contiguous, wt (K, N) bf16 or float32 contiguous (a weight stored transposed) -> (M, N)
        float32 = x @ wt, reading only the rows of wt whose input is non-zero somewhere in x (ReLU^2 zeros)."""
        m, k = x.shape
        n = wt.shape[1]
        y = torch.empty(m, n, dtype=torch.float32)
        self.lib.vl_dense_t_gemv(x.data_ptr(), m, k, wt.data_ptr(), n, int(wt.dtype == torch.bfloat16),
                                 y.data_ptr(), torch.get_num_threads())
        return y


def _mode() -> str:
    return loader.mode("VL_QUANT_KERNEL")


TILE_FROM_ROWS = 5  # `VL_NVFP4_TILES=auto`: below this many rows the float32 loop is the faster (12B widths)


def tile_rule() -> str:
    """`VL_NVFP4_TILES`: which NVFP4 rows of bf16 models take AMX tiles where the kernel has them (auto: calls and
    steps of TILE_FROM_ROWS rows or more, on: every row, off: none; docs/quant_cpu_kernels.md, "NVFP4 rows on AMX
    tiles")."""
    return switches.get("VL_NVFP4_TILES")


def tile_from() -> int:
    """`tile_rule()` as a row count: calls (fused steps: decode rows) of at least this many rows take the tiles
    (0: none)."""
    return {"on": 1, "auto": TILE_FROM_ROWS, "off": 0}[tile_rule()]


@functools.cache
def _load(mode: str) -> tuple[Kernel | None, str]:
    return loader.load(SOURCE, mode, "VL_QUANT_KERNEL", "the fused CPU kernel", Kernel, linux_only_in_auto=True,
                       avx512_in_auto=False)


def kernel() -> Kernel | None:
    """The fused kernel for the current `VL_QUANT_KERNEL` mode, or None (reason logged once)."""
    k, why = _load(_mode())
    if k is None and _mode() != "off":
        _warn_once(why)
    return k


@functools.cache
def _warn_once(why: str) -> None:
    log.warning("vl.quant: fused CPU FP8/NVFP4 kernel unavailable (%s); weight-only layers dequantize per "
                "call (correct, slower).", why)


def status() -> str:
    """One line for logs and `vl bench`: which path weight-only decode uses here."""
    k, why = _load(_mode())
    if k is None:
        return f"reference path ({why})"
    tiles = f", AMX tiles: {tile_rule()}" if k.packed_tiles else ""
    return f"fused {k.isa} kernel ({k.path.name}; NVFP4 with bf16 activations: {k.nvfp4_loop}{tiles})"
