"""Experiments on the demo model, apart from the recipes a user runs; reproducible by name (data_recipes/registry.py)."""
