"""ViPO's Perceptual Structuring Module as a batch stage: per-element weights of each image's denoising steps."""
from __future__ import annotations

import functools
from dataclasses import replace

import torch

from ...config import ConfigError
from .vipo import element_weights, pca_maps
from ...registry import BATCH_STAGES, POLICIES, param


def _check_vipo_maps(cfg) -> None:
    if not getattr(POLICIES.get(cfg.policy), "uses_element_weights", False):
        users = ", ".join(n for n, c in POLICIES.items() if getattr(c, "uses_element_weights", False))
        raise ConfigError(f"batch stage 'vipo_maps' weights the elements of each step's log-prob; policy "
                          f"{cfg.policy} ignores row_data['element_weights'] (policies that use them: {users})")
    if cfg.vipo_components < 1:
        raise ConfigError(f"vipo_components: at least 1 PCA component, got {cfg.vipo_components}")


@functools.lru_cache(maxsize=1)
def _backbone():
    from .classifier import load_digit_classifier
    return load_digit_classifier(log=lambda *a, **k: None)


@BATCH_STAGES.register("vipo_maps", check=_check_vipo_maps, needs=("gaussian_steps", "images"))
def vipo_maps(batch, ctx, *,
              vipo_components: int = param(3, "vipo_maps: PCA components of the batch's backbone features (the "
                                              "paper's ablation prefers 3); the map is |first component|")):
    """ViPO's perceptual allocation maps (Ni et al., "Seeing What Matters: Visual Preference Policy
    Optimization", arXiv:2511.18719; seed 004-10) as per-element weights of every denoising step's log-prob.

    Features F = the digit classifier's last conv maps [R, 32, 4, 4] of each row's final image
    (``row_data["images"]`` mapped to [−1, 1]); PCA over the batch's R·16 feature vectors (centred,
    ``vipo_components`` components); map m_i(p) = |⟨F_i(p) − mean, v₁⟩| normalised to mean 1 per image;
    upsampled (bilinear) to the latent, renormalised to mean 1 and the same on each channel →
    ``row_data["element_weights"]`` w_i(u). The policy's step log-prob becomes

        log p_ij = (1/d)·Σ_u w_i(u)·ℓ_ij(u)    (ℓ(u): the per-element Gaussian log-density terms)

    so the advantage A_i acts as the map A_i·w_i(u) on the elements (w ≡ 1 is the plain log-prob), and
    ``behavior_logprobs`` are recomputed with the same weights under the behaviour model (``ctx.logprobs``),
    so ratios start at 1. Only ``flow_matching`` uses the weights (a config check).

    Provenance: reconstructed from the abstract — and the paper's summary (no code found: the code index and the
    project page akira-l.github.io/publications/vipo); the backbone is grpolab's in-process digit classifier,
    not the paper's DINO; only the first PCA component is used (the paper aggregates its components with
    variance weighting, and over frames for video); the map weights the log-prob's elements, which with the
    clipped ratio differs from weighting the advantage only inside the clip.
    Test: tests/test_image_dgpo_vipo.py::test_uniform_map_is_the_plain_logprob,
    tests/test_image_dgpo_vipo.py::test_vipo_weights_average_one.
    """
    images = batch.row_data["images"].float()
    backbone = _backbone()
    with torch.no_grad():
        feats = backbone.features(images.cpu() * 2 - 1)
    maps = pca_maps(feats, vipo_components)
    weights = element_weights(maps, tuple(batch.step_data["x"].shape[2:]))
    out = replace(batch, row_data={**batch.row_data, "element_weights": weights.to(images.device)})
    out.behavior_logprobs = ctx.logprobs(out).to(batch.behavior_logprobs.dtype)
    return out
