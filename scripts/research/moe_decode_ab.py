"""Decode at Nemotron 3 Nano Omni's LLM widths (30B-A3B MoE, random NVFP4 weights, routed experts packed): the fused
C++ step against the modules, alternated in one process, at 1 and 2 threads, each as a fraction of the copy
kernel's bandwidth for the bytes one step reads (vl/bench/geometry.py decode_bytes: top-k routed experts only).

    PYTHONPATH=. python scripts/research/moe_decode_ab.py --layers 52 --rounds 4 --dir /tmp/omni52

The checkpoint is written once into --dir (17.5 GiB at 52 layers) and reused by later runs.
"""

import argparse
import statistics
from pathlib import Path

import torch

from vl.bench import geometry
from vl.bench.timing import our_decode_s
from vl.runtime.cpu import decode as cpu_decode


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--layers", type=int, default=52)
    p.add_argument("--rounds", type=int, default=4)
    p.add_argument("--tokens", type=int, default=16)
    p.add_argument("--dir", required=True, help="where the random checkpoint is written (or found)")
    a = p.parse_args()
    out = Path(a.dir)
    cfg = geometry.geometry_config("nano-omni-30b-a3b", a.layers)
    if not (out / "config.json").exists():
        geometry.write_random_checkpoint(cfg, "nvfp4", out)
    model = geometry.load(out, cfg)
    print("fused step:", cpu_decode.unsupported(model) or cpu_decode.status())
    nbytes = geometry.decode_bytes(model)
    print(f"pattern {cfg.pattern}; read per step {nbytes / 1e9:.3f} GB", flush=True)
    ids = torch.randint(3, cfg.vocab_size, (1, a.tokens), generator=torch.Generator().manual_seed(0))
    times = {}
    for n in (1, 2):
        torch.set_num_threads(n)
        bw = geometry.copy_bandwidth(1 << 29) / 1e9
        for r in range(a.rounds):
            for mode in (("fused", "modules") if r % 2 == 0 else ("modules", "fused")):
                our_decode_s(model, ids[:, :1], 1, decode=mode)  # untimed: binds the kernels
                times.setdefault((n, mode), []).append(our_decode_s(model, ids, a.tokens, decode=mode))
        for mode in ("modules", "fused"):
            s = statistics.median(times[(n, mode)])
            print(f"threads {n} {mode:8s}: {s * 1e3:.1f} ms/token, {1 / s:.2f} tok/s, {nbytes / s / 1e9:.2f} GB/s = "
                  f"{nbytes / s / 1e9 / bw:.0%} of copy {bw:.1f} GB/s  {[round(t * 1e3, 1) for t in times[(n, mode)]]}",
                  flush=True)


if __name__ == "__main__":
    main()
