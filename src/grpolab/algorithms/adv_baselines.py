"""Advantage baselines, normalisations and multi-reward estimators.

Advantage estimators (``ADVANTAGES``) map rewards to per-row advantages (the
weightings that rescale them afterwards are in ``weightings.py``). All of them
reuse ``group_stats`` / ``group_zscore`` / ``combine_rewards`` for the
shared formulas, take NaN as "unscorable" (left out of every statistic,
advantage 0) and accept ragged groups.

Where a paper studies a domain (video, safety alignment), the generic text-LLM
mechanism is implemented; the docstrings say so.
"""
from __future__ import annotations

import torch

from .advantages import ADVANTAGES, combine_rewards, group_mean, group_stats, group_zscore
from .groups import zero_variance_rows
from ..registry import param

# --------------------------------------------------------------------------- helpers


def _per_group(values: torch.Tensor, group_ids: torch.Tensor, fn) -> torch.Tensor:
    """Apply ``fn`` to every group's scored values; returns ``[R]`` with fn's value per row (NaN elsewhere)."""
    out = torch.full_like(values, float("nan"))
    for g in torch.unique(group_ids):
        sel = (group_ids == g) & ~torch.isnan(values)
        if sel.any():
            out[group_ids == g] = fn(values[sel])
    return out


def _batch_whiten(values: torch.Tensor, epsilon: float) -> torch.Tensor:
    """``(x - mean_batch x) / (std_batch x + epsilon)`` over the scored (non-NaN) rows; NaN rows -> 0.

    Bessel-corrected std as TRL's ``nanstd``; one row per completion (verl's
    ``masked_whiten`` weights each completion by its token count instead).
    """
    ok = ~torch.isnan(values)
    if ok.sum() < 2:
        return torch.zeros_like(values)
    v = values[ok]
    out = (values - v.mean()) / (v.std() + epsilon)
    return torch.nan_to_num(out, nan=0.0)


def _per_reward_zscore(reward_matrix: torch.Tensor, group_ids: torch.Tensor, epsilon: float) -> torch.Tensor:
    """``[R, K]``: each reward column group-z-scored on its own (``group_zscore``), NaN kept where unscorable."""
    cols = [group_zscore(reward_matrix[:, k], group_ids, advantage_epsilon=epsilon) for k in range(reward_matrix.shape[1])]
    z = torch.stack(cols, dim=1) if cols else reward_matrix.clone()
    return torch.where(torch.isnan(reward_matrix), torch.full_like(z, float("nan")), z)


# --------------------------------------------------------------------------- baselines


@ADVANTAGES.register("leave_one_out", min_group_size=2)
def leave_one_out(rewards: torch.Tensor, group_ids: torch.Tensor) -> torch.Tensor:
    """RLOO leave-one-out baseline (Ahmadian et al., 2024, arXiv:2402.14740).

    ``A_i = r_i - (1 / (n - 1)) sum_{j != i} r_j = n / (n - 1) * (r_i - mean_g(r))``

    with ``n`` the number of scored rows in the group (TRL ``RLOOTrainer``,
    verl ``rloo``, OpenRLHF ``rloo``). So RLOO is ``n/(n-1)`` times the
    mean-only baseline (``group_mean``). A group with a single scored row and
    unscorable rows get 0.

    Provenance: paper equations — RLOO (Ahmadian et al., 2024, arXiv:2402.14740), the leave-one-out baseline of
    REINFORCE with k samples (equation number not recorded); TRL RLOOTrainer, verl rloo and OpenRLHF rloo
    compute the same.
    """
    mean, _, count = group_stats(rewards, group_ids)
    scale = count / (count - 1).clamp(min=1)
    adv = torch.where(count > 1, (rewards - mean) * scale, torch.zeros_like(rewards))
    return torch.nan_to_num(adv, nan=0.0)


@ADVANTAGES.register("batch_zscore", min_group_size=2)
def batch_zscore(rewards: torch.Tensor, group_ids: torch.Tensor, completion_mask: torch.Tensor | None = None, *,
                 batch_zscore_over: str = param('tokens', "REINFORCE++-baseline whitening statistics: over every "
                                                "valid token of the batch ('tokens', OpenRLHF reinforce_baseline, "
                                                "the authors' code) or one value per completion ('completions', "
                                                "Bessel std + advantage_epsilon, grpolab's earlier choice)",
                                                ['tokens', 'completions']),
                 advantage_epsilon: float = 1e-4) -> torch.Tensor:
    """REINFORCE++-baseline: group mean baseline, then whitening over the whole batch (arXiv:2501.03262).

    ``a_i = r_i - mean_g(r)``, every token ``t`` of completion ``i`` carries
    ``a_i`` (gamma = 1), then, with ``T = sum_i L_i`` the valid tokens of the
    batch (``L_i`` = completion ``i``'s token count):

    ``mu = (1/T) sum_i L_i a_i``;  ``var = (1/T) sum_i L_i (a_i - mu)^2``;
    ``A_i = (a_i - mu) / sqrt(max(var, 1e-8))``

    Provenance: authors' code — https://github.com/OpenRLHF/OpenRLHF,
    openrlhf/trainer/ppo_utils/experience_maker.py (estimator ``reinforce_baseline``); there:
    ``rewards - rewards.mean(-1)`` per group, then the "normalize advantages across all experiences" block:
    token-level masked mean, biased (divide by the token count) masked variance,
    ``var.clamp(min=1e-8).rsqrt()``. verl ``reinforce_plus_plus_baseline``
    also whitens over tokens (``masked_whiten``). Long completions therefore
    weigh more in the batch statistics. ``advantage_epsilon`` is not used
    here (OpenRLHF's 1e-8 variance floor is).
    Test: tests/test_advantage_baselines.py::test_batch_zscore_whitens_over_tokens_like_openrlhf.

    ``batch_zscore_over="completions"`` keeps grpolab's earlier variant: one
    value per completion, ``A_i = (a_i - mean(a)) / (std(a) + epsilon)`` with
    Bessel std (TRL's ``nanstd``). Without a ``completion_mask`` every
    completion counts as one token (the two agree up to the std estimator).
    Unscorable (NaN) rows are left out of every statistic and get 0.
    """
    centred = rewards - group_stats(rewards, group_ids)[0]
    if batch_zscore_over == "completions":
        return _batch_whiten(centred, advantage_epsilon)
    ok = ~torch.isnan(centred)
    if completion_mask is None:
        weight = ok.to(centred.dtype)
    else:
        weight = completion_mask.to(centred.dtype).sum(-1) * ok
    total = weight.sum()
    if total <= 0:
        return torch.zeros_like(centred)
    a = torch.nan_to_num(centred, nan=0.0)
    mean = (a * weight).sum() / total
    var = ((a - mean).pow(2) * weight).sum() / total
    out = (a - mean) * var.clamp(min=1e-8).rsqrt()
    return torch.where(ok, out, torch.zeros_like(out))


@ADVANTAGES.register("group_mean_batch_std", min_group_size=2)
def group_mean_batch_std(rewards: torch.Tensor, group_ids: torch.Tensor, *,
                         advantage_epsilon: float = 1e-4) -> torch.Tensor:
    """Lite-PPO advantage: group mean, **batch** std (Liu et al., 2025, arXiv:2508.08221).

    ``A_i = (r_i - mean_g(r)) / (std_batch(r) + epsilon)``

    ``std_batch`` is the Bessel-corrected std of every scored reward in the
    batch (TRL ``scale_rewards="batch"``, ROLL Lite-PPO). Unscorable rows get 0.

    Provenance: paper equations — Lite-PPO (Liu et al., 2025, arXiv:2508.08221), group-mean / batch-std
    advantage normalisation (equation number not recorded); the same as TRL scale_rewards batch.
    """
    ok = ~torch.isnan(rewards)
    std = rewards[ok].std() if ok.sum() > 1 else rewards.new_tensor(0.0)
    return torch.nan_to_num(group_mean(rewards, group_ids) / (std + advantage_epsilon), nan=0.0)


@ADVANTAGES.register("gpg", min_group_size=2)
def gpg(rewards: torch.Tensor, group_ids: torch.Tensor, *,
        gpg_alpha: str = param('valid', "GPG: batch correction alpha = B / #valid rows ('valid', paper: rows outside "
                               "zero-variance groups), B / #non-zero rewards ('nonzero', verl) or 1 ('none')",
                               ['valid', 'nonzero', 'none']),
        gpg_std_normalize: bool = param(False, "GPG: F_norm = group std (True) or 1 (False, the paper's best)"),
        advantage_epsilon: float = 1e-4) -> torch.Tensor:
    """GPG corrected group advantage (Chu et al., 2025, arXiv:2504.02546; seed 000-18).

    ``A_i = alpha * (r_i - mean_g(r)) / F_norm``

    * ``F_norm = 1`` (default; the paper's best row) or ``std_g(r) + epsilon``
      (``gpg_std_normalize``).
    * ``alpha = B / (B - M)`` (``gpg_alpha="valid"``, the paper's definition):
      ``B`` scored rows in the batch, ``M`` of them in groups whose rewards are
      all equal (they carry zero advantage). With a loss averaged over the
      whole batch this turns the average into one over the rows that carry
      signal. ``"nonzero"`` is verl's approximation ``alpha = B /
      count_nonzero(r)`` (equal to the paper's for 0/1 rewards only in special
      cases); ``"none"`` sets ``alpha = 1``. When no row is valid, ``alpha = 1``
      (every advantage is 0 anyway).

    The GPG *loss* is the plain ``-A log pi`` without ratio or clip (policy
    objective ``policy_gradient``). The paper's ``beta_th`` (resample when the
    valid fraction is below a threshold) is a sampling rule, not part of this
    estimator.

    Provenance: paper equations — GPG (Chu et al., 2025, arXiv:2504.02546), the corrected advantage alpha (r -
    mean) / F_norm with alpha = B / (B - M) (equation numbers not recorded); gpg_alpha nonzero is verl's
    approximation, named as such.
    """
    adv = group_mean(rewards, group_ids)
    if gpg_std_normalize:
        _, std, _ = group_stats(rewards, group_ids)
        adv = torch.nan_to_num(adv / (std + advantage_epsilon), nan=0.0)
    scored = ~torch.isnan(rewards)
    b = float(scored.sum())
    if gpg_alpha == "valid":
        valid = float((scored & ~zero_variance_rows(rewards, group_ids)).sum())
    elif gpg_alpha == "nonzero":
        valid = float((torch.nan_to_num(rewards, nan=0.0) != 0).sum())
    elif gpg_alpha == "none":
        valid = b
    else:
        raise ValueError(f"gpg_alpha: '{gpg_alpha}' is not valid; valid values: valid, nonzero, none")
    alpha = b / valid if valid > 0 else 1.0
    return adv * alpha


@ADVANTAGES.register("group_mad", min_group_size=2)
def group_mad(rewards: torch.Tensor, group_ids: torch.Tensor, *, lengths: torch.Tensor | None = None,
              dgpo_valid_token_rescale: bool = param(False, 'DGPO: multiply advantages by all tokens / tokens of '
                                                     "non-zero-variance groups (authors' code)"),
              advantage_epsilon: float = 1e-4) -> torch.Tensor:
    """DGPO difficulty-balanced group advantage, DGAE (MathForge, Dai et al., 2026, arXiv:2601.20614; seed 000-05).

    ``A_i = n (r_i - mean_g(r)) / (sum_{j in g} |r_j - mean_g(r)| + epsilon)``
    ``    = (r_i - mean_g(r)) / (MAD_g(r) + epsilon / n)``

    with ``MAD_g`` the mean absolute deviation over the group's ``n`` scored
    rows. Every non-degenerate group then has the same total update size
    ``sum_i |A_i| = n`` whatever its accuracy (GRPO's std gives
    ``~2n sqrt(p(1-p))``, largest at p = 1/2). The ``n / (sum + eps)`` form
    and ``epsilon = 1e-4`` follow the authors' code (AMAP-ML/MathForge).

    ``dgpo_valid_token_rescale`` (authors' code, on in their DGPO runs)
    multiplies every advantage by ``(all completion tokens) / (tokens of rows
    in non-zero-variance groups)``, a token-level analogue of GPG's alpha for a
    token-mean loss. The authors' per-rank ``global_balancing_ratio`` is a
    data-parallel detail and is not needed here.

    Provenance: authors' code — https://github.com/AMAP-ML/MathForge, trl-0.20.0/trl/trainer/grpo_trainer.py
    (DGAE: n / (sum |r - mean| + eps) and the valid-token rescale); the per-rank global_balancing_ratio is a
    data-parallel detail left out.
    Test: tests/test_advantage_baselines.py::test_group_mad_hand_computed_and_constant_update_size,
    tests/test_advantage_baselines.py::test_group_mad_valid_token_rescale.
    """
    mean, _, count = group_stats(rewards, group_ids)
    dev = rewards - mean
    abs_sum = _per_group(dev.abs(), group_ids, lambda v: v.sum())
    adv = torch.nan_to_num(count * dev / (abs_sum + advantage_epsilon), nan=0.0)
    if dgpo_valid_token_rescale:
        if lengths is None:
            raise ValueError("group_mad: dgpo_valid_token_rescale needs the 'lengths' input")
        valid = ~zero_variance_rows(rewards, group_ids) & ~torch.isnan(rewards)
        valid_tokens = float(lengths[valid].sum())
        if valid_tokens > 0:
            adv = adv * (float(lengths.sum()) / valid_tokens)
    return adv


@ADVANTAGES.register("group_mean_balanced_drop", min_group_size=2)
def group_mean_balanced_drop(rewards: torch.Tensor, group_ids: torch.Tensor, step: int = 0, *,
                             red_seed: int = param(0, 'RED-Drop: seed of the choice of dropped negatives (combined '
                                                   'with the step)')) -> torch.Tensor:
    """RED-Drop: shape the data by dropping surplus negatives (Yao et al., 2025, arXiv:2509.24203; seed 000-39).

    Off-policy group-relative REINFORCE ("Group-Relative REINFORCE Is
    Secretly an Off-Policy Algorithm"), RED family, ``drop: balance`` in the
    authors' Trinity-RFT code. In each group, rows with ``r >= mean_g(r)`` are
    positives, the rest negatives. When negatives outnumber positives, ``#neg
    - #pos`` negatives chosen at random are dropped (advantage 0), and the
    baseline is the mean over the kept rows:

    ``A_i = r_i - mean_{kept}(r)`` for kept rows, ``0`` for dropped rows.

    The random choice is reproducible: it uses a generator seeded with
    ``red_seed * 1_000_003 + step`` (no state, so a resumed run drops the same
    rows). Groups where the kept set has one row get 0 (as in the authors'
    code, which then uses a zero baseline only for singleton groups; here a
    single kept row carries no relative signal).

    Provenance: reconstructed from the abstract — the RED-Drop rule as restated from the paper and the authors'
    Trinity-RFT option drop: balance (file not located in this pass): surplus negatives dropped at random,
    baseline over the kept rows; the seeded per-step draw and the singleton-group rule are grpolab's.
    """
    gen = torch.Generator().manual_seed(int(red_seed) * 1_000_003 + int(step))
    out = torch.zeros_like(rewards)
    for g in torch.unique(group_ids).tolist():
        idx = torch.nonzero((group_ids == g) & ~torch.isnan(rewards)).flatten()
        if idx.numel() < 2:
            continue
        r = rewards[idx]
        pos = r >= r.mean()
        keep = torch.ones_like(pos)
        surplus = int((~pos).sum()) - int(pos.sum())
        if surplus > 0:
            neg = torch.nonzero(~pos).flatten()
            keep[neg[torch.randperm(neg.numel(), generator=gen)[:surplus]]] = False
        if keep.sum() < 2:
            continue
        out[idx] = torch.where(keep, r - r[keep].mean(), torch.zeros_like(r))
    return out


# --------------------------------------------------------------------------- multi-reward


@ADVANTAGES.register("gdpo", min_group_size=2)
def gdpo(rewards: torch.Tensor, group_ids: torch.Tensor, reward_matrix: torch.Tensor,
         reward_weights: torch.Tensor, *, advantage_epsilon: float = 1e-4) -> torch.Tensor:
    """GDPO group reward-decoupled normalisation (seed 000-24; TRL ``normalize_then_sum``, verl ``gdpo``).

    ``A_ik = (r_ik - mean_g r_k) / (std_g r_k + epsilon)``   (each reward column separately)
    ``a_i = sum_k w_k A_ik``                                 (over the scored columns)
    ``A_i = (a_i - mean_batch a) / (std_batch a + epsilon)``  (batch re-normalisation)

    Summing the *raw* rewards first (GRPO) maps different reward combinations
    to the same advantage; normalising each reward first keeps them apart.
    Unscorable entries are left out of their column's statistics; a row with
    every reward unscorable gets 0. With one reward, the first two lines are
    exactly ``group_zscore``; GDPO differs from GRPO only by the batch step.

    Provenance: paper equations — GDPO (seed 000-24), reward-decoupled normalisation then batch re-normalisation
    (equation numbers not recorded); cross-checked against TRL multi_objective_aggregation normalize_then_sum
    and verl gdpo, which compute the same three lines.
    """
    del rewards  # the combined reward is not used: each column is normalised on its own
    decoupled = combine_rewards(_per_reward_zscore(reward_matrix, group_ids, advantage_epsilon), reward_weights)
    return _batch_whiten(decoupled, advantage_epsilon)


@ADVANTAGES.register("mo_grpo", min_group_size=2)
def mo_grpo(rewards: torch.Tensor, group_ids: torch.Tensor, reward_matrix: torch.Tensor, reward_weights: torch.Tensor,
            *,
            mo_grpo_use_weights: bool = param(False, 'MO-GRPO: weight the normalised rewards by reward_weights (the '
                                              'paper sums them unweighted)'),
            advantage_epsilon: float = 1e-4) -> torch.Tensor:
    """MO-GRPO variance-normalised reward combination (Ichihara et al., 2025, arXiv:2509.22047; seed 000-16).

    ``r~_i = sum_k (r_ik - mean_g r_k) / (std_g r_k + epsilon)``   then   ``A_i = group_zscore(r~)_i``

    Each reward is rescaled by its own group std before the sum, so every
    reward function contributes evenly to the loss whatever its scale (the
    order of preferences inside each reward is kept) and no reward can be
    hacked at the expense of the others. The sum is unweighted as in the
    paper; ``mo_grpo_use_weights`` multiplies each term by its
    ``reward_weights`` entry. Unlike GDPO the final normalisation is per
    group (the GRPO step applied to the combined reward), not over the batch.

    Provenance: paper equations — MO-GRPO (Ichihara et al., 2025, arXiv:2509.22047), per-reward group
    normalisation then the GRPO z-score (equation numbers not recorded); mo_grpo_use_weights is grpolab's
    option.
    """
    del rewards
    weights = reward_weights if mo_grpo_use_weights else torch.ones_like(reward_weights)
    combined = combine_rewards(_per_reward_zscore(reward_matrix, group_ids, advantage_epsilon), weights)
    return group_zscore(combined, group_ids, advantage_epsilon=advantage_epsilon)


@ADVANTAGES.register("multi_label_zscore", min_group_size=2)
def multi_label_zscore(rewards: torch.Tensor, group_ids: torch.Tensor, reward_matrix: torch.Tensor,
                       reward_weights: torch.Tensor, *, advantage_epsilon: float = 1e-4) -> torch.Tensor:
    """Multi-label reward combined into one scalar, then GRPO (Li et al., 2025, arXiv:2503.21819; seed 000-52).

    The paper's reward model regresses several alignment scores (politeness,
    meaningfulness, actionability, safety) that are combined into one scalar.
    Generic mechanism: each label is one reward column ``y_ik``; the scalar is
    the weighted *mean* over the labels that were scored for that row,

    ``R_i = sum_{k scored} w_k y_ik / sum_{k scored} w_k``,   ``A_i = group_zscore(R)_i``.

    Choice: renormalising the weights over the scored labels keeps a row that
    misses one label (NaN) on the same scale as the others; with every label
    scored this is the plain weighted sum up to the constant ``sum_k w_k``,
    which the z-score removes.

    Provenance: reconstructed from the abstract — the labels are reward columns combined by a weighted mean over
    the scored labels, then group_zscore; the paper's reward-model architecture is not part of this component.
    """
    del rewards
    scored = (~torch.isnan(reward_matrix)).to(reward_matrix.dtype)
    total_w = scored @ reward_weights.to(reward_matrix.dtype)
    combined = combine_rewards(reward_matrix, reward_weights) / total_w.where(total_w != 0, torch.ones_like(total_w))
    return group_zscore(combined, group_ids, advantage_epsilon=advantage_epsilon)
