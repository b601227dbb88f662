"""Config fields of the variant components, one mixin per group of variants.

Every field is a config key (settable in YAML, recipes and as ``--key value``).
A component's keyword-only parameter named ``x`` is filled from the config key
``x`` (advantage estimators first try ``advantage_x``). Prefix fields with the
component's short name (``dgpo_...``, ``sapo_...``) so names never collide.
"""
from __future__ import annotations

from dataclasses import field
from typing import Any


def param(default, help: str, choices: Any = None):
    """A config field with its help text and (optional) valid choices.

    ``choices`` may be a list, or a registry name such as ``"WEIGHTINGS"``
    (``"WEIGHTINGS*"`` for a list of names from that registry).
    """
    kw = {"default_factory": lambda: list(default)} if isinstance(default, list) else {"default": default}
    return field(metadata={"help": help, "choices": choices}, **kw)


from .advantages_a import AdvantageParamsA  # noqa: E402
from .advantages_b import AdvantageParamsB  # noqa: E402
from .objectives import ObjectiveParams  # noqa: E402
from .rewards import RewardParams  # noqa: E402
from .samplers import SamplerParams  # noqa: E402
from .rollouts import RolloutParams  # noqa: E402
from .budgets import BudgetParams  # noqa: E402
from .stages import StageParams  # noqa: E402
from .tasks import TaskParams  # noqa: E402
from .injection import InjectionParams  # noqa: E402

__all__ = ["param", "AdvantageParamsA", "AdvantageParamsB", "ObjectiveParams", "RewardParams", "SamplerParams",
           "RolloutParams", "BudgetParams", "StageParams", "TaskParams", "InjectionParams"]
