"""Overhead of the transformers `pipeline` over calling `vl.Engine.chat` directly.

Same model, same held-out synthetic document question, greedy, interleaved calls (pipeline, engine, ...);
prints the median milliseconds per call of each and their difference.

Usage: .venv/bin/python scripts/bench_pipeline.py [--model vl/demo] [--calls 15] [--threads 1]
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default=None, help="checkpoint directory (default: the shipped demo model)")
    p.add_argument("--calls", type=int, default=15)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--max-new-tokens", type=int, default=16)
    a = p.parse_args()
    torch.set_num_threads(a.threads)
    import vl
    from transformers import pipeline

    from data_recipes.synthetic import generate
    from vl.cli import default_model

    model = a.model or default_model()
    pipe = pipeline("image-text-to-text", model=model, device="cpu")
    engine = vl.Engine.from_pretrained(model)
    tile = engine.model.config.force_image_size
    sample = generate("doc_total", "test", 0, tile_size=tile)
    msgs = [{"role": "user", "content": [{"type": "image", "image": sample.media[0]},
                                         {"type": "text", "text": sample.question}]}]
    calls = {"pipeline": lambda: pipe(text=msgs, max_new_tokens=a.max_new_tokens, return_full_text=False,
                                      thinking=False),
             "engine": lambda: engine.chat(msgs, max_new_tokens=a.max_new_tokens, thinking=False)}
    for f in calls.values():  # warm-up
        f()
    times = {k: [] for k in calls}
    for _ in range(a.calls):
        for k, f in calls.items():
            t0 = time.perf_counter()
            f()
            times[k].append(time.perf_counter() - t0)
    ms = {k: 1000 * statistics.median(v) for k, v in times.items()}
    print(f"pipeline {ms['pipeline']:.1f} ms, engine {ms['engine']:.1f} ms per call (medians of {a.calls}); "
          f"overhead {ms['pipeline'] - ms['engine']:+.1f} ms")


if __name__ == "__main__":
    main()
