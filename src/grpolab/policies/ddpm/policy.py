"""A DDPM (ε-prediction) image generator (``diffusers``), sampled by DDIM with η > 0 so that every denoising step has
a Gaussian log-prob: DDPO's construction; one step of the ``[rows, steps]`` layout is one DDIM step t → t'."""
from __future__ import annotations

from typing import Any

import torch

from ...config import ConfigError
from ...generation.sampling import completion_counts
from .._image import sde
from ...registry import POLICIES, declared_params, param
from ..base import PolicyBase, held_out_seed
from .._image.flow import (LM_LORA_TARGETS, FlowMatchingPolicy, check_image_policy, check_sampler,
                           gaussian_step_outputs, pack_images, row_noise)
from .pipelines import load_denoiser

#: the one declaration of ``guidance_scale``, shared with flow_matching (a config key has one default and help)
GUIDANCE_SCALE = declared_params(FlowMatchingPolicy)["guidance_scale"]
#: added to a held-out row's seed (``base.held_out_seed``: its noise_seed, else derived from the row) to seed
#: its step noises (the seed itself draws the initial noise)
STEP_NOISE_OFFSET = 1_000_003


@POLICIES.register("ddpm", check=check_image_policy)
class DDPMPolicy(PolicyBase):
    """A DDPM image model (a ``diffusers`` UNet predicting ε, or v / x₀ as its scheduler says) sampled by DDIM
    with η > 0, so every denoising step is a Gaussian and GRPO's per-step ratios exist (DDPO's construction).

    Models (``pipelines.py``): the built-in class-conditional digits ``UNet2DModel``; a user's ``UNet2DModel``
    folder or ``DDPMPipeline`` folder, unconditional (the rows' prompt / label ignored) or class-conditional;
    a ``StableDiffusionPipeline`` (SD 1.x / 2.x) or ``StableDiffusionXLPipeline`` folder, whose
    ``UNet2DConditionModel`` in latent space is the trained module, text prompts encoded by the pipeline's frozen
    text encoder(s) once per sampling call into ``row_data``, images the frozen VAE's decoding. The UNet is the
    only module the optimiser, DDP and checkpoints see (tested on tiny random pipelines:
    tests/test_ddpm_pipelines.py).

    Schedule: ``DDIMScheduler.from_config`` of the model's saved scheduler config (a ``DDPMScheduler``'s, as
    DDPO builds its DDIM scheduler from the pipeline's), ``set_timesteps(ddpm_steps)``: timesteps t_0 > t_1 > ...
    > t_{T−1}, and t'_j = t_j − N/T (N = ``num_train_timesteps``; DDPO's ``prev_timestep``). ``steps_offset`` is
    raised to 1 when the config has 0 (the digits model's): Stable Diffusion's config, which DDPO trains with,
    has 1, and with 0 the last step starts at t = 0, where ᾱ_t = ᾱ_{t'} (t' is clamped to 0) makes σ_t = 0: a
    step without a density, no log-prob, a division by 0 in the KL. So T = 10 on N = 1000 gives t = 901, 801,
    ..., 1. With ᾱ = ``alphas_cumprod``, ε̂ = ε_θ(x_j, t_j, c) (with ``guidance_scale`` w != 1:
    ε̂ = ε_u + w·(ε_c − ε_u), ε_u under the empty prompt's embeds for a pipeline, as DDPO; SDXL: zeros, its
    ``force_zeros_for_empty_prompt``; under the unconditional class for a class-conditional UNet: the digits
    model's 10, a saved folder's record, else ``ddpm_unconditional_class``, never guessed), step j is
    ``policies/_image/sde.py::ddim_step``:

    - x̂₀ = (x_j − √(1−ᾱ_t)·ε̂)/√ᾱ_t (``sample`` and ``v_prediction`` configs converted as in the code), clipped
      to ±``clip_sample_range`` when ``clip_sample`` (the digits config: yes);
    - σ_t² = (1−ᾱ_{t'})/(1−ᾱ_t)·(1 − ᾱ_t/ᾱ_{t'}), std = η·σ_t (η = ``ddpm_eta``, DDPO's ``sample.eta``);
    - μ = √ᾱ_{t'}·x̂₀ + √(1 − ᾱ_{t'} − std²)·ε̂;  x_{j+1} = μ + std·z, z ~ N(0, I);

    with ᾱ_{t'} = ᾱ[clamp(t', 0, N−1)]: the authors' code clamps before its ``final_alpha_cumprod`` test, so the
    last step uses ᾱ[0], never ``final_alpha_cumprod`` (matched). log π(x_{j+1} | x_j, c) is the Gaussian
    log-density averaged over the image's elements (mean, not sum, as in the code). ``step_data`` keeps x_j,
    x_{j+1}, t_j and t'_j of every step, so the log-probs are recomputed under new weights from the stored
    pairs, only for the steps on the loss mask. ``step_std_dev`` (what ``gaussian_mean_kl`` divides by) is the
    step std η·σ_t, so that regularizer is the exact KL between the policy's and the reference's step Gaussians,
    averaged over elements (DDPO has no KL; Flow-GRPO's s differs from its step std by √(−Δσ), DDIM's has no
    such factor). Evaluation (``evaluation=True``) runs ``ddpm_eval_steps`` DDIM steps with η =
    ``ddpm_eval_eta``: by default the training η (the distribution RL trains, as DDPO reports the reward of its
    training samples), the initial noise from each row's seed (its ``noise_seed``, else derived from its uid
    and prompt: ``base.held_out_seed``) and every step's noise from that seed + :data:`STEP_NOISE_OFFSET`, so a
    held-out row gets the same draws before and after training and in every ``grpolab eval``; ``ddpm_eval_eta: 0``
    is deterministic DDIM (the same step with std 0: at the last step it keeps
    ᾱ[0] ≈ 0.9999 where diffusers' ``DDIMScheduler.step`` uses 1). Why the training η by default [measured,
    digits model, held-out confidence of the asked class]: η = 1 samples score 0.770 (200 rows), η = 0 samples
    0.594 (50 rows), and RL trains the former.
    The initial noise is scaled by the scheduler's ``init_noise_sigma`` as the pipelines' ``prepare_latents``
    (DDIM: 1). Images are the last x clipped to [−1, 1] and mapped to [0, 1] (a pipeline: the VAE's decoding of
    x / ``scaling_factor``, (x/2 + 0.5).clamp(0, 1)); reward functions receive them as float32 NumPy
    ``[H, W, C]``. ``use_lora``: PEFT adapters on the UNet (:meth:`prepare`); the final folder then also holds
    them in the model's library's format (:meth:`save_adapters`).

    The forward runs in float32 whatever the run's ``dtype``. ``temperature`` does not apply (the noise level
    is η).

    Paper: Black et al., "Training Diffusion Models with Reinforcement Learning", arXiv:2305.13301 (DDPO; the
    anchor DDPM recipe, not a seed).

    Provenance: authors' code — https://github.com/kvablack/ddpo-pytorch, ddpo_pytorch/diffusers_patch/ddim_with_logprob.py
    (ddim_step_with_logprob and _get_variance: the step, its log-prob and the clamp quirk, policies/_image/sde.py) and
    ddpo_pytorch/diffusers_patch/pipeline_with_logprob.py (the sampling loop over scheduler.timesteps, CFG on ε);
    steps_offset raised to 1, the η = 0 evaluation sampler and the tiny class-conditional UNet are grpolab's.
    Test: tests/test_ddpm_policy.py::test_a_step_logprob_is_the_hand_gaussian,
    tests/test_ddpm_policy.py::test_the_last_step_uses_alphas_cumprod_0.
    """

    step = "denoising step"
    capabilities = frozenset({"gaussian_steps", "images"})
    description = "an image generator by DDPM (diffusers) sampled by DDIM, eta > 0 (DDPO); one step = one DDIM step"
    default_model = "digits"
    default_task = "digits"  # the task a run with this policy and no --task / --data trains on
    float32_only = True
    steps_key = "ddpm_steps"  # the columns of a training sample (denoising_steps checks it)

    def __init__(self, *, model: str,
                 ddpm_steps: int = param(10, "DDIM steps of a training sample (the columns of [rows, steps]; DDPO "
                                         "uses 50)"),
                 ddpm_eta: float = param(1.0, "DDIM's eta: each step's std is eta * sigma_t (DDPO's sample.eta; "
                                         "above 0, since eta = 0 is deterministic and has no log-prob)"),
                 ddpm_eval_steps: int = param(10, "DDIM steps of a held-out evaluation sample"),
                 ddpm_eval_eta: float | None = param(None, "DDIM's eta of a held-out evaluation sample: null = "
                                                     "ddpm_eta (the sampler RL trains; every step's noise drawn "
                                                     "from the row's noise_seed, the same before and after); 0 = "
                                                     "deterministic DDIM"),
                 guidance_scale: float = GUIDANCE_SCALE,
                 ddpm_unconditional_class: int | None = param(None, "the class of a class-conditional UNet2DModel "
                                                              "that guidance (guidance_scale != 1) uses as "
                                                              "unconditional: null = the model's own record (the "
                                                              "built-in digits model: 10; a folder this policy "
                                                              "saved), else guidance is refused"),
                 use_lora: bool, lora_r: int, lora_alpha: int, lora_target_modules: list):
        check_sampler("ddpm", ddpm_steps, ddpm_eval_steps, "ddpm_eta", ddpm_eta,
                      "the training sampler needs eta above 0 (eta = 0 is deterministic DDIM, whose steps have no "
                      "log-prob; evaluation already uses it)")
        self.model_name, self.T, self.T_eval = model, int(ddpm_steps), int(ddpm_eval_steps)
        if ddpm_eval_eta is not None and ddpm_eval_eta < 0:
            raise ConfigError(f"ddpm_eval_eta: null (= ddpm_eta) or a number >= 0, got {ddpm_eval_eta}")
        self.eta, self.w = float(ddpm_eta), float(guidance_scale)
        self.eval_eta = self.eta if ddpm_eval_eta is None else float(ddpm_eval_eta)
        self.shape: tuple = (1, 8, 8)
        self.unconditional_class = None if ddpm_unconditional_class is None else int(ddpm_unconditional_class)
        self.scheduler_config: dict = {}
        self.init_noise_sigma = 1.0
        self.net = None  #: the loaded denoiser (pipelines.py): conditions, the UNet call, decoding, saving
        self.lora = (int(lora_r), int(lora_alpha), list(lora_target_modules or LM_LORA_TARGETS)) if use_lora else None

    # ---------------------------------------------------------------- loading
    def load(self, cfg, rows, eval_rows, *, extra_texts=(), log=print):
        """``model``: ``digits`` (the built-in tiny DDPM, pre-trained on first use and cached), a folder holding
        a ``diffusers`` ``UNet2DModel`` predicting noise and its ``scheduler_config.json`` (what :meth:`save`
        writes), or a diffusers pipeline folder (``model_index.json``: ``StableDiffusionPipeline``,
        ``StableDiffusionXLPipeline``, ``DDPMPipeline``; ``pipelines.py``)."""
        self.net = load_denoiser(self.model_name, cfg, rows, eval_rows, guidance_scale=self.w,
                                 unconditional_class=self.unconditional_class, log=log)
        self._set_scheduler(self.net.scheduler_config)
        self.shape = self.net.shape
        return self.net.module

    def prepare(self, module):
        """LoRA adapters (PEFT, ``use_lora``) on the UNet; ``lora_target_modules`` left at the causal LM's
        default means a Stable Diffusion UNet's attention projections ``to_q/to_k/to_v/to_out.0`` (ddpo-pytorch's
        LoRA layers) or a pixel UNet2DModel's ``to_q/to_k/to_v/to_out.0/conv1/conv2``."""
        if self.lora is None:
            return module
        from peft import LoraConfig, get_peft_model
        r, alpha, targets = self.lora
        if targets == LM_LORA_TARGETS:
            targets = self.net.lora_targets
        return get_peft_model(module, LoraConfig(r=r, lora_alpha=alpha, target_modules=targets,
                                                 init_lora_weights="gaussian"))

    def _set_scheduler(self, config: dict) -> None:
        from diffusers import DDIMScheduler

        if config.get("thresholding"):
            raise ConfigError("model: the scheduler config sets thresholding, which DDPO's DDIM step (and "
                              "policies/_image/sde.py::ddim_step) does not implement")
        self.scheduler_config = config
        offset = max(1, int(config.get("steps_offset", 0) or 0))
        sched = DDIMScheduler.from_config(config, steps_offset=offset)
        n = int(sched.config.num_train_timesteps)
        self.alphas_cumprod = sched.alphas_cumprod.float()
        self.init_noise_sigma = float(sched.init_noise_sigma)  # the pipelines' prepare_latents scale (DDIM: 1)
        self.clip, self.clip_range = bool(sched.config.clip_sample), float(sched.config.clip_sample_range)
        self.prediction_type = sched.config.prediction_type
        self.timesteps, self.eval_timesteps = [], []
        for steps, into in ((self.T, self.timesteps), (self.T_eval, self.eval_timesteps)):
            if steps > n:
                raise ConfigError(f"ddpm_steps / ddpm_eval_steps: at most the model's {n} training timesteps, got "
                                  f"{steps}")
            sched.set_timesteps(steps)
            into += [(int(t), int(t) - n // steps) for t in sched.timesteps]
            if not all(0 < t < n for t, _ in into):
                raise ConfigError(f"model: the DDIM timesteps for {steps} steps reach t = 0 (a step without "
                                  f"noise, sigma_t = 0) or leave 0..{n - 1}; the scheduler config's steps_offset "
                                  f"and timestep_spacing give {[t for t, _ in into]}")

    def save(self, module, path) -> None:
        """What ``--model PATH`` loads again: a bare ``UNet2DModel`` (the digits model, a model folder) as
        ``save_pretrained`` (config.json + diffusion_pytorch_model.safetensors) and the scheduler config it was
        loaded with (scheduler_config.json), plus the unconditional class it guided with (``grpolab_ddpm.json``,
        a class-conditional model); a pipeline as the user's pipeline folder with ``unet/`` replaced
        (``policies/_image/pipeline_folder.py::save_pipeline``), which its diffusers class loads."""
        self.net.save(module, path)

    def save_adapters(self, module, path) -> None:
        """A LoRA run's adapters beside the merged model: a pipeline's ``pytorch_lora_weights.safetensors``
        (``pipe.load_lora_weights(path)``), a bare UNet2DModel's PEFT folder ``path/adapter``."""
        self.net.save_adapters(module, path)

    # ---------------------------------------------------------------- acting
    def epsilon(self, module, x: torch.Tensor, t: torch.Tensor, cond) -> torch.Tensor:
        """ε_θ(x, t, c) for rows of x (integer timestep per row), float32, with classifier-free guidance when
        w != 1; ``cond``: class labels [R], a pipeline's text embeds (dict) or None (an unconditional UNet)."""
        return self.net.eps(module, x, t, cond, self.w)

    def _step(self, x, eps, t, t_prev, eta, **kw) -> sde.SDEStep:
        return sde.ddim_step(x, eps, t, t_prev, self.alphas_cumprod, eta, clip_sample=self.clip,
                             clip_range=self.clip_range, prediction_type=self.prediction_type, **kw)

    @torch.no_grad()
    def sample(self, module, rows, uids, *, group_offset=0, num_generations, temperature=None, generator=None,
               evaluation=False):
        """Images for ``rows`` by DDIM with η = ``ddpm_eta`` (training: step_data and per-step log-probs) or, with
        ``evaluation``, DDIM with η = ``ddpm_eval_eta`` from each row's fixed draws (log-probs 0)."""
        if not self.scheduler_config:
            raise RuntimeError("policy ddpm: load() the model before sampling (it reads the scheduler config)")
        counts = completion_counts(num_generations, len(rows))
        device = next(module.parameters()).device
        labels, cond, extra = self.net.conditions(rows, uids, counts, device)  # text: each prompt encoded once
        x = row_noise(rows, uids, counts, self.shape, generator, evaluation=evaluation,
                      same_in_group=False).to(device) * self.init_noise_sigma
        R = len(x)
        if evaluation:
            z = self.eval_noise(rows, uids, counts).to(device)  # [R, T_eval, *shape]
            for j, (t, t_prev) in enumerate(self.eval_timesteps):
                tt = torch.full((R,), t, device=device)
                x = self._step(x, self.epsilon(module, x, tt, cond), t, t_prev, self.eval_eta,
                               noise=z[:, j]).x_next
            return pack_images(rows, uids, counts, labels, self.net.decode(x), logprobs=torch.zeros(R, 1),
                               group_offset=group_offset, row_extra=extra)
        xs, nexts, lps = [], [], []
        for t, t_prev in self.timesteps:
            tt = torch.full((R,), t, device=device)
            out = self._step(x, self.epsilon(module, x, tt, cond), t, t_prev, self.eta, generator=generator)
            xs.append(x)
            nexts.append(out.x_next)
            lps.append(out.logprob)
            x = out.x_next
        ts = torch.tensor(self.timesteps, dtype=torch.long)  # [T, 2]
        step_data = {"x": torch.stack(xs, 1), "x_next": torch.stack(nexts, 1),
                     "t": ts[:, 0].expand(R, self.T).clone(), "t_prev": ts[:, 1].expand(R, self.T).clone()}
        return pack_images(rows, uids, counts, labels, self.net.decode(x), logprobs=torch.stack(lps, 1),
                           group_offset=group_offset, step_data=step_data, row_extra=extra)

    def eval_noise(self, rows, uids, counts) -> torch.Tensor:
        """The step noises ``[R, ddpm_eval_steps, *shape]`` of a held-out sample: zeros when ``ddpm_eval_eta`` is
        0; otherwise drawn, like the initial noise (``row_noise``), from the row's own seed (``held_out_seed``:
        its ``noise_seed``, else derived from its uid and prompt) + :data:`STEP_NOISE_OFFSET`, so a held-out row
        gets the same draws before and after training."""
        if self.eval_eta == 0:
            return torch.zeros(sum(counts), self.T_eval, *self.shape)
        out = []
        for row, uid, n in zip(rows, uids, counts):
            g = torch.Generator().manual_seed(held_out_seed(row, uid) + STEP_NOISE_OFFSET)
            out.append(torch.randn((n, self.T_eval, *self.shape), generator=g))
        return torch.cat(out)

    def offers(self) -> frozenset[str]:
        return frozenset({"step_mean", "step_std_dev"})

    def forward(self, module, mb, *, want: frozenset[str] = frozenset(), grad: bool = True) -> dict[str, Any]:
        """Per-step log-probs [R, T] of the stored transitions x_j -> x_{j+1} under ``module``; only the steps on
        ``completion_mask`` run through the network (0 elsewhere). ``step_mean`` [R, T, *x]: the step's mean
        μ_θ; ``step_std_dev`` [R, T]: the step std η·σ_t (``gaussian_mean_kl`` is then the exact Gaussian KL)."""
        device = next(module.parameters()).device
        R, T = mb.completion_mask.shape
        on = mb.completion_mask > 0
        rows, cols = on.nonzero(as_tuple=True)
        x = mb.step_data["x"][rows, cols].to(device)
        t = mb.step_data["t"][rows, cols].to(device)
        with torch.set_grad_enabled(grad):
            eps = self.epsilon(module, x, t, self.net.row_condition(mb.row_data, rows, device))
            out = self._step(x, eps, t, mb.step_data["t_prev"][rows, cols].to(device), self.eta,
                             x_next=mb.step_data["x_next"][rows, cols].to(device))
            return gaussian_step_outputs(R, T, rows, cols, out, want)

    def describe(self, batch, i: int) -> dict:
        """The asked class and the image as a 32x32 PNG data URI (the completions log, the report)."""
        return FlowMatchingPolicy.describe(self, batch, i)
