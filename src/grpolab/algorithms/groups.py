"""Row and group helpers that advantage estimators and weightings share (no component lives here).

Rows are completions; ``group_ids [R]`` says which prompt's group each row belongs to (any ids, ragged groups
allowed). NaN rewards are unscorable rows, as everywhere in ``grpolab.algorithms``.
"""
from __future__ import annotations

import torch

from .filters import zero_variance_groups


def zero_variance_rows(rewards: torch.Tensor, group_ids: torch.Tensor) -> torch.Tensor:
    """``[R]`` bool: the row's group has fewer than two scored rows or all its scored rewards are equal
    (the complement of the ``zero_variance_groups`` filter, which uses a tolerance, not ``== 0``)."""
    return ~zero_variance_groups(rewards, group_ids)


def group_index(group_ids: torch.Tensor):
    """``(inv, n_groups)``: row -> dense group index 0..n_groups-1."""
    uniq, inv = torch.unique(group_ids, return_inverse=True)
    return inv, uniq.numel()


def masked_row_mean(values: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """``[R]``: the mean of each row's ``values [R, T]`` over its ``mask``ed tokens (0 for a row with none)."""
    m = mask.to(values.dtype)
    return (values * m).sum(-1) / m.sum(-1).clamp(min=1)
