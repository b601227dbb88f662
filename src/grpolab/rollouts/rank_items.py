"""Rank items of a ranked-list completion as token spans (Rank-GRPO, seed 000-91): one span per line."""
from __future__ import annotations

import torch

from ..registry import ROLLOUT_STRATEGIES


def line_item_ids(pieces: list[str]) -> list[int]:
    """Item (span) id per token from the tokens' decoded texts: items are 1, 2, ... from the first token; a token
    that contains newlines belongs to the item it ends, and the next token starts an item that many lines
    later (an empty line is an item too)."""
    ids, item = [], 1
    for piece in pieces:
        ids.append(item)
        item += piece.replace("\r\n", "\n").count("\n")
    return ids


def mark_rank_items(batch, tokenizer) -> torch.Tensor:
    """``span_ids`` ``[R, T]``: :func:`line_item_ids` of each completion's tokens on its mask, 0 off it."""
    mask = batch.completion_mask > 0
    spans = torch.zeros(batch.completion_ids.shape, dtype=torch.long)
    for i in range(batch.completion_ids.shape[0]):
        cols = torch.nonzero(mask[i]).flatten().tolist()
        if cols:
            pieces = [tokenizer.decode([int(batch.completion_ids[i, t])], skip_special_tokens=False) for t in cols]
            spans[i, cols] = torch.tensor(line_item_ids(pieces), dtype=torch.long)
    return spans.to(batch.span_ids.device)


@ROLLOUT_STRATEGIES.register("rank_items", needs=("text",))
def rank_items(ctx, rows, uids, group_offset, budgets=None, temperatures=None):
    """The plain rollout with Rank-GRPO's rank items marked (ConvRec-R1, Zhu et al., 2025, arXiv:2510.20150;
    seed 000-91).

    Rank-GRPO takes each item (rank) of a generated list as the unit of its importance ratio and of its
    per-rank advantage. After G completions per prompt are sampled (as ``plain``), ``span_ids[i, t] = k`` for
    token t of line k of completion i (:func:`line_item_ids`: every completion token is in an item, the token
    with the newline closes its item). The loss ``rank_ratio`` reads them (one ratio per item, the geometric
    mean of its tokens' ratios), and so does ``span_decoupled_advantage`` with ``span_mark: batch`` (item k's
    tokens take the group-normalised advantage of reward column ``span_reward_columns[k]``, e.g. ``rank_k`` of
    the ``ranked_list`` task). Tokens off the completion mask get span 0.

    Provenance: authors' code — https://github.com/yaochenzhu/Rank-GRPO, libs/trl/rank_grpo_trainer.py
    ``_segment_items_from_tokens`` (item index per token from each token's decoded text; a newline is attached
    to the previous item and the count rises after it); ids here start at 1 (0 = no span in grpolab). Known
    differences: the authors' code clamps items past ``rec_num`` (advantage 0) and treats the EOS token
    separately; here every line is an item and the EOS token belongs to the last line.
    Test: tests/test_rank_items.py::test_line_items_follow_the_newlines.
    """
    batch = ctx.generate(rows, uids, group_offset=group_offset, num_generations=budgets, temperature=temperatures)
    batch.span_ids = mark_rank_items(batch, ctx.tokenizer)
    return batch
