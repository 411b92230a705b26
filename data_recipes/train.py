"""`vl train-demo`: train a very small NemotronH_Nano_VL_V2 on the synthetic families, from scratch.

    vl train-demo --recipe demo --out runs/demo                 # the shipped model (see vl/demo/README.md)
    vl train-demo --recipe demo --out runs/demo                 # same command again: resumes from its checkpoint
    vl train-demo --recipe smoke --out /tmp/smoke --steps 6     # a few seconds (CI)
    vl train-demo --recipe evs_where --init-from runs/evs_where/model --out runs/evs_where2
                                                                # a fine-tune from a saved model (default: vl/demo)

The loop (nanochat / nanoVLM style, on accelerate's `Accelerator`): each optimizer step draws
`samples_per_step` synthetic samples from the recipe's mixture sampler, formats them through the
processor and chat.py (data_recipes/formatting.py), packs them into forward passes under a padded-token
budget (packing.py) and accumulates gradients over those passes (`accelerator.no_sync` on all but the last)
before one clipped AdamW step. The loss is next-token cross entropy summed over assistant tokens and divided
by the step's assistant-token count, so every supervised token weighs the same however the step was packed.
A background thread renders and formats the next step's samples while the current step trains (`Prefetch` of
data_recipes/train_data.py: the same examples in the same order, so the same losses; 1.54 -> 1.34 s a step on the
demo recipe). A stage may add tower-only samples a step (`Stage.probe_samples`, from `Recipe.probe_sources`): one
more forward pass through the tower and projector alone, whose probe loss trains them without an LM forward
(`probe_pass_loss` of train_loss.py); which samples is a pure function of (seed, step), so resume and prefetch
keep them. The run's log and loss curve: train_log.py.

Mixed precision: `--mixed-precision auto` is bf16 autocast on CUDA and off on CPU. CPUs without bf16
instructions (AVX512-BF16/AMX; the 2-core build machine has neither) emulate it, which is slower than fp32.

Checkpoint and resume: every `checkpoint_every` steps (and at the end or when `--max-minutes` runs out)
`accelerator.save_state` writes model, optimizer and RNG state to `<out>/checkpoint`, with
`trainer_state.json` holding the step and the sampler position. Rendering, the reasoning-mode choice and
the sampler are pure functions of (seed, position), so a resumed run continues the same data stream. A run
resumes only under the recipe it started with (`<out>/recipe.json`): another mixture or `--steps` is an error
that names what differs (`--fresh` starts over).
Outputs: `<out>/log.jsonl` (one line per step), `<out>/loss.png`, `<out>/model/` (a Nano V2 VL checkpoint
directory: config.json, model.safetensors, tokenizer files, generation_config.json).
"""

from __future__ import annotations

import argparse
import contextlib
import inspect
import json
import math
import os
import shutil
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import torch

from data_recipes.packing import collate
from data_recipes.registry import RECIPES, Recipe, get_recipe
from data_recipes.train_data import Prefetch, SampleStream, load_or_train_tokenizer, step_batches, training_processor
from data_recipes.train_log import plot_loss, read_log
from data_recipes.train_loss import batch_loss, probe_pass_loss
from data_recipes.vision_targets import ProbeHeads
from vl.directory import SYNTHETIC_ONLY_KEY
from vl.errors import ConfigError

CHECKPOINT = "checkpoint"
TRAINER_STATE = "trainer_state.json"


# --- model ------------------------------------------------------------------------------------------
@torch.no_grad()
def init_weights(model, seed: int = 0, qk_std: float = 0.02) -> None:
    """From-scratch initialisation (no pretrained weights can be downloaded on the build machines).

    Linear and embedding weights N(0, 0.02), residual output projections scaled by 1/sqrt(2 * layers)
    (GPT-2 / Nemotron-H `rescale_prenorm_residual`); Mamba-2 as in the Mamba reference: A = -U[1, 16],
    dt = logU[1e-3, 1e-1] stored through the inverse softplus in dt_bias, D = 1; ViT position and prefix
    tokens N(0, 0.02)."""
    g = torch.Generator().manual_seed(seed)
    n_layers = model.config.lm.num_hidden_layers
    for name, p in model.named_parameters():
        if name.endswith("A_log"):
            p.copy_(torch.log(torch.rand(p.shape, generator=g) * 15 + 1))
        elif name.endswith("dt_bias"):
            dt = torch.exp(torch.rand(p.shape, generator=g) * (math.log(0.1) - math.log(1e-3)) + math.log(1e-3))
            p.copy_(dt + torch.log(-torch.expm1(-dt)))
        elif name.endswith(".D") or (p.ndim == 1 and name.endswith("weight")):  # D skip, norm scales
            p.fill_(1.0)
        elif p.ndim == 1:  # biases
            p.zero_()
        elif "conv1d" in name:
            p.copy_(torch.randn(p.shape, generator=g) / math.sqrt(p.shape[-1]))
        else:
            std = qk_std if name.endswith(("q_proj.weight", "k_proj.weight")) else 0.02
            if name.endswith(("o_proj.weight", "out_proj.weight", "down_proj.weight")) and "language_model" in name:
                std /= math.sqrt(2 * n_layers)
            p.copy_(torch.randn(p.shape, generator=g) * std)


def check_init_from(directory) -> None:
    """A fine-tune's starting model must be a saved model directory (before anything is trained or written)."""
    if not (Path(directory) / "config.json").is_file():
        raise ConfigError(f"init_from {directory}: no model there (no config.json); the evs_* recipes start from the "
                          f"from-scratch demo model (`vl train-demo --recipe demo --out runs/demo`); --init-from DIR "
                          f"names another")


def load_weights_from(model, directory) -> None:
    """Copies a saved model's weights (any layout `vl.load_pretrained` reads) into `model`, which must have
    the same architecture (`Recipe.init_from`)."""
    from vl.runtime.pretrained import load_pretrained

    source = load_pretrained(directory, dtype=torch.float32).state_dict()
    try:
        model.load_state_dict(source, strict=True)
    except RuntimeError as exc:
        raise ConfigError(f"init_from {directory}: its weights do not fit the recipe's model ({exc})") from None


def count_parameters(model) -> dict[str, int]:
    parts = {"vision": model.vision, "projector": model.projector, "language_model": model.language_model}
    out = {k: sum(p.numel() for p in m.parameters()) for k, m in parts.items()}
    out["total"] = sum(out.values())
    return out


# --- state ------------------------------------------------------------------------------------------
@dataclass
class TrainerState:
    recipe: str
    step: int = 0  # optimizer steps done
    consumed: int = 0  # samples drawn from the mixture
    elapsed_s: float = 0.0  # wall time spent in steps (all runs of a resumed training)
    samples: int = 0
    tokens: int = 0


def check_same_recipe(path: Path, recipe_json: str) -> None:
    """A checkpoint resumes only under the recipe it was trained with (`path`: the run's recipe.json, written
    when the run started): another mixture, step count or schedule would continue a run that no single recipe
    describes, so it is an error that names the fields that differ, with the run left as it was."""
    if not path.exists():
        return
    before, now = json.loads(path.read_text()), json.loads(recipe_json)
    changed = sorted(k for k in before.keys() | now.keys() if before.get(k) != now.get(k))
    if changed:
        raise ConfigError(f"{path.parent} was trained under another {now['name']!r} recipe (it differs in "
                          f"{', '.join(changed)}); pass --fresh to start over, or use another --out")


def set_trainable(model, prefixes: tuple[str, ...]) -> None:
    for name, p in model.named_parameters():
        p.requires_grad_(any(name.startswith(prefix) for prefix in prefixes))


def param_groups(model, weight_decay: float):
    decay, no_decay = [], []
    for name, p in model.named_parameters():
        skip = p.ndim < 2 or any(k in name for k in ("pos_embed", "cls_token", "embeddings"))
        (no_decay if skip else decay).append(p)
    return [{"params": decay, "weight_decay": weight_decay}, {"params": no_decay, "weight_decay": 0.0}]


def export_model(model, tokenizer, directory: Path, dtype: torch.dtype = torch.float32) -> Path:
    """A Nano V2 VL checkpoint directory (vl.checkpoint.nano_vl.save_pretrained) + generation_config.json."""
    import copy

    from vl.checkpoint.nano_vl import save_pretrained
    from data_recipes.tokenizer import save_tokenizer

    directory = Path(directory)
    shipped = copy.deepcopy(model).to(dtype)
    for name, p in shipped.named_parameters():  # the small precision-critical tensors stay fp32 (as loaded)
        if any(name.endswith(k) for k in shipped.keep_in_fp32):
            p.data = p.data.float()
    save_pretrained(shipped, directory)
    config_file = directory / "config.json"  # every model trained here has seen only synthetic data: mark it so
    config = json.loads(config_file.read_text())  # `vl chat` and the app warn, wherever it is copied
    config[SYNTHETIC_ONLY_KEY] = True
    config_file.write_text(json.dumps(config, indent=2) + "\n")
    save_tokenizer(tokenizer, directory)
    lm = model.config.lm
    gen = {"eos_token_id": list(lm.eos_token_id), "pad_token_id": lm.pad_token_id, "bos_token_id": lm.bos_token_id,
           "do_sample": False, "max_new_tokens": 64}
    (directory / "generation_config.json").write_text(json.dumps(gen, indent=2) + "\n")
    return directory


# --- the loop ---------------------------------------------------------------------------------------
def train(recipe: Recipe, out_dir, *, resume: bool = True, max_minutes: float | None = None, threads: int = 2,
          mixed_precision: str = "auto", progress: bool = True, stop_after: int | None = None,
          save_dtype: torch.dtype = torch.float32, prefetch: bool = True) -> dict:
    """Runs (or resumes) `recipe` into `out_dir`; returns a summary dict (also written to summary.json).

    `stop_after` ends this invocation after that many optimizer steps in total (for tests: the run can then
    be resumed); `max_minutes` ends it when that much wall time has passed in this invocation. `prefetch`
    builds each step's examples during the previous step (same examples, same losses; see `Prefetch`)."""
    from accelerate import Accelerator
    from accelerate.utils import set_seed
    from tqdm.auto import tqdm

    from vl.modeling.vlm import NemotronVL

    torch.set_num_threads(threads)
    if recipe.init_from:
        check_init_from(recipe.init_from)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    if mixed_precision == "auto":
        mixed_precision = "bf16" if torch.cuda.is_available() else "no"
    accelerator = Accelerator(mixed_precision=mixed_precision, cpu=not torch.cuda.is_available())
    set_seed(recipe.seed)

    tokenizer = load_or_train_tokenizer(recipe, out / "tokenizer")
    config = recipe.model.vl_config(tokenizer)
    model = NemotronVL(config)
    model.micro_batch = 512  # tiles per vision call: bigger matmuls; memory is not the limit at this size
    if recipe.init_from:
        load_weights_from(model, recipe.init_from)
    else:
        init_weights(model, recipe.seed, recipe.init_qk_std)
    params = count_parameters(model)
    probe = ProbeHeads(config.tokens_per_tile, config.lm.hidden_size,  # training-only heads, never exported
                       positions=any(s.position_weight > 0 for s in recipe.stages))
    groups = param_groups(model, recipe.weight_decay)
    groups[0]["params"] = groups[0]["params"] + list(probe.parameters())
    optimizer = torch.optim.AdamW(groups, lr=recipe.lr_at(0), betas=recipe.betas)
    model, probe, optimizer = accelerator.prepare(model, probe, optimizer)
    processor = training_processor(tokenizer, config)
    data = SampleStream(recipe, processor)

    state = TrainerState(recipe.name)
    ckpt = out / CHECKPOINT
    recipe_json = json.dumps(asdict(recipe), indent=1, default=str) + "\n"
    if resume and (ckpt / TRAINER_STATE).exists():
        saved = json.loads((ckpt / TRAINER_STATE).read_text())
        if saved["recipe"] != recipe.name:
            raise ConfigError(f"{ckpt} holds recipe {saved['recipe']!r}, not {recipe.name!r}; use another --out")
        check_same_recipe(out / "recipe.json", recipe_json)
        accelerator.load_state(str(ckpt))
        state = TrainerState(**saved)
        data.mixture.load_state_dict({"consumed": state.consumed})
    elif not resume:
        for stale in (ckpt, out / "log.jsonl"):
            shutil.rmtree(stale, ignore_errors=True) if stale.is_dir() else stale.unlink(missing_ok=True)
    log_path = out / "log.jsonl"
    rows = read_log(log_path, upto_step=state.step)  # a crash after the last checkpoint left later lines
    log_path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    (out / "recipe.json").write_text(recipe_json)

    def save_checkpoint():
        tmp = out / (CHECKPOINT + ".tmp")
        shutil.rmtree(tmp, ignore_errors=True)
        accelerator.save_state(str(tmp))
        (tmp / TRAINER_STATE).write_text(json.dumps(asdict(state), indent=1) + "\n")
        shutil.rmtree(ckpt, ignore_errors=True)
        os.replace(tmp, ckpt)
        export_model(accelerator.unwrap_model(model), tokenizer, out / "model", save_dtype)  # loadable as is

    pad_id = processor.pad_id
    total = recipe.total_steps
    last = min(total, stop_after) if stop_after is not None else total
    start_time = time.perf_counter()
    bar = tqdm(total=total, initial=state.step, disable=not progress, desc=f"train {recipe.name}", unit="step",
               dynamic_ncols=True)
    ema = None
    current_stage = None
    stopped_early = False

    feed = Prefetch(data, enabled=prefetch)
    with open(log_path, "a", encoding="utf-8") as log, contextlib.closing(feed):  # closed on errors too
        while state.step < last:
            if max_minutes is not None and time.perf_counter() - start_time > 60 * max_minutes:
                stopped_early = True
                break
            t0 = time.perf_counter()
            stage, _ = recipe.stage_at(state.step)
            if stage is not current_stage:
                set_trainable(accelerator.unwrap_model(model), stage.trainable)
                current_stage = stage
            lr = recipe.lr_at(state.step)
            q = stage.pruning_rate(recipe.seed, state.step)  # EVS rate of this step's clips, for the LM
            for group in optimizer.param_groups:
                group["lr"] = lr
            examples, probe_examples, consumed = feed.get(state.step, state.step + 1 if state.step + 1 < last else None)
            t_data = time.perf_counter() - t0  # with prefetch: only the part of the build not hidden
            batches, pack_eff = step_batches(examples, recipe, pad_id)
            probe_batch = collate(probe_examples, pad_id) if probe_examples else None
            n_target = sum(b.num_target_tokens for b in batches)
            n_tiles = sum(e.num_tiles for e in examples)
            model.train()
            probe.train()
            loss_sum, lm_sum, aux_sum, probe_hits = 0.0, 0.0, 0.0, {}
            passes = ([probe_batch] if probe_batch is not None else []) + batches
            for i, batch in enumerate(passes):
                sync = contextlib.nullcontext() if i == len(passes) - 1 else accelerator.no_sync(model)
                with sync, accelerator.autocast():
                    if batch is probe_batch:
                        loss, aux, stats = probe_pass_loss(model, probe, batch, stage)
                        lm = None
                    else:
                        loss, lm, aux, stats = batch_loss(model, probe, batch, stage, n_target, n_tiles, q)
                accelerator.backward(loss)
                loss_sum += float(loss.detach())
                lm_sum += float(lm.detach()) if lm is not None else 0.0
                aux_sum += float(aux.detach()) if aux is not None else 0.0
                for k, (c, n) in stats.items():
                    hit = probe_hits.setdefault(k, [0, 0])
                    hit[0], hit[1] = hit[0] + c, hit[1] + n
            trainable = [p for p in model.parameters() if p.requires_grad] + list(probe.parameters())
            grad_norm = float(accelerator.clip_grad_norm_(trainable, recipe.grad_clip))
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            dt = time.perf_counter() - t0
            n_tokens = sum(b.num_tokens for b in batches)
            state.step += 1
            state.consumed = consumed
            state.elapsed_s += dt
            state.samples += len(examples)
            state.tokens += n_tokens
            ema = loss_sum if ema is None else 0.95 * ema + 0.05 * loss_sum
            row = {"step": state.step, "stage": stage.name, "lr": lr, "loss": loss_sum,
                   **({"video_pruning_rate": q} if stage.video_pruning_rates else {}),
                   "lm_loss": lm_sum if stage.objective == "vlm" else None, "aux_loss": aux_sum,
                   "probe_acc": round(sum(c for c, _ in probe_hits.values()) / max(1, sum(n for _, n in
                                                                                          probe_hits.values())), 4),
                   "grad_norm": grad_norm,
                   "samples": len(examples), "probe_samples": len(probe_examples), "tokens": n_tokens, "target_tokens": n_target,
                   "tiles": sum(e.num_tiles for e in examples), "forward_passes": len(batches),
                   "packing_efficiency": round(pack_eff, 4), "step_s": round(dt, 4), "data_s": round(t_data, 4),
                   "samples_per_s": round(len(examples) / dt, 3), "tokens_per_s": round(n_tokens / dt, 1),
                   "elapsed_s": round(state.elapsed_s, 2)}
            log.write(json.dumps(row) + "\n")
            log.flush()
            bar.update(1)
            bar.set_postfix(loss=f"{ema:.3f}", stage=stage.name, sps=f"{len(examples) / dt:.1f}",
                            tps=f"{n_tokens / dt:.0f}")
            if state.step % recipe.checkpoint_every == 0 and state.step < last:
                save_checkpoint()
    bar.close()
    save_checkpoint()
    rows = read_log(log_path)
    plot_loss(rows, out / "loss.png", f"{recipe.name}: {params['total'] / 1e6:.2f}M parameters")
    finished = state.step >= total
    model_dir = out / "model" if finished else None
    summary = {"recipe": recipe.name, "steps": state.step, "total_steps": total, "finished": finished,
               "stopped_early": stopped_early, "elapsed_s": round(state.elapsed_s, 1), "samples": state.samples,
               "tokens": state.tokens, "samples_per_s": round(state.samples / max(state.elapsed_s, 1e-9), 3),
               "tokens_per_s": round(state.tokens / max(state.elapsed_s, 1e-9), 1), "parameters": params,
               "threads": threads, "mixed_precision": mixed_precision,
               "first_loss": rows[0]["loss"] if rows else None, "last_loss": rows[-1]["loss"] if rows else None,
               "model_dir": str(model_dir) if model_dir else None, "loss_png": str(out / "loss.png")}
    (out / "summary.json").write_text(json.dumps(summary, indent=1) + "\n")
    return summary


DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}
FINE_TUNES = tuple(sorted(n for n, f in RECIPES.items() if "init_from" in inspect.signature(f).parameters))


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="vl train-demo", description="train the demo model on synthetic documents "
                                "and videos (resumes from <out>/checkpoint when present)")
    p.add_argument("--recipe", default="demo", choices=sorted(RECIPES))
    p.add_argument("--out", default="runs/demo", help="run directory (checkpoint, log, loss.png, model/)")
    p.add_argument("--steps", type=int, default=None, help="total optimizer steps (the recipe's default if unset)")
    p.add_argument("--fresh", action="store_true", help="ignore an existing checkpoint and start over")
    p.add_argument("--init-from", default=None, metavar="DIR",
                   help=f"start from this saved model (recipes that fine-tune: {', '.join(FINE_TUNES)}; default: the "
                        "from-scratch demo model, runs/demo/model)")
    p.add_argument("--seed", type=int, default=None,
                   help="sampling seed: which pool samples, EVS rates and reasoning modes the steps draw, and the "
                        "init of a from-scratch model (default: the recipe's; a fine-tune run again from its own "
                        "output with a new seed sees new samples)")
    p.add_argument("--max-minutes", type=float, default=None, help="stop (and checkpoint) after this wall time")
    p.add_argument("--threads", type=int, default=2, help="torch CPU threads")
    p.add_argument("--mixed-precision", default="auto", choices=["auto", "no", "bf16", "fp16"])
    p.add_argument("--save-dtype", default="float32", choices=sorted(DTYPES))
    p.add_argument("--no-progress", action="store_true")
    argv = sys.argv[1:] if argv is None else list(argv)
    args = p.parse_args(argv)
    if os.environ.get("OMP_WAIT_POLICY") is None:
        # libgomp reads this when it loads, i.e. before any flag here is parsed: without it, idle OpenMP
        # threads busy-wait, and on a CPU shared with other processes 2 threads ran ~10x slower than 1
        # (measured on the 2-core build machine). Start once more with the variable set.
        os.execve(sys.executable, [sys.executable, "-m", "vl.cli", "train-demo", *argv],
                  {**os.environ, "OMP_WAIT_POLICY": "PASSIVE"})
    options = {"total_steps": args.steps} if args.steps else {}
    if args.init_from is not None:
        if args.recipe not in FINE_TUNES:
            p.error(f"--init-from: recipe {args.recipe!r} trains from scratch; these start from a saved model: "
                    f"{list(FINE_TUNES)}")
        try:
            check_init_from(args.init_from)
        except ConfigError as exc:
            p.error(str(exc))
        options["init_from"] = args.init_from
    recipe = get_recipe(args.recipe, **options)
    if args.seed is not None:
        recipe = recipe.replace(seed=args.seed)
    summary = train(recipe, args.out, resume=not args.fresh, max_minutes=args.max_minutes, threads=args.threads,
                    mixed_precision=args.mixed_precision, progress=not args.no_progress,
                    save_dtype=DTYPES[args.save_dtype])
    print(json.dumps(summary, indent=1))
    return 0 if summary["finished"] else 3


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
