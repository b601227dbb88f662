"""Policy losses (``POLICY_LOSSES``, key ``policy_loss``): per-token loss from new/old log-probs and advantages.

Every policy objective of grpolab is here: the clipped ratio, sequence-level
ratios (GSPO), soft gates (SAPO), CISPO, LUSPO, VESPO, pairwise and
group-contrastive objectives (REBEL, GVPO, DisCO, CoPG, P3O, GTPO), ...
Sequence-level objectives put their per-sequence loss on every token of the
sequence, so that ``seq_mean_token_mean`` gives the paper's ``(1/N) sum_i L_i``.

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

import math

import torch

from ..errors import ConfigError, warn_fallback
from ..registry import POLICY_LOSSES, param


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


# ------------------------------------------------------------------ config checks (registered with each component)
def _positive(*keys: str):
    """A config check: each of ``keys`` must be > 0."""
    def check(cfg) -> None:
        for key in keys:
            if getattr(cfg, key) <= 0:
                raise ConfigError(f"{key}: must be > 0, got {getattr(cfg, key)}")
    return check


def _whole_groups(cfg) -> None:
    """Objectives that compare the completions of a prompt need >= 2 of them, all in one micro-batch."""
    if cfg.num_generations < 2:
        raise ConfigError(f"policy_loss '{cfg.policy_loss}' compares completions of a prompt: "
                          f"num_generations must be >= 2, got {cfg.num_generations}")
    if cfg.micro_batch_size % cfg.num_generations:
        raise ConfigError(f"policy_loss '{cfg.policy_loss}' needs whole groups in each micro-batch: "
                          f"micro_batch_size ({cfg.micro_batch_size}) must be a multiple of num_generations "
                          f"({cfg.num_generations})")


def _anchored(key: str, extra=None):
    """GVPO / CoPG: a 'reference' anchor needs a reference model (beta > 0); whole groups per micro-batch."""
    def check(cfg) -> None:
        _whole_groups(cfg)
        if getattr(cfg, key) == "reference" and cfg.beta <= 0:
            raise ConfigError(f"{key}: 'reference' needs a reference model: set beta > 0 or use 'behavior'")
        if extra is not None:
            extra(cfg)
    return check


def _both(*checks):
    def check(cfg) -> None:
        for c in checks:
            c(cfg)
    return check



@POLICY_LOSSES.register("policy_gradient")
def policy_gradient(logprobs: torch.Tensor, old_logprobs: torch.Tensor, advantages: torch.Tensor,
                    mask: torch.Tensor):
    """Plain policy gradient, no ratio, no clip, no reference (GPG, seed 000-18).

    ``loss_t = -A_t * log pi_theta(o_t)``

    Its gradient is the REINFORCE estimator ``-A grad log pi``; the value is not
    a surrogate of the return (it is not ~0 on-policy). ``old_logprobs`` is
    unused: GPG needs no behaviour policy (verl ``gpg`` loss, anchors §2).

    Provenance: paper equations — GPG (Chu et al., 2025, arXiv:2504.02546), the plain policy-gradient objective
    -A log pi without ratio or clip (equation number not recorded); the same as verl's gpg loss.
    """
    adv = per_token(advantages, logprobs)
    return -adv * logprobs, {}


# ----------------------------------------------------------------------------- helpers

def _row_mean(values: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Masked mean over tokens per row, ``[R, T] -> [R]`` (0 for rows with no tokens)."""
    return (values * mask).sum(-1) / mask.sum(-1).clamp(min=1)


def _row_sum(values: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    return (values * mask).sum(-1)


def _segment_mean(values: torch.Tensor, mask: torch.Tensor, segments: torch.Tensor):
    """Masked mean of ``values`` over each (row, segment) unit, put back on every token.

    Returns ``(mean [R, T], unit_size [R, T], units_per_row [R])``. Differentiable.
    """
    R, T = values.shape
    seg = segments.long()
    _, local = torch.unique(seg, return_inverse=True)
    n_seg = int(local.max()) + 1 if local.numel() else 1
    key = (torch.arange(R, device=values.device)[:, None] * n_seg + local).reshape(-1)
    m = mask.reshape(-1).to(values.dtype)
    total = torch.zeros(R * n_seg, dtype=values.dtype, device=values.device).index_add(0, key, values.reshape(-1) * m)
    count = torch.zeros(R * n_seg, dtype=values.dtype, device=values.device).index_add(0, key, m)
    mean = (total / count.clamp(min=1))[key].reshape(R, T)
    units = (count.reshape(R, n_seg) > 0).sum(-1)
    return mean, count[key].reshape(R, T), units


def _pair_matrix(group_ids: torch.Tensor, name: str) -> torch.Tensor:
    """``same[i, j]`` = rows i != j share a group. Raises if a row has no partner.

    Pairwise / group-coupled objectives need whole groups in each micro-batch
    (``micro_batch_size`` a multiple of ``num_generations``; see
    the check registered with the loss).
    """
    same = group_ids[:, None] == group_ids[None, :]
    same.fill_diagonal_(False)
    if bool((same.sum(-1) == 0).any()):
        raise ValueError(f"{name}: a group in this micro-batch has a single row; this objective compares the rows "
                         f"of a group, so every group needs >= 2 rows in the same micro-batch (make "
                         f"micro_batch_size a multiple of num_generations)")
    return same


def _group_center(values: torch.Tensor, group_ids: torch.Tensor) -> torch.Tensor:
    """``v_i - mean_{j in g(i)} v_j`` (differentiable; every row counts)."""
    same = (group_ids[:, None] == group_ids[None, :]).to(values.dtype)
    return values - (same @ values) / same.sum(-1)


# ------------------------------------------------------------------ ratio objectives

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


@POLICY_LOSSES.register("soft_gate", check=_positive("sapo_tau_pos", "sapo_tau_neg"))
def soft_gate(logprobs: torch.Tensor, old_logprobs: torch.Tensor, advantages: torch.Tensor, mask: torch.Tensor, *,
              sapo_tau_pos: float = param(1.0, 'SAPO gate temperature for A > 0 (soft_gate)'),
              sapo_tau_neg: float = param(1.05, 'SAPO gate temperature for A < 0 (soft_gate)')):
    """SAPO soft temperature gate (Soft Adaptive Policy Optimization, Gao et al., Qwen team, 2025, arXiv:2511.20347; seed 000-114).

    ``f(r) = (4 / tau) * sigmoid(tau (r - 1))``, ``tau = tau_pos if A > 0 else tau_neg``
    ``loss_t = -f(r_t) A_t``

    At ``r = 1`` the gate's slope is ``(4/tau) tau sigmoid(0)(1 - sigmoid(0)) = 1``,
    so the gradient there is exactly the policy gradient ``-A grad log pi``
    (its value is ``2/tau``, not 1). Far off-policy tokens are down-weighted
    smoothly instead of hard-clipped. Defaults 1.0 / 1.05: TRL ``GRPOConfig``
    ``sapo_temperature_pos/neg`` defaults, documented by TRL as the paper's setting.

    Provenance: paper equations — SAPO (Gao et al., 2025, arXiv:2511.20347), the soft gate (4 / tau) sigmoid(tau
    (r - 1)) with separate positive / negative temperatures (equation number not recorded); defaults as TRL's
    sapo_temperature_pos/neg.
    """
    adv = per_token(advantages, logprobs)
    ratio = torch.exp((logprobs - old_logprobs).clamp(-20.0, 20.0))
    tau = torch.where(adv > 0, torch.full_like(adv, sapo_tau_pos), torch.full_like(adv, sapo_tau_neg))
    gate = torch.sigmoid(tau * (ratio - 1.0)) * 4.0 / tau
    return -gate * adv, {"sapo_gate": gate.detach()}


@POLICY_LOSSES.register("cispo")
def cispo(logprobs: torch.Tensor, old_logprobs: torch.Tensor, advantages: torch.Tensor, mask: torch.Tensor, *,
          cispo_epsilon_low: float | None = param(None, 'CISPO: IS weight clipped below at 1 - eps_low (None = no '
                                                  'lower clip)'),
          cispo_epsilon_high: float = param(4.0, 'CISPO: IS weight clipped above at 1 + eps_high')):
    """CISPO clipped importance-sampling weight (MiniMax-M1, arXiv:2506.13585).

    ``w_t = sg(clip(r_t, 1 - eps_low, 1 + eps_high))``,  ``loss_t = -w_t A_t log pi_theta(o_t)``

    The IS weight is clipped and detached, never the gradient, so every token
    keeps contributing. MiniMax-M1 leaves the lower bound open (``eps_low``
    unset = no lower clip, as TRL); ``eps_high = 4`` caps the weight at 5.0, the
    ScaleRL / TRL value. The paper normalises by all tokens of the batch
    (recipe: ``token_mean``). Metric ``cispo_clip_frac``: share of clipped weights.

    Provenance: paper equations — MiniMax-M1 (arXiv:2506.13585), the CISPO objective with the clipped, detached
    IS weight (equation number not recorded); eps_high = 4 and the open lower bound follow TRL's cispo loss
    (ScaleRL value).
    """
    adv = per_token(advantages, logprobs)
    ratio = torch.exp((logprobs - old_logprobs).clamp(-20.0, 20.0)).detach()
    low = None if cispo_epsilon_low is None else 1.0 - cispo_epsilon_low
    weight = ratio.clamp(min=low, max=1.0 + cispo_epsilon_high)
    return -weight * adv * logprobs, {"cispo_clip_frac": (weight != ratio).float()}


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
    Use it with ``seq_mean_token_mean`` (or its all-rows form): the length factor is already in the loss.

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


_VESPO_MIN_LOG_W = math.log(1e-8)


def _check_vespo(cfg) -> None:
    for key in ("vespo_lambda_pos", "vespo_lambda_neg"):
        if getattr(cfg, key) <= 0:
            raise ConfigError(f"{key}: the Gamma kernel's decay must be > 0, got {getattr(cfg, key)}")
    for key in ("vespo_k_pos", "vespo_k_neg"):
        if getattr(cfg, key) < 0:
            raise ConfigError(f"{key}: the Gamma kernel's power must be >= 0, got {getattr(cfg, key)}")


@POLICY_LOSSES.register("vespo", check=_check_vespo)
def vespo(logprobs: torch.Tensor, old_logprobs: torch.Tensor, advantages: torch.Tensor, mask: torch.Tensor, *,
          vespo_k_pos: float = param(2.0, 'VESPO Gamma-kernel power k for A >= 0 (vespo)'),
          vespo_lambda_pos: float = param(3.0, 'VESPO Gamma-kernel decay lambda for A >= 0 (vespo)'),
          vespo_k_neg: float = param(3.0, 'VESPO Gamma-kernel power k for A < 0 (vespo)'),
          vespo_lambda_neg: float = param(2.0, 'VESPO Gamma-kernel decay lambda for A < 0 (vespo)')):
    """VESPO Gamma-kernel weight on the sequence importance ratio (Variational Sequence-Level Soft Policy Optimization, arXiv:2602.10693).

    ``W_i = prod_t r_it = exp(sum_t log r_it)``  (the true sequence ratio, no length normalisation)
    ``phi(W) = W^k exp(lambda (1 - W))``  (``phi(1) = 1``; ``k, lambda`` by the sign of ``A``: ``A >= 0`` pos)
    ``loss_t = -sg(phi(W_i)) A_t log pi_theta(o_t)``

    ``phi`` is detached, so it only scales the REINFORCE gradient
    ``phi(W_i) A grad log pi``: extreme sequence ratios (large or tiny ``W``)
    are smoothly suppressed instead of hard-clipped. On-policy ``W = 1``, so the
    gradient equals GRPO's policy gradient (tested). Per-token log-ratios are
    clamped to [-20, 20] and ``log W`` to [log 1e-8, 20], as the authors' code
    and TRL. Defaults 2 / 3 / 3 / 2 as the authors' code and TRL
    (``vespo_k_pos/lambda_pos/k_neg/lambda_neg``). The authors aggregate with
    verl's token-mean by default (recipe: ``token_mean``; TRL ``vespo`` also
    normalises by the step's token count). Metric ``vespo_phi``.

    Provenance: authors' code — https://github.com/FloyedShen/VESPO, recipe/vespo/code/core_algos.py
    (compute_policy_loss_vespo); the same sequence ratio, clamps, sign selection (A >= 0 uses k_pos/lambda_pos) and
    detached kernel; known difference: the authors (and TRL) fold the rollout-engine correction pi_old / pi_sampler
    into W, while with generation_engine vllm grpolab multiplies its truncated engine weight into the per-token
    loss (batch.token_weights), as for every loss (the native engine samples with the trained policy and has no
    such weight); cross-checked with TRL's implementation, huggingface/trl
    trl/trainer/grpo_trainer.py (get_gamma_weights); paper: VESPO: Variational Sequence-Level Soft Policy
    Optimization for Stable Off-Policy LLM Training (arXiv:2602.10693); k, lambda are its c1, c2 (Sec. 3.4, as cited
    by TRL's paper index; the paper itself was not read).
    Test: tests/test_objectives.py::test_vespo_values_and_detached_kernel.
    """
    adv = per_token(advantages, logprobs)
    with torch.no_grad():
        log_r = (logprobs - old_logprobs).clamp(-20.0, 20.0)
        log_w = (log_r * mask).sum(-1, keepdim=True).clamp(_VESPO_MIN_LOG_W, 20.0)
        pos = adv >= 0
        k = torch.where(pos, torch.full_like(adv, vespo_k_pos), torch.full_like(adv, vespo_k_neg))
        lam = torch.where(pos, torch.full_like(adv, vespo_lambda_pos), torch.full_like(adv, vespo_lambda_neg))
        phi = torch.exp(lam + k * log_w - lam * torch.exp(log_w)).nan_to_num(nan=0.0, posinf=0.0, neginf=0.0)
    return -phi * adv * logprobs, {"vespo_phi": phi}


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


@POLICY_LOSSES.register("simple_po", check=_positive("simple_po_epsilon"))
def simple_po(logprobs: torch.Tensor, old_logprobs: torch.Tensor, advantages: torch.Tensor, mask: torch.Tensor, *,
              simple_po_epsilon: float = param(0.2, 'Simple PO: trust-region size eps in the |A|/(2 eps) (r-1)^2 '
                                               'penalty')):
    """Simple Policy Optimization ratio penalty (Xie et al., 2024, arXiv:2401.16025; seed 000-53).

    ``loss_t = -(r_t A_t - |A_t| / (2 eps) * (r_t - 1)^2)``

    A quadratic penalty replaces the clip; its optimum over ``r`` for a fixed
    ``A`` is ``r = 1 + eps * sign(A)``, exactly the clip boundary, and the
    gradient never vanishes. At ``r = 1`` the gradient is the policy gradient.

    Provenance: authors' code — https://github.com/MyRepositories-hub/Simple-Policy-Optimization,
    mujoco/trainer.py (Trainer.compute_policy_loss, ``algo == 'spo'``:
    ``-(A * ratios - |A| * (ratios - 1)^2 / (2 eps)).mean()``) with
    ``--epsilon`` 0.2 in mujoco/main.py; the same form per token here. The
    authors' code is for continuous-control PPO (GAE advantages, minibatch
    advantage normalisation); with LLM groups the advantage comes from the
    recipe's estimator and the mean over tokens/sequences from its
    aggregation.
    Test: tests/test_objectives.py::test_simple_po_matches_the_authors_loss_beyond_the_clip.
    """
    adv = per_token(advantages, logprobs)
    ratio = torch.exp((logprobs - old_logprobs).clamp(-20.0, 20.0))
    loss = -(ratio * adv - adv.abs() / (2.0 * simple_po_epsilon) * (ratio - 1.0) ** 2)
    return loss, {}


# -------------------------------------------------------- group-coupled objectives

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


def _pair_rows(pair_loss: torch.Tensor, same: torch.Tensor) -> torch.Tensor:
    """Row loss ``L_i = mean_{j != i in g} l_ij``; then ``(1/n) sum_i L_i`` = mean over ordered pairs."""
    w = same.to(pair_loss.dtype)
    return (pair_loss * w).sum(-1) / w.sum(-1)


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


def _anchor(anchor: str, old_logprobs, ref_logprobs, name: str):
    if anchor == "behavior":
        return old_logprobs
    if ref_logprobs is None:
        raise ValueError(f"{name}: anchor 'reference' needs reference log-probs; set beta > 0 (or use the "
                         f"'behavior' anchor)")
    return ref_logprobs


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


def _check_dgpo(cfg) -> None:
    """DGPO's group weight sums over a whole group: groups of >= 2 that micro-batches never split."""
    _whole_groups(cfg)
    if cfg.micro_batch_tokens <= 0 and cfg.micro_batch_size % cfg.num_generations:
        raise ConfigError(f"policy_loss 'dgpo' sums each group's terms inside a micro-batch: micro_batch_size "
                          f"({cfg.micro_batch_size}) must be a multiple of num_generations ({cfg.num_generations})")
    if cfg.dgpo_beta <= 0 or cfg.dgpo_clip < 0:
        raise ConfigError(f"dgpo_beta must be > 0 and dgpo_clip >= 0, got {cfg.dgpo_beta} / {cfg.dgpo_clip}")


@POLICY_LOSSES.register("dgpo", check=_check_dgpo, needs=("denoising_loss",))
def dgpo(logprobs: torch.Tensor, old_logprobs: torch.Tensor, advantages: torch.Tensor, mask: torch.Tensor,
         group_ids: torch.Tensor, ref_dsm_loss: torch.Tensor | None = None, *,
         dgpo_beta: float = param(100.0, "DGPO (diffusion): beta_dpo in the group weight "
                                         "sigmoid(beta/G * sum_g A_i (l_theta - l_ref)) (the authors' 100)"),
         dgpo_clip: float = param(0.0, "DGPO (diffusion): clip range c; a step whose ratio exp(l_old - l_theta) "
                                       "leaves [1 - c, 1 + c] on its advantage's side has its loss detached "
                                       "(the authors' clip_dsm, 1e-2 / 5e-2; 0 = off)")):
    """DGPO group-preference loss for diffusion / flow models (Luo et al., "Reinforcing Diffusion Models by
    Direct Group Preference Optimization", arXiv:2510.08425; seed 000-42).

    With ``logprobs = −ℓ_θ`` (the policy ``flow_dsm``: ℓ = mean_u (v_θ(x_t) − v*)² of a re-noised final sample,
    one step per re-noising) and ℓ_ref the frozen reference's (``ref_dsm_loss``), per step j and group g of the
    micro-batch (G_g its rows):

        w_g,j = σ( (β/G_g) · Σ_{i∈g} A_i · (ℓ_θ,ij − ℓ_ref,ij) )   (detached)
        loss_ij = w_g,j · A_i · ℓ_θ,ij

    averaged over rows and steps by the aggregation (``token_mean``: the code's mean over the batch and over
    the M accumulated timesteps). It is the gradient of the DPO-style −log σ between the group's
    positive- and negative-advantage subsets. ``dgpo_clip`` c > 0: with ratio = exp(ℓ_old − ℓ_θ) (``old`` =
    the behaviour values), a step with A > 0 and ratio > 1 + c, or A < 0 and ratio < 1 − c, uses ℓ_θ detached
    (metric ``clip_frac``). Metric ``dgpo_weight``: w.

    Provenance: authors' code — https://github.com/Luo-Yihong/DGPO, scripts/train_sd3_dgpo.py
    (compute_group_dgpo_loss_allreduce; the clip_dsm branch of the training loop); differences: G is the
    group's row count in the micro-batch (the code divides by the configured group size; equal when groups
    are whole, which the config check enforces), the clip's ℓ_old is the behaviour (sampling) model's, the
    code's is an EMA of the policy; the code's optional KL β·mean‖v_θ − v_ref‖² is not included.
    Test: tests/test_image_dgpo_vipo.py::test_dgpo_weights_by_hand_on_two_groups,
    tests/test_image_dgpo_vipo.py::test_dgpo_clip_detaches.
    """
    if ref_dsm_loss is None:
        raise ValueError("dgpo needs the frozen reference's denoising losses (ref_dsm_loss): use policy flow_dsm, "
                         "whose forward offers dsm_loss")
    ell = -logprobs
    adv = per_token(advantages, logprobs).to(ell.dtype) * mask
    _, inv = torch.unique(group_ids, return_inverse=True)
    inv = inv.to(ell.device)
    n_groups = int(inv.max()) + 1 if inv.numel() else 0
    with torch.no_grad():
        term = adv * (ell.detach() - ref_dsm_loss.to(ell))                       # [R, T]
        sums = torch.zeros(n_groups, ell.shape[1], dtype=ell.dtype, device=ell.device).index_add_(0, inv, term)
        size = torch.bincount(inv, minlength=n_groups).to(ell.dtype)[:, None]
        weight = torch.sigmoid(dgpo_beta * sums / size)[inv]                     # [R, T]
        clip = torch.zeros_like(mask, dtype=torch.bool)
        if dgpo_clip > 0:
            ratio = torch.exp((logprobs.detach() - old_logprobs).clamp(-20.0, 20.0))
            clip = torch.where(adv > 0, ratio > 1 + dgpo_clip, ratio < 1 - dgpo_clip) & (mask > 0)
    ell_used = torch.where(clip, ell.detach(), ell)
    return weight * adv * ell_used, {"dgpo_weight": weight, "clip_frac": clip.float()}


dgpo.needs_reference_model = True


# ------------------------------------------------------------------ GRPO vs DPO (000-82)
def _check_group_dpo(cfg) -> None:
    """Whole groups per micro-batch, dpo_beta > 0, and reference log-probs: the trainer's (beta > 0), the
    policy's reference forward (a policy that offers ``token_logprobs``, e.g. ``ar_image``) or the update
    strategy's (one with ``fills_ref_logprobs``, e.g. ``group_robust_dpo``)."""
    from ..registry import POLICIES
    _whole_groups(cfg)
    if cfg.dpo_beta <= 0:
        raise ConfigError(f"dpo_beta: must be > 0, got {cfg.dpo_beta}")
    if cfg.beta <= 0:
        from ..registry import UPDATE_STRATEGIES
        if getattr(UPDATE_STRATEGIES.get(cfg.update_strategy), "fills_ref_logprobs", False):
            return  # e.g. group_robust_dpo computes them before the update
        try:
            offers = POLICIES.get(cfg.policy).offers(None)
        except Exception:  # an offers() that reads its instance: decided at run time
            return
        if "token_logprobs" not in offers:
            raise ConfigError(f"policy_loss 'group_dpo' needs the reference's log-probs: policy {cfg.policy} gives "
                              f"them through the trainer's KL pass only, so set beta > 0 (or use a policy that "
                              f"offers token_logprobs, e.g. ar_image)")


@POLICY_LOSSES.register("group_dpo", check=_check_group_dpo, needs=("tokens",))
def group_dpo(logprobs: torch.Tensor, old_logprobs: torch.Tensor, advantages: torch.Tensor, mask: torch.Tensor,
              group_ids: torch.Tensor, ref_logprobs: torch.Tensor | None = None,
              ref_token_logprobs: torch.Tensor | None = None, batch=None, *,
              dpo_beta: float = param(0.1, "group_dpo: DPO's beta in -log sigmoid(beta * margin) (the authors' "
                                           "training.beta 0.1)")):
    """DPO on the best and worst completion of each group (online pairs; the DPO half of "Delving into RL for
    Image Generation with CoT: A Study on DPO vs. GRPO", Tong et al., arXiv:2505.17017; seed 000-82).

    Per group g (its rows in this micro-batch): y_w = the row with the highest scalar reward, y_l = the row with
    the lowest (the first such row on ties); a group whose rewards are all equal (or that has fewer than two
    scorable rows) forms no pair and contributes nothing. With S(y) = Σ_t log π(y_t) the summed token
    log-prob and h(y) = S_θ(y) − S_ref(y):

    ``L_g = −log σ(β · [h(y_w) − h(y_l)])``

    L_g·n_g/2 is put on every token of y_w and of y_l (n_g = the group's rows), every other row gets 0, so
    that with the per-row or per-token mean aggregations (16 tokens per image) the step loss is Σ_g L_g / (number
    of groups): the mean pair loss, a tie group counting 0. Rewards: ``batch.scalar_rewards`` (the weighted sum,
    after reward transforms); a batch without them falls back to the row advantages, which ``group_zscore`` keeps
    monotone in the reward within a group. Reference log-probs: ``ref_token_logprobs`` (the frozen reference's
    forward of this micro-batch, from a policy that offers ``token_logprobs``: ``ar_image``), else the trainer's
    ``ref_logprobs`` (filled when beta > 0, which also adds the KL term). ``old_logprobs`` is unused (DPO has no
    ratio). Metrics (averaged by the trainer over every loss token, 0 off the pair rows): ``dpo_pair_frac`` (1 on
    a pair row) and ``dpo_margin`` (h(y_w) − h(y_l), detached, on the pair's rows).

    Matched to the authors' code (https://github.com/ZiyuGuo99/Image-Generation-CoT, training/train_dpo.py):
    ``get_batch_logps`` sums the token log-probs (``average_log_prob=False``), ``logits = (π_w − π_l) −
    (ref_w − ref_l)``, ``loss = −F.logsigmoid(beta · logits)``, beta 0.1 (scripts/dpo.yaml; ``sft_coef`` 0), a
    frozen copy of the initial model as reference. Differences [ours]: their pairs are built off-line from a
    preference data set; here each step's groups give one online pair each (winner and loser by the scalar
    reward); tie groups are dropped (Flow-GRPO's tracker in ``type='dpo'`` mode takes rows 0 and 1 instead).

    Provenance: authors' code — https://github.com/ZiyuGuo99/Image-Generation-CoT, training/train_dpo.py (the DPO
    loss on summed log-probs, beta 0.1); online best/worst pairs per group and dropped ties are grpolab's.
    Test: tests/test_ar_image.py::test_group_dpo_hand_value_and_ties.
    """
    _pair_matrix(group_ids, "group_dpo")  # every group whole in this micro-batch
    ref = ref_token_logprobs if ref_token_logprobs is not None else ref_logprobs
    if ref is None:
        raise ValueError("group_dpo needs the reference model's log-probs: set beta > 0, or use a policy whose "
                         "forward offers token_logprobs (ar_image)")
    h = _row_sum(logprobs - ref.to(logprobs.dtype), mask)
    rewards = getattr(batch, "scalar_rewards", None)
    if rewards is None or rewards.shape[0] != logprobs.shape[0]:
        rewards = _row_mean(per_token(advantages, logprobs), mask)
    rewards = rewards.detach().to(h.device, torch.float64)
    row_loss = torch.zeros_like(h)
    on_pair = torch.zeros(h.shape[0], dtype=torch.bool, device=h.device)
    margin = torch.zeros_like(h)
    for g in torch.unique(group_ids).tolist():
        rows = (group_ids == g).nonzero().squeeze(-1).to(h.device)
        r = rewards[rows]
        ok = ~torch.isnan(r)
        if int(ok.sum()) < 2:
            continue
        rows, r = rows[ok], r[ok]
        if bool(r.max() == r.min()):
            continue
        w, l = rows[int(r.argmax())], rows[int(r.argmin())]
        d = h[w] - h[l]
        pair_loss = -torch.nn.functional.logsigmoid(dpo_beta * d) * (len(rows) / 2)
        row_loss = row_loss.index_put((torch.stack([w, l]),), pair_loss.expand(2))
        on_pair[w] = on_pair[l] = True
        margin[w] = margin[l] = d.detach()
    pair = per_token(on_pair.to(logprobs.dtype), logprobs)
    return per_token(row_loss, logprobs), {"dpo_pair_frac": pair, "dpo_margin": per_token(margin, logprobs)}


group_dpo.needs_reference_model = True


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
