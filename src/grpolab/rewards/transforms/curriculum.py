"""Curriculum transforms: Self-Paced GRPO's progressive reward, whose weight moves from one reward column to the
next (fidelity, temporal coherence, alignment) as the generator's competence grows."""
from __future__ import annotations

import math

import torch

from ...errors import ConfigError
from ...registry import REWARD_TRANSFORMS, param


# ---------------------------------------------------------------- Self-Paced GRPO (000-36)

def self_paced_weights(c: float, thresholds=(1 / 3, 2 / 3), temperature: float = 0.1) -> list[float]:
    """The stage weights ``[w_1, w_2, w_3]`` at competence ``c``: logistic transitions
    g_k(c) = σ((c − τ_k)/κ) (k = 1, 2), w_1 = 1 − g_1, w_2 = g_1 − g_2, w_3 = g_2 (non-negative when
    τ_1 ≤ τ_2; they sum to 1)."""
    t1, t2 = (float(x) for x in thresholds)
    g1 = 1 / (1 + math.exp(-(c - t1) / temperature))
    g2 = 1 / (1 + math.exp(-(c - t2) / temperature))
    return [1 - g1, g1 - g2, g2]


def _check_self_paced(cfg) -> None:
    cols, th = list(cfg.self_paced_columns), list(cfg.self_paced_thresholds)
    if len(cols) != 3:
        raise ConfigError(f"self_paced_columns: three reward columns (fidelity, temporal coherence, alignment), "
                          f"got {cols}")
    if len(th) != 2 or not float(th[0]) <= float(th[1]):
        raise ConfigError(f"self_paced_thresholds: two competences tau_1 <= tau_2, got {th}")
    if not cfg.self_paced_temperature > 0:
        raise ConfigError(f"self_paced_temperature: must be > 0, got {cfg.self_paced_temperature}")
    if not 0 <= cfg.self_paced_momentum < 1:
        raise ConfigError(f"self_paced_momentum: must be in [0, 1), got {cfg.self_paced_momentum}")
    lo, hi = (float(x) for x in cfg.self_paced_fidelity_range)
    if not hi > lo:
        raise ConfigError(f"self_paced_fidelity_range: [low, high] with high > low, got {[lo, hi]}")


@REWARD_TRANSFORMS.register("self_paced", check=_check_self_paced)
class SelfPaced:
    """Self-Paced GRPO's progressive reward (Li et al., 2025, *Growing with the Generator: Self-paced GRPO for
    Video Generation*, arXiv:2511.19356; seed 000-36): the scalar reward moves its weight from coarse visual
    fidelity to temporal coherence to semantic alignment as the generator's competence grows.

    With R_1, R_2, R_3 the reward columns named by ``self_paced_columns`` (default the ``digit_frames`` task's
    ``frame_fidelity``, ``frame_coherence``, ``frame_alignment``), per step::

        ĉ   = clip((mean_i R_1,i − lo) / (hi − lo), 0, 1)      batch competence, [lo, hi] = self_paced_fidelity_range
        c   ← m·c + (1 − m)·ĉ                                   EMA, m = self_paced_momentum (the first batch: c = ĉ)
        g_k = σ((c − τ_k) / κ),  k = 1, 2                       τ = self_paced_thresholds, κ = self_paced_temperature
        w   = (1 − g_1,  g_1 − g_2,  g_2)
        r_i = Σ_j w_j · R_j,i

    (the task's own weighted sum, the input ``rewards``, is replaced). At c = 0, ½, 1 with the defaults
    (τ = ⅓, ⅔; κ = 0.1) w ≈ (0.966, 0.033, 0.001), (0.159, 0.682, 0.159), (0.001, 0.033, 0.966).
    The competence is updated once per training step: a second call in the same step (a collector or rollout
    strategy scoring twice) recomputes the step's update from the competence before it, so the last call wins.
    The competence and the step are checkpointed (``state_dict``). Rows with a NaN column stay NaN and are left
    out of ĉ; a step with no scored row keeps c.

    Provenance: reconstructed from the abstract — seed 000-36 (arXiv:2511.19356) and the reference notes: a
    competence-aware weighting Σ_j w_j(c)·R_j over three stages (fidelity → temporal coherence → alignment)
    with transition functions; no authors' code found (searched the code index for "Self-Paced GRPO",
    "self-paced" repositories and the arXiv id: only paper pages and a third party's re-implementation).
    Our choices: competence = EMA of the batch-mean fidelity min-max normalised to [lo, hi]; two logistic
    transitions at fixed thresholds whose differences are the three weights (summing to 1); the EMA's
    initialisation by the first batch; the once-per-step update. The paper's dynamic group-wise evaluation is
    left out.
    Test: tests/test_self_paced_planner.py::test_self_paced_hand_weights,
    tests/test_self_paced_planner.py::test_self_paced_state_round_trip.
    """

    def __init__(self, *,
                 self_paced_columns: list = param(["frame_fidelity", "frame_coherence", "frame_alignment"],
                                                  "self_paced: the three reward columns, in curriculum order "
                                                  "(fidelity, temporal coherence, alignment)"),
                 self_paced_momentum: float = param(0.9, "self_paced: EMA momentum m of the competence "
                                                    "c <- m c + (1 - m) c_batch"),
                 self_paced_thresholds: list = param([1 / 3, 2 / 3], "self_paced: competences tau_1 <= tau_2 at "
                                                     "which the weight passes fidelity -> coherence -> alignment"),
                 self_paced_temperature: float = param(0.1, "self_paced: width kappa of the logistic transitions"),
                 self_paced_fidelity_range: list = param([0.0, 1.0], "self_paced: [low, high] of the fidelity "
                                                         "column, mapped to competence 0 and 1")):
        self.columns = [str(c) for c in self_paced_columns]
        self.momentum, self.temperature = float(self_paced_momentum), float(self_paced_temperature)
        self.thresholds = [float(x) for x in self_paced_thresholds]
        self.lo, self.hi = (float(x) for x in self_paced_fidelity_range)
        self.competence, self.before, self.step, self.seen = 0.0, 0.0, -1, False
        self.seen_before = False

    def weights(self) -> list[float]:
        """The current stage weights w(c)."""
        return self_paced_weights(self.competence, self.thresholds, self.temperature)

    def __call__(self, rewards: torch.Tensor, reward_matrix: torch.Tensor, reward_names: list[str],
                 step: int = 0) -> torch.Tensor:
        missing = [c for c in self.columns if c not in reward_names]
        if missing:
            raise ValueError(f"self_paced: no reward column {', '.join(map(repr, missing))} (reward functions: "
                             f"{', '.join(reward_names) or 'none'}); set self_paced_columns")
        R = reward_matrix[:, [reward_names.index(c) for c in self.columns]].double()  # [rows, 3]
        if int(step) != self.step:  # a new step: its update starts from the competence after the last one
            self.before, self.seen_before, self.step = self.competence, self.seen, int(step)
        fid = R[:, 0][~torch.isnan(R).any(-1)]
        if fid.numel():
            c_hat = min(max((float(fid.mean()) - self.lo) / (self.hi - self.lo), 0.0), 1.0)
            self.competence = (self.momentum * self.before + (1 - self.momentum) * c_hat if self.seen_before
                               else c_hat)
            self.seen = True
        else:
            self.competence, self.seen = self.before, self.seen_before
        w = torch.tensor(self.weights(), dtype=torch.float64)
        return (R * w).sum(-1).to(rewards.dtype)  # a NaN column leaves the row NaN

    def state_dict(self) -> dict:
        return {"competence": self.competence, "before": self.before, "step": self.step, "seen": int(self.seen),
                "seen_before": int(self.seen_before)}

    def load_state_dict(self, state: dict) -> None:
        self.competence, self.before = float(state["competence"]), float(state["before"])
        self.step, self.seen, self.seen_before = int(state["step"]), bool(state["seen"]), bool(state["seen_before"])
