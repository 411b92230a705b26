"""Paired A/B timing of edits to the fused CPU decode step's C++ (docs/cpu_decode.md, "Prefetch into L2").

Builds the kernels as they are ("base") and once per --variant with text replacements applied, in temporary
copies of the package layout (the product's library is untouched), then decodes 32 tokens after a 128-token
prompt with the 180m `vl bench` config through `generate_steps`, every library once per round in a random order,
and prints per library the median tok/s and the median (min, max) of its round-by-round ratio to base: the
machine's speed drifts between rounds, the ratio within a round does not carry that drift.

    PYTHONPATH=. .venv/bin/python scripts/research/ab_decode_kernel.py --threads 1 --rounds 12 --formats bf16,nvfp4 \
        --variant 'T0:row_kernels.h:PREFETCH_BYTES, _MM_HINT_T1);=>PREFETCH_BYTES, _MM_HINT_T0);'

A variant is NAME:FILE:OLD=>NEW, several replacements in one FILE separated by '|'; every OLD must occur.
"""

from __future__ import annotations

import argparse
import random
import statistics
import tempfile
import time
from pathlib import Path

import torch

import functools

from vl.kernels import decode_step, loader
from vl.bench.run import CONFIGS, build_pair
from vl.bench.timing import our_decode_s
from vl.bench.quant import quantized_copy
from vl.runtime.cpu import decode as cpu_decode

from profile_decode_step import kernel_tree  # this folder (sys.path[0] when run as a script)


def build_variant(tmp: Path, fname: str, edits: str) -> decode_step.Library:
    kernels = kernel_tree(tmp)
    if edits:
        path = kernels / fname
        text = path.read_text()
        for edit in edits.split("|"):
            old, new = edit.split("=>")
            if old not in text:
                raise SystemExit(f"{fname}: {old!r} not found")
            text = text.replace(old, new)
        path.write_text(text)
    return decode_step.Library(loader.build(kernels / "decode_step.cpp"), functions=decode_step.FUNCTIONS)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--rounds", type=int, default=12)
    ap.add_argument("--formats", default="bf16", help="comma list of bf16, fp32, fp8, nvfp4 (fp8 / nvfp4: weight-only "
                    "copies of the bf16 model)")
    ap.add_argument("--variant", action="append", default=[], help="NAME:FILE:OLD=>NEW[|OLD=>NEW...]")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    with tempfile.TemporaryDirectory() as tmp:
        libs = {}
        for i, spec in enumerate(["base::"] + args.variant):
            name, fname, edits = spec.split(":", 2)
            libs[name] = build_variant(Path(tmp) / str(i), fname, edits)
        cfg = CONFIGS["180m"]()
        bf16, _ = build_pair(cfg, torch.bfloat16)
        calib = torch.randint(3, cfg.vocab_size, (1, 64), generator=torch.Generator().manual_seed(1))
        formats = args.formats.split(",")
        models = {f: bf16 if f == "bf16" else build_pair(cfg, torch.float32)[0] if f == "fp32"
                  else quantized_copy(bf16, f, calib) for f in formats}
        ids = torch.randint(3, cfg.vocab_size, (1, 128), generator=torch.Generator().manual_seed(2))
        tok_s = {(m, n): [] for m in models for n in libs}
        real_load = cpu_decode._load
        try:
            for _ in range(args.rounds):
                for m, model in models.items():
                    order = list(libs.items())
                    random.shuffle(order)
                    for n, lib in order:
                        cpu_decode._load = lambda mode, lib=lib: (lib, "")
                        tok_s[(m, n)].append(1 / our_decode_s(model, ids, 32))
        finally:
            cpu_decode._load = real_load
    print(f"180m, {args.threads} thread(s), {args.rounds} rounds, {time.strftime('%F %T %Z')}")
    for m in models:
        for n in libs:
            r = [x / b for x, b in zip(tok_s[(m, n)], tok_s[(m, "base")])]
            print(f"{m:6s} {n:12s} {statistics.median(tok_s[(m, n)]):7.1f} tok/s   paired vs base "
                  f"{statistics.median(r):.3f} ({min(r):.3f}-{max(r):.3f})")


if __name__ == "__main__":
    main()
