"""Give the C heap's free pages back to the operating system after a model load (glibc's `malloc_trim`).

Loading leaves holes in the C heap: the huge-page pass copies a model's small tensors (norm weights, block
scales, small projections) into one arena and frees the originals (vl/runtime/hugepages.py), and the loader
frees its read buffers. glibc keeps freed memory below its mmap threshold (128 KiB, rising to 32 MiB as the
process frees large blocks) inside the heap, resident, unless the free space sits at the heap's top. `malloc_trim(0)`
returns every free whole page inside the heap as well. Measured on the 12B NVFP4 geometry (`vl bench --geometry`,
docs/quant_cpu_kernels.md): ~85 MiB per 6 layers were free but resident after the load. Elsewhere (macOS,
Windows, musl) there is no such call and nothing is done.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
import logging
import platform

log = logging.getLogger(__name__)


@functools.cache
def _trim_fn():
    if platform.system() != "Linux":
        return None
    try:
        fn = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6").malloc_trim
    except (OSError, AttributeError):  # not glibc
        return None
    fn.argtypes, fn.restype = [ctypes.c_size_t], ctypes.c_int
    return fn


def trim() -> bool:
    """Return the heap's free pages to the OS; -> whether any were returned (False where there is no call)."""
    fn = _trim_fn()
    return bool(fn(0)) if fn is not None else False
