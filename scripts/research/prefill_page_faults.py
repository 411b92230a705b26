"""Page faults and time of a 2048-token prefill of the 180m config, as `vl bench` builds it (our model and
transformers' twin in one process), with glibc's defaults or with `vl.runtime.cpu.heap.keep_freed_memory` (the
default after a load; docs/benchmarks.md, "Prefill temporaries").

    PYTHONPATH=. .venv/bin/python scripts/research/prefill_page_faults.py [--dtype bf16|fp32] [--runs 3]
    VL_HEAP_KEEP=0 PYTHONPATH=. .venv/bin/python scripts/research/prefill_page_faults.py   # glibc's defaults

The setting is process-wide, so compare separate runs of this script, alternated. One thread."""

from __future__ import annotations

import argparse
import resource
import time

import torch

from vl.bench.run import CONFIGS, DTYPES, build_pair
from vl.bench.timing import our_prefill
from vl.kernels import switches


def minor_faults() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--dtype", default="bf16", choices=sorted(DTYPES))
    p.add_argument("--runs", type=int, default=3)
    p.add_argument("--tokens", type=int, default=2048)
    a = p.parse_args()
    torch.set_num_threads(1)
    ours, _ = build_pair(CONFIGS["180m"](), DTYPES[a.dtype])
    ids = torch.randint(3, 16384, (1, a.tokens), generator=torch.Generator().manual_seed(0))
    our_prefill(ours, ids)  # warm-up
    print(f"VL_HEAP_KEEP={switches.get('VL_HEAP_KEEP')}, {a.dtype}, {a.tokens} tokens, 1 thread")
    for _ in range(a.runs):
        f0, t0 = minor_faults(), time.perf_counter()
        our_prefill(ours, ids)
        print(f"prefill {time.perf_counter() - t0:.3f} s, {minor_faults() - f0} page faults")


if __name__ == "__main__":
    main()
