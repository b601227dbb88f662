"""Advantage weightings (``WEIGHTINGS``): ``advantages -> advantages``, applied after the estimator.

Signature: ``fn(advantages, **inputs, *, params) -> Tensor`` with ``[R]`` or
``[R, T]`` advantages; inputs are resolved by name (see ``components.py``).
Listed in the config as ``advantage_weightings: [name, ...]``, applied in order.

Every built-in weighting is in this package (tests/test_architecture.py keeps it so), one module per family:

* ``difficulty.py``: difficulty weights (DGPO, GRPO-LEAD, HA-DW, DGRPO);
* ``magnitude.py``: functions of the advantage's own value (RED-Weight, the DDPO / Flow-GRPO advantage clip);
* ``entropy.py``: uncertainty and entropy weights (SEED-GRPO, EDGE-GRPO, entropy-guided exploration for
  function calling);
* ``tokens.py``: token weights (lambda-GRPO, TW-GRPO, LC-R1's compress bonus, AVATAR's temporal shaping);
* ``span_scales.py``: per-span scales (DeGRPO, VAR RL's per-action normalisation).

Importing the package imports every module, so every weighting is registered; every name is importable from
``grpolab.algorithms.weightings``. NaN rewards are unscorable rows (left out of every statistic); groups may be
ragged.
"""
from ...registry import WEIGHTINGS
from .difficulty import (HistoryAwareDifficultyWeight, dgpo_question_weight, dgrpo_difficulty_weight,
                         lead_difficulty_weight, lead_logistic)
from .magnitude import advantage_clip, advantage_exp_weight
from .entropy import (edge_entropy_driven, fc_cot_entropy_advantage, seed_semantic_entropy, semantic_entropy,
                      sequence_loglik)
from .tokens import (avatar_tas, lambda_prefix_weight, lc_compress_bonus, shared_prefix_counts, tas_weights,
                     tw_token_weight)
from .span_scales import span_balance, span_scale

__all__ = [
    "WEIGHTINGS",
    "HistoryAwareDifficultyWeight", "dgpo_question_weight", "dgrpo_difficulty_weight", "lead_difficulty_weight",
    "lead_logistic",
    "advantage_clip", "advantage_exp_weight",
    "edge_entropy_driven", "fc_cot_entropy_advantage", "seed_semantic_entropy", "semantic_entropy",
    "sequence_loglik",
    "avatar_tas", "lambda_prefix_weight", "lc_compress_bonus", "shared_prefix_counts", "tas_weights",
    "tw_token_weight",
    "span_balance", "span_scale",
]
