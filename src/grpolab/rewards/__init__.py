"""Rewards: reward functions scored into a ``[rows, K]`` matrix (``scoring.py``), reward-model, judge, process
and agent rewards registered as ``--reward`` specs, and every reward transform (``transforms.py``)."""
from .scoring import STANDARD_ARGS, BatchScorer, RewardFn, RewardScorer, check_signature, parse_reward_spec

__all__ = ["STANDARD_ARGS", "BatchScorer", "RewardFn", "RewardScorer", "check_signature", "parse_reward_spec"]
