"""Recipes: YAML presets named after papers.

Each file ``<name>.yaml`` holds ``name``, ``title``, ``citation``, ``seed``
(the seed-catalog id, when the paper is one of the seeds), ``description``,
``components`` (which registered functions to use) and ``parameters`` (their
settings). Both ``components`` and ``parameters`` are config keys: applying a
recipe is merging them into the config, below ``--config`` and ``--key value``.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from ..errors import ConfigError

HERE = Path(__file__).parent


def recipe_names() -> list[str]:
    return sorted(p.stem for p in HERE.glob("*.yaml"))


def load_recipe(name: str) -> dict[str, Any]:
    path = HERE / f"{name}.yaml"
    if not path.exists():
        raise ConfigError(f"unknown recipe '{name}'; valid recipes: {', '.join(recipe_names())}")
    data = yaml.safe_load(path.read_text())
    data.setdefault("components", {})
    data.setdefault("parameters", {})
    return data


def recipe_overrides(name: str) -> dict[str, Any]:
    """The config keys a recipe sets."""
    r = load_recipe(name)
    return {**r["components"], **r["parameters"]}


def all_recipes() -> list[dict[str, Any]]:
    return [load_recipe(n) for n in recipe_names()]
