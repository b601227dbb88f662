"""Config fields for batch stages and update strategies (``stages/``): pruning, replay, SFPO."""
from __future__ import annotations

from dataclasses import dataclass

from . import param


@dataclass
class StageParams:
    # CPPO completion pruning (000-84)
    cppo_pruning_rate: float = param(0.5, "CPPO: pruning rate P; keep floor(n (1 - P)) (>= 1) completions with the "
                                          "largest |advantage| per group (or per batch, cppo_scope)")
    cppo_scope: str = param("group", "CPPO: prune within each group (paper) or over the whole batch (authors' verl "
                                     "code)", ["group", "batch"])
    cppo_refill: bool = param(True, "CPPO: fill the freed rows with pruned completions of additional prompts "
                                    "(dynamic completion allocation), so the row count is unchanged")
    # EFRame exploration-filter-replay (000-11)
    eframe_explore_n: int = param(8, "EFRame: extra completions for each hard (all-fail, zero-advantage) prompt")
    eframe_explore_temperature: float = param(1.2, "EFRame: sampling temperature of the exploration rollouts")
    eframe_explore_threshold: float = param(1.0, "EFRame: keep exploration rows with |advantage| > this")
    eframe_fail_reward: float = param(0.0, "EFRame: a prompt is hard when all its rewards are <= this and its "
                                           "advantages are all zero")
    eframe_filter_threshold: float = param(0.05, "EFRame: keep original rows with |advantage| > this")
    eframe_filter_overlong: bool = param(True, "EFRame: drop truncated rows with a positive advantage")
    eframe_replay_threshold: float = param(1.0, "EFRame: rows with |advantage| > this enter the replay buffer")
    eframe_replay_size: float = param(2.0, "EFRame: replay buffer capacity, in batches (x rows of the first batch)")
    eframe_replay_freq: int = param(5, "EFRame: replay buffered rows every N steps")
    # RePO replay-enhanced policy optimization (000-34)
    repo_buffer_size: int = param(16, "RePO: per-prompt FIFO replay buffer size (completions)")
    repo_num_replay: int = param(8, "RePO: off-policy completions replayed per prompt (k)")
    repo_strategy: str = param("highest_k", "RePO: replay strategy",
                               ["all", "random_k", "highest_k", "recent_k", "max_variance_k"])
    repo_min_buffer: int = param(1, "RePO: replay only once a prompt's buffer holds this many completions")
    repo_adv_norm: str = param("mixed", "RePO: 'mixed' = z-score over on-policy + replayed (union group); 'split' "
                                        "= replayed rows z-scored on their own", ["mixed", "split"])
    # SFPO slow-fast policy optimization (000-59)
    sfpo_fast_steps: int = param(3, "SFPO: fast-trajectory updates K on the same batch before repositioning")
    sfpo_alpha: float = param(0.8, "SFPO: reposition theta_0 + alpha (theta_K - theta_0), in [0, 1]")
    sfpo_entropy_window: int = param(10, "SFPO: steps of on-policy entropy kept for the switch-off test")
    sfpo_entropy_z: float = param(3.0, "SFPO: switch fast steps off for good when the entropy z-score exceeds "
                                       "this (0 = never)")
