"""Reward noise: ReDit's dithering (ties broken in flat reward regions) and synthetic reward flips (a method's
robustness to a noisy verifier). Both draw from a generator seeded per row (``common._row_seed``), never from a
global RNG, so a resumed run draws exactly as an uninterrupted one."""
from __future__ import annotations

import torch

from ...registry import REWARD_TRANSFORMS, param
from .common import _row_seed


# ---------------------------------------------------------------- ReDit (004-06)

@REWARD_TRANSFORMS.register("redit")
def redit(rewards: torch.Tensor, prompt_uids: torch.Tensor, step: int, *, seed: int = 0,
          redit_distribution: str = param('gaussian', 'ReDit: noise distribution', ['gaussian', 'uniform']),
          redit_scale: float = param(0.05, 'ReDit: noise std (gaussian) or half-width (uniform)')) -> torch.Tensor:
    """ReDit reward dithering (Wei et al., 2025, arXiv:2506.18631; seed 004-06).

    ``r~_i = r_i + eps_i`` with zero-mean noise: ``eps ~ N(0, scale^2)``
    (``redit_distribution: gaussian``) or ``eps ~ U(-scale, scale)`` (``uniform``),
    the two dithers the paper studies. Dithering breaks ties in flat reward
    regions, so a group of equal discrete rewards still gets (small) advantages.

    Deterministic without hidden RNG state: ``eps_i`` is drawn from a generator
    seeded by (config ``seed``, ``step``, the row's prompt uid, the row's
    occurrence index among rows of that uid), so a resumed run dithers exactly
    as an uninterrupted one, and the same row gets the same noise when the
    transform is evaluated twice in a step (dynamic sampling's filter and the
    advantages). Note that noisy rewards are never tied, so DAPO's dynamic
    sampling drops no group after ReDit. NaN rows stay NaN.

    Provenance: paper equations — ReDit (Wei et al., 2025, arXiv:2506.18631), additive zero-mean Gaussian or
    uniform dithering of the discrete reward (equation number not recorded); the deterministic per-row seeding
    is grpolab's.
    """
    if redit_distribution not in ("gaussian", "uniform"):
        raise ValueError(f"redit_distribution: expected gaussian or uniform, got '{redit_distribution}'")
    seen: dict[int, int] = {}
    eps = torch.empty(len(rewards), dtype=torch.float64)
    for i, uid in enumerate(prompt_uids.tolist()):
        k = seen.get(uid, 0)
        seen[uid] = k + 1
        gen = torch.Generator().manual_seed(_row_seed(int(seed), int(step), int(uid), k))
        if redit_distribution == "gaussian":
            eps[i] = torch.randn(1, generator=gen, dtype=torch.float64)[0]
        else:
            eps[i] = torch.rand(1, generator=gen, dtype=torch.float64)[0] * 2 - 1
    return rewards + (redit_scale * eps).to(rewards.dtype)


@REWARD_TRANSFORMS.register("reward_flip")
def reward_flip(rewards: torch.Tensor, prompt_uids: torch.Tensor, step: int, *, seed: int = 0,
                flip_prob: float = param(0.2, 'reward_flip: probability that a row\'s 0/1 reward is flipped')
                ) -> torch.Tensor:
    """Synthetic reward noise: each row's 0/1 reward is flipped (``r -> 1 - r``) with probability ``flip_prob``.

    The noise model of S-GRPO's headline experiment (seed 000-32: "standard GRPO fails under 20% synthetic
    reward noise"), for testing a method's robustness (docs/science.md). The draw is a pure function of
    (config ``seed``, ``step``, prompt uid, the row's occurrence index), as ReDit's, salted so the two never
    share noise; a resumed run flips exactly as an uninterrupted one. Rewards must lie in [0, 1] (a shaped or
    fractional reward is flipped as ``1 - r`` too); NaN rows stay NaN. Held-out evaluation is never flipped.

    Provenance: reconstructed from the abstract — S-GRPO (Shen et al., 2025, seed 000-32) names "20% synthetic
    reward noise" on a binary verifier reward without the exact process; the symmetric, independent per-row
    flip is grpolab's choice.
    """
    if not 0.0 <= flip_prob <= 1.0:
        raise ValueError(f"flip_prob: must be in [0, 1], got {flip_prob}")
    finite = rewards[~torch.isnan(rewards)]
    if bool(((finite < 0) | (finite > 1)).any()):
        raise ValueError("reward_flip: rewards must lie in [0, 1] (a 0/1 verifier reward); got "
                         f"{finite.min().item():g}..{finite.max().item():g}")
    seen: dict[int, int] = {}
    flip = torch.zeros(len(rewards), dtype=torch.bool)
    for i, uid in enumerate(prompt_uids.tolist()):
        k = seen.get(uid, 0)
        seen[uid] = k + 1
        gen = torch.Generator().manual_seed(_row_seed(int(seed) + 0x5F11, int(step), int(uid), k))
        flip[i] = bool(torch.rand(1, generator=gen, dtype=torch.float64)[0] < flip_prob)
    return torch.where(flip, 1 - rewards, rewards)
