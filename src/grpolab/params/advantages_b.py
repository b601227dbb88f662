"""Config fields for uncertainty, entropy, token-level, stateful and span-decoupled advantages."""
from __future__ import annotations

from dataclasses import dataclass

from . import param  # noqa: F401


@dataclass
class AdvantageParamsB:
    # SEED-GRPO semantic-entropy scaling (000-86), weighting `seed_semantic_entropy`
    seed_alpha: float = param(0.5, "SEED-GRPO: sensitivity alpha; A * f(alpha * SE / SE_max)")
    seed_scaling: str = param("linear", "SEED-GRPO: f(x) = 1 - x (linear) or exp(-x) (exponential)",
                              ["linear", "exponential"])
    seed_equivalence: str = param("last_number", "SEED-GRPO: answer key that clusters completions: "
                                  "'last_number', 'final_line', 'exact' or 'module:function' (text -> key)")
    # S-GRPO noise-aware weights (000-32), advantage `sgrpo_noise_aware`
    sgrpo_noise_p: float = param(0.1, "S-GRPO: symmetric reward-flip probability p in [0, 0.5)")
    sgrpo_success_threshold: float = param(0.0, "S-GRPO: a reward above this counts as a success (k)")
    # EDGE-GRPO entropy-driven advantage (000-25), weighting `edge_entropy_driven`
    edge_normalize: str = param("group", "EDGE-GRPO: divide each row's entropy by the mean over its "
                                "'group' (paper) or the whole 'batch' (authors' code)", ["group", "batch"])
    edge_min_entropy: float = param(1e-6, "EDGE-GRPO: floor on the per-row entropy estimate")
    # SPO single-stream value tracker (000-113), advantage `spo_single_stream`
    spo_rho_min: float = param(0.875, "SPO: lower clip of the forgetting factor rho")
    spo_rho_max: float = param(0.96, "SPO: upper clip of the forgetting factor rho")
    spo_kl_half: float = param(0.06, "SPO: policy drift D_half at which rho = 1/2 before clipping")
    spo_prior_value: float = param(0.5, "SPO: value estimate of a prompt never seen before")
    spo_normalize: str = param("batch", "SPO: z-score advantages over the whole batch, or not",
                               ["batch", "none"])
    # lambda-GRPO shared-prefix weighting (004-03), weighting `lambda_prefix_weight`
    lambda_grpo_power: float = param(1.0, "lambda-GRPO: token weight k^-lambda, k = group completions "
                                     "sharing the token's prefix (0 = GRPO)")
    # TW-GRPO token weights (000-95), weighting `tw_token_weight`
    tw_alpha: float = param(1.7, "TW-GRPO: maximum token weight; weights min-max map the group divergence to "
                                 "[1, alpha] (>= 1; 1 = GRPO; authors' script uses 1.7)")
    # TempSamp-R1 soft advantage (000-112), advantage `tempsamp_soft_advantage`
    tempsamp_tau: float = param(0.5, "TempSamp-R1: reward pivot of the asymmetric transform")
    tempsamp_alpha_pos: float = param(1.0, "TempSamp-R1: log-compression strength above the pivot")
    tempsamp_alpha_neg: float = param(1.0, "TempSamp-R1: exp-expansion strength below the pivot")
    # AAPO momentum-augmented advantage (000-48), advantage `aapo_momentum`
    aapo_momentum: float = param(0.9, "AAPO: EMA momentum of each prompt's mean reward (fallback baseline when "
                                      "no reference-reward column; 1 = frozen at first visit)")
    aapo_eta: float = param(1.0, "AAPO: weight of the clipped margin term clip(r - r_ref)")
    aapo_clip_low: float = param(0.2, "AAPO: margin r - r_ref is clipped below at -clip_low (authors: 0.2)")
    aapo_clip_high: float = param(0.28, "AAPO: margin r - r_ref is clipped above at clip_high (authors: 0.28)")
    aapo_ref_column: str = param("ref_reward", "AAPO: batch column with the reference model's reward per row "
                                               "(missing = per-prompt EMA fallback)")
    # AWPO reasoning-reward gating (000-118), advantage `awpo_gated`
    awpo_outcome_reward: str = param("0", "AWPO: outcome reward column (name or index)")
    awpo_reasoning_reward: str = param("-1", "AWPO: reasoning reward column (name or index)")
    awpo_lambda: float = param(0.5, "AWPO: weight of the gated reasoning advantage")
    awpo_var_cap: float = param(0.25, "AWPO: outcome variance at which the gate closes (0.25 = Bernoulli max)")
    # DaGRPO distinctiveness masking (000-17), advantage `dagrpo_distinct_pairs`
    dagrpo_delta: float = param(0.1, "DaGRPO: pairs with |r_i - r_j| < delta are masked")
    # span-decoupled advantages (DeGRPO 004-12, DTPO 004-05)
    span_mark: str = param("batch", "spans from batch.span_ids, or 'first_token' (1 = first completion "
                           "token, 2 = the rest; Thinkless control token)", ["batch", "first_token"])
    span_scales: list = param([1.0], "coefficient per span id (list index = span id; missing ids = 1.0)")
    span_normalize: str = param("none", "'per_span_tokens': scale span s by N/N_s so that token_mean "
                                "averages each span separately (DeGRPO)", ["none", "per_span_tokens"])
    span_reward_columns: list = param([""], "DTPO: reward column (name or index) per span id; "
                                      "'' = combined reward")
