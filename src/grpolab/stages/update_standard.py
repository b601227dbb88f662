"""The standard update strategy (GRPO's update)."""
from __future__ import annotations

from ..registry import UPDATE_STRATEGIES


@UPDATE_STRATEGIES.register("standard")
def standard(update, batch):
    """``num_iterations`` optimiser passes over the batch in micro-batches (GRPO's update).

    Provenance: paper equations — DeepSeekMath (Shao et al., 2024, arXiv:2402.03300), Algorithm 1 (mu optimiser
    iterations over the sampled batch).
    """
    return update(batch)
