"""VAR RL mask propagation (seed 000-27): only the tokens whose pixels move the reward stay on the loss mask."""
from __future__ import annotations

from dataclasses import replace

import torch
from torch.nn import functional as F

from ...errors import ConfigError
from ...registry import BATCH_STAGES, param


def _check(cfg) -> None:
    q = float(cfg.var_mask_top_q)
    if not 0 < q <= 1:
        raise ConfigError(f"var_mask_top_q: the fraction of the 8x8 pixels kept, in (0, 1]; got {q}")


def pixel_saliency(images: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """``|∂ digit_confidence / ∂ pixel|`` ``[R, 8, 8]`` of images ``[R, 1, 8, 8]`` in [0, 1]: the gradient of the
    classifier's softmax probability of the asked class (the reward ``digit_confidence``, input 2x − 1)."""
    from .._image.tasks import digit_classifier

    clf = digit_classifier()
    x = images.detach().float().cpu().clone().requires_grad_(True)
    with torch.enable_grad():
        p = clf(x * 2 - 1).softmax(-1).gather(-1, labels.long().cpu()[:, None]).sum()
        (g,) = torch.autograd.grad(p, x)
    return g.abs()[:, 0]


def top_q_mask(saliency: torch.Tensor, q: float) -> torch.Tensor:
    """``[R, 8, 8]`` bool: per row the ``max(1, round(q · 64))`` pixels of largest saliency (ties: the lower raster
    index first)."""
    R = saliency.shape[0]
    flat = saliency.reshape(R, -1)
    n = max(1, int(round(q * flat.shape[1])))
    order = torch.sort(-flat, dim=1, stable=True).indices[:, :n]
    keep = torch.zeros_like(flat, dtype=torch.bool).scatter_(1, order, True)
    return keep.reshape(saliency.shape)


def propagate(mask8: torch.Tensor) -> torch.Tensor:
    """``[R, 8, 8]`` bool → token mask ``[R, 85]``: the 8×8 mask max-pooled to each scale (a coarse token stays when
    any pixel under it does), scales coarsest first, each map in raster order (policy var_image's layout)."""
    from .model import SIDES

    m = mask8.float()[:, None]
    return torch.cat([F.max_pool2d(m, 8 // s).reshape(len(m), -1) for s in SIDES], 1) > 0


@BATCH_STAGES.register("var_mask_propagation", check=_check, needs=("scales", "images"))
def var_mask_propagation(batch, ctx=None, *,
                         var_mask_top_q: float = param(0.5, "var_mask_propagation: fraction of the 8x8 pixels, by "
                                                       "|d digit_confidence / d pixel|, whose tokens stay on the "
                                                       "loss mask (max-pooled to the coarser scales)")):
    """Mask propagation, MP ("VAR RL Done Right", Sun et al., arXiv:2601.02256; seed 000-27).

    Per row: the saliency ``|∂ r / ∂ x|`` of the reward r = ``digit_confidence`` (the classifier's probability of
    the asked class) with respect to each pixel of the decoded 8×8 image; the top ``var_mask_top_q`` fraction of
    pixels (``max(1, round(q·64))``, ties: lower raster index) form the finest scale's mask; each coarser scale's
    mask is the max-pool of it (2×2 → 4×4, ...): a token stays when any pixel it covers does. Tokens outside go off
    ``completion_mask`` and their advantages become 0, so the update acts only where (space) and at the scales
    (time) that produced the reward-relevant pixels. Reads ``row_data["images"]`` and ``row_data["cond"]``.

    Provenance: reconstructed from the abstract — no public code found (searched the code index for "VAR
    reinforcement learning next-scale GRPO" and repository names containing "var"); the abstract's "mask
    propagation ... derived from ReFL ... to isolate optimization effects both spatially and temporally" and
    the reference notes. Choices made: the reward's input gradient as the relevance map (ReFL-style: the reward
    is differentiable here; the paper's exact relevance measure is not known to us), a top-q fraction at the
    finest scale, max-pooling to coarser scales, a binary mask (no soft weights), the digits classifier as the
    differentiable reward (the stage is tied to digit_confidence whatever the run's rewards).
    Test: tests/test_var_image.py::test_mask_propagation_by_hand.
    """
    images, labels = batch.row_data.get("images"), batch.row_data.get("cond")
    if images is None or labels is None:
        raise ValueError("stage var_mask_propagation needs row_data['images'] and row_data['cond'] (policy var_image)")
    keep = propagate(top_q_mask(pixel_saliency(images, labels), float(var_mask_top_q)))
    if keep.shape != batch.completion_mask.shape:
        raise ValueError(f"stage var_mask_propagation: token mask {tuple(keep.shape)} does not match the batch's "
                         f"{tuple(batch.completion_mask.shape)} (policy var_image's 85 tokens)")
    keep = keep.to(batch.completion_mask.device)
    mask = batch.completion_mask * keep.to(batch.completion_mask.dtype)
    out = {"completion_mask": mask}
    if batch.advantages is not None:
        out["advantages"] = batch.advantages * keep.to(batch.advantages.dtype)
    if ctx is not None and hasattr(ctx, "metric"):
        ctx.metric("var_mask_kept", float(mask.sum() / batch.completion_mask.sum().clamp(min=1)))
    return replace(batch, **out)
