"""What the pipeline needs from a policy, and the capabilities components may ask of one.

A policy is the model being trained together with how it acts: it loads (or
builds) its network, says what one *step* of an action is, recomputes the
per-step log-probs of a batch's actions under given weights, and prepares its
network for training (LoRA, activation checkpointing). Every policy writes its
actions into the ``[rows, steps]`` layout of :class:`~grpolab.batch.RolloutBatch`
(``completion_ids``, ``completion_mask``, ``behavior_logprobs``; non-token
actions in ``step_data`` / ``row_data``), so masks, spans, per-step advantages
and loss aggregation keep one meaning: "per step".

Policies are registered in ``POLICIES`` (config key ``policy``); the causal
language model (``causal_lm``, policies/causal_lm.py) is the default and the
one every text recipe trains. A component that only makes sense for some
policies declares what it needs at registration, ``register(name,
needs=("text",))``; selecting it with a policy that lacks a capability is a
start-up error naming the component, the capability and the policy
(``Config.validate``). The plan for the other policies (image generators,
diffusion LMs, ...) is docs/design/policies.md.
"""
from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Any, ClassVar

import torch

from ..registry import CAPABILITIES, POLICIES

__all__ = ["CAPABILITIES", "POLICIES", "PolicyBase"]


class PolicyBase(ABC):
    """The interface every policy implements (the causal LM: policies/causal_lm.py): :meth:`forward` is
    required, the rest has defaults. Loading, sampling, evaluation and saving still go through the causal LM's
    own code (grpolab/model, grpolab/generation); moving them here is the plan of docs/design/policies.md.

    Class attributes: ``step`` (what one column of ``[rows, steps]`` is, e.g. "token"), ``capabilities``
    (a subset of :data:`CAPABILITIES`), ``description`` (one line, for errors and ``grpolab components``).
    """

    step: ClassVar[str] = "step"
    capabilities: ClassVar[frozenset[str]] = frozenset()
    description: ClassVar[str] = ""

    def prepare(self, module):
        """The module to train: LoRA adapters, activation checkpointing (returns the module, maybe wrapped)."""
        return module

    def offers(self) -> frozenset[str]:
        """Names besides ``logprobs`` that :meth:`forward` can return (loss components ask for them by name)."""
        return frozenset()

    @abstractmethod
    def forward(self, module, mb, *, want: frozenset[str] = frozenset(), grad: bool = True) -> dict[str, Any]:
        """Per-step terms of micro-batch ``mb`` under ``module``: ``logprobs`` [R, T] (with gradients when
        ``grad``), plus the names in ``want`` that :meth:`offers` lists."""

    @torch.no_grad()
    def logprobs(self, module, batch, *, micro_batch_size: int, max_tokens: int = 0) -> torch.Tensor:
        """Per-step log-probs [R, T] of ``batch``'s actions under ``module``, without gradients, micro-batched
        (the behaviour log-probs of injected steps, the reference pass); 0 off the action mask."""
        parts = [self.forward(module, mb, grad=False)["logprobs"]
                 for mb in batch.micro_batches(micro_batch_size, trim=False, max_tokens=max_tokens)]
        return torch.cat(parts).to(batch.completion_attention_mask.device) * batch.completion_attention_mask
