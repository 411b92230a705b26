"""Resident memory of the GPU libraries in a CPU process before and after vl/runtime/gpu_libs.py's pass (KiB),
as one JSON line; tests/runtime/test_gpu_libs.py runs it too.

Run it alone: the kernel reclaims only pages that no other process maps, so a second Python process holding torch
(a test runner, a server) keeps them resident in this one too.

    .venv/bin/python scripts/research/gpu_libs_rss.py
"""

import json

import torch

from vl.runtime import gpu_libs


def gpu_rss_kib() -> int:
    """Resident KiB of this process's mappings of GPU libraries (/proc/self/smaps)."""
    total, cur = 0, False
    with open("/proc/self/smaps") as f:
        for line in f:
            head = line.split()
            if "-" in head[0] and len(head) >= 5 and ":" in head[3]:  # a mapping's header line
                cur = len(head) == 6 and gpu_libs.GPU_LIBRARY.search(head[5]) is not None
            elif line.startswith("Rss:") and cur:
                total += int(head[1])
    return total


def main():
    before = gpu_rss_kib()
    freed = gpu_libs.page_out()
    after = gpu_rss_kib()
    x = torch.randn(64, 64)
    ok = bool(torch.allclose(x @ torch.eye(64), x)) and not torch.cuda.is_available()  # torch's CPU ops still run
    print(json.dumps(dict(before=before, after=after, freed=freed, ok=ok)))


if __name__ == "__main__":
    main()
