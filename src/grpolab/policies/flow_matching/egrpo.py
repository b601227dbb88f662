"""E-GRPO's branching rollout for a rectified-flow image policy (seed 000-78): an ODE anchor per prompt, G
branches per chosen step that take one merged (higher-entropy) SDE step and finish by the ODE."""
from __future__ import annotations

import torch

from ...batch import RolloutBatch
from ...errors import ConfigError
from .._image import sde
from ...registry import ROLLOUT_STRATEGIES, param
from ..base import repeat_rows


def _check_egrpo(cfg) -> None:
    steps, merge = list(cfg.egrpo_steps), list(cfg.egrpo_merge)
    if not steps or len(steps) != len(merge):
        raise ConfigError(f"egrpo_steps / egrpo_merge: one merge span per branching step (the authors' "
                          f"eta_step_list / eta_step_merge_list), got {steps} and {merge}")
    if len(set(int(k) for k in steps)) != len(steps):
        raise ConfigError(f"egrpo_steps: each branching step once, got {steps}")
    T = getattr(cfg, "flow_steps", None)
    for k, m in zip(steps, merge):
        if int(m) < 1 or int(k) < 0 or (T is not None and int(k) + int(m) > int(T)):
            raise ConfigError(f"egrpo_steps / egrpo_merge: a merged step goes from sigma_k to sigma_(k+m) with "
                              f"k >= 0, m >= 1 and k + m <= flow_steps ({T}); got k={k}, m={m}")
    if getattr(cfg, "flow_sde", "flow_grpo") != "flow_grpo":
        raise ConfigError(f"rollout_strategy egrpo_branch: E-GRPO's merged step is Flow-GRPO's SDE step; set "
                          f"flow_sde: flow_grpo (got {cfg.flow_sde})")


def ode_to_end(policy, module, x: torch.Tensor, labels: torch.Tensor, sigmas: torch.Tensor, start: int
               ) -> torch.Tensor:
    """Euler ODE steps x_{j+1} = x_j + (σ_{j+1} − σ_j)·v_θ(x_j, σ_j, c) for j = ``start`` .. T−1 (x at σ_start):
    the deterministic part of an E-GRPO sample (Flow-GRPO's step with noise level 0)."""
    for j in range(start, len(sigmas) - 1):
        sig = sigmas[j].expand(len(x)).to(x.device)
        x = x + (sigmas[j + 1] - sigmas[j]).to(x.device) * policy.velocity(module, x, sig, labels)
    return x


@ROLLOUT_STRATEGIES.register("egrpo_branch", check=_check_egrpo, needs=("flow_matching",))
def egrpo_branch(ctx, rows, uids, group_offset, budgets=None, temperatures=None, *,
                 egrpo_steps: list = param([1], "egrpo_branch: the steps k (indices into the sigma schedule, "
                                           "0 = sigma_0 = 1) where G branches leave the ODE anchor (E-GRPO's "
                                           "eta_step_list; its yaml default [1], its example script [1, 2, 3])"),
                 egrpo_merge: list = param([1], "egrpo_branch: per branching step, the number m of consecutive "
                                           "steps merged into its one SDE step sigma_k -> sigma_(k+m) (E-GRPO's "
                                           "eta_step_merge_list; 1 = the ordinary Flow-GRPO step)")):
    """E-GRPO branching rollout (Zhang et al., "High Entropy Steps Drive Effective RL for Flow Models",
    arXiv:2601.00423; seed 000-78).

    Per prompt (class c): one initial noise x_0 shared by the prompt's branches and one Euler-ODE **anchor**
    x_{j+1} = x_j + Δ_j·v_θ(x_j, σ_j, c). For each branching step k of ``egrpo_steps`` with span m (its entry of
    ``egrpo_merge``), G branches start from the anchor's x_k and take **one merged SDE step** σ_k → σ_{k+m}
    (Flow-GRPO's step, ``policies/_image/sde.py::merged_flow_step``):

    ``Δ = σ_{k+m} − σ_k``, ``s = a·√(σ_k / (1 − σ̃))`` (σ̃ = σ_1 where σ_k = 1, else σ_k),
    ``μ = x_k·(1 + s²Δ/(2σ_k)) + v·(1 + s²(1−σ_k)/(2σ_k))·Δ``, ``x' = μ + s·√(−Δ)·z``,

    then finish by the ODE from σ_{k+m} to σ_T = 0. The step's std s·√(−Δ) grows with m: merged low-entropy
    steps make one high-entropy step. Each row has **one column**, the merged step (``step_data`` x, x_next,
    σ_k, σ_{k+m}; behaviour log-prob = that Gaussian's per-element mean log-density), so only it is on the loss
    mask and the policy's forward recomputes it from the stored pair like any other step. Groups are
    (prompt, k): k's first group ids are ``group_offset``, the others ``ctx.allocate_groups``, so a group
    advantage (``group_zscore``) normalises within the samples that share the same merged step (E-GRPO's
    multi-step group-normalised advantage). Rows are k-major, then prompt, then branch; columns ``egrpo_step``
    (k) and ``egrpo_merge`` (m) record each row's step. Logs ``rollout/egrpo_step_std`` (the mean merged-step
    std). ``temperatures`` do not apply (the noise level is ``flow_noise_level``); ``budgets`` give G per
    prompt.

    Provenance: authors' code — https://github.com/shengjun-zhang/VisualGRPO, fastvideo/workers/sampler/
    flux_sampler.py (_flow_grpo_step with merge_step, _run_anchor_sample, _run_sde_sample_step, _run_ode_sample,
    sample) and fastvideo/workers/rollout_buffer.py (compute_advantages), read at commit ae619bf; the
    advantage is group_zscore with the code's epsilon 1e-8 and unbiased std (torch .std) per (prompt, k) column,
    the loss clipped_ratio with clip 1e-4 and advantages clipped to +-5 (fastvideo/trainer/grpo_trainer.py,
    _compute_grpo_loss). Known differences: the multi-granularity rewards (granular_list: each branch also
    finished on every g-th remaining sigma, advantages summed over g) are left out (g = 1 only); the code's ODE
    after the merged step restarts at schedule index k+1 whatever m is (for m > 1 it integrates from
    σ_{k+1} a latent that is at σ_{k+m}; its configs only use m = 1), here it continues from σ_{k+m} as the
    paper describes; the code draws one initial noise per sample() call (shared by every prompt of the call),
    here one per prompt; the sigma schedule is the policy's (diffusers' schedule), the code's a shifted
    linspace; the code's timestep int(1000·σ) is 1000·σ here; the paper's adaptive entropy threshold is, as in
    the code, fixed lists.
    Test: tests/test_image_egrpo_chunk.py::test_merged_step_with_m_1_is_the_flow_grpo_step,
    tests/test_image_egrpo_chunk.py::test_merged_step_std_grows_with_m,
    tests/test_image_egrpo_chunk.py::test_egrpo_groups_per_prompt_and_step_and_one_column.
    """
    with torch.no_grad():
        return _branch(ctx, rows, uids, group_offset, budgets, list(egrpo_steps), list(egrpo_merge))


def _branch(ctx, rows, uids, group_offset, budgets, egrpo_steps, egrpo_merge) -> RolloutBatch:
    cfg = ctx.cfg
    if len(egrpo_steps) != len(egrpo_merge):
        raise ValueError(f"egrpo_branch: egrpo_steps {list(egrpo_steps)} and egrpo_merge {list(egrpo_merge)} "
                         f"must have the same length")
    from .._image.flow import condition_of, pack_images

    policy, module = ctx.actions, ctx.policy
    device = next(module.parameters()).device
    generator = ctx.sampling_generator
    sigmas = policy.sigmas
    T = len(sigmas) - 1
    for k, m in zip(egrpo_steps, egrpo_merge):
        if int(m) < 1 or int(k) < 0 or int(k) + int(m) > T:
            raise ValueError(f"egrpo_branch: need 0 <= k, 1 <= m, k + m <= {T} (the policy's steps); got k={k}, "
                             f"m={m}")
    counts = list(budgets) if budgets else [int(cfg.num_generations)] * len(rows)
    labels = torch.tensor([condition_of(r) for r in rows], device=device)
    # one initial noise per prompt, shared by all its branches (the code's init_same_noise)
    x = torch.randn((len(rows), *policy.shape), generator=generator).to(device)
    anchor = [x]
    for j in range(max(int(k) for k in egrpo_steps)):
        sig = sigmas[j].expand(len(x)).to(device)
        x = x + (sigmas[j + 1] - sigmas[j]).to(device) * policy.velocity(module, x, sig, labels)
        anchor.append(x)
    row_labels = repeat_rows(labels, counts)
    parts, stds = [], []
    for q, (k, m) in enumerate(zip(egrpo_steps, egrpo_merge)):
        k, m = int(k), int(m)
        xk = repeat_rows(anchor[k], counts)
        R = len(xk)
        sig = sigmas[k].expand(R).to(device)
        out = sde.merged_flow_step(xk, policy.velocity(module, xk, sig, row_labels), sigmas.to(device), k, m,
                                   policy.a, generator=generator)
        stds.append(out.std)
        x_end = ode_to_end(policy, module, out.x_next, row_labels, sigmas, k + m)
        step_data = {"x": xk[:, None], "x_next": out.x_next[:, None],
                     "sigma": sigmas[k].expand(R, 1).clone(), "sigma_next": sigmas[k + m].expand(R, 1).clone()}
        offset = group_offset if q == 0 else ctx.allocate_groups(len(rows))
        part = pack_images(rows, uids, counts, row_labels, (x_end.clamp(-1, 1) + 1) / 2,
                           logprobs=out.logprob[:, None], group_offset=offset, step_data=step_data)
        part.columns["egrpo_step"] = [k] * R
        part.columns["egrpo_merge"] = [m] * R
        parts.append(part)
    ctx.metric("egrpo_step_std", float(torch.cat(stds).float().mean()))
    return parts[0] if len(parts) == 1 else RolloutBatch.concat(parts, pad_id=ctx.pad_id)
