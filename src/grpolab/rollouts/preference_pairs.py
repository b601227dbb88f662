"""Offline preference pairs as a rollout: each data row's ``chosen`` and ``rejected`` replies, teacher-forced."""
from __future__ import annotations

import torch

from ..batch import INJECTED
from ..errors import ConfigError
from ..generation.turns import Segment
from ..registry import ROLLOUT_STRATEGIES
from .injection import compose_rows, text_ids

PAIR_COLUMNS = ("chosen", "rejected", "labeller_group")


def _check(cfg) -> None:
    if cfg.micro_batch_size % 2:
        raise ConfigError(f"rollout_strategy 'preference_pairs' makes 2 rows per prompt (its chosen and rejected "
                          f"reply), kept in one micro-batch: micro_batch_size must be even (got "
                          f"{cfg.micro_batch_size})")


@ROLLOUT_STRATEGIES.register("preference_pairs", check=_check, columns=PAIR_COLUMNS, needs=("text",))
def preference_pairs(ctx, rows, uids, group_offset, budgets=None, temperatures=None):
    """Offline preference pairs (x, y_w, y_l, g) as a batch: nothing is sampled.

    For the k-th prompt row of the step, two batch rows in group ``group_offset + k``: the row's ``chosen``
    reply + EOS and its ``rejected`` reply + EOS, both INJECTED and in the loss, their behaviour log-probs
    teacher-forced under the current policy (:func:`~grpolab.rollouts.injection.compose_rows`, ``continue_``
    off). The batch is scored here (the trainer does not score it again); a ``preferred`` reward (task
    ``arithmetic_prefs``) is set to the row's label, 1 on the chosen and 0 on the rejected row, also where a
    reply was cut. ``batch.row_data`` gets ``pref_chosen`` (1 on the chosen row, 0 on the rejected one) and
    ``labeller_group`` (the row's labeller group, an integer). Replies longer than ``max_completion_length``
    are cut and flagged truncated, like any completion. ``num_generations`` is not used (every prompt gives
    exactly its two replies; the recipe sets it to 2). This is how offline preference data enter the trainer;
    the objective is the update strategy's (``group_robust_dpo``) and the policy loss's (``group_dpo``).

    Provenance: reconstructed from the abstract — Group Robust Preference Optimization (Ramesh et al., 2024,
    arXiv:2405.20304, seed 000-57) learns from a fixed (offline) data set of preference pairs labelled by
    groups, as the authors' bandit code's GroupTransition (state, two actions, group_id, pref) does; putting
    both replies of each pair in the batch, teacher-forced, with their labels in row_data, is grpolab's.
    """
    tok = ctx.tokenizer
    eos = tok.eos_token_id
    pair_rows, pair_uids, gids, heads, chosen = [], [], [], [], []
    for k, (row, uid) in enumerate(zip(rows, uids)):
        for role in ("chosen", "rejected"):
            pair_rows.append(row)
            pair_uids.append(uid)
            gids.append(group_offset + k)
            heads.append([Segment(text_ids(tok, str(row[role])) + [eos], INJECTED, True)])
            chosen.append(1.0 if role == "chosen" else 0.0)
    batch = compose_rows(ctx, pair_rows, pair_uids, gids, heads, continue_=False)
    batch.row_data["pref_chosen"] = torch.tensor(chosen)
    batch.row_data["labeller_group"] = torch.tensor([int(r["labeller_group"]) for r in pair_rows])
    ctx.score(batch)
    if "preferred" in batch.reward_names:  # the label, also where max_completion_length cut the reply
        batch.rewards[:, batch.reward_names.index("preferred")] = batch.row_data["pref_chosen"].to(batch.rewards)
    return batch
