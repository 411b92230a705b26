"""Recipes (data_recipes/recipes.py): plain data that builds the demo model's config and schedule."""

import dataclasses

import pytest

from data_recipes.recipes import ModelSpec, Recipe, Source, Stage
from data_recipes.registry import get_recipe
from data_recipes.synthetic import FAMILIES
from data_recipes.tokenizer import train_tokenizer
from vl.errors import ConfigError

CORPUS = ["What is the total? 42", "Frame 1 sampled at 0.50 seconds:", "left right up down"] * 10


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory):
    return train_tokenizer(CORPUS, 300, tmp_path_factory.mktemp("tok"))


def test_demo_recipe_trains_on_every_family_in_two_stages():
    r = get_recipe("demo")
    assert {s.family for s in r.sources} == {f for f in FAMILIES if FAMILIES[f].kind != "audio"}  # it does not hear
    assert [s.name for s in r.stages] == ["vision", "full"]
    # stage 1 teaches the from-scratch tower to see (probe targets only, LM untouched); stage 2 trains all
    assert r.stages[0].trainable == ("vision.", "projector.") and r.stages[0].objective == "vision"
    assert r.stages[1].trainable == ("",) and r.stages[1].objective == "vlm" and r.stages[1].aux_weight > 0
    assert r.total_steps == sum(s.steps for s in r.stages)
    assert all(s.options == (("num_frames", 8), ("fps", 2.0)) for s in r.sources if s.kind == "video")
    assert r.sampler == "rs2" and 0 < r.think_fraction < 1
    assert get_recipe("demo", total_steps=600).total_steps == 600
    # tower-only pages for the families whose digits the tower misreads, in both stages
    assert {s.family for s in r.probe_sources} == {"doc_table", "doc_total"} and all(s.probe_samples for s in r.stages)


def test_stage_boundaries_and_learning_rate_schedule():
    r = Recipe("t", ModelSpec(), (Source("doc_count"),),
               (Stage("a", 10, 1e-3, warmup_steps=5, min_lr_ratio=1.0), Stage("b", 20, 2e-3, warmup_steps=4)))
    assert r.stage_at(0)[0].name == "a" and r.stage_at(9) == (r.stages[0], 9) and r.stage_at(10) == (r.stages[1], 0)
    with pytest.raises(ConfigError):
        r.stage_at(30)
    assert r.lr_at(0) == pytest.approx(2e-4) and r.lr_at(4) == pytest.approx(1e-3) and r.lr_at(9) == pytest.approx(1e-3)
    assert r.lr_at(13) == pytest.approx(2e-3)  # end of warm-up
    lrs = [r.lr_at(k) for k in range(13, 30)]
    assert all(a >= b for a, b in zip(lrs, lrs[1:]))  # cosine decay
    assert lrs[-1] >= 0.1 * 2e-3 - 1e-12 and lrs[-1] < 0.2 * 2e-3


def test_stage_pruning_rates_are_drawn_per_step_and_validated():
    s = Stage("x", 10, 1e-3, video_pruning_rates=(0.0, 0.5, 0.75))
    draws = [s.pruning_rate(0, k) for k in range(200)]
    assert set(draws) == {0.0, 0.5, 0.75} and draws == [s.pruning_rate(0, k) for k in range(200)]
    assert draws != [s.pruning_rate(1, k) for k in range(200)]  # keyed by the recipe's seed too
    assert Stage("y", 1, 1e-3).pruning_rate(0, 3) == 0.0
    for bad in ((1.0,), (-0.1,)):
        with pytest.raises(ConfigError, match="video_pruning_rates"):
            Stage("x", 1, 1e-3, video_pruning_rates=bad)


def test_the_evs_tune_experiment_starts_from_the_from_scratch_model_and_trains_the_lm_alone():
    r = get_recipe("evs_tune")  # not vl/demo: the shipped model is already the end of the EVS fine-tunes
    assert r.init_from == "runs/demo/model" and r.total_steps == 600 and len(r.stages) == 1
    assert get_recipe("evs_settle").init_from == "runs/demo/model"
    (stage,) = r.stages
    assert stage.trainable == ("language_model.",) and stage.video_pruning_rates == (0.0, 0.0, 0.5, 0.75)
    assert stage.probe_samples == 0 and stage.aux_weight == 0.0
    assert r.sources == get_recipe("demo").sources and r.model == get_recipe("demo").model


def test_the_evs_long_experiment_splits_each_video_family_into_8_and_64_frame_clips():
    from data_recipes.experiments.evs import LONG_VIDEO_OPTIONS
    from data_recipes.recipes import VIDEO_OPTIONS

    tune, r = get_recipe("evs_tune"), get_recipe("evs_long", long_share=0.25)
    assert r.stages[0].video_pruning_rates == tune.stages[0].video_pruning_rates and r.init_from == tune.init_from
    docs = [s for s in r.sources if s.kind == "document"]
    assert docs == [s for s in tune.sources if s.kind == "document"]
    for s in (s for s in tune.sources if s.kind == "video"):
        pair = [x for x in r.sources if x.family == s.family]
        assert [x.options for x in pair] == [VIDEO_OPTIONS, LONG_VIDEO_OPTIONS]
        assert [x.weight for x in pair] == pytest.approx([0.75 * s.weight, 0.25 * s.weight])
    assert r.packing.max_seq_len >= 2048  # a 64-frame clip is ~1.6k tokens
    with pytest.raises(ConfigError, match="long_share"):
        get_recipe("evs_long", long_share=1.0)


def test_the_evs_where_experiment_is_evs_long_with_everything_trainable_and_the_position_loss():
    long, r = get_recipe("evs_long"), get_recipe("evs_where", position_weight=0.25)
    (stage,) = r.stages
    assert r.sources == long.sources and r.packing == long.packing and r.init_from == long.init_from
    assert stage.trainable == ("",) and stage.position_weight == 0.25
    assert stage.video_pruning_rates == long.stages[0].video_pruning_rates and stage.steps == long.stages[0].steps
    assert all(s.position_weight == 0.0 for s in get_recipe("demo").stages)  # the shipped recipe builds no head


def test_the_evs_pruned_experiment_is_evs_where_pruned_three_steps_in_four_with_a_fresh_seed():
    where, r = get_recipe("evs_where"), get_recipe("evs_pruned", init_from="runs/evs_where2/model")
    (stage,) = r.stages
    assert r.sources == where.sources and r.packing == where.packing and r.init_from == "runs/evs_where2/model"
    assert stage.video_pruning_rates == (0.0, 0.5, 0.75, 0.75) and r.seed != where.seed
    assert stage.position_weight == where.stages[0].position_weight and stage.trainable == ("",)
    rates = [stage.pruning_rate(r.seed, k) for k in range(400)]
    assert 0.15 < rates.count(0.0) / 400 < 0.35  # a quarter of the steps see every token


def test_the_evs_settle_experiment_is_evs_where_half_unpruned_with_a_falling_rate():
    where, r = get_recipe("evs_where"), get_recipe("evs_settle", init_from="runs/evs_pruned2/model")
    (stage,) = r.stages
    assert r.sources == where.sources and r.packing == where.packing and r.init_from == "runs/evs_pruned2/model"
    assert stage.video_pruning_rates == (0.0, 0.75) and r.seed not in (where.seed, get_recipe("evs_pruned").seed)
    assert stage.position_weight == where.stages[0].position_weight and stage.trainable == ("",)
    rates = [stage.pruning_rate(r.seed, k) for k in range(400)]
    assert 0.4 < rates.count(0.0) / 400 < 0.6 and set(rates) == {0.0, 0.75}
    peak, last = r.lr_at(stage.warmup_steps), r.lr_at(r.total_steps - 1)
    assert peak == pytest.approx(1.5e-4) and last == pytest.approx(0.1 * peak, rel=1e-3)
    assert r.lr_at(r.total_steps // 2) < peak  # decays, where evs_where holds its rate
    assert where.lr_at(where.total_steps - 1) == pytest.approx(where.lr_at(where.stages[0].warmup_steps))


def test_bad_recipes_are_errors():
    with pytest.raises(ConfigError, match="unknown family"):
        Source("doc_poem")
    with pytest.raises(ConfigError):
        Source("doc_count", weight=0.0)
    with pytest.raises(ConfigError):
        Stage("x", 0, 1e-3)
    with pytest.raises(ConfigError, match="sampler"):
        get_recipe("smoke").replace(sampler="uniform")
    with pytest.raises(ConfigError, match="unknown recipe"):
        get_recipe("giant")
    with pytest.raises(ConfigError, match="position_weight must be >= 0"):
        Stage("x", 1, 1e-3, position_weight=-0.5)
    with pytest.raises(ConfigError, match="probe_samples must be >= 0"):
        Stage("x", 1, 1e-3, probe_samples=-1)
    with pytest.raises(ConfigError, match="no probe_sources"):
        get_recipe("smoke").replace(probe_sources=())


def test_model_spec_builds_a_nano_vl_config_from_the_tokenizer(tokenizer):
    from vl.modeling.vlm import NemotronVL

    spec = get_recipe("demo").model
    cfg = spec.vl_config(tokenizer)
    assert cfg.lm.vocab_size == len(tokenizer)
    assert cfg.tokens.img_context_id == tokenizer.convert_tokens_to_ids("<image>")
    assert cfg.tokens.video_context_id == tokenizer.convert_tokens_to_ids("<video>")
    assert cfg.lm.eos_token_id == (tokenizer.convert_tokens_to_ids("<SPECIAL_12>"),)
    assert cfg.max_num_tiles == 1 and cfg.force_image_size == spec.tile_size
    assert cfg.tokens_per_tile == (spec.tile_size // 32) ** 2
    assert set(cfg.lm.pattern) == {"M", "*", "-"}  # a hybrid, like the real LLM
    model = NemotronVL(cfg)
    n = sum(p.numel() for p in model.parameters())
    assert n * 4 < 30e6  # fp32 weights well inside the 30 MB package budget
    with pytest.raises(ConfigError, match="no id"):
        dataclasses.replace(spec).vl_config(type("T", (), {"convert_tokens_to_ids": lambda s, t: None,
                                                            "unk_token_id": 0, "__len__": lambda s: 1})())
