"""Group-coupled objectives that regress the policy's log-ratios onto the advantages: Reg-GRPO (the z-scored
sequence log-ratio), REBEL (pairwise reward gaps) and GVPO (the group variance of the implicit reward). Each
needs whole groups in a micro-batch (its registered check)."""
from __future__ import annotations

import torch

from ...registry import POLICY_LOSSES, param
from .common import (_anchor, _anchored, _both, _group_center, _pair_matrix, _pair_rows, _positive, _row_mean,
                     _row_sum, _whole_groups, per_token)


@POLICY_LOSSES.register("reg_grpo", check=_whole_groups)
def reg_grpo(logprobs: torch.Tensor, old_logprobs: torch.Tensor, advantages: torch.Tensor, mask: torch.Tensor,
             group_ids: torch.Tensor, *, advantage_epsilon: float = 1e-4):
    """Reg-GRPO advantage regression (DeepVideo-R1, Park et al., NeurIPS 2025, arXiv:2506.07464 §3.2; seed 000-04).

    ``rho_i = sum_t log(pi_theta(o_it) / pi_old(o_it))``           (sequence log-ratio)
    ``A_theta_i = (rho_i - mean_g rho) / (std_g rho + eps)``      (predicted advantage)
    ``L_i = (A_i - A_theta_i)^2``                                    (no clip, no min)

    Source: paper §3.2 (arxiv.org/abs/2506.07464): the KL-regularised optimum
    gives ``R = lambda log(pi*/pi_old) + lambda log Z``, so the group z-score of
    the rewards equals the group z-score of ``log(pi*/pi_old)`` (Z and lambda
    cancel); the policy's z-scored log-ratio is regressed onto the GRPO
    advantage. The paper also adds GRPO's KL to the reference (the trainer's
    ``beta``; recipe 0.04). Choices: std is the Bessel-corrected group std
    (as ``group_stats`` / ``group_zscore``) and ``eps`` is ``advantage_epsilon``,
    the target advantage's own epsilon. On the first pass over a batch all
    ``rho_i = 0``: the prediction is 0 and the gradient is
    ``-2 A_i grad(rho_i - mean rho) / eps`` (std's own gradient is cut at
    zero variance to avoid 0/0), i.e. scale-free and bounded only by ``eps``;
    the authors' code was not public (github.com/mlvlab/DeepVideoR1 not in
    the searched index), so this corner is our choice.

    Provenance: paper equations — DeepVideo-R1 (Park et al., 2025, arXiv:2506.07464), Sec. 3.2: the z-scored
    sequence log-ratio regressed onto the GRPO advantage (equation numbers not recorded); std estimator, eps and
    the first-pass gradient corner are grpolab's choices (no public code).
    """
    same_pairs = _pair_matrix(group_ids, "reg_grpo")
    rho = _row_sum(logprobs - old_logprobs, mask)
    same = (group_ids[:, None] == group_ids[None, :]).to(rho.dtype)
    centred = _group_center(rho, group_ids)
    n = same_pairs.sum(-1).to(rho.dtype) + 1
    var = (same @ centred ** 2) / (n - 1)
    std = var.clamp(min=1e-12).sqrt()
    pred = centred / (std + advantage_epsilon)
    row = (_row_mean(per_token(advantages, logprobs), mask) - pred) ** 2
    return per_token(row, logprobs), {"reg_grpo_pred": per_token(pred.detach(), logprobs)}


@POLICY_LOSSES.register("rebel", check=_both(_whole_groups, _positive("rebel_eta")))
def rebel(logprobs: torch.Tensor, old_logprobs: torch.Tensor, advantages: torch.Tensor, mask: torch.Tensor,
          group_ids: torch.Tensor, *,
          rebel_eta: float = param(1.0, 'REBEL: log-ratio differences are divided by eta before regressing on reward '
                                   'gaps')):
    """REBEL relative-reward regression (Gao et al., 2024, arXiv:2404.16767; seed 000-117).

    For each pair (i, j) of rows in a group, with ``l_i = sum_t log(pi_theta(o_it) / pi_old(o_it))``:

    ``l_ij = ((l_i - l_j) / eta - (A_i - A_j))^2``,   ``L_i = mean_{j != i} l_ij``

    REBEL regresses reward differences ``r_i - r_j``. With the ``group_mean``
    advantage (recipe ``rebel``) ``A_i - A_j = r_i - r_j`` exactly; with other
    estimators it regresses their differences (e.g. normalised rewards). Pairs
    are all pairs of a group (the paper uses 2 samples per prompt).
    Checked against the authors' code (github.com/ZhaolinGao/REBEL,
    src/tldr/rebel.py): sequence log-prob sums, pi_t = the sampling policy; the
    code writes ``((l_i - l_j) - eta (r_i - r_j))^2`` = ``eta^2`` x this loss
    (same minimiser), and puts the KL-to-reference into the reward (here the
    trainer's ``beta`` KL term instead).

    Provenance: authors' code — https://github.com/ZhaolinGao/REBEL, src/tldr/rebel.py; the code's loss is eta^2
    times this one (same minimiser), and its KL-in-reward is the trainer's beta KL here.
    Test: tests/test_objectives.py::test_rebel_values_and_on_policy_gradient.
    """
    same = _pair_matrix(group_ids, "rebel")
    ell = _row_sum(logprobs - old_logprobs, mask)
    adv = _row_mean(per_token(advantages, logprobs), mask)
    pair = ((ell[:, None] - ell[None, :]) / rebel_eta - (adv[:, None] - adv[None, :])) ** 2
    return per_token(_pair_rows(pair, same), logprobs), {}


@POLICY_LOSSES.register("gvpo", check=_anchored("gvpo_anchor"))
def gvpo(logprobs: torch.Tensor, old_logprobs: torch.Tensor, advantages: torch.Tensor, mask: torch.Tensor,
         group_ids: torch.Tensor, ref_logprobs: torch.Tensor | None = None, *,
         gvpo_beta: float = param(0.1, 'GVPO: KL strength beta in the implicit reward beta * log(pi / pi_anchor)'),
         gvpo_anchor: str = param('behavior', 'GVPO: anchor policy of the implicit reward', ['behavior', 'reference']),
         gvpo_groups_per_micro_batch: int = param(4, "GVPO: the authors' step loss is the sum of the group losses of "
                                                  "a micro-batch averaged over micro-batches, i.e. this many times "
                                                  "the mean group loss (their 16 rows per GPU micro-batch / n = 4); "
                                                  "fixed here, so independent of grpolab's micro_batch_size")):
    """GVPO group-variance objective (Zhang et al., 2025, arXiv:2504.19599; seed 000-51).

    ``R_theta(o_i) = beta * sum_t log(pi_theta(o_it) / pi_anchor(o_it))``
    ``c_i = (R_theta(o_i) - mean_g R_theta) - (r_i - mean_g r)``
    group loss ``L_g = (1 / (2 (n - 1))) sum_i c_i^2``
    step loss ``k * mean_g L_g``, ``k = gvpo_groups_per_micro_batch``
    (row loss ``k n c_i^2 / (2 (n - 1))``, averaged over the step's rows by
    ``loss_aggregation: seq_mean_token_mean``, the recipe's)

    Scale, from the authors' code (github.com/jszkc/GVPO,
    ``GVPO/gvpo_core_algos.py`` ``compute_policy_loss_gvpo`` and
    ``GVPO/gvpo_dp_actor.py`` ``update_policy``): each micro-batch's loss is
    the *sum* of ``L_g`` over its groups, multiplied by
    ``1 / gradient_accumulation`` and averaged over ranks (FSDP), i.e.
    ``sum_g L_g / (number of micro-batches)`` = ``(B_micro / n) mean_g L_g``
    with ``B_micro`` the rows per GPU micro-batch: 16 / 4 = 4 in
    ``GVPO/run_qwen2-7b_math_gvpo.sh``. grpolab fixes that factor as ``k``
    (default 4) instead of tying it to its own ``micro_batch_size``, so the
    gradient equals the authors' for every micro-batch size (their run's
    configuration); ``k = 1`` gives the mean group loss.

    Its gradient is ``-(k beta / (n - 1)) mean_g sum_i w_i grad log pi(o_i)`` with
    ``w_i = (r_i - mean r) - beta (l_i - mean l)``: the authors' weighted form.
    ``r_i - mean_g r`` is taken as the group-centred row advantage (exactly
    the reward gap with ``group_mean``, the recipe's estimator). ``gvpo_anchor``: ``behavior`` (default; the sampling policy,
    no reference model needed) or ``reference`` (needs beta > 0). The paper's
    pi_theta' may be any fixed policy; the authors' verl code
    (github.com/jszkc/GVPO, README ``compute_policy_loss_gvpo``) uses the old
    (behaviour) log-probs, ``0.5 * sum_i c_i^2 / (n - 1)`` per group, with
    ``beta 0.1`` and the mean-only GRPO advantage: all matched here.

    Provenance: authors' code — https://github.com/jszkc/GVPO, GVPO/gvpo_core_algos.py
    (compute_policy_loss_gvpo) and GVPO/gvpo_dp_actor.py (update_policy); the micro-batch scale is the fixed
    factor gvpo_groups_per_micro_batch (4 in their run).
    Test: tests/test_objectives.py::test_gvpo_gradient_matches_authors_for_any_micro_batch_size.
    """
    same = _pair_matrix(group_ids, "gvpo")
    anchor = _anchor(gvpo_anchor, old_logprobs, ref_logprobs, "gvpo")
    implicit = gvpo_beta * _row_sum(logprobs - anchor, mask)
    adv = _row_mean(per_token(advantages, logprobs), mask)
    c = _group_center(implicit, group_ids) - _group_center(adv, group_ids)
    n = same.sum(-1).to(c.dtype) + 1
    return per_token(gvpo_groups_per_micro_batch * n * c ** 2 / (2 * (n - 1)), logprobs), {}
