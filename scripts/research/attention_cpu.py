"""The towers' attention alone: vl/kernels/attention.py (AMX tiles) against torch's scaled_dot_product_attention on
the same bf16 tensors, one head layout (16 heads of 80 channels: RADIO ViT-H) at several token counts, interleaved
rounds, median ms and TFLOP/s (4 L^2 D per head). 1032 tokens is a 512-px tile (1024 patches + 8 prefix rows); Omni's
native-resolution images reach 13,312 patches.

    PYTHONPATH=. .venv/bin/python scripts/research/attention_cpu.py [--threads 2] [--tokens 1032,2056,4104,13320]
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch
import torch.nn.functional as F

from vl.kernels import attention


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--tokens", default="1032,2056,4104,13320")
    p.add_argument("--heads", type=int, default=16)
    p.add_argument("--channels", type=int, default=80)
    p.add_argument("--rounds", type=int, default=5)
    a = p.parse_args()
    torch.set_num_threads(a.threads)
    print(f"{attention.status()}; {a.threads} threads; {a.heads} heads of {a.channels}")
    for length in (int(t) for t in a.tokens.split(",")):
        qkv = torch.randn(1, length, 3, a.heads, a.channels, generator=torch.Generator().manual_seed(0)).bfloat16()
        q, k, v = qkv.unbind(2)
        fns = {"ours": lambda: attention.attention(q, k, v),
               "sdpa": lambda: F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2),
                                                              v.transpose(1, 2))}
        rounds = a.rounds if length <= 4200 else max(2, a.rounds // 2)
        times = {k: [] for k in fns}
        for _ in range(rounds):
            for name, f in fns.items():
                t = time.perf_counter()
                f()
                times[name].append(time.perf_counter() - t)
        flop = 4 * a.heads * length * length * a.channels
        med = {k: statistics.median(v) for k, v in times.items()}
        print(f"{length} tokens: ours {med['ours'] * 1e3:.1f} ms ({flop / med['ours'] / 1e12:.2f} TFLOP/s), sdpa "
              f"{med['sdpa'] * 1e3:.1f} ms ({flop / med['sdpa'] / 1e12:.2f}): {med['sdpa'] / med['ours']:.2f}x")


if __name__ == "__main__":
    main()
