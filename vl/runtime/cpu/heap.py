"""Freed heap memory: give it back to the operating system after a load and after each app request (glibc
`malloc_trim`), keep it between trims so that a CPU prefill reuses it (glibc's thresholds).

`trim_heap()`. Gradio runs each step of a handler's generator on a pool thread, so a request's tensors, tiles and
preview pictures were allocated in several per-thread arenas (before `share_one_arena()` below), and glibc gives a
non-main arena's memory back only from the arena's top; in any arena, free space pinned below a live chunk stays
resident, request after request. Measured inside
`vl app` over a 5-minute soak (`mallinfo2()`, `tracemalloc`): Python objects grew by 5 MB and the heap in use by
26 MB, while the free chunks malloc kept grew from 10 MB to 120 MB and RSS followed them (+180 MB).
`malloc_trim(0)` walks every arena and releases each whole free page (`MADV_DONTNEED`); the next request gets the
pages back on demand. It runs once per request, when the request's stream closes (`ui/runner.py` `stream_chat`):
about 0.5 ms when little is free, 145 ms when 355 MB are released at once. With it the 10-minute soak of `vl app`
(scripts/soak.py, docs/reliability_policy.md row S11) grows 5.3% (7.3 MB/min) instead of 12% (12.8 MB/min); the
rest is memory still in use, not traced to its owner. After a load it gives back the small tensors the huge-page
pass copied into its arena (vl/runtime/cpu/hugepages.py), which glibc keeps resident below its mmap threshold:
85 MiB on the first 6 layers of the 12B NVFP4 geometry (`vl/runtime/pretrained.py` calls it last).
On a C library without `malloc_trim` (musl, macOS) it does nothing and says so (returns None): those allocators
have no arena retention of this kind to undo.

`keep_freed_memory()`. A CPU prefill allocates and frees the same large temporaries layer after layer (projection
outputs, the SSD scan's fp32 blocks: 4-33 MB each for the 180m config at 2k tokens), and glibc's defaults hand them
back to the OS as soon as they are freed (blocks above its dynamic mmap threshold are mapped and unmapped per
allocation; the top of the heap is trimmed once more than twice that threshold is free), so each new temporary
starts on fresh pages, each a page fault that the kernel must also zero; how many depends on what the process
allocated before (glibc's threshold is history). It turns glibc's mmap off for the process's allocations (no block
is mapped on its own; the threshold alone tops out at 32 MiB, while a 12B layer's temporaries at a page's 3367
tokens are 34-276 MB) and sets the automatic trim threshold to 1 GiB, so freed temporaries stay in the heap for
the next layer: a 2048-token prefill of the 180m config in the process `vl bench` builds then takes under 5200
faults instead of 180-390 thousand (~2.3 us each on an AMD EPYC VM, 3-15% of the prefill;
`scripts/research/prefill_page_faults.py`), and a 3367-token prefill of the 12B widths' first 8 layers 0-34 thousand
instead of 0.8-1.1 million, 10-15% faster (`scripts/research/prefill_heap_12b.py`; docs/benchmarks.md "Prefill
temporaries"). This is what PyTorch's CPU performance-tuning guide gets from jemalloc
or TCMalloc ("reusing memory as much as possible"), without swapping the process's allocator. `trim_heap()` still
releases it all, after a load and after each app request. `VL_HEAP_KEEP=0` leaves glibc's defaults alone.

`share_one_arena()`. Off the main thread (`vl serve`'s engine worker, the app's handlers) glibc gives each thread
an arena of its own, whose heaps cannot grow past 64 MiB: a larger block is mapped there whatever `M_MMAP_MAX` says
and unmapped when freed, so a page's prefill on such a thread took 1.0-1.4 million faults and ~15% more time than on
the main thread. With at most one arena (`M_ARENA_MAX` 1) a thread that allocates for the first time takes the main
arena, which grows without that limit: the same prefill on its own thread then runs as on the main one
(`scripts/research/prefill_heap_12b.py --thread`). It applies to threads that have not allocated yet, so the `vl`
command sets it before its command runs; threads of the process that already hold an arena keep it. Python's own
small objects do not go through malloc, so the one arena's lock is taken by few calls.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
import logging
import platform

from vl.kernels import switches

log = logging.getLogger(__name__)

M_TRIM_THRESHOLD, M_MMAP_MAX, M_ARENA_MAX = -1, -4, -8  # mallopt parameters (glibc <malloc.h>)
TRIM_THRESHOLD = 1 << 30


@functools.cache
def libc():
    """The process's C library through ctypes, loaded once for the memory passes (this file's malloc calls,
    vl/runtime/cpu/hugepages.py's `madvise`); None where it cannot be loaded."""
    try:
        return ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
    except OSError:
        return None


@functools.cache
def _glibc(name: str, argtypes: tuple):
    """A glibc malloc function (`malloc_trim`, `mallopt`), or None where the C library has no such function."""
    fn = getattr(libc(), name, None)
    if fn is None:
        return None
    fn.argtypes, fn.restype = list(argtypes), ctypes.c_int
    return fn


@functools.cache
def madvise_libc():
    """`libc()` once, with `madvise(addr, length, advice) -> int` typed for ctypes: the page passes' one handle
    (vl/runtime/cpu/hugepages.py, vl/runtime/cpu/gpu_libs.py); None where the C library cannot be loaded."""
    lib = libc()
    if lib is not None:
        lib.madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
        lib.madvise.restype = ctypes.c_int
    return lib


def linux_switch(var: str) -> bool:
    """Whether a Linux-only memory setting is on: always off elsewhere; its on/off switch (vl/kernels/switches.py)
    turns it off (this file's `VL_HEAP_KEEP`, vl/runtime/cpu/hugepages.py's `VL_HUGEPAGES`). No torch import here:
    the app's heap test measures a bare process."""
    return platform.system() == "Linux" and switches.on(var)


def _mallopt(*settings: tuple[int, int]) -> bool | None:
    """glibc `mallopt(param, value)` for each setting. -> True when every one was set, False when the C library
    refused one, None where nothing was tried (`VL_HEAP_KEEP` off, not Linux, no `mallopt`)."""
    fn = _glibc("mallopt", (ctypes.c_int, ctypes.c_int)) if linux_switch("VL_HEAP_KEEP") else None
    return None if fn is None else all([bool(fn(param, value)) for param, value in settings])


@functools.cache
def keep_freed_memory() -> bool:
    """Keep freed heap memory in the process for reuse (module docstring); once per process. -> True when set."""
    ok = _mallopt((M_MMAP_MAX, 0), (M_TRIM_THRESHOLD, TRIM_THRESHOLD))
    if ok is None:
        return False
    ok = ok and share_one_arena()
    log.info("heap: freed blocks of any size stay in the heap for reuse (%s)", "set" if ok else
             "refused by the C library")
    return ok


@functools.cache
def share_one_arena() -> bool:
    """Every thread that allocates for the first time from now on takes the main malloc arena instead of one of its
    own (module docstring, `share_one_arena()`); once per process, as early as the process allows (the `vl` command
    calls it before its command runs; a load calls it too). -> True when set."""
    return bool(_mallopt((M_ARENA_MAX, 1)))


def trim_heap() -> bool | None:
    """Release free heap pages of every malloc arena to the OS.

    Returns True when glibc released memory, False when there was none to release, None when the C
    library has no `malloc_trim` (nothing is done then).
    """
    fn = _glibc("malloc_trim", (ctypes.c_size_t,))
    if fn is None:
        return None
    return bool(fn(0))
