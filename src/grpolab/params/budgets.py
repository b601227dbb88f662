"""Config fields for rollout budgets and budget-aware samplers (``sampling/budgets.py``)."""
from __future__ import annotations

from dataclasses import dataclass

from . import param


@dataclass
class BudgetParams:
    # Knapsack RL (000-67)
    knapsack_min_generations: int = param(2, "Knapsack RL: fewest completions a prompt gets")
    knapsack_max_generations: int = param(16, "Knapsack RL: most completions a prompt gets")
    knapsack_prior_success: float = param(0.5, "Knapsack RL: success-rate estimate of a prompt never rolled out")
    knapsack_smoothing: float = param(1.0, "Knapsack RL: pseudo-count pulling the last visit's success rate "
                                           "towards knapsack_prior_success (0 = raw rate)")
    knapsack_success_threshold: float = param(1.0, "Knapsack RL: a completion succeeds when its reward >= this")
    # AR3PO (000-70)
    ar3po_stage_size: int = param(4, "AR3PO: completions per prompt per generation stage")
    ar3po_max_stages: int = param(2, "AR3PO: generation stages (a prompt stops once it has a correct response)")
    ar3po_reuse: bool = param(True, "AR3PO: add a stored earlier correct response to an all-wrong group")
    ar3po_success_threshold: float = param(1.0, "AR3PO: a response is correct when its reward >= this")
    # GAIN-RL (004-08)
    gain_rl_sigma: float = param(0.1, "GAIN-RL: std of the Gaussian over sorted positions, as a fraction of "
                                      "the data set")
    gain_rl_max_shift: float = param(0.1, "GAIN-RL: largest advance of the Gaussian centre per update, as a "
                                          "fraction of the data set")
    gain_rl_update_steps: int = param(1, "GAIN-RL: steps between advances of the Gaussian centre")
    gain_rl_refresh_steps: int = param(0, "GAIN-RL: recompute angle concentration with the current policy "
                                          "every N steps (0 = once, at the start)")
    gain_rl_batch_size: int = param(32, "GAIN-RL: prompts per forward when computing angle concentration")
    gain_rl_success_threshold: float = param(1.0, "GAIN-RL: a completion is correct when its reward >= this")
    # Automatic grouping + worst-group weights (000-115, 000-57)
    auto_group_num_groups: int = param(2, "auto_group: number of automatic prompt groups")
    auto_group_eta: float = param(1.0, "auto_group: exponentiated-gradient step size of the group weights")
    auto_group_gamma: float = param(0.1, "auto_group: share of uniform exploration over groups")
    auto_group_ema: float = param(0.5, "auto_group: EMA factor of each prompt's success-rate estimate")
    auto_group_prior_success: float = param(0.5, "auto_group: success-rate estimate of a prompt never rolled out")
    auto_group_regroup_steps: int = param(1, "auto_group: steps between re-partitions of the prompts")
    auto_group_success_threshold: float = param(1.0, "auto_group: a completion succeeds when its reward >= this")
    # ERPO (000-85)
    erpo_temperature_step: float = param(0.1, "ERPO: temperature added per residual (all-correct) visit")
    erpo_max_temperature: float = param(1.2, "ERPO: highest per-prompt sampling temperature")
    erpo_success_threshold: float = param(1.0, "ERPO: a completion is correct when its reward >= this")
    # Rollout-GDRO (000-28)
    rgdro_bin_edges: list = param([0.25, 0.5, 0.75], "Rollout-GDRO: ascending pass@k bin edges in (0, 1)")
    rgdro_window: int = param(4, "Rollout-GDRO: pass@k is the mean of a prompt's last N any-success flags")
    rgdro_ema: float = param(0.9, "Rollout-GDRO: EMA factor of each bin's error rate (bias-corrected)")
    rgdro_min_generations: int = param(2, "Rollout-GDRO: fewest completions a prompt gets")
    rgdro_max_generations: int = param(16, "Rollout-GDRO: most completions a prompt gets")
    rgdro_min_variance: float = param(0.01, "Rollout-GDRO: floor of a bin's variance proxy e(1-e)")
    rgdro_success_threshold: float = param(1.0, "Rollout-GDRO: a completion succeeds when its reward >= this")
