"""The demo model card's reproducibility section: a second training run's accuracies against the shipped one's."""

import json
from dataclasses import asdict

import pytest

from data_recipes.demo_eval import model_card, repro_summary
from data_recipes.recipes import get_recipe
from vl.errors import ConfigError

FAMS = ("doc_total", "video_flash")


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
    card = model_card(first, summary, recipe, 50, repro=repro)
    assert "macro mean change /no_think +1.0; /think +3.0 points" in card and "50.0 min" in card
    assert "first differ at step 3" in card and repro["table"] in card
    assert "has not been measured" in model_card(first, summary, recipe, 50)
    assert "its weakest family on this test split is doc_total (40% / 30%)" in card
    assert "| full | vlm | 5 | 0.01 | all | 0.5 | 4 | 2 |" in card  # the smoke recipe's tower-only pages
    assert "Tower-only samples (family: weight): doc_table (1);" in card
    del recipe["probe_sources"], recipe["stages"][1]["probe_samples"]  # a run from before tower-only samples
    assert "| full | vlm | 5 | 0.01 | all | 0.5 | 4 | 0 |" in (old := model_card(first, summary, recipe, 50))
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
    card = model_card(result, summary, recipe, 50, repro=repro)
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
    card = model_card(result, summary, recipe, 50, repro=repro)
    assert "stopped after 2 of 4 steps" in card and "losses are equal at all 2 steps" in card
    assert "accuracy was not measured" in card
    _run(tmp_path / "c", None, [2.0, 1.6], elapsed=60.0, total_steps=4)
    assert "losses first differ at step 2" in model_card(result, summary, recipe, 50,
                                                        repro=repro_summary(result, tmp_path / "a", tmp_path / "c"))
