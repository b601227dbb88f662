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

The modules say which they hold: ``batch_*.py`` batch stages (``batch_pruning``: CPPO and the row helpers the
replay stages share; ``batch_replay``: EFRame, RePO; ``batch_dcpo``; ``batch_avatar_replay``), ``update_*.py``
update strategies (``update_standard``, ``update_sfpo``, ``update_trpo``, ``update_group_robust_dpo``; and
``training_free.py``, Training-Free GRPO's update, whose prompt builders ``rollouts/experience_prompt.py``
imports too), ``collectors.py`` the collectors. What only some policy kinds can use lives in their packages and
is found by the catalogue's discovery, never imported from here: the image stages ``denoising_steps`` and
``chunk_grpo`` in ``policies/_image/stages_*.py``, d1's ``mask_reseed`` in
``policies/masked_diffusion_lm/stages_mask_reseed.py``.
"""
from __future__ import annotations

from ..registry import BATCH_STAGES, COLLECTORS, UPDATE_STRATEGIES

__all__ = ["BATCH_STAGES", "COLLECTORS", "UPDATE_STRATEGIES"]
