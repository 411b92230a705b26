"""Time and page faults of a page-sized prefill at the 12B widths: the first 8 layers of the 12B geometry in NVFP4
or FP8 (`--format`; written once into DIR, as `scripts/bench_server.py --build nano-12b-v2-vl --layers 8` writes
them), loaded as a user's load does, one prompt of `--tokens` tokens prefilled `--runs` times, on the main thread
or on a thread of its own (`--thread`: where `vl serve` and the app run a request). The heap setting is
process-wide, so compare separate runs of this script, alternated (docs/benchmarks.md, "Prefill temporaries").

    PYTHONPATH=. .venv/bin/python scripts/research/prefill_heap_12b.py DIR [--tokens 3367] [--threads 2] [--thread]
                                                                          [--format fp8] [--chunk 2048]
    VL_HEAP_KEEP=0 PYTHONPATH=. .venv/bin/python scripts/research/prefill_heap_12b.py DIR   # glibc's defaults
"""

from __future__ import annotations

import argparse
import resource
import sys
import threading
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # scripts/ for bench_server.build_lm


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("dir", type=Path)
    p.add_argument("--tokens", type=int, default=3367)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--runs", type=int, default=3)
    p.add_argument("--format", choices=("nvfp4", "fp8"), default="nvfp4", help="of a DIR written here")
    p.add_argument("--chunk", type=int, default=0, help="prefill in calls of this many tokens, as the engine does "
                   "(vl/runtime/decode_batch.py; 2048 on the CPU); 0: one call")
    p.add_argument("--thread", action="store_true", help="prefill on a thread of its own, not the main thread")
    a = p.parse_args()
    import vl
    from bench_server import build_lm
    from vl.kernels import switches
    from vl.runtime.cache import HybridCache

    if not (a.dir / "config.json").exists():
        build_lm("nano-12b-v2-vl", a.dir, 8, a.format)
    torch.set_num_threads(a.threads)
    lm = vl.load_pretrained(str(a.dir))
    cfg = lm.config
    ids = torch.randint(3, cfg.vocab_size, (1, a.tokens), generator=torch.Generator().manual_seed(0))
    print(f"VL_HEAP_KEEP={switches.get('VL_HEAP_KEEP')}, {a.tokens} tokens (calls of {a.chunk or a.tokens}), "
          f"{a.threads} threads, {'own thread' if a.thread else 'main thread'}", flush=True)

    def run():
        with torch.no_grad():
            lm(ids[:, :256], cache=HybridCache(cfg, 1, a.tokens + 8, dtype=torch.bfloat16), logits_to_keep=1)
            for _ in range(a.runs):
                f0, t0 = resource.getrusage(resource.RUSAGE_SELF).ru_minflt, time.perf_counter()
                cache = HybridCache(cfg, 1, a.tokens + 8, dtype=torch.bfloat16)
                step = a.chunk or a.tokens
                for start in range(0, a.tokens, step):
                    last = start + step >= a.tokens
                    lm(ids[:, start:start + step], cache=cache, logits_to_keep=1, cache_only=not last)
                faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt - f0
                print(f"prefill: {time.perf_counter() - t0:.2f} s, {faults} minor faults", flush=True)

    if a.thread:
        th = threading.Thread(target=run)
        th.start()
        th.join()
    else:
        run()
    print(f"peak RSS {resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20:.2f} GiB")


if __name__ == "__main__":
    main()
