"""NVFP4 prompt products on AMX tiles against expanding the weights and a GEMM, at the widths prompts meet: Omni's
routed experts (1856 x 2688 and back: a 2048-token chunk gives each of 128 experts ~96 rows), Omni's Mamba input
projection (10304 x 2688) and the 12B MLP's up projection (20480 x 5120). For each row count: the bound layer call
as a quantized Linear makes it (`gemv.Kernel.nvfp4_layer`, tiles) and the expansion into bf16 (`nvfp4_expand`) plus
`torch.mm`, best of `--reps`, ms; the heap keeps freed memory as a loaded model's does (vl/runtime/cpu/heap.py).

    PYTHONPATH=. .venv/bin/python scripts/research/nvfp4_prompt_rows.py [--threads 1,2] [--reps 5] [--rows 64,512]

`--rev REV` times the kernel of an earlier commit in the same sitting (its vl/ checked out into a temporary
worktree, run in a subprocess), so the two columns come from one machine state.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

SHAPES = [("Omni expert up", 1856, 2688), ("Omni expert down", 2688, 1856), ("Omni Mamba in", 10304, 2688),
          ("12B MLP up", 20480, 5120)]
ROWS = (64, 96, 128, 256, 512)


def best(f, reps: int) -> float:
    f()
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        f()
        times.append(time.perf_counter() - t0)
    return min(times)


def measure(threads: list[int], reps: int, rows=ROWS) -> None:
    import torch

    from vl.kernels import gemv
    from vl.quant.nvfp4 import quantize_nvfp4
    from vl.runtime.cpu import heap

    heap.keep_freed_memory()
    k = gemv.kernel()
    if k is None or not k.packed_tiles:
        raise SystemExit(f"no AMX tiles for NVFP4 here ({gemv.status()})")
    print(gemv.status())
    torch.manual_seed(0)
    for th in threads:
        torch.set_num_threads(th)
        for name, n, kin in SHAPES:
            packed, bs, gs = quantize_nvfp4(torch.randn(n, kin) * 0.05)
            layer = k.nvfp4_layer(packed, bs, float(gs))
            cells = []
            for m in rows:
                x = torch.randn(m, kin).bfloat16()
                tiles = best(lambda: layer(x, True), reps)
                gemm = best(lambda: torch.mm(x, k.nvfp4_expand(packed, bs, float(gs), 0, n, torch.bfloat16).t()), reps)
                cells.append(f"{m}: {tiles * 1e3:.2f} / {gemm * 1e3:.2f}")
            print(f"{th} thread(s) {name:17s} {n}x{kin}  rows: tiles / expand+mm ms  " + "  ".join(cells), flush=True)


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--threads", default="1,2")
    p.add_argument("--reps", type=int, default=5)
    p.add_argument("--rows", default=",".join(map(str, ROWS)), help="row counts (comma-separated)")
    p.add_argument("--rev", help="also time this commit's kernel (a temporary worktree)")
    args = p.parse_args()
    threads = [int(t) for t in args.threads.split(",")]
    if args.rev:
        repo = Path(__file__).resolve().parents[2]
        with tempfile.TemporaryDirectory() as tmp:
            subprocess.run(["git", "-C", str(repo), "worktree", "add", "--detach", tmp, args.rev], check=True,
                           capture_output=True)
            try:
                print(f"== {args.rev}")
                subprocess.run([sys.executable, __file__, "--threads", args.threads, "--reps", str(args.reps), "--rows", args.rows],
                               env={**os.environ, "PYTHONPATH": tmp}, check=True)
            finally:
                subprocess.run(["git", "-C", str(repo), "worktree", "remove", "--force", tmp], check=True)
        print("== this checkout")
    measure(threads, args.reps, [int(r) for r in args.rows.split(",")])


if __name__ == "__main__":
    main()
