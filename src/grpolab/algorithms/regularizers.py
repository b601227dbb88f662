"""Loss regularisers: extra per-token loss terms added before aggregation.

Signature: ``fn(**inputs, *, params) -> (per_token_loss [R, T], per_token_metrics)``
with inputs ``logprobs``, ``old_logprobs``, ``ref_logprobs``, ``advantages``,
``mask``, ``entropy``, ``group_ids``, ``batch`` resolved by name. Listed in the
config as ``regularizers: [name, ...]``. (The KL penalty to the reference is
built in: ``beta`` and ``kl_estimator``.)
"""
from __future__ import annotations

import torch

from ..errors import ConfigError
from ..registry import REGULARIZERS, param
from .kl import kl_penalty
from .losses import _row_mean, _segment_mean, per_token


def _check_dynamic_kl(cfg) -> None:
    if cfg.beta <= 0:
        raise ConfigError("regularizers: dynamic_kl needs a reference model: set beta > 0 "
                          "(the total KL coefficient then follows the GRPO-D schedule grpo_d_beta_min/grpo_d_beta_max)")
    if not 0.0 <= cfg.grpo_d_explore_frac < 1.0:
        raise ConfigError(f"grpo_d_explore_frac: must be in [0, 1), got {cfg.grpo_d_explore_frac}")


@REGULARIZERS.register("entropy_bonus", needs=("tokens",))
def entropy_bonus(entropy_grad: torch.Tensor, *,
                  entropy_bonus_coef: float = param(0.01, 'entropy_bonus: coefficient of -H (maximise entropy)')):
    """Entropy bonus: ``term_t = -coef * H_t`` with ``H_t`` the policy entropy at token t (with gradient).

    Maximises entropy (TRL ``entropy_coef``, verl ``entropy_coeff``); the
    aggregation averages it like the policy loss.

    Provenance: paper equations — the standard entropy bonus of PPO (Schulman et al., 2017, arXiv:1707.06347),
    Eq. (9) (c2 S[pi]); the same as TRL entropy_coef and verl entropy_coeff.
    """
    return -entropy_bonus_coef * entropy_grad, {}


@REGULARIZERS.register("llds")
def llds(logprobs: torch.Tensor, old_logprobs: torch.Tensor, advantages: torch.Tensor, mask: torch.Tensor, batch=None,
         *,
         llds_coef: float = param(0.1, 'LLDS: weight of the likelihood-preserving penalty'),
         llds_gate: str = param('response', 'LLDS: unit whose likelihood drop activates the penalty',
                                ['response', 'action'])):
    """LLDS likelihood-preserving regulariser (Deng et al., 2025, arXiv:2512.04220; seed 000-13).

    Preserving set: completions with ``A_i >= 0``. For each unit u (the whole
    response for ``llds_gate = response``; each action span ``batch.span_ids``
    for ``action``, tokens outside spans forming one unit) whose likelihood fell,
    ``sum_{t in u} (log pi_theta - log pi_old) < 0``, only the tokens whose
    log-prob fell are penalised:

    ``term_t = coef * 1[A_i >= 0] * 1[unit likelihood fell] * max(0, log pi_old(o_t) - log pi_theta(o_t))``

    Confirmed against the authors' code (github.com/vengdeng/LLDS-On-Group-
    Relative-Policy-Optimization-Collapse-in-Search-R1, verl/workers/actor/
    dp_actor.py): preserving mask ``A >= 0``; response gate = sum over the
    response of ``log pi_old - log pi_theta > 0``; action gate = the same per
    contiguous loss-mask chunk (here ``span_ids``); penalty
    ``max(0, log pi_old - log pi_theta)`` weighted by ``no_reduce_lambda``
    (0.1 in the released checkpoints' run names). Not ported: the code's
    optional separate (smaller) weight on answer tokens. The term is 0
    on-policy and acts from the second pass over a batch.

    Provenance: authors' code —
    https://github.com/vengdeng/LLDS-On-Group-Relative-Policy-Optimization-Collapse-in-Search-R1,
    verl/workers/actor/dp_actor.py; the optional separate weight on answer tokens is not ported.
    Test: tests/test_objectives.py::test_llds_response_and_action_gates.
    """
    if llds_gate == "response":
        units = torch.zeros_like(mask, dtype=torch.long)
    elif llds_gate == "action":
        if batch is None:
            raise ValueError("llds: gate 'action' needs the batch (span_ids)")
        units = batch.span_ids[:, :mask.shape[1]]
    else:
        raise ValueError(f"llds_gate: '{llds_gate}' is not valid; valid values: response, action")
    log_ratio = logprobs - old_logprobs
    unit_mean, _, _ = _segment_mean(log_ratio.detach(), mask, units)
    adv = _row_mean(per_token(advantages, logprobs), mask)
    active = (adv >= 0)[:, None] & (unit_mean < 0) & (mask > 0)
    term = llds_coef * active.to(logprobs.dtype) * torch.relu(-log_ratio)
    return term, {"llds_active_frac": active.float()}


def grpo_d_beta(step: float, steps: int, beta_min: float, beta_max: float, explore_frac: float) -> float:
    """GRPO-D KL weight ``beta(s)`` (OThink-MR1, arXiv:2503.16081 Eq. 3).

    ``w = explore_frac * t``, ``beta_mid = (beta_min + beta_max) / 2``:
    ``beta(s) = beta_mid - (beta_mid - beta_min) * s / w``            for ``s <= w``
    ``beta(s) = beta_min + (beta_max - beta_min) * (s - w) / (t - w)`` for ``w < s <= t`` (held at beta_max after t).
    """
    t = float(max(steps, 1))
    w = explore_frac * t
    mid = 0.5 * (beta_min + beta_max)
    if step <= w:
        return mid - (mid - beta_min) * (step / w if w > 0 else 1.0)
    return beta_min + (beta_max - beta_min) * min(1.0, (step - w) / max(t - w, 1e-12))


@REGULARIZERS.register("dynamic_kl", check=_check_dynamic_kl)
def dynamic_kl(logprobs: torch.Tensor, ref_logprobs: torch.Tensor | None, step: int, *, beta: float, steps: int,
               kl_estimator: str = "k3",
               grpo_d_beta_min: float = param(0.0, 'GRPO-D (dynamic_kl): minimum KL weight, reached after the '
                                              'exploration steps'),
               grpo_d_beta_max: float = param(0.02, 'GRPO-D (dynamic_kl): maximum KL weight, reached at the last step'),
               grpo_d_explore_frac: float = param(0.3, 'GRPO-D (dynamic_kl): exploration steps w as a fraction of '
                                                  'steps (w/t)')):
    """GRPO-D dynamic KL weight (OThink-MR1, Liu et al., 2025, arXiv:2503.16081 §3.2 Eq. 3; seed 000-69).

    Schedule (:func:`grpo_d_beta`, ``t`` = the config's ``steps``, ``w = 0.3 t``):
    start at ``beta_mid``, fall linearly to ``beta_min`` over the ``w``
    exploration steps, then rise linearly to ``beta_max`` at step ``t``
    ("early exploration, late exploitation", by analogy with epsilon-greedy).
    Paper values: ``w/t = 0.3``; geometry reasoning ``beta_min 0``,
    ``beta_max 0.02`` (our defaults); visual counting 0.04 / 0.1. KL = the k3
    estimator (paper Eq. 5, DeepSeek-R1), here ``kl_estimator`` via ``kl_penalty``.

    The trainer already adds ``beta * KL`` (``beta`` > 0 is required so that
    reference log-probs exist), so this term adds ``(beta(s) - beta) * KL`` and
    the total KL coefficient is exactly ``beta(s)``. ``step`` is the 0-based
    optimiser step.

    Provenance: paper equations — OThink-MR1 (Liu et al., 2025, arXiv:2503.16081), Sec. 3.2 Eq. (3) (the dynamic
    KL schedule) and Eq. (5) (the k3 estimator); the beta values are the paper's geometry setting.
    """
    if ref_logprobs is None:
        raise ValueError("dynamic_kl needs reference log-probs: set beta > 0 (the recipe grpo_d does)")
    coef = grpo_d_beta(float(step), steps, grpo_d_beta_min, grpo_d_beta_max, grpo_d_explore_frac)
    kl = kl_penalty(logprobs, ref_logprobs, kl_estimator)
    return (coef - beta) * kl, {"kl_coef": torch.full_like(logprobs, coef)}


def _check_auto_group_kl(cfg) -> None:
    if cfg.beta <= 0:
        raise ConfigError("regularizers: auto_group_kl needs a reference model: set beta > 0 (the base KL "
                          "coefficient that each automatic group's coefficient scales)")
    if cfg.prompt_sampler != "auto_group":
        raise ConfigError(f"regularizers: auto_group_kl reads the groups of prompt_sampler auto_group; "
                          f"prompt_sampler is '{cfg.prompt_sampler}' (valid values: auto_group)")


def group_adaptive_kl_coefficients(group_success: torch.Tensor, group_sizes: torch.Tensor, beta: float,
                                   scale: float) -> torch.Tensor:
    """Per-group KL coefficients ``beta_g = beta * exp(scale * (s_g - s_bar))``.

    ``s_g``: group g's mean success rate; ``s_bar = sum_g n_g s_g / sum_g n_g``, the mean success rate of all
    prompts (``n_g``: group sizes). A group below the mean (hard) gets ``beta_g < beta`` (a looser tie to the
    reference: more room to explore); one above it (easy) gets ``beta_g > beta`` (held close to the reference:
    no over-optimisation). ``scale = 0`` gives every group ``beta``. Empty groups count for nothing in ``s_bar``.
    """
    sizes = group_sizes.to(torch.float64)
    success = group_success.to(torch.float64)
    s_bar = (sizes * success).sum() / sizes.sum().clamp_min(1.0)
    return beta * torch.exp(scale * (success - s_bar))


@REGULARIZERS.register("auto_group_kl", check=_check_auto_group_kl)
class AutoGroupKL:
    """Per-group KL penalty driven by the ``auto_group`` sampler's automatic groups (seed 000-115).

    Zheng et al. 2024, *Improving Generalization of Alignment with Human Preferences through Group Invariant
    Learning*, arXiv:2310.11971 (ICLR 2024), seed 000-115: "leveraging the established groups, our approach
    adaptively adjusts the exploration space, allocating more learning capacity to more challenging data and
    preventing the model from over-optimizing on simpler data" — the paper's adaptive KL penalty per inferred
    group.

    A row whose prompt is in automatic group g (``auto_group`` sampler: prompts sorted by their EMA success
    rate and cut into equal groups) is penalised with ``beta_g * KL_t`` instead of ``beta * KL_t``:

    ``beta_g = beta * exp(auto_group_kl_scale * (s_g - s_bar))``   (:func:`group_adaptive_kl_coefficients`)

    with ``s_g`` the mean EMA success rate of group g's prompts and ``s_bar`` that of all prompts. The trainer
    already adds ``beta * KL`` (``beta`` > 0 is required, so reference log-probs exist), so this term adds
    ``(beta_g - beta) * KL``, with the run's ``kl_estimator`` / ``kl_gradient``. The sampler hands itself to
    this regulariser when the trainer attaches it (``AutoGroupSampler.attach``); the coefficients follow the
    sampler's state (groups and success rates), which its checkpoint restores, so this term holds no state.

    Provenance: reconstructed from the abstract — the paper (arXiv:2310.11971) names an adaptive KL penalty per
    inferred group as its exploration-space adaptation; its equation was not available here and no authors' code
    was found (searched: the code corpus for group invariant learning / adaptive KL, OpenLMLab/MOSS-RLHF by
    name), so the exponential form in the group's success rate relative to the mean, and the scale 2, are
    grpolab's choices.
    Test: tests/test_auto_group_kl.py.
    """

    def __init__(self, *, beta: float, kl_estimator: str = "k3", kl_gradient: str | None = None,
                 auto_group_kl_scale: float = param(2.0, 'auto_group_kl: scale kappa of the per-group KL '
                                                         'coefficient beta * exp(kappa (s_g - s_bar)); 0 = beta '
                                                         'for every group')):
        self.beta, self.scale = float(beta), float(auto_group_kl_scale)
        self.kl_estimator, self.kl_gradient = kl_estimator, kl_gradient
        self.sampler = None

    def bind(self, sampler) -> None:
        """Read groups from ``sampler`` (``row_groups(uids)``, ``group_success()``, ``group_sizes()``)."""
        self.sampler = sampler

    def coefficients(self, prompt_uids: torch.Tensor) -> torch.Tensor:
        """``beta_g`` of each row's group, ``[R]`` (float64)."""
        if self.sampler is None:
            raise ValueError("regularizer auto_group_kl was not bound to an auto_group prompt sampler "
                             "(prompt_sampler: auto_group binds it when the trainer attaches the sampler)")
        per_group = group_adaptive_kl_coefficients(self.sampler.group_success(), self.sampler.group_sizes(),
                                                   self.beta, self.scale)
        return per_group[self.sampler.row_groups(prompt_uids)]

    def __call__(self, logprobs: torch.Tensor, ref_logprobs: torch.Tensor | None, batch):
        if ref_logprobs is None:
            raise ValueError("auto_group_kl needs reference log-probs: set beta > 0")
        coef = self.coefficients(batch.prompt_uids.cpu()).to(device=logprobs.device, dtype=logprobs.dtype)[:, None]
        kl = kl_penalty(logprobs, ref_logprobs, self.kl_estimator, gradient=self.kl_gradient)
        return (coef - self.beta) * kl, {"kl_coef": coef.expand_as(logprobs)}


@REGULARIZERS.register("ratio_variance")
class RatioVariance:
    """R^2VPO ratio-variance constraint, primal-dual (seed 000-75).

    Constraint ``E[(r_t - 1)^2] <= delta`` on the policy ratio's second central
    moment (E[r] = 1 under pi_old), with Lagrangian term

    ``term_t = lambda * (r_t - 1)^2``

    and the multiplier updated once per optimiser step from the previous
    step's measured moment ``v``: ``lambda <- max(0, lambda + dual_lr * (v - delta))``.
    Used with the unclipped ratio (recipe ``r2vpo``: clipping off).
    Choices: the moment is the token mean over all passes of the step; the
    paper's reuse of stale off-policy samples is the batch stage
    ``r2vpo_replay`` (stages/batch_replay.py), whose rows enter this term with
    their own behaviour log-probs. Stateful: ``state_dict`` holds lambda and the
    running moment.

    Provenance: reconstructed from the abstract — a Lagrangian term lambda (r - 1)^2 with a dual ascent step per
    optimiser step; the moment estimator and the step size are grpolab's choices.
    """

    def __init__(self, *,
                 r2vpo_delta: float = param(0.02, "R2VPO: budget on the ratio's second central moment E[(r-1)^2]"),
                 r2vpo_dual_lr: float = param(1.0, 'R2VPO: step size of the Lagrange multiplier update'),
                 r2vpo_lambda_init: float = param(1.0, 'R2VPO: initial Lagrange multiplier')):
        self.delta, self.dual_lr = r2vpo_delta, r2vpo_dual_lr
        self.lam = float(r2vpo_lambda_init)
        self.step: int | None = None
        self.moment_sum, self.moment_count = 0.0, 0.0

    def _advance(self, step: int) -> None:
        if self.step is not None and step != self.step and self.moment_count > 0:
            v = self.moment_sum / self.moment_count
            self.lam = max(0.0, self.lam + self.dual_lr * (v - self.delta))
            self.moment_sum, self.moment_count = 0.0, 0.0
        self.step = step

    def __call__(self, logprobs: torch.Tensor, old_logprobs: torch.Tensor, mask: torch.Tensor, step: int):
        self._advance(int(step))
        ratio = torch.exp((logprobs - old_logprobs).clamp(-20.0, 20.0))
        dev = (ratio - 1.0) ** 2
        self.moment_sum += float((dev.detach() * mask).sum())
        self.moment_count += float(mask.sum())
        return self.lam * dev, {"r2vpo_lambda": torch.full_like(logprobs, self.lam), "ratio_var": dev.detach()}

    def state_dict(self) -> dict:
        return {"lam": self.lam, "step": self.step, "moment_sum": self.moment_sum,
                "moment_count": self.moment_count}

    def load_state_dict(self, state: dict) -> None:
        self.lam, self.step = float(state["lam"]), state["step"]
        self.moment_sum, self.moment_count = float(state["moment_sum"]), float(state["moment_count"])


@REGULARIZERS.register("gaussian_mean_kl", needs=("gaussian_steps",))
def gaussian_mean_kl(step_mean: torch.Tensor, ref_step_mean: torch.Tensor, step_std_dev: torch.Tensor,
                     mask: torch.Tensor, *,
                     gaussian_kl_beta: float = param(0.04, "gaussian_mean_kl: weight beta of the KL between the "
                                                           "policy's and the reference's Gaussian denoising steps "
                                                           "(Flow-GRPO: 0.04 GenEval/OCR, 0.01 PickScore)")):
    """Flow-GRPO's KL to the reference for Gaussian denoising steps, per step j:

    ``term_j = beta * mean_u (mu_theta(u) - mu_ref(u))^2 / (2 s_j^2)``

    with mu the step's mean under the policy (with gradient) and under the frozen reference, u the image's
    elements, and s_j the SDE's ``std_dev_t`` (Flow-GRPO's s = a*sqrt(sigma/(1-sigma)), *not* the step std
    s*sqrt(-dsigma)); the closed-form KL of two Gaussians with one std, up to the sqrt(-dsigma) factor the code
    leaves out, so the authors' beta values transfer. Inputs come from the policy's forward (``step_mean``,
    ``step_std_dev``: policies with gaussian steps offer them) and the trainer's reference forward
    (``ref_step_mean``). Use it instead of ``beta`` (the token KL estimators), which image policies refuse.

    Provenance: authors' code — https://github.com/yifan123/flow_grpo, scripts/train_sd3.py (the kl_loss of the
    training loop: squared mean difference averaged over the latent, divided by 2*std_dev_t^2, times beta).
    Test: tests/test_image_policies.py::test_gaussian_mean_kl_by_hand.
    """
    from .kl import gaussian_mean_kl as kl
    R, T = mask.shape
    on = mask > 0
    term = torch.zeros(R, T, dtype=step_mean.dtype, device=step_mean.device)
    if bool(on.any()):
        term = term.index_put(on.nonzero(as_tuple=True), kl(step_mean[on], ref_step_mean[on].to(step_mean.dtype),
                                                            step_std_dev[on]))
    return gaussian_kl_beta * term, {"gaussian_kl": term.detach()}


gaussian_mean_kl.needs_reference_model = True
