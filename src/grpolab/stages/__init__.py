"""Batch stages and update strategies: what happens between scoring and the optimiser.

``BATCH_STAGES`` (config ``batch_stages``, a list applied in order): each is a
registered function or class (stateful: checkpointed) called after the
advantages are computed and before the loss, with the inputs ``batch``
(a scored :class:`RolloutBatch` with ``advantages`` [R, T]), ``rewards`` (the
scalar reward [R]), ``ctx`` (:class:`~grpolab.rollouts.context.RolloutContext`)
and ``step``. It returns the batch to train on (possibly fewer or more rows;
rows it adds must carry rewards and advantages).

``UPDATE_STRATEGIES`` (config ``update_strategy``): called with ``update`` (the
trainer's standard update: ``update(batch) -> metrics dict``), ``batch``,
``model``, ``optimizer``, ``ctx`` and ``step``; returns the metrics dict.

``COLLECTORS`` (switched on by ``dynamic_sampling: true``): gather the step's
scored batch over several rollout rounds (collectors.py).
"""
from __future__ import annotations

from ..registry import BATCH_STAGES, COLLECTORS, UPDATE_STRATEGIES

__all__ = ["BATCH_STAGES", "COLLECTORS", "UPDATE_STRATEGIES"]
