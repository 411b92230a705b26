"""Resident memory of the GPU libraries in a CPU process before and after vl/runtime/cpu/gpu_libs.py's pass (KiB),
as one JSON line (tests/runtime/cpu/test_gpu_libs.py runs the same steps in a fresh process).

Run it alone: the kernel reclaims only pages that no other process maps, so a second Python process holding torch
(a test runner, a server) keeps them resident in this one too.

    .venv/bin/python scripts/research/gpu_libs_rss.py
"""

import json

import torch

from vl.runtime.cpu import gpu_libs


def main():
    before = gpu_libs.resident_kib()
    freed = gpu_libs.page_out()
    after = gpu_libs.resident_kib()
    x = torch.randn(64, 64)
    ok = bool(torch.allclose(x @ torch.eye(64), x)) and not torch.cuda.is_available()  # torch's CPU ops still run
    print(json.dumps(dict(before=before, after=after, freed=freed, ok=ok)))


if __name__ == "__main__":
    main()
