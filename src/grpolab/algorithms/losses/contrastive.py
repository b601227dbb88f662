"""Group-contrastive and pairwise objectives: DisCO's discriminative objective, CoPG's contrastive policy
gradient, P3O's pairwise clipped PPO and GTPO's conflict-token protection with entropy filtering. Each needs whole
groups in a micro-batch (its registered check)."""
from __future__ import annotations

import torch

from ...registry import POLICY_LOSSES, param
from .common import (_anchor, _anchored, _both, _pair_matrix, _pair_rows, _positive, _row_mean, _row_sum,
                     _whole_groups, per_token)


@POLICY_LOSSES.register("disco", check=_both(_whole_groups, _positive("disco_tau")))
def disco(logprobs: torch.Tensor, old_logprobs: torch.Tensor, advantages: torch.Tensor, mask: torch.Tensor,
          group_ids: torch.Tensor, *,
          disco_score: str = param('log_l', 'DisCO scoring function', ['log_l', 'l_ratio']),
          disco_tau: float = param(10.0, 'DisCO: log-sum-exp temperature over negatives (10 for log_l, 1 for l_ratio)'),
          disco_delta: float = param(0.0001, 'DisCO: KL(pi_old || pi_theta) budget delta'),
          disco_beta: float = param(1000.0, 'DisCO: squared-hinge penalty weight on KL above delta'),
          disco_balanced: bool = param(False, 'DisCO-b: plain mean over negatives instead of log-sum-exp')):
    """DisCO discriminative constrained objective (Li et al., 2025, arXiv:2505.12366; seed 000-33).

    Score of a completion (non-clipping surrogates):
    ``log_l``: ``s(o) = mean_t log pi_theta(o_t)``; ``l_ratio``: ``s(o) = mean_t pi_theta(o_t) / pi_old(o_t)``.
    Positives ``O+`` = rows with A > 0, negatives ``O-`` = rows with A < 0 (binary
    rewards: correct / wrong in a mixed group). Per group:

    ``J = mean_{O+} s - tau log mean_{O-} exp(s / tau)``   (DisCO, imbalance-aware)
    ``J = mean_{O+} s - mean_{O-} s``                        (DisCO-b, ``disco_balanced``)

    The row loss spreads ``-n_g J`` over the group's rows (positives
    ``-(n_g/n+) s_i``, each negative ``(n_g/n-) tau LME``) so that
    ``seq_mean_token_mean`` gives ``-mean_g J``. Groups with no contrast (all
    A = 0) contribute 0. The trust region is the constrained KL, a squared hinge
    on every token: ``beta * max(0, KL(pi_old || pi_theta) - delta)^2`` with
    ``KL = mean over the micro-batch tokens of (log pi_old - log pi_theta)``
    (the authors' code; exact when a micro-batch is the whole step).
    Defaults are the paper's: tau 10 (log_l), delta 1e-4, beta 1e3.

    Provenance: authors' code — https://github.com/Optimization-AI/DisCO, verl/verl/trainer/ppo/core_algos.py
    (compute_policy_loss_disco_logL / _Lratio and the discob_ variants); scores (mean token log-prob, or mean
    ratio), positives / negatives per question and the tau log-mean-exp over negatives as there; known
    difference: the trust region uses the code's kl_type 'kl' (mean log pi_old - log pi_theta), its default is
    'low_var_kl'; defaults tau 10, delta 1e-4, beta 1e3 as in the paper.
    Test: tests/test_objectives.py::test_disco_values_and_kl_constraint.
    """
    if disco_score == "log_l":
        score = _row_mean(logprobs, mask)
    elif disco_score == "l_ratio":
        score = _row_mean(torch.exp((logprobs - old_logprobs).clamp(-20.0, 20.0)), mask)
    else:
        raise ValueError(f"disco_score: '{disco_score}' is not valid; valid values: log_l, l_ratio")
    _pair_matrix(group_ids, "disco")
    adv = _row_mean(per_token(advantages, logprobs), mask)
    pos, neg = adv > 0, adv < 0
    same = (group_ids[:, None] == group_ids[None, :]).to(score.dtype)
    n_g = same.sum(-1)
    n_pos = same @ pos.to(score.dtype)
    n_neg = same @ neg.to(score.dtype)
    if disco_balanced:
        neg_term = (same @ torch.where(neg, score, 0.0)) / n_neg.clamp(min=1)
    else:
        big = torch.where(neg[None, :] & (same > 0), score[None, :] / disco_tau, torch.full_like(same, -torch.inf))
        lme = torch.logsumexp(big, dim=-1) - torch.log(n_neg.clamp(min=1))
        neg_term = disco_tau * torch.where(n_neg > 0, lme, torch.zeros_like(lme))
    row = torch.where(pos, -n_g / n_pos.clamp(min=1) * score, torch.zeros_like(score))
    row = row + torch.where(neg, n_g / n_neg.clamp(min=1) * neg_term, torch.zeros_like(score))
    kl = ((old_logprobs - logprobs) * mask).sum() / mask.sum().clamp(min=1)
    penalty = disco_beta * torch.relu(kl - disco_delta) ** 2
    loss = per_token(row, logprobs) + penalty
    return loss, {"disco_kl": torch.full_like(logprobs, float(kl.detach()))}


@POLICY_LOSSES.register("copg", check=_anchored("copg_anchor"))
def copg(logprobs: torch.Tensor, old_logprobs: torch.Tensor, advantages: torch.Tensor, mask: torch.Tensor,
         group_ids: torch.Tensor, ref_logprobs: torch.Tensor | None = None, *,
         copg_beta: float = param(0.1, 'CoPG: KL strength beta in the regularised reward r - beta log(pi / pi_anchor)'),
         copg_anchor: str = param('behavior', 'CoPG: anchor policy of the KL term', ['behavior', 'reference'])):
    """Contrastive Policy Gradient (Flet-Berliac et al., 2024, arXiv:2406.19185; seed 000-93).

    For a pair (i, j) of completions of a prompt, ``L_i = sum_t log pi_theta(o_it)``,
    ``l_i = sum_t log(pi_theta / pi_anchor)(o_it)``:

    ``l_ij = -1/2 [ (r_i - r_j)(L_i - L_j) - (beta / 2)(l_i - l_j)^2 ]``

    Its gradient is ``-1/2 (R_i - R_j) grad(L_i - L_j)`` with the regularised
    reward ``R = r - beta l``: a policy gradient whose baseline is the other
    completion (no importance ratio). ``beta = 0`` is the contrastive policy
    gradient; fixing the reward difference gives IPO. ``r_i - r_j`` is taken as
    ``A_i - A_j`` (exact with the ``group_mean`` advantage). All pairs of a group,
    ``L_i = mean_{j != i} l_ij``. Anchor: ``behavior`` (default) or ``reference``.
    The paper (arxiv.org/abs/2406.19185, offline setting) regularises towards
    ``pi_ref``; ``behavior`` is our online default (no reference model), so use
    ``reference`` + beta > 0 for the paper's anchor.

    Provenance: reconstructed from the abstract — the pairwise loss above is
    grpolab's writing of the paper's contrastive objective as described by its
    abstract and secondary summaries (the method section, and so its equation
    numbers, were not in the searched store); the all-pairs average within a
    group, ``r_i - r_j = A_i - A_j`` and the ``behavior`` anchor default are
    grpolab's choices. Searched: arXiv:2406.19185 pages, the code index
    (contrastive policy gradient / CoPG implementations: none by the
    authors), GitHub issues.
    """
    same = _pair_matrix(group_ids, "copg")
    anchor = _anchor(copg_anchor, old_logprobs, ref_logprobs, "copg")
    total = _row_sum(logprobs, mask)
    ell = _row_sum(logprobs - anchor, mask)
    adv = _row_mean(per_token(advantages, logprobs), mask)
    pair = -0.5 * ((adv[:, None] - adv[None, :]) * (total[:, None] - total[None, :])
                   - 0.5 * copg_beta * (ell[:, None] - ell[None, :]) ** 2)
    return per_token(_pair_rows(pair, same), logprobs), {}


@POLICY_LOSSES.register("p3o", check=_whole_groups)
def p3o(logprobs: torch.Tensor, old_logprobs: torch.Tensor, advantages: torch.Tensor, mask: torch.Tensor,
        group_ids: torch.Tensor, *, p3o_epsilon: float = param(0.2, 'P3O: clip range of the trajectory-wise ratio')):
    """Pairwise PPO, separate clipping (Wu et al., 2023, arXiv:2310.00212; seed 000-64).

    Trajectory-wise ratio ``rho_i = pi_theta(o_i) / pi_old(o_i)`` (product over
    tokens). For a pair (i, j) with reward difference ``D_ij = r_i - r_j``:

    ``l_ij = -1/2 [ min(rho_i D_ij, clip(rho_i) D_ij) + min(rho_j D_ji, clip(rho_j) D_ji) ]``

    averaged over the pairs of a group. Per row this is the clipped surrogate
    with the positive and the negative parts of ``sum_j D_ij`` clipped
    separately (``clipped_ratio`` is reused for both). ``D_ij = A_i - A_j``
    (exact reward differences with ``group_mean``; invariant to a per-prompt
    reward shift, as P3O).

    Provenance: reconstructed from the abstract — the separate-clipping
    variant as written above (trajectory-wise ratio, pairwise reward
    difference) follows the abstract and blog summaries; the all-pairs
    average, ``D_ij = A_i - A_j`` and the KL-in-reward as the trainer's
    ``beta`` are grpolab's choices. Searched: arXiv:2310.00212 pages (method
    section not stored), the code index (pairwise proximal policy
    optimization: no authors' repository; an unrelated "P3O" for prompt
    optimization and a policy-on/policy-off P3O).
    """
    same = _pair_matrix(group_ids, "p3o")
    log_rho = _row_sum(logprobs - old_logprobs, mask)
    adv = _row_mean(per_token(advantages, logprobs), mask)
    diff = (adv[:, None] - adv[None, :]) * same.to(adv.dtype)
    n_other = same.sum(-1).to(adv.dtype)
    pos_part = torch.relu(diff).sum(-1) / n_other
    neg_part = -torch.relu(-diff).sum(-1) / n_other
    clip = POLICY_LOSSES.get("clipped_ratio")
    lr = per_token(log_rho, logprobs)
    zero = torch.zeros_like(lr)
    lp, mp = clip(lr, zero, per_token(pos_part, logprobs), mask, epsilon=p3o_epsilon)
    ln, mn = clip(lr, zero, per_token(neg_part, logprobs), mask, epsilon=p3o_epsilon)
    return lp + ln, {"clip_frac_low": mn["clip_frac_low"], "clip_frac_high": mp["clip_frac_high"]}


def _conflicts(ids: torch.Tensor, mask: torch.Tensor, pos: torch.Tensor, neg: torch.Tensor,
               same_group: torch.Tensor) -> torch.Tensor:
    """Leading run of positions whose token also appears at that position in a
    positive and in a negative completion of the same group."""
    valid = mask > 0
    eq = (ids[:, None, :] == ids[None, :, :]) & valid[:, None, :] & valid[None, :, :] & same_group[:, :, None]
    has_pos = (eq & pos[None, :, None]).any(1)
    has_neg = (eq & neg[None, :, None]).any(1)
    raw = has_pos & has_neg & valid
    return torch.cumprod(raw.long(), dim=-1).bool()


@POLICY_LOSSES.register("gtpo_conflict", check=_whole_groups, needs=("tokens",))
def gtpo_conflict(logprobs: torch.Tensor, old_logprobs: torch.Tensor, advantages: torch.Tensor, mask: torch.Tensor,
                  group_ids: torch.Tensor, entropy: torch.Tensor, batch=None, *, epsilon: float = 0.2,
                  epsilon_high: float | None = None,
                  gtpo_conflict_weight: float = param(2.0, 'GTPO: weight of conflict tokens in positive completions'),
                  gtpo_entropy_threshold: float = param(0.7, 'GTPO: completions with mean entropy above this get '
                                                        'advantage 0'),
                  gtpo_entropy_coef: float = param(0.1, 'GTPO: advantage -= coef * mean completion entropy (kept '
                                                   'completions)')):
    """GTPO conflict-token protection and entropy filtering (Simoni et al., 2025, arXiv:2508.03772; seed 000-29).

    Conflict tokens: token ``o_it`` at position t such that the same token id
    sits at position t in a positive (A > 0) *and* in a negative (A < 0)
    completion of the group; as in the authors' code only the leading run of
    such positions counts, aligned from the start and, separately, from the end
    of each completion. Token weight ``delta_it``: 1 for ordinary tokens,
    ``gtpo_conflict_weight`` (2) for conflict tokens of positive completions
    (amplified), 0 for conflict tokens of negative completions (negative update
    skipped); the start- and end-aligned weights multiply.

    Entropy filter: a completion whose mean token entropy ``H_i`` exceeds
    ``gtpo_entropy_threshold`` gets advantage 0; the others get
    ``A_i - gtpo_entropy_coef * H_i`` (authors' code: threshold 0.7, coef 0.1).

    ``loss_t = clipped_ratio(A'_it = delta_it (A_it - c H_i))``; on-policy this
    is the authors' ratio-1 policy gradient. Choice: their per-completion
    division by the number of conflict tokens is left out (not in the paper's
    objective); no KL is needed (recipe beta 0).

    Provenance: authors' code — https://github.com/winstonsmith1897/GTPO, gtpo/gtpo_training.py (conflict tokens
    from the leading runs at start and end, entropy threshold 0.7 and coefficient 0.1); their per-completion
    division by the number of conflict tokens is left out.
    Test: tests/test_objectives.py::test_gtpo_conflict_tokens_and_entropy_filter.
    """
    if batch is None:
        raise ValueError("gtpo_conflict needs the batch (completion token ids)")
    ids = batch.completion_ids[:, :logprobs.shape[1]]
    _pair_matrix(group_ids, "gtpo_conflict")
    adv_tok = per_token(advantages, logprobs)
    adv_row = _row_mean(adv_tok, mask)
    pos, neg = adv_row > 0, adv_row < 0
    same_group = group_ids[:, None] == group_ids[None, :]
    fwd = _conflicts(ids, mask, pos, neg, same_group)
    # end-aligned: reverse each row's tokens so its last token sits at position 0
    T = ids.shape[1]
    lengths = batch.completion_attention_mask[:, :T].sum(-1).long()
    idx = (lengths[:, None] - 1 - torch.arange(T, device=lengths.device)[None, :])
    valid_rev = idx >= 0
    idx_c = idx.clamp(min=0)
    rev = _conflicts(torch.where(valid_rev, ids.gather(1, idx_c), -1), valid_rev.to(mask.dtype), pos, neg, same_group)
    bwd = rev.gather(1, idx_c) & valid_rev & (mask > 0)  # t <-> L-1-t is its own inverse

    def weight(conflict):
        w_conf = torch.where(pos[:, None], torch.full_like(mask, gtpo_conflict_weight), torch.zeros_like(mask))
        return torch.where(conflict, w_conf, torch.ones_like(mask))

    delta = weight(fwd) * weight(bwd)
    h = _row_mean(entropy.detach(), mask)
    keep = h <= gtpo_entropy_threshold
    shaped = torch.where(keep[:, None], adv_tok - gtpo_entropy_coef * h[:, None], torch.zeros_like(adv_tok))
    loss, metrics = POLICY_LOSSES.get("clipped_ratio")(logprobs, old_logprobs, shaped * delta, mask,
                                                       epsilon=epsilon, epsilon_high=epsilon_high)
    metrics = {**metrics, "gtpo_conflict_frac": (fwd | bwd).float(),
               "gtpo_filtered_frac": (~keep).float()[:, None].expand_as(mask)}
    return loss, metrics
