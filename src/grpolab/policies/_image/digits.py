"""The built-in tiny image models: class-conditional generators of scikit-learn's 8×8 digits (design §5.4).

Data: ``sklearn.datasets.load_digits()`` (1,797 images 8×8, values 0–16, shipped with scikit-learn: no
download), scaled to [−1, 1], one channel. Split: even indices train the classifier, odd ones are held out.

Models: one ``diffusers.UNet2DModel`` on 8×8×1, class-conditional through ``num_class_embeds=11`` (classes 0–9;
class :data:`UNCOND` = 10 is the unconditional label, used with probability 0.1 in pre-training so CFG works).

* ``flow``: rectified flow, loss ‖v_θ(x_σ, 1000·σ, c) − (ε − x₀)‖² with σ ~ U(0, 1) and x_σ = (1 − σ)x₀ + σε;
  the timestep fed to the UNet is 1000·σ, the convention of diffusers' ``FlowMatchEulerDiscreteScheduler``
  (``timesteps = sigmas · num_train_timesteps``); its ``scheduler_config.json`` is saved with the weights.
* ``ddpm``: the same UNet predicting ε, noised by ``DDPMScheduler(num_train_timesteps=1000)`` (linear betas);
  its ``scheduler_config.json`` is saved (a ``DDIMScheduler`` is built ``from_config`` of it for sampling).

Pre-training: AdamW (2e-3, cosine decay), batch 128, a **fixed** number of iterations (never a time- or
metric-based stop), seed 0, in float32. The recipe (:func:`pretrain_recipe`) is hashed into the cache folder's
name (``$GRPOLAB_CACHE/digits-<kind>-<hash12>/``, see ``model/cache.py``), so changing it rebuilds.

Size [measured, this repository's 2-core CI machine]: the design's ``block_out_channels=(32, 64)`` UNet
(0.64 M parameters) costs ≈ 52 ms per forward+backward+AdamW at batch 128 with 2 threads on an idle machine,
89 ms with 1 thread on a loaded one; the one here, ``(16, 32)`` (0.16 M parameters), 24 ms and 36 ms. The
base-accuracy target (:data:`ITERATIONS`) needs only 70 (flow) and 200 (DDPM) iterations, so either width fits
the ≈ 40 s budget; the narrower one is kept because every RL step of the image tests runs it (T forwards and
backwards).
Pre-training runs on **one thread** (``threads`` in the recipe; the caller's setting is restored): two
threads on a machine already busy (pytest-xdist's two workers on two cores) were 3–10× slower, and one thread
makes the weights independent of the caller's thread count.

:func:`sample_flow` / :func:`sample_ddim` are quick deterministic samplers (Euler ODE, DDIM η = 0) for checking
the base models' quality in tests and benchmarks; the RL sampling loops are the policies' (``grpolab/policies``).
"""
from __future__ import annotations

import hashlib
import time
from pathlib import Path

import numpy as np
import torch

from ...model.cache import cached_build, pretraining

KINDS = ("flow", "ddpm")
NUM_CLASSES = 10
UNCOND = 10  #: the unconditional class label (label dropout in pre-training, CFG's v_u)
NUM_TRAIN_TIMESTEPS = 1000
#: Pre-training iterations, tuned once for a base held-out class accuracy (8-step Euler / 10-step DDIM, classifier
#: argmax = asked class) inside 0.3–0.85 so RL has room: flow 60 → 0.73, 80 → 0.83, 100 → 0.86, 300 → 0.95;
#: DDPM 150 → 0.44, 200 → 0.62, 300 → 0.81, 600 → 0.87 [measured, 500 samples each].
ITERATIONS = {"flow": 70, "ddpm": 200}


# ---------------------------------------------------------------------------------------------------- data

def load_digits_tensor() -> tuple[torch.Tensor, torch.Tensor]:
    """``(images, labels)``: float32 ``[1797, 1, 8, 8]`` in [−1, 1] (pixel/8 − 1) and int64 ``[1797]``."""
    from sklearn.datasets import load_digits

    d = load_digits()
    images = torch.from_numpy(d.images.astype(np.float32) / 8.0 - 1.0).unsqueeze(1)
    labels = torch.from_numpy(d.target.astype(np.int64))
    return images.contiguous(), labels


def split_digits(images: torch.Tensor, labels: torch.Tensor, part: str):
    """The fixed split: ``part='train'`` the even indices, ``'held_out'`` the odd ones."""
    if part not in ("train", "held_out"):
        raise ValueError(f"part must be 'train' or 'held_out', got {part!r}")
    sl = slice(0, None, 2) if part == "train" else slice(1, None, 2)
    return images[sl], labels[sl]


def data_sha256(images: torch.Tensor, labels: torch.Tensor) -> str:
    h = hashlib.sha256()
    h.update(images.numpy().astype("<f4").tobytes())
    h.update(labels.numpy().astype("<i8").tobytes())
    return h.hexdigest()


# ---------------------------------------------------------------------------------------------------- model

def tiny_unet_config(block_out_channels=(16, 32), layers_per_block: int = 1, norm_num_groups: int = 8) -> dict:
    """The ``UNet2DModel`` config of the tiny digits models (8×8×1, 11 class embeddings, no attention)."""
    return dict(sample_size=8, in_channels=1, out_channels=1, layers_per_block=layers_per_block,
                block_out_channels=list(block_out_channels),
                down_block_types=["DownBlock2D"] * len(block_out_channels),
                up_block_types=["UpBlock2D"] * len(block_out_channels),
                norm_num_groups=norm_num_groups, add_attention=False, num_class_embeds=NUM_CLASSES + 1)


def build_unet(config: dict, seed: int = 0):
    """A freshly initialised ``UNet2DModel`` from ``config``, its init drawn under ``seed`` (global RNG kept)."""
    from diffusers import UNet2DModel

    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        return UNet2DModel(**config).float()


def build_tiny_unet(kind: str = "flow", seed: int = 0):
    """The untrained tiny UNet of ``kind`` (both kinds share the architecture)."""
    _check_kind(kind)
    return build_unet(pretrain_recipe(kind)["unet"], seed=seed)


def n_parameters(module: torch.nn.Module) -> int:
    return sum(p.numel() for p in module.parameters())


def scheduler_config(kind: str) -> dict:
    """The diffusers scheduler saved beside the weights: flow-matching Euler (shift 1) or DDPM (linear)."""
    _check_kind(kind)
    if kind == "flow":
        return {"_class_name": "FlowMatchEulerDiscreteScheduler", "num_train_timesteps": NUM_TRAIN_TIMESTEPS,
                "shift": 1.0}
    return {"_class_name": "DDPMScheduler", "num_train_timesteps": NUM_TRAIN_TIMESTEPS, "beta_schedule": "linear",
            "beta_start": 0.0001, "beta_end": 0.02, "prediction_type": "epsilon", "clip_sample": True}


def make_scheduler(kind: str, config: dict | None = None):
    from diffusers import DDPMScheduler, FlowMatchEulerDiscreteScheduler

    config = dict(config or scheduler_config(kind))
    cls = FlowMatchEulerDiscreteScheduler if kind == "flow" else DDPMScheduler
    return cls.from_config(config)


def pretrain_recipe(kind: str) -> dict:
    """Everything that determines the pre-trained weights (hashed into the cache folder's name)."""
    _check_kind(kind)
    return {"kind": kind, "version": 1, "unet": tiny_unet_config(), "scheduler": scheduler_config(kind),
            "data": "sklearn.datasets.load_digits, all 1797, pixel/8-1", "iterations": ITERATIONS[kind],
            "batch_size": 128, "optimizer": "AdamW", "learning_rate": 2e-3, "weight_decay": 0.0,
            "lr_schedule": "cosine", "label_dropout": 0.1, "seed": 0, "dtype": "float32", "threads": 1}


def _check_kind(kind: str) -> None:
    if kind not in KINDS:
        raise ValueError(f"digits model kind must be one of {', '.join(KINDS)}, got {kind!r}")


# ---------------------------------------------------------------------------------------------------- pre-training

def _pretrain(kind: str, model, images: torch.Tensor, labels: torch.Tensor, recipe: dict, log=None) -> list[float]:
    """Train ``model`` in place by the recipe (``cache.fit``); returns the mean loss of each tenth of the run."""
    from ...model.cache import fit

    g = torch.Generator().manual_seed(recipe["seed"])
    if kind == "ddpm":
        alphas_cumprod = make_scheduler("ddpm", recipe["scheduler"]).alphas_cumprod.float()

    def batch_loss(idx):
        bs = len(idx)
        x0, c = images[idx], labels[idx].clone()
        c[torch.rand(bs, generator=g) < recipe["label_dropout"]] = UNCOND
        eps = torch.randn(x0.shape, generator=g)
        if kind == "ddpm":
            t = torch.randint(0, NUM_TRAIN_TIMESTEPS, (bs,), generator=g)
            a = alphas_cumprod[t].view(-1, 1, 1, 1)
            xt = a.sqrt() * x0 + (1 - a).sqrt() * eps
            target, timestep = eps, t
        else:  # rectified flow (the flow and the frames models)
            sigma = torch.rand(bs, generator=g)
            s = sigma.view(-1, 1, 1, 1)
            xt = (1 - s) * x0 + s * eps
            target, timestep = eps - x0, sigma * NUM_TRAIN_TIMESTEPS
        pred = model(xt, timestep, class_labels=c).sample
        return (pred - target).pow(2).mean()

    return fit(model, len(images), recipe, batch_loss, g, name=kind, log=log)


def pretrain_flow(recipe: dict | None = None, log=None):
    """``(model, loss_curve)``: the tiny UNet pre-trained by rectified flow (not cached; see
    :func:`digits_model_path`)."""
    return _pretrain_kind("flow", recipe, log)


def pretrain_ddpm(recipe: dict | None = None, log=None):
    """``(model, loss_curve)``: the tiny UNet pre-trained by DDPM ε-prediction (not cached)."""
    return _pretrain_kind("ddpm", recipe, log)


def _pretrain_kind(kind: str, recipe: dict | None, log):
    recipe = recipe or pretrain_recipe(kind)
    images, labels = load_digits_tensor()
    model = build_unet(recipe["unet"], seed=recipe["seed"])
    with pretraining(recipe):
        losses = _pretrain(kind, model, images, labels, recipe, log)
    return model, losses


# ---------------------------------------------------------------------------------------------------- cache

def digits_model_path(kind: str, log=print) -> Path:
    """Folder with the pre-trained tiny digits model of ``kind`` (``flow`` or ``ddpm``), built on first use:
    ``config.json`` + ``diffusion_pytorch_model.safetensors`` (diffusers' ``save_pretrained``),
    ``scheduler_config.json`` and ``meta.json``."""
    _check_kind(kind)
    recipe = pretrain_recipe(kind)
    n_params = n_parameters(build_unet(recipe["unet"]))

    def build(tmp: Path) -> dict:
        images, labels = load_digits_tensor()
        t0 = time.perf_counter()
        model, losses = pretrain_flow(recipe) if kind == "flow" else pretrain_ddpm(recipe)
        seconds = time.perf_counter() - t0
        model.save_pretrained(tmp, safe_serialization=True)
        make_scheduler(kind, recipe["scheduler"]).save_config(tmp)
        return {"seed": recipe["seed"], "data_sha256": data_sha256(images, labels), "parameters": n_params,
                "loss_curve": losses, "train_seconds": round(seconds, 2)}

    name = "flow" if kind == "flow" else "DDPM"
    message = (f"[grpolab] pre-training the tiny digits {name} model (UNet2DModel, {n_params / 1e6:.2f}M parameters, "
               f"1,797 scikit-learn digits, {recipe['iterations']:,} steps; one time, about {_estimate(recipe)} s) and "
               f"caching it in {_target(kind, recipe)}")
    return cached_build(f"digits-{kind}", recipe, build, log=log, message=message)


def _estimate(recipe: dict) -> int:
    """Seconds a build takes, roughly: ≈ 40 ms an iteration on one busy core [measured], in steps of 5 s."""
    return max(5, 5 * round(recipe["iterations"] * 0.04 / 5))


def _target(kind: str, recipe: dict) -> Path:
    from ...model.cache import cached_path
    return cached_path(f"digits-{kind}", recipe)


def load_digits_model(kind: str, log=print):
    """The pre-trained tiny digits ``UNet2DModel`` of ``kind``, float32, in eval mode (built and cached on
    first use)."""
    from diffusers import UNet2DModel

    path = digits_model_path(kind, log=log)
    model = UNet2DModel.from_pretrained(path, torch_dtype=torch.float32)
    return model.eval()


# ---------------------------------------------------------------------------------------------------- quick samplers

def _noise(n: int, seed: int) -> torch.Tensor:
    return torch.randn((n, 1, 8, 8), generator=torch.Generator().manual_seed(seed))


@torch.no_grad()
def sample_flow(model, labels: torch.Tensor, steps: int = 8, seed: int = 0, noise: torch.Tensor | None = None,
                guidance_scale: float = 1.0) -> torch.Tensor:
    """Euler ODE samples of a flow model for ``labels`` (diffusers' ``FlowMatchEulerDiscreteScheduler``,
    ``steps`` steps, timestep = 1000·σ), float32 ``[B, 1, 8, 8]``, roughly in [−1, 1]. For quality checks."""
    from diffusers import FlowMatchEulerDiscreteScheduler

    sched = FlowMatchEulerDiscreteScheduler(num_train_timesteps=NUM_TRAIN_TIMESTEPS)
    sched.set_timesteps(steps)
    x = _noise(len(labels), seed) if noise is None else noise.clone()
    for t in sched.timesteps:
        v = _guided(model, x, t, labels, guidance_scale)
        x = sched.step(v, t, x).prev_sample
    return x


@torch.no_grad()
def sample_ddim(model, labels: torch.Tensor, steps: int = 10, seed: int = 0, noise: torch.Tensor | None = None,
                guidance_scale: float = 1.0, config: dict | None = None) -> torch.Tensor:
    """DDIM (η = 0) samples of an ε-prediction model: ``DDIMScheduler.from_config`` of the DDPM scheduler,
    ``steps`` steps. For quality checks."""
    from diffusers import DDIMScheduler

    sched = DDIMScheduler.from_config(config or scheduler_config("ddpm"))
    sched.set_timesteps(steps)
    x = _noise(len(labels), seed) if noise is None else noise.clone()
    for t in sched.timesteps:
        eps = _guided(model, x, t, labels, guidance_scale)
        x = sched.step(eps, t, x, eta=0.0).prev_sample
    return x


def _guided(model, x, t, labels, w: float):
    tt = torch.full((len(x),), float(t))
    out = model(x, tt, class_labels=labels).sample
    if w == 1.0:
        return out
    unc = model(x, tt, class_labels=torch.full_like(labels, UNCOND)).sample
    return unc + w * (out - unc)


def sample_digits(model, kind: str, labels: torch.Tensor, seed: int = 0, steps: int | None = None,
                  guidance_scale: float = 1.0) -> torch.Tensor:
    """Quick samples of either kind, clamped to [−1, 1]."""
    _check_kind(kind)
    if kind == "flow":
        x = sample_flow(model, labels, steps=steps or 8, seed=seed, guidance_scale=guidance_scale)
    else:
        x = sample_ddim(model, labels, steps=steps or 10, seed=seed, guidance_scale=guidance_scale)
    return x.clamp(-1, 1)


# ---------------------------------------------------------------------------------------------------- frames

#: The 3-frame digit stacks of the ``digit_frames`` task (Self-Paced GRPO, seed 000-36, design §7): frame t
#: (t = 0, 1, 2) is the digit shifted right by t pixels (zero-filled, i.e. −1 in the model's scale), the three
#: frames stored as the 3 channels of one 8×8 image. The flow UNet is the ``flow`` model's architecture with
#: ``in_channels = out_channels = 3``, pre-trained by the same rectified-flow loop on the 1,797 stacks.
FRAMES = 3
#: Pre-training iterations [measured once, 300 Euler samples, 8 steps]: asked-class accuracy of frames 0/1/2 as they
#: are 0.59 / 0.35 / 0.23 (the classifier saw centred digits only), mean |f_{t+1} − S_1 f_t| = 0.09 (in [0, 1]);
#: 22 s on one thread of a busy 2-core machine.
FRAMES_ITERATIONS = 120


def shift_right(images: torch.Tensor, pixels: int, fill: float) -> torch.Tensor:
    """``[..., H, W]`` shifted right by ``pixels`` columns, the vacated columns set to ``fill``."""
    if pixels == 0:
        return images.clone()
    out = torch.full_like(images, fill)
    out[..., pixels:] = images[..., :-pixels]
    return out


def frame_stacks(images: torch.Tensor) -> torch.Tensor:
    """``[N, 1, 8, 8]`` digits in [−1, 1] → ``[N, 3, 8, 8]``: channel t = the digit shifted right by t pixels."""
    return torch.cat([shift_right(images, t, -1.0) for t in range(FRAMES)], dim=1).contiguous()


def frames_recipe() -> dict:
    """Everything that determines the pre-trained frames model (hashed into its cache folder's name)."""
    unet = {**tiny_unet_config(), "in_channels": FRAMES, "out_channels": FRAMES}
    return {"kind": "frames", "version": 1, "unet": unet, "scheduler": scheduler_config("flow"),
            "data": "sklearn.datasets.load_digits, all 1797, pixel/8-1, frames t=0,1,2 shifted right by t px",
            "iterations": FRAMES_ITERATIONS, "batch_size": 128, "optimizer": "AdamW", "learning_rate": 2e-3,
            "weight_decay": 0.0, "lr_schedule": "cosine", "label_dropout": 0.1, "seed": 0, "dtype": "float32",
            "threads": 1}


def pretrain_frames(recipe: dict | None = None, log=None):
    """``(model, loss_curve)``: the 3-channel UNet pre-trained by rectified flow on the frame stacks (not
    cached; see :func:`frames_model_path`)."""
    recipe = recipe or frames_recipe()
    images, labels = load_digits_tensor()
    stacks = frame_stacks(images)
    model = build_unet(recipe["unet"], seed=recipe["seed"])
    with pretraining(recipe):
        losses = _pretrain("flow", model, stacks, labels, recipe, log)  # the flow loop, on 3 channels
    return model, losses


def frames_model_path(log=print) -> Path:
    """Folder with the pre-trained 3-frame digits flow model (built on first use, cached like the others)."""
    recipe = frames_recipe()
    n_params = n_parameters(build_unet(recipe["unet"]))

    def build(tmp: Path) -> dict:
        images, labels = load_digits_tensor()
        t0 = time.perf_counter()
        model, losses = pretrain_frames(recipe)
        seconds = time.perf_counter() - t0
        model.save_pretrained(tmp, safe_serialization=True)
        make_scheduler("flow", recipe["scheduler"]).save_config(tmp)
        return {"seed": recipe["seed"], "data_sha256": data_sha256(images, labels), "parameters": n_params,
                "loss_curve": losses, "train_seconds": round(seconds, 2)}

    from ...model.cache import cached_path
    message = (f"[grpolab] pre-training the tiny 3-frame digits flow model (UNet2DModel, {n_params / 1e6:.2f}M "
               f"parameters, 1,797 scikit-learn digits as 3 shifted frames, {recipe['iterations']:,} steps; one "
               f"time, about {_estimate(recipe)} s) and caching it in {cached_path('digits-frames', recipe)}")
    return cached_build("digits-frames", recipe, build, log=log, message=message)


def load_frames_model(log=print):
    """The pre-trained 3-frame digits ``UNet2DModel``, float32, eval mode (built and cached on first use)."""
    from diffusers import UNet2DModel

    return UNet2DModel.from_pretrained(frames_model_path(log=log), torch_dtype=torch.float32).eval()
