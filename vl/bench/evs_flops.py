"""Forward FLOPs to the first token of a long video at each EVS rate: vision tower, projector and LLM prefill.

Counts the matmul FLOPs of this project's own modules (torch.utils.flop_counter on the meta device: no weights, no
memory, seconds) for a video of --frames one-tile frames: the tower and projector see every frame at every rate
(EVS prunes after the projector, as in every reference implementation), the LLM prefills the kept vision tokens
(token_reduction.evs.retained_count) plus --text-tokens of frame headers, chat template and question, which EVS
keeps. The ratio against q=0 estimates how far EVS cuts time to first token where matmul FLOPs set the time (a
large model's compute-bound prefill); video decoding, elementwise work and the Mamba scan's recurrence are not
counted. It is an estimate, not a bound: on the tiny demo model on a CPU, per-token overheads rather than FLOPs
set the time, and the measured cut of the model part (scripts/research/bench_evs_ttft.py) is at or above this one.

Default geometry: the released Nano V2 VL 12B (C-RADIOv2-H at 512 px, 256 tokens a frame, Nemotron-H 12B; from
vl.config); --model DIR reads a checkpoint's config.json instead (e.g. vl/demo). The count lives here, with the
other measures, so that its test imports it; scripts/research/evs_flops.py runs it.

Usage: .venv/bin/python -m vl.bench.evs_flops [--model DIR] [--frames 64] [--rates 0,0.5,0.75,0.9] [--text-tokens 961]
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch
from torch.utils.flop_counter import FlopCounterMode

from token_reduction.evs import retained_count
from vl.config import VisionConfig, VLConfig, nano_12b_lm, vl_config_from_hf
from vl.modeling.vlm import NemotronVL


def released_config() -> VLConfig:
    return VLConfig(lm=nano_12b_lm(), vision=VisionConfig(model="vit_huge_patch16_224"))


def _flops(fn) -> int:
    with FlopCounterMode(display=False) as counter:
        fn()
    return counter.get_total_flops()


def count(cfg: VLConfig, frames: int, rates: list[float], text_tokens: int) -> list[dict]:
    """One row per rate: vision tokens kept, prompt tokens, FLOPs of tower / projector / LLM prefill, total."""
    with torch.device("meta"):
        model = NemotronVL(cfg)
    s, grid = cfg.force_image_size, (cfg.grid, cfg.grid)
    feats = torch.empty(frames, cfg.grid ** 2, cfg.vit_hidden_size, device="meta")  # forward_features' output
    tower = _flops(lambda: model.vision.forward_features(torch.empty(frames, 3, s, s, device="meta")))
    projector = _flops(lambda: model.projector(feats, grid))
    rows = []
    for q in rates:
        kept = retained_count(frames, cfg.tokens_per_tile, q)
        prompt = kept + text_tokens
        embeds = torch.empty(1, prompt, cfg.lm.hidden_size, device="meta")
        llm = _flops(lambda: model.language_model(inputs_embeds=embeds, logits_to_keep=1))
        rows.append({"rate": q, "vision_tokens": kept, "prompt_tokens": prompt, "tower": tower,
                     "projector": projector, "llm": llm, "total": tower + projector + llm})
    return rows


def table(rows: list[dict]) -> str:
    first = rows[0]["total"]
    lines = ["| EVS rate | vision tokens | prompt tokens | tower TFLOP | projector TFLOP | LLM prefill TFLOP | "
             "total TFLOP | q=0 / this |", "|---:|---:|---:|---:|---:|---:|---:|---:|"]
    lines += [f"| {r['rate']:g} | {r['vision_tokens']:,} | {r['prompt_tokens']:,} | {r['tower'] / 1e12:.3g} | "
              f"{r['projector'] / 1e12:.3g} | {r['llm'] / 1e12:.3g} | {r['total'] / 1e12:.3g} | "
              f"{first / r['total']:.2f}x |" for r in rows]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default=None, help="checkpoint directory whose config.json to count (default: the "
                                                 "released 12B geometry)")
    p.add_argument("--frames", type=int, default=64)
    p.add_argument("--rates", default="0,0.5,0.75,0.9")
    p.add_argument("--text-tokens", type=int, default=961,
                   help="prompt tokens besides the vision tokens (default: the demo model's 64-frame prompts, "
                        "1538 tokens of which 576 vision, as `vl eval` counts them)")
    a = p.parse_args(argv)
    cfg = (vl_config_from_hf(json.loads((Path(a.model) / "config.json").read_text())) if a.model
           else released_config())
    rates = [float(x) for x in a.rates.split(",")]
    what = a.model or "released Nano V2 VL 12B geometry"
    print(f"{what}: {a.frames} frames, {cfg.tokens_per_tile} tokens a frame, {a.text_tokens} text tokens\n")
    print(table(count(cfg, a.frames, rates, a.text_tokens)))


if __name__ == "__main__":
    main()
