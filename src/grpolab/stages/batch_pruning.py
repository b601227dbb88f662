"""Completion pruning (CPPO) and the helpers the batch stages share.

Shared helpers (one place each):

* :func:`row_advantage` — the per-completion advantage a stage ranks rows by:
  the mean of ``batch.advantages`` over the row's loss tokens (for GRPO's
  sequence-level advantage this is exactly ``A_i``).
* :func:`score_new_rows` — score rows a stage generated itself and give them
  group-z-score advantages (``grpolab.algorithms.group_zscore`` with
  ``cfg.advantage_epsilon``), so every row a stage adds carries ``rewards``,
  ``scalar_rewards`` and ``advantages`` like the trainer's rows.
"""
from __future__ import annotations

import math

import torch

from ..algorithms import group_zscore, mask_truncated
from ..batch import RolloutBatch
from ..errors import ConfigError
from ..registry import BATCH_STAGES, param


def row_advantage(batch: RolloutBatch) -> torch.Tensor:
    """Per-row advantage ``[R]``: mean of ``advantages`` over the row's loss tokens (0 if it has none)."""
    mask = batch.completion_mask.to(batch.advantages.dtype)
    return (batch.advantages * mask).sum(-1) / mask.sum(-1).clamp(min=1.0)


def set_group_advantages(ctx, batch: RolloutBatch, scalar: torch.Tensor) -> RolloutBatch:
    """``batch.scalar_rewards = scalar`` and ``batch.advantages = group_zscore(scalar) * mask`` (in place).

    Groups are ``batch.group_ids``; epsilon is ``cfg.advantage_epsilon``. The
    configured advantage estimator and weightings are *not* applied: rows a
    stage creates get GRPO's group z-score (documented per stage).
    """
    adv = group_zscore(scalar, batch.group_ids, advantage_epsilon=ctx.cfg.advantage_epsilon)
    batch.scalar_rewards = scalar
    batch.advantages = adv[:, None].to(torch.float32) * batch.completion_mask
    return batch


def score_new_rows(ctx, batch: RolloutBatch) -> RolloutBatch:
    """Score a freshly generated batch (``ctx.score``), then group z-score advantages.

    Honours ``mask_truncated_completions`` the way the trainer does (the loss
    mask of truncated rows is zeroed before the advantages are taken).
    """
    scalar = ctx.score(batch)
    if ctx.cfg.mask_truncated_completions:
        batch.completion_mask = mask_truncated(batch.completion_mask, batch.truncated)
    return set_group_advantages(ctx, batch, scalar)


def pick_uids(generator: torch.Generator, num_rows: int, n: int, avoid) -> list[int]:
    """``n`` dataset indices drawn uniformly without replacement, preferring ones not in ``avoid``."""
    avoid = set(int(u) for u in avoid)
    perm = torch.randperm(num_rows, generator=generator).tolist()
    fresh = [u for u in perm if u not in avoid]
    out = fresh[:n]
    while len(out) < n:  # fewer fresh prompts than needed: reuse, cycling through permutations
        out.extend(torch.randperm(num_rows, generator=generator).tolist()[:n - len(out)])
    return out


def _keep_count(n: int, rate: float) -> int:
    """``floor(n (1 - rate))``, at least 1 (robust to float error, e.g. 10 * (1 - 0.9))."""
    return max(1, math.floor(n * (1.0 - rate) + 1e-9))


def top_abs_advantage(batch: RolloutBatch, rate: float, scope: str) -> torch.Tensor:
    """Indices (ascending) of the rows CPPO keeps: the largest ``|A|``.

    ``scope="group"``: per group, the ``floor(n_g (1 - rate))`` (>= 1) rows with
    the largest ``|A_i|``. ``scope="batch"``: the ``floor(R (1 - rate))`` rows
    of the whole batch. Ties keep the earlier row (stable sort).
    """
    absadv = row_advantage(batch).abs()
    if scope == "batch":
        order = torch.sort(-absadv, stable=True).indices
        return order[:_keep_count(len(absadv), rate)].sort().values
    keep = []
    for g in torch.unique(batch.group_ids):
        rows = (batch.group_ids == g).nonzero().squeeze(-1)
        order = torch.sort(-absadv[rows], stable=True).indices
        keep.append(rows[order[:_keep_count(len(rows), rate)]])
    return torch.cat(keep).sort().values


def _check_cppo_prune(cfg) -> None:
    if not 0.0 <= cfg.cppo_pruning_rate < 1.0:
        raise ConfigError(f"cppo_pruning_rate: must be in [0, 1), got {cfg.cppo_pruning_rate}")
    if cfg.cppo_scope not in ("group", "batch"):
        raise ConfigError(f"cppo_scope: '{cfg.cppo_scope}' is not valid; valid values: group, batch")


@BATCH_STAGES.register("cppo_prune", check=_check_cppo_prune)
class CPPOPrune:
    """CPPO: prune low-|advantage| completions, refill with completions of new questions.

    *CPPO: Accelerating the Training of Group Relative Policy Optimization-Based
    Reasoning Models* (Lin et al., 2025, arXiv:2503.22342), seed 000-84.

    1. **Pruning.** After the group advantages are computed, keep only the
       completions with the largest ``|A_i|`` for the forward/backward pass
       (the paper's argument: a completion's contribution to the policy
       gradient scales with ``|A_i|``). With pruning rate ``P``
       (``cppo_pruning_rate``) each group keeps ``k = floor(G (1 - P))``
       completions (``cppo_scope: group``, the paper's per-question
       formulation), or the whole batch keeps ``floor(R (1 - P))``
       (``cppo_scope: batch``, what the authors' verl code does). Kept rows
       are unchanged (same advantages, behaviour log-probs, group ids).
    2. **Dynamic completion allocation** (``cppo_refill``). The freed capacity
       ``R - kept`` is filled with completions of additional questions:
       ``ceil(freed / k_G)`` new prompts (``k_G = floor(G (1 - P))``) are drawn
       uniformly, without replacement and preferring prompts not already in
       the batch, by the stage's own seeded generator from ``ctx.rows``;
       each gets ``num_generations`` completions (``ctx.generate``, fresh group
       ids from ``ctx.allocate_groups``), is scored (``ctx.score``), gets
       group-z-score advantages (``cfg.advantage_epsilon``), is pruned the same
       way, and the ``freed`` largest-``|A|`` survivors are appended, so the
       batch has exactly its original number of rows.

    Choices (documented): the authors' code allocates the extra questions
    *before* generation (a ``1/(1-P)`` larger prompt batch); a batch stage runs
    after the rollout, so the refill generates them here with plain sampling
    (no rollout strategy) and always z-scores them with ``group_zscore`` (the
    configured advantage estimator/weightings apply only to the trainer's
    rows). Ranking uses the row's mean advantage over its loss tokens (equal
    to ``A_i`` for sequence-level advantages).

    Provenance: authors' code — https://github.com/lzhxmu/CPPO, cppo_verl/recipe/cppo/src/cppo_ray_trainer.py
    (pruning rate, batch-level pruning by |A|); matched by ``cppo_scope: batch`` (their ``metric=smallest``
    keeps the ``int(R (1 - P))`` largest ``|A|``); the default ``group`` is the paper's per-question form. The
    refill generates the extra questions after the rollout instead of enlarging the prompt batch beforehand.
    Test: tests/test_stages.py::test_cppo_batch_scope_matches_the_authors_selection,
    tests/test_stages.py::test_cppo_keeps_largest_abs_advantage_per_group_and_batch.
    """

    def __init__(self, *,
                 cppo_pruning_rate: float = param(0.5, 'CPPO: pruning rate P; keep floor(n (1 - P)) (>= 1) '
                                                  'completions with the largest |advantage| per group (or per batch, '
                                                  'cppo_scope)'),
                 cppo_scope: str = param('group', 'CPPO: prune within each group (paper) or over the whole batch '
                                         "(authors' verl code)", ['group', 'batch']),
                 cppo_refill: bool = param(True, 'CPPO: fill the freed rows with pruned completions of additional '
                                           'prompts (dynamic completion allocation), so the row count is unchanged'),
                 seed: int = 0):
        self.rate = float(cppo_pruning_rate)
        self.scope = cppo_scope
        self.refill = bool(cppo_refill)
        self.generator = torch.Generator().manual_seed(int(seed) + 8400)


    def prune(self, batch: RolloutBatch) -> RolloutBatch:
        return batch.select(top_abs_advantage(batch, self.rate, self.scope))

    def __call__(self, batch, ctx):
        n_rows = batch.num_rows
        kept = self.prune(batch)
        freed = n_rows - kept.num_rows
        if not self.refill or freed <= 0:
            return kept
        G = ctx.cfg.num_generations
        n_new = math.ceil(freed / _keep_count(G, self.rate))
        uids = pick_uids(self.generator, len(ctx.rows), n_new, batch.prompt_uids.tolist())
        extra = ctx.generate([ctx.rows[u] for u in uids], uids, group_offset=ctx.allocate_groups(n_new))
        extra = self.prune(score_new_rows(ctx, extra))
        if extra.num_rows > freed:  # keep the freed-many largest |A| (rows stay in order)
            order = torch.sort(-row_advantage(extra).abs(), stable=True).indices
            extra = extra.select(order[:freed].sort().values)
        return RolloutBatch.concat([kept, extra], pad_id=ctx.pad_id)

    def state_dict(self) -> dict:
        return {"generator": self.generator.get_state()}

    def load_state_dict(self, state: dict) -> None:
        self.generator.set_state(state["generator"])
