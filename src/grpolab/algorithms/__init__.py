"""Pure algorithm functions over tensors, each registered by what it does."""
from . import adv_baselines, adv_shaping  # noqa: F401  (register the variants)
from .advantages import ADVANTAGES, combine_rewards, group_mean, group_stats, group_zscore
from .aggregation import AGGREGATIONS, StepTotals, aggregate_loss, step_totals
from .filters import mask_truncated, zero_variance_groups, zero_variance_groups_count
from .kl import KL_ESTIMATORS, kl_penalty
from .losses import POLICY_LOSSES, clipped_ratio
from .regularizers import REGULARIZERS
from .weightings import WEIGHTINGS

__all__ = [
    "ADVANTAGES", "AGGREGATIONS", "KL_ESTIMATORS", "POLICY_LOSSES", "REGULARIZERS", "StepTotals", "WEIGHTINGS",
    "aggregate_loss", "step_totals",
    "clipped_ratio", "combine_rewards", "group_mean", "group_stats", "group_zscore", "kl_penalty", "mask_truncated",
    "zero_variance_groups", "zero_variance_groups_count",
]
