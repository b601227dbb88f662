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


def _is_image_policy(name) -> bool:
    from ..registry import POLICIES
    return isinstance(name, str) and name in POLICIES and "images" in getattr(POLICIES.get(name), "capabilities", ())


def _unmet_needs(components: dict, policy: str) -> list[str]:
    """``"<key> <name> needs <capability>"`` for each of ``components`` that needs a capability ``policy``
    lacks."""
    from ..registry import ALL_REGISTRIES, POLICIES
    has = frozenset(getattr(POLICIES.get(policy), "capabilities", ())) if policy in POLICIES else frozenset()
    out = []
    for key, value in components.items():
        for reg in (r for r in ALL_REGISTRIES.values() if r.key == key):
            for v in value if isinstance(value, list) else [value]:
                missing = [c for c in reg.needs(v) if c not in has] if isinstance(v, str) and v in reg else []
                if missing:
                    out.append(f"{key} {v} needs {', '.join(missing)}")
    return out


def check_recipe_fits(cfg) -> None:
    """``--recipe NAME`` whose components select no image policy, given for an image run — an image policy
    (``--policy flow_matching``) or ``--model`` a diffusers pipeline folder (``model_index.json``) — is refused
    where it cannot work: the pipeline folder under a policy that generates no images, or a component of the
    recipe that needs a capability the image policy lacks (e.g. ``flow_grpo``, AgentFlow's Flow-GRPO: agent
    episodes on text). The message names the recipe's paper and the image recipe of the same name
    (``flow_grpo`` -> ``flow_grpo_images``, the image Flow-GRPO of Liu et al.), else the image recipes.
    Test: tests/test_flux_pipeline.py::test_the_text_flow_grpo_recipe_on_an_image_run_names_flow_grpo_images."""
    import json

    name = getattr(cfg, "recipe", None)
    if not name or name not in recipe_names():
        return
    recipe = load_recipe(name)
    if _is_image_policy(recipe["components"].get("policy")):
        return
    folder = Path(str(cfg.model)) / "model_index.json"
    pipeline, image_policy = folder.is_file(), _is_image_policy(cfg.policy)
    needs = _unmet_needs(recipe["components"], cfg.policy)
    if not (pipeline or image_policy) or (image_policy and not needs):
        return  # not an image run, or the recipe's method works on the image policy
    what = (f"--model {cfg.model} is a diffusers {json.loads(folder.read_text()).get('_class_name')} folder"
            + ("" if image_policy else f", which policy {cfg.policy} does not load") if pipeline
            else f"policy {cfg.policy} generates images")
    images = [n for n in recipe_names() if _is_image_policy(load_recipe(n)["components"].get("policy"))]
    same = [n for n in images if n.startswith(name + "_")]
    hint = (f"for images use --recipe {same[0]} ({load_recipe(same[0])['title']}, {load_recipe(same[0])['citation']})"
            if same else f"the image recipes are {', '.join(images)}")
    why = f" ({'; '.join(needs)})" if needs else ""
    raise ConfigError(f"recipe {name}: {recipe['title']} ({recipe['citation']}) is a recipe for policy "
                      f"{recipe['components'].get('policy', 'causal_lm')}{why}, but {what}; {hint}")
