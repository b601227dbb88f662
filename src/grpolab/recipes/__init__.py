"""Recipes: YAML presets named after papers.

Each file ``<name>.yaml`` holds ``name``, ``title``, ``citation``, ``seed``
(the seed-catalog id, when the paper is one of the seeds), ``description``,
optionally ``partial`` (one sentence: what of the paper is not built and why; the
recipe is then listed as a partial reconstruction), ``components`` (which registered functions to use) and ``parameters`` (their
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
    if "partial" in data and not (isinstance(data["partial"], str) and data["partial"].strip()):
        raise ConfigError(f"{path}: 'partial' must be one sentence saying what of the paper is not built")
    return data


PARTIAL = "partial reconstruction"


def partial_note(recipe: dict[str, Any]) -> str:
    """``"partial reconstruction: <what is missing>"`` for a recipe that builds only part of its paper, else ""."""
    return f"{PARTIAL}: {' '.join(recipe['partial'].split())}" if recipe.get("partial") else ""


# A recipe's *task* settings: they describe its built-in task (which task, weights of that task's rewards,
# hint templates written for its columns) and do not apply to a user's --data. Everything else is the method.
TASK_KEYS = ("task", "reward_weights", "injection_reference_template", "arithmetic_paraphrases")


def recipe_overrides(name: str, user_data: bool = False) -> dict[str, Any]:
    """The config keys a recipe sets; with ``user_data`` (a run on --data) without its task settings
    (:data:`TASK_KEYS` and the parameters of the recipe's task): its method settings apply to any data
    (docs/data.md)."""
    r = load_recipe(name)
    out = {**r["components"], **r["parameters"]}
    if user_data:  # also the parameters its built-in task declares (e.g. shape_segmentation's segment_format)
        from ..registry import TASKS
        task = out.get("task")
        own = set(TASKS.params(task)) if isinstance(task, str) and task in TASKS else set()
        out = {k: v for k, v in out.items() if k not in TASK_KEYS and k not in own}
    return out


def method_rewards(name: str) -> list[str]:
    """Reward specs a recipe's method adds (e.g. ``pm4grpo``'s conformance reward): on --data they are
    kept next to the user's own reward functions."""
    return [str(s) for s in load_recipe(name)["parameters"].get("reward", [])]


def all_recipes() -> list[dict[str, Any]]:
    return [load_recipe(n) for n in recipe_names()]
