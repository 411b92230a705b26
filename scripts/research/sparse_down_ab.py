"""Paired A/B of the ReLU^2 down_proj layout (docs/cpu_decode.md, "ReLU^2 zeros: down_proj stored by input rows").

Builds the 180m `vl bench` config twice with the same random weights, both through `runtime_passes` as
`vl.load_pretrained` does: "rows" as loaded by default (down_proj stored (K, N), the fused step skips the weight rows
of zero inputs) and "plain" with `VL_SPARSE_DOWN=0`.

Default: prints the fraction of exact zeros in the down_proj inputs, then decodes 32 tokens after a 128-token prompt
through `generate_steps` with each, alternating which goes first, and prints the median ms per token of each and the
median (min, max) of the rounds' own plain/rows ratios. `--batch`: B rows (1, 8, 32) of 32-token prompts prefilled
by the modules, then 3 fused steps per measurement, 6 alternating rounds; prints the median ms per step of each.

    PYTHONPATH=. .venv/bin/python scripts/research/sparse_down_ab.py --dtype fp32 --threads 1 --rounds 10 [--batch]
"""

from __future__ import annotations

import argparse
import copy
import os
import statistics
import time

import torch

from vl.bench.timing import our_decode_s
from vl.config import bench_180m_lm
from vl.modeling.nemotron_h import NemotronHForCausalLM
from vl.runtime.cpu import decode as cpu_decode
from vl.runtime.cache import HybridCache
from vl.runtime.cpu.matmul import transposed
from vl.runtime.pretrained import runtime_passes


def build(dtype, sparse: bool, base):
    os.environ["VL_SPARSE_DOWN"] = "1" if sparse else "0"
    try:
        return runtime_passes(copy.deepcopy(base).to(dtype))  # each copy gets its own huge pages
    finally:
        os.environ.pop("VL_SPARSE_DOWN")


def single_rows(plain, rows, rounds: int, label: str) -> None:
    mlps = [b.mixer for b in rows.backbone.layers if b.kind == "-"]
    print(f"down_proj stored by rows: {sum(transposed(m.down_proj.weight) for m in mlps)} of {len(mlps)}")
    ids = torch.randint(3, rows.config.vocab_size, (1, 128), generator=torch.Generator().manual_seed(0))
    zeros = []
    hooks = [m.down_proj.register_forward_hook(lambda mod, i, o: zeros.append((i[0][0, -1] == 0).float().mean()))
             for m in mlps]
    with torch.no_grad():
        rows(ids)
    for h in hooks:
        h.remove()
    print("zero fraction of the down_proj inputs at the last prompt position, per layer:",
          " ".join(f"{float(z):.3f}" for z in zeros))
    t = {"plain": [], "rows": []}
    for r in range(rounds):
        order = [("plain", plain), ("rows", rows)] if r % 2 == 0 else [("rows", rows), ("plain", plain)]
        for name, m in order:
            t[name].append(our_decode_s(m, ids, 32, "fused"))
    ratios = sorted(x / y for x, y in zip(t["plain"], t["rows"]))
    ms = {k: 1e3 * statistics.median(v) for k, v in t.items()}
    print(f"{label}, {rounds} rounds: ms per token plain {ms['plain']:.2f}, rows {ms['rows']:.2f}; plain/rows per "
          f"round: median {statistics.median(ratios):.3f} ({ratios[0]:.3f}-{ratios[-1]:.3f})")


def batched(models: dict, dtype, label: str) -> None:
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
        ms = {k: 1e3 * statistics.median(v) for k, v in t.items()}
        print(f"{label} B={b}: plain {ms['plain']:.1f} ms, rows {ms['rows']:.1f} ms per step")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--dtype", choices=("fp32", "bf16"), default="fp32")
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--rounds", type=int, default=10)
    p.add_argument("--batch", action="store_true", help="time fused steps of 1, 8 and 32 rows instead")
    a = p.parse_args()
    torch.set_num_threads(a.threads)
    dtype = {"fp32": torch.float32, "bf16": torch.bfloat16}[a.dtype]
    torch.manual_seed(0)
    base = NemotronHForCausalLM(bench_180m_lm()).eval()
    with torch.no_grad():
        for p_ in base.parameters():
            if p_.dim() > 1:
                p_.normal_(0, 0.02)  # as vl bench's build_pair
    plain, rows = build(dtype, False, base), build(dtype, True, base)
    label = f"{a.dtype}, {a.threads} thread(s)"
    if a.batch:
        batched({"plain": plain, "rows": rows}, dtype, label)
    else:
        single_rows(plain, rows, a.rounds, label)


if __name__ == "__main__":
    main()
