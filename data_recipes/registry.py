"""Every training recipe by name: the product's (data_recipes/recipes.py) and the experiments' (data_recipes/experiments/)."""

from __future__ import annotations

from data_recipes.experiments.evs import (evs_long_recipe, evs_pruned_recipe, evs_settle_recipe, evs_tune_recipe,
                                          evs_where_recipe)
from data_recipes.recipes import Recipe, demo_recipe, smoke_recipe
from vl.errors import ConfigError

RECIPES = {"demo": demo_recipe, "smoke": smoke_recipe, "evs_tune": evs_tune_recipe, "evs_long": evs_long_recipe,
           "evs_where": evs_where_recipe, "evs_pruned": evs_pruned_recipe, "evs_settle": evs_settle_recipe}


def get_recipe(name: str, **kwargs) -> Recipe:
    if name not in RECIPES:
        raise ConfigError(f"unknown recipe {name!r}; known: {sorted(RECIPES)}")
    return RECIPES[name](**kwargs)
