"""Weights that depend on the advantage's own value: RED-Weight's ``A exp(A / tau)`` and the advantage clip of
DDPO and Flow-GRPO."""
from __future__ import annotations

import math

import torch

from ...registry import WEIGHTINGS, param


# --------------------------------------------------------------------------- RED-Weight


@WEIGHTINGS.register("advantage_exp_weight")
def advantage_exp_weight(advantages: torch.Tensor, *,
                         red_temperature: float = param(1.0, 'RED-Weight: temperature tau of the weight exp(A / tau)')
                         ) -> torch.Tensor:
    """RED-Weight advantage weighting (Yao et al., 2025, arXiv:2509.24203; seed 000-39).

    ``A'_i = A_i exp(A_i / tau)``   (unnormalised, ``weight: advantage`` in the authors' Trinity-RFT code)

    Off-policy group-relative REINFORCE interpreted as data shaping: samples
    with high advantage are up-weighted and low-advantage samples are
    down-weighted, which the paper justifies as moving the effective data
    distribution towards better responses. ``tau = 1`` in their configs.

    Provenance: authors' code — https://github.com/agentscope-ai/Trinity-RFT,
    trinity/algorithm/policy_loss_fn/rec_policy_loss.py (RECPolicyLossFn, weight "advantage":
    A exp(A / temp), then -A' log pi with clip_mode "none"); temp = 1 as there (recipe red_weight pairs it
    with policy_gradient).
    Test: tests/test_advantage_baselines.py::test_red_weight_hand_computed.
    """
    if red_temperature <= 0 or not math.isfinite(red_temperature):
        raise ValueError(f"red_temperature: must be a positive number, got {red_temperature}")
    return advantages * torch.exp(advantages / red_temperature)


# --------------------------------------------------------------------------- advantage clipping (DDPO, Flow-GRPO)


@WEIGHTINGS.register("advantage_clip")
def advantage_clip(advantages: torch.Tensor, *,
                   adv_clip_max: float = param(5.0, 'advantage_clip: advantages are clamped to [-adv_clip_max, '
                                               "adv_clip_max] (DDPO's and Flow-GRPO's train.adv_clip_max, 5)")
                   ) -> torch.Tensor:
    """Advantage clipping of DDPO (Black et al., 2023, arXiv:2305.13301) and Flow-GRPO (Liu et al., 2025,
    arXiv:2505.05470).

    ``A'_i = clamp(A_i, -adv_clip_max, adv_clip_max)``, elementwise on ``[R]`` or ``[R, T]`` advantages;
    ``adv_clip_max = 5`` as in both codes. List it last in ``advantage_weightings``: both codes clamp the
    advantage right before the clipped-ratio loss.

    Provenance: authors' code — https://github.com/kvablack/ddpo-pytorch, scripts/train.py (the training loop:
    ``torch.clamp(sample["advantages"], -config.train.adv_clip_max, config.train.adv_clip_max)`` before the PPO
    loss; ``train.adv_clip_max = 5`` in config/base.py); the same clamp in
    https://github.com/yifan123/flow_grpo scripts/train_sd3.py (on ``sample["advantages"][:, j]``, the
    advantage repeated over the trained steps; ``train.adv_clip_max = 5`` in config/base.py).
    Test: tests/test_image_algorithms.py::test_advantage_clip_hand_computed.
    """
    if not adv_clip_max > 0:
        raise ValueError(f"adv_clip_max: must be > 0, got {adv_clip_max}")
    return advantages.clamp(-adv_clip_max, adv_clip_max)
