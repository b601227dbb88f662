"""ViPO's pieces (Ni et al., "Seeing What Matters: Visual Preference Policy Optimization", arXiv:2511.18719; seed
004-10): the perceptual allocation map of a batch of images and the element-weighted step log-prob.

Reconstructed from the paper's summary (no code found): features of a frozen vision backbone, PCA over the
batch, the first component's magnitude as a map of mean 1 per image, which then weights the per-element terms
of each denoising step's log-prob. The backbone here is the in-process digit classifier
(``policies/_image/classifier.py``, its last conv maps), not the paper's DINO."""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F

_HALF_LOG_2PI = 0.5 * math.log(2.0 * math.pi)


def _rows_like(t: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    t = torch.as_tensor(t, dtype=like.dtype, device=like.device)
    return t.reshape(-1, *([1] * (like.ndim - 1))) if t.ndim >= 1 else t


def weighted_step_logprob(kind: str, x_next: torch.Tensor, mean: torch.Tensor, std: torch.Tensor,
                          weights: torch.Tensor) -> torch.Tensor:
    """The step log-prob with per-element weights w(u): [R].

    Gaussian steps (``flow_grpo``, ``dance``): (1/d)·Σ_u w(u)·[−(x'_u − μ_u)²/(2·std²) − log std − ½·log 2π],
    0 for rows whose std is 0 (as ``sde.gaussian_step_logprob``, which is w ≡ 1). ``cps``: −(1/d)·Σ_u w(u)·(x'_u −
    μ_u)² (the code's constant-free value, weighted alike). ``x_next`` is detached; ``std`` is [R];
    ``weights`` broadcast to ``mean`` ([R, *x] or [R, 1, H, W]).
    """
    dtype = torch.promote_types(torch.float32, mean.dtype)
    mean = mean.to(dtype)
    x_next = x_next.detach().to(dtype)
    w = weights.to(dtype=dtype, device=mean.device).expand_as(mean)
    dims = tuple(range(1, mean.ndim))
    if kind == "cps":
        return -(w * (x_next - mean) ** 2).mean(dim=dims)
    s = _rows_like(std.to(dtype), mean)
    positive = s > 0
    safe = torch.where(positive, s, torch.ones_like(s))
    elem = -((x_next - mean) ** 2) / (2 * safe**2) - torch.log(safe) - _HALF_LOG_2PI
    return torch.where(positive.reshape(-1), (w * elem).mean(dim=dims), torch.zeros((), dtype=dtype,
                                                                                    device=mean.device))


def pca_maps(features: torch.Tensor, components: int = 3, eps: float = 1e-8) -> torch.Tensor:
    """Allocation maps [B, h, w] from feature maps [B, C, h, w]: PCA of the batch's B·h·w feature vectors
    (centred; the top ``components`` right singular vectors), |projection on the first| per position,
    normalised to mean 1 per image (an image whose map is all 0 gets 1 everywhere)."""
    B, C, h, w = features.shape
    X = features.permute(0, 2, 3, 1).reshape(-1, C).double()
    Xc = X - X.mean(0, keepdim=True)
    _, _, Vh = torch.linalg.svd(Xc, full_matrices=False)
    comps = Vh[:max(1, min(components, Vh.shape[0]))]
    m = (Xc @ comps[0]).abs().reshape(B, h, w)
    return normalise_mean_one(m, eps).float()


def normalise_mean_one(m: torch.Tensor, eps: float = 1e-8) -> torch.Tensor:
    """Each row of ``m`` [B, ...] divided by its mean (a row whose mean is below eps becomes all 1)."""
    mu = m.mean(dim=tuple(range(1, m.ndim)), keepdim=True)
    return torch.where(mu > eps, m / mu.clamp_min(eps), torch.ones_like(m))


def element_weights(maps: torch.Tensor, latent_shape: tuple) -> torch.Tensor:
    """Maps [B, h, w] upsampled (bilinear) to a latent [C, H, W], renormalised to mean 1, the same on every
    channel: [B, C, H, W]."""
    C, H, W = latent_shape
    up = F.interpolate(maps[:, None].float(), size=(H, W), mode="bilinear", align_corners=False)
    return normalise_mean_one(up).expand(-1, C, H, W).contiguous()
