"""Checkpoints: weights (safetensors), optimiser, scheduler, components, RNG, step.

Layout::

    OUT/checkpoints/step_000010/weights.safetensors   trainable parameters
    OUT/checkpoints/step_000010/state.pt              everything else

A checkpoint is written into ``step_N.tmp`` and renamed when complete, so a
run killed mid-save (even by ``kill -9``) leaves the previous checkpoint intact.
"""
from __future__ import annotations

import random
import shutil
from pathlib import Path

import numpy as np
import torch
from safetensors.torch import load_file, save_file


def checkpoint_dirs(out: Path) -> list[Path]:
    root = Path(out) / "checkpoints"
    if not root.exists():
        return []
    return sorted(p for p in root.glob("step_*") if p.is_dir() and not p.name.endswith(".tmp"))


def latest_checkpoint(out: Path) -> Path | None:
    dirs = checkpoint_dirs(out)
    return dirs[-1] if dirs else None


def rng_state(generator: torch.Generator, device_generator: torch.Generator | None = None) -> dict:
    """Every random stream of a run: torch, Python, NumPy, the trainer's generator, the device's sampler."""
    state = {"torch": torch.get_rng_state(), "python": random.getstate(), "numpy": np.random.get_state(),
             "sampling": generator.get_state()}
    if device_generator is not None and device_generator is not generator:
        state["device_sampling"] = device_generator.get_state()
    return state


def set_rng_state(state: dict, generator: torch.Generator, device_generator: torch.Generator | None = None) -> None:
    torch.set_rng_state(state["torch"])
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    generator.set_state(state["sampling"])
    if device_generator is not None and "device_sampling" in state:
        device_generator.set_state(state["device_sampling"])


def trainable_state(model) -> dict[str, torch.Tensor]:
    return {n: p.detach().contiguous().clone() for n, p in model.named_parameters() if p.requires_grad}


def save_checkpoint(out: Path, step: int, model, state: dict, keep: int) -> Path:
    root = Path(out) / "checkpoints"
    final = root / f"step_{step:06d}"
    tmp = root / f"step_{step:06d}.tmp"
    if tmp.exists():
        shutil.rmtree(tmp)
    tmp.mkdir(parents=True)
    save_file(trainable_state(model), str(tmp / "weights.safetensors"))
    torch.save(state, tmp / "state.pt")
    if final.exists():
        shutil.rmtree(final)
    tmp.rename(final)
    for old in checkpoint_dirs(out)[:-keep] if keep > 0 else []:
        shutil.rmtree(old, ignore_errors=True)
    return final


def load_checkpoint(path: Path, model) -> dict:
    weights = load_file(str(Path(path) / "weights.safetensors"))
    missing, unexpected = model.load_state_dict(weights, strict=False)
    if unexpected:
        raise RuntimeError(f"checkpoint {path} has weights the model does not: {unexpected[:5]}")
    trainable = {n for n, p in model.named_parameters() if p.requires_grad}
    absent = trainable - set(weights)
    if absent:
        raise RuntimeError(f"checkpoint {path} lacks trainable weights: {sorted(absent)[:5]}")
    return torch.load(Path(path) / "state.pt", weights_only=False)
