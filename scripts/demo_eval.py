"""Held-out accuracy of the demo model per synthetic family, with /think and /no_think (for the model card).

Two paths, one scorer (eval.tasks.synthetic_docs: `strip_reasoning`, then normalized exact match):
- `evaluate_files` is the user's path and the one the model card reports: the test split is written to disk
  by `data_recipes.synthetic.export_split` (PNG pages, multi-page PDFs, H.264 MP4 clips), read back by
  `eval.data.load_items` with the `synthetic_docs` / `synthetic_video` tasks, and answered by
  `vl.Engine.chat_batch` (processor, PDF rendering, video decoding with timestamps, greedy decoding).
- `evaluate_direct` skips the files: prompts are built from the generator's images and frames by
  data_recipes/formatting.py (what training sees) and decoded greedily; quick checks during development.

The test split's seeds are disjoint from the train split's (`data_recipes.synthetic.SPLIT_SEED_BASE`), so
no test sample was ever trained on. Chance is the family's uniform-guess accuracy.

    python scripts/demo_eval.py --model vl/demo --n 100 --out runs/demo_eval
"""

from __future__ import annotations

import argparse
import json
import time
from collections import defaultdict
from pathlib import Path

import torch

from data_recipes import lineage
from data_recipes.formatting import prompt_inputs
from data_recipes.synthetic import FAMILIES, export_split, families, generate
from eval.data import load_items
from eval.metrics import exact_match
from eval.sweep import sweep_markdown
from eval.tasks import get_task
from vl.errors import ConfigError
from vl.processing.reasoning_text import split_reasoning

MODES = {"no_think": False, "think": True}
VIDEO_OPTIONS = {"num_frames": 8, "fps": 2.0}  # the recipe's clips (data_recipes.recipes.VIDEO_OPTIONS)


def _score(prediction: str, answer: str) -> float:
    return float(exact_match(prediction, [answer]))


def _summary(hits: dict, chance: dict) -> dict:
    out = {"families": {}, "chance": chance}
    for mode in MODES:
        per = {f: sum(v) / len(v) for f, v in hits[mode].items() if v}
        if per:
            out["families"].setdefault(mode, per)
            out.setdefault("macro", {})[mode] = sum(per.values()) / len(per)
            out.setdefault("n", {})[mode] = {f: len(v) for f, v in hits[mode].items()}
    return out


@torch.no_grad()
def evaluate_direct(model, processor, *, split: str = "val", n_per_family: int = 20, seed: int = 0,
                    modes=("no_think", "think"), family_names=None, batch_size: int = 16,
                    max_new_tokens: int = 40) -> dict:
    """Greedy answers on `n_per_family` generated samples per family, prompts built in memory."""
    from vl.runtime.generate import generate_steps, left_pad_embeds

    model.eval()
    names = list(family_names or [f for f in FAMILIES if FAMILIES[f].kind != "audio"])  # the demo does not hear
    tile = model.config.force_image_size
    stop = processor.stop_token_ids()
    hits = {m: defaultdict(list) for m in MODES}
    chance = {}
    for family in names:
        opts = VIDEO_OPTIONS if FAMILIES[family].kind == "video" else {}
        samples = [generate(family, split, i, seed=seed, tile_size=tile, **opts) for i in range(n_per_family)]
        chance[family] = samples[0].chance if samples else None
        for mode in modes:
            thinking = MODES[mode]
            for start in range(0, len(samples), batch_size):
                chunk = samples[start:start + batch_size]
                embeds, opened = [], []
                for s in chunk:
                    ids, pixels, media, prompt = prompt_inputs(s, processor, thinking)
                    e, _, _ = model.prepare_inputs(ids, pixels, media)
                    embeds.append(e[0])
                    opened.append(prompt.prompt_opened_think)
                x, mask = left_pad_embeds(embeds)
                rows = [[] for _ in chunk]
                for ev in generate_steps(model.language_model, inputs_embeds=x, attention_mask=mask,
                                         max_new_tokens=max_new_tokens, stop_ids=stop):
                    for i, tok in enumerate(ev.tokens):
                        if tok is not None and tok not in stop:
                            rows[i].append(tok)
                for s, toks, op in zip(chunk, rows, opened):
                    _, answer, _ = split_reasoning(processor.tokenizer.decode(toks), op)
                    hits[mode][family].append(_score(answer, s.answer))
    return _summary(hits, chance)


def export_test_set(out_dir, n_per_family: int, *, tile_size: int, seed: int = 0) -> dict[str, Path]:
    """Writes (once) the test split: `n_per_family` samples of every family, per kind, with media files."""
    out_dir = Path(out_dir)
    paths = {}
    for kind in ("document", "video"):
        n = n_per_family * len(families(kind))
        jsonl = out_dir / f"{kind}_test.jsonl"
        stamp = out_dir / f"{kind}_test.stamp.json"
        want = {"n": n, "tile_size": tile_size, "seed": seed}
        if not (jsonl.exists() and stamp.exists() and json.loads(stamp.read_text()) == want):
            opts = VIDEO_OPTIONS if kind == "video" else {}
            export_split(kind, "test", n, out_dir, seed=seed, tile_size=tile_size, **opts)
            stamp.write_text(json.dumps(want))
        paths[kind] = jsonl
    return paths


def evaluate_files(model_dir, data_dir, *, n_per_family: int = 100, seed: int = 0, modes=("no_think", "think"),
                   batch_size: int = 16, dtype=None, progress: bool = True, records_path=None,
                   render_size: int | None = None) -> dict:
    """The real input path: exported files -> eval tasks -> `Engine.chat_batch` -> the tasks' scorer.

    Pages and frames are drawn at the model's tile size unless `render_size` says otherwise (then the
    processor resizes them to the tile, as it does any user's image).
    """
    from tqdm.auto import tqdm

    from vl.runtime.engine import Engine

    engine = Engine.from_pretrained(model_dir, dtype=dtype)
    tile = render_size or engine.model.config.force_image_size
    paths = export_test_set(data_dir, n_per_family, tile_size=tile, seed=seed)
    hits = {m: defaultdict(list) for m in MODES}
    chance = {}
    records = []
    t0 = time.perf_counter()
    for kind, task_name in (("document", "synthetic_docs"), ("video", "synthetic_video")):
        task = get_task(task_name)
        items = list(load_items(paths[kind], task))
        for item in items:
            chance[item.fields["family"]] = item.fields.get("chance")
        for mode in modes:
            bar = tqdm(total=len(items), desc=f"{task_name} {mode}", disable=not progress, dynamic_ncols=True)
            for start in range(0, len(items), batch_size):
                chunk = items[start:start + batch_size]
                results = engine.chat_batch([task.build_messages(it) for it in chunk], thinking=MODES[mode],
                                            **task.generation_kwargs())
                for it, res in zip(chunk, results):
                    pred = task.postprocess(res.text)
                    score = task.score_record(task.prediction_record(it, pred))["score"]
                    hits[mode][it.fields["family"]].append(float(score))
                    records.append({"id": it.id, "family": it.fields["family"], "mode": mode, "raw": res.text,
                                    "prediction": pred, "answers": list(it.answers), "score": float(score)})
                bar.update(len(chunk))
            bar.close()
    out = _summary(hits, chance)
    out["eval_s"] = round(time.perf_counter() - t0, 1)
    out["path"] = "files: export_split -> eval.data.load_items -> Engine.chat_batch (greedy)"
    out["max_new_tokens"] = get_task("synthetic_docs").max_new_tokens
    out["render_size"] = tile
    if records_path is not None:
        Path(records_path).write_text("".join(json.dumps(r) + "\n" for r in records))
    return out


def table(result: dict) -> str:
    """Markdown table: family | chance | no_think | think."""
    fams = sorted(result["chance"], key=lambda f: (FAMILIES[f].kind, list(FAMILIES).index(f)))
    modes = [m for m in MODES if m in result["families"]]
    lines = ["| family | kind | chance | " + " | ".join(f"/{m}" for m in modes) + " |",
             "|---|---|---:|" + "---:|" * len(modes)]
    for f in fams:
        cells = [f"{100 * result['families'][m].get(f, float('nan')):.1f}" for m in modes]
        lines.append(f"| {f} | {FAMILIES[f].kind} | {100 * result['chance'][f]:.1f} | " + " | ".join(cells) + " |")
    lines.append("| **macro mean** | | | " + " | ".join(f"**{100 * result['macro'][m]:.1f}**" for m in modes) + " |")
    return "\n".join(lines)


FINETUNE_LOSS = "finetune_loss.png"
MODEL_FILES = ("config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json",
               "generation_config.json")


def ship(run_dir, result: dict, dest, *, n_per_family: int, quant: dict | None = None,
         repro: dict | None = None, sweeps: list[str] = ()) -> Path:
    """Copies the trained checkpoint of `run_dir` into `dest` (vl/demo) with its training history
    (data_recipes/lineage.py: the from-scratch run's recipe, summary and loss curve; the fine-tunes after it, if
    any, in train_lineage.json and finetune_loss.png), these results (and those of its `vl quantize` exports,
    `quant`: format -> result), `sweeps` (`sweep_summary` texts, kept in eval_results.json so the card can be
    rendered again from the shipped files) and a model card written from them."""
    import shutil

    from data_recipes.train_log import plot_loss

    run, dest = Path(run_dir), Path(dest)
    history = lineage.record(run)  # read first: `dest` may be the model the oldest fine-tune started from
    base_loss = Path(history["base"]["dir"]) / "loss.png"
    dest.mkdir(parents=True, exist_ok=True)
    for name in MODEL_FILES:
        shutil.copy2(run / "model" / name, dest / name)
    if not (dest / "loss.png").exists() or not base_loss.samefile(dest / "loss.png"):
        shutil.copy2(base_loss, dest / "loss.png")
    for name, obj in ((lineage.RECIPE, history["base"]["recipe"]), (lineage.SUMMARY, history["base"]["summary"])):
        (dest / name).write_text(json.dumps(obj, indent=1) + "\n")
    for stale in (lineage.LINEAGE, FINETUNE_LOSS):
        (dest / stale).unlink(missing_ok=True)
    if history["fine_tunes"]:
        (dest / lineage.LINEAGE).write_text(json.dumps({"fine_tunes": history["fine_tunes"]}, indent=1) + "\n")
        tuned = [t for t in history["fine_tunes"] if (Path(t["run"]) / "log.jsonl").is_file()]  # this ship's
        plot_loss(lineage.loss_rows([t["run"] for t in tuned]), dest / FINETUNE_LOSS,
                  f"{len(tuned)} fine-tunes, one after the other")
    extra = ({"quantized": quant or {}} | ({"sweeps": list(sweeps)} if sweeps else {})
             | ({"second_run": {k: v for k, v in repro.items() if k != "table"}} if repro else {}))
    (dest / "eval_results.json").write_text(json.dumps({**result, **extra}, indent=1) + "\n")
    (dest / "README.md").write_text(model_card(result, history, n_per_family, quant or {}, repro, sweeps))
    return dest


def quant_table(result: dict, quant: dict) -> str:
    """Markdown: per family and mode, the full-precision accuracy and each export's, with the change in points."""
    fams = sorted(result["chance"], key=lambda f: (FAMILIES[f].kind, list(FAMILIES).index(f)))
    modes = [m for m in MODES if m in result["families"]]
    head = "| family | " + " | ".join(f"/{m} fp32" + "".join(f" | /{m} {q}" for q in quant) for m in modes) + " |"
    lines = [head, "|---|" + "---:|" * (len(modes) * (1 + len(quant)))]
    for f in fams + ["macro"]:
        cells = []
        for m in modes:
            base = result["macro"][m] if f == "macro" else result["families"][m].get(f, float("nan"))
            cells.append(f"{100 * base:.1f}")
            for q in quant.values():
                v = q["macro"][m] if f == "macro" else q["families"][m].get(f, float("nan"))
                cells.append(f"{100 * v:.1f} ({100 * (v - base):+.1f})")
        lines.append(f"| {'**macro mean**' if f == 'macro' else f} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def repro_summary(result: dict, run_dir, second_dir) -> dict:
    """A second training run of the same recipe against this one: per family and mode both accuracies and the
    change, the macro changes, the largest per-family change, and the first step whose training loss differs.
    For a fine-tuned model, the second run is a second chain of the same fine-tunes (data_recipes/lineage.py):
    losses are compared over all of the chain's runs in order, steps counted on through them.

    A second run stopped early (its summary.json says `finished: false`, e.g. `vl train-demo --max-minutes`, or
    its chain ends sooner) has no trained model to evaluate: then only the losses of the steps it ran are compared
    (`partial`)."""
    from data_recipes.train_log import read_log

    (chain, fine_tunes), (second_chain, _) = _local_runs(run_dir), _local_runs(second_dir)
    chains = [chain, second_chain]
    second_dir = Path(second_dir)
    summaries = [[json.loads((r / "summary.json").read_text()) for r in c] for c in chains]
    summary = summaries[1][0] if len(chains[1]) == 1 else _chain_summary(summaries[1])
    losses = [[r["loss"] for run in c for r in read_log(run / "log.jsonl")] for c in chains]
    first = next((i + 1 for i, (a, b) in enumerate(zip(*losses)) if a != b), None)
    compared = {"run": str(second_dir), "summary": summary, "steps_compared": min(map(len, losses)),
                "first_differing_step": first if first is not None else "none (identical)",
                "fine_tunes": fine_tunes}
    if not summary["finished"] or len(chains[1]) < len(chains[0]):
        return compared | {"partial": True, "total_steps": sum(s["total_steps"] for s in summaries[0])}
    other = json.loads((second_dir / "eval" / "results.json").read_text())
    fams = sorted(result["chance"], key=lambda f: (FAMILIES[f].kind, list(FAMILIES).index(f)))
    modes = [m for m in MODES if m in result["families"] and m in other.get("families", {})]
    if not modes or set(other["chance"]) != set(result["chance"]):
        raise ConfigError(f"{second_dir}/eval/results.json does not cover the same families and modes as this run")
    head = "| family | " + " | ".join(f"/{m} this | /{m} second run" for m in modes) + " |"
    lines = [head, "|---|" + "---:|" * (2 * len(modes))]
    deltas = []
    for f in fams + ["macro"]:
        cells = []
        for m in modes:
            a = result["macro"][m] if f == "macro" else result["families"][m][f]
            b = other["macro"][m] if f == "macro" else other["families"][m][f]
            cells += [f"{100 * a:.1f}", f"{100 * b:.1f} ({100 * (b - a):+.1f})"]
            if f != "macro":
                deltas.append(abs(b - a))
        lines.append(f"| {'**macro mean**' if f == 'macro' else f} | " + " | ".join(cells) + " |")
    n = {m: set(v.values()) for m, v in result.get("n", {}).items()}
    return compared | {
        "table": "\n".join(lines), "macro_delta": {m: other["macro"][m] - result["macro"][m] for m in modes},
        "max_family_delta": max(deltas), "weights_identical": _same_weights(run_dir, second_dir),
        "n_per_family": min(min(v) for v in n.values()) if n else 0,
    }


def sweep_summary(sweep_dir) -> str:
    """A `vl eval --sweep` run for the card: what it ran on and its table (eval/sweep.py `sweep_markdown`)."""

    d = Path(sweep_dir)
    if not (d / "sweep.json").is_file():
        raise ConfigError(f"--sweeps {d}: no sweep.json (the output folder of `vl eval ... --sweep`)")
    table = json.loads((d / "sweep.json").read_text())
    first = json.loads((d / Path(table["rows"][0]["out"]).name / "summary.json").read_text())  # settings share data
    header, run = first["header"], first["run"]
    labels = ",".join(str(r["label"]) for r in table["rows"])
    return (f"`vl eval --task {table['task']} --sweep {table['key']}={labels}` on the {first['counts']['items']} "
            f"held-out items of `{Path(header['data']).parent.name}/{Path(header['data']).name}` "
            f"({header['reasoning_mode']}, batch {run['batch_size']}, {run['device']}, {run['started_at'][:10]}):\n\n"
            + "\n".join(sweep_markdown(table).splitlines()[2:]))


def _local_runs(run_dir) -> tuple[list[Path], int]:
    """(the run directories whose training made `run_dir`'s model, oldest first; how many of them are fine-tunes).
    Just `run_dir` for a run with no recipe.json, or one trained from scratch."""
    run_dir = Path(run_dir)
    if not (run_dir / "recipe.json").is_file():
        return [run_dir], 0
    chain, shipped = lineage.runs(run_dir)
    return chain, len(chain) - (shipped is None)  # the oldest trained from scratch unless it started from a model


def _chain_summary(summaries: list[dict]) -> dict:
    """One summary for consecutive runs: their wall time, steps and samples added up."""
    total = {k: sum(s[k] for s in summaries) for k in ("elapsed_s", "samples", "steps", "total_steps")}
    return total | {"finished": all(s["finished"] for s in summaries),
                    "samples_per_s": total["samples"] / max(total["elapsed_s"], 1e-9)}


def _same_weights(run_dir, second_dir) -> bool | None:
    """Whether the two runs' trained models hold equal tensors (None when either model file is missing)."""
    from safetensors.torch import load_file

    files = [Path(d) / "model" / "model.safetensors" for d in (run_dir, second_dir)]
    if not all(f.is_file() for f in files):
        return None
    a, b = (load_file(f) for f in files)
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def model_card(result: dict, history: dict, n_per_family: int, quant: dict | None = None,
               repro: dict | None = None, sweeps: list[str] = ()) -> str:
    """The card for a model with this training `history` (data_recipes.lineage.record) and held-out `result`."""
    from data_recipes.model_card import render

    return render(result=result, summary=history["base"]["summary"], recipe=history["base"]["recipe"],
                  fine_tunes=history.get("fine_tunes", []), n_per_family=n_per_family, table=table(result),
                  quant_table=quant_table(result, quant) if quant else None, repro=repro, sweeps=sweeps)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python scripts/demo_eval.py", description=__doc__.splitlines()[0])
    p.add_argument("--model", default=None, help="checkpoint directory (default: the shipped demo model)")
    p.add_argument("--n", type=int, default=100, help="test samples per family")
    p.add_argument("--out", default="runs/demo_eval", help="where the test files and results go")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--modes", default="no_think,think")
    p.add_argument("--batch-size", type=int, default=16)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--dtype", default=None)
    p.add_argument("--render-size", type=int, default=None, metavar="PX",
                   help="draw the test pages and frames at PX pixels (default: the model's tile size); the "
                        "processor resizes them to the tile, as it does a user's image")
    p.add_argument("--ship", default=None, metavar="DEST", help="copy the run's model + card here (e.g. vl/demo)")
    p.add_argument("--run", default=None, help="the training run directory (for --ship; default: --model/..)")
    p.add_argument("--results", default=None, help="reuse this results.json instead of evaluating again")
    p.add_argument("--quant-results", default=None, metavar="FMT=PATH,...",
                   help="results.json of the model's `vl quantize` exports, for the card (with --ship)")
    p.add_argument("--second-run", default=None, metavar="RUN_DIR",
                   help="a second training run of the same recipe (evaluated into RUN_DIR/eval): its accuracies "
                        "against this run's go in the card's reproducibility section (with --ship)")
    p.add_argument("--sweeps", default=None, metavar="DIR,...",
                   help="output folders of `vl eval ... --sweep` on this model (e.g. EVS rates on 64-frame clips): "
                        "their tables go in the card (with --ship)")
    args = p.parse_args(argv)
    from vl.cli import default_model

    torch.set_num_threads(args.threads)
    modes = tuple(m for m in args.modes.split(",") if m)
    if bad := [m for m in modes if m not in MODES]:
        raise ConfigError(f"--modes takes {sorted(MODES)}, found {bad}")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    if args.results:
        result = json.loads(Path(args.results).read_text())
    else:
        result = evaluate_files(args.model or default_model(), out / "data", n_per_family=args.n, seed=args.seed,
                                modes=modes, batch_size=args.batch_size, dtype=args.dtype,
                                records_path=out / "predictions.jsonl", render_size=args.render_size)
        (out / "results.json").write_text(json.dumps(result, indent=1) + "\n")
    print(table(result))
    quant = {}
    for pair in filter(None, (args.quant_results or "").split(",")):
        name, _, path = pair.partition("=")
        if not path:
            raise ConfigError(f"--quant-results takes FMT=PATH pairs, found {pair!r}")
        quant[name] = json.loads(Path(path).read_text())
    if quant:
        print(quant_table(result, quant))
    if args.ship:
        run = Path(args.run) if args.run else Path(args.model or default_model()).parent
        repro = repro_summary(result, run, args.second_run) if args.second_run else None
        if repro:
            print(repro.get("table") or f"second run stopped after {repro['steps_compared']} steps; losses differ "
                                        f"first at step {repro['first_differing_step']}")
        sweeps = [sweep_summary(d) for d in filter(None, (args.sweeps or "").split(","))]
        print(f"shipped to {ship(run, result, args.ship, n_per_family=args.n, quant=quant, repro=repro, sweeps=sweeps)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
