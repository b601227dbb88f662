"""Rollout strategies: how a step's completions are produced.

A strategy is a registered function or class (stateful: checkpointed). It is
called with the inputs ``ctx`` (:class:`~grpolab.rollouts.context.RolloutContext`),
``rows`` (the sampled data rows), ``uids`` (their dataset indices),
``group_offset`` (first group id to use), ``budgets`` (completions per prompt,
a list) and ``temperatures`` (one per prompt, a list), plus ``step``; keyword-only
parameters come from the config. It returns a :class:`RolloutBatch`. If it
scored the batch itself (``ctx.score``) it leaves ``batch.rewards`` set and the
trainer does not score again.

Every injected token must be marked in ``batch.token_origin`` and carry the
behaviour log-prob it really has (``ctx.logprobs``).
"""
from __future__ import annotations

from ..registry import ROLLOUT_STRATEGIES



@ROLLOUT_STRATEGIES.register("plain")
def plain(ctx, rows, uids, group_offset, budgets=None, temperatures=None):
    """G sampled completions per prompt (the GRPO rollout); ragged when ``budgets`` differ.

    Provenance: paper equations — DeepSeekMath (Shao et al., 2024, arXiv:2402.03300), Algorithm 1 (G outputs
    sampled per question from the old policy).
    """
    return ctx.generate(rows, uids, group_offset=group_offset, num_generations=budgets, temperature=temperatures)
