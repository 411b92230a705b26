"""Hand freed heap memory back to the operating system (glibc `malloc_trim`): after every load, and after every
request of the app.

After a load: the huge-page pass copies a model's small tensors (norm weights, block scales, small projections)
into one arena and frees the originals (vl/runtime/hugepages.py), and glibc keeps such freed chunks (below its
mmap threshold) resident inside the heap. Measured on the first 6 layers of the 12B NVFP4 geometry: 85 MiB free
but resident after `vl.load_pretrained`, given back by one trim (`vl/runtime/pretrained.py` calls it last).

After a request: the first 10-minute soak of `vl app` (docs/reliability_policy.md row S11) grew the server's RSS by 12 %
(about 13 MB/min, steady, no plateau) while every request was served. Measured inside the server with
`mallinfo2()` and `tracemalloc` during a 5-minute soak: Python objects grew by 5 MB and the heap in use by
26 MB, but the *free* chunks that malloc kept in its arenas grew from 10 MB to 120 MB, and RSS followed them
(+180 MB). Gradio runs each step of a handler's generator on a pool thread, so a request's tensors, tiles and
preview pictures are allocated in several per-thread arenas; glibc gives a non-main arena's memory back only
from the arena's top, so free space pinned below a live chunk stays resident, request after request.
`malloc_trim(0)` walks every arena and releases each whole free page (`MADV_DONTNEED`); the next request
gets the pages back on demand. It is called once per request, when the request's stream closes
(`ui/runner.py` `stream_chat`). Measured: about 0.5 ms when little is free, 145 ms when 355 MB were released at once.
After the fix the 10-minute soak grew 5.3 % (slope 7.3 MB/min, was 12.8): most of the growth was this, a
smaller part is memory still in use, not yet traced to its owner.

On a C library without `malloc_trim` (musl, macOS) this does nothing and says so (`trim_heap` returns
None): those allocators have no arena retention of this kind to undo.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools


@functools.cache
def _malloc_trim():
    """glibc's `int malloc_trim(size_t pad)`, or None where the C library has no such function."""
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        fn = libc.malloc_trim
    except (OSError, AttributeError):
        return None
    fn.argtypes, fn.restype = [ctypes.c_size_t], ctypes.c_int
    return fn


def trim_heap() -> bool | None:
    """Release free heap pages of every malloc arena to the OS.

    Returns True when glibc released memory, False when there was none to release, None when the C
    library has no `malloc_trim` (nothing is done then).
    """
    fn = _malloc_trim()
    if fn is None:
        return None
    return bool(fn(0))
