"""Rollout strategies: how a step's prompts become a RolloutBatch (plain, hints, injection, thinking)."""
from . import ar3po, guidance, injection, strategies, tempsamp, thinking  # noqa: F401  (register the strategies)
from .context import RolloutContext

__all__ = ["RolloutContext"]
