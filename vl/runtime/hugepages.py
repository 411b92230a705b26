"""Back a CPU model's large weight tensors with 2 MiB pages (Linux transparent huge pages), in place.

A CPU decode step streams every weight once per token. With 4 KiB pages that is one TLB miss per 4 KiB read, and
the CPU's stream prefetchers stop at every 4 KiB page boundary. Measured on this project's 2-core AVX512 runner
(AMD EPYC, 1 thread, 2 Dec 2026): the fp32 GEMV of `kernels/quant_gemv.cpp` over a 512 MiB matrix read 23-26 GB/s
from 4 KiB pages and 29-32 GB/s from 2 MiB pages of the same process, in alternating rounds (docs/cpu_decode.md).

Most Linux machines ship THP in `madvise` mode (only memory that asks gets huge pages), and torch's CPU allocator
does not ask. `advise(model)` asks for every large CPU storage the model holds: `madvise(MADV_HUGEPAGE)` on the
2 MiB-aligned interior of each storage, then `madvise(MADV_COLLAPSE)` (Linux >= 6.1), which rebuilds the already
written pages as huge pages synchronously. The data and every pointer stay the same; only the page size under
them changes, so nothing can change numerically. Where the kernel refuses (THP `never`, an older kernel, a file
mapping it cannot collapse, a non-Linux OS) the pages stay as they are; one log line says how much was collapsed.
`VL_HUGEPAGES=0` turns it off.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
import logging
import os
import platform

import torch
from torch import nn

log = logging.getLogger(__name__)

HUGE = 2 << 20
MIN_BYTES = 2 * HUGE  # smaller storages have no whole 2 MiB page worth the call
MADV_HUGEPAGE, MADV_COLLAPSE = 14, 25


@functools.cache
def _libc():
    lib = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
    lib.madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
    lib.madvise.restype = ctypes.c_int
    return lib


def enabled() -> bool:
    return platform.system() == "Linux" and os.environ.get("VL_HUGEPAGES", "1").strip() not in ("0", "off", "no")


def advise_range(addr: int, nbytes: int) -> int:
    """Ask for huge pages under [addr, addr + nbytes): -> bytes the kernel collapsed (0 where it refused)."""
    start = -(-addr // HUGE) * HUGE
    end = (addr + nbytes) // HUGE * HUGE
    if end - start < HUGE:
        return 0
    libc = _libc()
    libc.madvise(start, end - start, MADV_HUGEPAGE)  # also lets khugepaged collapse what the next call cannot
    return end - start if libc.madvise(start, end - start, MADV_COLLAPSE) == 0 else 0


def advise(model: nn.Module) -> int:
    """Huge pages under the model's large CPU parameters and buffers; -> bytes collapsed. Safe to call twice."""
    if not enabled():
        return 0
    seen, done, asked = set(), 0, 0
    for t in [*model.parameters(), *model.buffers()]:
        if t is None or t.device.type != "cpu":
            continue
        st = t.untyped_storage()
        if st.data_ptr() in seen or st.nbytes() < MIN_BYTES:
            continue
        seen.add(st.data_ptr())
        asked += st.nbytes()
        try:
            done += advise_range(st.data_ptr(), st.nbytes())
        except (OSError, AttributeError) as e:  # no libc madvise: keep the pages as they are
            log.info("vl: huge pages not requested (%s)", e)
            return 0
    if asked:
        log.info("vl: %.0f of %.0f MiB of CPU weights now on 2 MiB pages%s", done / 2**20, asked / 2**20,
                 "" if done else " (the kernel declined: THP off, an older kernel, or file-backed weights)")
    return done


def huge_bytes(t: torch.Tensor) -> int:
    """How many bytes of `t`'s storage this process maps with huge pages (/proc/self/smaps; tests and bench)."""
    lo = t.untyped_storage().data_ptr()
    hi = lo + t.untyped_storage().nbytes()
    total, cur = 0, None
    with open("/proc/self/smaps") as f:
        for line in f:
            head = line.split()[0]
            if "-" in head and not head.endswith(":"):
                a, b = (int(v, 16) for v in head.split("-"))
                cur = (a, b) if a < hi and b > lo else None
            elif cur is not None and head == "AnonHugePages:":
                total += int(line.split()[1]) * 1024
            elif cur is not None and head == "FilePmdMapped:":
                total += int(line.split()[1]) * 1024
    return total
