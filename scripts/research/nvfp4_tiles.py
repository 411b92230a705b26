"""NVFP4 products of bf16 rows: the float32 loop (four rows per pass) against AMX tiles (32 rows per pass), by row
count, on one thread, the weights in L2 (one 3072 x 1024 layer) and streamed from memory (20 such layers, 31 MB),
and at the 12B widths (5120 -> 20480, 20480 -> 5120). Best of `--reps` calls of each; prints ms and G weights/s.

    PYTHONPATH=. .venv/bin/python scripts/research/nvfp4_tiles.py [--reps 20]
"""

from __future__ import annotations

import argparse
import time

import torch

from vl.kernels import gemv
from vl.quant.nvfp4 import quantize_nvfp4


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--reps", type=int, default=20)
    args = p.parse_args()
    torch.set_num_threads(1)
    k = gemv.kernel()
    if k is None or not k.packed_tiles:
        raise SystemExit(f"no AMX tiles for NVFP4 here ({gemv.status()})")
    print(gemv.status())
    torch.manual_seed(0)
    for name, n, kin, layers in [("L2, 3072 x 1024", 3072, 1024, 1), ("memory, 20 x 3072 x 1024", 3072, 1024, 20),
                                 ("12B up, 20480 x 5120", 20480, 5120, 1), ("12B down, 5120 x 20480", 5120, 20480, 1)]:
        ws = [quantize_nvfp4(torch.randn(n, kin) * 0.05) for _ in range(layers)]
        for rows in (1, 2, 4, 8, 16, 32):
            x = torch.randn(rows, kin).bfloat16()
            y = torch.empty(rows, n)
            best = {}
            for tiles, step in ((0, 4), (1, 32)):
                def once():
                    for w, bs, gs in ws:
                        for r in range(0, rows, step):
                            k.lib.vl_nvfp4_gemv(x[r].data_ptr(), min(step, rows - r), kin, w.data_ptr(),
                                                bs.data_ptr(), float(gs), n, 1, 1, tiles, y[r].data_ptr(), 1)
                once()
                t = []
                for _ in range(args.reps):
                    t0 = time.perf_counter()
                    once()
                    t.append(time.perf_counter() - t0)
                best[tiles] = min(t)
            gw = n * kin * layers / 1e9
            print(f"{name:28s} {rows:2d} rows: loop {best[0] * 1e3:7.2f} ms ({gw / best[0]:5.1f} G w/s), tiles "
                  f"{best[1] * 1e3:7.2f} ms ({gw / best[1]:5.1f} G w/s), loop / tiles {best[0] / best[1]:.2f}",
                  flush=True)


if __name__ == "__main__":
    main()
