"""Time to first token on long clips with and without EVS, split into media preparation and model work.

For the first --items clips of a `synthetic_video` JSONL (e.g. the 64-frame set scripts/research/demo_figures.sh writes),
in-process `vl.Engine.chat` (no sandbox worker): median TTFT at each EVS rate, the processor's share (video
decode, frame resize, prompt; timed separately on the same input) and the rest (vision tower, projector, EVS,
prefill, first decode step). Every rate runs once before timing, and the rates are interleaved per item.

Usage: .venv/bin/python scripts/research/bench_evs_ttft.py runs/figures/video64/video_test.jsonl [--rates 0,0.75]
       [--items 6] [--model vl/demo] [--threads 1]
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import torch


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("data", help="synthetic_video JSONL (media paths relative to its folder)")
    p.add_argument("--rates", default="0,0.75")
    p.add_argument("--items", type=int, default=6)
    p.add_argument("--model", default=None, help="checkpoint directory (default: the shipped demo model)")
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--repeats", type=int, default=2, help="passes over the items (medians over all of them)")
    a = p.parse_args()
    torch.set_num_threads(a.threads)
    import vl
    from vl.cli import default_model

    engine = vl.Engine.from_pretrained(a.model or default_model())
    root = Path(a.data).parent
    records = [json.loads(line) for line in open(a.data, encoding="utf-8")][: a.items]

    def messages(r):
        video = next(part["video"] for part in r["content"] if part["type"] == "video")
        return [{"role": "user", "content": [{"type": "video", "video": str(root / video)},
                                             {"type": "text", "text": r["question"]}]}]

    rates = [float(x) for x in a.rates.split(",")]
    for rate in rates:  # warm-up: every rate once (the first timed block otherwise pays for cold caches)
        engine.chat(messages(records[0]), max_new_tokens=2, thinking=False, video_pruning_rate=rate)
    prep, ttft, kept = ({q: [] for q in rates} for _ in range(3))
    for _ in range(a.repeats):
        for r in records:  # rates interleaved per item, so drift on a shared CPU hits every rate alike
            for rate in rates:
                t0 = time.perf_counter()
                engine.processor(messages(r), thinking=False)
                prep[rate].append(time.perf_counter() - t0)
                res = engine.chat(messages(r), max_new_tokens=2, thinking=False, video_pruning_rate=rate)
                ttft[rate].append(res.stats.time_to_first_token_s)
                kept[rate].append(res.stats.vision_tokens_after)
    base = None
    for rate in rates:
        pm, tm = statistics.median(prep[rate]), statistics.median(ttft[rate])
        base = base or (tm, tm - pm)
        print(f"EVS q={rate:g}: vision tokens {statistics.mean(kept[rate]):.0f}, TTFT {1000 * tm:.0f} ms "
              f"(processor {1000 * pm:.0f} ms, model {1000 * (tm - pm):.0f} ms); "
              f"speed-up vs the first rate: TTFT {base[0] / tm:.2f}x, model part {base[1] / (tm - pm):.2f}x")

if __name__ == "__main__":
    main()
