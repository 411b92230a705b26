"""Give back the memory of GPU libraries that a process without a GPU mapped at `import torch` (Linux).

The CUDA builds of torch (the only ones with a matching torchvision on some machines) link cuBLAS, cuDNN, NVRTC,
nvJitLink, NCCL and their kin, and the dynamic loader maps them at `import torch` whether or not a GPU exists.
Relocating them and running their initialisers touches pages, and the kernel's fault-around maps more of each file
where it is already in the page cache, so a CPU process carries them: 140-220 MiB of resident memory on this
project's runner after `import torch, vl` (torch 2.14.1+cu130; 559-641 -> 417 MiB RSS with this pass), a fortieth to
a sixtieth of the ~9 GB budget of a 12B NVFP4 model on a 24 GB machine (docs/quant_cpu_kernels.md, "GPU libraries
in a CPU process").

`page_out()` asks the kernel to reclaim those mappings (`madvise(MADV_PAGEOUT)`, Linux >= 5.4) when torch sees no
CUDA device. Nothing is lost: clean file pages are read back from the library file if anything touches them again,
and the pages the loader modified (relocations: private, anonymous copies) are only ever swapped out, never
dropped, so without swap they simply stay. Where the kernel refuses (an older kernel, another OS), nothing changes.
`VL_GPU_LIBS_PAGEOUT=0` turns it off.
"""

from __future__ import annotations

import logging
import re

from vl.runtime.cpu.heap import linux_switch, madvise_libc

log = logging.getLogger(__name__)

MADV_PAGEOUT = 21
# site-packages/nvidia/* (the CUDA wheels torch depends on) and torch's own CUDA libraries
GPU_LIBRARY = re.compile(r"/site-packages/nvidia/|/torch/lib/lib[^/]*(cuda|nvrtc|cudnn|nccl)[^/]*\.so")


def gpu_mappings(maps: str) -> list[tuple[int, int, str]]:
    """(start, end, path) of each mapping in a /proc/PID/maps text whose file is a GPU library."""
    out = []
    for line in maps.splitlines():
        parts = line.split(None, 5)
        if len(parts) == 6 and GPU_LIBRARY.search(parts[5]):
            start, end = (int(x, 16) for x in parts[0].split("-"))
            out.append((start, end, parts[5].strip()))
    return out


def resident_kib() -> int:
    """Resident KiB of this process's mappings of GPU libraries (/proc/self/smaps; 0 where there is none)."""
    total, cur = 0, False
    try:
        with open("/proc/self/smaps") as f:
            for line in f:
                head = line.split()
                if "-" in head[0] and len(head) >= 5 and ":" in head[3]:  # a mapping's header line
                    cur = len(head) == 6 and GPU_LIBRARY.search(head[5]) is not None
                elif line.startswith("Rss:") and cur:
                    total += int(head[1])
    except OSError:
        return 0
    return total


def _rss_kib() -> int | None:
    try:
        with open("/proc/self/status") as f:
            return next(int(line.split()[1]) for line in f if line.startswith("VmRSS:"))
    except (OSError, StopIteration, ValueError):
        return None


def page_out() -> int | None:
    """Reclaim the GPU libraries' pages where no CUDA device is visible -> KiB of RSS given back (None: not done)."""
    if not linux_switch("VL_GPU_LIBS_PAGEOUT"):
        return None
    import torch

    if torch.cuda.is_available():
        return None
    lib = madvise_libc()
    try:
        with open("/proc/self/maps") as f:
            maps = gpu_mappings(f.read())
    except OSError:
        return None
    if lib is None or not maps:
        return None
    before = _rss_kib()
    refused = sum(lib.madvise(start, end - start, MADV_PAGEOUT) != 0 for start, end, _ in maps)
    after = _rss_kib()
    freed = max(0, before - after) if before is not None and after is not None else 0
    if refused == len(maps):
        log.info("vl: the kernel kept the GPU libraries' pages (madvise(MADV_PAGEOUT) refused)")
        return None
    log.info("vl: no CUDA device: gave back %.0f MiB of GPU library pages (%d mappings; VL_GPU_LIBS_PAGEOUT=0 keeps "
             "them)", freed / 1024, len(maps) - refused)
    return freed
