"""SFPO: Slow-Fast Policy Optimization (update strategy)."""
from __future__ import annotations

import math

import torch

from ..errors import ConfigError
from ..registry import UPDATE_STRATEGIES, param
from ._checks import require_at_least


def _check_sfpo(cfg) -> None:
    require_at_least(cfg, 1, "sfpo_fast_steps")
    if not 0.0 <= cfg.sfpo_alpha <= 1.0:
        raise ConfigError(f"sfpo_alpha: must be in [0, 1], got {cfg.sfpo_alpha}")
    require_at_least(cfg, 2, "sfpo_entropy_window")


@UPDATE_STRATEGIES.register("sfpo", check=_check_sfpo, needs=("tokens",))
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
       The optimiser state (Adam moments, step count) keeps what the fast
       trajectory left, as in the authors' code;
       ``sfpo_reposition_optimizer`` (grpolab's option) moves it along the same
       line, ``s~ = s_0 + alpha (s_K - s_0)``, so that ``alpha = 0`` is exactly
       one plain update from ``theta_0`` also for Adam.
    3. **Slow correction**: one more ``update(batch)`` at ``theta~``; the
       result is ``theta_{s+1,0}``. Behaviour log-probs stay those of
       ``theta_0`` throughout, so the clipped ratio sees the drift.

    So ``alpha = 1`` is ``K + 1`` plain updates on the batch. The learning-rate
    scheduler steps once per training step (the trainer's ``train_step``), as
    in the authors' code.

    **Switch-off** (authors' entropy z-score): after every step the step's
    policy entropy (the last update's ``entropy``) is recorded; once
    ``sfpo_entropy_window`` values are recorded, with ``w`` the last window
    (the newest value included), ``z = (H_newest - mean(w)) / (std(w) +
    1e-9)`` (population std); ``z >= sfpo_entropy_z`` switches SFPO off for
    the rest of training (one standard update per step). ``sfpo_entropy_z
    <= 0`` disables the switch. The window and the switch are checkpointed.

    Provenance: authors' code — https://github.com/Urheen/SFPO,
    Demo/fsdp_workers.py (ActorRolloutRefWorker.sfpo_update_actor: K inner
    ``update_policy`` calls, ``slow + step_size * (fast - slow)`` on the
    trainable weights only, one more ``update_policy``, one scheduler step)
    and Code/SFPO/verl/trainer/ppo/ray_trainer.py (fit: ``entropy_container``
    of ``actor/entropy_loss``, ``z = (last - mean) / (np.std + 1e-9)`` over the
    last ``zscore_w``, stop when ``z >= zscore_threshold``); settings from
    Code/SFPO/train-scripts/*_sfpo.sh (sfpo_inner_steps 3, sfpo_step_size 0.8
    (0.9 for Qwen3-4B), zscore_w 30, zscore_threshold 1.0). Known difference:
    the authors' entropy metric is the mean over micro-batches of the token
    entropy during the slow update; here it is the token mean of the last
    update's first pass.
    Test: tests/test_stages.py::test_sfpo_interpolation_hand_computed_sgd,
    tests/test_stages.py::test_sfpo_entropy_switch_and_restore.
    """

    def __init__(self, *,
                 sfpo_fast_steps: int = param(3, 'SFPO: fast-trajectory updates K on the same batch before '
                                              'repositioning (authors: 3)'),
                 sfpo_alpha: float = param(0.8, 'SFPO: reposition theta_0 + alpha (theta_K - theta_0), in [0, 1] '
                                           '(authors: 0.8)'),
                 sfpo_entropy_window: int = param(30, 'SFPO: steps of entropy in the switch-off z-score (authors: '
                                                  '30)'),
                 sfpo_entropy_z: float = param(1.0, 'SFPO: switch fast steps off for good when the newest entropy\'s '
                                               'z-score >= this (authors: 1.0; <= 0 = never)'),
                 sfpo_reposition_optimizer: bool = param(False, 'SFPO: also reposition the optimiser state (grpolab '
                                                         "option; the authors' code keeps the fast trajectory's)")):
        self.K = int(sfpo_fast_steps)
        self.alpha = float(sfpo_alpha)
        self.window = int(sfpo_entropy_window)
        self.z = float(sfpo_entropy_z)
        self.move_state = bool(sfpo_reposition_optimizer)
        self.entropies: list[float] = []
        self.active = True


    # -------------------------------------------------------------- schedule
    def observe_entropy(self, h: float) -> None:
        """Record the step's entropy; may switch SFPO off for good (authors' one-sided z-score, the newest
        value inside the window, population std)."""
        if not math.isfinite(h):
            return
        self.entropies = (self.entropies + [float(h)])[-self.window:]
        if self.z <= 0 or len(self.entropies) < self.window:
            return
        w = torch.tensor(self.entropies, dtype=torch.float64)
        zscore = (float(w[-1]) - float(w.mean())) / (float(w.std(unbiased=False)) + 1e-9)
        if zscore >= self.z:
            self.active = False

    # ------------------------------------------------------------ reposition
    @staticmethod
    def snapshot(params, optimizer) -> tuple[list[torch.Tensor], list[dict]]:
        weights = [p.detach().clone() for p in params]
        states = [{k: (v.detach().clone() if torch.is_tensor(v) else v) for k, v in optimizer.state[p].items()}
                  if p in optimizer.state else {} for p in params]
        return weights, states

    @staticmethod
    @torch.no_grad()
    def reposition(params, optimizer, weights0, states0, alpha: float, move_state: bool = True) -> None:
        """``x <- lerp(x_0, x_K, alpha)`` for every trainable weight (and, with ``move_state``, its optimiser
        state)."""
        for p, w0, s0 in zip(params, weights0, states0):
            p.copy_(torch.lerp(w0, p.detach(), alpha))
            if not move_state:
                continue
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
            self.observe_entropy(float(out["entropy"]))
            return {**out, "sfpo/active": 0.0}
        params = [p for p in model.parameters() if p.requires_grad]
        weights0, states0 = self.snapshot(params, optimizer)
        skipped = 0
        first = None
        for _ in range(self.K):  # fast trajectory
            out = update(batch)
            skipped += out["skipped"]
            first = first or out
        self.reposition(params, optimizer, weights0, states0, self.alpha, self.move_state)
        out = update(batch)  # slow correction
        skipped += out["skipped"]
        self.observe_entropy(float(out["entropy"]))
        return {**out, "skipped": skipped, "sfpo/active": 1.0, "sfpo/fast_loss": first["loss"]}

    def state_dict(self) -> dict:
        return {"entropies": list(self.entropies), "active": self.active}

    def load_state_dict(self, state: dict) -> None:
        self.entropies = [float(h) for h in state["entropies"]]
        self.active = bool(state["active"])
