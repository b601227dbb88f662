"""Generalised advantage estimation (GAE) and masked whitening: the learned critics' shared formulas (turn-PPO's
turn-level critic, agents/critic.py; the control policies' PPO baseline, policies/control/critic.py).

GAE (Schulman et al., 2015, arXiv:1506.02438, eq. 16) over a row of length ``L`` with values ``V_0..V_{L-1}`` and
the value after the last step ``V_L = bootstrap`` (0 for a terminal state)::

    delta_t = r_t + gamma V_{t+1} - V_t,    A_t = delta_t + gamma lambda A_{t+1}  (A_L = 0),    R_t = A_t + V_t

``R_t`` is the value target (the lambda-return).
"""
from __future__ import annotations

import torch


def gae(rewards: torch.Tensor, values: torch.Tensor, lengths: torch.Tensor, bootstrap: torch.Tensor,
        gamma: float, lam: float) -> tuple[torch.Tensor, torch.Tensor]:
    """``(A, R)`` ``[B, T]`` for right-padded ``rewards`` / ``values`` ``[B, T]``, each row ``lengths[b]`` steps long,
    with ``bootstrap[b]`` the value after its last step (module docstring); 0 past each row's length. Computed and
    returned in float64."""
    B, T = rewards.shape
    rewards, values = rewards.double(), values.double()
    lengths, bootstrap = lengths.long(), bootstrap.double()
    adv = torch.zeros(B, T, dtype=torch.float64)
    nxt_adv = torch.zeros(B, dtype=torch.float64)
    for t in reversed(range(T)):
        valid = t < lengths
        nxt_v = torch.where(lengths == t + 1, bootstrap, values[:, t + 1] if t + 1 < T else bootstrap)
        delta = rewards[:, t] + gamma * nxt_v - values[:, t]
        a = torch.where(valid, delta + gamma * lam * nxt_adv, torch.zeros_like(delta))
        adv[:, t] = a
        nxt_adv = a
    valid = torch.arange(T)[None] < lengths[:, None]
    return adv, (adv + values) * valid


def masked_whiten(x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """``(x - mean) / sqrt(var + 1e-8)`` over the masked entries (unbiased variance), as verl's masked_whiten."""
    m = mask.to(x.dtype)
    n = m.sum()
    if n < 2:
        return x * m
    mean = (x * m).sum() / n
    var = (((x - mean) ** 2) * m).sum() / (n - 1)
    return (x - mean) * torch.rsqrt(var + 1e-8) * m
