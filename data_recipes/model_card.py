"""The shipped demo model's card (vl/demo/README.md), written from measured numbers only.

`render` fills the card from the training summary (data_recipes/train.py `summary.json`), the recipe as
trained (`recipe.json`), those of the fine-tunes after it if any (data_recipes/lineage.py) and the held-out
results of scripts/demo_eval.py; nothing in it is typed by hand.
"""

from __future__ import annotations

RETRAIN = "scripts/train_demo.sh"


def _quant_section(quant_table: str | None) -> str:
    if quant_table is None:
        return "FP8 / NVFP4 exports (`vl quantize`) of this model: not evaluated in this run."
    return ("FP8 and NVFP4 exports of this model (`vl quantize --format fp8|nvfp4`, calibrated on built-in synthetic "
            "samples, lm_head kept in high precision), same test files and scorer; in brackets the change in "
            "points against the fp32 model:\n\n" + quant_table)


def _repro_section(repro: dict | None) -> str:
    if repro is None:
        return "Reproducibility of these numbers by a second run from scratch has not been measured yet (one run so far)."
    what = (f"A second chain of the same {repro['fine_tunes']} fine-tunes from the same model"
            if repro.get("fine_tunes") else "A second run of the same command from scratch")
    if repro.get("partial"):
        return (f"{what} was stopped after {repro['steps_compared']} of "
                f"{repro['total_steps']} steps ({repro['run']}: {_m(repro['summary']['elapsed_s'])}): with the same "
                f"seeds and data order its training losses {_losses(repro)}. Its accuracy was not measured: a "
                f"partial check of the run's numerics, not of the accuracies.")
    macro = "; ".join(f"/{m} {100 * d:+.1f}" for m, d in repro["macro_delta"].items())
    return (f"{what} ({repro['run']}: {_m(repro['summary']['elapsed_s'])}, "
            f"{repro['summary']['samples_per_s']:.1f} samples/s), evaluated on the same test files: macro mean "
            f"change {macro} points; per family the largest change is {100 * repro['max_family_delta']:.0f} points "
            f"(at {repro['n_per_family']} samples a family, one sample is {_points(100 / repro['n_per_family'])}). "
            f"{_numerics(repro)} Percent:\n\n{repro['table']}")


def _points(x: float) -> str:
    return f"{x:.0f} point" + ("" if round(x) == 1 else "s")


def _losses(repro: dict) -> str:
    """How the two runs' training losses compare, over the steps both ran."""
    first = repro["first_differing_step"]
    if isinstance(first, int):
        return f"first differ at step {first}"
    return f"are equal at all {repro['steps_compared']} steps"


def _numerics(repro: dict) -> str:
    if isinstance(repro["first_differing_step"], int):
        return (f"Same seeds and data order; the training losses {_losses(repro)}, "
                f"from where floating-point differences grow through training.")
    weights = {True: "and the trained weights are equal, tensor for tensor", False: "but the trained weights differ",
               None: "(the weights were not compared)"}[repro["weights_identical"]]
    return (f"Same seeds and data order: the training losses {_losses(repro)} {weights}. Training is "
            f"deterministic on one CPU type and thread count; other hardware or thread counts sum floating-point "
            f"numbers in another order, so runs there part from this one.")


def _lr(stage: dict) -> str:
    ratio = stage["min_lr_ratio"]
    return f"{stage['lr']:g}" + ("" if ratio == 1 else f", cosine to {stage['lr'] * ratio:g}")


def _command(recipe: dict) -> str:
    """The `vl train-demo` flags that made this recipe from its named default (seed and steps; others not shown)."""
    from data_recipes.registry import RECIPES, get_recipe

    cmd = f"vl train-demo --recipe {recipe['name']}"
    if recipe["name"] not in RECIPES:
        return cmd
    default = get_recipe(recipe["name"])
    steps = sum(s["steps"] for s in recipe["stages"])
    if recipe["seed"] != default.seed:
        cmd += f" --seed {recipe['seed']}"
    if steps != default.total_steps:
        cmd += f" --steps {steps}"
    return cmd


def _fine_tune_section(fine_tunes: list[dict]) -> str:
    if not fine_tunes:
        return ""

    def cells(stages, f):  # one value per stage
        return "; ".join(f(s) for s in stages)

    rows = []
    for i, t in enumerate(fine_tunes, 1):
        stages, summary = t["recipe"]["stages"], t["summary"]
        trains = cells(stages, lambda s: ", ".join(p or "all" for p in s["trainable"]))
        rates = cells(stages, lambda s: " / ".join(f"{q:g}" for q in s.get("video_pruning_rates") or [0.0]))
        position = cells(stages, lambda s: f"{s.get('position_weight', 0.0):g}")
        rows.append(f"| {i} | `{_command(t['recipe'])}` | {summary['steps']} | {cells(stages, _lr)} | {trains} | "
                    f"{rates} | {position} | {summary['samples']:,} | {_m(summary['elapsed_s'])} |")
    steps = sum(t["summary"]["steps"] for t in fine_tunes)
    return f"""
Then {len(fine_tunes)} fine-tunes, each from the model the one before made (`vl train-demo --init-from`),
{steps} steps and {_m(sum(t['summary']['elapsed_s'] for t in fine_tunes))} in all. Each step draws one EVS pruning
rate from the listed ones for its clips (the LM sees the pruned clips, as at inference); the position loss weights
a per-token loss on where each kept video token was (data_recipes/recipes.py `Stage.position_weight`).

| # | command | steps | lr | trains | EVS rates drawn | position loss | samples | wall time |
|---|---|---:|---|---|---|---:|---:|---:|
{chr(10).join(rows)}

Fine-tune loss curves, one after the other: `finetune_loss.png`; their recipes and summaries:
`train_lineage.json`.
"""


def _sweep_section(sweeps: list[str]) -> str:
    if not sweeps:
        return ""
    return ("\n## Held-out sweeps\n\nThe same model with one setting varied (`vl eval --sweep`; the change is paired "
            "against the first setting, with a 95% bootstrap interval over items):\n\n" + "\n\n".join(sweeps) + "\n")


def _m(seconds: float) -> str:
    return f"{seconds / 60:.1f} min"


def render(*, result: dict, summary: dict, recipe: dict, n_per_family: int, table: str,
           quant_table: str | None = None, repro: dict | None = None, fine_tunes: list[dict] = (),
           sweeps: list[str] = ()) -> str:
    """`summary` and `recipe` are the from-scratch run's; `fine_tunes` the runs after it ({"recipe", "summary"});
    `sweeps` texts of `vl eval --sweep` runs on this model (scripts/demo_eval.py: sweep_summary)."""
    model = recipe["model"]
    tuned_s = sum(t["summary"]["elapsed_s"] for t in fine_tunes)
    title = "trained from scratch" + (", then fine-tuned" if fine_tunes else "")
    if not fine_tunes:
        reproduce = f"`{RETRAIN}` (trains from scratch into runs/demo, evaluates, and writes this directory)"
    else:
        reproduce = (f"`{RETRAIN}` (trains from scratch into runs/demo, then the fine-tunes above in order into "
                     f"runs/demo/evs, each from the model of the one before, evaluates the last, and writes this "
                     f"directory)")
    trained = ("trained for under 90 minutes" if not fine_tunes else
               f"trained for {_m(summary['elapsed_s'] + tuned_s)} in all ({_m(summary['elapsed_s'])} from scratch, "
               f"{_m(tuned_s)} of fine-tunes)")
    params = summary["parameters"]
    stages = "\n".join(
        f"| {s['name']} | {s['objective']} | {s['steps']} | {s['lr']:g} | "
        f"{', '.join(p or 'all' for p in s['trainable'])} | {s['aux_weight'] if s['objective'] == 'vlm' else 1.0:g} | "
        f"{s['samples_per_step'] or recipe['samples_per_step']} | {s.get('probe_samples', 0)} |"
        for s in recipe["stages"])
    sources = ", ".join(f"{s['family']} ({s['weight']:g})" for s in recipe["sources"])
    probe_sources = ", ".join(f"{s['family']} ({s['weight']:g})" for s in recipe.get("probe_sources", ()))
    tower_only = (f" Tower-only samples (family: weight): {probe_sources}; the tower and projector see them, "
                  f"the LM does not." if probe_sources else "")
    low = {m: [f for f, v in result["families"][m].items() if v < 0.85] for m in result["families"]}
    shortfall = "; ".join(f"/{m}: {', '.join(fs)}" for m, fs in low.items() if fs)
    worst = min(result["chance"], key=lambda f: min(result["families"][m][f] for m in result["families"]))
    weakest = f"{worst} (" + " / ".join(f"{100 * result['families'][m][worst]:.0f}%" for m in result["families"]) + ")"
    verdict = ("Every family reaches 85% in both modes." if not shortfall else
               f"Families below the 85% goal: {shortfall}. These are reported as measured; the model is too small "
               f"or trained too briefly for them (see Limitations).")
    return f"""# Nemotron-VL demo model (a very small NemotronH_Nano_VL_V2, {title})

This directory is the model that `vl app`, `vl chat` and `vl eval` use when no `--model` is given. It has
the architecture and the on-disk layout of NVIDIA Nemotron Nano V2 VL (RADIO ViT -> pixel shuffle 2x2 ->
`mlp1` projector -> hybrid Mamba-2 / attention Nemotron-H LLM; `config.json` + `model.safetensors` +
tokenizer files), at {params['total'] / 1e6:.2f}M parameters instead of 12.6B, and it only knows the
project's **synthetic** documents and clips (data_recipes/synthetic). It cannot read real documents,
photos or videos. **For real use, pass a real checkpoint with `--model`**
(e.g. a local copy of `nvidia/NVIDIA-Nemotron-Nano-12B-v2-VL-BF16`).

## Architecture

| part | this model | Nano V2 VL 12B |
|---|---|---|
| vision tower | timm `{model['vit']}` as RADIO (64 wide, 6 blocks, 2 heads), {model['num_prefix_tokens']} cls/register tokens | C-RADIOv2-H (1280 wide, 32 blocks) |
| tile | {model['tile_size']} px, patch 16, pixel shuffle 2x2 -> {(model['tile_size'] // 32) ** 2} tokens per tile | 512 px -> 256 tokens |
| projector `mlp1` | RMSNorm -> Linear({4 * 64}->{model['projector_hidden_size']}) -> ReLU^2 -> Linear(->{model['hidden_size']}) | 5120 -> 20480 -> 5120 |
| LLM | Nemotron-H, hidden {model['hidden_size']}, pattern `{model['pattern']}` (M Mamba-2, * attention, - ReLU^2 MLP) | hidden 5120, 62 layers |
| vocabulary | {model['vocab_size']} (byte-level BPE on the synthetic corpus, Nemotron control tokens, same chat template) | 131072 |

Parameters: vision {params['vision']:,}, projector {params['projector']:,}, language model {params['language_model']:,},
total {params['total']:,} (fp32 weights; `keep_in_fp32` tensors as in the real checkpoints).

## Defaults to use with it

- `max_num_tiles = {model['max_num_tiles']}` is written in `config.json`: every page and every frame is one tile squashed to
  {model['tile_size']} x {model['tile_size']} px, as in training. More tiles would show it crops it never saw.
- Video: sample at the clip's own frame rate so that every frame is kept: the processor defaults
  (`fps=2.0`, `max_frames=128`) do exactly that for the training clips (8 frames at 2 fps, 4 s).
  A one-frame flash or an appearance time is lost if frames are skipped. Recommended:
  `fps` = the clip's fps (2.0 for the synthetic clips), `max_frames` >= the clip's frame count (<= 64).
- PDFs: the default render scale (2.0) is what training used for multi-page documents.
- Reasoning: `/think` (default) writes a short trace before the answer; `/no_think` answers at once.
  Greedy decoding; generation stops on `<SPECIAL_12>` (generation_config.json).

## How it was trained

`vl train-demo --recipe demo` (data_recipes/train.py, recipe `data_recipes/recipes.py: demo_recipe`):
{summary['steps']} optimizer steps, {summary['samples']:,} synthetic samples (train split, seeds disjoint from the
test split), {summary['tokens']:,} tokens, {recipe['sampler']} sampler, {recipe['think_fraction']:.0%} of the samples
with their reasoning trace (/think) and the rest answer-only (/no_think), AdamW (weight decay
{recipe['weight_decay']:g}, clip {recipe['grad_clip']:g}), {recipe['packing']['max_tokens']} padded tokens per forward pass.

| stage | objective | steps | lr | trains | aux weight | samples/step | tower-only samples/step |
|---|---|---:|---:|---|---:|---:|---:|
{stages}

Mixture (family: weight): {sources}.{tower_only}

"vision" is the tower's pre-training: with random initial weights and no pretrained tower to download,
next-token loss alone left the tower's features collapsed and the answers at chance after ~6k samples, so
linear probe heads on the projector output are trained on per-tile facts read from the generators'
metadata (data_recipes/vision_targets.py) - first alone, then beside the LM loss. The heads are not
part of this checkpoint.

Wall time {_m(summary['elapsed_s'])} on a 2-core CPU ({summary['threads']} torch threads, fp32: this CPU has
no bf16 instructions); {summary['samples_per_s']:.1f} samples/s, {summary['tokens_per_s']:.0f} tokens/s over all
stages. The same steps have run up to ~20% slower or faster from one session to the next on this machine type.
Loss curve: `loss.png`; numbers: `train_summary.json`.
{_fine_tune_section(list(fine_tunes))}
## Held-out accuracy

Test split of data_recipes.synthetic (never trained on), {n_per_family} samples per family, written to PNG /
PDF / MP4 files and answered through the real input path (`eval.data` -> `Engine.chat_batch`, greedy,
scored by the `synthetic_docs` / `synthetic_video` tasks: normalized exact match after stripping the
reasoning). Chance = uniform guessing over the family's answers. Percent:

{table}

{verdict}

Reproduce: {reproduce}.
{_repro_section(repro)}

{_quant_section(quant_table)}
{_sweep_section(list(sweeps))}
## Limitations

- Synthetic families only; fixed vocabulary of labels, words and colours; square single-tile pages.
- A tiny model {trained}: its weakest family on this test split is {weakest}.
"""
