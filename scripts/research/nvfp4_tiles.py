"""NVFP4 products of bf16 rows: the float32 loop (four rows per pass) against AMX tiles (all rows in one call, and
past 64 rows also in calls of 64), by row count, on one thread, the weights in L2 (one 3072 x 1024 layer) and
streamed from memory (20 such layers, 31 MB), and at the 12B widths (5120 -> 20480, 20480 -> 5120, up to 2048
rows), where prompt-sized row counts also time what a layer does past `gemv.TILE_MAX_ROWS` rows: the weights
expanded to bf16 2048 rows at a time, then a GEMM. Best of `--reps` calls of each (2 past 256 rows); prints ms,
G weights/s and TFLOP/s.

    PYTHONPATH=. .venv/bin/python scripts/research/nvfp4_tiles.py [--reps 20]
"""

from __future__ import annotations

import argparse
import time

import torch

from vl.kernels import gemm, gemv
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
    SLAB = 64  # one kernel call per 64 rows: how prompts took the tiles before the kernel took all rows at once
    torch.manual_seed(0)
    for name, n, kin, layers in [("L2, 3072 x 1024", 3072, 1024, 1), ("memory, 20 x 3072 x 1024", 3072, 1024, 20),
                                 ("12B up, 20480 x 5120", 20480, 5120, 1), ("12B down, 5120 x 20480", 5120, 20480, 1)]:
        ws = [quantize_nvfp4(torch.randn(n, kin) * 0.05) for _ in range(layers)]
        wide = layers == 1 and n * kin > 1 << 24
        for rows in (1, 2, 4, 8, 16, 32) + ((64, 128, 256, 512, 1024, 2048) if wide else ()):
            x = torch.randn(rows, kin).bfloat16()
            y = torch.empty(rows, n)
            best = {}
            for tiles, step in ((0, gemv.KERNEL_ROWS), (1, rows), (2, SLAB)):
                if (tiles == 0 and rows > 256) or (tiles == 2 and rows <= SLAB):
                    continue
                def once():
                    for w, bs, gs in ws:
                        for r in range(0, rows, step):
                            k.lib.vl_nvfp4_gemv(x[r].data_ptr(), min(step, rows - r), kin, w.data_ptr(),
                                                bs.data_ptr(), float(gs), n, 1, 1, min(tiles, 1),
                                                y[r].data_ptr(), 1)
                best[tiles] = timed(once, args.reps if rows <= 256 else 2)
            line = f"{name:28s} {rows:4d} rows: tiles {best[1] * 1e3:7.2f} ms ({n * kin * layers / 1e9 / best[1]:5.1f} G w/s"
            line += f", {2 * rows * n * kin * layers / 1e12 / best[1]:4.2f} TFLOP/s)"
            if 0 in best:
                line += f", loop {best[0] * 1e3:7.2f} ms, loop / tiles {best[0] / best[1]:5.2f}"
            if 2 in best:
                line += f", tiles {SLAB} rows per call {best[2] * 1e3:7.2f} ms"
            if wide and rows >= 16:
                w, bs, gs = ws[0]

                def expand():
                    for r0 in range(0, n, 2048):
                        r1 = min(n, r0 + 2048)
                        y[:, r0:r1] = gemm.linear(x, k.nvfp4_expand(w, bs, float(gs), r0, r1, torch.bfloat16), None)
                line += f", expand + GEMM {timed(expand, 3 if rows <= 256 else 2) * 1e3:7.2f} ms"
            print(line, flush=True)


def timed(fn, reps: int) -> float:
    fn()
    t = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        t.append(time.perf_counter() - t0)
    return min(t)

if __name__ == "__main__":
    main()
