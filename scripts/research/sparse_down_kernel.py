"""The by-input-rows product alone (docs/cpu_decode.md, "ReLU^2 zeros: down_proj stored by input rows"): 1024 x 3072
layers (the 180m down_proj) past the caches (720 MiB in all), one activation row, through the CPU kernel of
vl/kernels/gemv.py: the row-major dense GEMV ("dense"), the by-rows kernel on an input with half its entries zero
("t_sparse": relu of a normal draw) and on one with none ("t_full"); 5 interleaved rounds, medians.

    PYTHONPATH=. .venv/bin/python scripts/research/sparse_down_kernel.py bf16|fp32 THREADS [LAYERS]
"""

import statistics
import sys
import time

import torch

from vl.kernels import gemv as cpu_gemv

torch.set_num_threads(int(sys.argv[2]))
k = cpu_gemv.kernel()
dt = {"fp32": torch.float32, "bf16": torch.bfloat16}[sys.argv[1]]
L, N, K = int(sys.argv[3]) if len(sys.argv) > 3 else (60 if dt == torch.float32 else 120), 1024, 3072
ws = [torch.randn(N, K).to(dt) for _ in range(L)]
wts = [w.t().contiguous() for w in ws]
x = torch.randn(1, K).relu()
xd = x.to(dt) if dt == torch.bfloat16 else x
full = torch.randn(1, K)
runs = {"dense": lambda: [k.dense(xd, w) for w in ws], "t_sparse": lambda: [k.dense_t(x, w) for w in wts],
        "t_full": lambda: [k.dense_t(full, w) for w in wts]}
res = {name: [] for name in runs}
for _ in range(5):
    for name, f in runs.items():
        t0 = time.perf_counter()
        f()
        res[name].append(time.perf_counter() - t0)
nbytes = L * N * K * ws[0].element_size()
for name, v in res.items():
    print(f"{sys.argv[1]} {sys.argv[2]}t {name}: {statistics.median(v) * 1e3:.1f} ms for {nbytes / 2**20:.0f} MiB = "
          f"{nbytes / statistics.median(v) / 1e9:.1f} GB/s-equivalent")
