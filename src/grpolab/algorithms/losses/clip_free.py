"""Objectives without PPO's hard clip: the plain policy gradient (GPG), SAPO's soft gate, CISPO's clipped and
detached importance weight, VESPO's Gamma kernel on the sequence ratio and Simple PO's quadratic ratio
penalty."""
from __future__ import annotations

import math

import torch

from ...errors import ConfigError
from ...registry import POLICY_LOSSES, param
from .common import _positive, per_token


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
