"""Transforms of a reward model's or a judge's column: IRPO's Bradley-Terry win probabilities from pointwise
scores, GRPO-S's (DR-IRL's) difficulty scale from the gap to the demonstration's reward, and SGPO's step-judge
credit in all-negative groups."""
from __future__ import annotations

import math

import torch

from ...errors import ConfigError
from ...registry import REWARD_TRANSFORMS, param
from ..agentic import data_column
from .common import _groups


# ---------------------------------------------------------------- IRPO Bradley-Terry scoring (000-21)

@REWARD_TRANSFORMS.register("irpo_bradley_terry")
def irpo_bradley_terry(rewards: torch.Tensor, group_ids: torch.Tensor, reward_matrix: torch.Tensor,
                       reward_names: list[str], *,
                       irpo_reward_column: str = param('rm', 'IRPO: reward column with the pointwise reward-model '
                                                       'scores'),
                       irpo_weight: float = param(1.0, 'IRPO: weight of the Bradley-Terry win probability added to '
                                                  'the reward'),
                       irpo_scale: float = param(1.0, 'IRPO: k in P(i beats j) = sigmoid(k (s_i - s_j))')
                       ) -> torch.Tensor:
    """IRPO pointwise Bradley-Terry scoring (Song et al., 2026, arXiv:2601.00677; seed 000-21).

    A pointwise reward model gives each completion a score ``s_i`` (the reward
    column ``irpo_reward_column``, e.g. a :class:`grpolab.rewards.models.RewardModelFn`
    named ``rm``). Under Bradley-Terry, ``P(i > j) = sigmoid(k (s_i - s_j))`` with
    ``k = irpo_scale``; the reward of row i is its mean win probability against
    the *other* scored rows of its group::

        p_i = 1/(n-1) * sum_{j in group, j != i, s_j scored} sigmoid(k (s_i - s_j))

    (``p_i = 0.5`` when i is the only scored row). This needs only n pointwise
    scores per group instead of n(n-1)/2 pairwise judgements — the point of
    IRPO. Added as ``r + irpo_weight * p_i``; to make the BT probability *the*
    reward, give the raw reward-model column weight 0 (``reward_weights``), as
    fgrpr does for its accuracy. Rows whose score is unscorable (NaN) get no
    bonus and are left out of the others' means. Choices: j = i is excluded
    (a self-comparison is always 0.5 and only shrinks the spread); the scale
    ``k`` is grpolab's knob (1 = plain BT on the model's logits).

    Provenance: reconstructed from the abstract — pointwise scores turned into each row's mean Bradley-Terry win
    probability against the other scored rows of its group (j = i excluded), with a scale k; the paper's exact
    aggregation was not available.
    """
    if irpo_reward_column not in reward_names:
        raise ValueError(f"irpo_reward_column: no reward column '{irpo_reward_column}' (reward functions: "
                         f"{', '.join(reward_names) or 'none'}); add a reward model, e.g. --reward rm:PATH")
    s = reward_matrix[:, reward_names.index(irpo_reward_column)].to(torch.float64)
    p = torch.zeros(len(rewards), dtype=torch.float64)
    for idx in _groups(group_ids):
        ok = idx[~torch.isnan(s[idx])]
        if len(ok) == 1:
            p[ok] = 0.5
        elif len(ok) > 1:
            d = torch.sigmoid(irpo_scale * (s[ok][:, None] - s[ok][None, :]))  # [n, n], P(i beats j)
            p[ok] = (d.sum(1) - 0.5) / (len(ok) - 1)  # drop the diagonal sigmoid(0) = 0.5
    return rewards + (irpo_weight * p).to(rewards.dtype)


# ---------------------------------------------------------------- GRPO-S dynamic reward scaling (DR-IRL, 000-43)

@REWARD_TRANSFORMS.register("grpo_s_scaling")
def grpo_s_scaling(rewards: torch.Tensor, group_ids: torch.Tensor, reward_matrix: torch.Tensor,
                   reward_names: list[str], batch, *,
                   grpo_s_reward_column: str = param('drirl', 'GRPO-S: reward column of the (category) reward model '
                                                     'whose gap to the demonstration measures responsiveness'),
                   grpo_s_hardness_column: str = param('hardness', 'GRPO-S: data column with the data-level '
                                                       'hardness h(x) in [0, 1]'),
                   grpo_s_demo_reward_column: str = param('demo_reward', "GRPO-S: data column with the reward "
                                                          "r(x, y*) of the prompt's demonstration"),
                   grpo_s_alpha: float = param(1.0, 'GRPO-S: weight of the data-level hardness in the scale'),
                   grpo_s_beta: float = param(1.0, 'GRPO-S: weight of the model-level responsiveness in the '
                                                   'scale')) -> torch.Tensor:
    """GRPO-S reward scaling by task difficulty (DR-IRL, Cheng et al., 2025, arXiv:2503.18991; seed 000-43).

    Each group (the G completions of prompt x) has its reward multiplied by one scale::

        gap(x)   = r(x, y*) - mean_{i in group, scored} r_i        (r = column grpo_s_reward_column)
        s(x)     = 1 + alpha * h(x) + beta * tanh(max(gap(x), 0))
        r'_i     = s(x) * r_i

    ``h(x)`` is the data-level hardness (data column ``grpo_s_hardness_column``; task ``drirl_safety``:
    ``1 - cos`` of the request and its demonstration) and the reward gap between the demonstration and the
    policy's completions is the model-level responsiveness: the further the policy is from the demonstration's
    reward, the harder the prompt for it now and the larger its scale. ``tanh`` bounds that term by ``beta``, so
    ``1 <= s(x) <= 1 + alpha + beta`` (for h in [0, 1]). A group with no scored row gets ``gap = 0``. NaN
    rewards stay NaN.

    A per-group scale cancels in group_zscore's ``(r - mean) / std``: use it with an advantage that does not
    divide by the group's std (``group_mean``, recipe ``grpo_s``), where it scales the group's advantages by
    ``s(x)`` (tested).

    Provenance: reconstructed from the abstract — GRPO-S (arXiv:2503.18991, seed 000-43) "scales the reward ...
    to task difficulty -- data-level hardness measured by CLIP similarity and model-level responsiveness
    measured by reward gaps"; the multiplicative form 1 + alpha h + beta tanh(max(gap, 0)), the gap to the
    demonstration's reward and the hashed-word cosine in place of CLIP are grpolab's choices; no authors' code
    found (searched the code index for DR-IRL, GRPO-S, the title and the arXiv id).
    """
    if grpo_s_reward_column not in reward_names:
        raise ConfigError(f"grpo_s_reward_column: no reward column '{grpo_s_reward_column}' (reward functions: "
                          f"{', '.join(reward_names) or 'none'}); task drirl_safety has 'drirl'")
    who = "grpo_s_scaling"
    h = torch.tensor([float(v) for v in data_column(batch.columns, grpo_s_hardness_column, who,
                                                    "grpo_s_hardness_column")], dtype=torch.float64)
    demo = torch.tensor([float(v) for v in data_column(batch.columns, grpo_s_demo_reward_column, who,
                                                       "grpo_s_demo_reward_column")], dtype=torch.float64)
    r = reward_matrix[:, reward_names.index(grpo_s_reward_column)].to(torch.float64)
    scale = torch.ones(len(rewards), dtype=torch.float64)
    for idx in _groups(group_ids):
        ok = idx[~torch.isnan(r[idx])]
        gap = float(demo[idx[0]] - r[ok].mean()) if len(ok) else 0.0
        scale[idx] = 1.0 + grpo_s_alpha * h[idx] + grpo_s_beta * math.tanh(max(gap, 0.0))
    return rewards * scale.to(rewards.dtype)


# ---------------------------------------------------------------- SGPO step credit in all-negative groups (000-49)

@REWARD_TRANSFORMS.register("sgpo_negative_credit")
def sgpo_negative_credit(rewards: torch.Tensor, group_ids: torch.Tensor, reward_matrix: torch.Tensor,
                         reward_names: list[str], *,
                         sgpo_judge_column: str = param('sgpo_judge', 'sgpo_negative_credit: reward column with the '
                                                        "step judge's credit c_i in [0, 1] (--reward sgpo_judge:...)"),
                         sgpo_credit_scale: float = param(0.5, 'sgpo_negative_credit: lambda, the reward a wrong '
                                                          'completion gains at full step credit (below the 1 of a '
                                                          'right answer)')) -> torch.Tensor:
    """SGPO: partial credit from a step-wise judge in all-negative groups (Chen et al., 2025, *Spectral Policy
    Optimization: Coloring your Incorrect Reasoning in GRPO* / *Stepwise Guided Policy Optimization*,
    arXiv:2505.11595; seed 000-49).

    For each group ``g`` with no correct row (an all-negative-sample group; a row is correct when its credit
    ``c_i = 1``: the judge column marks a right final answer 1 and every wrong completion below 1)::

        r_i <- r_i + lambda * c_i        (i in g; c_i = the sgpo_judge column, NaN -> 0)

    and every group with a correct row is unchanged, so GRPO's advantages are non-zero in an all-negative group
    whenever the judge tells its completions apart, and ordered by the credit. ``c_i`` is the share of a wrong
    completion's steps (its wrong final answer the last) before the first one the judge marks wrong
    (``rewards/step_judge.py``); an unparseable judge reply leaves ``c_i`` NaN and the row gains nothing.
    ``lambda = sgpo_credit_scale`` < 1 keeps every wrong completion below a right one. The judge column should
    have reward weight 0 (recipe ``sgpo``), so it reaches the scalar reward only here. Rows whose reward is NaN
    stay NaN.

    Provenance: reconstructed from the abstract — SGPO (arXiv:2505.11595; seed 000-49): the judge's diversity is
    applied to all-negative groups only; our choices: additive credit lambda * c_i on the task reward with
    lambda = 0.5, unparseable replies add nothing, correctness read from the judge column (the answer
    checked against the data's answer) instead of the task's accuracy column; no authors' code found (searched
    the code index for "Spectral Policy Optimization", "Stepwise Guided Policy Optimization", "SGPO" and the
    arXiv id).
    Test: tests/test_sgpo.py::test_all_negative_group_gets_ordered_advantages,
    tests/test_sgpo.py::test_group_with_a_right_answer_is_unchanged.
    """
    if sgpo_judge_column not in reward_names:
        raise ValueError(f"sgpo_judge_column: no reward column '{sgpo_judge_column}' (reward functions: "
                         f"{', '.join(reward_names) or 'none'}); add --reward sgpo_judge:self=0 (or another judge)")
    credit = torch.nan_to_num(reward_matrix[:, reward_names.index(sgpo_judge_column)], nan=0.0).to(rewards.dtype)
    correct = credit >= 1.0
    out = rewards.clone()
    for idx in _groups(group_ids):
        if not correct[idx].any():
            out[idx] = rewards[idx] + sgpo_credit_scale * credit[idx]
    return out
