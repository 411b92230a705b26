"""The Python between two fused CPU decode steps, warm and after a weight stream (docs/cpu_decode.md, "The Python
between steps").

Greedy decode of the 180m `vl bench` config in bf16 through `generate_steps` (the loop `Engine` runs), with the
C++ step replaced by a stand-in that either returns at once ("warm": Python's code and objects stay in the
caches) or first streams a 400 MB buffer through them as the real step streams the weights ("cold"), then with the
real step. Prints per token: wall time, time inside the step's ctypes call, and the rest (the Python around it).

    PYTHONPATH=. .venv/bin/python scripts/research/decode_python_gap.py [--threads 1] [--tokens 64]
"""

from __future__ import annotations

import argparse
import time

import torch

from vl.bench.run import CONFIGS, build_pair
from vl.bench.timing import our_decode_s
from vl.runtime.cpu import decode as cpu_decode


class Timed:
    """Stands in for the library's ctypes function: times the call, or runs `body` instead of the step."""

    def __init__(self, real, body=None):
        self.real, self.body, self.s = real, body, 0.0

    def __call__(self, *args):
        t = time.perf_counter()
        r = self.body() if self.body is not None else self.real(*args)
        self.s += time.perf_counter() - t
        return 0 if self.body is not None else r


class Lib:  # the attributes run_step reads from `Library.lib`
    def __init__(self, fn):
        self.vl_decode_step = fn


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--tokens", type=int, default=64)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    cfg = CONFIGS["180m"]()
    model, _ = build_pair(cfg, torch.bfloat16)
    ids = torch.randint(3, cfg.vocab_size, (1, 128), generator=torch.Generator().manual_seed(2))
    lib = cpu_decode.library()
    if lib is None:
        raise SystemExit(f"the fused step is not available here: {cpu_decode.status()}")
    real, junk = lib.lib, torch.empty(400 << 20, dtype=torch.uint8)
    stand_ins = {"warm (no step)": lambda: None, "cold (400 MB streamed)": lambda: junk.add_(1),
                 "the real step": None}
    print(f"180m bf16, {args.threads} thread(s), {args.tokens} tokens after 128, ms per token "
          f"({time.strftime('%F %T %Z')}); the stand-ins' logits are uninitialised: their tokens are meaningless")
    try:
        for name, body in stand_ins.items():
            fn = Timed(real.vl_decode_step, body)
            lib.lib = Lib(fn)
            our_decode_s(model, ids, 4)
            fn.s = 0.0
            s = our_decode_s(model, ids, args.tokens)
            step = fn.s / args.tokens  # one call per token after the first, which the prefill gives
            print(f"{name:24s} wall {1e3 * s:7.3f}  in the call {1e3 * step:7.3f}  Python around it "
                  f"{1e3 * (s - step):6.3f}")
    finally:
        lib.lib = real


if __name__ == "__main__":
    main()
