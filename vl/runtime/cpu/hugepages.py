"""Back a CPU model's large weight tensors with 2 MiB pages (Linux transparent huge pages), in place.

A CPU decode step streams every weight once per token. With 4 KiB pages that is one TLB miss per 4 KiB read, and
the CPU's stream prefetchers stop at every 4 KiB page boundary. On an AMD EPYC runner (AVX512-BF16, 1 thread) the
fp32 GEMV of the decode kernels over a 512 MiB matrix read 23-26 GB/s from 4 KiB pages and 29-32 GB/s from 2 MiB
pages of the same process, in alternating rounds, and the 180m config's fused decode step 5-7% more tokens/s
(`scripts/bench_hugepages.py`, docs/cpu_decode.md "Huge pages under the weights").

Most Linux machines ship THP in `madvise` mode (only memory that asks gets huge pages), and torch's CPU allocator
does not ask. `advise(model)` asks, for every CPU storage the model holds:
- a large storage (>= IN_PLACE_BYTES) stays where it is: `madvise(MADV_HUGEPAGE)` on its 2 MiB-aligned interior,
  then `madvise(MADV_COLLAPSE)` (Linux >= 6.1), which rebuilds the already written pages as huge pages in place
  (same addresses, no copy, no extra memory);
- smaller ones (>= MIN_BYTES; a 1024 x 3072 projection of a small model, any packed layer of one) have no or few
  whole 2 MiB pages inside them, so they are copied into 2 MiB-aligned huge-page arenas of at most ARENA_BYTES
  each, and the module's parameters and buffers are re-pointed at their copies (shared and tied tensors stay
  shared). The extra memory is one arena, for the duration of its copy.
The values never change, so nothing can change numerically. Where the kernel refuses (THP `never`, an older kernel,
a non-Linux OS) the pages stay as they are; one log line says how much was done. Memory torch does not own (the
loader's memory-mapped embedding tables) is never advised. `VL_HUGEPAGES=0` turns it off.
"""

from __future__ import annotations

import logging
import weakref

import torch
from torch import nn

from vl.runtime.cpu.heap import linux_switch, madvise_libc, trim_heap

log = logging.getLogger(__name__)

HUGE = 2 << 20
IN_PLACE_BYTES = 8 << 20  # from here on, whole 2 MiB pages cover >= 3/4 of a storage: collapse it where it is
MIN_BYTES = 64 << 10  # smaller storages (norm weights, biases) are not worth moving
ARENA_BYTES = 256 << 20  # the most one arena holds: the extra memory of a move is one arena at a time
ALIGN = 64
MADV_HUGEPAGE, MADV_COLLAPSE = 14, 25


_libc = madvise_libc  # the C library with madvise typed (vl/runtime/cpu/heap.py); a name tests can replace


def enabled() -> bool:
    return linux_switch("VL_HUGEPAGES")


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
    """Huge pages under the model's CPU parameters and buffers; -> bytes now on huge pages by this call's doing
    (collapsed in place or moved into arenas). Safe to call twice. Holds storages' sizes, never the storages, so
    that each arena's originals are freed as soon as the model points at the copies."""
    if not enabled():
        return 0
    sizes = {}  # data_ptr -> nbytes of the storages to advise
    for t in _tensors(model):
        # memory torch does not own (a file map: the loader's mapped embedding, a numpy buffer) is left alone:
        # MADV_HUGEPAGE on a file map lets khugepaged read the whole file range in (1.2 GiB for a 12B embedding
        # that decode reads a few rows of)
        st = t.untyped_storage()
        if t.device.type == "cpu" and st.nbytes() >= MIN_BYTES and st.resizable():
            sizes.setdefault(st.data_ptr(), st.nbytes())
    try:
        done = sum(advise_range(ptr, n) for ptr, n in sizes.items() if n >= IN_PLACE_BYTES)
        moved = 0
        for batch in _batches({ptr: n for ptr, n in sizes.items() if n < IN_PLACE_BYTES and not _in_huge(ptr)}):
            moved += _move_to_arena(model, batch)
            trim_heap()  # the batch's originals, freed by the move, go back before the next arena is taken
    except (OSError, AttributeError) as e:  # no libc madvise: keep the pages as they are
        log.info("vl: huge pages not requested (%s)", e)
        return 0
    total = sum(sizes.values())
    if total:
        log.info("vl: %.0f of %.0f MiB of CPU weights now on 2 MiB pages (%.0f MiB moved into huge-page arenas)%s",
                 (done + moved) / 2**20, total / 2**20, moved / 2**20,
                 "" if done + moved else " (the kernel declined: THP off, an older kernel, or file-backed weights)")
    return done + moved


def _tensors(model: nn.Module):
    for t in model.parameters():
        yield t
    for t in model.buffers():
        if t is not None:
            yield t


# The arenas' storages, while any tensor still uses them: their tensors are not moved again. Weak, so that an arena
# freed with its model is forgotten; a later allocation at the same addresses is a new storage to move.
_ARENAS: weakref.WeakSet = weakref.WeakSet()


def _in_huge(ptr: int) -> bool:
    return any(st.data_ptr() <= ptr < st.data_ptr() + st.nbytes() for st in list(_ARENAS))


def _batches(small: dict) -> list[dict]:
    """{data_ptr: nbytes} of the small storages in groups of at most ARENA_BYTES: each group gets its own arena,
    and its originals are freed before the next is copied, so the copies never need more than one arena of extra
    memory (a 30B MoE's packed experts are 16 GB of 2.5 MB storages)."""
    out, size = [{}], 0
    for ptr, n in small.items():
        if out[-1] and size + n > ARENA_BYTES:
            out.append({})
            size = 0
        out[-1][ptr] = n
        size += n
    return out


def _move_to_arena(model: nn.Module, small: dict) -> int:
    """Copy the storages `small` ({data_ptr: nbytes}) into one huge-page arena and re-point the model's tensors at
    the copies."""
    offsets, size = {}, 0
    for ptr, n in small.items():
        offsets[ptr] = size
        size += -(-n // ALIGN) * ALIGN
    if size < HUGE:
        return 0
    raw = torch.empty(size + HUGE, dtype=torch.uint8)  # fresh, untouched pages: huge ones fault in once advised
    base = -raw.data_ptr() % HUGE
    libc = _libc()
    libc.madvise(raw.data_ptr() + base, -(-size // HUGE) * HUGE, MADV_HUGEPAGE)
    arena = raw[base:base + size]
    _copy_into(arena, model, offsets, small)
    if libc.madvise(arena.data_ptr(), -(-size // HUGE) * HUGE, MADV_COLLAPSE) != 0 and not _any_huge(arena):
        return 0  # the kernel gave no huge pages: leave the model's tensors where they were
    storage = raw.untyped_storage()
    new = {}  # id(old tensor) -> its copy, so that shared tensors stay shared

    def moved(t: torch.Tensor) -> torch.Tensor | None:
        ptr = t.untyped_storage().data_ptr()
        if t.device.type != "cpu" or ptr not in offsets:
            return None
        if id(t) not in new:
            first = (base + offsets[ptr]) // t.element_size() + t.storage_offset()
            new[id(t)] = torch.empty(0, dtype=t.dtype).set_(storage, first, t.size(), t.stride())
        return new[id(t)]

    with torch.no_grad():
        for module in model.modules():
            for name, p in module._parameters.items():
                if p is not None and (q := moved(p)) is not None:
                    p.data = q
            for name, b in module._buffers.items():
                if b is not None and (q := moved(b)) is not None:
                    module._buffers[name] = q
    _ARENAS.add(storage)  # the storage the moved tensors share
    return size


def _copy_into(arena: torch.Tensor, model: nn.Module, offsets: dict, small: dict) -> None:
    """The bytes of each storage of `small` at its offset in `arena` (a function, so no reference outlives it)."""
    copied = set()
    for t in _tensors(model):
        st = t.untyped_storage()
        ptr = st.data_ptr()
        if t.device.type == "cpu" and ptr in offsets and ptr not in copied:
            src = torch.empty(0, dtype=torch.uint8).set_(st, 0, (small[ptr],), (1,))
            arena[offsets[ptr]:offsets[ptr] + small[ptr]].copy_(src)
            copied.add(ptr)


def _any_huge(t: torch.Tensor) -> bool:
    try:
        return huge_bytes(t) > 0
    except OSError:
        return False


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
