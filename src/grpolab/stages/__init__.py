"""Batch stages and update strategies: what happens between scoring and the optimiser.

``BATCH_STAGES`` (config ``batch_stages``, a list applied in order): each is a
registered function or class (stateful: checkpointed) called after the
advantages are computed and before the loss, with the inputs ``batch``
(a scored :class:`RolloutBatch` with ``advantages`` [R, T]), ``rewards`` (the
scalar reward [R]), ``ctx`` (:class:`~grpolab.rollout.context.RolloutContext`)
and ``step``. It returns the batch to train on (possibly fewer or more rows;
rows it adds must carry rewards and advantages).

``UPDATE_STRATEGIES`` (config ``update_strategy``): called with ``update`` (the
trainer's standard update: ``update(batch) -> metrics dict``), ``batch``,
``model``, ``optimizer``, ``ctx`` and ``step``; returns the metrics dict.
"""
from __future__ import annotations

from ..registry import Registry

BATCH_STAGES: Registry = Registry("batch stage")
UPDATE_STRATEGIES: Registry = Registry("update strategy")


@UPDATE_STRATEGIES.register("standard")
def standard(update, batch):
    """``num_iterations`` optimiser passes over the batch in micro-batches (GRPO's update)."""
    return update(batch)

from . import pruning, replay, sfpo  # noqa: E402,F401  (register stages and update strategies)
