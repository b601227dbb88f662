"""Which denoising steps of an image policy enter the loss (Flow-GRPO, DDPO, DanceGRPO): a batch stage."""
from __future__ import annotations

import math
from dataclasses import replace

import torch

from ...errors import ConfigError
from ...registry import BATCH_STAGES, POLICIES, param


def _check_denoising_steps(cfg) -> None:
    """``steps_fraction`` in (0, 1], and at least one step of a sample trained: the policy's number of steps
    (its ``steps_key``, e.g. ``flow_steps``) T, n = T (T − 1 with ``steps_drop_last``), ``int(n ·
    steps_fraction)`` >= 1, else refused naming the fields, their values and the smallest valid ones."""
    if not 0.0 < cfg.steps_fraction <= 1.0:
        raise ConfigError(f"steps_fraction: must be in (0, 1], got {cfg.steps_fraction}")
    key = getattr(POLICIES.get(cfg.policy), "steps_key", None) if cfg.policy in POLICIES else None
    if key is None or key not in cfg.params:
        return
    message = no_step_trained(int(cfg.params[key]), float(cfg.steps_fraction), bool(cfg.steps_drop_last), key)
    if message:
        raise ConfigError(message)


def no_step_trained(T: int, fraction: float, drop_last: bool, key: str = "steps") -> str | None:
    """None when a row of ``T`` loss steps keeps at least one (``k = int(n · fraction)``, n = T, or T − 1 with
    ``drop_last``); else the error: the fields and values, the k that would train, and the smallest valid
    ``key`` (at this fraction), ``steps_fraction`` (at this T) and ``steps_drop_last``."""
    n = T - 1 if drop_last else T
    k = int(n * fraction)
    if k >= 1 or T < 1:
        return None
    how = f"int(({key} - 1) * steps_fraction) = int({n} * {fraction:g})" if drop_last else \
        f"int({key} * steps_fraction) = int({n} * {fraction:g})"
    fixes = [f"{key} >= {next(t for t in range(T + 1, T + 10**6) if int((t - drop_last) * fraction) >= 1)} "
             f"(at steps_fraction {fraction:g})"]
    if n >= 1:  # the smallest fraction f with int(n * f) >= 1, rounded up to 3 decimals
        f = math.ceil(1000 / n) / 1000
        while int(n * f) < 1:
            f += 0.001
        fixes.append(f"steps_fraction >= {min(f, 1.0):g} (at {key} {T})")
    if drop_last and int(T * fraction) >= 1:
        fixes.append("steps_drop_last: false")
    return (f"{key} {T}, steps_fraction {fraction:g}, steps_drop_last {str(drop_last).lower()}: denoising_steps "
            f"keeps {how} = {k} of each sample's {T} denoising step{'s' if T != 1 else ''}, so no step would "
            f"train (loss and grad_norm 0 on every step); set {' or '.join(fixes)}")


def kept_steps(mask_row: torch.Tensor, fraction: float, order: str, drop_last: bool,
               generator: torch.Generator | None = None) -> list[int]:
    """The columns of one row that stay on the loss mask: of its loss steps (``mask_row > 0``, in order; the
    last left out with ``drop_last``), ``k = int(n * fraction)``: the first k (``in_order``) or the first k of a
    uniform random permutation drawn from ``generator`` (``random``)."""
    steps = torch.nonzero(mask_row > 0).flatten().tolist()
    if drop_last:
        steps = steps[:-1]
    k = int(len(steps) * fraction)
    if order == "in_order":
        return steps[:k]
    if order == "random":
        perm = torch.randperm(len(steps), generator=generator).tolist()
        return [steps[j] for j in perm[:k]]
    raise ValueError(f"steps_order: '{order}' is not valid; valid values: in_order, random")


@BATCH_STAGES.register("denoising_steps", check=_check_denoising_steps, needs=("gaussian_steps",))
def denoising_steps(batch, ctx, *,
                    steps_fraction: float = param(1.0, 'denoising_steps: share of each row\'s denoising steps that '
                                                  "enter the loss, k = int(T * fraction) (DDPO's and Flow-GRPO's "
                                                  'train.timestep_fraction; Flow-GRPO trains with 0.99)'),
                    steps_order: str = param('in_order', 'denoising_steps: which k steps: the first k in sampling '
                                             "order (Flow-GRPO) or k drawn at random per row (DDPO, DanceGRPO)",
                                             ['in_order', 'random']),
                    steps_drop_last: bool = param(False, "denoising_steps: leave each row's last denoising step "
                                                  'out before choosing (k = int((T - 1) * fraction))')):
    """Which denoising steps train: DDPO's and Flow-GRPO's ``timestep_fraction`` (Black et al., 2023,
    arXiv:2305.13301; Liu et al., 2025, arXiv:2505.05470).

    One step of an image policy is one denoising step (a column of ``[R, T]``). For each row, of its ``n``
    loss steps (``completion_mask > 0``; ``n - 1`` with ``steps_drop_last``), ``k = int(n * steps_fraction)``
    stay on the mask: the first k in sampling order (``steps_order: in_order``, Flow-GRPO: with its 0.99 and
    10 steps, all but the last) or the first k of a uniform random permutation, drawn per row from the run's
    seeded generator ``ctx.generator`` (``random``, DDPO and DanceGRPO). Only the mask changes (and the
    advantages, zeroed off it as everywhere in the trainer): the dropped steps' ``step_data``, behaviour
    log-probs and attention mask stay as they are. The default (fraction 1, in order) keeps every step.

    Provenance: authors' code — https://github.com/yifan123/flow_grpo, scripts/train_sd3.py (training loop:
    ``num_train_timesteps = int(config.sample.num_steps * config.train.timestep_fraction)``, ``train_timesteps
    = range(num_train_timesteps)``, in order; 0.99 in config/grpo.py); random order: DDPO
    https://github.com/kvablack/ddpo-pytorch scripts/train.py (``perms = torch.stack([torch.randperm(
    num_timesteps) ...])`` per sample, then the first ``int(num_steps * timestep_fraction)`` of the permuted
    steps; 1.0 in config/base.py) and the same in DanceGRPO (https://github.com/XueZeyue/DanceGRPO,
    fastvideo/train_grpo_flux.py, fraction 0.6 in scripts/finetune/finetune_flux_grpo.sh). Known differences:
    DDPO and DanceGRPO redraw the permutation every inner epoch, here it is drawn once per step (the same at
    fraction 1.0, DDPO's default); ``steps_drop_last`` is DanceGRPO's: both fastvideo/train_grpo_sd.py and
    fastvideo/train_grpo_flux.py cut the last step off every trajectory before permuting (``timesteps[:, :-1]``,
    ``latents[:, :-1][:, :-1]``, ``log_probs[:, :-1]``), so the permutation and ``k = int((T - 1) *
    timestep_fraction)`` cover the first T - 1 steps and the last step is never trained.
    Test: tests/test_image_algorithms.py::test_denoising_steps_in_order_keeps_the_first_k,
    tests/test_image_algorithms.py::test_denoising_steps_random_keeps_k_per_row,
    tests/test_image_algorithms.py::test_denoising_steps_drop_last.
    """
    if not 0.0 < steps_fraction <= 1.0:
        raise ValueError(f"steps_fraction: must be in (0, 1], got {steps_fraction}")
    mask = batch.completion_mask
    generator = None
    if steps_order == "random":
        generator = getattr(ctx, "generator", None)
        if generator is None:
            raise ValueError("denoising_steps: steps_order random draws from the run's seeded generator "
                             "(ctx.generator), which this context lacks")
    new_mask = torch.zeros_like(mask)
    for i in range(mask.shape[0]):
        keep = kept_steps(mask[i].cpu(), steps_fraction, steps_order, steps_drop_last, generator)
        if keep:
            idx = torch.tensor(keep, dtype=torch.long, device=mask.device)
            new_mask[i, idx] = mask[i, idx]
    if bool((mask > 0).any()) and not bool((new_mask > 0).any()):  # e.g. a rollout whose rows have one step
        n = int((mask > 0).sum(1).max())
        m = n - 1 if steps_drop_last else n
        raise ConfigError(f"denoising_steps: the batch's rows have at most {n} loss step{'s' if n != 1 else ''} "
                          f"and steps_fraction {steps_fraction:g}{' with steps_drop_last' if steps_drop_last else ''}"
                          f" keeps int({m} * {steps_fraction:g}) = 0 of them, so no step would train; set "
                          f"steps_fraction: 1.0 and steps_drop_last: false, or leave denoising_steps out of "
                          f"batch_stages")
    out = {"completion_mask": new_mask}
    if batch.advantages is not None:
        out["advantages"] = batch.advantages * new_mask.to(batch.advantages.dtype)
    return replace(batch, **out)
