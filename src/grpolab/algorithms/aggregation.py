"""Loss aggregation: per-token loss [R, T] -> scalar.

The normaliser is fixed **once per optimiser step** from the whole step batch
(every micro-batch and every rank) and passed in as :class:`StepTotals`. Each
micro-batch's contribution is then a plain weighted sum, so summing the
micro-batch losses (gradient accumulation) or the per-rank losses gives exactly
the gradient of the whole batch processed at once; nothing is ever divided by
the number of accumulation steps again (the bug class in TRL #3021, verl
PR #5798, ms-swift #10117).

Modes (``loss_aggregation`` in the config):

* ``seq_mean_token_mean``: ``(1/N) sum_i (1/|o_i|) sum_t l_it``  (GRPO 000-41;
  TRL ``grpo``, verl ``seq-mean-token-mean``)
* ``token_mean``: ``(1/sum_i |o_i|) sum_i sum_t l_it`` over the whole step
  (DAPO; TRL ``dapo``, verl ``token-mean``)
* ``constant``: ``(1/(N * L)) sum_i sum_t l_it`` with ``L`` =
  ``loss_constant`` or ``max_completion_length`` (Dr. GRPO 000-107; TRL
  ``dr_grpo``, verl ``seq-mean-token-sum-norm``)

* ``seq_mean_token_mean_all_rows``: ``seq_mean_token_mean`` with ``N`` = every
  row of the step, a row without loss tokens (``mask_truncated_completions``)
  adding 0 and still counting (TRL ``grpo`` / ``sapo`` / ``luspo``: ``.mean()``
  over the rows; the TRL drop-in ``grpolab.api`` maps those loss types here)

A batch of several roles (``row_data["role"]``, the team and m_grpo rollouts) is aggregated **per role**
(:func:`step_totals`, :func:`aggregate_loss`): the loss is the sum over the roles of each role's loss, aggregated
as above over that role's rows only, with that role's normalisers, so a role's share of the gradient does not
depend on how many rows or tokens the other roles produced (as if each role had its own loss, as each agent has
its own loss and optimiser in MAGRPO's code, 000-40; with a separate model or LoRA adapter per role, each gets
exactly its own loss's gradient).

``N`` is the number of sequences with at least one loss token in the step
(verl's ``seq-mean``) for ``seq_mean_token_mean``, and the number of rows for
``constant`` (Dr. GRPO's fixed ``G * L_max``) and ``seq_mean_token_mean_all_rows``;
``|o_i|`` is the number of loss tokens of row i.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from ..registry import AGGREGATIONS



@dataclass(frozen=True)
class StepTotals:
    """Counts over the whole optimiser-step batch (all micro-batches, all ranks)."""

    num_rows: int
    num_sequences: int
    num_tokens: int
    constant: int

    @classmethod
    def from_masks(cls, masks: list[torch.Tensor], constant: int) -> "StepTotals":
        rows = sum(int(m.shape[0]) for m in masks)
        seqs = sum(int((m.sum(-1) > 0).sum()) for m in masks)
        toks = sum(int(m.sum()) for m in masks)
        return cls(max(rows, 1), max(seqs, 1), max(toks, 1), constant)


def step_totals(mbs: list, constant: int) -> "StepTotals | dict[int, StepTotals]":
    """The normalisers of one optimiser step over its micro-batches ``mbs``: one :class:`StepTotals`, or, when the
    rows belong to several roles (``row_data["role"]``), one per role (module docstring)."""
    masks = [mb.completion_mask for mb in mbs]
    if not mbs or not all("role" in mb.row_data for mb in mbs):
        return StepTotals.from_masks(masks, constant)
    roles = sorted({int(r) for mb in mbs for r in mb.row_data["role"].tolist()})
    if len(roles) < 2:
        return StepTotals.from_masks(masks, constant)
    return {r: StepTotals.from_masks([mb.completion_mask[mb.row_data["role"] == r] for mb in mbs], constant)
            for r in roles}


def aggregate_loss(aggregate, loss: torch.Tensor, mask: torch.Tensor, totals, roles: torch.Tensor | None = None):
    """``aggregate(loss, mask, totals)``; with per-role ``totals`` (:func:`step_totals`) the sum over the roles of
    ``aggregate`` on the role's rows (``roles``: each row's role) with the role's normalisers."""
    if not isinstance(totals, dict):
        return aggregate(loss, mask, totals)
    roles = roles.to(loss.device)
    return sum(aggregate(loss[roles == r], mask[roles == r], t) for r, t in totals.items())


@AGGREGATIONS.register("seq_mean_token_mean")
def seq_mean_token_mean(loss: torch.Tensor, mask: torch.Tensor, totals: StepTotals) -> torch.Tensor:
    """GRPO's aggregation: each sequence's mean token loss, averaged over the step's sequences (module docstring).

    Provenance: paper equations — DeepSeekMath (Shao et al., 2024, arXiv:2402.03300), Eq. (3): (1/G) sum_i
    (1/|o_i|) sum_t; the same as TRL grpo and verl seq-mean-token-mean.
    """
    per_seq = (loss * mask).sum(-1) / mask.sum(-1).clamp(min=1)
    return per_seq.sum() / totals.num_sequences


@AGGREGATIONS.register("seq_mean_token_mean_all_rows")
def seq_mean_token_mean_all_rows(loss: torch.Tensor, mask: torch.Tensor, totals: StepTotals) -> torch.Tensor:
    """TRL's grpo / sapo / luspo aggregation: each row's mean token loss, averaged over every row of the step,
    rows without loss tokens included (module docstring).

    Provenance: paper equations — DeepSeekMath (Shao et al., 2024, arXiv:2402.03300), Eq. (3): (1/G) sum_i
    (1/|o_i|) sum_t with G every sampled row, as TRL's loss_type grpo computes it
    (``((l*m).sum(-1)/m.sum(-1).clamp(1)).mean()``): a fully masked row (mask_truncated_completions) adds 0 and
    still counts in G, where seq_mean_token_mean divides by the rows that have loss tokens. Test:
    tests/test_trl_api.py::test_fully_masked_row_counts_in_trl_grpo_and_luspo.
    """
    per_seq = (loss * mask).sum(-1) / mask.sum(-1).clamp(min=1)
    return per_seq.sum() / totals.num_rows


@AGGREGATIONS.register("token_mean")
def token_mean(loss: torch.Tensor, mask: torch.Tensor, totals: StepTotals) -> torch.Tensor:
    """DAPO's aggregation: the mean over every loss token of the step (module docstring).

    Provenance: paper equations — DAPO (Yu et al., 2025, arXiv:2503.14476), the token-level policy-gradient loss
    (1 / sum_i |o_i|) sum_i sum_t (equation number not recorded); the same as TRL dapo and verl token-mean.
    """
    return (loss * mask).sum() / totals.num_tokens


@AGGREGATIONS.register("constant")
def constant(loss: torch.Tensor, mask: torch.Tensor, totals: StepTotals) -> torch.Tensor:
    """Dr. GRPO's aggregation: the token sum divided by rows x a constant length (module docstring).

    Provenance: paper equations — Dr. GRPO (Liu et al., 2025, arXiv:2503.20783), the constant normaliser of the
    unbiased objective (1 / (G L_max), equation number not recorded); the same as TRL dr_grpo and verl
    seq-mean-token-sum-norm.
    """
    return (loss * mask).sum() / (totals.num_rows * totals.constant)
