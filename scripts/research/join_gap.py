"""The running rows' step while a long prompt joins a `DecodeBatch` (vl/runtime/decode_batch.py), in-process, on
the 180m config (bf16 or `--nvfp4`, random weights std 0.02, the load passes applied): the chunk riding along with
the fused step (the default) against the chunk and the step as two calls (`--two-calls`, the path before the ride).

    PYTHONPATH=. .venv/bin/python scripts/research/join_gap.py [--rows 7] [--join 1024] [--chunks default,8,16]
        [--two-calls] [--nvfp4] [--step-costs]

For each chunk size: `--rows` rows join at once and step 3 times, 10 usual steps are timed, then a `--join`-token
prompt joins and every step until its first token is timed; prints the medians, p95, their ratios and how long the
join took. `--step-costs` instead times single fused steps: B rows alone (1, 7, 8, 9, 11, 16, 24, 32) and 7 rows
with a T-token chunk riding (0, 1, 4, 9, 16, 25, 32; the chunk's cache already holding 1000 tokens). One thread, as
`vl serve --threads 1`."""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from vl.bench.quant import quantized_copy
from vl.config import bench_180m_lm
from vl.modeling.nemotron_h import NemotronHForCausalLM
from vl.runtime.cpu import decode as cpu_decode
from vl.runtime.decode_batch import DecodeBatch
from vl.runtime.pretrained import runtime_passes


def p95(xs):
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(round(0.95 * (len(xs) - 1))))]


def measure(lm, rows: int, join: int, chunk: int | None, two_calls: bool, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    vocab = lm.config.vocab_size
    batch = DecodeBatch(lm, mix_chunk=chunk)
    if two_calls:
        batch.step_fn = cpu_decode.step_fn(lm)  # a fresh step without `mix`: the chunk runs as its own call
        del batch.step_fn.mix
    batch.join(list(range(rows)), [10_000] * rows, input_ids=torch.randint(3, vocab, (rows, 64), generator=g))
    for _ in range(3):
        batch.step()
    usual = []
    for _ in range(10):
        t0 = time.perf_counter()
        batch.step()
        usual.append(time.perf_counter() - t0)
    batch.join(["long"], [4], input_ids=torch.randint(3, vocab, (1, join), generator=g))
    joining, t_join = [], time.perf_counter()
    while True:
        t0 = time.perf_counter()
        out = batch.step()
        joining.append(time.perf_counter() - t0)
        if "long" in out:
            break
    return usual, joining, time.perf_counter() - t_join


def step_costs(lm) -> None:
    from vl.runtime.cache import HybridCache

    cfg, lib, dtype = lm.config, cpu_decode.library(), lm.backbone.embeddings.weight.dtype

    def timed(fn):
        ts = []
        for _ in range(12):
            t0 = time.perf_counter()
            fn()
            ts.append(time.perf_counter() - t0)
        return statistics.median(ts[2:]) * 1e3

    with torch.no_grad():
        for rows, chunk in [(b, 0) for b in (1, 7, 8, 9, 11, 16, 24, 32)] + [(7, t) for t in (0, 1, 4, 9, 16, 25, 32)]:
            ids = torch.randint(3, cfg.vocab_size, (rows, 64))
            cache = HybridCache(cfg, rows, 64 + 40, dtype=dtype)
            lm(ids, cache=cache, logits_to_keep=1)
            other = HybridCache(cfg, 1, 2048, dtype=dtype)
            lm(torch.randint(3, cfg.vocab_size, (1, 1000)), cache=other, cache_only=True)
            tok = ids[:, -1:]
            ride = (lambda: (lm.embed(torch.randint(3, cfg.vocab_size, (chunk,))), other, False)) if chunk else None
            ms = timed(lambda: cpu_decode.run_step(lm, lib, tok, cache, chunk=ride() if ride else None))
            what = f" + a {chunk}-token chunk" if chunk else ""
            print(f"{rows:2d} rows{what:>20}: {ms:6.1f} ms per step", flush=True)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rows", type=int, default=7)
    p.add_argument("--join", type=int, default=1024)
    p.add_argument("--chunks", default="default,8,16,64", help="comma-separated mix_chunk values ('default': None)")
    p.add_argument("--two-calls", action="store_true", help="also time the chunk and the step as two calls")
    p.add_argument("--nvfp4", action="store_true", help="the weights as NVFP4 weight-only (vl quantize's format)")
    p.add_argument("--step-costs", action="store_true", help="time single steps by rows and riding chunk instead")
    args = p.parse_args()
    torch.set_num_threads(1)
    torch.manual_seed(0)
    lm = NemotronHForCausalLM(bench_180m_lm()).eval()
    with torch.no_grad():
        for _, w in lm.named_parameters():
            if w.dim() > 1:
                w.normal_(0, 0.02)
    lm = lm.to(torch.bfloat16)
    if args.nvfp4:
        lm = quantized_copy(lm, "nvfp4", torch.randint(3, lm.config.vocab_size, (1, 64)))
    lm = runtime_passes(lm)
    if args.step_costs:
        print(f"fused step: {cpu_decode.status()}; {'nvfp4' if args.nvfp4 else 'bf16'}; 1 thread")
        step_costs(lm)
        return 0
    print(f"fused step: {cpu_decode.status()}; {'nvfp4' if args.nvfp4 else 'bf16'}; {args.rows} rows decoding, "
          f"a {args.join}-token prompt joins; 1 thread")
    for c in args.chunks.split(","):
        chunk = None if c == "default" else int(c)
        for two in ([False, True] if args.two_calls else [False]):
            usual, joining, took = measure(lm, args.rows, args.join, chunk, two)
            u, j = statistics.median(usual), statistics.median(joining)
            print(f"chunk {c:>7} {'two calls' if two else 'riding   '}: usual {u * 1e3:6.1f} ms (p95 "
                  f"{p95(usual) * 1e3:6.1f}), while joining {j * 1e3:6.1f} ms (p95 {p95(joining) * 1e3:6.1f}, max "
                  f"{max(joining) * 1e3:6.1f}, {len(joining)} steps): median {j / u:4.2f}x, p95 "
                  f"{p95(joining) / statistics.median(usual):4.2f}x; the join took {took:5.1f} s", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
