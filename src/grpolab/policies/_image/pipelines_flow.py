"""The diffusers flow-matching pipelines a rectified-flow image policy trains (``policies/_image/flow.py``): one small
adapter per pipeline class, holding what differs between them — loading, prompt encoding, the transformer call
(the velocity), the latent layout, the sigma schedule, decoding and the LoRA file. The SDE steps, the sampling loop,
``step_data`` and the log-probs stay in :class:`~grpolab.policies._image.flow.FlowMatchingPolicy`, the same for
every adapter (and for the built-in digits UNet).

- :class:`SD3Pipeline`: ``StableDiffusion3Pipeline`` (Stable Diffusion 3 / 3.5).
- :class:`FluxPipelineAdapter`: ``FluxPipeline`` (FLUX.1 [dev] with its guidance embedding, FLUX.1 [schnell]
  without one).

Every adapter keeps the pipeline's frozen parts (VAE, text encoders) on the pipeline object, outside the trained
module; the trained module is the pipeline's ``transformer`` in float32.
"""
from __future__ import annotations

from abc import ABC, abstractmethod

import math
from pathlib import Path

import torch

from ...errors import ConfigError
from . import sde

#: T5 tokens of a pipeline's prompt embedding (Flow-GRPO's compute_text_embeddings: max_sequence_length=128, in
#: scripts/train_sd3.py and scripts/train_flux.py alike)
PIPELINE_T5_TOKENS = 128
#: LoRA targets of an SD3 transformer when lora_target_modules is left at the causal LM's default (Flow-GRPO's
#: scripts/train_sd3.py)
SD3_LORA_TARGETS = ["attn.add_k_proj", "attn.add_q_proj", "attn.add_v_proj", "attn.to_add_out", "attn.to_k",
                    "attn.to_out.0", "attn.to_q", "attn.to_v"]
#: LoRA targets of a FLUX transformer likewise: Flow-GRPO's scripts/train_flux.py list, the attention projections of
#: the double-stream blocks (image and text streams; the single-stream blocks' attn.to_q/to_k/to_v match too) and
#: the feed-forwards of both streams of the double-stream blocks
FLUX_LORA_TARGETS = ["attn.to_k", "attn.to_q", "attn.to_v", "attn.to_out.0", "attn.add_k_proj", "attn.add_q_proj",
                     "attn.add_v_proj", "attn.to_add_out", "ff.net.0.proj", "ff.net.2", "ff_context.net.0.proj",
                     "ff_context.net.2"]


class FlowPipeline(ABC):
    """What :class:`FlowMatchingPolicy` asks of a diffusers flow-matching pipeline folder; subclasses fill in the
    class-specific parts. ``shape`` is one sample's state as the transformer takes it (what the SDE steps and
    ``step_data`` hold), ``noise_shape`` the initial noise as the pipeline draws it (:meth:`pack` maps one to the
    other)."""

    class_name = ""  #: the model_index.json _class_name
    label = ""  #: what the class is, for messages
    lora_targets: list = []
    embeds_guidance = False  #: the guidance scale is an input of the transformer (no CFG batch)

    def __init__(self, pipe, path: Path, flow_shift: float, log=print):
        self.pipe, self.path, self.flow_shift = pipe, Path(path), float(flow_shift)
        self.module = pipe.transformer.float()
        self._negative = None
        self.shape: tuple = ()
        self.noise_shape: tuple = ()

    # ---------------------------------------------------------------- layout
    def pack(self, noise: torch.Tensor) -> torch.Tensor:
        """Initial noise ``[R, *noise_shape]`` as states ``[R, *shape]``."""
        return noise

    def unpack(self, x: torch.Tensor) -> torch.Tensor:
        """States ``[R, *shape]`` as the VAE's latents ``[R, C, H, W]``."""
        return x

    @abstractmethod
    def sigmas(self, steps: int) -> torch.Tensor:
        """σ_0 = 1 > … > σ_steps = 0: the pipeline's own schedule for ``steps`` steps (see the subclass)."""
        ...

    # ---------------------------------------------------------------- conditions
    def frozen_to(self, device) -> None:
        from .pipeline_folder import frozen_to
        frozen_to(self.pipe, device)

    @abstractmethod
    def encode_unique(self, prompts: list[str], device) -> tuple[torch.Tensor, torch.Tensor]:
        """``(prompt_embeds, pooled_prompt_embeds)`` of distinct prompts by the pipeline's ``encode_prompt``."""
        ...

    def encode(self, prompts: list[str], device) -> dict:
        """``prompt_embeds`` [n, L, D] and ``pooled_prompt_embeds`` [n, P] (float32) of ``prompts`` by the
        pipeline's frozen text encoders, each distinct prompt once."""
        self.frozen_to(device)
        unique = list(dict.fromkeys(prompts))
        pe, pp = self.encode_unique(unique, device)
        at = torch.tensor([unique.index(p) for p in prompts], device=pe.device)
        return {"prompt_embeds": pe.float()[at], "pooled_prompt_embeds": pp.float()[at]}

    def negative(self, device) -> dict:
        """The empty prompt's embeds (classifier-free guidance's unconditional branch), cached."""
        if self._negative is None or self._negative["prompt_embeds"].device != torch.device(device):
            self._negative = self.encode([""], device)
        return self._negative

    # ---------------------------------------------------------------- the network
    @abstractmethod
    def call(self, module, x: torch.Tensor, sigma: torch.Tensor, cond: dict, w: float) -> torch.Tensor:
        """One transformer call at noise levels ``sigma`` [R], float32 output shaped like ``x``."""
        ...

    def velocity(self, module, x: torch.Tensor, sigma: torch.Tensor, cond: dict, w: float,
                 detach_uncond: bool = False) -> torch.Tensor:
        """v_θ(x, σ, text) in float32 whatever autocast is on; with w != 1 and no guidance embedding, classifier-
        free guidance v = v_u + w·(v_c − v_u), v_u under the empty prompt's embeds (one doubled batch,
        unconditional half first, as Flow-GRPO's train_sd3.py), v_u detached with ``detach_uncond``
        (``sde.guided``)."""
        with torch.autocast(device_type=x.device.type, enabled=False):
            sigma = sigma.float().to(x.device)
            cond = {k: cond[k].float() for k in ("prompt_embeds", "pooled_prompt_embeds")}
            if w == 1.0 or self.embeds_guidance:
                return self.call(module, x.float(), sigma, cond, w)
            neg = self.negative(x.device)
            both = {k: torch.cat([neg[k].expand(len(x), *neg[k].shape[1:]), cond[k]]) for k in cond}
            unc, con = self.call(module, torch.cat([x, x]).float(), torch.cat([sigma, sigma]), both, w).chunk(2)
            return sde.guided(unc, con, w, detach_uncond)

    # ---------------------------------------------------------------- images and files
    @torch.no_grad()
    def decode(self, x: torch.Tensor) -> torch.Tensor:
        """Images [R, 3, H, W] in [0, 1] of final states x: unpacked, ``latents / scaling_factor + shift_factor``,
        decoded by the VAE 8 at a time, ``(image / 2 + 0.5).clamp(0, 1)`` (the pipelines' postprocess)."""
        vae = self.pipe.vae
        self.frozen_to(x.device)
        sf, sh = vae.config.scaling_factor, getattr(vae.config, "shift_factor", None) or 0.0
        latents = self.unpack(x.float())
        out = [vae.decode((part / sf + sh).to(vae.dtype), return_dict=False)[0].float() for part in latents.split(8)]
        return (torch.cat(out) / 2 + 0.5).clamp(0, 1)

    def save_lora(self, module, path) -> None:
        """The PEFT adapters of ``module`` (a ``PeftModel`` around the transformer) as diffusers' LoRA file
        ``path/pytorch_lora_weights.safetensors`` (``<Pipeline>.save_lora_weights``, with the adapter's
        ``LoraConfig`` as metadata, so its rank and alpha load back): ``pipe.load_lora_weights(path)`` reads it."""
        from peft.utils import get_peft_model_state_dict
        from torch.nn.parallel import DistributedDataParallel

        if isinstance(module, DistributedDataParallel):
            module = module.module
        state = {k.removeprefix("base_model.model."): v.detach().float().cpu().contiguous()
                 for k, v in get_peft_model_state_dict(module).items()}
        config = module.peft_config["default"].to_dict()
        if isinstance(config.get("target_modules"), (set, list, tuple)):  # JSON metadata: a list, in order
            config["target_modules"] = sorted(config["target_modules"])
        type(self.pipe).save_lora_weights(Path(path), transformer_lora_layers=state,
                                          transformer_lora_adapter_metadata=config)


class SD3Pipeline(FlowPipeline):
    """``StableDiffusion3Pipeline``: latents ``[in_channels, sample_size, sample_size]`` of the transformer's
    config (16 × 128 × 128 for SD3 / 3.5: 1024 px), no packing; prompts by CLIP-L + CLIP-G + T5 (``encode_prompt``,
    128 T5 tokens as Flow-GRPO); the call ``transformer(hidden_states=x, timestep=1000·σ,
    encoder_hidden_states=..., pooled_projections=...)`` as StableDiffusion3Pipeline passes it (its scheduler's
    ``timesteps`` are σ·num_train_timesteps); guidance w != 1 by CFG with the empty prompt (Flow-GRPO's
    pipeline_with_logprob). Schedule: ``sde.flow_sigmas(T, flow_shift, schedule="diffusers")``, the
    StableDiffusion3Pipeline's own for a scheduler of shift ``flow_shift`` (the run says so at start when the
    folder's scheduler has another shift)."""

    class_name = "StableDiffusion3Pipeline"
    label = "Stable Diffusion 3 / 3.5"
    lora_targets = SD3_LORA_TARGETS

    def __init__(self, pipe, path: Path, flow_shift: float, log=print):
        super().__init__(pipe, path, flow_shift, log)
        c = self.module.config
        self.shape = self.noise_shape = (c.in_channels, c.sample_size, c.sample_size)
        shift = float(getattr(pipe.scheduler.config, "shift", 1.0))
        if shift != flow_shift:
            log(f"[grpolab] note: {path}/scheduler has shift {shift:g}; this run samples with flow_shift "
                f"{flow_shift:g} (set flow_shift: {shift:g} for the pipeline's own schedule)")

    def sigmas(self, steps: int) -> torch.Tensor:
        return sde.flow_sigmas(steps, self.flow_shift, schedule="diffusers")

    def encode_unique(self, prompts, device):
        pe, _, pp, _ = self.pipe.encode_prompt(prompt=prompts, prompt_2=None, prompt_3=None, device=device,
                                               do_classifier_free_guidance=False,
                                               max_sequence_length=PIPELINE_T5_TOKENS)
        return pe, pp

    def call(self, module, x, sigma, cond, w):
        return module(hidden_states=x, timestep=sigma * 1000, encoder_hidden_states=cond["prompt_embeds"],
                      pooled_projections=cond["pooled_prompt_embeds"]).sample.float()


class FluxPipelineAdapter(FlowPipeline):
    """``FluxPipeline`` (FLUX.1): the ``FluxTransformer2DModel`` is the trained module.

    - **Latents, packed**: the VAE's latent [C, H, W] (H = W = 2·(vae.sample_size // (2·vae_scale_factor)), the
      image size of ``vae/config.json``, 1024 px for FLUX.1 as FluxPipeline's default) is packed into 2×2 patches,
      ``[(H/2)(W/2), 4C]`` (``FluxPipeline._pack_latents``), with ``img_ids`` from
      ``FluxPipeline._prepare_latent_image_ids`` and ``txt_ids`` zeros [L, 3]; the initial noise is drawn as the
      pipeline draws it ([C, H, W]) and packed, and every SDE step, ``step_data`` and log-prob is on the packed
      state (the per-element mean log-density is the same in either layout).
    - **Text**: ``encode_prompt`` (CLIP-L's pooled output, T5's sequence, 128 T5 tokens as Flow-GRPO), each
      distinct prompt once per sampling call.
    - **The call** is FluxPipeline's: ``transformer(hidden_states=x, timestep=t/1000, guidance=...,
      pooled_projections=..., encoder_hidden_states=..., txt_ids=..., img_ids=...)`` with t = 1000·σ (so the
      timestep is σ). A transformer with ``guidance_embeds`` (FLUX.1 [dev]) gets ``guidance = guidance_scale``
      per row and no CFG batch (Flow-GRPO's and DanceGRPO's FLUX runs; FluxPipeline's default is 3.5, which
      the run's log recalls at start); one without (FLUX.1 [schnell]) runs true CFG with the empty
      prompt when w != 1 (FluxPipeline's true_cfg_scale with negative_prompt ""), else the plain call.
    - **Schedule**: FluxPipeline's sigmas are ``linspace(1, 1/T, T)`` time-shifted by the scheduler, then 0,
      which is ``sde.flow_sigmas(T, k, schedule="linspace")`` for the shift k. With ``use_dynamic_shifting``
      (FLUX.1 [dev]) the shift depends on the image: mu = ``calculate_shift(image tokens, base_image_seq_len,
      max_image_seq_len, base_shift, max_shift)`` as FluxPipeline computes it, and the exponential time shift
      e^mu/(e^mu + (1/u − 1)) is the SD3 shift k·u/(1 + (k−1)·u) with k = e^mu (k = mu for
      ``time_shift_type: linear``). So ``flow_shift`` maps thus: left at 1 (its default), k is the pipeline's
      own (e^mu, or the scheduler's ``shift`` when it does not shift dynamically); any other value is k itself
      (e.g. DanceGRPO's shift 3 on FLUX), and the run's log says which. Karras / exponential / beta sigmas and
      ``shift_terminal`` are not reproduced (a note says so).
    - **Decoding**: unpack (``FluxPipeline._unpack_latents``), ``latents / scaling_factor + shift_factor``,
      ``vae.decode``, ``(x / 2 + 0.5).clamp(0, 1)``.

    Provenance: the call, packing, ids, guidance and schedule are diffusers' FluxPipeline.__call__ (0.42); matched
    against the authors' FLUX code. Flow-GRPO (yifan123/flow_grpo, flow_grpo/diffusers_patch/
    flux_pipeline_with_logprob.py and scripts/train_flux.py, read in the fork zqqqqz2000/flow_grpo@6211705 and
    yifan123/flow_grpo@74db691): the same pipeline schedule (linspace(1, 1/T, T) with the pipeline's mu), the same
    call (guidance = config.sample.guidance_scale when guidance_embeds, timestep/1000, txt_ids zeros, no CFG),
    sde_step_with_logprob on the packed latents (sigma_max = scheduler.sigmas[1], our ``flow_grpo_step``),
    text embeddings with max_sequence_length 128, LoRA targets :data:`FLUX_LORA_TARGETS`; it decodes the last
    latents as here. DanceGRPO (XueZeyue/DanceGRPO@22b85ef, fastvideo/train_grpo_flux.py: flux_step,
    run_sample_step, grpo_one_step, sample_reference_model): the same packing and ids, guidance fixed at 3.5 (here
    guidance_scale, so --guidance_scale 3.5),
    timestep int(1000·σ)/1000 (here 1000·σ/1000, not rounded), sigmas sd3_time_shift(shift, linspace(1, 0, T+1))
    with args.shift (3 in its scripts; here flow_shift 3 gives exactly that schedule, the default is the
    pipeline's e^mu), init_same_noise (``flow_same_noise_in_group``), the whole transformer trained (no LoRA in
    that script), and it decodes the last step's x̂₀ = x − σ·v instead of the sampled x_T; its text embeddings are
    precomputed offline. Both run the transformer in bf16 autocast; here it runs in float32 (the policy is
    float32_only). Test: tests/test_flux_pipeline.py.
    """

    class_name = "FluxPipeline"
    label = "FLUX.1"
    lora_targets = FLUX_LORA_TARGETS

    def __init__(self, pipe, path: Path, flow_shift: float, log=print):
        super().__init__(pipe, path, flow_shift, log)
        c = self.module.config
        if c.patch_size != 1 or c.in_channels % 4:
            raise ConfigError(f"model: {path}/transformer/config.json has patch_size {c.patch_size} and in_channels "
                              f"{c.in_channels}; FluxPipeline packs 2x2 latent patches itself (patch_size 1, "
                              f"in_channels = 4 x the VAE's latent channels)")
        self.embeds_guidance = bool(c.guidance_embeds)
        size = pipe.vae.config.sample_size
        size = int(size[0] if isinstance(size, (list, tuple)) else size)
        self.pixels = size
        f = pipe.vae_scale_factor
        h = 2 * (size // (f * 2))
        if h < 2:
            raise ConfigError(f"model: {path}/vae/config.json has sample_size {size}, too small for a packed latent "
                              f"at VAE scale factor {f} (at least {4 * f} px)")
        self.noise_shape = (c.in_channels // 4, h, h)
        self.shape = ((h // 2) * (h // 2), c.in_channels)
        self.img_ids = pipe._prepare_latent_image_ids(1, h // 2, h // 2, "cpu", torch.float32)
        self.shift, why = self._shift(flow_shift)
        log(f"[grpolab] {path}: FLUX {size}x{size} px, {self.shape[0]} image tokens; sigma schedule time shift "
            f"{self.shift:.4g} ({why})")
        if c.guidance_embeds:
            log("[grpolab] note: this FLUX transformer embeds the guidance scale (guidance_embeds): guidance_scale is "
                "passed as its guidance input, no CFG batch (FluxPipeline's default is 3.5)")
        sched = pipe.scheduler.config
        extra = [k for k in ("use_karras_sigmas", "use_exponential_sigmas", "use_beta_sigmas", "shift_terminal",
                             "invert_sigmas", "use_flow_sigmas") if sched.get(k)]
        if extra:
            log(f"[grpolab] note: {path}/scheduler sets {', '.join(extra)}; this run samples the plain shifted "
                f"schedule (sde.flow_sigmas, schedule linspace)")

    def mu(self) -> float:
        """FluxPipeline's mu for this image size: ``calculate_shift`` of the packed sequence length."""
        s = self.pipe.scheduler.config
        base_len, max_len = s.get("base_image_seq_len", 256), s.get("max_image_seq_len", 4096)
        base, top = s.get("base_shift", 0.5), s.get("max_shift", 1.15)
        m = (top - base) / (max_len - base_len)
        return self.shape[0] * m + (base - m * base_len)

    def _shift(self, flow_shift: float) -> tuple[float, str]:
        s = self.pipe.scheduler.config
        if flow_shift != 1.0:
            return float(flow_shift), "flow_shift"
        if s.get("use_dynamic_shifting"):
            mu = self.mu()
            if s.get("time_shift_type", "exponential") == "linear":
                return mu, f"the scheduler's dynamic shift mu = {mu:.4g}, linear; set flow_shift to replace it"
            return math.exp(mu), (f"the scheduler's dynamic shift e^mu, mu = {mu:.4g} as FluxPipeline computes it; "
                                  f"set flow_shift to replace it")
        return float(s.get("shift", 1.0)), "the scheduler's shift"

    def sigmas(self, steps: int) -> torch.Tensor:
        return sde.flow_sigmas(steps, self.shift, schedule="linspace")

    def pack(self, noise):
        c, h, w = noise.shape[1:]
        return self.pipe._pack_latents(noise, len(noise), c, h, w)

    def unpack(self, x):
        return self.pipe._unpack_latents(x, self.pixels, self.pixels, self.pipe.vae_scale_factor)

    def encode_unique(self, prompts, device):
        pe, pp, _ = self.pipe.encode_prompt(prompt=prompts, prompt_2=None, device=device,
                                            max_sequence_length=PIPELINE_T5_TOKENS)
        return pe, pp

    def call(self, module, x, sigma, cond, w):
        pe = cond["prompt_embeds"]
        guidance = torch.full([1], w, device=x.device, dtype=torch.float32).expand(len(x)) \
            if self.embeds_guidance else None
        return module(hidden_states=x, timestep=(sigma * 1000) / 1000, guidance=guidance,
                      pooled_projections=cond["pooled_prompt_embeds"], encoder_hidden_states=pe,
                      txt_ids=torch.zeros(pe.shape[1], 3, device=x.device, dtype=pe.dtype),
                      img_ids=self.img_ids.to(x.device), return_dict=False)[0].float()


#: the pipeline classes a rectified-flow image policy trains, by model_index.json _class_name
ADAPTERS = {a.class_name: a for a in (SD3Pipeline, FluxPipelineAdapter)}


def load_flow_pipeline(policy: str, path, cfg, rows, eval_rows, text_prompt, *, flow_shift: float,
                       log=print) -> FlowPipeline:
    """The adapter of the pipeline folder ``path`` (model_index.json): its class one of :data:`ADAPTERS` (else
    refused naming the classes and, for another policy's class, that policy), every row with a text prompt, the
    pipeline loaded in float32 with its frozen parts frozen (``pipeline_folder.freeze_parts``: the VAE float32, the
    text encoders in the run's bf16 / fp16 dtype when it is one) and its transformer the trained module."""
    import diffusers

    from .pipeline_folder import check_text_rows, freeze_parts, pipeline_class, refuse_class

    path = Path(path)
    found = pipeline_class(path)
    if found not in ADAPTERS:
        refuse_class(policy, path, found, {k: a.label for k, a in ADAPTERS.items()})
    check_text_rows(rows, eval_rows, text_prompt)
    pipe = getattr(diffusers, found).from_pretrained(path)  # float32 unless cast below
    freeze_parts(pipe, cfg)
    return ADAPTERS[found](pipe, path, flow_shift, log=log)
