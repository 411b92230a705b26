"""The EVS fine-tune chain: experiments on the demo model, kept reproducible because the shipped model is their end.

Each recipe starts from a saved model (`init_from`) and trains on with video clips EVS-pruned at rates drawn per
step; scripts/train_demo_evs.sh runs them in order from the from-scratch model, and docs/token_reduction.md
reports what each one gave. They are registered by name in data_recipes/registry.py.
"""

from __future__ import annotations

import dataclasses

from data_recipes.recipes import Packing, Recipe, Stage, demo_recipe
from vl.errors import ConfigError

FROM_SCRATCH = "runs/demo/model"  # where scripts/train_demo.sh trains the `demo` recipe, which the evs_* recipes start from


def evs_tune_recipe(total_steps: int = 600, lr: float = 1.5e-4, init_from: str | None = None) -> Recipe:
    """An experiment: the from-scratch demo model (`init_from`, default `FROM_SCRATCH`: `vl train-demo --recipe demo
    --out runs/demo`; the shipped model is its EVS fine-tune, scripts/train_demo.sh) trained on for
    `total_steps` more steps of the demo mixture at the demo recipe's final learning rate, the LM alone
    trainable (the tower and projector stay as they were; the probe heads, never exported, are not used), with
    each step's video clips EVS-pruned at a rate drawn from (0, 0, 0.5, 0.75): half the steps unpruned, which
    kept the unpruned accuracy better than (0, 0.5, 0.75, 0.9) did. It measures how much of EVS's accuracy
    cost on the demo model comes from an LM that never saw a pruned clip (docs/token_reduction.md)."""
    base = demo_recipe()
    return base.replace(
        name="evs_tune", seed=1, init_from=str(init_from or FROM_SCRATCH),
        stages=(Stage("evs", total_steps, lr, warmup_steps=min(20, total_steps), min_lr_ratio=1.0,
                      trainable=("language_model.",), video_pruning_rates=(0.0, 0.0, 0.5, 0.75)),),
    )


LONG_VIDEO_OPTIONS = (("num_frames", 64), ("fps", 2.0))  # 32 s clips: the 64-frame video of the long-video EVS goal


def evs_long_recipe(total_steps: int = 720, lr: float = 3e-4, init_from: str | None = None,
                    long_share: float = 0.5) -> Recipe:
    """`evs_tune` with long clips: each video family is drawn `long_share` of its weight as 64-frame clips
    (`LONG_VIDEO_OPTIONS`) and the rest as the demo's 8-frame ones, every step's clips EVS-pruned at a rate
    drawn from (0, 0, 0.5, 0.75). The demo model never saw a clip longer than 4 s (no timestamp past 3.5 s,
    no flash among 64 frames), so on 64-frame clips it is out of its training distribution before any
    pruning; this measures EVS on a model that knows such clips (docs/token_reduction.md)."""
    if not 0 < long_share < 1:
        raise ConfigError(f"evs_long: long_share must lie in (0, 1), found {long_share}")
    base = evs_tune_recipe(total_steps, lr, init_from)
    sources = []
    for s in base.sources:
        if s.kind != "video":
            sources.append(s)
            continue
        sources += [dataclasses.replace(s, weight=s.weight * (1 - long_share)),
                    dataclasses.replace(s, weight=s.weight * long_share, options=LONG_VIDEO_OPTIONS)]
    return base.replace(name="evs_long", sources=tuple(sources),
                        packing=Packing(max_tokens=4096, max_seq_len=2048))  # a 64-frame clip is ~1.6k tokens


def evs_where_recipe(total_steps: int = 720, lr: float = 3e-4, init_from: str | None = None,
                     position_weight: float = 0.5) -> Recipe:
    """`evs_long` with the tower and projector trainable too, plus the per-token position loss at
    `position_weight` on every tile the LM sees. On the from-scratch model an EVS-kept token does not say where it
    was (`vision_targets.position_loss`), so a pruned clip leaves the LM guessing where the moving shape went:
    evs_long's motion direction fell from 92 to 55% at q=0.75 on 64-frame clips. This measures EVS on a tower
    whose tokens keep their place (docs/token_reduction.md)."""
    base = evs_long_recipe(total_steps, lr, init_from)
    stage = dataclasses.replace(base.stages[0], name="evs_where", trainable=("",), position_weight=position_weight)
    return base.replace(name="evs_where", stages=(stage,))


def evs_pruned_recipe(total_steps: int = 720, lr: float = 3e-4, init_from: str | None = None) -> Recipe:
    """`evs_where` with three steps in four pruned (rates drawn from 0 / 0.5 / 0.75 / 0.75, against evs_where's
    0 / 0 / 0.5 / 0.75) and a fresh sampling seed. In 720 evs_where steps the LM saw ~350 64-frame direction
    clips pruned at q=0.75 (32 samples a step, ~6% of them long direction clips, a quarter of steps at 0.75);
    this doubles that, to measure whether exposure is what limits direction on pruned clips (docs/token_reduction.md). Meant to start from an evs_where run (`--init-from runs/evs_where2/model`)."""
    base = evs_where_recipe(total_steps, lr, init_from)
    stage = dataclasses.replace(base.stages[0], name="evs_pruned", video_pruning_rates=(0.0, 0.5, 0.75, 0.75))
    return base.replace(name="evs_pruned", seed=2, stages=(stage,))


def evs_settle_recipe(total_steps: int = 600, lr: float = 1.5e-4, init_from: str | None = None) -> Recipe:
    """`evs_where` with half the steps unpruned and half at q=0.75 (rates 0 / 0 / 0.5 / 0.75 -> 0 / 0.75), at
    half evs_where's learning rate decayed by a cosine to a tenth, where every earlier fine-tune held its rate
    to the last step. `evs_pruned` runs ended with pruned clips read as well as or better than whole ones but
    swung 12 points unpruned between two runs of one recipe (flash counting 72.5 -> 27.5%); this measures
    whether settling at a falling rate on whole and pruned clips alike keeps both (docs/token_reduction.md). Meant to start from an evs_pruned run (`--init-from runs/evs_pruned2/model`)."""
    base = evs_where_recipe(total_steps, lr, init_from)
    stage = dataclasses.replace(base.stages[0], name="evs_settle", video_pruning_rates=(0.0, 0.75), min_lr_ratio=0.1)
    return base.replace(name="evs_settle", seed=4, stages=(stage,))
