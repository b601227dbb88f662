"""Rollout strategies: how a step's prompts become a RolloutBatch (plain, hints, injection, thinking)."""
from .context import RolloutContext

__all__ = ["RolloutContext"]
