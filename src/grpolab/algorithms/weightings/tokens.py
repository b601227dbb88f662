"""Token weights: λ-GRPO's shared-prefix weights, TW-GRPO's intra-group divergence weights, LC-R1's compress
bonus at the end-of-thinking token and AVATAR's temporal advantage shaping. Each returns ``[R, T]``
advantages."""
from __future__ import annotations

import torch

from ...registry import WEIGHTINGS, param
from ..groups import group_index
from ..losses import per_token


# --------------------------------------------------------------------------- lambda-GRPO


def shared_prefix_counts(completion_ids: torch.Tensor, completion_mask: torch.Tensor,
                         group_ids: torch.Tensor) -> torch.Tensor:
    """``k[i, t]`` = rows of i's group whose first t+1 completion tokens equal row i's
    (i itself included; only rows that still have a token at t count). 0 on padding."""
    R, T = completion_ids.shape
    alive = completion_mask > 0
    same_group = group_ids[:, None] == group_ids[None, :]                            # [R, R]
    eq = (completion_ids[:, None, :] == completion_ids[None, :, :]) & alive[:, None, :] & alive[None, :, :]
    prefix_eq = torch.cumprod(eq.to(torch.int64), dim=-1).bool()                     # [R, R, T]
    k = (prefix_eq & same_group[:, :, None]).sum(1)
    return k * alive


@WEIGHTINGS.register("lambda_prefix_weight", needs=("tokens",))
def lambda_prefix_weight(advantages: torch.Tensor, group_ids: torch.Tensor, completion_mask: torch.Tensor, batch, *,
                         lambda_grpo_power: float = param(1.0, 'lambda-GRPO: token weight k^-lambda, k = group '
                                                          "completions sharing the token's prefix (0 = GRPO)")
                         ) -> torch.Tensor:
    """λ-GRPO shared-prefix weighting ("GRPO is secretly a PRM", 2025, seed 004-03).

    ``A'_it = A_i * k_it^(-lambda)``, ``k_it`` = number of completions in i's group
    sharing i's prefix up to and including token t (:func:`shared_prefix_counts`).
    A shared prefix is one "process step" of GRPO's implicit PRM; vanilla GRPO
    counts a step shared by k completions k times. With ``lambda = 1`` each
    step counts once (its tokens' total weight is the mean of the sharing
    completions' advantages, the step's Monte-Carlo process reward); ``lambda = 0``
    is GRPO. Output ``[R, T]``.

    Provenance: authors' code — https://github.com/coli-saar/grpo-prm,
    lambda_grpo/utils.py (InfPRMTree.loss_scales: a prefix tree over the
    group's trajectories, every token of a node scaled by 1 / the number of
    trajectories through it, identical trajectories sharing one leaf) and
    lambda_grpo/trainer.py (LambdaGRPOTrainer._step: the clipped surrogate
    times the scale, summed per sequence over its token count, mean over
    sequences = ``seq_mean_token_mean``; defaults in train_utils.py: group 6,
    beta 0, loss_type grpo, scaling on). ``lambda = 1`` is the authors'
    method and ``lambda = 0`` their ``--no_loss_scale``; other exponents are
    grpolab's interpolation. Known difference: with ``beta > 0`` the authors
    also scale the KL term per token; here the weight scales the advantage
    only (the recipe, like the authors' default, has beta 0).
    Test: tests/test_advantage_shaping.py::test_lambda_prefix_weight,
    tests/test_advantage_shaping.py::test_lambda_grpo_loss_matches_the_authors_trainer.
    """
    k = shared_prefix_counts(batch.completion_ids, completion_mask, group_ids).to(torch.float64)
    w = torch.where(k > 0, k.clamp(min=1) ** (-lambda_grpo_power), torch.zeros_like(k)).to(advantages.dtype)
    return per_token(advantages, w) * w


# --------------------------------------------------------------------------- TW-GRPO


@WEIGHTINGS.register("tw_token_weight", needs=("tokens",))
def tw_token_weight(advantages: torch.Tensor, group_ids: torch.Tensor, batch, token_group_divergence: torch.Tensor,
                    *, tw_alpha: float = param(1.7, 'TW-GRPO: maximum token weight; weights min-max map the group '
                                               "divergence to [1, alpha] (>= 1; 1 = GRPO; authors' script uses "
                                               '1.7)')) -> torch.Tensor:
    """TW-GRPO token weights from intra-group divergence (Dang et al., 2025, arXiv:2505.24718, seed 000-95).

    Per group g (its ``G`` rows) and completion position ``t < T_g`` (``T_g`` =
    the group's longest completion), with ``lp_i,t`` row i's full next-token
    log-probability vector (a row that has ended before t takes the uniform
    distribution ``-log V``) and ``m_t = mean_i lp_i,t`` (mean in log space)::

        D_i,t = sum_v k3(m_t,v - lp_i,t,v),   k3(d) = exp(d) - d - 1,  d clamped to [-11, 11]
        s_t   = mean_i D_i,t                                            (all G rows)
        n_t   = (s_t - min_t' s_t') / (max_t' s_t' - min_t' s_t' + 1e-8)  (over t' < T_g)
        w_t   = 1 + (alpha - 1) * n_t                                     (in [1, alpha])

    and every row's advantage at t is multiplied by ``w_t``. Positions where
    the group's next-token distributions agree get weight 1 — whatever tokens
    were sampled there — and the most divergent position gets ``alpha``.
    ``D`` is the input ``token_group_divergence`` ``[R, T]``, which the trainer
    computes from the policy's full distributions when a selected component
    asks for it (:func:`grpolab.model.logprobs.group_token_divergence`: a
    no-grad forward of the batch at the start of the step, reduced to ``D``
    position-chunk by position-chunk, never a stored ``[R, T, V]``).
    ``tw_alpha`` must be >= 1; 1 gives GRPO. Output ``[R, T]``.

    Provenance: authors' code — https://github.com/longmalongma/TW-GRPO, src/open_r1/trainer/grpo_trainer.py
    (compute_token_importance_kl_logs_uniform); matches the weights of
    ``loss_type tw_grpo`` (scripts/tw-grpo.sh: alpha 1.70, beta 0): full
    distributions of the current policy (their ``per_logps`` of the training
    forward, one update per generation batch), uniform padding of ended rows,
    mean over all G rows, min-max over the group's positions (their ``T`` is
    the padded width of a one-prompt device batch: the group's longest
    completion, as here). Known differences: their weights multiply the whole
    per-token loss (KL included; beta = 0 in their script, where the two
    coincide) and keep the gradient of ``per_logps`` (not detached), so their
    gradient has an extra term ``-(1/N) sum_t (sum_{i alive at t} A_i) grad w_t``,
    zero at positions where all rows of the group are alive (z-scored A sums to
    0); grpolab's weights are constants (no_grad) computed once per step, so
    with ``num_iterations > 1`` later passes keep the first pass's weights
    (their trainer has one pass). The soft multi-choice reward and Q/A
    inversion are task-side, not here.
    Test: tests/test_advantage_shaping.py::test_tw_token_weight_issue_example,
    tests/test_advantage_shaping.py::test_tw_token_weight_uniform_padding_ragged_groups.
    """
    if tw_alpha < 1.0:
        raise ValueError(f"tw_alpha: the maximum token weight must be >= 1, got {tw_alpha}")
    inv, n_groups = group_index(group_ids)
    alive = batch.completion_attention_mask > 0
    D = token_group_divergence.to(torch.float64)
    w = torch.ones_like(D)
    for g in range(n_groups):
        rows = (inv == g).nonzero().squeeze(-1)
        Tg = int(alive[rows].sum(-1).max())
        if Tg == 0:
            continue
        s = D[rows, :Tg].mean(0)
        norm = (s - s.min()) / (s.max() - s.min() + 1e-8)
        w[rows, :Tg] = (1.0 + (tw_alpha - 1.0) * norm)[None, :]
    w = w.to(advantages.dtype)
    return per_token(advantages, w) * w


# --------------------------------------------------------------------------- LC-R1


@WEIGHTINGS.register("lc_compress_bonus", needs=("text",))
def lc_compress_bonus(advantages: torch.Tensor, completion_mask: torch.Tensor, batch, *,
                      lc_compress_weight: float = param(1.0, "LC-R1: weight of the compress reward added to the "
                                                        "advantage at the end-of-thinking token (the authors' "
                                                        "add_adv, 1)")) -> torch.Tensor:
    """LC-R1 compress reward, a token-level advantage term (Cheng et al., 2025, arXiv:2506.14755; seed 000-100).

    ``A_i,t = A_i + w * c_i * [t = p_i]``: the row's compress reward
    ``c_i = 1 - |R'|/(|R| + 1e-4)`` (``-1`` when the answer is not in the
    reasoning; 0 for wrong rows) is added, unnormalised, to the advantage of
    the one token ``p_i`` where the reasoning ends (the end-of-thinking marker
    of the cropped sequence), after the group baseline. ``c`` and ``p`` are the
    columns ``lc_compress`` and ``lc_think_end`` written by the ``lc_r1``
    rollout strategy (an error names it when they are missing). Output ``[R, T]``.

    Provenance: authors' code — https://github.com/zxiangx/LC-R1, trl/trainer/grpo_trainer.py
    (_generate_and_score_completions); matches ``advantages = torch.where(inf_mask,
    advantages + self.add_adv * length_compress_ratio, advantages)`` with
    ``inf_mask`` the ``</think>`` position ``max_lengths`` of right rows, after
    the group mean is subtracted.
    Test: tests/test_lc_r1.py::test_lc_compress_bonus_is_added_at_one_token.
    """
    cols = batch.columns
    missing = [c for c in ("lc_compress", "lc_think_end") if c not in cols]
    if missing:
        raise ValueError(f"lc_compress_bonus needs the batch columns {missing}, written by rollout_strategy: lc_r1 "
                         f"(the valid-thinking crop); select it (recipe lc_r1)")
    adv = per_token(advantages, completion_mask).clone()
    T = adv.shape[1]
    for i, (c, p) in enumerate(zip(cols["lc_compress"], cols["lc_think_end"])):
        if c != 0 and 0 <= p < T:
            adv[i, p] = adv[i, p] + lc_compress_weight * c
    return adv


# --------------------------------------------------------------------------- AVATAR: Temporal Advantage Shaping


def tas_weights(completion_mask: torch.Tensor, tas_lambda: float) -> torch.Tensor:
    """AVATAR's TAS weights ``[R, T]``: ``w_it = 1 + lambda * (2 t / max(L_i - 1, 1) - 1)^2``, ``t`` the column
    index (0-based), ``L_i = max(sum_t mask_it, 1)``; all ones when ``lambda <= 0`` (the authors' switch-off)."""
    R, T = completion_mask.shape
    if tas_lambda <= 0:
        return torch.ones(R, T, dtype=torch.float32, device=completion_mask.device)
    t = torch.arange(T, device=completion_mask.device, dtype=torch.float32)[None, :].expand(R, T)
    L = completion_mask.sum(-1).clamp(min=1).to(torch.float32)
    denom = (L - 1).clamp(min=1)[:, None]
    return 1.0 + float(tas_lambda) * (2.0 * t / denom - 1.0) ** 2


@WEIGHTINGS.register("avatar_tas", needs=("tokens",))
def avatar_tas(advantages: torch.Tensor, completion_mask: torch.Tensor, *,
               avatar_tas_lambda: float = param(0.3, "AVATAR TAS: amplitude lambda of the U-shaped token weight "
                                                "1 + lambda (2t/(L-1) - 1)^2 (the authors' tas_lambda 0.3; "
                                                "<= 0 = GRPO)")) -> torch.Tensor:
    """AVATAR Temporal Advantage Shaping, TAS (AVATAR, 2025, arXiv:2508.03100; seed 000-104).

    ``A'_it = A_i * w_it``,  ``w_it = 1 + lambda * (2 t / (L_i - 1) - 1)^2``

    with ``t`` the token's column in the completion (0-based) and ``L_i`` the row's loss-token count
    (:func:`tas_weights`): a U over the completion, ``1 + lambda`` at the first and last token and 1 in the
    middle, so early planning tokens and the final answer weigh more. Not normalised: the weights' mean over a
    row exceeds 1 (for ``L = 3``, ``lambda = 0.3``: 1.3, 1, 1.3). ``L = 1``: the denominator is clamped to 1,
    so the single token gets ``1 + lambda``. ``lambda <= 0`` gives weight 1 (GRPO). Output ``[R, T]``.

    The authors multiply the per-token *loss* (the clipped surrogate, before the KL term is added) by ``w``;
    for ``w > 0`` that equals multiplying the advantage inside the clipped surrogate, since
    ``-min(rho A w, clip(rho) A w) = w * -min(rho A, clip(rho) A)``, so a weighting gives the same loss with
    ``policy_loss: clipped_ratio`` and leaves the KL term unweighted, as theirs.

    Provenance: authors' code — https://github.com/yogkul2000/AVATAR,
    ms-swift/swift/rlhf_trainers/grpo_tas_trainer.py (GRPOTASTrainer._compute_tas_weights: positions are the
    column index over the padded width, ``L = mask.sum().clamp(min=1)``, denominator ``(L - 1).clamp(min=1)``,
    no normalisation; applied to every mini-batch, replayed ones included); lambda 0.3 from args_mixin.py and
    the Qwen2.5-Omni launcher. Known difference: a loss whose per-token term is not linear in the advantage
    (other than the clipped ratio) sees a weighted advantage rather than a weighted loss; the avatar_replay
    stage applies the same weights to the rows it replays.
    Test: tests/test_vision_tools_avatar.py::test_tas_weights_by_hand.
    """
    w = tas_weights(completion_mask, avatar_tas_lambda).to(advantages.dtype)
    return per_token(advantages, completion_mask) * w
