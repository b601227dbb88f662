"""Config fields for reward functions and reward transforms (``src/grpolab/rewards/shaping.py``)."""
from __future__ import annotations

from dataclasses import dataclass

from . import param


@dataclass
class RewardParams:
    # shared by the transforms that need "is this row correct?"
    shaping_correct_reward: str = param("accuracy", "reward shaping: reward column whose value marks a correct row")
    shaping_correct_threshold: float = param(0.5, "reward shaping: that column >= this value counts as correct")
    # ReDit reward dithering (004-06), transform `redit`
    redit_distribution: str = param("gaussian", "ReDit: noise distribution", ["gaussian", "uniform"])
    redit_scale: float = param(0.05, "ReDit: noise std (gaussian) or half-width (uniform)")
    # GRPO-LEAD length-dependent accuracy (000-03), transform `lead_length_reward`
    lead_len_alpha: float = param(0.05, "GRPO-LEAD: length penalty strength alpha in exp(-alpha z)")
    lead_len_wrong_penalty: float = param(1.0, "GRPO-LEAD: reward of a wrong answer is -this")
    lead_len_epsilon: float = param(1e-6, "GRPO-LEAD: epsilon in z = (L - mu) / (sigma + eps)")
    # FGRPR fuzzy numeric reward (000-66), transform `fuzzy_numeric`
    fuzzy_weight: float = param(1.0, "FGRPR: weight of the fuzzy closeness reward")
    fuzzy_pattern: str = param(r"Answer:\s*(-?\d+(?:\.\d+)?(?:/\d+)?)",
                               "FGRPR: regex whose first group (last match) is the predicted number")
    fuzzy_floor: float = param(1.0, "FGRPR: relative error is |y_hat - y| / max(|y|, floor)")
    fuzzy_answer_column: str = param("answer", "FGRPR: data column with the reference number")
    # LC-R1 length and compress rewards (000-100), transform `lc_length_compress`
    lc_length_weight: float = param(1.0, "LC-R1: weight of the group-relative length reward")
    lc_compress_weight: float = param(1.0, "LC-R1: weight of the compress reward")
    lc_answer_column: str = param("answer", "LC-R1: data column with the reference answer")
    lc_missing_penalty: float = param(1.0, "LC-R1: compress reward is -this when the answer never appears")
    # Unlikeliness reward (000-62), transform `unlikeliness`
    unlikely_beta: float = param(0.25, "Unlikeliness: beta_rank, the reward cut of the most likely sample")
    # GCPO-geometry length reward (000-56), transform `gcpo_length`
    gcpo_len_weight: float = param(0.5, "GCPO-geometry: weight of the length reward")
    gcpo_len_sign: float = param(1.0, "GCPO-geometry: +1 rewards longer completions, -1 shorter")
    gcpo_len_target: int = param(64, "GCPO-geometry: token length at which the length reward saturates")
    gcpo_len_correct_only: bool = param(True, "GCPO-geometry: give the length reward to correct rows only")
    # BAPO IDK boundary reward (000-109), transform `bapo_idk`
    bapo_idk_reward: float = param(0.5, "BAPO: reward of an IDK answer in a group with no correct answer")
    bapo_idk_pattern: str = param(r"I DON'?T KNOW", "BAPO: regex (case-insensitive) marking an IDK answer")
    bapo_exploration_steps: int = param(0, "BAPO: steps of the exploration stage (modulator active)")
    bapo_max_idk_ratio: float = param(0.3, "BAPO: in exploration, IDK reward is off when the batch IDK ratio exceeds this")
    # IRPO pointwise Bradley-Terry scoring (000-21), transform `irpo_bradley_terry`
    irpo_reward_column: str = param("rm", "IRPO: reward column with the pointwise reward-model scores")
    irpo_weight: float = param(1.0, "IRPO: weight of the Bradley-Terry win probability added to the reward")
    irpo_scale: float = param(1.0, "IRPO: k in P(i beats j) = sigmoid(k (s_i - s_j))")
    # E-GRPO entity-match partial reward (000-54), transform `egrpo_entity`
    egrpo_alpha: float = param(0.3, "E-GRPO: wrong rows earn alpha * normalised entity match rate")
    egrpo_entity_column: str = param("entities", "E-GRPO: data column with the gold entities (list of strings)")
    egrpo_normalize: str = param("group_max", "E-GRPO: normalise the match rate by the group's maximum, or not",
                                 ["group_max", "none"])
    # Paraphrase-set consistency (000-77 PS-GRPO, 000-30), transform `paraphrase_consistency`
    paraphrase_weight: float = param(0.5, "paraphrase consistency: weight of the consistency reward")
    paraphrase_mode: str = param("agreement", "paraphrase consistency: agreement with the other paraphrases "
                                 "(PS-GRPO) or 1 - normalised answer entropy over the set (000-30)",
                                 ["agreement", "entropy"])
    paraphrase_group_column: str = param("paraphrase_group", "paraphrase consistency: data column naming "
                                         "each row's paraphrase set")
    paraphrase_answer_pattern: str = param(r"Answer:\s*([^\n]+)", "paraphrase consistency: regex whose first "
                                           "group (last match) is the final answer when there is no \\boxed{}")
