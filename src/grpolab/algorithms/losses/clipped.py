"""Clipped-ratio objectives: the PPO / GRPO clipped surrogate per token, GSPO's sequence ratio (and
GSPO-token), Rank-GRPO's rank-level ratio, LUSPO's length-unbiased sequence loss, Guide-GRPO's shaped ratio on
hinted rows and AWPO's clipped advantage."""
from __future__ import annotations

import torch

from ...errors import ConfigError, warn_fallback
from ...registry import POLICY_LOSSES, param
from .common import _positive, _segment_mean, per_token


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


@POLICY_LOSSES.register("sequence_ratio")
def sequence_ratio(logprobs: torch.Tensor, old_logprobs: torch.Tensor, advantages: torch.Tensor,
                   mask: torch.Tensor, *, epsilon: float = 0.2, epsilon_high: float | None = None):
    """GSPO sequence-level clipped ratio (Zheng et al., 2025, arXiv:2507.18071).

    ``s_i = (pi_theta(o_i) / pi_old(o_i))^(1/|o_i|) = exp(mean_t log r_it)``
    ``loss_it = -min(s_i A_it, clip(s_i, 1 - eps_low, 1 + eps_high) A_it)``

    The loss is the same on every token of a sequence, so ``seq_mean_token_mean``
    gives GSPO's ``(1/G) sum_i -min(s_i A_i, clip(s_i) A_i)``. The published
    ranges are ``epsilon = 3e-4``, ``epsilon_high = 4e-4`` (recipe ``gspo``).
    When every token of a sequence has the same ratio, ``s_i = r_it`` and the
    per-token loss equals ``clipped_ratio``'s, so GSPO = GRPO under any
    aggregation (and as objectives under GRPO's ``seq_mean_token_mean``).
    The clip itself is ``clipped_ratio`` applied to ``log s_i``.

    Provenance: paper equations — GSPO (Zheng et al., 2025, arXiv:2507.18071), the sequence importance ratio s_i
    and its clipped objective (Sec. 4); ranges 3e-4 / 4e-4 as published.
    """
    log_s, _, _ = _segment_mean(logprobs - old_logprobs, mask, torch.zeros_like(mask, dtype=torch.long))
    return POLICY_LOSSES.get("clipped_ratio")(log_s, torch.zeros_like(log_s), advantages, mask,
                                              epsilon=epsilon, epsilon_high=epsilon_high)


@POLICY_LOSSES.register("sequence_ratio_token")
def sequence_ratio_token(logprobs: torch.Tensor, old_logprobs: torch.Tensor, advantages: torch.Tensor,
                         mask: torch.Tensor, *, epsilon: float = 0.2, epsilon_high: float | None = None):
    """GSPO-token (arXiv:2507.18071 §4.3; verl ``gspo``; anchors §2 and §5).

    ``s_it = sg(s_i) * pi_theta(o_it) / sg(pi_theta(o_it))``, clipped like GSPO.

    Its value equals ``s_i`` on every token, and its gradient is
    ``s_i grad log pi(o_it)``, so with a per-sequence advantage and
    ``seq_mean_token_mean`` its gradient equals GSPO's; it additionally allows
    token-level advantages ``A_it``.

    Provenance: paper equations — GSPO (Zheng et al., 2025, arXiv:2507.18071), the GSPO-token objective of Sec.
    4.3; verl's gspo loss computes the same.
    """
    log_s, _, _ = _segment_mean((logprobs - old_logprobs).detach(), mask, torch.zeros_like(mask, dtype=torch.long))
    log_s_token = log_s + logprobs - logprobs.detach()
    return POLICY_LOSSES.get("clipped_ratio")(log_s_token, torch.zeros_like(log_s), advantages, mask,
                                              epsilon=epsilon, epsilon_high=epsilon_high)


@POLICY_LOSSES.register("rank_ratio")
def rank_ratio(logprobs: torch.Tensor, old_logprobs: torch.Tensor, advantages: torch.Tensor, mask: torch.Tensor,
               batch=None, *, epsilon: float = 0.2, epsilon_high: float | None = None):
    """Rank-GRPO rank-level ratio (ConvRec-R1, Zhu et al., 2025, arXiv:2510.20150, github.com/yaochenzhu/Rank-GRPO; seed 000-91).

    Each item of a ranked list is a span (``batch.span_ids > 0``); tokens with
    span 0 form one more unit per row. For unit k of row i:

    ``w_ik = exp(mean_{t in k} log r_it)``   (geometric mean of the item's token ratios)
    ``loss_t = -min(w_ik A_t, clip(w_ik) A_t) * |o_i| / (K_i |k|)``

    The weight makes ``seq_mean_token_mean`` average the *items* of a row
    equally (``(1/K_i) sum_k``), as the paper averages over ranks. With no spans
    this is ``sequence_ratio`` (GSPO); with one token per span it is
    ``clipped_ratio``. The per-rank rewards/advantages come from the advantage
    stage (token-level advantages); this objective only defines the ratio.

    Provenance: paper equations — Rank-GRPO (Zhu et al., 2025, arXiv:2510.20150), the rank-level ratio as the
    geometric mean of an item's token ratios, averaged over ranks (equation numbers not recorded); the authors'
    code (github.com/yaochenzhu/Rank-GRPO) was not compared line by line.
    """
    segments = batch.span_ids if batch is not None else torch.zeros_like(mask, dtype=torch.long)
    if not bool((segments[:, :mask.shape[1]] * mask > 0).any()):
        warn_fallback("rank_ratio", "rank-item spans (batch.span_ids: the rollout marked no item)",
                      "one unit per completion, i.e. GSPO's sequence ratio")
    log_w, unit_size, units = _segment_mean(logprobs - old_logprobs, mask, segments)
    loss, metrics = POLICY_LOSSES.get("clipped_ratio")(log_w, torch.zeros_like(log_w), advantages, mask,
                                                       epsilon=epsilon, epsilon_high=epsilon_high)
    weight = mask.sum(-1, keepdim=True) / (units[:, None].clamp(min=1) * unit_size.clamp(min=1))
    return loss * weight, metrics


@POLICY_LOSSES.register("luspo")
def luspo(logprobs: torch.Tensor, old_logprobs: torch.Tensor, advantages: torch.Tensor, mask: torch.Tensor, *,
          epsilon: float = 0.2, epsilon_high: float | None = None):
    """LUSPO length-unbiased sequence loss: GSPO's clipped sequence loss scaled by the length (arXiv:2602.05261).

    ``s_i = exp(mean_t log r_it)``,  ``l_i = -min(s_i A_i, clip(s_i, 1 - eps_low, 1 + eps_high) A_i)``
    ``loss_it = |o_i| * l_i``   (on every token of row i)

    Under ``seq_mean_token_mean`` this gives ``(1/N) sum_i |o_i| l_i``; under
    ``seq_mean_token_mean_all_rows`` (``N`` = every row, fully masked ones
    included) it is TRL's ``luspo`` (``(per_token_loss * mask.sum(1)).mean()``
    on a sequence-level loss), which the TRL drop-in selects. GSPO's ``(1/N) sum_i l_i`` weights every sequence equally, so a long
    response gets less gradient per token than a short one; scaling by
    ``|o_i|`` removes that length bias. At ``s_i = 1`` the gradient is the
    token-sum policy gradient ``-(1/N) sum_i sum_t A_i grad log pi(o_it)``; with
    all lengths equal to ``L`` it is ``L`` times GSPO (both tested). The clip is
    ``sequence_ratio``'s (the published ranges are ``epsilon = 2e-3``,
    ``epsilon_high = 2.5e-3``, paper Sec. 5.1 as cited by TRL; recipe ``luspo``).
    Use it with ``seq_mean_token_mean_all_rows`` (TRL's normaliser, recipe ``luspo``) or ``seq_mean_token_mean``:
    the length factor is already in the loss.

    Provenance: reconstructed from the abstract — LUSPO (Liu, Yin, Shi, Yang, Zeng and Qiu, 2026, arXiv:2602.05261,
    "Length-Unbiased Sequence Policy Optimization: Revealing and Controlling Response Length Variation in RLVR"),
    which rectifies GSPO's length bias, with the form taken from the reference implementation, TRL's luspo loss
    (huggingface/trl trl/trainer/grpo_trainer.py, _compute_loss): GSPO's clipped sequence loss times |o_i|, mean
    over sequences; the paper's equations and the authors' verl code (github.com/murphy4122/LUSPO, core_algos.py)
    were not read, so agreement with them is not checked.
    """
    loss, metrics = POLICY_LOSSES.get("sequence_ratio")(logprobs, old_logprobs, advantages, mask,
                                                        epsilon=epsilon, epsilon_high=epsilon_high)
    return loss * mask.sum(-1, keepdim=True).to(loss.dtype), metrics


def _check_guide_quantile(cfg) -> None:
    if not 0.0 <= cfg.guide_gamma_quantile <= 1.0:
        raise ConfigError(f"guide_gamma_quantile: must be in [0, 1], got {cfg.guide_gamma_quantile}")


@POLICY_LOSSES.register("guide_off_policy", check=_check_guide_quantile)
def guide_off_policy(logprobs: torch.Tensor, old_logprobs: torch.Tensor, advantages: torch.Tensor, mask: torch.Tensor,
                     batch=None, *, epsilon: float = 0.2, epsilon_high: float | None = None,
                     guide_gamma_quantile: float = param(0.9, 'Guide: off-policy (hinted) rows use the shaped ratio '
                                                         'r / (r + gamma), gamma = this quantile of the row\'s '
                                                         'token ratios (authors: 0.9)')):
    """Guide-GRPO objective: clipped ratio on-policy, shaped unclipped ratio on hinted rows
    (Nath et al. 2025, arXiv:2506.13923; seed 004-16).

    Rows sampled with a hint (the ``guide`` rollout strategy's ``hint_level``
    column > 0) are off-policy for the hint-free prompt: their ratio
    ``r_t = pi_theta(o_t | q) / pi_old(o_t | q, h)`` is shaped and not clipped::

        gamma   = quantile_{guide_gamma_quantile}(r over the row's tokens)   (detached, >= 1e-4)
        loss_t  = -A_t * r_t / (r_t + gamma)                                  hinted rows
        loss_t  = -min(r_t A_t, clip(r_t, 1 - eps_low, 1 + eps_high) A_t)      other rows

    Provenance: authors' code — https://github.com/vaskar-open-source-research/guide_rl,
    verl/verl/trainer/ppo/core_algos.py (compute_policy_loss, gamma_strategy
    "percentile") with verl/experiments/math_reasoning/configs/guide_paper_experiments/guide_grpo_qwen.sh
    (apply_off_policy_shaping=True, gamma_strategy=percentile, gamma_value=0.9,
    clip_ratio 0.2, importance_weighted_reroll=True: the old log-probs of every
    row are taken under the prompt it was sampled with). Known difference: the
    authors take the quantile over the off-policy rows of a micro-batch,
    padding positions included, with one row per micro-batch in their config;
    here it is per hinted row over its completion tokens (no padding). Without
    a ``hint_level`` column (no hinted rows) this is the clipped ratio.
    Test: tests/test_objectives.py::test_guide_off_policy_shaped_ratio_on_hinted_rows.
    """
    eps_low = epsilon
    eps_high = epsilon if epsilon_high is None else epsilon_high
    adv = per_token(advantages, logprobs)
    ratio = torch.exp((logprobs - old_logprobs).clamp(-20.0, 20.0))
    clipped = -torch.minimum(ratio * adv, ratio.clamp(1.0 - eps_low, 1.0 + eps_high) * adv)
    levels = None if batch is None else getattr(batch, "columns", {}).get("hint_level")
    off = torch.zeros(ratio.shape[0], dtype=torch.bool, device=ratio.device)
    if levels is not None:
        off = torch.tensor([bool(v) and int(v) > 0 for v in levels], dtype=torch.bool, device=ratio.device)
    gamma = torch.ones(ratio.shape[0], 1, dtype=ratio.dtype, device=ratio.device)
    with torch.no_grad():
        for i in off.nonzero().squeeze(-1).tolist():
            valid = ratio[i][mask[i] > 0]
            if valid.numel():
                gamma[i, 0] = torch.quantile(valid.float(), guide_gamma_quantile).to(ratio.dtype).clamp(min=1e-4)
    shaped = -adv * ratio / (ratio + gamma)
    loss = torch.where(off[:, None], shaped, clipped)
    with torch.no_grad():
        on = (~off)[:, None].float()
        low = ((ratio < 1.0 - eps_low) & (adv < 0)).float() * on
        high = ((ratio > 1.0 + eps_high) & (adv > 0)).float() * on
    return loss, {"clip_frac_low": low, "clip_frac_high": high, "guide_off_policy_frac": off[:, None].float()
                  .expand_as(ratio)}


# ------------------------------------------------------------------ AWPO (000-118)
@POLICY_LOSSES.register("awpo_clipped", check=_positive("awpo_adv_clip"))
def awpo_clipped(logprobs: torch.Tensor, old_logprobs: torch.Tensor, advantages: torch.Tensor, mask: torch.Tensor, *,
                 epsilon: float = 0.2, epsilon_high: float | None = None,
                 awpo_adv_clip: float = param(3.0, 'AWPO: the mixed advantage is clipped to [-c, c] before the '
                                              'clipped-ratio surrogate')):
    """AWPO tailored clipping (Lin et al., 2025, arXiv:2512.19126, seed 000-118): the clipped-ratio surrogate
    on a clipped mixed advantage.

    ``A^ = clip(A, -c, c)``, ``rho_t = exp(log pi_theta(o_t) - log pi_old(o_t))``::

        loss_t = -min(rho_t A^_t, clip(rho_t, 1 - eps_low, 1 + eps_high) A^_t)

    ``A`` is AWPO's mixed advantage (``awpo_gated``: outcome z-score plus the
    gated, difficulty-weighted reasoning z-score), whose magnitude can exceed
    the outcome's own range by up to ``lambda |A_z|``; the advantage clip
    bounds the step a single completion can take however the two signals add
    up, and the ratio clip (``epsilon`` / ``epsilon_high``, as
    ``clipped_ratio``) bounds how far the policy moves. Where ``|A| <= c`` the
    loss is ``clipped_ratio`` exactly; where the advantage is clipped the
    gradient is ``-sign(A) c rho_t grad log pi`` (scaled down, never
    reversed); where the ratio is clipped on the side of the advantage's sign
    the gradient is 0, as in PPO. ``c = 3`` is about the largest outcome
    z-score of a group of 8 with one success (``7/8 / 0.354 = 2.47``) plus a
    margin. Metrics: ``clip_frac_low`` / ``clip_frac_high`` as
    ``clipped_ratio``, ``awpo_adv_clip_frac`` = share of tokens whose
    advantage was clipped.

    Provenance: reconstructed from the abstract — "a tailored clipping
    mechanism for stable optimization"; a summary of the paper
    (newx.sg) calls it "customized advantage clipping to mitigate objective
    conflicts and ensure training stability", which is the reading here. The
    symmetric bound ``c`` on the advantage, its default 3 and keeping PPO's
    ratio clip are grpolab's choices. Searched (no authors' code, no
    equations): the stored text of arXiv:2512.19126 (html v2/v3: abstract and
    introduction only), the emergentmind.com AWPO pages ("adaptive clipping"
    without a formula), the code index (no repository).
    Test: tests/test_awpo_clip.py::test_awpo_clipped_by_hand.
    """
    eps_low = epsilon
    eps_high = epsilon if epsilon_high is None else epsilon_high
    raw = per_token(advantages, logprobs)
    adv = raw.clamp(-awpo_adv_clip, awpo_adv_clip)
    ratio = torch.exp((logprobs - old_logprobs).clamp(-20.0, 20.0))
    loss = -torch.minimum(ratio * adv, ratio.clamp(1.0 - eps_low, 1.0 + eps_high) * adv)
    with torch.no_grad():
        low = ((ratio < 1.0 - eps_low) & (adv < 0)).float()
        high = ((ratio > 1.0 + eps_high) & (adv > 0)).float()
        adv_clipped = (raw.abs() > awpo_adv_clip).float()
    return loss, {"clip_frac_low": low, "clip_frac_high": high, "awpo_adv_clip_frac": adv_clipped}
