"""Advantages that add an action-wise reward to a group-relative one: MasHost's HRPO (seed 000-22).

A rollout that splits a completion into actions writes, for every token, the reward of the action the token
belongs to in ``batch.step_data[ACTION_REWARD]`` (``[R, T]``, 0 off any action); the estimator here adds it to
the trajectory's group-relative advantage. Writer: the rollout strategy ``mas_build``
(``grpolab/rollouts/mas_build.py``: one construction line = one action).
"""
from __future__ import annotations

import torch

from ..errors import ConfigError
from ..registry import param
from .advantages import ADVANTAGES, group_zscore

ACTION_REWARD = "action_reward"  # batch.step_data key: per-token reward of the token's action
ACTION_REWARD_ROLLOUTS = ("mas_build",)  # the rollout strategies that write it


def _check(cfg) -> None:
    if cfg.rollout_strategy not in ACTION_REWARD_ROLLOUTS:
        raise ConfigError(f"advantage: mashost_hrpo needs the per-action rewards that rollout_strategy "
                          f"{' or '.join(ACTION_REWARD_ROLLOUTS)} writes; got rollout_strategy: "
                          f"{cfg.rollout_strategy}")
    if not cfg.mashost_action_weight >= 0:
        raise ConfigError(f"mashost_action_weight: expected a weight >= 0, got {cfg.mashost_action_weight}")


@ADVANTAGES.register("mashost_hrpo", min_group_size=2, check=_check)
def mashost_hrpo(rewards: torch.Tensor, group_ids: torch.Tensor, completion_mask: torch.Tensor, batch, *,
                 advantage_epsilon: float = 1e-4,
                 mashost_action_weight: float = param(0.5, "MasHost HRPO: weight lambda of the action-wise "
                                                           "rationality reward added to each action's tokens "
                                                           "(0 = plain group z-score)")) -> torch.Tensor:
    """HRPO, Hierarchical Relative Policy Optimization (MasHost, Yang et al., 2025, *MasHost Builds It All:
    Autonomous Multi-Agent System Directed by Reinforcement Learning*, arXiv:2506.08507, seed 000-22).

    For token t of completion i (a whole constructed system), in construction action ``a(t)``::

        A_it = (R_i - mean_g R) / (std_g R + epsilon)  +  lambda * r_{i, a(t)}

    The first term is the trajectory level: the group z-score of the system reward ``R`` (accuracy minus the
    system's costs; task ``mas_build``) over the G systems built for one query, equal on every token of the
    completion. The second is the action level: ``r_{i,a}`` is the action-wise reward of action a (rationality:
    0 for a rational construction action, -1 for an irrational one; ``grpolab.tasks.mas_build``), added,
    un-normalised, to the tokens of that action only; tokens outside every action (blank lines, text after
    ``end``) get the first term alone. ``lambda = mashost_action_weight`` (0.5); ``lambda = 0`` is GRPO's
    advantage. Unscorable (NaN) rows get 0 in the first term. Output ``[R, T]``.

    Provenance: reconstructed from the abstract — the abstract says HRPO "collaboratively integrates
    group-relative advantages and action-wise rewards" and names three objectives (accuracy, efficiency,
    component rationality); grpolab's choices: accuracy and efficiency in the trajectory reward, normalised
    per group (z-score, Bessel std, epsilon 1e-4 as group_zscore), rationality as a raw per-action reward in
    {0, -1} added with weight lambda = 0.5 to that action's tokens (no per-action normalisation, no
    discounting over later actions); the paper's equations could not be read here, and the authors' code is
    announced "upon acceptance of the paper" (none found: GitHub name, code and issue searches). Test:
    tests/test_mashost.py::test_hrpo_advantage_by_hand.
    """
    per_token = batch.step_data.get(ACTION_REWARD) if batch is not None else None
    if per_token is None:
        raise ConfigError(f"advantage: mashost_hrpo needs batch.step_data['{ACTION_REWARD}'] (the per-action "
                          f"rewards of rollout_strategy {' or '.join(ACTION_REWARD_ROLLOUTS)}); this batch has "
                          f"none")
    traj = group_zscore(rewards, group_ids, advantage_epsilon=advantage_epsilon)
    act = per_token[:, :completion_mask.shape[1]].to(traj.dtype)
    return (traj[:, None] + mashost_action_weight * act) * (completion_mask > 0)
