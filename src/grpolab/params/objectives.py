"""Config fields for policy objectives and regularisers (``algorithms/objectives.py``)."""
from __future__ import annotations

from dataclasses import dataclass

from . import param


@dataclass
class ObjectiveParams:
    # SAPO (soft_gate)
    sapo_tau_pos: float = param(1.0, "SAPO gate temperature for A > 0 (soft_gate)")
    sapo_tau_neg: float = param(1.05, "SAPO gate temperature for A < 0 (soft_gate)")
    # CISPO
    cispo_epsilon_low: float | None = param(None, "CISPO: IS weight clipped below at 1 - eps_low (None = no lower clip)")
    cispo_epsilon_high: float = param(4.0, "CISPO: IS weight clipped above at 1 + eps_high")
    # Simple Policy Optimization
    simple_po_epsilon: float = param(0.2, "Simple PO: trust-region size eps in the |A|/(2 eps) (r-1)^2 penalty")
    # REBEL (Reg-GRPO has no own key: its predicted advantage uses advantage_epsilon)
    rebel_eta: float = param(1.0, "REBEL: log-ratio differences are divided by eta before regressing on reward gaps")
    # GVPO
    gvpo_beta: float = param(0.1, "GVPO: KL strength beta in the implicit reward beta * log(pi / pi_anchor)")
    gvpo_anchor: str = param("behavior", "GVPO: anchor policy of the implicit reward",
                             ["behavior", "reference"])
    # DisCO
    disco_score: str = param("log_l", "DisCO scoring function", ["log_l", "l_ratio"])
    disco_tau: float = param(10.0, "DisCO: log-sum-exp temperature over negatives (10 for log_l, 1 for l_ratio)")
    disco_delta: float = param(1e-4, "DisCO: KL(pi_old || pi_theta) budget delta")
    disco_beta: float = param(1e3, "DisCO: squared-hinge penalty weight on KL above delta")
    disco_balanced: bool = param(False, "DisCO-b: plain mean over negatives instead of log-sum-exp")
    # CoPG
    copg_beta: float = param(0.1, "CoPG: KL strength beta in the regularised reward r - beta log(pi / pi_anchor)")
    copg_anchor: str = param("behavior", "CoPG: anchor policy of the KL term", ["behavior", "reference"])
    # P3O
    p3o_epsilon: float = param(0.2, "P3O: clip range of the trajectory-wise ratio")
    # GTPO (000-29)
    gtpo_conflict_weight: float = param(2.0, "GTPO: weight of conflict tokens in positive completions")
    gtpo_entropy_threshold: float = param(0.7, "GTPO: completions with mean entropy above this get advantage 0")
    gtpo_entropy_coef: float = param(0.1, "GTPO: advantage -= coef * mean completion entropy (kept completions)")
    # regularisers
    entropy_bonus_coef: float = param(0.01, "entropy_bonus: coefficient of -H (maximise entropy)")
    llds_coef: float = param(0.1, "LLDS: weight of the likelihood-preserving penalty")
    llds_gate: str = param("response", "LLDS: unit whose likelihood drop activates the penalty",
                           ["response", "action"])
    dcpo_coef: float = param(0.1, "DCPO: coefficient of the target-distribution REINFORCE regulariser")
    dcpo_temperature: float = param(1.5, "DCPO: temperature T > 1 of the target distribution pi_old^(1/T)")
    dcpo_entropy_target: float = param(0.25, "DCPO: regulariser active while mean token entropy < this (H_0)")
    grpo_d_beta_min: float = param(0.0, "GRPO-D (dynamic_kl): minimum KL weight, reached after the exploration steps")
    grpo_d_beta_max: float = param(0.02, "GRPO-D (dynamic_kl): maximum KL weight, reached at the last step")
    grpo_d_explore_frac: float = param(0.3, "GRPO-D (dynamic_kl): exploration steps w as a fraction of steps (w/t)")
    r2vpo_delta: float = param(0.02, "R2VPO: budget on the ratio's second central moment E[(r-1)^2]")
    r2vpo_dual_lr: float = param(1.0, "R2VPO: step size of the Lagrange multiplier update")
    r2vpo_lambda_init: float = param(1.0, "R2VPO: initial Lagrange multiplier")
