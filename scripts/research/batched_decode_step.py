"""Time the fused CPU decode step (vl/runtime/cpu/decode.py) at 1, 4 and 8 rows on the 180m config, in bf16 and as
NVFP4 weight-only (`vl quantize`'s format, loaded as a user's load does), for one optimisation level of its build.

    PYTHONPATH=. .venv/bin/python scripts/research/batched_decode_step.py [--opt O2|O3] [--steps 40]

Random weights (std 0.02), a 64-token prompt per row prefilled through the modules, then `--steps` fused steps;
prints the median step time and tokens/s per row count. `--opt` rebuilds the step at that level (its own cache
entry) so that the two can be compared on one machine (docs/cpu_decode.md, "Build time"). One thread."""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from vl.config import bench_180m_lm
from vl.modeling.nemotron_h import NemotronHForCausalLM
from vl.kernels import loader as native
from vl.bench.quant import quantized_copy
from vl.runtime.cpu import decode as cpu_decode
from vl.runtime.cache import HybridCache


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--opt", choices=["O2", "O3"], default="O3", help="g++ optimisation level of the step (O3: the default)")
    p.add_argument("--steps", type=int, default=40)
    args = p.parse_args()
    torch.set_num_threads(1)
    flags = native._flags
    native._flags = lambda portable, defines=(): [f"-{args.opt}"] + flags(portable, defines)[1:]
    cpu_decode._load.cache_clear()
    lib = cpu_decode.library()
    if lib is None:
        print(f"the fused step is not used here: {cpu_decode.status()}")
        return 1
    torch.manual_seed(0)
    cfg = bench_180m_lm()
    lm = NemotronHForCausalLM(cfg).eval()
    with torch.no_grad():
        for _, w in lm.named_parameters():
            if w.dim() > 1:
                w.normal_(0, 0.02)
    lm = lm.to(torch.bfloat16)
    models = {"bf16": lm, "nvfp4": quantized_copy(lm, "nvfp4", torch.randint(3, cfg.vocab_size, (1, 64)))}
    for name, model in models.items():
        for rows in (1, 4, 8):
            ids = torch.randint(3, cfg.vocab_size, (rows, 64))
            cache = HybridCache(model.config, rows, 64 + args.steps + 1, dtype=torch.bfloat16)
            times = []
            with torch.no_grad():
                model(ids, cache=cache, logits_to_keep=1)
                tok = ids[:, -1:]
                for _ in range(args.steps):
                    t0 = time.perf_counter()
                    cpu_decode.run_step(model, lib, tok, cache)
                    times.append(time.perf_counter() - t0)
            med = statistics.median(times[min(5, len(times) - 1):])
            print(f"-{args.opt} {name:5s} {rows} rows: {med * 1e3:6.2f} ms/step, {rows / med:6.0f} tok/s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
