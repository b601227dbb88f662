"""Advantage estimators: scalar reward per row -> advantage per row.

Uniform signature (verl ``core_algos`` style)::

    fn(rewards: Tensor[R], group_ids: Tensor[R], **params) -> Tensor[R]

``rewards`` may contain NaN for rows no reward function could score; those rows
are left out of the group statistics and get advantage 0. Groups may have any
size (ragged groups are fine): statistics are taken per ``group_ids`` value.
"""
from __future__ import annotations

import torch

from ..registry import ADVANTAGES



def combine_rewards(reward_matrix: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
    """Weighted sum over reward functions, ignoring unscorable (NaN) entries.

    ``r_i = sum_k w_k R[i, k]`` over the k where ``R[i, k]`` is not NaN (TRL's
    ``sum_then_normalize``). A row with every entry NaN stays NaN (unscorable).
    """
    scored = ~torch.isnan(reward_matrix)
    total = torch.where(scored, reward_matrix, 0.0) @ weights.to(reward_matrix.dtype)
    return torch.where(scored.any(-1), total, torch.full_like(total, float("nan")))


def group_stats(values: torch.Tensor, group_ids: torch.Tensor):
    """Per-row NaN-aware group mean, Bessel-corrected std and count.

    Returns ``(mean, std, count)``, each ``[R]``, where row i gets the statistics
    of its group over the group's non-NaN values. ``std`` is the unbiased
    (n-1) estimator as in TRL, verl and AReaL; it is NaN for groups with fewer
    than two scored rows.
    """
    uniq, inv = torch.unique(group_ids, return_inverse=True)
    n_groups = uniq.numel()
    valid = ~torch.isnan(values)
    v = torch.where(valid, values, 0.0).double()
    count = torch.zeros(n_groups, dtype=torch.float64).index_add_(0, inv, valid.double())
    total = torch.zeros(n_groups, dtype=torch.float64).index_add_(0, inv, v)
    mean = total / count.clamp(min=1)
    dev = torch.where(valid, v - mean[inv], 0.0)
    ss = torch.zeros(n_groups, dtype=torch.float64).index_add_(0, inv, dev * dev)
    std = torch.where(count > 1, (ss / (count - 1).clamp(min=1)).sqrt(), torch.full_like(ss, float("nan")))
    mean = torch.where(count > 0, mean, torch.full_like(mean, float("nan")))
    return mean[inv].to(values.dtype), std[inv].to(values.dtype), count[inv].to(values.dtype)


@ADVANTAGES.register("group_zscore", min_group_size=2)
def group_zscore(rewards: torch.Tensor, group_ids: torch.Tensor, *, advantage_epsilon: float = 1e-4) -> torch.Tensor:
    """GRPO group-normalised advantage (DeepSeekMath, seed 000-41).

    ``A_i = (r_i - mean_g(r)) / (std_g(r) + epsilon)``

    ``std_g`` is the Bessel-corrected (n-1) sample std over the group's scored
    rows, ``epsilon = 1e-4`` as in TRL (verl uses 1e-6). A zero-variance group
    gets A = 0 exactly (numerator is 0). A group with a single scored row, and
    unscorable (NaN) rows, get A = 0.

    Provenance: paper equations — DeepSeekMath (Shao et al., 2024, arXiv:2402.03300), the outcome-supervision
    advantage of Sec. 4.1.2 (r_i - mean(r)) / std(r) used in Eq. (3); the Bessel std and epsilon = 1e-4 are
    TRL's GRPOTrainer convention (the paper does not fix them).
    """
    mean, std, _ = group_stats(rewards, group_ids)
    adv = (rewards - mean) / (std + advantage_epsilon)
    return torch.nan_to_num(adv, nan=0.0)


@ADVANTAGES.register("group_mean", min_group_size=2)
def group_mean(rewards: torch.Tensor, group_ids: torch.Tensor) -> torch.Tensor:
    """Mean-only group baseline (Dr. GRPO, seed 000-107): ``A_i = r_i - mean_g(r)``.

    Dropping the std removes GRPO's question-level difficulty bias. Unscorable
    rows get A = 0.

    Provenance: paper equations — Dr. GRPO (Liu et al., 2025, "Understanding R1-Zero-Like Training",
    arXiv:2503.20783), the unbiased advantage r_i - mean(r) (GRPO's advantage without the std; equation number
    not recorded); TRL scale_rewards none computes the same.
    """
    mean, _, _ = group_stats(rewards, group_ids)
    return torch.nan_to_num(rewards - mean, nan=0.0)
