"""A rectified-flow image generator (``diffusers``), sampled by an SDE so that every denoising step has a Gaussian
log-prob: Flow-GRPO's construction; one step of the ``[rows, steps]`` layout is one denoising step."""
from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from ...batch import RolloutBatch
from ...config import ConfigError
from ...generation.counting import GENERATED
from ...generation.sampling import completion_counts, per_row
from . import sde
from .pipelines_flow import PIPELINE_T5_TOKENS, SD3_LORA_TARGETS  # noqa: F401  (kept importable from here)
from ...registry import declared_params, param
from ..base import PolicyBase, fanned_columns, group_identity, held_out_seed, repeat_rows

BUILT_IN = ("digits", "tiny")  #: model names of the built-in class-conditional 8x8 digits model
#: LoRA targets of a UNet when lora_target_modules is left at the causal LM's default (docs/design/policies.md
#: §1.2); a pipeline's transformer has its adapter's (pipelines_flow.py: SD3_LORA_TARGETS, FLUX_LORA_TARGETS)
UNET_LORA_TARGETS = ["to_q", "to_k", "to_v", "to_out.0", "conv1", "conv2"]
LM_LORA_TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]


def condition_of(row: dict, where: str = "") -> int:
    """The class label a row asks for: its ``label`` column, else its ``prompt`` read as an integer."""
    value = row.get("label", row.get("prompt"))
    try:
        return int(value)
    except (TypeError, ValueError):
        raise ConfigError(f"{where or 'a data row'}: an image policy's row names its class in a 'label' column (an "
                          f"integer) or as its prompt (e.g. \"3\"); got label/prompt {value!r}") from None


def image_rows(images: torch.Tensor) -> list:
    """``[R, C, H, W]`` images in [0, 1] as the reward functions receive them: float32 NumPy ``[H, W, C]``."""
    return [img.permute(1, 2, 0).float().cpu().numpy() for img in images]


def row_noise(rows: list[dict], uids: list[int], counts: list[int], shape: tuple, generator, *, evaluation: bool,
              same_in_group: bool) -> torch.Tensor:
    """Initial noise ``[R, *shape]``: drawn from ``generator`` (one per row, or one per group when
    ``same_in_group``); for evaluation, from each row's own seed (``base.held_out_seed``: its ``noise_seed``,
    else derived from its uid and prompt), so a held-out row is denoised from the same noise before and after
    training and in every ``grpolab eval`` of the model."""
    on = {"device": generator.device} if generator is not None else {}  # an accelerator's generator draws there
    out = []
    for row, uid, n in zip(rows, uids, counts):
        if evaluation:
            g = torch.Generator().manual_seed(held_out_seed(row, uid))
            out.append(torch.randn((n, *shape), generator=g))
        elif same_in_group:
            out.append(torch.randn((1, *shape), generator=generator, **on).expand(n, *shape).clone().cpu())
        else:
            out.append(torch.randn((n, *shape), generator=generator, **on).cpu())
    return torch.cat(out)


def text_prompt(row: dict, where: str = "") -> str:
    """The text prompt of a row for a text-conditioned pipeline: its ``prompt`` column, a non-empty string."""
    value = row.get("prompt")
    if not isinstance(value, str) or not value.strip():
        raise ConfigError(f"{where or 'a data row'}: a diffusers pipeline (model_index.json) is conditioned on text; "
                          f"each row needs a 'prompt' column with a non-empty string, got {value!r}")
    return value


def check_row_classes(rows: list[dict], eval_rows: list[dict], classes: int,
                      unconditional: tuple[int, str] | None = None) -> None:
    """Every row's class (``condition_of``) is one of a class-conditional model's ``classes`` 0..n-1 and not
    its unconditional class (``unconditional``: the class and the config key that names it), if given. The first
    1,000 rows of each part are checked."""
    for where, part in (("train", rows), ("held-out", eval_rows)):
        for i, row in enumerate(part[:1000]):
            c = condition_of(row, f"{where} row {i}")
            if not 0 <= c < classes:
                raise ConfigError(f"{where} row {i}: class {c} is outside the model's classes 0..{classes - 1}")
            if unconditional is not None and c == unconditional[0]:
                raise ConfigError(f"{where} row {i}: class {c} is the model's unconditional class "
                                  f"({unconditional[1]}), not a class to ask for")


def check_class_rows(module, rows: list[dict], eval_rows: list[dict]) -> int:
    """Every row's class (``condition_of``) is one of ``module``'s classes 0..n-1, the last class embedding
    being the unconditional label; returns n. The first 1,000 rows of each part are checked."""
    classes = (module.config.num_class_embeds or 1) - 1
    check_row_classes(rows, eval_rows, classes)
    return classes


def check_sampler(prefix: str, steps: int, eval_steps: int, noise_key: str, noise: float, why: str) -> None:
    """A stochastic denoising sampler's settings: ``{prefix}_steps`` / ``{prefix}_eval_steps`` (the denoising
    steps of a training and of a held-out sample) at least 1 each, and its noise ``noise_key`` above 0 (a
    deterministic step has no log-prob), refused with ``why``."""
    if steps < 1 or eval_steps < 1:
        raise ConfigError(f"{prefix}_steps / {prefix}_eval_steps: at least 1 denoising step, got {steps} / "
                          f"{eval_steps}")
    if noise <= 0:
        raise ConfigError(f"{noise_key}: {why}, got {noise}")


def load_class_unet(policy: str, model: str, kind: str, log=print):
    """A class-conditional ``UNet2DModel`` in float32: the built-in digits model of ``kind`` when ``model`` is
    ``digits`` / ``tiny``, else the folder ``model`` (``config.json`` + safetensors), refused naming ``policy``."""
    from diffusers import UNet2DModel

    if model in BUILT_IN:
        from .digits import load_digits_model
        return load_digits_model(kind, log=log)
    path = Path(model)
    if not (path / "config.json").exists():
        raise ConfigError(f"model: policy {policy} loads 'digits' (the built-in tiny model) or a folder with a "
                          f"diffusers UNet2DModel (config.json + safetensors); {path} has no config.json")
    return UNet2DModel.from_pretrained(path, torch_dtype=torch.float32)


def unet_velocity(module, x: torch.Tensor, sigma: torch.Tensor, labels: torch.Tensor, w: float,
                  detach_uncond: bool = False) -> torch.Tensor:
    """v_θ(x, σ, c) of a class-conditional ``UNet2DModel`` for rows of x (σ per row, timestep 1000·σ), in
    float32 whatever autocast is on; with w != 1 classifier-free guidance v_u + w·(v_c − v_u), v_u under the
    unconditional label 10 (detached from the gradient with ``detach_uncond``: ``sde.guided``)."""
    with torch.autocast(device_type=x.device.type, enabled=False):
        t = (sigma * 1000).float().to(x.device)
        if w == 1.0:
            return module(x.float(), t, class_labels=labels).sample.float()
        both = module(torch.cat([x, x]).float(), torch.cat([t, t]),
                      class_labels=torch.cat([labels, torch.full_like(labels, 10)])).sample.float()
        cond, unc = both.chunk(2)
        return sde.guided(unc, cond, w, detach_uncond)


def gaussian_step_outputs(R: int, T: int, rows: torch.Tensor, cols: torch.Tensor, out, want: frozenset,
                          logprob: torch.Tensor | None = None) -> dict:
    """A Gaussian-step policy's forward result from its on-mask steps (``rows``, ``cols``; ``out`` an
    ``images.sde.SDEStep`` of those steps): ``logprobs`` [R, T] (``logprob`` overrides ``out.logprob``), and on
    request ``step_mean`` [R, T, *x] and ``step_std_dev`` [R, T]; 0 off the mask."""
    lp = out.logprob if logprob is None else logprob
    device = lp.device
    result = {"logprobs": torch.zeros(R, T, device=device, dtype=lp.dtype).index_put((rows, cols), lp)}
    if "step_mean" in want:
        mean = torch.zeros(R, T, *out.mean.shape[1:], device=device, dtype=out.mean.dtype)
        result["step_mean"] = mean.index_put((rows, cols), out.mean)
    if "step_std_dev" in want:
        result["step_std_dev"] = torch.zeros(R, T, device=device).index_put((rows, cols), out.std_dev_t.float())
    return result


def pack_steps(rows: list[dict], uids: list[int], counts: list[int], *, prompt_ids: torch.Tensor, completion: list,
               logprobs: torch.Tensor, group_offset: int, step_data: dict | None, row_data: dict) -> RolloutBatch:
    """A RolloutBatch of actions of T steps each (prompt-major): one step per column of ``logprobs`` [R, T], every
    step on the mask, ``prompt_ids`` [R, 1] the one prompt token, data columns repeated per action,
    ``completion`` what the reward functions receive, ``step_data`` moved to the CPU (an image policy's
    denoising steps: :func:`pack_images`; ddpm_planner's trajectories)."""
    R, T = logprobs.shape
    GENERATED.add(R, R * T)  # the run's budgets count samples and steps (max_tokens counts denoising steps)
    columns = fanned_columns(rows, counts)
    columns["prompt"] = per_row([str(r.get("prompt", "")) for r in rows], counts)
    columns["completion"] = completion
    ones = torch.ones(R, T)
    return RolloutBatch(
        prompt_ids=prompt_ids, prompt_mask=torch.ones(R, 1, dtype=torch.long),
        completion_ids=torch.arange(T).expand(R, T).clone(), completion_mask=ones,
        behavior_logprobs=logprobs.float().cpu(), completion_attention_mask=ones.long(),
        truncated=torch.zeros(R, dtype=torch.bool), columns=columns, **group_identity(counts, uids, group_offset),
        step_data={k: v.cpu() for k, v in (step_data or {}).items()}, row_data=row_data)


def pack_images(rows: list[dict], uids: list[int], counts: list[int], labels: torch.Tensor, images: torch.Tensor, *,
                logprobs: torch.Tensor, group_offset: int, step_data: dict | None = None,
                row_extra: dict | None = None) -> RolloutBatch:
    """A RolloutBatch of image actions (:func:`pack_steps`): the class label as the one prompt token, ``row_data``
    ``cond`` and ``images`` ([R, C, H, W] in [0, 1]) plus ``row_extra`` (a pipeline's text embeds),
    ``completion`` = the images as :func:`image_rows`."""
    return pack_steps(rows, uids, counts, prompt_ids=labels[:, None].cpu(), completion=image_rows(images),
                      logprobs=logprobs, group_offset=group_offset, step_data=step_data,
                      row_data={"cond": labels.cpu(), "images": images.float().cpu(),
                                **{k: v.cpu() for k, v in (row_extra or {}).items()}})


def check_image_policy(cfg) -> None:
    """Settings an image policy cannot work with, refused when the config is built."""
    if cfg.beta > 0:
        raise ConfigError(f"beta: the token KL estimators ({cfg.kl_estimator}) on policy {cfg.policy}'s per-step "
                          f"log-probs (averaged over pixels) are no paper's KL; set beta: 0 and add "
                          f"regularizers: [gaussian_mean_kl] (Flow-GRPO's KL between the policy's and the "
                          f"reference's step means; its weight is gaussian_kl_beta)")


class FlowMatchingPolicy(PolicyBase):
    """A class-conditional rectified-flow image model (a ``diffusers`` ``UNet2DModel``): images drawn by an SDE
    whose every denoising step is a Gaussian, so GRPO's per-step ratios exist (Flow-GRPO's construction).

    Schedule: σ_0 = 1 > σ_1 > ... > σ_T = 0, diffusers' ``FlowMatchEulerDiscreteScheduler`` sigmas for
    ``flow_steps`` steps and ``flow_shift`` (``policies/_image/sde.py::flow_sigmas``, schedule "diffusers"); the network
    gets timestep 1000·σ and the class label, v = v_θ(x_j, σ_j, c) (with ``guidance_scale`` w != 1:
    v = v_u + w·(v_c − v_u), v_u under the unconditional label 10; ``cfg_detach_uncond`` below). Step j (one
    column) goes from x_j at σ_j to x_{j+1} at σ_{j+1} by ``flow_sde``:

    - ``flow_grpo``: Flow-GRPO's SDE step (``sde.flow_grpo_step``; noise level a = ``flow_noise_level``);
    - ``dance``: DanceGRPO's step (``sde.dance_step``, η = ``flow_noise_level``);
    - ``cps``: Flow-GRPO's coefficients-preserving step (``sde.cps_step``);

    and log π(x_{j+1} | x_j, c) is the Gaussian log-density averaged over the image's elements (mean, not sum,
    as in the authors' code). ``step_data`` keeps x_j, x_{j+1}, σ_j, σ_{j+1} of every step, so the log-probs
    are recomputed under new weights from the stored pairs, steps one at a time or any subset (only the steps
    on the loss mask are run). Evaluation (``evaluation=True``) is the Euler ODE (a = 0) for
    ``flow_eval_steps`` steps from each row's fixed noise (its ``noise_seed``, else derived from the row:
    ``base.held_out_seed``). Images are x_T clipped to [−1, 1] and mapped to
    [0, 1]; reward functions receive them as float32 NumPy ``[H, W, C]``.

    Guidance in the training forward (w != 1, no FLUX guidance embedding): the log-prob's gradient goes through
    both branches by default, w·∂v_c + (1 − w)·∂v_u, as Flow-GRPO's first release and its current scripts
    (scripts/train_sd3.py, train_sd3_fast.py, train_sd3_gardo.py: ``noise_pred_uncond + guidance_scale *
    (noise_pred_text - noise_pred_uncond)``) and DanceGRPO's guided scripts (train_grpo_sd.py,
    train_grpo_wan_2_1.py) compute it. ``cfg_detach_uncond: true`` is the form of Flow-GRPO's train_sd3.py from
    commit 2d76907 (2025-07-15) until a later revision dropped it: ``noise_pred_uncond.detach()``, the gradient
    w·∂v_c only, i.e. the update moves the conditional prediction alone and treats the unconditional one as a
    fixed baseline. Values (log-probs, ratios, samples) are the same either way; sampling runs without a
    gradient, so only the update differs (``sde.guided``).

    The forward runs in float32 whatever the run's ``dtype`` (Flow-GRPO computes the log-prob in float32: bf16
    overflows). ``temperature`` does not apply (the SDE's noise level is ``flow_noise_level``).

    ``model`` may also be a diffusers pipeline folder (``model_index.json``) of a Stable Diffusion 3 / 3.5 or a
    FLUX.1 pipeline: the same steps with the pipeline's transformer as the module, text prompts encoded once per
    sampling call into ``row_data`` (``prompt_embeds``, ``pooled_prompt_embeds``), the final latents decoded by
    the frozen VAE; what differs between the two classes (latent layout — FLUX packs 2x2 patches —, the
    transformer call, guidance, the sigma schedule, decoding, the LoRA file) is one adapter per class in
    ``policies/_image/pipelines_flow.py`` (:meth:`load_pipeline`, docs/images.md). ``use_lora``: PEFT adapters
    on the UNet or transformer (:meth:`prepare`); a pipeline's final folder also gets them in diffusers' LoRA
    format (:meth:`save_adapters`).

    Paper: Liu et al., "Flow-GRPO: Training Flow Matching Models via Online RL", arXiv:2505.05470 (the anchor
    image recipe, not a seed).

    Provenance: authors' code — https://github.com/yifan123/flow_grpo, flow_grpo/diffusers_patch/sd3_sde_with_logprob.py
    (sde_step_with_logprob, sde_type 'sde' and 'cps'; checked numerically against it, policies/_image/sde.py) and
    https://github.com/XueZeyue/DanceGRPO fastvideo/train_grpo_flux.py (flux_step) for 'dance'; the guidance of the
    training forward as scripts/train_sd3.py compute_log_prob (both branches differentiated at the first release
    and at 74db691; v_u detached at 2d76907..ac4c86e: cfg_detach_uncond); the sampling loop,
    the tiny class-conditional UNet and the evaluation ODE are grpolab's (pipelines: pipelines_flow.py, where the
    FLUX adapter says what it matches of Flow-GRPO's and DanceGRPO's FLUX code; tests/test_flow_pipeline.py,
    tests/test_flux_pipeline.py).
    Test: tests/test_image_policies.py::test_a_step_logprob_is_the_hand_gaussian,
    tests/test_flow_cfg_detach.py::test_the_training_logprob_gradient_by_hand,
    tests/test_flow_cfg_detach.py::test_unet_velocity_gradient_is_w_times_the_conditional_branch_when_detached.
    """

    step = "denoising step"
    capabilities = frozenset({"gaussian_steps", "flow_matching", "images"})
    description = "an image generator by rectified flow (diffusers); one step = one SDE denoising step"
    default_model = "digits"
    default_task = "digits"  # the task a run with this policy and no --task / --data trains on
    float32_only = True
    steps_key = "flow_steps"  # the columns of a training sample (denoising_steps checks it)
    pipe = None  #: a diffusers pipeline (model_index.json) whose frozen VAE / text encoders this policy uses
    adapter = None  #: its pipelines_flow.FlowPipeline (what differs between SD3 and FLUX)
    lora = None  #: (r, alpha, targets) with use_lora
    uses_element_weights = True  # forward weights each step's elements by row_data["element_weights"] (ViPO)

    def __init__(self, *, model: str,
                 flow_sde: str = param("flow_grpo", "the SDE that makes each denoising step a Gaussian: flow_grpo "
                                       "(Flow-GRPO), dance (DanceGRPO), cps (Flow-GRPO's coefficients-preserving "
                                       "sampler)", choices=["flow_grpo", "dance", "cps"]),
                 flow_noise_level: float = param(0.7, "the SDE's noise level a (Flow-GRPO's noise_level; "
                                                 "DanceGRPO's eta)"),
                 flow_steps: int = param(8, "denoising steps of a training sample (the columns of [rows, steps])"),
                 flow_eval_steps: int = param(8, "Euler ODE steps of a held-out evaluation sample"),
                 flow_shift: float = param(1.0, "time shift of the sigma schedule (SD3's shift; 1 = none)"),
                 flow_same_noise_in_group: bool = param(False, "one initial noise per group (DanceGRPO's "
                                                         "init_same_noise) instead of one per sample"),
                 guidance_scale: float = param(1.0, "classifier-free guidance scale w (1 = none)"),
                 cfg_detach_uncond: bool = param(False, "guidance in the training forward: detach the unconditional "
                                                 "velocity, gradient w*dv_c (Flow-GRPO's train_sd3.py of 2025-07) "
                                                 "instead of w*dv_c + (1-w)*dv_u (false: Flow-GRPO's first and "
                                                 "current scripts, DanceGRPO); the values are the same"),
                 use_lora: bool, lora_r: int, lora_alpha: int, lora_target_modules: list):
        check_sampler("flow", flow_steps, flow_eval_steps, "flow_noise_level", flow_noise_level,
                      "the SDE needs a noise level above 0 (a = 0 is the ODE, which has no log-prob)")
        self.model_name, self.kind = model, flow_sde
        self.a, self.T, self.T_eval, self.shift = float(flow_noise_level), int(flow_steps), int(flow_eval_steps), \
            float(flow_shift)
        self.same_noise, self.w = bool(flow_same_noise_in_group), float(guidance_scale)
        self.detach_uncond = bool(cfg_detach_uncond)
        self.sigmas = sde.flow_sigmas(self.T, self.shift, schedule="diffusers")
        self.shape: tuple = (1, 8, 8)
        if use_lora:
            self.lora = (int(lora_r), int(lora_alpha), list(lora_target_modules or LM_LORA_TARGETS))

    # ---------------------------------------------------------------- loading
    def load(self, cfg, rows, eval_rows, *, extra_texts=(), log=print):
        """``model``: ``digits`` (the built-in tiny model, pre-trained on first use and cached) or a folder
        holding a ``diffusers`` ``UNet2DModel`` (``config.json`` + safetensors, what :meth:`save` writes), or a
        Stable Diffusion 3 / 3.5 or FLUX.1 pipeline folder (``model_index.json``; :meth:`load_pipeline`)."""
        if self.model_name not in BUILT_IN and (Path(self.model_name) / "model_index.json").exists():
            return self.load_pipeline(cfg, Path(self.model_name), rows, eval_rows, log=log)
        module = load_class_unet("flow_matching", self.model_name, "flow", log=log)
        cfg_ = module.config
        self.shape = (cfg_.in_channels, cfg_.sample_size, cfg_.sample_size)
        check_class_rows(module, rows, eval_rows)
        return module.float()

    def load_pipeline(self, cfg, path: Path, rows, eval_rows, *, log=print):
        """A ``StableDiffusion3Pipeline`` or ``FluxPipeline`` folder (``pipelines_flow.load_flow_pipeline``; another
        class is refused naming the policy that trains it): the trained ``module`` is its transformer (float32);
        the VAE (float32, as Flow-GRPO) and the text encoders (the run's ``dtype`` when it is bfloat16 / float16,
        else float32) stay frozen on the policy, outside the module (the optimiser, DDP and checkpoints see only
        the transformer). The states, their shape and the sigma schedule are the adapter's (SD3: latents
        ``[in_channels, sample_size, sample_size]``; FLUX: packed ``[tokens, 4·C]``); every row needs a text
        ``prompt``."""
        from .pipelines_flow import load_flow_pipeline

        adapter = load_flow_pipeline(getattr(cfg, "policy", None) or "flow_matching", path, cfg, rows, eval_rows,
                                     text_prompt, flow_shift=self.shift, log=log)
        self.adapter, self.pipe = adapter, adapter.pipe
        self.shape, self.sigmas = adapter.shape, adapter.sigmas(self.T)
        return adapter.module

    def schedule(self, steps: int) -> torch.Tensor:
        """The sigma schedule of ``steps`` steps: a pipeline's own (its adapter's), else diffusers' for
        ``flow_shift``."""
        if self.adapter is not None:
            return self.adapter.sigmas(steps)
        return sde.flow_sigmas(steps, self.shift, schedule="diffusers")

    def save(self, module, path) -> None:
        """``save_pretrained``: config.json + diffusion_pytorch_model.safetensors (``--model PATH`` loads it); a
        pipeline folder is the trained transformer (``transformer/``, float32) beside the source folder's
        ``model_index.json`` and frozen parts as they were (hard links where the file system allows, else
        copies: the VAE and text encoders keep their own files and precision)."""
        if self.adapter is None:
            Path(path).mkdir(parents=True, exist_ok=True)
            module.save_pretrained(path, safe_serialization=True)
            return
        from .pipeline_folder import save_pipeline
        save_pipeline(self.model_name, path, "transformer", module)

    def prepare(self, module):
        """LoRA adapters (PEFT, ``use_lora``) on the UNet or transformer; ``lora_target_modules`` left at the
        causal LM's default means Flow-GRPO's lists for a pipeline's transformer (SD3: the attention projections,
        scripts/train_sd3.py; FLUX: the attention projections and the double-stream blocks' feed-forwards,
        scripts/train_flux.py: ``pipelines_flow.FLUX_LORA_TARGETS``) or the UNet's
        ``to_q/to_k/to_v/to_out.0/conv1/conv2``."""
        if self.lora is None:
            return module
        from peft import LoraConfig, get_peft_model
        r, alpha, targets = self.lora
        if targets == LM_LORA_TARGETS:
            targets = self.adapter.lora_targets if self.adapter is not None else UNET_LORA_TARGETS
        return get_peft_model(module, LoraConfig(r=r, lora_alpha=alpha, target_modules=targets,
                                                 init_lora_weights="gaussian"))

    def save_adapters(self, module, path) -> None:
        """A pipeline's LoRA adapters as diffusers' ``path/pytorch_lora_weights.safetensors``
        (``FluxPipeline`` / ``StableDiffusion3Pipeline.save_lora_weights``, rank and alpha in its metadata), beside
        the merged pipeline :meth:`save` wrote there: ``pipe.load_lora_weights(path)`` on the source pipeline gives
        the trained one. A UNet's adapters are only merged (diffusers has no LoRA loader for a bare UNet2DModel)."""
        if self.adapter is not None:
            self.adapter.save_lora(module, path)

    # ---------------------------------------------------------------- text conditions (pipelines)
    def encode(self, prompts: list[str], device) -> dict:
        """``prompt_embeds`` [n, L, D] and ``pooled_prompt_embeds`` [n, P] (float32) of ``prompts`` by the
        pipeline's frozen text encoders (its adapter's ``encode_prompt`` call), each distinct prompt once."""
        return self.adapter.encode(prompts, device)

    def conditions(self, rows, counts, device):
        """One condition per image: class labels [R] (a UNet) or the text embeds dict (a pipeline)."""
        if self.adapter is None:
            return torch.tensor(per_row([condition_of(r) for r in rows], counts), device=device)
        return self.encode(per_row([text_prompt(r) for r in rows], counts), device)

    @staticmethod
    def row_condition(row_data: dict, rows: torch.Tensor, device):
        """The stored conditions of rows ``rows`` of a batch (``row_data``), on ``device``."""
        if "prompt_embeds" in row_data:
            return {k: row_data[k][rows].to(device) for k in ("prompt_embeds", "pooled_prompt_embeds")}
        return row_data["cond"][rows].to(device)

    @torch.no_grad()
    def decode(self, x: torch.Tensor) -> torch.Tensor:
        """Images [R, C, H, W] in [0, 1] of final samples x: x clipped to [−1, 1] (a UNet's pixels), or a
        pipeline's latents unpacked and decoded by its VAE (``x / scaling_factor + shift_factor``), 8 at a time
        (its adapter's ``decode``)."""
        if self.adapter is None:
            return (x.clamp(-1, 1) + 1) / 2
        return self.adapter.decode(x)

    # ---------------------------------------------------------------- acting
    def velocity(self, module, x: torch.Tensor, sigma: torch.Tensor, labels) -> torch.Tensor:
        """v_θ(x, σ, c) for rows of x (σ per row), float32, with classifier-free guidance when w != 1. ``labels``:
        class labels [R] (a ``UNet2DModel``) or a pipeline's text embeds dict (its transformer, called as its
        pipeline calls it: ``pipelines_flow``, SD3 at timestep 1000·σ, FLUX packed with its ids and guidance);
        v_u detached from the gradient with ``cfg_detach_uncond``."""
        if isinstance(labels, dict):
            return self.adapter.velocity(module, x, sigma, labels, self.w, self.detach_uncond)
        return unet_velocity(module, x, sigma, labels, self.w, self.detach_uncond)

    def _step(self, x, v, sig, sig_next, *, generator=None, x_next=None):
        if self.kind == "flow_grpo":
            return sde.flow_grpo_step(x, v, sig, sig_next, self.a, sigma_max_sub=float(self.sigmas[1]),
                                      generator=generator, x_next=x_next)
        if self.kind == "dance":
            return sde.dance_step(x, v, sig, sig_next, self.a, generator=generator, x_next=x_next)
        return sde.cps_step(x, v, sig, sig_next, self.a, generator=generator, x_next=x_next)

    def initial_noise(self, rows, uids, counts, generator, *, evaluation: bool) -> torch.Tensor:
        """``row_noise`` of the state shape; a pipeline's drawn as its pipeline draws it (FLUX: [C, H, W]), then
        laid out as its states (packed)."""
        if self.adapter is None:
            return row_noise(rows, uids, counts, self.shape, generator, evaluation=evaluation,
                             same_in_group=self.same_noise)
        return self.adapter.pack(row_noise(rows, uids, counts, self.adapter.noise_shape, generator,
                                           evaluation=evaluation, same_in_group=self.same_noise))

    @torch.no_grad()
    def sample(self, module, rows, uids, *, group_offset=0, num_generations, temperature=None, generator=None,
               evaluation=False):
        """Images for ``rows`` by the SDE (training: step_data and per-step log-probs) or, with ``evaluation``,
        the Euler ODE from each row's fixed noise (``row_noise``; log-probs 0)."""
        counts = completion_counts(num_generations, len(rows))
        device = next(module.parameters()).device
        labels = cond = self.conditions(rows, counts, device)
        extra = None
        if self.adapter is not None:  # text embeds in row_data (forward does not re-encode); the prompt uid as label
            labels = repeat_rows(torch.tensor(uids, device=device), counts)
            extra = cond
        x = self.initial_noise(rows, uids, counts, generator, evaluation=evaluation).to(device)
        if evaluation:
            sigmas = self.schedule(self.T_eval)
            for j in range(self.T_eval):
                x = x + (sigmas[j + 1] - sigmas[j]) * self.velocity(module, x, sigmas[j].expand(len(x)), cond)
            return pack_images(rows, uids, counts, labels, self.decode(x),
                               logprobs=torch.zeros(len(x), 1), group_offset=group_offset, row_extra=extra)
        xs, nexts, lps = [], [], []
        for j in range(self.T):
            sig, nxt = self.sigmas[j].expand(len(x)).to(device), self.sigmas[j + 1].expand(len(x)).to(device)
            out = self._step(x, self.velocity(module, x, sig, cond), sig, nxt, generator=generator)
            xs.append(x)
            nexts.append(out.x_next)
            lps.append(out.logprob)
            x = out.x_next
        R = len(x)
        step_data = {"x": torch.stack(xs, 1), "x_next": torch.stack(nexts, 1),
                     "sigma": self.sigmas[:-1].expand(R, self.T).clone(),
                     "sigma_next": self.sigmas[1:].expand(R, self.T).clone()}
        return pack_images(rows, uids, counts, labels, self.decode(x), logprobs=torch.stack(lps, 1),
                           group_offset=group_offset, step_data=step_data, row_extra=extra)

    def offers(self) -> frozenset[str]:
        return frozenset({"step_mean", "step_std_dev"})

    def forward(self, module, mb, *, want: frozenset[str] = frozenset(), grad: bool = True) -> dict[str, Any]:
        """Per-step log-probs [R, T] of the stored transitions x_j -> x_{j+1} under ``module``; only the steps on
        ``completion_mask`` run through the network (0 elsewhere). ``step_mean`` [R, T, *x]: the step's mean
        μ_θ; ``step_std_dev`` [R, T]: the SDE's s (Flow-GRPO's std_dev_t, which its KL divides by)."""
        device = next(module.parameters()).device
        R, T = mb.completion_mask.shape
        on = mb.completion_mask > 0
        rows, cols = on.nonzero(as_tuple=True)
        x = mb.step_data["x"][rows, cols].to(device)
        with torch.set_grad_enabled(grad):
            v = self.velocity(module, x, mb.step_data["sigma"][rows, cols].to(device),
                              self.row_condition(mb.row_data, rows, device))
            out = self._step(x, v, mb.step_data["sigma"][rows, cols].to(device),
                             mb.step_data["sigma_next"][rows, cols].to(device),
                             x_next=mb.step_data["x_next"][rows, cols].to(device))
            lp = out.logprob
            if "element_weights" in mb.row_data:  # ViPO (policies/_image/vipo_maps.py): per-element weights in each step's mean
                from .vipo import weighted_step_logprob
                lp = weighted_step_logprob(self.kind, out.x_next, out.mean, out.std,
                                           mb.row_data["element_weights"][rows].to(device))
            return gaussian_step_outputs(R, T, rows, cols, out, want, logprob=lp)

    def describe(self, batch, i: int) -> dict:
        """The asked class and the image as a 32x32 PNG data URI (the completions log, the report)."""
        from ...media import thumbnail_data_uri
        return {"prompt": str(batch.columns["prompt"][i]), "completion": "",
                "image": thumbnail_data_uri(batch.row_data["images"][i])}


declared_params(FlowMatchingPolicy, owned=False)  # its keys are owned by the kinds that register it or a subclass
