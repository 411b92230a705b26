"""The demo model card's reproducibility section: a second training run's accuracies against the shipped one's."""

import json
from dataclasses import asdict
from pathlib import Path

import pytest

from data_recipes import lineage
from demo_eval import model_card, repro_summary
from data_recipes.registry import get_recipe
from vl.errors import ConfigError

FAMS = ("doc_total", "video_flash")
ROOT = Path(__file__).resolve().parents[2]


def _result(acc: dict[str, tuple[float, float]], n: int = 50) -> dict:
    fam = {m: {f: acc[f][i] for f in FAMS} for i, m in enumerate(("no_think", "think"))}
    return {"families": fam, "chance": {f: 0.1 for f in FAMS},
            "macro": {m: sum(v.values()) / len(v) for m, v in fam.items()},
            "n": {m: {f: n for f in FAMS} for m in fam}}


def _run(path, result, losses, elapsed=3600.0, total_steps=None):
    (path / "eval").mkdir(parents=True)
    if result is not None:
        (path / "eval" / "results.json").write_text(json.dumps(result))
    (path / "log.jsonl").write_text("".join(json.dumps({"step": i + 1, "loss": x}) + "\n" for i, x in enumerate(losses)))
    summary = {"steps": len(losses), "total_steps": total_steps or len(losses),
               "finished": total_steps in (None, len(losses)), "samples": 320, "tokens": 9000, "elapsed_s": elapsed, "samples_per_s": 18.0,
               "tokens_per_s": 2000.0, "threads": 2, "parameters": {"vision": 1, "projector": 2, "language_model": 3,
                                                                      "total": 6}}
    (path / "summary.json").write_text(json.dumps(summary))
    return summary


def test_second_run_table_deltas_and_first_differing_step(tmp_path):
    first = _result({"doc_total": (0.40, 0.30), "video_flash": (0.90, 0.80)})
    second = _result({"doc_total": (0.44, 0.30), "video_flash": (0.88, 0.86)})
    summary = _run(tmp_path / "a", first, [2.0, 1.5, 1.2, 1.0])
    _run(tmp_path / "b", second, [2.0, 1.5, 1.25, 1.1], elapsed=3000.0)
    repro = repro_summary(first, tmp_path / "a", tmp_path / "b")
    assert repro["macro_delta"] == pytest.approx({"no_think": 0.01, "think": 0.03})
    assert repro["max_family_delta"] == pytest.approx(0.06)
    assert repro["first_differing_step"] == 3 and repro["n_per_family"] == 50
    assert "| doc_total | 40.0 | 44.0 (+4.0) | 30.0 | 30.0 (+0.0) |" in repro["table"]
    recipe = json.loads(json.dumps(asdict(get_recipe("smoke")), default=str))
    card = model_card(first, {"base": {"summary": summary, "recipe": recipe}}, 50, repro=repro)
    assert "macro mean change /no_think +1.0; /think +3.0 points" in card and "50.0 min" in card
    assert "first differ at step 3" in card and repro["table"] in card
    assert "has not been measured" in model_card(first, {"base": {"summary": summary, "recipe": recipe}}, 50)
    assert "its weakest family on this test split is doc_total (40% / 30%)" in card
    assert "| full | vlm | 5 | 0.01 | all | 0.5 | 4 | 2 |" in card  # the smoke recipe's tower-only pages
    assert "Tower-only samples (family: weight): doc_table (1);" in card
    del recipe["probe_sources"], recipe["stages"][1]["probe_samples"]  # a run from before tower-only samples
    assert "| full | vlm | 5 | 0.01 | all | 0.5 | 4 | 0 |" in (old := model_card(first, {"base": {"summary": summary, "recipe": recipe}}, 50))
    assert "Tower-only" not in old


def test_second_run_must_cover_the_same_families(tmp_path):
    first = _result({"doc_total": (0.4, 0.3), "video_flash": (0.9, 0.8)})
    other = _result({"doc_total": (0.4, 0.3), "video_flash": (0.9, 0.8)})
    other["chance"] = {"doc_total": 0.1}
    _run(tmp_path / "a", first, [1.0])
    _run(tmp_path / "b", other, [1.0])
    with pytest.raises(ConfigError, match="same families"):
        repro_summary(first, tmp_path / "a", tmp_path / "b")


def test_identical_second_run_says_so_and_compares_weights(tmp_path):
    import torch
    from safetensors.torch import save_file

    result = _result({"doc_total": (0.4, 0.3), "video_flash": (0.9, 0.8)})
    summary = _run(tmp_path / "a", result, [2.0, 1.5, 1.2])
    _run(tmp_path / "b", result, [2.0, 1.5, 1.2])
    for run, w in (("a", 1.0), ("b", 1.0)):
        (tmp_path / run / "model").mkdir()
        save_file({"w": torch.full((2, 2), w)}, tmp_path / run / "model" / "model.safetensors")
    repro = repro_summary(result, tmp_path / "a", tmp_path / "b")
    assert repro["first_differing_step"] == "none (identical)" and repro["weights_identical"] is True
    assert repro["max_family_delta"] == 0 and repro["steps_compared"] == 3
    recipe = json.loads(json.dumps(asdict(get_recipe("smoke")), default=str))
    card = model_card(result, {"base": {"summary": summary, "recipe": recipe}}, 50, repro=repro)
    assert "equal at all 3 steps and the trained weights are equal, tensor for tensor" in card
    save_file({"w": torch.full((2, 2), 1.5)}, tmp_path / "b" / "model" / "model.safetensors")
    assert repro_summary(result, tmp_path / "a", tmp_path / "b")["weights_identical"] is False


def test_second_run_stopped_early_compares_only_its_losses(tmp_path):
    result = _result({"doc_total": (0.4, 0.3), "video_flash": (0.9, 0.8)})
    summary = _run(tmp_path / "a", result, [2.0, 1.5, 1.2, 1.0])
    _run(tmp_path / "b", None, [2.0, 1.5], elapsed=60.0, total_steps=4)  # stopped by --max-minutes: no model, no eval
    repro = repro_summary(result, tmp_path / "a", tmp_path / "b")
    assert repro["partial"] is True and repro["steps_compared"] == 2 and repro["total_steps"] == 4
    assert repro["first_differing_step"] == "none (identical)" and "table" not in repro
    recipe = json.loads(json.dumps(asdict(get_recipe("smoke")), default=str))
    card = model_card(result, {"base": {"summary": summary, "recipe": recipe}}, 50, repro=repro)
    assert "stopped after 2 of 4 steps" in card and "losses are equal at all 2 steps" in card
    assert "accuracy was not measured" in card
    _run(tmp_path / "c", None, [2.0, 1.6], elapsed=60.0, total_steps=4)
    assert "losses first differ at step 2" in model_card(result, {"base": {"summary": summary, "recipe": recipe}}, 50,
                                                        repro=repro_summary(result, tmp_path / "a", tmp_path / "c"))


def _save(path: Path, obj) -> None:
    path.write_text(json.dumps(obj))


def _recipe(name: str, init_from=None, seed=None, **kw) -> dict:
    recipe = get_recipe(name, **({"init_from": str(init_from)} if init_from else {}), **kw)
    return json.loads(json.dumps(asdict(recipe if seed is None else recipe.replace(seed=seed)), default=str))


def _fine_tune(run: Path, init_from, losses, seed=None, finished=True):
    """A finished (or stopped) evs_pruned run from `init_from`; a from-scratch smoke run when that is None."""
    from demo_eval import MODEL_FILES

    summary = _run(run, None, losses, elapsed=600.0, total_steps=None if finished else len(losses) + 1)
    recipe = _recipe("evs_pruned", init_from, seed, total_steps=len(losses)) if init_from else _recipe("smoke")
    _save(run / "recipe.json", recipe)
    (run / "model").mkdir()
    for name in MODEL_FILES:
        (run / "model" / name).write_text(f"{run.name} {name}")
    (run / "loss.png").write_bytes(b"png of " + run.name.encode())
    return summary


def _shipped_base(tmp_path) -> Path:
    base = tmp_path / "demo"
    _run(base, None, [2.0, 1.0], elapsed=4800.0)
    _save(base / "train_summary.json", json.loads((base / "summary.json").read_text()))
    _save(base / "train_recipe.json", _recipe("smoke"))
    (base / "loss.png").write_bytes(b"base curve")
    return base


def test_ship_a_fine_tuned_model_keeps_its_base_and_lists_each_fine_tune(tmp_path):
    from demo_eval import ship

    base = _shipped_base(tmp_path)
    _fine_tune(tmp_path / "ft1", base, [1.0, 0.9, 0.8])
    _fine_tune(tmp_path / "ft2", tmp_path / "ft1" / "model", [0.9, 0.7], seed=3)
    assert lineage.runs(tmp_path / "ft2") == ([tmp_path / "ft1", tmp_path / "ft2"], base)
    result = _result({"doc_total": (0.9, 0.8), "video_flash": (0.7, 0.95)})
    ship(tmp_path / "ft2", result, base, n_per_family=50)  # into the model the chain started from, as into vl/demo
    assert (base / "model.safetensors").read_text() == "ft2 model.safetensors"
    assert (base / "loss.png").read_bytes() == b"base curve" and (base / "finetune_loss.png").stat().st_size > 0
    assert json.loads((base / "train_recipe.json").read_text())["name"] == "smoke"
    assert json.loads((base / "train_summary.json").read_text())["elapsed_s"] == 4800.0
    tunes = json.loads((base / "train_lineage.json").read_text())["fine_tunes"]
    assert [(Path(t["run"]).name, t["recipe"]["seed"], t["summary"]["steps"]) for t in tunes] == [
        ("ft1", get_recipe("evs_pruned").seed, 3), ("ft2", 3, 2)]
    card = (base / "README.md").read_text()
    assert "trained from scratch, then fine-tuned)" in card
    assert "Then 2 fine-tunes" in card and "5 steps and 20.0 min in all" in card
    assert "| 1 | `vl train-demo --recipe evs_pruned --steps 3` | 3 | 0.0003 | all | 0 / 0.5 / 0.75 / 0.75 | 0.5 |" in card
    assert "| 2 | `vl train-demo --recipe evs_pruned --seed 3 --steps 2` | 2 |" in card
    assert "trained for 100.0 min in all (80.0 min from scratch, 20.0 min of fine-tunes)" in card
    assert "| full | vlm | 5 | 0.01 |" in card  # the base's stages, from its train_recipe.json
    # shipped again (a new card): the chain's first run is listed there, so it still started from the base alone
    assert [Path(t["run"]).name for t in lineage.record(tmp_path / "ft2")["fine_tunes"]] == ["ft1", "ft2"]
    ship(tmp_path / "ft2", result, base, n_per_family=50)
    assert (base / "README.md").read_text() == card

    # a later fine-tune from the shipped fine-tuned model carries the earlier ones on
    _fine_tune(tmp_path / "ft3", base, [0.5])
    ship(tmp_path / "ft3", result, tmp_path / "elsewhere", n_per_family=50)
    tunes = json.loads((tmp_path / "elsewhere" / "train_lineage.json").read_text())["fine_tunes"]
    assert [Path(t["run"]).name for t in tunes] == ["ft1", "ft2", "ft3"]
    assert (tmp_path / "elsewhere" / "loss.png").read_bytes() == b"base curve"
    assert "Then 3 fine-tunes" in (tmp_path / "elsewhere" / "README.md").read_text()

    # a from-scratch run shipped over it leaves no fine-tune files behind
    scratch = tmp_path / "scratch"
    _fine_tune(scratch, None, [2.0, 1.0])
    ship(scratch, result, base, n_per_family=50)
    assert not (base / "train_lineage.json").exists() and not (base / "finetune_loss.png").exists()
    assert (base / "loss.png").read_bytes() == b"png of scratch"
    assert "trained from scratch)" in (card := (base / "README.md").read_text()) and "fine-tunes" not in card


def test_lineage_refuses_what_it_cannot_describe(tmp_path):
    base = _shipped_base(tmp_path)
    _fine_tune(tmp_path / "ft1", base, [1.0, 0.9], finished=False)
    with pytest.raises(ConfigError, match="stopped early"):
        lineage.record(tmp_path / "ft1")
    _fine_tune(tmp_path / "ft2", base, [1.0])
    (base / "train_recipe.json").unlink()  # a model shipped before its recipe was kept beside it
    with pytest.raises(ConfigError, match="train_recipe.json: missing"):
        lineage.record(tmp_path / "ft2")
    _save(tmp_path / "ft2" / "recipe.json", _recipe("evs_pruned", tmp_path / "ft2" / "model"))
    with pytest.raises(ConfigError, match="loops"):
        lineage.runs(tmp_path / "ft2")


def test_second_chain_compares_losses_across_all_its_runs(tmp_path):
    import torch
    from safetensors.torch import save_file

    base = _shipped_base(tmp_path)
    result = _result({"doc_total": (0.9, 0.8), "video_flash": (0.7, 0.95)})
    for chain, second_loss in (("a", 0.8), ("b", 0.75)):
        _fine_tune(tmp_path / f"{chain}1", base, [1.0, 0.9])
        _fine_tune(tmp_path / f"{chain}2", tmp_path / f"{chain}1" / "model", [0.9, second_loss], seed=3)
        save_file({"w": torch.ones(2)}, tmp_path / f"{chain}2" / "model" / "model.safetensors")
    _save(tmp_path / "b2" / "eval" / "results.json", result)
    repro = repro_summary(result, tmp_path / "a2", tmp_path / "b2")
    assert repro["fine_tunes"] == 2 and repro["steps_compared"] == 4 and repro["first_differing_step"] == 4
    assert repro["summary"]["elapsed_s"] == 1200.0 and repro["weights_identical"] is True
    card = model_card(result, lineage.record(tmp_path / "a2"), 50, repro=repro)
    assert "A second chain of the same 2 fine-tunes from the same model (" in card and "20.0 min" in card
    assert "first differ at step 4" in card
    partial = repro_summary(result, tmp_path / "a2", tmp_path / "b1")  # the second chain's first run only
    assert partial["partial"] is True and partial["steps_compared"] == 2 and partial["total_steps"] == 4


def test_the_shipped_card_is_what_its_shipped_files_render():
    """vl/demo/README.md again from vl/demo's train_recipe.json, train_summary.json, train_lineage.json and
    eval_results.json (its sweeps included): equal
    except the reproducibility section, whose table is not kept (only its summary numbers are)."""
    demo = ROOT / "vl" / "demo"
    results = json.loads((demo / "eval_results.json").read_text())
    quant, sweeps, _ = results.pop("quantized"), results.pop("sweeps", []), results.pop("second_run", None)
    history = lineage.of_shipped(demo)
    card = model_card(results, history, 100, quant, sweeps=sweeps)
    shipped = (demo / "README.md").read_text()
    assert "\nReproduce: `scripts/train_demo.sh` (trains from scratch" in card
    cut = [(c.index("\nReproduce:"), c.index("\nFP8 ")) for c in (card, shipped)]
    assert card[:cut[0][0]] == shipped[:cut[1][0]] and card[cut[0][1]:] == shipped[cut[1][1]:]


def test_sweeps_go_in_the_card_with_what_they_ran_on(tmp_path):
    from demo_eval import sweep_summary

    d = tmp_path / "settle_v64"
    rows = [{"label": q, "score": sc, "n": 200, "n_error": 0, "vision_tokens_after": v, "vision_tokens_before": 576.0,
             "prompt_tokens": 1000 + v, "items_per_s": 5.0, "ttft_s": 1.5, "out": f"elsewhere/video_pruning_rate={q}"}
            for q, sc, v in (("0", 0.805, 576.0), ("0.75", 0.795, 144.0))]
    rows[1]["change_vs_first"] = {"change": -0.01, "low": -0.035, "high": 0.015, "n": 200, "n_differ": 8}
    (d / "video_pruning_rate=0").mkdir(parents=True)
    _save(d / "sweep.json", {"task": "synthetic_video", "key": "video_pruning_rate", "rows": rows})
    _save(d / "video_pruning_rate=0" / "summary.json", {
        "header": {"data": "/x/runs/evs/video64/video_test.jsonl", "reasoning_mode": "/no_think"},
        "run": {"batch_size": 8, "device": "cpu", "started_at": "2026-12-02T01:01:01"}, "counts": {"items": 200}})
    text = sweep_summary(d)
    assert text.startswith("`vl eval --task synthetic_video --sweep video_pruning_rate=0,0.75` on the 200 held-out "
                           "items of `video64/video_test.jsonl` (/no_think, batch 8, cpu, 2026-12-02):")
    assert "| 0.75 | 0.7950 | -0.0100 [-0.0350, +0.0150] (8 of 200) | 144.0 / 576.0 | 1144.0 | 1.5 |" in text
    result = _result({"doc_total": (0.9, 0.8), "video_flash": (0.7, 0.95)})
    history = {"base": {"summary": _run(tmp_path / "a", result, [1.0]), "recipe": _recipe("smoke")}}
    card = model_card(result, history, 50, sweeps=[text])
    assert "## Held-out sweeps" in card and text in card
    assert "## Held-out sweeps" not in model_card(result, history, 50)
    with pytest.raises(ConfigError, match="no sweep.json"):
        sweep_summary(tmp_path / "a")
