"""The construction episode of MasHost (seed 000-22): each completion builds a multi-agent system, one
construction action per line; the actions are marked as token spans with their action-wise rewards."""
from __future__ import annotations

import torch

from ..algorithms.adv_actionwise import ACTION_REWARD
from ..data import completion_text
from ..registry import ROLLOUT_STRATEGIES
from ..tasks.mas_build import parse_construction
from .rank_items import line_item_ids


def mark_actions(batch, tokenizer) -> dict[str, float]:
    """Mark each completion's construction actions (:func:`grpolab.tasks.mas_build.parse_construction`):
    ``span_ids[i, t] = L`` and ``step_data[ACTION_REWARD][i, t] = r_a`` for the tokens of action a on line L
    (line numbers of the tokens from their decoded texts, :func:`line_item_ids`); tokens of no action (blank
    lines, text after ``end``) and off the completion mask get span 0 and reward 0. Returns the batch means of
    the construction statistics (the rollout metrics)."""
    mask = batch.completion_mask > 0
    spans = torch.zeros(batch.completion_ids.shape, dtype=torch.long)
    reward = torch.zeros(batch.completion_ids.shape, dtype=torch.float32)
    stats = {"malformed_lines": 0.0, "irrational_actions": 0.0, "actions": 0.0, "agents": 0.0, "edges": 0.0,
             "ended": 0.0}
    R = batch.completion_ids.shape[0]
    for i in range(R):
        con = parse_construction(completion_text(batch.columns["completion"][i]))
        for key, value in (("malformed_lines", con.malformed), ("irrational_actions", con.irrational),
                           ("actions", len(con.actions)), ("agents", con.n_agents), ("edges", con.n_edges),
                           ("ended", float(con.ended))):
            stats[key] += value / max(R, 1)
        cols = torch.nonzero(mask[i]).flatten().tolist()
        if not cols or not con.actions:
            continue
        pieces = [tokenizer.decode([int(batch.completion_ids[i, t])], skip_special_tokens=True) for t in cols]
        lines = torch.tensor(line_item_ids(pieces), dtype=torch.long)
        idx = torch.tensor(cols, dtype=torch.long)
        for act in con.actions:
            on = idx[lines == act.line]
            spans[i, on] = act.line
            reward[i, on] = act.reward
    batch.span_ids = spans.to(batch.span_ids.device)
    batch.step_data[ACTION_REWARD] = reward
    return stats


@ROLLOUT_STRATEGIES.register("mas_build", needs=("text",))
def mas_build(ctx, rows, uids, group_offset, budgets=None, temperatures=None):
    """MasHost's construction episode (MasHost, Yang et al., 2025, arXiv:2506.08507; seed 000-22): G
    completions per query are sampled as ``plain`` does; each is a whole multi-agent system written as
    construction actions, one per line (``agent N: ROLE <- [INPUTS]``, then ``end``; task ``mas_build``).
    Every action's tokens are marked (:func:`mark_actions`): ``span_ids`` = the action's line number,
    ``step_data["action_reward"]`` = its action-wise rationality reward (0 or -1), read by the advantage
    ``mashost_hrpo``. The system itself is run and scored by the task's reward functions.

    Metrics: ``rollout/mashost/malformed_lines``, ``irrational_actions``, ``actions``, ``agents``, ``edges``
    (means per completion) and ``ended`` (the fraction that wrote ``end``).

    Provenance: reconstructed from the abstract — MasHost samples "agent roles and their interactions" node by
    node as one probabilistic construction; here the causal LM's text is the sampler: one line = one node with its
    role and its links to earlier nodes (a role and its links are one action, not two as a separate edge step
    would be), so one completion is one construction episode and its per-line token spans carry the per-action
    rewards. Test: tests/test_mashost.py::test_actions_are_marked_on_their_lines.
    """
    batch = ctx.generate(rows, uids, group_offset=group_offset, num_generations=budgets, temperature=temperatures)
    for key, value in mark_actions(batch, ctx.tokenizer).items():
        ctx.metric(f"mashost/{key}", value)
    return batch
