"""Tiles per vision-tower call on the CPU: one page of 13 tiles (12 + thumbnail) through the released-size RADIO tower
and the 12B projector (random weights, `vl.bench.vision.build`), encoded in micro-batches of each size asked,
alternated round by round after a warm-up each; seconds per tile (median) and the process's peak RSS after each
size's first pass (sizes run in the order given, so put the smallest first to see each one's own growth).

    PYTHONPATH=. .venv/bin/python scripts/research/tower_micro_batch.py [--threads 2] [--sizes 4,8,16] [--rounds 3]
"""

from __future__ import annotations

import argparse
import resource
import statistics
import time

import torch

from vl.bench.vision import build


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--sizes", default="4,8,16")
    p.add_argument("--tiles", type=int, default=13)
    p.add_argument("--rounds", type=int, default=3)
    a = p.parse_args()
    torch.set_num_threads(a.threads)
    tower, proj, _, _, _ = build(torch.bfloat16)
    grid = (32, 32)
    page = torch.randn(a.tiles, 3, 512, 512, generator=torch.Generator().manual_seed(4)).bfloat16()
    sizes = [int(s) for s in a.sizes.split(",")]

    def encode(mb: int) -> None:
        for s in range(0, a.tiles, mb):
            proj(tower.forward_features(page[s:s + mb]), grid)

    times = {mb: [] for mb in sizes}
    with torch.inference_mode():
        for mb in sizes:
            encode(mb)
            print(f"micro-batch {mb}: peak RSS after its first pass "
                  f"{resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20:.2f} GiB", flush=True)
        for r in range(a.rounds):
            for mb in sizes[r % len(sizes):] + sizes[:r % len(sizes)]:
                t = time.perf_counter()
                encode(mb)
                times[mb].append((time.perf_counter() - t) / a.tiles)
    for mb, v in times.items():
        print(f"micro-batch {mb}: {statistics.median(v):.3f} s/tile (rounds {', '.join(f'{x:.3f}' for x in v)})")


if __name__ == "__main__":
    main()
