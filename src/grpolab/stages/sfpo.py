"""SFPO: Slow-Fast Policy Optimization (update strategy)."""
from __future__ import annotations

import math

import torch

from ..errors import ConfigError
from ..registry import UPDATE_STRATEGIES
from ..registry import param


def _check_sfpo(cfg) -> None:
    if cfg.sfpo_fast_steps < 1:
        raise ConfigError(f"sfpo_fast_steps: must be >= 1, got {cfg.sfpo_fast_steps}")
    if not 0.0 <= cfg.sfpo_alpha <= 1.0:
        raise ConfigError(f"sfpo_alpha: must be in [0, 1], got {cfg.sfpo_alpha}")
    if cfg.sfpo_entropy_window < 2:
        raise ConfigError(f"sfpo_entropy_window: must be >= 2, got {cfg.sfpo_entropy_window}")


@UPDATE_STRATEGIES.register("sfpo", check=_check_sfpo)
class SFPO:
    """SFPO: fast trajectory, reposition, slow correction — on one batch.

    *Slow-Fast Policy Optimization: Reposition-Before-Update for LLM
    Reasoning* (Wang, Wang, Qu, Cheng, Fu, Tang, Zhang, Huo, 2025,
    arXiv:2510.04072), seed 000-59. Rollouts and objective are unchanged; only
    the update rule differs. At step s, from ``theta_0``:

    1. **Fast trajectory**: ``K = sfpo_fast_steps`` standard updates on the same
       batch (each is the trainer's ``update(batch)``: ``num_iterations``
       optimiser passes), ``theta_0 -> theta_K``.
    2. **Reposition**: ``theta~ = theta_0 + alpha (theta_K - theta_0)`` with
       ``alpha = sfpo_alpha`` (``torch.lerp``, exact at 0 and 1), pulling the
       parameters back toward the rollout policy to limit off-policy drift.
    3. **Slow correction**: one more ``update(batch)`` at ``theta~``; the
       result is ``theta_{s+1,0}``. Behaviour log-probs stay those of
       ``theta_0`` throughout, so the clipped ratio sees the drift.

    So ``alpha = 1`` is ``K + 1`` plain updates on the batch, and ``alpha = 0``
    is one plain update from ``theta_0`` (both tested exactly).

    **Optimiser state** (the paper is silent; choice): the optimiser's
    per-parameter state (Adam moments and step count) is repositioned along
    the same line, ``s~ = s_0 + alpha (s_K - s_0)`` (a state absent at
    ``theta_0`` counts as zeros; at ``alpha = 0`` it is restored exactly), so
    the reposition moves the whole optimiser, not only the weights, and the
    two limits above hold for Adam, not only for SGD.

    **When to stop repositioning** (choice): the paper switches the
    fast-reposition machinery off near convergence with an entropy-based
    schedule, reverting to plain GRPO updates. The exact rule was not
    retrievable from the sources searched; implemented: keep the policy
    entropy measured in the first fast update (on-policy, at ``theta_0``) of
    the last ``sfpo_entropy_window`` steps; once the window is full, if the
    new entropy's z-score against it, ``|H_s - mean| / (std + 1e-8)``, exceeds
    ``sfpo_entropy_z``, SFPO is switched off for the rest of training
    (``alpha = 0`` and no fast steps, i.e. one standard update per step).
    ``sfpo_entropy_z = 0`` disables the switch. The window and the switch are
    checkpointed.

    Note: the trainer's ``update`` also steps the learning-rate scheduler, so
    with a non-constant schedule the learning rate advances ``K + 1`` times per
    step (see docs/variants/stages.md).

    Provenance: reconstructed from the abstract — fast steps, reposition by alpha and a slow correction follow
    the abstract; repositioning the optimiser state and the entropy z-score switch-off rule are grpolab's
    choices.
    """

    def __init__(self, *,
                 sfpo_fast_steps: int = param(3, 'SFPO: fast-trajectory updates K on the same batch before '
                                              'repositioning'),
                 sfpo_alpha: float = param(0.8, 'SFPO: reposition theta_0 + alpha (theta_K - theta_0), in [0, 1]'),
                 sfpo_entropy_window: int = param(10, 'SFPO: steps of on-policy entropy kept for the switch-off test'),
                 sfpo_entropy_z: float = param(3.0, 'SFPO: switch fast steps off for good when the entropy z-score '
                                               'exceeds this (0 = never)')):
        self.K = int(sfpo_fast_steps)
        self.alpha = float(sfpo_alpha)
        self.window = int(sfpo_entropy_window)
        self.z = float(sfpo_entropy_z)
        self.entropies: list[float] = []
        self.active = True


    # -------------------------------------------------------------- schedule
    def observe_entropy(self, h: float) -> None:
        """Feed the step's on-policy entropy; may switch SFPO off for good."""
        if self.z <= 0 or not math.isfinite(h):
            return
        if len(self.entropies) >= self.window:
            w = torch.tensor(self.entropies[-self.window:], dtype=torch.float64)
            zscore = abs(h - float(w.mean())) / (float(w.std()) + 1e-8)
            if zscore > self.z:
                self.active = False
        self.entropies = (self.entropies + [float(h)])[-self.window:]

    # ------------------------------------------------------------ reposition
    @staticmethod
    def snapshot(params, optimizer) -> tuple[list[torch.Tensor], list[dict]]:
        weights = [p.detach().clone() for p in params]
        states = [{k: (v.detach().clone() if torch.is_tensor(v) else v) for k, v in optimizer.state[p].items()}
                  if p in optimizer.state else {} for p in params]
        return weights, states

    @staticmethod
    @torch.no_grad()
    def reposition(params, optimizer, weights0, states0, alpha: float) -> None:
        """``x <- lerp(x_0, x_K, alpha)`` for every trainable weight and its optimiser state."""
        for p, w0, s0 in zip(params, weights0, states0):
            p.copy_(torch.lerp(w0, p.detach(), alpha))
            sK = optimizer.state.get(p)
            if not sK:
                continue
            if alpha == 0.0:  # exact restore (including "no state yet")
                if s0:
                    optimizer.state[p] = {k: (v.clone() if torch.is_tensor(v) else v) for k, v in s0.items()}
                else:
                    del optimizer.state[p]
                continue
            for k, vK in sK.items():
                if not (torch.is_tensor(vK) and vK.is_floating_point()):
                    continue
                v0 = s0.get(k, torch.zeros_like(vK))
                sK[k] = torch.lerp(v0.to(vK.dtype), vK, alpha)

    def __call__(self, update, batch, model, optimizer):
        if not self.active:
            out = update(batch)
            return {**out, "sfpo/active": 0.0}
        params = [p for p in model.parameters() if p.requires_grad]
        weights0, states0 = self.snapshot(params, optimizer)
        skipped = 0
        first = None
        for _ in range(self.K):  # fast trajectory
            out = update(batch)
            skipped += out["skipped"]
            first = first or out
        self.reposition(params, optimizer, weights0, states0, self.alpha)
        out = update(batch)  # slow correction
        skipped += out["skipped"]
        self.observe_entropy(float(first["entropy"]))
        return {**out, "skipped": skipped, "entropy": first["entropy"], "sfpo/active": 1.0,
                "sfpo/fast_loss": first["loss"]}

    def state_dict(self) -> dict:
        return {"entropies": list(self.entropies), "active": self.active}

    def load_state_dict(self, state: dict) -> None:
        self.entropies = [float(h) for h in state["entropies"]]
        self.active = bool(state["active"])
