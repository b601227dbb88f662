"""Policy objectives: per-token loss from new/old log-probs and advantages.

Uniform signature::

    fn(logprobs, old_logprobs, advantages, mask, **params)
        -> (per_token_loss [R, T], per_token_metrics {name: [R, T]})

``advantages`` is ``[R, T]`` (or ``[R]``, broadcast over tokens). The returned
loss is *per token*; turning it into a scalar is the aggregation's job
(``aggregation.py``), so every objective composes with every aggregation.
Per-token metrics are averaged by the trainer over the masked tokens of the
whole optimiser step.
"""
from __future__ import annotations

import torch

from ..registry import POLICY_LOSSES



def per_token(advantages: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    """``[R]`` per-row values broadcast to ``like``'s ``[R, T]``; ``[R, T]`` passes through."""
    return advantages.unsqueeze(-1).expand_as(like) if advantages.dim() == 1 else advantages


@POLICY_LOSSES.register("clipped_ratio")
def clipped_ratio(logprobs: torch.Tensor, old_logprobs: torch.Tensor, advantages: torch.Tensor,
                  mask: torch.Tensor, *, epsilon: float = 0.2, epsilon_high: float | None = None):
    """PPO / GRPO clipped surrogate per token (PPO 000-83, GRPO 000-41, DAPO clip-higher).

    ``rho_t = exp(log pi_theta(o_t) - log pi_old(o_t))``
    ``loss_t = -min(rho_t A_t, clip(rho_t, 1 - eps_low, 1 + eps_high) A_t)``

    ``eps_low = epsilon``; ``eps_high = epsilon_high`` or ``epsilon`` when unset
    (TRL's convention; DAPO uses 0.2 / 0.28). The log-ratio is clamped to
    [-20, 20] before ``exp``. Metrics: ``clip_frac_low`` = share of tokens with
    ``rho < 1 - eps_low`` and ``A < 0`` (the clip is active there), and
    ``clip_frac_high`` = share with ``rho > 1 + eps_high`` and ``A > 0``.

    Provenance: paper equations — PPO (Schulman et al., 2017, arXiv:1707.06347), Eq. (7), as used per token in
    DeepSeekMath (Shao et al., 2024, arXiv:2402.03300) Eq. (3); the asymmetric eps_high is DAPO's clip-higher
    (arXiv:2503.14476); the log-ratio clamp is grpolab's numerical guard.
    """
    eps_low = epsilon
    eps_high = epsilon if epsilon_high is None else epsilon_high
    adv = per_token(advantages, logprobs)
    ratio = torch.exp((logprobs - old_logprobs).clamp(-20.0, 20.0))
    unclipped = ratio * adv
    clipped = ratio.clamp(1.0 - eps_low, 1.0 + eps_high) * adv
    loss = -torch.minimum(unclipped, clipped)
    with torch.no_grad():
        low = ((ratio < 1.0 - eps_low) & (adv < 0)).float()
        high = ((ratio > 1.0 + eps_high) & (adv > 0)).float()
    return loss, {"clip_frac_low": low, "clip_frac_high": high}
