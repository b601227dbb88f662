"""Policy losses (``POLICY_LOSSES``, key ``policy_loss``): per-token loss from new/old log-probs and advantages.

Every policy objective of grpolab is in this package, one module per family:

* ``clipped.py``: clipped-ratio objectives (the clipped ratio, GSPO's sequence ratios, Rank-GRPO, LUSPO,
  Guide-GRPO, AWPO);
* ``clip_free.py``: objectives without the hard clip (the plain policy gradient, SAPO's soft gate, CISPO,
  VESPO, Simple PO);
* ``regression.py``: group-coupled regressions onto the advantages (Reg-GRPO, REBEL, GVPO);
* ``contrastive.py``: group-contrastive and pairwise objectives (DisCO, CoPG, P3O, GTPO);
* ``preference.py``: preference objectives over a group (DGPO for diffusion / flow models, DPO on each group's
  best and worst completion);
* ``common.py``: what they share (``per_token``, masked row and segment means, the pair matrix, config checks).

Importing the package imports every module, so every loss is registered; every name is importable from
``grpolab.algorithms.losses``. Sequence-level objectives put their per-sequence loss on every token of the
sequence, so that ``seq_mean_token_mean`` gives the paper's ``(1/N) sum_i L_i``.

Uniform signature::

    fn(logprobs, old_logprobs, advantages, mask, **params)
        -> (per_token_loss [R, T], per_token_metrics {name: [R, T]})

``advantages`` is ``[R, T]`` (or ``[R]``, broadcast over tokens). The returned
loss is *per token*; turning it into a scalar is the aggregation's job
(``aggregation.py``), so every objective composes with every aggregation.
Per-token metrics are averaged by the trainer over the masked tokens of the
whole optimiser step.
"""
from ...registry import POLICY_LOSSES
from .common import _row_mean, _segment_mean, per_token  # noqa: F401  (the masked means: regularizers.py)
from .clipped import (awpo_clipped, clipped_ratio, guide_off_policy, luspo, rank_ratio, sequence_ratio,
                      sequence_ratio_token)
from .clip_free import cispo, policy_gradient, simple_po, soft_gate, vespo
from .regression import gvpo, rebel, reg_grpo
from .contrastive import copg, disco, gtpo_conflict, p3o
from .preference import dgpo, group_dpo

__all__ = [
    "POLICY_LOSSES", "per_token",
    "awpo_clipped", "clipped_ratio", "guide_off_policy", "luspo", "rank_ratio", "sequence_ratio",
    "sequence_ratio_token",
    "cispo", "policy_gradient", "simple_po", "soft_gate", "vespo",
    "gvpo", "rebel", "reg_grpo",
    "copg", "disco", "gtpo_conflict", "p3o",
    "dgpo", "group_dpo",
]
