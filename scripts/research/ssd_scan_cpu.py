"""The C++ SSD scan (vl/kernels/csrc/ssd_scan.cpp) against the reference scan (vl/modeling/ssd_ref.py) on the 180m
config's Mamba layer shapes, then whole 2048-token prefills of the 180m config with each (docs/benchmarks.md, "SSD
scan in C++"): per-layer milliseconds and prefill tok/s, alternated, best and median of the rounds, and the
prefill logits' largest difference next to the reference's own against a 64-token chunking (exact maths, another
summation order: the noise floor).

    PYTHONPATH=. .venv/bin/python scripts/research/ssd_scan_cpu.py [--threads 1] [--dtype bf16|fp32] [--rounds 5]
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from vl.bench.run import CONFIGS, DTYPES, build_pair
from vl.bench.timing import our_prefill
from vl.kernels import ssd_scan as ssd_cpu
from vl.modeling import kernels, ssd_ref


def timed(fn) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def rounds(fns: dict, n: int) -> dict:
    for f in fns.values():
        f()
    out = {k: [] for k in fns}
    for _ in range(n):
        for k, f in fns.items():
            out[k].append(timed(f))
    return out


def line(label: str, times: dict, unit) -> str:
    return label + "  " + "  ".join(f"{k} best {unit(min(v))} median {unit(statistics.median(v))}"
                                    for k, v in times.items())


@torch.no_grad()
def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--dtype", default="bf16", choices=sorted(DTYPES))
    p.add_argument("--rounds", type=int, default=5)
    a = p.parse_args()
    torch.set_num_threads(a.threads)
    dtype = DTYPES[a.dtype]
    cfg = CONFIGS["180m"]()
    print(f"{a.threads} thread(s), {a.dtype}; {ssd_cpu.status()}")

    # one layer's scan inputs as the mixer passes them: strided views into the projection's output
    t, h, p_, g, n = 2048, cfg.mamba_num_heads, cfg.mamba_head_dim, cfg.n_groups, cfg.ssm_state_size
    gen = torch.Generator().manual_seed(0)
    xbc = torch.randn(1, t, h * p_ + 2 * g * n, generator=gen).to(dtype)
    x = xbc[..., :h * p_].reshape(1, t, h, p_)
    B = xbc[..., h * p_:h * p_ + g * n].reshape(1, t, g, n)
    C = xbc[..., h * p_ + g * n:].reshape(1, t, g, n)
    dt = torch.nn.functional.softplus(torch.randn(1, t, h, generator=gen) - 1)
    A = -(torch.rand(h, generator=gen) * 4 + 0.1)
    chunk = kernels.REF_CHUNK
    times = rounds({"reference": lambda: ssd_ref.ssd_chunked(x, dt, A, B, C, chunk),
                    "C++": lambda: ssd_cpu.ssd_chunked(x, dt, A, B, C, chunk)}, a.rounds)
    print(line("one Mamba layer's scan, ms:", times, lambda s: f"{s * 1e3:.1f}"))

    ours, hf = build_pair(cfg, dtype)
    del hf
    ids = torch.randint(3, cfg.vocab_size, (1, t), generator=torch.Generator().manual_seed(0))

    def with_ref():
        with kernels.override("ref"):
            our_prefill(ours, ids)

    times = rounds({"reference": with_ref, "C++": lambda: our_prefill(ours, ids)}, a.rounds)
    print(line(f"prefill of {t} tokens, tok/s:", times, lambda s: f"{t / s:.0f}"))

    got = ours(ids).logits.float()
    with kernels.override("ref"):
        want = ours(ids).logits.float()
        kernels.REF_CHUNK = 64
        other = ours(ids).logits.float()
        kernels.REF_CHUNK = chunk
    print(f"logits max |C++ - reference| {(got - want).abs().max():.3g}; reference at chunks 32 vs 64 "
          f"{(other - want).abs().max():.3g} (scale {want.abs().max():.3g})")


if __name__ == "__main__":
    main()
