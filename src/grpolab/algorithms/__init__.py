"""Pure algorithm functions over tensors, each registered by what it does."""
from .advantages import ADVANTAGES, combine_rewards, group_mean, group_stats, group_zscore
from .aggregation import AGGREGATIONS, StepTotals
from .filters import FILTERS
from .kl import KL_ESTIMATORS, kl_penalty
from .losses import POLICY_LOSSES, clipped_ratio
from .regularizers import REGULARIZERS
from .weightings import WEIGHTINGS
from . import adv_baselines, adv_shaping, objectives  # noqa: F401,E402  (register variants)

__all__ = [
    "ADVANTAGES", "AGGREGATIONS", "FILTERS", "KL_ESTIMATORS", "POLICY_LOSSES", "REGULARIZERS", "StepTotals", "WEIGHTINGS",
    "clipped_ratio", "combine_rewards", "group_mean", "group_stats", "group_zscore", "kl_penalty",
]
