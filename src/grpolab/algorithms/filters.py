"""Row filters: which rollout rows enter the loss.

Signature: ``fn(**inputs) -> keep [R] bool``, inputs resolved by name as in
``components.py`` (``rewards``, ``group_ids``, ...).
"""
from __future__ import annotations

import torch

from .advantages import group_stats


def zero_variance_groups(rewards: torch.Tensor, group_ids: torch.Tensor, *, tolerance: float = 1e-6) -> torch.Tensor:
    """Keep rows of groups whose rewards vary (DAPO dynamic sampling, arXiv:2503.14476).

    A group is dropped when its scored rewards have (Bessel) std <= ``tolerance``
    or it has fewer than two scored rows: its group-relative advantage is 0 and
    it would only dilute the loss. A tolerance rather than ``std == 0`` keeps
    float noise from letting a constant group through (NeMo-RL PR #4158).
    """
    _, std, _ = group_stats(rewards, group_ids)
    return ~torch.isnan(std) & (std > tolerance)


def zero_variance_groups_count(rewards: torch.Tensor, group_ids: torch.Tensor) -> int:
    """Number of groups :func:`zero_variance_groups` drops (the ``frac_zero_std_groups`` numerator)."""
    return len(torch.unique(group_ids[~zero_variance_groups(rewards, group_ids)]))


def mask_truncated(completion_mask: torch.Tensor, truncated: torch.Tensor) -> torch.Tensor:
    """Loss mask with truncated rows zeroed (DAPO overlong filtering, ``mask_truncated_completions``).

    A completion cut at ``max_completion_length`` has no final answer to reward,
    so its tokens leave the loss; its reward was already computed (and may be
    shaped, e.g. ``overlong_penalty``).
    """
    return completion_mask * (~truncated)[:, None]
