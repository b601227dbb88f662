"""Config fields for prompt samplers (``sampling/adaptive.py``)."""
from __future__ import annotations

from dataclasses import dataclass

from . import param


@dataclass
class SamplerParams:
    # VADE (000-06)
    vade_prior_alpha: float = param(1.0, "VADE: Beta prior alpha0 of every prompt's success probability")
    vade_prior_beta: float = param(1.0, "VADE: Beta prior beta0 of every prompt's success probability")
    vade_step_decay: float = param(0.99, "VADE: slow decay, every step a <- a0 + rho (a - a0) for all prompts")
    vade_visit_decay: float = param(0.5, "VADE: fast decay of a revisited prompt's old evidence before the new")
    vade_success_threshold: float = param(1.0, "VADE: a completion succeeds when its reward >= this")
    # VAS / MMR1 (000-26)
    vas_ovs_weight: float = param(1.0, "VAS: weight of the outcome variance p(1-p) in the VPS")
    vas_tds_weight: float = param(1.0, "VAS: weight of the trajectory diversity score in the VPS")
    vas_mix: float = param(0.5, "VAS: fraction of each batch drawn by VPS (the rest uniformly)")
    vas_update_interval: int = param(1, "VAS: steps between refreshes of the VPS sampling weights")
    vas_init_score: float = param(0.25, "VAS: VPS of prompts never rolled out")
    vas_min_score: float = param(1e-3, "VAS: floor added to every VPS weight")
    vas_success_threshold: float = param(1.0, "VAS: a completion succeeds when its reward >= this")
    # SRPO history resampling (000-50)
    srpo_success_threshold: float = param(1.0, "SRPO: a completion is correct when its reward >= this")
    srpo_drop_permanently: bool = param(False, "SRPO: never resample a prompt once all its rollouts were correct")
    # Prompt-GDRO (000-28)
    gdro_bin_edges: list = param([0.25, 0.5, 0.75], "Prompt-GDRO: ascending pass@k bin edges in (0, 1)")
    gdro_window: int = param(4, "Prompt-GDRO: pass@k is the mean of a prompt's last N any-success flags")
    gdro_init_pass: float = param(0.5, "Prompt-GDRO: pass@k estimate of prompts never rolled out")
    gdro_ema: float = param(0.9, "Prompt-GDRO: EMA factor of the per-bin error rate (bias-corrected)")
    gdro_eta: float = param(1.0, "Prompt-GDRO: multiplicative-weights step size")
    gdro_gamma: float = param(0.1, "Prompt-GDRO: uniform exploration mixed into the bin distribution")
    gdro_success_threshold: float = param(1.0, "Prompt-GDRO: a completion succeeds when its reward >= this")
