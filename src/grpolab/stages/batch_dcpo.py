"""DCPO batch stage: the authors' entropy-controlled advantage mix (seed 000-35)."""
from __future__ import annotations

import torch

from ..errors import ConfigError
from ..model.logprobs import completion_logprobs
from ..registry import BATCH_STAGES, param
from ._checks import require_at_least


def dcpo_alpha(entropy_delta: float, correct_frac: float, max_delta: float) -> float:
    """Mixing weight ``alpha = a / (a + 1)``, ``a = min(|H_0 - H|, max_delta) / correct_frac``.

    With no correct row in the batch (``correct_frac = 0``) the authors' code divides by zero (NaN
    advantages, a lost step); here ``alpha`` takes its limit 1 (a > 0) or 0 (a = 0).
    """
    a = min(abs(entropy_delta), max_delta)
    if correct_frac <= 0:
        return 1.0 if a > 0 else 0.0
    a = a / correct_frac
    return a / (a + 1.0)


def dcpo_mix(advantages: torch.Tensor, correct: torch.Tensor, logp_target: torch.Tensor, logp_old: torch.Tensor,
             mask: torch.Tensor, alpha: float) -> torch.Tensor:
    """``A' = (1 - alpha) A + alpha * 1[correct] * pi_T(o_t) / pi_old(o_t)`` on the loss tokens ``[R, T]``."""
    rho = torch.exp((logp_target - logp_old).clamp(-20.0, 20.0))
    mixed = (1.0 - alpha) * advantages + alpha * correct.to(advantages.dtype)[:, None] * rho.to(advantages.dtype)
    return mixed * mask


def _check_dcpo(cfg) -> None:
    for key in ("dcpo_temperature_high", "dcpo_temperature_low"):
        if getattr(cfg, key) <= 0:
            raise ConfigError(f"{key}: must be > 0, got {getattr(cfg, key)}")
    require_at_least(cfg, 0, "dcpo_max_delta")


@BATCH_STAGES.register("dcpo", check=_check_dcpo, needs=("tokens",))
class DCPO:
    """DCPO: advantages mixed toward a temperature-shifted target distribution, by entropy
    (Li et al., 2026, *Distribution-Centric Policy Optimization Dominates the
    Exploration-Exploitation Trade-off*, arXiv:2601.12730; seed 000-35).

    After the GRPO advantages ``A`` are computed, every loss token gets::

        A'_t = (1 - alpha) A_t + alpha * b_i * rho_t,    rho_t = pi_old^T(o_t) / pi_old(o_t)

    * ``pi_old^T`` is the behaviour policy at temperature ``T`` (softmax of
      logits / T, properly normalised): ``T = dcpo_temperature_high`` (1.2)
      while the entropy ``H`` is at or below the target ``H_0``
      (``dcpo_entropy_target``, 0.5), else ``dcpo_temperature_low`` (0.8);
      both log-probs are computed here with the current (= behaviour) weights;
    * ``b_i = 1`` when row i's reward > ``dcpo_success_threshold`` (0.05: the
      authors' ``_compute_bool_reward_by_score`` threshold and strict ``>``, so
      DCPO keeps its own key instead of the shared ``success_threshold``,
      ``>= 1.0``);
    * ``alpha = a / (a + 1)``, ``a = min(|H_0 - H|, dcpo_max_delta) / p``,
      ``p`` = the batch's share of rows with ``b_i = 1`` (:func:`dcpo_alpha`).

    The mixed advantages then go through the configured policy loss (the
    recipe: the clipped ratio): the second ("target-distribution") ratio
    reshapes the REINFORCE-like term toward a hotter (or colder) distribution,
    the standard ratio keeps the update on-policy. ``H`` is the previous
    step's mean ``-log pi(o_t)`` over the loss tokens (0 before the first
    step, as in the authors' loop), recorded here from the batch's
    temperature-1 log-probs.

    Provenance: authors' code — https://github.com/597358816/DCPO,
    verl/trainer/ray_trainer.py (RayPPOTrainer.fit, branch
    ``alg == "DCPO"``; _compute_old_log_probs with a temperature;
    _compute_bool_reward_by_score, threshold 0.05), verl/trainer/config.py
    (temperature_high 1.2, temperature_low 0.8, entropy_base 0.5) and
    examples/qwen-math-7b-DCPO.sh (entropy_base 0.5, disable_kl). Known
    differences: the authors' ``H`` is the previous update's
    ``actor/entropy_loss`` metric (mean of per-micro-batch ``-log pi``
    during the update), here the mean over the previous batch's tokens
    before its update; their zero-correct batch gives NaN, here ``alpha = 1``
    (:func:`dcpo_alpha`); their PPO loss also has the dual clip (3.0), the
    recipe uses the plain clipped ratio.
    Test: tests/test_stages.py::test_dcpo_mix_hand_computed_from_the_authors_loop.
    """

    def __init__(self, *,
                 dcpo_entropy_target: float = param(0.5, 'DCPO: entropy threshold H_0 (authors: entropy_base 0.5); '
                                                    'hotter target distribution while H <= H_0'),
                 dcpo_temperature_high: float = param(1.2, 'DCPO: target temperature while the entropy is <= H_0 '
                                                      '(authors: 1.2)'),
                 dcpo_temperature_low: float = param(0.8, 'DCPO: target temperature while the entropy is > H_0 '
                                                     '(authors: 0.8)'),
                 dcpo_max_delta: float = param(0.1, 'DCPO: cap on |H_0 - H| in the mixing weight (authors: 0.1)'),
                 dcpo_success_threshold: float = param(0.05, 'DCPO: a row counts as correct (b = 1) when its reward '
                                                       "> this (the authors' value 0.05 and strict >); overrides "
                                                       'the shared success_threshold for DCPO')):
        self.h0 = float(dcpo_entropy_target)
        self.t_high, self.t_low = float(dcpo_temperature_high), float(dcpo_temperature_low)
        self.max_delta = float(dcpo_max_delta)
        self.threshold = float(dcpo_success_threshold)
        self.entropy = 0.0  # the authors' loop starts with entropy = 0

    @torch.no_grad()
    def logprobs(self, ctx, batch, temperature: float) -> torch.Tensor:
        cfg = ctx.cfg
        parts = [completion_logprobs(ctx.policy, mb, temperature, shared_prefix=cfg.shared_prefix_forward)[0].cpu()
                 for mb in batch.micro_batches(cfg.micro_batch_size, trim=False, max_tokens=cfg.micro_batch_tokens)]
        return torch.cat(parts).to(batch.advantages.device)

    def __call__(self, batch, rewards: torch.Tensor, ctx, step: int = 0):
        temperature = self.t_high if self.entropy <= self.h0 else self.t_low
        delta = self.h0 - self.entropy
        correct = (rewards > self.threshold)
        alpha = dcpo_alpha(delta, float(correct.float().mean()), self.max_delta)
        was_training = ctx.policy.training
        ctx.policy.eval()
        logp_old = self.logprobs(ctx, batch, 1.0)
        logp_t = self.logprobs(ctx, batch, temperature)
        if was_training:
            ctx.policy.train()
        mask = batch.completion_mask.to(batch.advantages.dtype)
        batch.advantages = dcpo_mix(batch.advantages, correct.to(batch.advantages.device), logp_t, logp_old, mask,
                                    alpha)
        n = float(mask.sum())
        if n > 0:  # H for the next step: mean -log pi(o_t) over the loss tokens
            self.entropy = float(-(logp_old * mask).sum() / n)
        return batch

    def state_dict(self) -> dict:
        return {"entropy": self.entropy}

    def load_state_dict(self, state: dict) -> None:
        self.entropy = float(state["entropy"])
