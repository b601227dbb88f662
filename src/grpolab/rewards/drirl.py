"""Saved DR-IRL category reward models as a reward: ``--reward drirl:PATH[=weight]`` (seed 000-43).

``PATH`` is a JSON file written by :meth:`grpolab.tasks.drirl_safety.CategoryRewardModels.save` (e.g. after
``CategoryRewardModels.fit_rows`` on your own demonstrations). A completion's reward is ``r_c(y)``, the linear
IRL reward of the row's category (data column ``drirl_category_column``); an unknown category raises, naming the
categories the file has. Use it with ``grpo_s_scaling`` (``grpo_s_reward_column: drirl``) and data columns for
the hardness and the demonstration's reward, as task ``drirl_safety`` has.
"""
from __future__ import annotations

from ..registry import REWARD_SPECS, declared_params, param
from ..tasks.drirl_safety import CategoryRewardModels
from .agentic import data_column
from .scoring import scorer_spec


class CategoryReward:
    """``r_c(y)`` of the row's category under saved category reward models (module docstring)."""

    def __init__(self, path: str, *,
                 drirl_category_column: str = param('category', 'drirl: data column naming each row\'s category'),
                 cfg=None, name: str = "drirl"):
        self.path = str(path)
        self.models = CategoryRewardModels.load(path)
        self.column = drirl_category_column
        self.__name__ = name

    def __call__(self, prompts=None, completions=None, **columns) -> list[float]:
        cats = data_column(columns, self.column, "drirl", "drirl_category_column")
        return [self.models.score(str(c), y) for c, y in zip(cats, completions)]

    def __repr__(self) -> str:
        return f"CategoryReward({self.path!r})"


def parse_drirl_spec(spec: str, cfg=None, **opts):
    """``drirl:PATH[=weight]`` -> :class:`grpolab.rewards.RewardFn` named ``drirl``.

    Provenance: reconstructed from the abstract — DR-IRL (Cheng et al., 2025, arXiv:2503.18991, seed 000-43):
    category-specific reward models learnt by IRL score the policy's responses; the linear hashed-feature model
    and its JSON file are grpolab's choices.
    """
    return scorer_spec(spec, "drirl", CategoryReward, "drirl:PATH or drirl:PATH=weight (a finite number)", cfg, opts)


parse_drirl_spec.__grpolab_params__ = declared_params(CategoryReward)
REWARD_SPECS.register("drirl:", prefix="PATH", needs=("text",))(parse_drirl_spec)
