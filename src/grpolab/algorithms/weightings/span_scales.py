"""Per-span advantage scales: DeGRPO's (Thinkless's) span coefficients and per-span normalisation, and VAR RL's
per-action normalisation (PANW) over ``batch.span_ids``. Each returns ``[R, T]`` advantages."""
from __future__ import annotations

import torch

from ...registry import WEIGHTINGS, param
from ..losses import per_token
from ..spans import SPAN_MARK, span_ids_of


# --------------------------------------------------------------------------- per-span scales (DeGRPO)


@WEIGHTINGS.register("span_scale")
def span_scale(advantages: torch.Tensor, completion_mask: torch.Tensor, batch, *,
               span_mark: str = SPAN_MARK,
               span_scales: list = param([1.0], 'coefficient per span id (list index = span id; missing ids = 1.0)'),
               span_normalize: str = param('none', "'per_span_tokens': scale span s by N/N_s so that token_mean "
                                           'averages each span separately (DeGRPO)',
                                           ['none', 'per_span_tokens'])) -> torch.Tensor:
    """Per-span advantage scaling and normalisation (DeGRPO / Thinkless, Fang et al., 2025,
    arXiv:2505.13379, seed 004-12).

    ``A'_it = A_i * c_s * n_s`` for token t in span ``s = span_id[i, t]``, with
    ``c_s = span_scales[s]`` (1.0 for ids past the list) and ``n_s = 1`` or, with
    ``span_normalize: per_span_tokens``, ``n_s = N / N_s`` (``N`` = loss tokens
    of the step batch, ``N_s`` = those in span s). Under ``loss_aggregation:
    token_mean`` (``(1/N) sum l``) this turns the loss into
    ``sum_s c_s * (1/N_s) sum_{t in s} l_t``: each span is averaged on its own,
    exactly DeGRPO's ``alpha * mean(control-token loss) + mean(response loss)``
    (authors' ``compute_policy_loss`` with ``thinkless_alpha``), so a single
    control token is not swamped by long responses. Scaling an advantage by a
    positive constant scales the clipped surrogate by the same constant, so
    this equals the decoupled loss for ``clipped_ratio``. Output ``[R, T]``.

    Spans: ``span_mark: first_token`` marks the first completion token as span
    1 (the Thinkless ``<short>``/``<think>`` control token) and the rest as
    span 2; ``batch`` uses ``batch.span_ids`` as written by the rollout.

    Provenance: authors' code — https://github.com/VainF/Thinkless, verl/verl/trainer/ppo/core_algos.py
    (compute_policy_loss with thinkless_alpha: alpha * mean(control-token loss) + mean(response loss)); equal to
    the decoupled loss for clipped_ratio under token_mean.
    Test: tests/test_advantage_shaping.py::test_span_scale_degrpo_hand_computed.
    """
    ids = span_ids_of(batch, completion_mask, span_mark)
    scales = [float(c) for c in span_scales]
    if span_normalize not in ("none", "per_span_tokens"):
        raise ValueError(f"span_normalize: '{span_normalize}' is not valid; valid values: none, per_span_tokens")
    alive = completion_mask > 0
    coef = torch.ones(ids.shape, dtype=torch.float64)
    n_total = float(alive.sum())
    for s in torch.unique(ids[alive]).tolist():
        in_s = alive & (ids == s)
        c = scales[s] if s < len(scales) else 1.0
        if span_normalize == "per_span_tokens":
            c = c * n_total / float(in_s.sum())
        coef[in_s] = c
    coef = (coef * alive).to(advantages.dtype)
    return per_token(advantages, coef) * coef


# --------------------------------------------------------------------------- VAR RL: per-action normalisation (PANW)


@WEIGHTINGS.register("span_balance")
def span_balance(advantages: torch.Tensor, completion_mask: torch.Tensor, batch) -> torch.Tensor:
    """Per-action normalisation weighting, PANW ("VAR RL Done Right", Sun et al., arXiv:2601.02256; seed 000-27).

    ``A'_it = A_it · w_it``, ``w_it = |o_i| / (K_i · |s_i|)`` for token t of row i in span ``s = span_ids[i, t]``,
    where ``|o_i|`` = the row's loss tokens, ``K_i`` = the number of distinct spans among them and ``|s_i|`` = the
    row's loss tokens in span s. Under ``loss_aggregation: token_mean`` the row's loss becomes the mean over its
    spans of each span's token mean (every scale of a next-scale model counts equally, whatever its token
    count: on var_image's 1 + 4 + 16 + 64 tokens the weights are 85/4, 85/16, 85/64, 85/256); a row's weights sum
    to ``|o_i|``. Generic over ``batch.span_ids`` (VAR scales, chunks, turns; id 0 is a span like any other);
    tokens off the loss mask get 0. Output ``[R, T]``.

    Provenance: reconstructed from the abstract — no public code found (searched the code index for "VAR
    reinforcement learning next-scale GRPO" and repository names containing "var"); the abstract's "dynamic
    time-step reweighting" and the reference notes (each scale's loss reweighted by its token count so that
    high-resolution scales do not dominate). Choices made: equal weight per scale (the paper may use another
    schedule), normalised per row over the spans present in the row's loss mask (so a mask that removes tokens,
    var_mask_propagation, run after it, does not change the weights), weights that keep the row's total |o_i|.
    Test: tests/test_var_image.py::test_span_balance_by_hand.
    """
    if batch is None or batch.span_ids is None:
        raise ValueError("weighting span_balance needs batch.span_ids (the policy's or rollout's spans: the scale "
                         "numbers of policy var_image)")
    ids = batch.span_ids.long().to(completion_mask.device)
    alive = completion_mask > 0
    n = alive.sum(-1).double()
    kinds = torch.zeros_like(n)
    per_span = torch.zeros(ids.shape, dtype=torch.float64, device=ids.device)
    for s in torch.unique(ids[alive]).tolist():
        in_s = alive & (ids == s)
        cnt = in_s.sum(-1).double()
        kinds += (cnt > 0).double()
        per_span = torch.where(in_s, cnt[:, None].expand_as(per_span), per_span)
    w = torch.where(alive, n[:, None] / (kinds[:, None].clamp(min=1) * per_span.clamp(min=1)),
                    torch.zeros_like(per_span)).to(advantages.dtype)
    return per_token(advantages, w) * w
