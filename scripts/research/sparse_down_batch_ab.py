"""The ReLU^2 down_proj layout on batched fused steps (docs/cpu_decode.md, "ReLU^2 zeros: down_proj stored by input
rows"): the 180m config built twice through `runtime_passes`, "plain" (`VL_SPARSE_DOWN=0`) and "rows" (the default),
B rows of 32-token prompts prefilled by the modules, then 3 fused steps per measurement, 6 alternating rounds; prints
the median ms per step of each for B = 1, 8, 32. One thread.

    PYTHONPATH=. .venv/bin/python scripts/research/sparse_down_batch_ab.py bf16|fp32
"""

from __future__ import annotations

import copy
import os
import statistics
import sys
import time

import torch

from vl.config import bench_180m_lm
from vl.modeling.nemotron_h import NemotronHForCausalLM
from vl.runtime import cpu_decode
from vl.runtime.cache import HybridCache
from vl.runtime.pretrained import runtime_passes


def main() -> None:
    dtype = {"bf16": torch.bfloat16, "fp32": torch.float32}[sys.argv[1] if len(sys.argv) > 1 else "bf16"]
    torch.set_num_threads(1)
    torch.manual_seed(0)
    base = NemotronHForCausalLM(bench_180m_lm()).eval()
    with torch.no_grad():
        for p in base.parameters():
            if p.dim() > 1:
                p.normal_(0, 0.02)

    def build(flag):
        os.environ["VL_SPARSE_DOWN"] = flag
        try:
            return runtime_passes(copy.deepcopy(base).to(dtype))
        finally:
            os.environ.pop("VL_SPARSE_DOWN")

    models = {"plain": build("0"), "rows": build("1")}
    lib = cpu_decode.library()
    for b in (1, 8, 32):
        ids = torch.randint(3, 16384, (b, 32))
        caches = {}
        for name, m in models.items():
            caches[name] = HybridCache(m.config, b, 64, dtype=dtype)
            with torch.no_grad():
                m(ids, cache=caches[name], logits_to_keep=1)
        t = {"plain": [], "rows": []}
        for r in range(6):
            for name in ("plain", "rows") if r % 2 == 0 else ("rows", "plain"):
                t0 = time.perf_counter()
                for _ in range(3):
                    cpu_decode.run_step(models[name], lib, ids[:, -1:], caches[name])
                t[name].append((time.perf_counter() - t0) / 3)
        print(f"{sys.argv[1] if len(sys.argv) > 1 else 'bf16'} B={b}: plain {1e3 * statistics.median(t['plain']):.1f} ms, "
              f"rows {1e3 * statistics.median(t['rows']):.1f} ms per step")


if __name__ == "__main__":
    main()
