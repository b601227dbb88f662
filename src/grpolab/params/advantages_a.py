"""Config fields for baselines, normalisations, difficulty and multi-reward weightings."""
from __future__ import annotations

from dataclasses import dataclass

from . import param  # noqa: F401


@dataclass
class AdvantageParamsA:
    # GPG (000-18), advantage `gpg`
    gpg_alpha: str = param("valid", "GPG: batch correction alpha = B / #valid rows ('valid', paper: rows outside "
                           "zero-variance groups), B / #non-zero rewards ('nonzero', verl) or 1 ('none')",
                           ["valid", "nonzero", "none"])
    gpg_std_normalize: bool = param(False, "GPG: F_norm = group std (True) or 1 (False, the paper's best)")
    # MathForge DGPO (000-05), advantage `group_mad` + weighting `dgpo_question_weight`
    dgpo_valid_token_rescale: bool = param(False, "DGPO: multiply advantages by all tokens / tokens of "
                                           "non-zero-variance groups (authors' code)")
    dgpo_temperature: float = param(2.0, "DGPO question weights: softmax temperature T over -accuracy")
    dgpo_accuracy_reward: int = param(0, "DGPO question weights: reward column used as accuracy "
                                      "(-1 = combined reward)")
    # GRPO-LEAD difficulty-aware reweighting (000-03), weighting `lead_difficulty_weight`
    lead_weight_min: float = param(0.4, "GRPO-LEAD: lower asymptote A of the logistic weight")
    lead_weight_max: float = param(1.5, "GRPO-LEAD: upper asymptote B of the logistic weight")
    lead_midpoint: float = param(0.75, "GRPO-LEAD: correct-ratio midpoint rho_0 of the logistic weight")
    lead_steepness: float = param(10.0, "GRPO-LEAD: steepness k of the logistic weight")
    lead_correct_threshold: float = param(0.0, "GRPO-LEAD: a reward above this counts as correct")
    # HA-DW history-aware difficulty weighting (000-120), weighting `hadw`
    hadw_eta: float = param(1.0, "HA-DW: anchor step size eta; eta_t = eta * sigma_t (clipped to [0, 1])")
    hadw_lambda_scale: float = param(1.0, "HA-DW: scale lambda of the weight lambda * exp(D * M)")
    hadw_window: int = param(8, "HA-DW: number of recent batch accuracies whose std is sigma_t")
    hadw_init_anchor: float = param(0.5, "HA-DW: difficulty anchor C_0 before the first batch")
    hadw_accuracy_reward: int = param(-1, "HA-DW: reward column used as accuracy (-1 = combined reward)")
    # VITAL / DGRPO difficulty-aware multi-task weighting (000-02), weighting `dgrpo_difficulty_weight`
    dgrpo_task_column: str = param("task", "DGRPO: data column naming each row's task (missing = one task)")
    dgrpo_task_power: float = param(1.0, "DGRPO: exponent a of the task weight (d_task / mean d_task)^a")
    dgrpo_sample_power: float = param(1.0, "DGRPO: exponent b of the prompt weight (d_q / mean d_q)^b")
    dgrpo_floor: float = param(0.05, "DGRPO: lower bound on a difficulty 1 - mean reward")
    # MO-GRPO (000-16), advantage `mo_grpo`
    mo_grpo_use_weights: bool = param(False, "MO-GRPO: weight the normalised rewards by reward_weights "
                                      "(the paper sums them unweighted)")
    # off-policy group-relative REINFORCE, RED family (000-39)
    red_temperature: float = param(1.0, "RED-Weight: temperature tau of the weight exp(A / tau)")
    red_seed: int = param(0, "RED-Drop: seed of the choice of dropped negatives (combined with the step)")
