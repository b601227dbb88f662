"""The denoisers policy ``ddpm`` trains: what one ``--model`` is, how its UNet is called, what its latents decode to
and how it is saved. One class per kind of folder; the DDIM steps, log-probs and the sampling loop are the
policy's (``policy.py``), the same for all of them.

- :class:`ClassUNet`: a ``UNet2DModel`` on pixels, unconditional or class-conditional (``num_class_embeds``):
  the built-in ``digits`` model, a bare model folder (``config.json`` + weights + ``scheduler_config.json``,
  what :meth:`ClassUNet.save` writes) or a ``DDPMPipeline`` folder (``unet/`` + ``scheduler/``).
- :class:`TextUNet`: a ``StableDiffusionPipeline`` folder (SD 1.x and 2.x; 2.x's ``v_prediction`` scheduler
  configs are ``sde.ddim_step``'s): the ``UNet2DConditionModel`` in latent space is the module; the CLIP text
  encoder and the VAE stay frozen on the denoiser, outside it.
- :class:`XLTextUNet`: a ``StableDiffusionXLPipeline`` folder: two text encoders, pooled text embeds and
  ``add_time_ids`` passed as ``added_cond_kwargs``.

Classifier-free guidance (w = ``guidance_scale`` != 1) is ε̂ = ε_u + w·(ε_c − ε_u) on every kind: ε_u under the
empty prompt's embeds for a pipeline (DDPO's ``pipeline_with_logprob``; SDXL: zeros when its
``force_zeros_for_empty_prompt``, as the pipeline does), under the model's unconditional class for a
class-conditional UNet. That class is never guessed: the built-in digits model's is 10, a folder this policy saved
records its class in :data:`RECORD`, and any other class-conditional model needs ``ddpm_unconditional_class``
when w != 1.
"""
from __future__ import annotations

from abc import ABC, abstractmethod

import json
from pathlib import Path

import torch

from ...config import ConfigError
from ...generation.sampling import per_row
from ..base import repeat_rows, save_pretrained_folder, saved_folder
from .._image.flow import BUILT_IN, UNET_LORA_TARGETS, check_row_classes, condition_of, text_prompt
from .._image.pipeline_folder import (check_text_rows, freeze_parts, frozen_to, pipeline_class, refuse_class,
                                      save_pipeline)

#: the pipeline folders (model_index.json's _class_name) policy ddpm loads, and what they are
SUPPORTED = {"StableDiffusionPipeline": "Stable Diffusion 1.x / 2.x", "StableDiffusionXLPipeline": "SDXL",
             "DDPMPipeline": "a pixel-space UNet2DModel"}
#: LoRA targets of a Stable Diffusion UNet when lora_target_modules is left at the causal LM's default: the
#: attention projections ddpo-pytorch puts its LoRA processors on (every attention layer's to_q/to_k/to_v/to_out.0)
SD_LORA_TARGETS = ["to_q", "to_k", "to_v", "to_out.0"]
#: written beside a class-conditional UNet this policy saves: the class its guidance used as unconditional
RECORD = "grpolab_ddpm.json"
#: the built-in digits model's unconditional class (policies/_image/digits.py UNCOND: label dropout to it)
DIGITS_UNCONDITIONAL = 10
#: images decoded by the VAE at a time
DECODE_CHUNK = 8


def guided(call, w: float, cond_first: bool = False) -> torch.Tensor:
    """Classifier-free guidance on one doubled batch: ``call()`` returns [2R, ...], the unconditional half first
    (DDPO's order) or, with ``cond_first``, the conditional half first; returns ε_u + w·(ε_c − ε_u)."""
    a, b = call().float().chunk(2)
    cond, unc = (a, b) if cond_first else (b, a)
    return unc + w * (cond - unc)


class Denoiser(ABC):
    """What policy ddpm needs of a loaded model besides the DDIM step (the interface of the classes below)."""

    module: torch.nn.Module  #: the trained UNet (float32)
    scheduler_config: dict  #: the model's scheduler config (DDIM is built from it)
    shape: tuple  #: one sample's latent (or pixel) shape [C, H, W]
    lora_targets: list  #: LoRA targets when lora_target_modules is the causal LM's default

    @abstractmethod
    def conditions(self, rows, uids, counts, device):
        """``(labels, cond, extra)`` for one action per count: ``labels`` [R] the one prompt token of each
        action (a class, else the prompt's uid), ``cond`` what :meth:`eps` takes, ``extra`` the tensors kept in
        ``row_data`` for the forward (a pipeline's text embeds) or None."""
        ...

    @abstractmethod
    def row_condition(self, row_data: dict, rows: torch.Tensor, device):
        """The ``cond`` of rows ``rows`` of a batch, from its ``row_data`` (never re-encoded)."""
        ...

    @abstractmethod
    def eps(self, module, x: torch.Tensor, t: torch.Tensor, cond, w: float) -> torch.Tensor:
        """The network's output ε̂ for rows of x at integer timesteps t [R], with guidance w, float32."""
        ...

    @abstractmethod
    def decode(self, x: torch.Tensor) -> torch.Tensor:
        """Images [R, C, H, W] in [0, 1] of final samples x."""
        ...

    @abstractmethod
    def save(self, module, path) -> None:
        ...

    @abstractmethod
    def save_adapters(self, module, path) -> None:
        """The LoRA adapters of the PEFT-wrapped ``module`` in the format its library loads."""
        ...


def _sample_shape(config) -> tuple:
    s = config.sample_size
    h, w = (s, s) if isinstance(s, int) else tuple(s)
    return int(config.in_channels), int(h), int(w)


def _no_guidance_embedding(config, path) -> None:
    if getattr(config, "time_cond_proj_dim", None):
        raise ConfigError(f"model: {path}'s UNet takes a guidance embedding (time_cond_proj_dim "
                          f"{config.time_cond_proj_dim}: a distilled LCM-style model), which policy ddpm's DDIM "
                          f"sampler does not pass")


def peft_adapter_state(module) -> tuple[dict, dict]:
    """``(state, config)`` of a PEFT-wrapped module's one adapter: its LoRA tensors named as in the unwrapped
    model (PEFT's format, which diffusers' ``save_lora_weights`` takes) and its ``LoraConfig`` as a dict."""
    from peft.utils import get_peft_model_state_dict

    state = {k.removeprefix("base_model.model."): v.detach().float().cpu().contiguous()
             for k, v in get_peft_model_state_dict(module).items()}
    config = module.peft_config["default"].to_dict()
    config["target_modules"] = sorted(config["target_modules"]) if isinstance(config["target_modules"], set) \
        else config["target_modules"]
    return state, config


# ------------------------------------------------------------------------------------ pixel-space UNet2DModel
class ClassUNet(Denoiser):
    """A ``UNet2DModel`` predicting noise on pixels: unconditional (neither ``num_class_embeds`` nor
    ``class_embed_type``: the rows' prompt / label are ignored) or class-conditional on classes
    0..num_class_embeds−1 (each row's ``label``, else its prompt read as an integer). ``pipeline``: the
    ``DDPMPipeline`` folder it came from (saved as that folder with the UNet replaced), else None (a bare model
    folder: ``config.json`` + weights + ``scheduler_config.json``)."""

    lora_targets = UNET_LORA_TARGETS

    def __init__(self, module, scheduler_config: dict, *, pipeline: Path | None, unconditional: int | None):
        c = module.config
        self.module, self.scheduler_config, self.pipeline = module, scheduler_config, pipeline
        self.shape = _sample_shape(c)
        self.classes = c.num_class_embeds  # None: unconditional
        self.unconditional = unconditional

    def check(self, rows, eval_rows, w: float) -> None:
        """Guidance needs a condition to drop and, on a class-conditional model, its unconditional class; every
        row's class (first 1,000 rows of each part) is one of the model's, not the unconditional one."""
        if self.classes is None:
            if w != 1.0:
                raise ConfigError(f"guidance_scale: {w:g} guides a conditional model; this UNet2DModel is "
                                  f"unconditional (no num_class_embeds), so set guidance_scale: 1")
            return
        n, u = int(self.classes), self.unconditional
        if u is not None and not 0 <= u < n:
            raise ConfigError(f"ddpm_unconditional_class: {u} is not one of the model's classes 0..{n - 1}")
        if w != 1.0 and u is None:
            raise ConfigError(f"guidance_scale: {w:g} needs the class-conditional model's unconditional class "
                              f"(the class embedding it was trained on for dropped labels), which is not "
                              f"guessed: set ddpm_unconditional_class to one of its classes 0..{n - 1}, or "
                              f"guidance_scale: 1")
        top = n - 2 if u == n - 1 else n - 1  # the last embedding as the unconditional class is not asked for
        check_row_classes(rows, eval_rows, top + 1, None if u is None else (u, "ddpm_unconditional_class"))

    def conditions(self, rows, uids, counts, device):
        if self.classes is None:  # the prompt uid as the action's prompt token; nothing conditions the UNet
            return repeat_rows(torch.tensor(uids, device=device), counts), None, None
        labels = torch.tensor(per_row([condition_of(r) for r in rows], counts), device=device)
        return labels, labels, None

    def row_condition(self, row_data, rows, device):
        return None if self.classes is None else row_data["cond"][rows].to(device)

    def eps(self, module, x, t, cond, w):
        with torch.autocast(device_type=x.device.type, enabled=False):
            t = t.long().to(x.device)
            if cond is None:
                return module(x.float(), t).sample.float()
            if w == 1.0:
                return module(x.float(), t, class_labels=cond).sample.float()
            return guided(lambda: module(torch.cat([x, x]).float(), torch.cat([t, t]), class_labels=torch.cat(
                [cond, torch.full_like(cond, self.unconditional)])).sample, w, cond_first=True)

    def decode(self, x):
        """x clipped to [−1, 1] and mapped to [0, 1] (``DDPMPipeline``'s (x/2 + 0.5).clamp(0, 1))."""
        return (x.clamp(-1, 1) + 1) / 2

    def save(self, module, path) -> None:
        """A bare folder: ``save_pretrained`` and the scheduler config it was loaded with
        (``scheduler_config.json``); a ``DDPMPipeline``'s: its folder with ``unet/`` replaced. Beside a
        class-conditional UNet with an unconditional class: :data:`RECORD` naming it."""
        if self.pipeline is None:
            at = save_pretrained_folder(module, path)
            (at / "scheduler_config.json").write_text(json.dumps(self.scheduler_config, indent=2,
                                                                 sort_keys=True) + "\n")
        else:
            save_pipeline(self.pipeline, path, "unet", module)
            at = Path(path) / "unet"
        if self.classes is not None and self.unconditional is not None:
            (at / RECORD).write_text(json.dumps({"unconditional_class": self.unconditional}) + "\n")

    def save_adapters(self, module, path) -> None:
        """PEFT's adapter folder (``adapter_config.json`` + ``adapter_model.safetensors``) in ``path/adapter``:
        diffusers loads no LoRA into a ``UNet2DModel``; ``peft.PeftModel.from_pretrained(base_unet,
        path/"adapter")`` does."""
        module.save_pretrained(Path(path) / "adapter", safe_serialization=True)


def _recorded_unconditional(folder: Path) -> int | None:
    record = folder / RECORD
    return int(json.loads(record.read_text())["unconditional_class"]) if record.exists() else None


def load_class_unet(folder: Path, scheduler_folder: Path, pipeline: Path | None, unconditional: int | None):
    """A :class:`ClassUNet` from ``folder`` (the UNet's config.json + weights) and the scheduler config in
    ``scheduler_folder``; ``unconditional`` (``ddpm_unconditional_class``) wins over the folder's record."""
    from diffusers import DDIMScheduler, UNet2DModel

    found = json.loads((folder / "config.json").read_text()).get("_class_name", "UNet2DModel")
    if found != "UNet2DModel":
        raise ConfigError(f"model: {folder}/config.json holds a {found}; policy ddpm loads a UNet2DModel folder "
                          f"or the pipeline folders {', '.join(SUPPORTED)} (model_index.json)")
    module = UNet2DModel.from_pretrained(folder, torch_dtype=torch.float32).eval().float()
    c = module.config
    if c.num_class_embeds is None and c.class_embed_type is not None:
        raise ConfigError(f"model: {folder}'s UNet2DModel has class_embed_type {c.class_embed_type!r} without "
                          f"num_class_embeds (a continuous condition), which policy ddpm does not pass")
    u = unconditional if unconditional is not None else _recorded_unconditional(folder)
    return ClassUNet(module, dict(DDIMScheduler.load_config(scheduler_folder)), pipeline=pipeline,
                     unconditional=u)


# ------------------------------------------------------------------------------------ Stable Diffusion (latents)
class TextUNet(Denoiser):
    """A ``StableDiffusionPipeline`` (SD 1.x / 2.x): ``unet(x, t, encoder_hidden_states=prompt_embeds)`` on
    latents ``[unet.in_channels, sample_size, sample_size]``; prompts encoded by the pipeline's own frozen CLIP
    text encoder (``encode_prompt``, each distinct prompt once per sampling call); images the VAE's decoding of
    ``latents / scaling_factor``, (x/2 + 0.5).clamp(0, 1)."""

    lora_targets = SD_LORA_TARGETS
    pipeline_class = "StableDiffusionPipeline"
    embed_keys = ("prompt_embeds",)

    def __init__(self, pipe, source: Path):
        self.pipe, self.pipeline = pipe, source
        self.module = pipe.unet.float()
        _no_guidance_embedding(self.module.config, source)
        self.shape = _sample_shape(self.module.config)
        from diffusers import DDIMScheduler
        self.scheduler_config = dict(DDIMScheduler.load_config(source / "scheduler"))
        self._negative = None

    def encode(self, prompts: list[str], device) -> dict:
        """``prompt_embeds`` [n, L, D] (float32) of ``prompts``, each distinct prompt encoded once."""
        frozen_to(self.pipe, device)
        unique = list(dict.fromkeys(prompts))
        pe, _ = self.pipe.encode_prompt(unique, device, 1, False)
        at = torch.tensor([unique.index(p) for p in prompts], device=pe.device)
        return {"prompt_embeds": pe.float()[at]}

    def negative(self, device) -> dict:
        """The unconditional embeds of guidance: the empty prompt's (DDPO's ``neg_prompt_embed``), cached."""
        if self._negative is None or self._negative["prompt_embeds"].device != torch.device(device):
            self._negative = self.encode([""], device)
        return self._negative

    def conditions(self, rows, uids, counts, device):
        cond = self.encode(per_row([text_prompt(r) for r in rows], counts), device)
        return repeat_rows(torch.tensor(uids, device=device), counts), cond, cond

    def row_condition(self, row_data, rows, device):
        return {k: row_data[k][rows].to(device) for k in self.embed_keys}

    def unet_kwargs(self, cond: dict, n: int, device) -> dict:
        """The UNet's condition arguments for ``n`` rows of ``cond``."""
        return {"encoder_hidden_states": cond["prompt_embeds"].float()}

    def eps(self, module, x, t, cond, w):
        with torch.autocast(device_type=x.device.type, enabled=False):
            t = t.long().to(x.device)
            if w == 1.0:
                return module(x.float(), t, **self.unet_kwargs(cond, len(x), x.device)).sample.float()
            neg = {k: v.expand(len(x), *v.shape[1:]) for k, v in self.negative(x.device).items()}
            both = {k: torch.cat([neg[k], cond[k]]) for k in self.embed_keys}
            return guided(lambda: module(torch.cat([x, x]).float(), torch.cat([t, t]),
                                         **self.unet_kwargs(both, 2 * len(x), x.device)).sample, w)

    @torch.no_grad()
    def decode(self, x):
        vae = self.pipe.vae
        frozen_to(self.pipe, x.device)
        out = [vae.decode(self.unscale(part.float()).to(vae.dtype), return_dict=False)[0].float()
               for part in x.split(DECODE_CHUNK)]
        return (torch.cat(out) / 2 + 0.5).clamp(0, 1)

    def unscale(self, x):
        """Latents as the VAE decodes them: x / scaling_factor (``StableDiffusionPipeline``)."""
        return x / self.pipe.vae.config.scaling_factor

    def save(self, module, path) -> None:
        """The source pipeline folder with ``unet/`` replaced by ``module`` (float32)."""
        save_pipeline(self.pipeline, path, "unet", module)

    def save_adapters(self, module, path) -> None:
        """diffusers' ``pytorch_lora_weights.safetensors`` in ``path`` (the pipeline class's
        ``save_lora_weights``, with the LoRA config as metadata so lora_alpha survives), which
        ``pipe.load_lora_weights(path)`` reads."""
        import diffusers

        state, config = peft_adapter_state(module)
        getattr(diffusers, self.pipeline_class).save_lora_weights(path, unet_lora_layers=state,
                                                                  unet_lora_adapter_metadata=config)


class XLTextUNet(TextUNet):
    """A ``StableDiffusionXLPipeline``: ``encode_prompt``'s two encoders (prompt_embeds concatenated, pooled
    ``text_embeds`` from text_encoder_2), ``time_ids`` from the pipeline's ``_get_add_time_ids`` (original size =
    target size = sample_size·vae_scale_factor, crop (0, 0)), passed as ``added_cond_kwargs``; the unconditional
    embeds are zeros when the folder's ``force_zeros_for_empty_prompt`` (the pipeline's default), else the empty
    prompt's. Decoding uses the VAE's ``latents_mean`` / ``latents_std`` where its config has them."""

    pipeline_class = "StableDiffusionXLPipeline"
    embed_keys = ("prompt_embeds", "pooled_prompt_embeds")

    def __init__(self, pipe, source: Path):
        super().__init__(pipe, source)
        size = pipe.default_sample_size * pipe.vae_scale_factor
        proj = int(pipe.text_encoder_2.config.projection_dim)
        self.time_ids = pipe._get_add_time_ids((size, size), (0, 0), (size, size), dtype=torch.float32,
                                               text_encoder_projection_dim=proj)  # [1, 6]

    def encode(self, prompts, device):
        frozen_to(self.pipe, device)
        unique = list(dict.fromkeys(prompts))
        pe, _, pooled, _ = self.pipe.encode_prompt(prompt=unique, device=device, num_images_per_prompt=1,
                                                   do_classifier_free_guidance=False)
        at = torch.tensor([unique.index(p) for p in prompts], device=pe.device)
        return {"prompt_embeds": pe.float()[at], "pooled_prompt_embeds": pooled.float()[at]}

    def negative(self, device):
        if self._negative is None or self._negative["prompt_embeds"].device != torch.device(device):
            empty = self.encode([""], device)
            zeros = self.pipe.config.force_zeros_for_empty_prompt
            self._negative = {k: torch.zeros_like(v) for k, v in empty.items()} if zeros else empty
        return self._negative

    def unet_kwargs(self, cond, n, device):
        return {"encoder_hidden_states": cond["prompt_embeds"].float(),
                "added_cond_kwargs": {"text_embeds": cond["pooled_prompt_embeds"].float(),
                                      "time_ids": self.time_ids.to(device).expand(n, -1)}}

    def unscale(self, x):
        c = self.pipe.vae.config
        mean, std = getattr(c, "latents_mean", None), getattr(c, "latents_std", None)
        if mean is None or std is None:
            return x / c.scaling_factor
        shape = (1, -1, 1, 1)
        mean, std = (torch.tensor(v, device=x.device, dtype=x.dtype).view(shape) for v in (mean, std))
        return x * std / c.scaling_factor + mean


def load_text_pipeline(found: str, path: Path, cfg, rows, eval_rows):
    """A :class:`TextUNet` / :class:`XLTextUNet` of the pipeline folder ``path`` (class ``found``): every row
    needs a text prompt; the frozen parts on the denoiser (VAE float32, text encoders in the run's half dtype
    if it has one); a safety checker in the folder is not loaded (the reward sees the raw images, as DDPO)."""
    import diffusers

    check_text_rows(rows, eval_rows, text_prompt)
    index = json.loads((path / "model_index.json").read_text())
    skip = {"safety_checker": None, "requires_safety_checker": False} if "safety_checker" in index else {}
    pipe = getattr(diffusers, found).from_pretrained(path, **skip)
    freeze_parts(pipe, cfg)
    return (XLTextUNet if found == "StableDiffusionXLPipeline" else TextUNet)(pipe, path)


# ------------------------------------------------------------------------------------ --model
def load_denoiser(model: str, cfg, rows, eval_rows, *, guidance_scale: float, unconditional_class: int | None,
                  log=print) -> Denoiser:
    """The denoiser of ``--model``: ``digits`` (the built-in model, unconditional class 10), a pipeline folder
    (``model_index.json``: :data:`SUPPORTED`) or a bare ``UNet2DModel`` folder with ``scheduler_config.json``;
    its rows checked (text prompts, classes)."""
    if model in BUILT_IN:
        from .._image.digits import digits_model_path
        path = digits_model_path("ddpm", log=log)
        u = DIGITS_UNCONDITIONAL if unconditional_class is None else unconditional_class
        net = load_class_unet(path, path, None, u)
    else:
        path = Path(model)
        found = pipeline_class(path)
        if found in ("StableDiffusionPipeline", "StableDiffusionXLPipeline"):
            return load_text_pipeline(found, path, cfg, rows, eval_rows)
        if found == "DDPMPipeline":
            net = load_class_unet(path / "unet", path / "scheduler", path, unconditional_class)
        elif found is not None:
            refuse_class("ddpm", path, found, SUPPORTED)
        else:
            saved_folder(model, "ddpm", ("config.json", "scheduler_config.json"),
                         "'digits' (the built-in tiny model), a folder with a diffusers UNet2DModel (config.json + "
                         "safetensors) and its DDPM/DDIM scheduler (scheduler_config.json), or a diffusers "
                         f"pipeline folder (model_index.json: {', '.join(SUPPORTED)})")
            net = load_class_unet(path, path, None, unconditional_class)
    net.check(rows, eval_rows, guidance_scale)
    return net
