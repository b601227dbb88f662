"""A rectified-flow image generator (``diffusers``), sampled by an SDE so that every denoising step has a Gaussian
log-prob: Flow-GRPO's construction; one step of the ``[rows, steps]`` layout is one denoising step."""
from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from ..batch import RolloutBatch
from ..config import ConfigError
from ..generation.counting import GENERATED
from ..generation.sampling import completion_counts
from ..images import sde
from ..registry import POLICIES, param
from .base import PolicyBase

BUILT_IN = ("digits", "tiny")  #: model names of the built-in class-conditional 8x8 digits model


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


def row_noise(rows: list[dict], counts: list[int], shape: tuple, generator, *, evaluation: bool,
              same_in_group: bool) -> torch.Tensor:
    """Initial noise ``[R, *shape]``: drawn from ``generator`` (one per row, or one per group when
    ``same_in_group``); for evaluation, from each row's ``noise_seed`` (the same noise before and after
    training) where the row has one."""
    on = {"device": generator.device} if generator is not None else {}  # an accelerator's generator draws there
    out = []
    for row, n in zip(rows, counts):
        if evaluation and row.get("noise_seed") is not None:
            g = torch.Generator().manual_seed(int(row["noise_seed"]))
            out.append(torch.randn((n, *shape), generator=g))
        elif same_in_group:
            out.append(torch.randn((1, *shape), generator=generator, **on).expand(n, *shape).clone().cpu())
        else:
            out.append(torch.randn((n, *shape), generator=generator, **on).cpu())
    return torch.cat(out)


def pack_images(rows: list[dict], uids: list[int], counts: list[int], labels: torch.Tensor, images: torch.Tensor, *,
                logprobs: torch.Tensor, group_offset: int, step_data: dict | None = None) -> RolloutBatch:
    """A RolloutBatch of image actions (prompt-major): one step per column of ``logprobs`` [R, T], every step on
    the mask, the class label as the one prompt token, ``row_data`` ``cond`` and ``images`` ([R, C, H, W] in
    [0, 1]); data columns repeated per image, ``completion`` = the images as :func:`image_rows`."""
    R, T = logprobs.shape
    GENERATED.add(R, R * T)  # the run's budgets count samples and steps (max_tokens counts denoising steps)
    rep = torch.tensor(counts)
    columns = {k: [r.get(k) for r, c in zip(rows, counts) for _ in range(c)] for k in rows[0]}
    columns["prompt"] = [str(r.get("prompt", "")) for r, c in zip(rows, counts) for _ in range(c)]
    columns["completion"] = image_rows(images)
    ones = torch.ones(R, T)
    return RolloutBatch(
        prompt_ids=labels[:, None].cpu(), prompt_mask=torch.ones(R, 1, dtype=torch.long),
        completion_ids=torch.arange(T).expand(R, T).clone(), completion_mask=ones,
        behavior_logprobs=logprobs.float().cpu(), completion_attention_mask=ones.long(),
        group_ids=torch.arange(group_offset, group_offset + len(rows)).repeat_interleave(rep),
        prompt_uids=torch.tensor(uids, dtype=torch.long).repeat_interleave(rep),
        truncated=torch.zeros(R, dtype=torch.bool), columns=columns,
        step_data={k: v.cpu() for k, v in (step_data or {}).items()},
        row_data={"cond": labels.cpu(), "images": images.float().cpu()})


def check_image_policy(cfg) -> None:
    """Settings an image policy cannot work with, refused when the config is built."""
    from ..generation.engines import engine_name
    if cfg.beta > 0:
        raise ConfigError(f"beta: the token KL estimators ({cfg.kl_estimator}) on policy {cfg.policy}'s per-step "
                          f"log-probs (averaged over pixels) are no paper's KL; set beta: 0 and add "
                          f"regularizers: [gaussian_mean_kl] (Flow-GRPO's KL between the policy's and the "
                          f"reference's step means; its weight is gaussian_kl_beta)")
    if engine_name(cfg) is not None:
        raise ConfigError(f"generation_engine: {engine_name(cfg)} samples text; policy {cfg.policy} samples in the "
                          f"trainer (set generation_engine: native and generation_workers: 0)")


@POLICIES.register("flow_matching", check=check_image_policy)
class FlowMatchingPolicy(PolicyBase):
    """A class-conditional rectified-flow image model (a ``diffusers`` ``UNet2DModel``): images drawn by an SDE
    whose every denoising step is a Gaussian, so GRPO's per-step ratios exist (Flow-GRPO's construction).

    Schedule: σ_0 = 1 > σ_1 > ... > σ_T = 0, diffusers' ``FlowMatchEulerDiscreteScheduler`` sigmas for
    ``flow_steps`` steps and ``flow_shift`` (``images/sde.py::flow_sigmas``, schedule "diffusers"); the network
    gets timestep 1000·σ and the class label, v = v_θ(x_j, σ_j, c) (with ``guidance_scale`` w != 1:
    v = v_u + w·(v_c − v_u), v_u under the unconditional label 10). Step j (one column) goes from x_j at σ_j to
    x_{j+1} at σ_{j+1} by ``flow_sde``:

    - ``flow_grpo``: Flow-GRPO's SDE step (``sde.flow_grpo_step``; noise level a = ``flow_noise_level``);
    - ``dance``: DanceGRPO's step (``sde.dance_step``, η = ``flow_noise_level``);
    - ``cps``: Flow-GRPO's coefficients-preserving step (``sde.cps_step``);

    and log π(x_{j+1} | x_j, c) is the Gaussian log-density averaged over the image's elements (mean, not sum,
    as in the authors' code). ``step_data`` keeps x_j, x_{j+1}, σ_j, σ_{j+1} of every step, so the log-probs
    are recomputed under new weights from the stored pairs, steps one at a time or any subset (only the steps
    on the loss mask are run). Evaluation (``evaluation=True``) is the Euler ODE (a = 0) for
    ``flow_eval_steps`` steps from each row's ``noise_seed``. Images are x_T clipped to [−1, 1] and mapped to
    [0, 1]; reward functions receive them as float32 NumPy ``[H, W, C]``.

    The forward runs in float32 whatever the run's ``dtype`` (Flow-GRPO computes the log-prob in float32: bf16
    overflows). ``temperature`` does not apply (the SDE's noise level is ``flow_noise_level``).

    Paper: Liu et al., "Flow-GRPO: Training Flow Matching Models via Online RL", arXiv:2505.05470 (the anchor
    image recipe, not a seed).

    Provenance: authors' code — https://github.com/yifan123/flow_grpo, flow_grpo/diffusers_patch/sd3_sde_with_logprob.py
    (sde_step_with_logprob, sde_type 'sde' and 'cps'; checked numerically against it, images/sde.py) and
    https://github.com/XueZeyue/DanceGRPO fastvideo/train_grpo_flux.py (flux_step) for 'dance'; the sampling loop,
    the tiny class-conditional UNet and the evaluation ODE are grpolab's.
    Test: tests/test_image_policies.py::test_a_step_logprob_is_the_hand_gaussian.
    """

    step = "denoising step"
    capabilities = frozenset({"gaussian_steps", "flow_matching", "images"})
    description = "an image generator by rectified flow (diffusers); one step = one SDE denoising step"
    default_model = "digits"
    float32_only = True
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
                 guidance_scale: float = param(1.0, "classifier-free guidance scale w (1 = none)")):
        if flow_steps < 1 or flow_eval_steps < 1:
            raise ConfigError(f"flow_steps / flow_eval_steps: at least 1 denoising step, got {flow_steps} / "
                              f"{flow_eval_steps}")
        if flow_noise_level <= 0:
            raise ConfigError(f"flow_noise_level: the SDE needs a noise level above 0 (a = 0 is the ODE, which "
                              f"has no log-prob), got {flow_noise_level}")
        self.model_name, self.kind = model, flow_sde
        self.a, self.T, self.T_eval, self.shift = float(flow_noise_level), int(flow_steps), int(flow_eval_steps), \
            float(flow_shift)
        self.same_noise, self.w = bool(flow_same_noise_in_group), float(guidance_scale)
        self.sigmas = sde.flow_sigmas(self.T, self.shift, schedule="diffusers")
        self.shape: tuple = (1, 8, 8)

    # ---------------------------------------------------------------- loading
    def load(self, cfg, rows, eval_rows, *, extra_texts=(), log=print):
        """``model``: ``digits`` (the built-in tiny model, pre-trained on first use and cached) or a folder
        holding a ``diffusers`` ``UNet2DModel`` (``config.json`` + safetensors, what :meth:`save` writes)."""
        from diffusers import UNet2DModel

        if self.model_name in BUILT_IN:
            from ..images.digits import load_digits_model
            module = load_digits_model("flow", log=log)
        else:
            path = Path(self.model_name)
            if not (path / "config.json").exists():
                raise ConfigError(f"model: policy flow_matching loads 'digits' (the built-in tiny model) or a folder "
                                  f"with a diffusers UNet2DModel (config.json + safetensors); {path} has no "
                                  f"config.json")
            module = UNet2DModel.from_pretrained(path, torch_dtype=torch.float32)
        cfg_ = module.config
        self.shape = (cfg_.in_channels, cfg_.sample_size, cfg_.sample_size)
        for where, part in (("train", rows), ("held-out", eval_rows)):
            for i, row in enumerate(part[:1000]):
                c = condition_of(row, f"{where} row {i}")
                if not 0 <= c < (cfg_.num_class_embeds or 0) - 1:
                    raise ConfigError(f"{where} row {i}: class {c} is outside the model's classes 0.."
                                      f"{(cfg_.num_class_embeds or 1) - 2}")
        return module.float()

    def save(self, module, path) -> None:
        """``save_pretrained``: config.json + diffusion_pytorch_model.safetensors (``--model PATH`` loads it)."""
        Path(path).mkdir(parents=True, exist_ok=True)
        module.save_pretrained(path, safe_serialization=True)

    # ---------------------------------------------------------------- acting
    def velocity(self, module, x: torch.Tensor, sigma: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        """v_θ(x, σ, c) for rows of x (σ per row), float32, with classifier-free guidance when w != 1."""
        with torch.autocast(device_type=x.device.type, enabled=False):
            t = (sigma * 1000).float().to(x.device)
            if self.w == 1.0:
                return module(x.float(), t, class_labels=labels).sample.float()
            both = module(torch.cat([x, x]).float(), torch.cat([t, t]),
                          class_labels=torch.cat([labels, torch.full_like(labels, 10)])).sample.float()
            cond, unc = both.chunk(2)
            return unc + self.w * (cond - unc)

    def _step(self, x, v, sig, sig_next, *, generator=None, x_next=None):
        if self.kind == "flow_grpo":
            return sde.flow_grpo_step(x, v, sig, sig_next, self.a, sigma_max_sub=float(self.sigmas[1]),
                                      generator=generator, x_next=x_next)
        if self.kind == "dance":
            return sde.dance_step(x, v, sig, sig_next, self.a, generator=generator, x_next=x_next)
        return sde.cps_step(x, v, sig, sig_next, self.a, generator=generator, x_next=x_next)

    @torch.no_grad()
    def sample(self, module, rows, uids, *, group_offset=0, num_generations, temperature=None, generator=None,
               evaluation=False):
        """Images for ``rows`` by the SDE (training: step_data and per-step log-probs) or, with ``evaluation``,
        the Euler ODE from each row's fixed ``noise_seed`` (log-probs 0)."""
        counts = completion_counts(num_generations, len(rows))
        device = next(module.parameters()).device
        labels = torch.tensor([condition_of(r) for r, n in zip(rows, counts) for _ in range(n)], device=device)
        x = row_noise(rows, counts, self.shape, generator, evaluation=evaluation,
                      same_in_group=self.same_noise).to(device)
        if evaluation:
            sigmas = sde.flow_sigmas(self.T_eval, self.shift, schedule="diffusers")
            for j in range(self.T_eval):
                x = x + (sigmas[j + 1] - sigmas[j]) * self.velocity(module, x, sigmas[j].expand(len(x)), labels)
            return pack_images(rows, uids, counts, labels, (x.clamp(-1, 1) + 1) / 2,
                               logprobs=torch.zeros(len(x), 1), group_offset=group_offset)
        xs, nexts, lps = [], [], []
        for j in range(self.T):
            sig, nxt = self.sigmas[j].expand(len(x)).to(device), self.sigmas[j + 1].expand(len(x)).to(device)
            out = self._step(x, self.velocity(module, x, sig, labels), sig, nxt, generator=generator)
            xs.append(x)
            nexts.append(out.x_next)
            lps.append(out.logprob)
            x = out.x_next
        R = len(x)
        step_data = {"x": torch.stack(xs, 1), "x_next": torch.stack(nexts, 1),
                     "sigma": self.sigmas[:-1].expand(R, self.T).clone(),
                     "sigma_next": self.sigmas[1:].expand(R, self.T).clone()}
        return pack_images(rows, uids, counts, labels, (x.clamp(-1, 1) + 1) / 2, logprobs=torch.stack(lps, 1),
                           group_offset=group_offset, step_data=step_data)

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
                              mb.row_data["cond"][rows].to(device))
            out = self._step(x, v, mb.step_data["sigma"][rows, cols].to(device),
                             mb.step_data["sigma_next"][rows, cols].to(device),
                             x_next=mb.step_data["x_next"][rows, cols].to(device))
            lp = out.logprob
            if "element_weights" in mb.row_data:  # ViPO (stages/vipo.py): per-element weights in each step's mean
                from ..images.vipo import weighted_step_logprob
                lp = weighted_step_logprob(self.kind, out.x_next, out.mean, out.std,
                                           mb.row_data["element_weights"][rows].to(device))
            logprobs = torch.zeros(R, T, device=device, dtype=lp.dtype).index_put((rows, cols), lp)
            result = {"logprobs": logprobs}
            if "step_mean" in want:
                mean = torch.zeros(R, T, *out.mean.shape[1:], device=device, dtype=out.mean.dtype)
                result["step_mean"] = mean.index_put((rows, cols), out.mean)
            if "step_std_dev" in want:
                result["step_std_dev"] = torch.zeros(R, T, device=device).index_put(
                    (rows, cols), out.std_dev_t.float())
        return result

    def describe(self, batch, i: int) -> dict:
        """The asked class and the image as a 32x32 PNG data URI (the completions log, the report)."""
        from ..images.render import thumbnail_data_uri
        return {"prompt": str(batch.columns["prompt"][i]), "completion": "",
                "image": thumbnail_data_uri(batch.row_data["images"][i])}
