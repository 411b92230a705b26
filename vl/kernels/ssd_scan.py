"""The chunked SSD scan on the CPU in C++ (`csrc/ssd_scan.cpp`): the prefill's fast path; its twin is
`vl.modeling.ssd_ref.ssd_chunked`.

The reference scan spends most of its time around the arithmetic: two small batched products per 32-token chunk
in a sequential loop, float32 copies of x, B and C in two layouts, full-size decay tensors. The C++ scan does the
same operations chunk by chunk with each group's state in cache, split over (batch row, group) across the OpenMP
threads torch uses. Numbers: the same as the reference up to the order of float32 additions (tests/kernels/
test_ssd_cpu.py); speed: docs/benchmarks.md, "SSD scan in C++".

It runs where `vl.modeling.kernels.ssd_scan` sends it: CPU tensors in bfloat16 or float32 with no autograd graph
being recorded. `VL_SSD_KERNEL` = auto (default: the AVX512 build, else the reference) | portable (the plain C++
loops, any CPU) | off (the reference). Built by the compile cache of vl/kernels/loader.py (~3 s, once per machine)
when a CPU model with Mamba layers is loaded (`runtime_passes`), or at first use; where it cannot be built, one log
line says why and the reference runs.
"""

from __future__ import annotations

import ctypes
import functools
import logging

import torch

from vl.kernels import loader

log = logging.getLogger(__name__)

SOURCE = loader.CSRC / "ssd_scan.cpp"
DTYPES = (torch.bfloat16, torch.float32)
_i, _l, _p = ctypes.c_int, ctypes.c_long, ctypes.c_void_p
FUNCTIONS = {"vl_ssd_scan": ([_i] * 8 + [_p, _l, _l, _l, _p, _l, _l, _l, _p, _p, _p, _l, _l, _l, _p, _p, _p, _i], None)}
Library = loader.Library


@functools.cache
def _load(mode: str) -> tuple[Library | None, str]:
    return loader.load(SOURCE, mode, "VL_SSD_KERNEL", "the C++ scan", functools.partial(Library, functions=FUNCTIONS))


def library() -> Library | None:
    lib, why = _load(loader.mode("VL_SSD_KERNEL"))
    if lib is None:
        _say_once(why)
    return lib


@functools.cache
def _say_once(why: str) -> None:
    log.info("vl.kernels: the CPU prefill's SSD scan runs the torch reference (%s)", why)


def status() -> str:
    """One line for logs and `vl bench`: which scan a CPU prefill uses here."""
    lib, why = _load(loader.mode("VL_SSD_KERNEL"))
    return f"C++ {lib.isa} scan ({lib.path.name})" if lib is not None else f"torch reference ({why})"


def applies(x: torch.Tensor, B: torch.Tensor, C: torch.Tensor) -> bool:
    """Whether these inputs can take the C++ scan (the caller checks autograd): CPU, bfloat16 or float32 alike."""
    return (x.device.type == "cpu" and x.dtype in DTYPES and B.dtype == x.dtype and C.dtype == x.dtype
            and x.shape[1] > 0)


def ssd_chunked(x, dt, A, B, C, chunk_size: int, initial_state=None, lib: Library | None = None):
    """`ssd_ref.ssd_chunked` in C++: the same arguments and results (y float32 (b, t, h, p) without the D skip, the
    final state float32 (b, h, p, n)). x, B and C may be strided views (the projection's output split), each with
    its last dimension contiguous; anything else is copied once here."""
    lib = lib or library()
    if lib is None:
        raise RuntimeError(f"the C++ SSD scan is unavailable: {status()}")
    b, t, h, p = x.shape
    g, n = B.shape[2], B.shape[3]
    if h % g or C.shape != B.shape or B.shape[:2] != (b, t) or dt.shape != (b, t, h) or A.shape != (h,):
        raise ValueError(f"SSD scan shapes do not agree: x {tuple(x.shape)}, dt {tuple(dt.shape)}, A {tuple(A.shape)}, "
                         f"B {tuple(B.shape)}, C {tuple(C.shape)}")
    if x.stride(3) != 1:
        x = x.contiguous()
    if B.stride(3) != 1 or C.stride() != B.stride():
        B, C = B.contiguous(), C.contiguous()
    dt = dt.float()
    A = A.float().contiguous()
    init = None
    if initial_state is not None:
        init = initial_state.float().contiguous()
        if init.shape != (b, h, p, n):
            raise ValueError(f"initial state {tuple(init.shape)} for x {tuple(x.shape)} and state size {n}")
    y = torch.empty(b, t, h, p, dtype=torch.float32)
    final = torch.empty(b, h, p, n, dtype=torch.float32)
    lib.lib.vl_ssd_scan(b, t, h, p, g, n, int(chunk_size), int(x.dtype == torch.bfloat16),
                        x.data_ptr(), *x.stride()[:3], dt.data_ptr(), *dt.stride(), A.data_ptr(),
                        B.data_ptr(), C.data_ptr(), *B.stride()[:3], None if init is None else init.data_ptr(),
                        y.data_ptr(), final.data_ptr(), torch.get_num_threads())
    return y, final
