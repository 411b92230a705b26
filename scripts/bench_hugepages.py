"""A/B of vl/runtime/cpu/hugepages.py: two copies of the `vl bench` 180m model in one process, one left on 4 KiB pages
(VL_HUGEPAGES=0 while it is built) and one on 2 MiB pages, decoded alternately (fused CPU step, 1 thread).

    PYTHONPATH=. .venv/bin/python scripts/bench_hugepages.py [--dtype fp32|bf16] [--rounds 5]
"""

import argparse
import os
import statistics

import torch

from vl.bench.run import build_pair
from vl.bench.timing import our_decode_s
from vl.config import bench_180m_lm


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--dtype", choices=("fp32", "bf16"), default="fp32")
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--new-tokens", type=int, default=32)
    a = p.parse_args()
    torch.set_num_threads(1)
    dtype = torch.float32 if a.dtype == "fp32" else torch.bfloat16
    models = {}
    for name, flag in (("4 KiB pages", "0"), ("2 MiB pages", "1")):
        os.environ["VL_HUGEPAGES"] = flag
        models[name] = build_pair(bench_180m_lm(), dtype)[0]
    ids = torch.randint(3, 16384, (1, 128), generator=torch.Generator().manual_seed(0))
    rates = {name: [] for name in models}
    for _ in range(a.rounds):
        for name, m in models.items():
            rates[name].append(1 / our_decode_s(m, ids, a.new_tokens))
    print(f"180m {a.dtype}, decode tok/s after 128, 1 thread, {a.rounds} alternating rounds; load {os.getloadavg()}")
    for name, v in rates.items():
        print(f"{name:12s} median {statistics.median(v):6.1f}   rounds {[round(x, 1) for x in v]}")


if __name__ == "__main__":
    main()
