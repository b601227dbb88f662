"""A k-means codebook over the 2×2 patches of the 8×8 digits: an image is 16 tokens (design §5.5, ``ar_image``).

The tokenizer of the autoregressive image policy (``policies/ar_image/policy.py``), the tiny stand-in for the VQ
tokenizer of AR-GRPO's LlamaGen [ours]. An 8×8 image (one channel, values in [−1, 1], the digits models'
scale) is cut into its 4×4 grid of 2×2 patches, read in raster order (patch row by patch row; inside a patch
the pixels (0,0), (0,1), (1,0), (1,1)): 16 vectors of 4 values. Each is replaced by the index of its nearest
codebook vector (squared Euclidean distance, ties: the lowest index): 16 codes in 0..K−1. Decoding puts the
codebook vectors back in place.

The codebook: :data:`K` = 64 centres fitted by Lloyd's k-means in torch on every 2×2 patch of the 1,797
scikit-learn digits (28,752 vectors), :data:`ITERATIONS` fixed iterations (never a tolerance stop) from
:data:`K` distinct data vectors drawn with ``torch.Generator().manual_seed(seed)``; a centre that loses all its
points keeps its position. Cached by :func:`~grpolab.model.cache.cached_build` (``digits-codebook-<hash12>/``:
``codebook.safetensors``, ``meta.json`` with the reconstruction error). Round trip [measured]: mean squared
error 0.027 per pixel on the [−1, 1] scale over all 1,797 digits (RMS 0.16, about 1.3 steps of the 17 grey
levels, 0.125 apart; 10 iterations 0.0275, 50 0.0265), largest pixel error 1.07 of the range 2
(:data:`ROUND_TRIP_MSE_BOUND` is the bound the tests check).
"""
from __future__ import annotations

from pathlib import Path

import torch

from ...model.cache import cached_build
from .._image.codebook import TableCodebook

K = 64  #: codebook size
PATCH = 2  #: patch side
SIDE = 8  #: image side
TOKENS = (SIDE // PATCH) ** 2  #: tokens per image (16)
ITERATIONS = 30  #: Lloyd iterations (fixed)
ROUND_TRIP_MSE_BOUND = 0.035  #: per-pixel MSE on [−1, 1] the tests allow (measured 0.027)


def patches(images: torch.Tensor) -> torch.Tensor:
    """``[N, 1, 8, 8]`` → ``[N, 16, 4]``: the 2×2 patches in raster order, each read row by row."""
    n = images.shape[0]
    g = SIDE // PATCH
    x = images.reshape(n, g, PATCH, g, PATCH)  # [N, patch row, row in patch, patch col, col in patch]
    return x.permute(0, 1, 3, 2, 4).reshape(n, g * g, PATCH * PATCH)


def unpatch(vectors: torch.Tensor) -> torch.Tensor:
    """The inverse of :func:`patches`: ``[N, 16, 4]`` → ``[N, 1, 8, 8]``."""
    n = vectors.shape[0]
    g = SIDE // PATCH
    x = vectors.reshape(n, g, g, PATCH, PATCH).permute(0, 1, 3, 2, 4)
    return x.reshape(n, 1, SIDE, SIDE)


def nearest(x: torch.Tensor, centres: torch.Tensor) -> torch.Tensor:
    """Index of the nearest centre (squared distance; ties: the lowest index) of every row of ``x`` [M, D]."""
    d = x.pow(2).sum(-1, keepdim=True) - 2 * x @ centres.T + centres.pow(2).sum(-1)[None, :]
    return d.argmin(-1)


def kmeans(x: torch.Tensor, k: int, iterations: int, seed: int) -> torch.Tensor:
    """Lloyd's k-means on ``x`` [M, D] (float32): ``k`` centres from ``k`` distinct rows drawn by a generator
    seeded ``seed``, then ``iterations`` assign/average steps; an empty cluster keeps its centre."""
    g = torch.Generator().manual_seed(seed)
    x = x.float()
    centres = x[torch.randperm(len(x), generator=g)[:k]].clone()
    for _ in range(iterations):
        assign = nearest(x, centres)
        sums = torch.zeros_like(centres).index_add_(0, assign, x)
        counts = torch.zeros(k).index_add_(0, assign, torch.ones(len(x)))
        full = counts > 0
        centres[full] = sums[full] / counts[full, None]
    return centres


class Codebook(TableCodebook):
    """``table``: the centres [K, 4] (float32, the [−1, 1] pixel scale), in ``codebook.safetensors``;
    :meth:`encode` images to codes, :meth:`decode` codes to images."""

    file, key = "codebook.safetensors", "centres"

    def encode(self, images: torch.Tensor) -> torch.Tensor:
        """``[N, 1, 8, 8]`` in [−1, 1] → codes ``[N, 16]`` (long)."""
        p = patches(images.float())
        return nearest(p.reshape(-1, p.shape[-1]), self.table).reshape(p.shape[0], TOKENS)

    def decode(self, codes: torch.Tensor) -> torch.Tensor:
        """Codes ``[N, 16]`` → ``[N, 1, 8, 8]`` on the [−1, 1] scale."""
        return unpatch(self.table.to(codes.device)[codes.long()])


def codebook_recipe() -> dict:
    """Everything that determines the codebook (hashed into the cache folder's name)."""
    return {"kind": "codebook", "version": 1, "k": K, "patch": PATCH, "iterations": ITERATIONS, "seed": 0,
            "init": "k distinct data vectors (randperm)", "empty_cluster": "keeps its centre",
            "data": "sklearn.datasets.load_digits, all 1797, pixel/8-1, every 2x2 patch"}


def fit_codebook(recipe: dict | None = None) -> tuple[Codebook, float]:
    """``(codebook, round-trip MSE per pixel over all digits)`` fitted by the recipe (not cached)."""
    from .._image.digits import load_digits_tensor

    recipe = recipe or codebook_recipe()
    images, _ = load_digits_tensor()
    p = patches(images)
    centres = kmeans(p.reshape(-1, p.shape[-1]), recipe["k"], recipe["iterations"], recipe["seed"])
    book = Codebook(centres)
    mse = float((book.decode(book.encode(images)) - images).pow(2).mean())
    return book, mse


def codebook_path(log=print) -> Path:
    """The cache folder of the digits codebook (fitted on first use, a second or less)."""
    def build(tmp: Path) -> dict:
        book, mse = fit_codebook(recipe)
        book.save(tmp)
        return {"round_trip_mse": round(mse, 6)}

    recipe = codebook_recipe()
    return cached_build("digits-codebook", recipe, build, log=log,
                        message="[grpolab] fitting the digits codebook (k-means, K = 64, 2x2 patches; cached)")


def load_codebook(log=print) -> Codebook:
    """The digits codebook (cached)."""
    return Codebook.load(codebook_path(log=log))
