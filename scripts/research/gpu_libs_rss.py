"""Resident memory of the GPU libraries in a CPU process before and after vl/runtime/gpu_libs.py's pass (KiB).

Run it alone: the kernel reclaims only pages that no other process maps, so a second Python process holding torch
(a test runner, a server) keeps them resident in this one too.

    .venv/bin/python scripts/research/gpu_libs_rss.py
"""

import json, torch
from vl.runtime import gpu_libs
def gpu_rss_kib():
    total, cur = 0, False
    for line in open("/proc/self/smaps"):
        head = line.split()
        if "-" in head[0] and len(head) >= 5 and ":" in head[3]:
            cur = len(head) == 6 and gpu_libs.GPU_LIBRARY.search(head[5]) is not None
        elif line.startswith("Rss:") and cur:
            total += int(head[1])
    return total
before = gpu_rss_kib()
freed = gpu_libs.page_out()
after = gpu_rss_kib()
x = torch.randn(64, 64)
ok = bool(torch.allclose(x @ torch.eye(64), x)) and not torch.cuda.is_available()
print(json.dumps(dict(before=before, after=after, freed=freed, ok=ok)))
