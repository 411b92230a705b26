"""Vision-tower CPU benchmark at the released size: our RADIO tower + projector against transformers' RadioModel.

A thin command over `vl/bench/vision.py` (what is timed, and how, is in its docstring): one dtype and one thread count
per process, so that run it once per row of the table in docs/benchmarks.md, "The vision tower on the CPU", e.g.

  flock /tmp/vl_heavy.lock .venv/bin/python scripts/bench_vision.py --dtype bf16 --threads 2 --rounds 5
  flock /tmp/vl_heavy.lock .venv/bin/python scripts/bench_vision.py --dtype fp32 --threads 1 --rounds 3 --page-tiles 0

A bf16 run takes ~4 minutes on 2 vCPUs (most of it the 13-tile page, encoded in micro-batches of 4 and as one batch);
fp32 about as long without the page. Peak memory: ~4 GB in bf16 (the fp32 tower for the accuracy row, then the bf16
tower, its packed weights and transformers' views of the same weights), ~7 GB in fp32.
"""

from __future__ import annotations

import argparse
import json
import sys

import torch

from vl.bench import llama_cpp_mtmd, vision


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--dtype", choices=("bf16", "fp32"), default="bf16")
    ap.add_argument("--threads", type=int, default=torch.get_num_threads())
    ap.add_argument("--rounds", type=int, default=5, help="interleaved rounds (median and best are reported)")
    ap.add_argument("--page-tiles", type=int, default=13, help="tiles of the page section; 0 skips it")
    ap.add_argument("--micro-batch", type=int, default=4, help="the page's micro-batch next to the whole page")
    ap.add_argument("--llama-cpp", metavar="DIR", help="a llama.cpp tree with libmtmd built: also time its encoder on "
                    "the same weights (vl/bench/llama_cpp_mtmd.py)")
    ap.add_argument("--llama-cpp-mmproj", default="f16", help="--llama-cpp: mmproj GGUF types, comma list of "
                    + ", ".join(llama_cpp_mtmd.OUTTYPES))
    ap.add_argument("--work-dir", help="--llama-cpp: where its files go (default: a temporary folder)")
    ap.add_argument("--json", help="also write the result here")
    args = ap.parse_args()
    dtype = {"bf16": torch.bfloat16, "fp32": torch.float32}[args.dtype]
    mtmd = llama_cpp_mtmd.Mtmd(args.llama_cpp) if args.llama_cpp else None
    types = tuple(t for t in args.llama_cpp_mmproj.split(",") if t)
    res = vision.run(dtype, threads=args.threads, rounds=args.rounds, page_tiles=args.page_tiles,
                     micro_batch=args.micro_batch, llama_cpp=mtmd, llama_cpp_types=types, work_dir=args.work_dir,
                     log=lambda m: print(m, file=sys.stderr, flush=True))
    print(vision.format_result(res))
    print(json.dumps(res))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(res, f, indent=1)


if __name__ == "__main__":
    main()
