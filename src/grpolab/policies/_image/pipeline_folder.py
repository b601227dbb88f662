"""A user's diffusers pipeline folder (``model_index.json``), shared by the image kinds that train one of its parts.

The trained part (a UNet or a transformer) is the policy's module; every other part (VAE, text encoders,
tokenizers, scheduler) stays frozen on the policy, outside the module, so the optimiser, DDP and checkpoints
never see it. A final model is the source folder again with the trained part replaced: the frozen parts are
hard links where the file system allows, else copies, so ``<PipelineClass>.from_pretrained(OUT/final)`` loads it.
LoRA runs also write the adapters in diffusers' format (``pytorch_lora_weights.safetensors``), which
``pipe.load_lora_weights(OUT/final)`` reads.
"""
from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import torch

from ...config import ConfigError

#: the frozen parts a pipeline may have, by their model_index.json names
FROZEN_PARTS = ("vae", "text_encoder", "text_encoder_2", "text_encoder_3")


def pipeline_class(path) -> str | None:
    """The ``_class_name`` of ``path/model_index.json``, or None when ``path`` is not a pipeline folder."""
    index = Path(path) / "model_index.json"
    if not index.exists():
        return None
    return json.loads(index.read_text()).get("_class_name")


def text_dtype(cfg) -> torch.dtype:
    """The dtype of a pipeline's frozen text encoders: the run's ``dtype`` when it is bfloat16 / float16, else
    float32 (the VAE and the trained part stay float32)."""
    return {"bfloat16": torch.bfloat16, "bf16": torch.bfloat16, "float16": torch.float16,
            "fp16": torch.float16}.get(str(getattr(cfg, "dtype", "float32")), torch.float32)


def freeze_parts(pipe, cfg) -> None:
    """Every frozen part of ``pipe``: no gradients, eval mode, the VAE in float32 and the text encoders in
    :func:`text_dtype`."""
    pipe.set_progress_bar_config(disable=True)
    low = text_dtype(cfg)
    for name in FROZEN_PARTS:
        part = getattr(pipe, name, None)
        if part is not None:
            part.requires_grad_(False).eval()
            if part.dtype != (want := torch.float32 if name == "vae" else low):
                part.to(dtype=want)


def frozen_to(pipe, device) -> None:
    """Move ``pipe``'s frozen parts to ``device`` (a no-op where they are)."""
    for name in FROZEN_PARTS:
        part = getattr(pipe, name, None)
        if part is not None and part.device != torch.device(device):
            part.to(device)


def check_text_rows(rows: list[dict], eval_rows: list[dict], text_prompt) -> None:
    """The first 1,000 rows of each part have a text prompt (``text_prompt(row, where)`` raises otherwise)."""
    for where, part in (("train", rows), ("held-out", eval_rows)):
        for i, row in enumerate(part[:1000]):
            text_prompt(row, f"{where} row {i}")


def refuse_class(policy: str, path, found: str | None, supported: dict[str, str]) -> None:
    """A ConfigError for a pipeline class ``policy`` does not load, naming the classes it does and, where the
    class belongs to another policy, that policy."""
    other = {"StableDiffusionPipeline": "ddpm", "StableDiffusionXLPipeline": "ddpm", "DDPMPipeline": "ddpm",
             "StableDiffusion3Pipeline": "flow_matching", "FluxPipeline": "flow_matching"}.get(found or "")
    hint = f"; a {found} trains with policy {other} (--policy {other})" if other and other != policy else ""
    raise ConfigError(f"model: policy {policy} loads the diffusers pipeline folders "
                      f"{', '.join(f'{k} ({v})' for k, v in supported.items())}; {path}/model_index.json names "
                      f"{found!r}{hint}")


def _link_or_copy(src, dst) -> None:
    """``dst`` as a hard link to ``src`` (else a copy); a ``dst`` already there (a final folder written again: a
    resumed or extended run) is kept when it is that file, else replaced."""
    if os.path.exists(dst) and os.path.samefile(src, dst):
        return
    if os.path.lexists(dst):
        os.remove(dst)
    try:
        os.link(os.path.realpath(src), dst)
    except OSError:
        shutil.copy2(src, dst)


def save_pipeline(source, path, trained: str, module) -> None:
    """``path`` as the pipeline folder ``source`` with its part ``trained`` (``"unet"`` / ``"transformer"``)
    replaced by ``module`` (``save_pretrained``, float32): the frozen parts and the scheduler as they were (hard
    links where the file system allows, else copies)."""
    src, path = Path(source), Path(path)
    path.mkdir(parents=True, exist_ok=True)
    if src.resolve() != path.resolve():
        for entry in src.iterdir():
            if entry.name == trained or entry.name.startswith("."):
                continue
            if entry.is_dir():
                shutil.copytree(entry, path / entry.name, copy_function=_link_or_copy, dirs_exist_ok=True)
            elif entry.name == "model_index.json":
                shutil.copy2(entry, path / entry.name)
    module.save_pretrained(path / trained, safe_serialization=True)
