"""A prefill-sized forward (2048 bf16 rows) of a 12B-wide weight-only layer (20480 x 5120), NVFP4 and FP8: the
kernel library's expansion of the packed rows (vl/kernels/gemv.py nvfp4_expand / fp8_expand) against the torch
dequantizers (VL_QUANT_KERNEL=off), alternated, at 1 and 2 threads.

    PYTHONPATH=. python scripts/research/prefill_expand_ab.py
"""

import os
import statistics
import time

import torch
import torch.nn as nn

from vl.quant.export import export_quantized
from vl.quant.linear import swap_quantized_linears


def main():
    torch.manual_seed(0)
    for algo in ("NVFP4", "FP8"):
        src = nn.Sequential(nn.Linear(5120, 20480, bias=False))
        sd, _ = export_quantized(src, algo, {"0": 1.0}, exclude_lm_head=False)
        q = nn.Sequential(nn.Linear(5120, 20480, bias=False))
        swap_quantized_linears(q, sd, "weight-only", compute_dtype=torch.bfloat16)
        x = torch.randn(1, 2048, 5120).bfloat16()
        for threads in (1, 2):
            torch.set_num_threads(threads)
            res = {}
            for r in range(3):
                for mode in (("auto", "off") if r % 2 == 0 else ("off", "auto")):
                    os.environ["VL_QUANT_KERNEL"] = mode
                    t = time.perf_counter()
                    with torch.no_grad():
                        q(x)
                    res.setdefault(mode, []).append(time.perf_counter() - t)
            a, o = statistics.median(res["auto"]), statistics.median(res["off"])
            print(f"{algo} 20480x5120, 2048 rows, {threads} thread(s): kernel expansion {a:.2f} s, torch dequantizers "
                  f"{o:.2f} s -> {o / a:.2f}x", flush=True)


if __name__ == "__main__":
    main()
