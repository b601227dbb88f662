"""DGPO's view of a rectified-flow image generator: images drawn by the deterministic ODE, then each final image
re-noised at M times, one step of the ``[rows, steps]`` layout per re-noising, scored by the flow-matching
(denoising) loss. Loads ``flow_matching``'s built-in network and shares its helpers (noise, packing); its SDE path is untouched."""
from __future__ import annotations

from typing import Any

import torch

from ...config import ConfigError
from ...generation.sampling import completion_counts, per_row
from .._image import sde
from ...registry import POLICIES, declared_params, param
from ..base import PolicyBase, save_pretrained_folder
from .._image.flow import (FlowMatchingPolicy, check_class_rows, check_image_policy, condition_of, load_class_unet,
                            pack_images, row_noise, unet_velocity)

_FM = declared_params(FlowMatchingPolicy)  # the shared declarations (one default and help per config key)


def dsm_renoise(x0: torch.Tensor, sigmas: torch.Tensor, counts: list[int], generator=None):
    """DGPO's re-noising of final samples ``x0`` [R, ...] at the M times ``sigmas`` [M] (shared by every row):
    one noise ε per group (``counts``: consecutive rows per group) and time, x_t = (1 − σ)·x₀ + σ·ε, target
    v* = ε − x₀. Returns ``(x_t, target, noise)``, each [R, M, ...].
    [code: Luo-Yihong/DGPO, scripts/train_sd3_dgpo.py, generate_shared_noise_for_groups and the training loop]"""
    M = len(sigmas)
    shape = x0.shape[1:]
    on = {"device": generator.device} if generator is not None else {}  # an accelerator's generator draws there
    noise = torch.cat([torch.randn((1, M, *shape), generator=generator, **on).expand(n, M, *shape)
                       for n in counts]).to(x0.device, x0.dtype)
    sig = sigmas.to(x0.device, x0.dtype).view(1, M, *([1] * len(shape)))
    x_t = (1 - sig) * x0[:, None] + sig * noise
    return x_t, noise - x0[:, None], noise


@POLICIES.register("flow_dsm", check=check_image_policy)
class FlowDSMPolicy(PolicyBase):
    """DGPO's rectified-flow policy (Luo et al., "Reinforcing Diffusion Models by Direct Group Preference
    Optimization", arXiv:2510.08425; seed 000-42): ``flow_matching``'s class-conditional UNet, sampled by the
    Euler ODE (no SDE, no per-step Gaussian), each final sample x₀ then re-noised for training.

    Rollout: ``flow_steps`` Euler steps from noise (``flow_shift`` schedule, ``guidance_scale``), x₀ = x_T (the
    image is x₀ clipped to [−1, 1] → [0, 1]). Re-noising: M = ``dsm_timesteps`` indices drawn without
    replacement from the first ``dsm_trunc_steps`` + 1 of the rollout schedule (σ ≥ σ_trunc: DGPO's timestep
    clip), the same for every row of the batch; per index one noise ε per group; x_t = (1 − σ)·x₀ + σ·ε,
    target v* = ε − x₀. Step j (one column) is the re-noising j; its value is

        ℓ_θ = mean_u (v_θ(x_t, σ, c) − v*)²,    logprobs = −ℓ_θ   [ours: the surrogate]

    so that behaviour values (−ℓ under the sampling weights) and ratios exp(ℓ_old − ℓ_θ) exist for the
    trainer; ``offers`` ``dsm_loss`` (ℓ, so the frozen reference's ℓ_ref arrives as ``ref_dsm_loss``).
    ``step_data``: x_t, sigma, target (and noise). Evaluation is ``flow_matching``'s (Euler ODE from each row's
    fixed noise: its ``noise_seed``, else ``base.held_out_seed``'s). Capabilities: flow_matching, images,
    denoising_loss (not gaussian_steps: the Gaussian
    components are refused).

    Provenance: authors' code — https://github.com/Luo-Yihong/DGPO, scripts/train_sd3_dgpo.py
    (generate_shared_sampled_timesteps, generate_shared_noise_for_groups, the training loop: x_t, target_v,
    dsm_loss); differences: Euler ODE rollouts (the code uses a DPM-Solver scheduler), the times are drawn at
    sampling (once per step, shared by the batch; the code draws once per inner epoch), logprobs = −ℓ is
    grpolab's surrogate, the tiny UNet trains all its weights (the code: LoRA on SD3.5-M).
    Test: tests/test_image_dgpo_vipo.py::test_renoising_shares_noise_within_a_group_and_times_within_the_batch.
    """

    step = "re-noising"
    capabilities = frozenset({"flow_matching", "images", "denoising_loss"})
    description = "an image generator by rectified flow (diffusers), ODE rollouts; one step = one re-noising of the " \
                  "final image, valued by its flow-matching loss (DGPO)"
    default_model = "digits"
    default_task = "digits"  # the task a run with this policy and no --task / --data trains on
    float32_only = True
    steps_key = "dsm_timesteps"  # the columns of a training sample: the M re-noisings

    def __init__(self, *, model: str,
                 flow_steps: int = _FM["flow_steps"],
                 flow_eval_steps: int = _FM["flow_eval_steps"],
                 flow_shift: float = _FM["flow_shift"],
                 flow_same_noise_in_group: bool = _FM["flow_same_noise_in_group"],
                 guidance_scale: float = _FM["guidance_scale"],
                 dsm_timesteps: int = param(4, "flow_dsm: re-noisings per sample, M (DGPO's num_train_timesteps, 4)"),
                 dsm_trunc_steps: int = param(5, "flow_dsm: re-noising times are drawn from the rollout schedule's "
                                              "first dsm_trunc_steps + 1 sigmas (DGPO's trunc_steps: 6 of 10 steps "
                                              "at shift 3 in config/dgpo.py; 5 of 8 here keeps sigma >= 0.37)")):
        if flow_steps < 1 or flow_eval_steps < 1:
            raise ConfigError(f"flow_steps / flow_eval_steps: at least 1 step, got {flow_steps} / {flow_eval_steps}")
        if not 0 <= dsm_trunc_steps < flow_steps:
            raise ConfigError(f"dsm_trunc_steps: an index of the rollout schedule's nonzero sigmas, 0..{flow_steps - 1}"
                              f", got {dsm_trunc_steps}")
        if not 1 <= dsm_timesteps <= dsm_trunc_steps + 1:
            raise ConfigError(f"dsm_timesteps: 1..dsm_trunc_steps + 1 = {dsm_trunc_steps + 1} distinct times, got "
                              f"{dsm_timesteps}")
        self.model_name, self.T, self.T_eval, self.shift = model, int(flow_steps), int(flow_eval_steps), float(flow_shift)
        self.same_noise, self.w = bool(flow_same_noise_in_group), float(guidance_scale)
        self.M, self.trunc = int(dsm_timesteps), int(dsm_trunc_steps)
        self.sigmas = sde.flow_sigmas(self.T, self.shift, schedule="diffusers")
        self.shape: tuple = (1, 8, 8)

    def load(self, cfg, rows, eval_rows, *, extra_texts=(), log=print):
        """``digits`` (the built-in tiny class-conditional UNet, flow_matching's) or a folder holding a
        ``diffusers`` ``UNet2DModel`` (what :meth:`save` writes)."""
        module = load_class_unet("flow_dsm", self.model_name, "flow", log=log)
        c = module.config
        self.shape = (c.in_channels, c.sample_size, c.sample_size)
        check_class_rows(module, rows, eval_rows)
        return module.float()

    def save(self, module, path) -> None:
        save_pretrained_folder(module, path)

    def velocity(self, module, x, sigma, labels):
        """v_θ(x, σ, c), float32 (timestep 1000·σ), with classifier-free guidance (label 10) when w != 1."""
        return unet_velocity(module, x, sigma, labels, self.w)

    def describe(self, batch, i: int) -> dict:
        from ...media import thumbnail_data_uri
        return {"prompt": str(batch.columns["prompt"][i]), "completion": "",
                "image": thumbnail_data_uri(batch.row_data["images"][i])}

    def ode(self, module, x, labels, steps: int) -> torch.Tensor:
        """The Euler ODE over the ``steps``-step schedule from noise x to x₀."""
        sigmas = self.sigmas if steps == self.T else sde.flow_sigmas(steps, self.shift, schedule="diffusers")
        for j in range(steps):
            x = x + (sigmas[j + 1] - sigmas[j]) * self.velocity(module, x, sigmas[j].expand(len(x)), labels)
        return x

    def dsm_loss(self, module, x_t, sigma, target, labels) -> torch.Tensor:
        """ℓ = mean_u (v_θ(x_t, σ, c) − v*)² per row, [N] float32."""
        v = self.velocity(module, x_t, sigma, labels)
        return (v - target.to(v)).square().reshape(len(v), -1).mean(1)

    @torch.no_grad()
    def sample(self, module, rows, uids, *, group_offset=0, num_generations, temperature=None, generator=None,
               evaluation=False):
        """Images by the Euler ODE; training batches carry the M re-noisings and their −ℓ as behaviour values."""
        counts = completion_counts(num_generations, len(rows))
        device = next(module.parameters()).device
        labels = torch.tensor(per_row([condition_of(r) for r in rows], counts), device=device)
        x = row_noise(rows, uids, counts, self.shape, generator, evaluation=evaluation,
                      same_in_group=self.same_noise).to(device)
        if evaluation:  # from each row's fixed noise (row_noise), flow_eval_steps Euler steps (as flow_matching)
            x = self.ode(module, x, labels, self.T_eval)
            return pack_images(rows, uids, counts, labels, (x.clamp(-1, 1) + 1) / 2,
                               logprobs=torch.zeros(len(x), 1), group_offset=group_offset)
        x = self.ode(module, x, labels, self.T)
        on = {"device": generator.device} if generator is not None else {}
        idx = torch.randperm(self.trunc + 1, generator=generator, **on)[:self.M].cpu()
        sig = self.sigmas[idx]
        x_t, target, noise = dsm_renoise(x, sig, counts, generator)
        R = len(x)
        sig_rows = sig.expand(R, self.M).clone().to(device)
        ell = torch.stack([self.dsm_loss(module, x_t[:, m], sig_rows[:, m], target[:, m], labels)
                           for m in range(self.M)], 1)
        return pack_images(rows, uids, counts, labels, (x.clamp(-1, 1) + 1) / 2, logprobs=-ell,
                           group_offset=group_offset,
                           step_data={"x": x_t, "sigma": sig_rows, "target": target, "noise": noise})

    def offers(self) -> frozenset[str]:
        return frozenset({"dsm_loss"})

    def forward(self, module, mb, *, want: frozenset[str] = frozenset(), grad: bool = True) -> dict[str, Any]:
        """``logprobs`` = −ℓ_θ [R, T] of the stored re-noisings (only the steps on ``completion_mask`` run; 0
        elsewhere); ``dsm_loss`` = ℓ_θ."""
        device = next(module.parameters()).device
        R, T = mb.completion_mask.shape
        rows, cols = (mb.completion_mask > 0).nonzero(as_tuple=True)
        with torch.set_grad_enabled(grad):
            ell = self.dsm_loss(module, mb.step_data["x"][rows, cols].to(device),
                                mb.step_data["sigma"][rows, cols].to(device),
                                mb.step_data["target"][rows, cols].to(device), mb.row_data["cond"][rows].to(device))
            full = torch.zeros(R, T, device=device, dtype=ell.dtype).index_put((rows, cols), ell)
        out = {"logprobs": -full}
        if "dsm_loss" in want:
            out["dsm_loss"] = full
        return out
