"""Per-step Gaussian log-probs of image samplers: pure tensor functions, no model call, no sampling loop.

Notation (docs/design/policies.md §5): x the latent before a step, x' the latent after it, R rows (the batch
dimension, first), d the number of non-batch elements; flow matching: σ the noise level of the step, σ' the next
one, Δ = σ' − σ < 0, v the predicted velocity (≈ ε − x₀); DDIM: ᾱ = ``alphas_cumprod``, t the timestep, t' the
previous one, ε̂ the predicted noise.

Every log-prob is a per-row **mean** over the d elements (not a sum), as in every implementation followed here,
and is computed in (at least) float32 whatever the input dtype: bf16 overflows in these expressions (Flow-GRPO
casts for that reason). Every step function returns a :class:`SDEStep`; ``x_next`` is drawn when not given
(``noise`` if given, else ``torch.randn`` with ``generator``), and when ``x_next`` is given (the recompute under
new weights) only the log-prob is computed, of that ``x_next``. The returned ``x_next`` is in the compute dtype
(float32 for bf16/fp16/fp32 inputs): store that tensor, so the log-prob recorded at sampling is the log-prob of
what is stored and the first recompute reproduces it exactly.

A step whose std is 0 (noise level 0: the ODE / DDIM η = 0 step; DDIM's clamped last step, see
:func:`ddim_step`) is deterministic and has no density: its log-prob is returned as 0 (no division by zero) and
such a step must not be trained (the caller masks it).

Sources (read in the authors' repositories; our own code):
- Flow-GRPO and CPS: ``yifan123/flow_grpo``, ``flow_grpo/diffusers_patch/sd3_sde_with_logprob.py``,
  ``sde_step_with_logprob`` (``sde_type='sde'`` at ac4c86e, ``'sde'``/``'cps'`` at 54809b5); the KL:
  ``scripts/train_sd3.py``, ``kl_loss`` (ac4c86e).
- DanceGRPO: ``XueZeyue/DanceGRPO``, ``fastvideo/train_grpo_flux.py``, ``flux_step`` and ``sd3_time_shift``
  (15cc71d; the log-prob fix of 9ac72b4 discussed at :func:`dance_step`).
- DDPO: ``kvablack/ddpo-pytorch``, ``ddpo_pytorch/diffusers_patch/ddim_with_logprob.py``,
  ``ddim_step_with_logprob`` and ``_get_variance``.
"""
from __future__ import annotations

import math
from typing import NamedTuple

import numpy as np
import torch
from ...algorithms.kl import gaussian_mean_kl  # noqa: F401  (the formula lives in algorithms/kl.py)

Number = float | int | torch.Tensor

_HALF_LOG_2PI = 0.5 * math.log(2.0 * math.pi)


class SDEStep(NamedTuple):
    """One sampler step.

    ``x_next`` [R, ...] the latent after the step (compute dtype); ``logprob`` [R] the per-row mean element
    log-density of ``x_next`` (0 where ``std`` is 0; CPS and legacy DanceGRPO drop constants, see there);
    ``mean`` [R, ...] the step mean μ (differentiable in the model output); ``std`` [R] the step std;
    ``std_dev_t`` [R] what the authors' code calls ``std_dev_t`` and Flow-GRPO's ``kl_loss`` divides by
    (Flow-GRPO ``sde``: s = a·√(σ/(1−σ̃)), *not* the step std s·√(−Δ); CPS, DanceGRPO, DDIM: the step std).
    """

    x_next: torch.Tensor
    logprob: torch.Tensor
    mean: torch.Tensor
    std: torch.Tensor
    std_dev_t: torch.Tensor


# ---------------------------------------------------------------------------------------------- helpers


def _compute_dtype(*tensors: torch.Tensor) -> torch.dtype:
    """float32, or float64 when an input is float64 (never below float32)."""
    dtype = torch.float32
    for t in tensors:
        if isinstance(t, torch.Tensor) and t.is_floating_point():
            dtype = torch.promote_types(dtype, t.dtype)
    return dtype


def _rows(value: Number, like: torch.Tensor) -> torch.Tensor:
    """A float, a 0-d tensor, an [R] tensor or a tensor already shaped [R, 1, ...] as a tensor that broadcasts
    against ``like`` [R, ...] row by row, in ``like``'s dtype and device."""
    t = torch.as_tensor(value, dtype=like.dtype, device=like.device)
    if t.ndim == 1 and like.ndim > 1:
        t = t.view(-1, *([1] * (like.ndim - 1)))
    return t


def _per_row(t: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    """A row-broadcastable tensor (0-d or [R, 1, ...]) as [R]."""
    rows = like.shape[0]
    return t.expand(rows, *([1] * (like.ndim - 1))).reshape(rows)


def _draw_or_take(mean: torch.Tensor, std: torch.Tensor, noise: torch.Tensor | None,
                  generator: torch.Generator | None, x_next: torch.Tensor | None) -> torch.Tensor:
    """``x_next`` (cast to the compute dtype) when given, else mean + std·z."""
    if x_next is not None:
        if noise is not None or generator is not None:
            raise ValueError("x_next is given (a recompute): nothing is drawn, so pass neither noise nor generator")
        if x_next.shape != mean.shape:
            raise ValueError(f"x_next has shape {tuple(x_next.shape)}, the step mean {tuple(mean.shape)}")
        return x_next.detach().to(mean.dtype)
    if noise is None:
        device = generator.device if generator is not None else mean.device
        noise = torch.randn(mean.shape, generator=generator, device=device, dtype=mean.dtype).to(mean.device)
    elif noise.shape != mean.shape:
        raise ValueError(f"noise has shape {tuple(noise.shape)}, the step mean {tuple(mean.shape)}")
    return mean + std * noise.to(mean.dtype)


def _row_mean(t: torch.Tensor) -> torch.Tensor:
    return t.mean(dim=tuple(range(1, t.ndim))) if t.ndim > 1 else t


# ---------------------------------------------------------------------------------------------- schedules


def flow_sigmas(steps: int, shift: float = 1.0, *, schedule: str = "linspace",
                num_train_timesteps: int = 1000) -> torch.Tensor:
    """The flow-matching noise levels σ_0 = 1 > … > σ_T = 0, float32, length ``steps`` + 1.

    ``schedule="linspace"``: u = linspace(1, 0, T+1), σ = k·u / (1 + (k−1)·u) with k = ``shift`` (the SD3 time
    shift) [code: XueZeyue/DanceGRPO, fastvideo/train_grpo_flux.py, sd3_time_shift and the sigma_schedule of
    sample_reference_model]. Equal to diffusers' ``FlowMatchEulerDiscreteScheduler(shift=k)
    .set_timesteps(sigmas=linspace(1, 0, T+1)[:-1])`` (custom sigmas are shifted too, then 0 appended).

    ``schedule="diffusers"``: what ``FlowMatchEulerDiscreteScheduler(shift=k, num_train_timesteps=N)
    .set_timesteps(T)`` gives with its default config (no dynamic shifting, no Karras/exponential/beta sigmas,
    no terminal stretch): u = linspace(1, σ_min, T) with σ_min = k/N / (1 + (k−1)/N) the smallest *shifted*
    training sigma, shifted again, then 0 appended. This is the schedule Flow-GRPO samples with (its SD3
    pipeline calls ``retrieve_timesteps`` without sigmas) [code: yifan123/flow_grpo,
    flow_grpo/diffusers_patch/sd3_pipeline_with_logprob.py]. Its last nonzero σ is about k/N, not k/T, so the
    two schedules differ (the design note's "linspace(1, 0, T+1) shifted" is DanceGRPO's).
    """
    if steps < 1:
        raise ValueError(f"steps must be >= 1, got {steps}")
    if shift <= 0:
        raise ValueError(f"shift must be > 0, got {shift}")

    def time_shift(u: np.ndarray) -> np.ndarray:
        return shift * u / (1.0 + (shift - 1.0) * u)

    if schedule == "linspace":
        sig = time_shift(np.linspace(1.0, 0.0, steps + 1))
    elif schedule == "diffusers":
        n = num_train_timesteps
        train = time_shift(np.linspace(1, n, n, dtype=np.float32)[::-1] / np.float32(n)).astype(np.float32)
        sigma_max, sigma_min = float(train[0]), float(train[-1])
        sig = time_shift(np.linspace(sigma_max * n, sigma_min * n, steps) / n)
        sig = np.concatenate([sig.astype(np.float32), np.zeros(1, dtype=np.float32)])
    else:
        raise ValueError(f"schedule must be 'linspace' or 'diffusers', got {schedule!r}")
    return torch.from_numpy(np.asarray(sig, dtype=np.float32).copy())


# ---------------------------------------------------------------------------------------------- log-prob, KL


def guided(unc: torch.Tensor, cond: torch.Tensor, w: float, detach_uncond: bool = False) -> torch.Tensor:
    """Classifier-free guidance v_u + w·(v_c − v_u). ``detach_uncond``: v_u is a constant of the gradient,
    sg(v_u) + w·(v_c − sg(v_u)): the same value, gradient w·∂v_c instead of w·∂v_c + (1 − w)·∂v_u (Flow-GRPO's
    scripts/train_sd3.py compute_log_prob from commit 2d76907, 2025-07-15, until a later revision removed it)."""
    if detach_uncond:
        unc = unc.detach()
    return unc + w * (cond - unc)


def gaussian_step_logprob(x_next: torch.Tensor, mean: torch.Tensor, std: Number) -> torch.Tensor:
    """Per-row mean element log-density of ``x_next`` under N(``mean``, std²): [R].

    log p = (1/d)·Σ_u [−(x'_u − μ_u)² / (2·std²) − log std − ½·log 2π], in float32 (float64 if an input is
    float64). ``std`` is a float, a 0-d tensor, an [R] tensor or [R, 1, ...]. ``x_next`` is detached (the
    gradient flows through ``mean`` only, as in every source). Rows whose std is 0 get 0 (a deterministic step
    has no density), with no division by zero and a zero gradient.
    [code: kvablack/ddpo-pytorch, ddpo_pytorch/diffusers_patch/ddim_with_logprob.py, ddim_step_with_logprob, the
    log_prob expression; the same in flow_grpo's sde_step_with_logprob]
    """
    dtype = _compute_dtype(x_next, mean, std if isinstance(std, torch.Tensor) else mean)
    mean = mean.to(dtype)
    x_next = x_next.detach().to(dtype)
    s = _rows(std, mean)
    positive = s > 0
    safe = torch.where(positive, s, torch.ones_like(s))
    elem = -((x_next - mean) ** 2) / (2 * safe**2) - torch.log(safe) - _HALF_LOG_2PI
    return torch.where(_per_row(positive, mean), _row_mean(elem), torch.zeros((), dtype=dtype, device=mean.device))





def flow_grpo_step(x: torch.Tensor, v: torch.Tensor, sigma: Number, sigma_next: Number, noise_level: float, *,
                   sigma_max_sub: Number | None = None, noise: torch.Tensor | None = None,
                   generator: torch.Generator | None = None, x_next: torch.Tensor | None = None) -> SDEStep:
    """Flow-GRPO's SDE step from σ to σ' (Δ = σ' − σ < 0), with noise level a = ``noise_level``.

    s = a·√(σ / (1 − σ̃)), σ̃ = ``sigma_max_sub`` where σ = 1 (only the denominator is replaced: 1 − σ would be
    0), else σ̃ = σ;
    μ = x·(1 + s²·Δ/(2σ)) + v·(1 + s²·(1−σ)/(2σ))·Δ;   std = s·√(−Δ);   x' = μ + std·z, z ~ N(0, I);
    log-prob: :func:`gaussian_step_logprob` (full Gaussian density, per-row mean).
    ``sigma``/``sigma_next`` are floats or per-row [R] tensors. ``sigma_max_sub`` is the schedule's *second*
    entry σ_1 in the code (``self.sigmas[1]``); when None, σ' is used, which is σ_1 for the first step of the
    schedule (the only step with σ = 1): pass σ_1 explicitly for a step from σ_0 that skips σ_1
    (:func:`merged_flow_step` does).
    a = 0 gives the Euler (ODE) step x' = x + Δ·v, std 0 and log-prob 0 (no density; the code would divide by 0).
    Returns ``std_dev_t`` = s for :func:`gaussian_mean_kl`.
    [code: yifan123/flow_grpo, flow_grpo/diffusers_patch/sd3_sde_with_logprob.py, sde_step_with_logprob,
    sde_type='sde']. Differences: σ is passed, not looked up from a scheduler timestep; a noise level 0 is
    allowed; float64 inputs stay float64.
    """
    dtype = _compute_dtype(x, v)
    x, v = x.to(dtype), v.to(dtype)
    sig, sig_next = _rows(sigma, x), _rows(sigma_next, x)
    sub = sig_next if sigma_max_sub is None else _rows(sigma_max_sub, x)
    dt = sig_next - sig
    s = noise_level * torch.sqrt(sig / (1 - torch.where(sig == 1, sub, sig)))
    mean = x * (1 + s**2 / (2 * sig) * dt) + v * (1 + s**2 * (1 - sig) / (2 * sig)) * dt
    std = s * torch.sqrt(-dt)
    x_new = _draw_or_take(mean, std, noise, generator, x_next)
    return SDEStep(x_new, gaussian_step_logprob(x_new, mean, std), mean, _per_row(std, x), _per_row(s, x))


def merged_flow_step(x: torch.Tensor, v: torch.Tensor, sigmas: torch.Tensor, k: int | torch.Tensor, m: int,
                     noise_level: float, **kwargs) -> SDEStep:
    """E-GRPO's merged step: :func:`flow_grpo_step` from σ_k to σ_{k+m} (Δ = σ_{k+m} − σ_k), one column of the
    trajectory; m = 1 is the ordinary step. σ̃ is the schedule's σ_1 as in Flow-GRPO (so a merged first step
    from σ_0 = 1 uses σ_1, not σ_m). ``kwargs``: noise, generator, x_next.
    [paper + reference notes §4 (E-GRPO); its code, shengjun-zhang/VisualGRPO flux_sampler.py _flow_grpo_step
    with merge_step, was not re-read here]
    """
    if m < 1 or len(sigmas) < 2:
        raise ValueError(f"need m >= 1 and a schedule of at least 2 sigmas, got m={m}, len={len(sigmas)}")
    return flow_grpo_step(x, v, sigmas[k], sigmas[k + m], noise_level, sigma_max_sub=sigmas[1], **kwargs)


def dance_step(x: torch.Tensor, v: torch.Tensor, sigma: Number, sigma_next: Number, eta: float, *,
               noise: torch.Tensor | None = None, generator: torch.Generator | None = None,
               x_next: torch.Tensor | None = None, legacy_logprob: bool = False) -> SDEStep:
    """DanceGRPO's SDE step (``flux_step`` with ``sde_solver=True``) from σ to σ', noise level η = ``eta``.

    x̂₀ = x − σ·v;  score ŝ = −(x − (1−σ)·x̂₀)/σ²;  μ = x + Δ·v − ½·η²·ŝ·Δ;  std = η·√(σ − σ');  x' = μ + std·z.
    (μ equals Flow-GRPO's mean with s = η, and std = s·√(−Δ): the two SDEs differ only in how the noise scale
    depends on σ.)
    Log-prob: by default the full Gaussian density (:func:`gaussian_step_logprob`), as the code computes it
    since commit 9ac72b4 ("fix a small bug, no influence on results", 2025-08-20). ``legacy_logprob=True``
    reproduces the code before that fix (2145e4f and earlier, which the design note describes): the
    ``− log std − log √(2π)`` terms stood on a line of their own after the closing parenthesis, a statement
    without effect, so the stored value was only the per-row mean of −(x'−μ)²/(2·std²). Ratios are the same
    either way (std does not depend on θ); only absolute log-probs (an entropy estimate) differ.
    η = 0 gives the Euler step and log-prob 0.
    [code: XueZeyue/DanceGRPO, fastvideo/train_grpo_flux.py, flux_step]. Differences: μ is computed in float32
    (the code computes it in the model dtype and casts only for the log-prob); ``sigma`` may be per row (the code
    takes one index for the batch); noise from ``generator`` (the code uses ``torch.randn_like``).
    """
    dtype = _compute_dtype(x, v)
    x, v = x.to(dtype), v.to(dtype)
    sig, sig_next = _rows(sigma, x), _rows(sigma_next, x)
    dt = sig_next - sig
    x0 = x - sig * v
    score = -(x - x0 * (1 - sig)) / sig**2
    mean = x + dt * v - 0.5 * eta**2 * score * dt
    std = eta * torch.sqrt(-dt)
    x_new = _draw_or_take(mean, std, noise, generator, x_next)
    if legacy_logprob:
        positive = std > 0
        safe = torch.where(positive, std, torch.ones_like(std))
        lp = _row_mean(-((x_new.detach() - mean) ** 2) / (2 * safe**2))
        logprob = torch.where(_per_row(positive, x), lp, torch.zeros((), dtype=dtype, device=x.device))
    else:
        logprob = gaussian_step_logprob(x_new, mean, std)
    std_rows = _per_row(std, x)
    return SDEStep(x_new, logprob, mean, std_rows, std_rows)


def cps_step(x: torch.Tensor, v: torch.Tensor, sigma: Number, sigma_next: Number, noise_level: float, *,
             noise: torch.Tensor | None = None, generator: torch.Generator | None = None,
             x_next: torch.Tensor | None = None) -> SDEStep:
    """Coefficients-Preserving Sampling (Flow-GRPO's ``sde_type='cps'``) from σ to σ', noise level a.

    std = σ'·sin(a·π/2);  x̂₀ = x − σ·v;  x̂₁ = x + (1−σ)·v;  μ = (1−σ')·x̂₀ + √(σ'² − std²)·x̂₁;  x' = μ + std·z.
    "Log-prob" as the code: −(1/d)·Σ_u (x'_u − μ_u)², all constants *and the variance* dropped, so the ratio
    exp(Δ log-prob) is not the Gaussian density ratio (it lacks the 1/(2·std²) factor). The last step (σ' = 0)
    has std 0 and x' = μ, log-prob 0. a = 0 gives the Euler step.
    ``std_dev_t`` = std (the code returns σ'·sin(aπ/2), which its ``kl_loss`` then divides by).
    [code: yifan123/flow_grpo @54809b5, flow_grpo/diffusers_patch/sd3_sde_with_logprob.py, sde_step_with_logprob,
    sde_type='cps']
    """
    dtype = _compute_dtype(x, v)
    x, v = x.to(dtype), v.to(dtype)
    sig, sig_next = _rows(sigma, x), _rows(sigma_next, x)
    std = sig_next * math.sin(noise_level * math.pi / 2)
    x0 = x - sig * v
    x1 = x + (1 - sig) * v
    mean = x0 * (1 - sig_next) + x1 * torch.sqrt(sig_next**2 - std**2)
    x_new = _draw_or_take(mean, std, noise, generator, x_next)
    logprob = -_row_mean((x_new.detach() - mean) ** 2)
    std_rows = _per_row(std, x)
    return SDEStep(x_new, logprob, mean, std_rows, std_rows)


# ---------------------------------------------------------------------------------------------- DDIM (DDPO)


def ddim_step(x: torch.Tensor, eps: torch.Tensor, t: int | torch.Tensor, t_prev: int | torch.Tensor,
              alphas_cumprod: torch.Tensor, eta: float, *, clip_sample: bool = False, clip_range: float = 1.0,
              prediction_type: str = "epsilon", noise: torch.Tensor | None = None,
              generator: torch.Generator | None = None, x_next: torch.Tensor | None = None) -> SDEStep:
    """DDPO's DDIM step with log-prob from timestep t to t' (``t_prev``, normally t − N/T), η = ``eta``.

    ᾱ_t = ᾱ[t], ᾱ_{t'} = ᾱ[clamp(t', 0, N−1)] (N = len(alphas_cumprod));
    x̂₀ = (x − √(1−ᾱ_t)·ε̂)/√ᾱ_t for ``epsilon`` (``sample``: x̂₀ = model output, ε̂ = (x − √ᾱ_t·x̂₀)/√(1−ᾱ_t);
    ``v_prediction``: x̂₀ = √ᾱ_t·x − √(1−ᾱ_t)·v̂, ε̂ = √ᾱ_t·v̂ + √(1−ᾱ_t)·x), then clamped to ±``clip_range``
    when ``clip_sample`` (ε̂ is *not* re-derived from the clipped x̂₀: ``use_clipped_model_output=False``);
    σ_t² = (1−ᾱ_{t'})/(1−ᾱ_t)·(1 − ᾱ_t/ᾱ_{t'});  std = η·σ_t;
    μ = √ᾱ_{t'}·x̂₀ + √(1 − ᾱ_{t'} − std²)·ε̂;  x' = μ + std·z;  log-prob: :func:`gaussian_step_logprob`.
    η = 0: μ is diffusers' ``DDIMScheduler.step(..., eta=0).prev_sample`` (tested), std 0, log-prob 0.

    **Code quirk, matched**: t' is clamped to [0, N−1] *before* the ``t' >= 0 ? ᾱ[t'] : final_alpha_cumprod``
    test, so that test is always true and the last step (t' < 0) uses ᾱ[0], never ``final_alpha_cumprod``. With
    ``set_alpha_to_one=False`` (Stable Diffusion's config) that is the same number; with diffusers' default
    ``set_alpha_to_one=True`` the last step differs from ``DDIMScheduler.step`` (which uses 1). And at t = 0
    (``steps_offset=0``) ᾱ_t = ᾱ_{t'} makes σ_t = 0: that step is deterministic (log-prob 0 here; NaN in the
    code) and μ = x unless x̂₀ is clipped. So no ``final_alpha_cumprod`` argument exists.
    ``t``/``t_prev`` are ints or per-row [R] integer tensors.
    [code: kvablack/ddpo-pytorch, ddpo_pytorch/diffusers_patch/ddim_with_logprob.py, ddim_step_with_logprob and
    _get_variance]. Differences: computed in float32 or above (the code uses the sample dtype) and x' returned in
    that dtype (the code casts it back to the sample dtype); thresholding (``_threshold_sample``) and
    ``use_clipped_model_output=True`` are not offered.
    """
    if prediction_type not in ("epsilon", "sample", "v_prediction"):
        raise ValueError(f"prediction_type must be 'epsilon', 'sample' or 'v_prediction', got {prediction_type!r}")
    dtype = _compute_dtype(x, eps)
    x, eps = x.to(dtype), eps.to(dtype)
    n = alphas_cumprod.shape[0]
    acp = alphas_cumprod.to(device=x.device, dtype=dtype)
    t_idx = torch.as_tensor(t, dtype=torch.long, device=x.device)
    prev_idx = torch.as_tensor(t_prev, dtype=torch.long, device=x.device).clamp(0, n - 1)
    a_t = _rows(acp[t_idx], x)
    a_prev = _rows(acp[prev_idx], x)  # the code's `t' >= 0 ? ᾱ[t'] : final` is always ᾱ[t'] after the clamp
    b_t = 1 - a_t
    if prediction_type == "epsilon":
        x0, eps_hat = (x - b_t.sqrt() * eps) / a_t.sqrt(), eps
    elif prediction_type == "sample":
        x0 = eps
        eps_hat = (x - a_t.sqrt() * x0) / b_t.sqrt()
    else:
        x0 = a_t.sqrt() * x - b_t.sqrt() * eps
        eps_hat = a_t.sqrt() * eps + b_t.sqrt() * x
    if clip_sample:
        x0 = x0.clamp(-clip_range, clip_range)
    variance = (1 - a_prev) / b_t * (1 - a_t / a_prev)
    std = eta * variance.sqrt()
    mean = a_prev.sqrt() * x0 + (1 - a_prev - std**2).sqrt() * eps_hat
    x_new = _draw_or_take(mean, std, noise, generator, x_next)
    std_rows = _per_row(std, x)
    return SDEStep(x_new, gaussian_step_logprob(x_new, mean, std), mean, std_rows, std_rows)
