"""Loss regularisers: extra per-token loss terms added before aggregation.

Signature: ``fn(**inputs, *, params) -> (per_token_loss [R, T], per_token_metrics)``
with inputs ``logprobs``, ``old_logprobs``, ``ref_logprobs``, ``advantages``,
``mask``, ``entropy``, ``group_ids``, ``batch`` resolved by name. Listed in the
config as ``regularizers: [name, ...]``. (The KL penalty to the reference is
built in: ``beta`` and ``kl_estimator``.)
"""
from __future__ import annotations

from ..registry import REGULARIZERS

