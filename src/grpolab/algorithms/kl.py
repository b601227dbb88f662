"""Per-token KL estimators against a frozen reference policy.

With ``x = log pi_ref(o_t) - log pi_theta(o_t)`` (Schulman, "Approximating KL
divergence"), all unbiased or low-variance estimates of KL(pi_theta || pi_ref)
on tokens sampled from pi_theta:

* ``k1 = -x``                       (unbiased, high variance, can be negative)
* ``k2 = x^2 / 2``                  (biased, its gradient is the KL gradient)
* ``k3 = exp(x) - x - 1``           (unbiased, >= 0, low variance; GRPO 000-41)

``x`` is clamped to [-20, 20] before ``exp`` (as verl / NeMo-RL) so a far
off-reference token cannot overflow. ``kl_penalty(..., gradient="k2")`` gives
the straight-through form: the *value* of one estimator with the *gradient* of
another (verl's ``k3+``).
"""
from __future__ import annotations

import torch

from ..registry import KL_ESTIMATORS



def _x(logprobs: torch.Tensor, ref_logprobs: torch.Tensor) -> torch.Tensor:
    return (ref_logprobs - logprobs).clamp(-20.0, 20.0)


@KL_ESTIMATORS.register("k1")
def k1(logprobs: torch.Tensor, ref_logprobs: torch.Tensor) -> torch.Tensor:
    """``k1 = log pi_theta - log pi_ref``.

    Provenance: paper equations — J. Schulman, "Approximating KL Divergence" (2020 note), estimator k1 = log r
    (unnumbered); the same as verl kl_penalty kl.
    """
    return -_x(logprobs, ref_logprobs)


@KL_ESTIMATORS.register("k2")
def k2(logprobs: torch.Tensor, ref_logprobs: torch.Tensor) -> torch.Tensor:
    """``k2 = (log pi_theta - log pi_ref)^2 / 2``.

    Provenance: paper equations — J. Schulman, "Approximating KL Divergence" (2020 note), estimator k2 = (log
    r)^2 / 2 (unnumbered); the same as verl kl_penalty mse.
    """
    return 0.5 * _x(logprobs, ref_logprobs) ** 2


@KL_ESTIMATORS.register("k3")
def k3(logprobs: torch.Tensor, ref_logprobs: torch.Tensor) -> torch.Tensor:
    """``k3 = pi_ref/pi_theta - log(pi_ref/pi_theta) - 1`` (GRPO's estimator, 000-41).

    Provenance: paper equations — DeepSeekMath (Shao et al., 2024, arXiv:2402.03300), Eq. (4); the same as TRL's
    GRPO KL and verl kl_penalty low_var_kl (without its clamp).
    """
    x = _x(logprobs, ref_logprobs)
    return torch.exp(x) - x - 1.0


def kl_penalty(logprobs: torch.Tensor, ref_logprobs: torch.Tensor, estimator: str = "k3",
               gradient: str | None = None) -> torch.Tensor:
    """Per-token KL with ``estimator``'s value and, if given, ``gradient``'s gradient.

    ``value = g + sg(v - g)`` where ``v`` is the value estimator and ``g`` the
    gradient estimator (``sg`` = stop-gradient).
    """
    value = KL_ESTIMATORS.get(estimator)(logprobs, ref_logprobs)
    if gradient is None or gradient == estimator:
        return value
    grad = KL_ESTIMATORS.get(gradient)(logprobs, ref_logprobs)
    return grad + (value - grad).detach()


def gaussian_mean_kl(mean: torch.Tensor, ref_mean: torch.Tensor, std_dev_t: float | torch.Tensor) -> torch.Tensor:
    """Flow-GRPO's KL term per row: (1/d)·Σ_u (μ_u − μ_ref,u)² / (2·s²), [R], float32 (or float64).

    s is the ``std_dev_t`` of the step (``policies/_image/sde.py``'s ``SDEStep.std_dev_t``): for ``sde`` s = a·√(σ/(1−σ̃)) *without* the
    √(−Δ) of the step std, so this is the exact KL between the two step Gaussians times 1/(−Δ); matching the
    code lets their β transfer. The trainer multiplies by β and averages over rows.
    [code: yifan123/flow_grpo, scripts/train_sd3.py, kl_loss = ((prev_sample_mean − prev_sample_mean_ref)²)
    .mean(dim=(1,2,3), keepdim=True) / (2·std_dev_t²), std_dev_t returned by sde_step_with_logprob]
    No zero guard: s = 0 (an ODE step) is a caller error and gives inf/nan, as in the code.
    """
    dtype = torch.promote_types(torch.promote_types(torch.float32, mean.dtype), ref_mean.dtype)
    mean = mean.to(dtype)
    rows = mean.shape[0]
    s = torch.as_tensor(std_dev_t, dtype=dtype, device=mean.device)
    s = s.expand(rows) if s.ndim == 0 else s.reshape(rows, -1)[:, 0]
    sq = (mean - ref_mean.to(dtype)) ** 2
    return s ** -2 * (sq.reshape(rows, -1).mean(1) if sq.ndim > 1 else sq) / 2


# ---------------------------------------------------------------------------------------------- flow matching
