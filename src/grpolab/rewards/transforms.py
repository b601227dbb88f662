"""Reward transforms: the combined scalar reward per row -> a shaped reward.

Signature: ``fn(rewards [R], **inputs, *, params) -> [R]`` with inputs
``lengths`` (completion tokens), ``truncated``, ``group_ids``, ``prompt_uids``,
``reward_matrix``, ``reward_names``, ``batch`` (completion texts and data
columns in ``batch.columns``), ``step`` resolved by name; keyword-only parameters come from
config keys of the same name. Listed as ``reward_transforms: [name, ...]`` and
applied in order, before advantages (and before dynamic sampling's filter).
"""
from __future__ import annotations

import torch

from ..registry import REWARD_TRANSFORMS



@REWARD_TRANSFORMS.register("overlong_penalty")
def overlong_penalty(rewards: torch.Tensor, lengths: torch.Tensor, *, max_completion_length: int,
                     overlong_buffer: int = 4, overlong_penalty_factor: float = 1.0) -> torch.Tensor:
    """DAPO soft overlong punishment (Yu et al., 2025, arXiv:2503.14476, Eq. 13).

    With ``L_max = max_completion_length`` and ``L_cache = overlong_buffer``::

        R_len(y) = 0                                  if |y| <= L_max - L_cache
                 = ((L_max - L_cache) - |y|) / L_cache  if L_max - L_cache < |y| <= L_max
                 = -1                                 if |y| > L_max

    scaled by ``overlong_penalty_factor`` and added to the reward (TRL's
    ``get_soft_overlong_punishment``; verl's ``overlong_buffer``). ``|y|`` counts
    generated tokens including EOS. Unscorable (NaN) rows stay NaN.

    Provenance: paper equations — DAPO (Yu et al., 2025, arXiv:2503.14476), Eq. (13); the same as TRL
    get_soft_overlong_punishment and verl overlong_buffer.
    """
    if not 0 < overlong_buffer <= max_completion_length:
        raise ValueError(f"overlong_buffer: must be in 1..max_completion_length ({max_completion_length}), "
                         f"got {overlong_buffer}")
    start = max_completion_length - overlong_buffer
    y = lengths.to(rewards.dtype)
    pen = torch.where(y <= start, torch.zeros_like(y), (start - y) / overlong_buffer)
    pen = torch.where(y > max_completion_length, torch.full_like(y, -1.0), pen)
    return rewards + overlong_penalty_factor * pen

