"""Token spans of a completion, shared by the span-aware estimator (``span_decoupled_advantage``) and weighting
(``span_scale``); no component lives here.

``batch.span_ids`` is ``[R, T]`` with 0 = no span. A rollout strategy (multi-turn tools, control tokens)
writes the ids; the plain rollout leaves them all 0. ``span_mark: first_token`` marks the first completion
token as span 1 (a Thinkless-style control token) and the rest as span 2 without any rollout support;
``span_mark: episode`` reads agent episodes (model turns with a tool call = 1, the answer = 2).
"""
from __future__ import annotations

import torch

from ..errors import warn_fallback
from ..registry import param
from .agentic import EPISODE_COLUMN

SPAN_MARK = param('batch', "spans from batch.span_ids, 'first_token' (1 = first completion token, 2 = the rest; Thinkless control token), or 'episode' (agent episodes: 1 = model turns with a tool call, 2 = model turns without one, the answer)", ['batch', 'first_token', 'episode'])


def span_ids_of(batch, completion_mask: torch.Tensor, span_mark: str) -> torch.Tensor:
    """Span id per token ``[R, T]`` (0 = none) from ``batch.span_ids`` or ``first_token`` marking."""
    alive = completion_mask > 0
    if span_mark == "batch":
        ids = batch.span_ids.long() * alive
        if not bool((ids > 0).any()):
            warn_fallback("span_mark: batch", "span ids (the rollout marked no token span)",
                          "one span for every token (span 0)")
        return ids
    if span_mark == "first_token":
        ids = torch.full(completion_mask.shape, 2, dtype=torch.long)
        ids[:, 0] = 1
        return ids * alive
    if span_mark == "episode":
        return tool_answer_spans(batch, completion_mask)
    raise ValueError(f"span_mark: '{span_mark}' is not valid; valid values: batch, first_token, episode")


def tool_answer_spans(batch, completion_mask: torch.Tensor) -> torch.Tensor:
    """Agent episodes: span 1 on the tokens of model turns that made a tool call, 2 on model turns that made
    none (the answer), 0 elsewhere (observations), from ``batch.span_ids`` and the episode record."""
    alive = completion_mask > 0
    episodes = batch.columns.get(EPISODE_COLUMN) if batch is not None else None
    if episodes is None:
        warn_fallback("span_mark: episode", "span ids of tool-call / answer turns (batch.columns['episode'], "
                      "written by rollout_strategy: agent)", "one span for every token (span 0)")
        return torch.zeros(completion_mask.shape, dtype=torch.long)
    spans = batch.span_ids[:, :completion_mask.shape[1]].long()
    ids = torch.zeros(completion_mask.shape, dtype=torch.long)
    for i, ep in enumerate(episodes):
        for turn in ep["turns"]:
            ids[i][spans[i] == int(turn["span"])] = 1 if turn.get("tool_calls") else 2
    return ids * alive
