"""``ddpm_planner``: a multi-head diffusion trajectory planner (seed 000-55), sampled by DDPO's DDIM step so that
every denoising step has a Gaussian log-prob; one step of the ``[rows, steps]`` layout is one DDIM step t → t'.

The model (:class:`PlannerDenoiser`) is a small MLP: a shared trunk reads the noisy trajectory, the timestep and
the scene; H output heads (one per driving strategy) each predict ε. The built-in one (``tiny`` / ``planner``)
is pre-trained once by imitation on straight-line demonstrations with all heads tied (one head trained, copied
to the others), then cached (``model/cache.py``). Scenes and rewards: task ``toy_planner``.
"""
from __future__ import annotations

import math
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from ...config import ConfigError
from ...generation.sampling import completion_counts
from .._image import sde
from ...model.cache import cached_build, pretraining
from ...registry import POLICIES, param
from ..base import PolicyBase, load_config_module, repeat_rows, save_config_module
from .._image.flow import check_image_policy, gaussian_step_outputs, pack_steps, row_noise

WAYPOINTS = 8
SCENE = 7  #: start (2), goal (2), obstacle centre (2) and radius (1)
BUILT_IN = ("tiny", "planner")
NUM_TRAIN_TIMESTEPS = 1000


# ---------------------------------------------------------------------------------------------------- model

class PlannerDenoiser(nn.Module):
    """ε_θ(x, t, scene, head): x the trajectory relative to the start, flattened ``[B, 16]``; trunk
    MLP([x, scene, sinusoidal(t)]) → ``width``, SiLU, two layers; head h a linear map ``width → 16``."""

    def __init__(self, width: int = 128, heads: int = 2, time_dim: int = 16):
        super().__init__()
        self.config = {"width": width, "heads": heads, "time_dim": time_dim}
        d = WAYPOINTS * 2
        self.trunk = nn.Sequential(nn.Linear(d + SCENE + time_dim, width), nn.SiLU(), nn.Linear(width, width),
                                   nn.SiLU())
        self.heads = nn.ModuleList(nn.Linear(width, d) for _ in range(heads))

    def time_embedding(self, t: torch.Tensor) -> torch.Tensor:
        half = self.config["time_dim"] // 2
        freqs = torch.exp(-math.log(1000.0) * torch.arange(half, device=t.device, dtype=torch.float32) / half)
        a = (t.float() / NUM_TRAIN_TIMESTEPS * 1000.0)[:, None] * freqs[None] / 1000.0 * 2 * math.pi
        return torch.cat([a.sin(), a.cos()], -1)

    def forward(self, x: torch.Tensor, t: torch.Tensor, scene: torch.Tensor, head: torch.Tensor) -> torch.Tensor:
        h = self.trunk(torch.cat([x.float(), scene.float(), self.time_embedding(t)], -1))
        out = torch.stack([lin(h) for lin in self.heads], 1)  # [B, H, 16]
        return out[torch.arange(len(x), device=x.device), head.long()]


def alphas_cumprod() -> torch.Tensor:
    """DDPM's linear β schedule (1e-4 → 0.02 over 1000 steps), ᾱ_t = Π(1 − β)."""
    betas = torch.linspace(1e-4, 0.02, NUM_TRAIN_TIMESTEPS, dtype=torch.float64)
    return torch.cumprod(1 - betas, 0).float()


def scene_tensor(rows: list[dict]) -> torch.Tensor:
    """``[B, 7]``: start, goal, obstacle (cx, cy, r) of each row."""
    for i, r in enumerate(rows):
        for key, n in (("start", 2), ("goal", 2), ("obstacle", 3)):
            v = r.get(key)
            try:
                ok = v is not None and len(v) == n and all(math.isfinite(float(a)) for a in v)
            except (TypeError, ValueError):
                ok = False
            if not ok:
                raise ConfigError(f"policy ddpm_planner: row {i} has no column '{key}' of {n} numbers (got {v!r}); "
                                  f"each row needs 'start' [x, y], 'goal' [x, y] and 'obstacle' [cx, cy, r] "
                                  f"(task toy_planner)")
    return torch.tensor([[*map(float, r["start"]), *map(float, r["goal"]), *map(float, r["obstacle"])]
                         for r in rows], dtype=torch.float32)


def random_scenes(n: int, generator: torch.Generator) -> torch.Tensor:
    """``n`` scenes ``[n, 7]``: start (−1, U(−½, ½)), goal (1, U(−½, ½)), obstacle centre U(−0.4, 0.4)², radius
    U(0.1, 0.3)."""
    u = torch.rand(n, 5, generator=generator)
    return torch.stack([torch.full((n,), -1.0), u[:, 0] - 0.5, torch.full((n,), 1.0), u[:, 1] - 0.5,
                        0.8 * u[:, 2] - 0.4, 0.8 * u[:, 3] - 0.4, 0.1 + 0.2 * u[:, 4]], 1)


def straight_line(scenes: torch.Tensor) -> torch.Tensor:
    """The demonstrations: p_k = s + (k/8)(g − s), k = 1..8, relative to the start, ``[n, 16]``."""
    k = torch.arange(1, WAYPOINTS + 1, dtype=torch.float32)[None, :, None] / WAYPOINTS
    return (k * (scenes[:, None, 2:4] - scenes[:, None, 0:2])).reshape(len(scenes), -1)


def pretrain_recipe() -> dict:
    return {"kind": "planner", "version": 1, "model": {"width": 128, "heads": 2, "time_dim": 16},
            "data": "straight lines start->goal, 8 waypoints, random scenes (random_scenes)", "iterations": 1500,
            "batch_size": 256, "optimizer": "AdamW", "learning_rate": 2e-3, "lr_schedule": "cosine", "seed": 0,
            "heads_tied": "head 0 trained, copied to every head", "threads": 1, "dtype": "float32"}


def pretrain_planner(recipe: dict | None = None) -> tuple[PlannerDenoiser, list[float]]:
    """``(model, loss_curve)``: ε-prediction on noised straight-line demos, head 0 trained, then copied to all."""
    recipe = recipe or pretrain_recipe()
    with pretraining(recipe):
        torch.manual_seed(recipe["seed"])
        model = PlannerDenoiser(**recipe["model"])
        g = torch.Generator().manual_seed(recipe["seed"])
        acp = alphas_cumprod()
        iters, bs = recipe["iterations"], recipe["batch_size"]
        opt = torch.optim.AdamW(model.parameters(), lr=recipe["learning_rate"])
        sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=iters)
        losses, chunk = [], []
        zero = torch.zeros(bs, dtype=torch.long)
        for _ in range(iters):
            scenes = random_scenes(bs, g)
            x0 = straight_line(scenes)
            t = torch.randint(0, NUM_TRAIN_TIMESTEPS, (bs,), generator=g)
            eps = torch.randn(x0.shape, generator=g)
            a = acp[t][:, None]
            loss = (model(a.sqrt() * x0 + (1 - a).sqrt() * eps, t, scenes, zero) - eps).pow(2).mean()
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            sched.step()
            chunk.append(loss.item())
            if len(chunk) == iters // 10:
                losses.append(round(sum(chunk) / len(chunk), 5))
                chunk = []
        with torch.no_grad():
            for head in model.heads[1:]:  # all heads tied at the end of imitation
                head.load_state_dict(model.heads[0].state_dict())
    return model.eval(), losses


def save_planner(model: PlannerDenoiser, path) -> None:
    save_config_module(model, path)


def load_planner(path) -> PlannerDenoiser:
    return load_config_module(PlannerDenoiser, path, "ddpm_planner")[0].eval()


def planner_model_path(log=print) -> Path:
    """Folder of the pre-trained built-in planner (built on first use, cached)."""
    recipe = pretrain_recipe()

    def build(tmp: Path) -> dict:
        t0 = time.perf_counter()
        model, losses = pretrain_planner(recipe)
        save_planner(model, tmp)
        return {"seed": recipe["seed"], "loss_curve": losses, "train_seconds": round(time.perf_counter() - t0, 2),
                "parameters": sum(p.numel() for p in model.parameters())}

    return cached_build("planner", recipe, build, log=log,
                        message="[grpolab] pre-training the tiny multi-head trajectory planner (MLP, 2 heads tied, "
                                f"{recipe['iterations']} steps on straight-line demos; one time, about 10 s)")


# ---------------------------------------------------------------------------------------------------- policy

@POLICIES.register("ddpm_planner", check=check_image_policy)
class DDPMPlannerPolicy(PolicyBase):
    """A multi-head diffusion trajectory planner: an MLP denoiser (shared trunk + H heads, the row's ``head``
    column selects one) over 8 waypoints (16 numbers), conditioned on the scene (start, goal, one disc
    obstacle), sampled by DDPO's DDIM step with η = ``planner_eta`` (``policies/_image/sde.py::ddim_step``: x̂₀ =
    (x − √(1−ᾱ_t)ε̂)/√ᾱ_t clipped to ±4, σ_t² = (1−ᾱ_{t'})/(1−ᾱ_t)·(1 − ᾱ_t/ᾱ_{t'}), std = ησ_t,
    μ = √ᾱ_{t'}x̂₀ + √(1 − ᾱ_{t'} − std²)ε̂), so each step j has log π(x_{j+1} | x_j, scene, head) = the mean
    element Gaussian log-density, recomputed from the stored x_j, x_{j+1} under new weights (only the steps on
    the loss mask). Timesteps t_j = 901, 801, ..., 1 for T = 10 (``steps_offset`` 1, t' = t − N/T, DDPO's clamp
    at the last step), linear β (1e-4 → 0.02, N = 1000). Evaluation: η = 0 from each row's ``noise_seed`` (a row
    without one: ``base.held_out_seed``'s).
    The trajectory is relative to the start inside the model; reward functions receive the absolute waypoints
    p_1..p_8 as a float32 NumPy array ``[8, 2]``. Groups are per row, and the task ``toy_planner`` makes one row
    per (scene, head), so each group holds one head's samples of one scene.

    ``planner_heads_only`` (default true) freezes the shared trunk, so each head is trained by its own rows only
    (the paper fine-tunes only the target strategy head's output layer, other heads and the encoder frozen).

    Paper: Ding et al., "Drive As You Like: Strategy-Level Motion Planning Based on A Multi-Head Diffusion
    Model", arXiv:2508.16947 (seed 000-55).

    Provenance: reconstructed from the abstract — seed 000-55 (arXiv:2508.16947): heads sharing weights after
    imitation, then GRPO per head on the stochastic denoising sampler; no authors' code ("released upon
    acceptance"; searched the code index for the title, "M-diffusion planner" and diffusion-planner
    repositories). Our choices: an MLP denoiser instead of their DiT over nuPlan scenes; tied heads by copying
    one trained head; DDPO's DDIM step (policies/_image/sde.py, matching kvablack/ddpo-pytorch) for the per-step
    log-probs; the trunk frozen by default.
    """

    step = "denoising step"
    capabilities = frozenset({"gaussian_steps"})
    description = "a multi-head diffusion trajectory planner (MLP, DDIM eta > 0); one step = one DDIM step"
    default_model = "planner"
    default_task = "toy_planner"  # the task a run with this policy and no --task / --data trains on
    float32_only = True
    steps_key = "planner_steps"  # the columns of a training sample (denoising_steps checks it)

    def __init__(self, *, model: str,
                 planner_steps: int = param(10, "ddpm_planner: DDIM steps of a training sample (the columns)"),
                 planner_eta: float = param(1.0, "ddpm_planner: DDIM eta of the training sampler (> 0)"),
                 planner_eval_steps: int = param(10, "ddpm_planner: DDIM (eta = 0) steps of an evaluation sample"),
                 planner_heads_only: bool = param(True, "ddpm_planner: train only the output heads (the shared "
                                                  "trunk frozen, as the paper fine-tunes one strategy head)")):
        if planner_steps < 1 or planner_eval_steps < 1 or planner_steps > NUM_TRAIN_TIMESTEPS:
            raise ConfigError(f"planner_steps / planner_eval_steps: 1..{NUM_TRAIN_TIMESTEPS}, got {planner_steps} / "
                              f"{planner_eval_steps}")
        if planner_eta <= 0:
            raise ConfigError(f"planner_eta: must be above 0 (eta = 0 has no log-prob), got {planner_eta}")
        self.model_name, self.T, self.T_eval = model, int(planner_steps), int(planner_eval_steps)
        self.eta, self.heads_only = float(planner_eta), bool(planner_heads_only)
        self.alphas_cumprod = alphas_cumprod()
        self.timesteps, self.eval_timesteps = self.schedule(self.T), self.schedule(self.T_eval)
        self.clip_range = 4.0

    @staticmethod
    def schedule(steps: int) -> list[tuple[int, int]]:
        """``[(t_j, t'_j)]``: DDIM's "leading" spacing with steps_offset 1, t' = t − N/T."""
        k = NUM_TRAIN_TIMESTEPS // steps
        return [(j * k + 1, j * k + 1 - k) for j in reversed(range(steps))]

    def load(self, cfg, rows, eval_rows, *, extra_texts=(), log=print):
        """``model``: ``planner`` / ``tiny`` (built in, pre-trained on first use and cached) or a folder that
        :meth:`save` wrote."""
        path = planner_model_path(log=log) if self.model_name in BUILT_IN else Path(self.model_name)
        if not (path / "config.json").exists():
            raise ConfigError(f"model: policy ddpm_planner loads 'planner' (the built-in tiny planner) or a folder "
                              f"it saved (config.json + model.safetensors); {path} has no config.json")
        module = load_planner(path)
        H = module.config["heads"]
        for where, part in (("train", rows), ("held-out", eval_rows)):
            for i, row in enumerate(part[:1000]):
                h = row.get("head", 0)
                if not isinstance(h, (int, np.integer)) or not 0 <= int(h) < H:
                    raise ConfigError(f"{where} row {i}: head {h!r} is not one of the model's heads 0..{H - 1}")
            scene_tensor(part[:1])
        return module.float()

    def save(self, module, path) -> None:
        save_planner(module, path)

    def prepare(self, module):
        if self.heads_only:
            getattr(module, "trunk", module).requires_grad_(False)
        return module

    def _step(self, x, eps, t, t_prev, eta, **kw) -> sde.SDEStep:
        return sde.ddim_step(x, eps, t, t_prev, self.alphas_cumprod, eta, clip_sample=True,
                             clip_range=self.clip_range, **kw)

    @torch.no_grad()
    def sample(self, module, rows, uids, *, group_offset=0, num_generations, temperature=None, generator=None,
               evaluation=False):
        counts = completion_counts(num_generations, len(rows))
        device = next(module.parameters()).device
        scenes = repeat_rows(scene_tensor(rows), counts).to(device)
        heads = repeat_rows(torch.tensor([int(r.get("head", 0)) for r in rows]), counts).to(device)
        x = row_noise(rows, uids, counts, (WAYPOINTS * 2,), generator, evaluation=evaluation,
                      same_in_group=False).to(device)
        R = len(x)
        xs, nexts, lps = [], [], []
        for t, t_prev in (self.eval_timesteps if evaluation else self.timesteps):
            tt = torch.full((R,), t, device=device)
            eps = module(x, tt, scenes, heads).float()
            if evaluation:
                x = self._step(x, eps, t, t_prev, 0.0, noise=torch.zeros_like(x)).x_next
                continue
            out = self._step(x, eps, t, t_prev, self.eta, generator=generator)
            xs.append(x)
            nexts.append(out.x_next)
            lps.append(out.logprob)
            x = out.x_next
        traj = x.view(R, WAYPOINTS, 2) + scenes[:, None, 0:2]  # absolute waypoints
        if evaluation:
            logprobs, step_data = torch.zeros(R, 1), {}
        else:
            ts = torch.tensor(self.timesteps, dtype=torch.long)
            logprobs = torch.stack(lps, 1)
            step_data = {"x": torch.stack(xs, 1), "x_next": torch.stack(nexts, 1),
                         "t": ts[:, 0].expand(R, self.T).clone(), "t_prev": ts[:, 1].expand(R, self.T).clone()}
        return pack_steps(rows, uids, counts, prompt_ids=heads[:, None].cpu(),
                          completion=[p.float().cpu().numpy() for p in traj], logprobs=logprobs,
                          group_offset=group_offset, step_data=step_data,
                          row_data={"cond": scenes.cpu(), "head": heads.cpu(), "trajectory": traj.float().cpu()})

    def offers(self) -> frozenset[str]:
        return frozenset({"step_mean", "step_std_dev"})

    def forward(self, module, mb, *, want: frozenset[str] = frozenset(), grad: bool = True) -> dict[str, Any]:
        """Per-step log-probs [R, T] of the stored transitions under ``module`` (only the steps on the mask run);
        ``step_mean`` [R, T, 16] and ``step_std_dev`` [R, T] (η·σ_t) on request."""
        device = next(module.parameters()).device
        R, T = mb.completion_mask.shape
        rows, cols = (mb.completion_mask > 0).nonzero(as_tuple=True)
        x = mb.step_data["x"][rows, cols].to(device)
        t = mb.step_data["t"][rows, cols].to(device)
        with torch.set_grad_enabled(grad):
            eps = module(x, t, mb.row_data["cond"][rows].to(device), mb.row_data["head"][rows].to(device)).float()
            out = self._step(x, eps, t, mb.step_data["t_prev"][rows, cols].to(device), self.eta,
                             x_next=mb.step_data["x_next"][rows, cols].to(device))
            return gaussian_step_outputs(R, T, rows, cols, out, want)

    def describe(self, batch, i: int) -> dict:
        traj = batch.row_data["trajectory"][i]
        return {"prompt": str(batch.columns["prompt"][i]),
                "completion": " ".join(f"({x:.2f},{y:.2f})" for x, y in traj.tolist())}
