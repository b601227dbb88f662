"""What the reward transforms share: which rows are correct (``shaping_correct_reward`` >=
``shaping_correct_threshold``), the rows of each group, the completion texts, numbers parsed from answers, and
the per-row seeds of the transforms that draw without a global RNG (ReDit, reward flips, PS-GRPO's subsampling)."""
from __future__ import annotations

import math
from fractions import Fraction

import torch

from ...data import completion_text
from ...registry import param


CORRECT_REWARD = param('accuracy', 'reward shaping: reward column whose value marks a correct row')
CORRECT_THRESHOLD = param(0.5, 'reward shaping: that column >= this value counts as correct (it tests one reward '
                               'column, before the transforms make the scalar reward, so the reward transforms use it '
                               'instead of the shared success_threshold)')


def correct_rows(reward_matrix: torch.Tensor, reward_names: list[str], column: str,
                 threshold: float) -> torch.Tensor:
    """Bool ``[R]``: the reward column ``column`` is scored and ``>= threshold``."""
    if column not in reward_names:
        raise ValueError(f"shaping_correct_reward: no reward column '{column}' (reward functions: "
                         f"{', '.join(reward_names) or 'none'})")
    v = reward_matrix[:, reward_names.index(column)]
    return torch.nan_to_num(v, nan=-math.inf) >= threshold


def _groups(group_ids: torch.Tensor):
    """The row indices (a ``[n]`` tensor) of each group, in ``torch.unique`` order of the group ids."""
    for g in torch.unique(group_ids):
        yield (group_ids == g).nonzero().squeeze(-1)


def _texts(batch) -> list[str]:
    return [completion_text(c) for c in batch.columns["completion"]]


def _to_number(text) -> float | None:
    try:
        return float(Fraction(str(text).strip()))
    except (ValueError, ZeroDivisionError):
        return None


def _row_seed(seed: int, step: int, uid: int, k: int) -> int:
    h = 1469598103934665603
    for x in (seed, step, uid, k):  # FNV-1a over the four integers: no global RNG, stable across runs
        h = ((h ^ (x & 0xFFFFFFFFFFFF)) * 1099511628211) % (1 << 63)
    return h
