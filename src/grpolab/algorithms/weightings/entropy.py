"""Uncertainty and entropy weights: SEED-GRPO's semantic-entropy scaling, EDGE-GRPO's entropy-driven advantage
and the CoT-entropy advantage of entropy-guided GRPO for function calling."""
from __future__ import annotations

import math

import torch

from ...batch import SAMPLED
from ...data import completion_text
from ...errors import ConfigError
from ...registry import WEIGHTINGS, param
from ..answer_keys import resolve_answer_key
from ..groups import group_index, masked_row_mean


# --------------------------------------------------------------------------- SEED-GRPO


def semantic_entropy(keys: list, group_ids: torch.Tensor,
                     loglik: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-row ``(SE, SE_max)`` of the row's group, clustering rows with equal keys.

    ``SE = -(1/K) sum_k log p(C_k)`` over the group's K clusters (the Monte-Carlo
    estimator SEED-GRPO uses), ``SE_max = log n`` (n rows: every row its own
    cluster, each with probability 1/n). With ``loglik`` ``[R]`` (each row's
    sequence log-likelihood) ``p(C_k) = sum_{i in C_k} exp(loglik_i) /
    sum_{j in group} exp(loglik_j)``, the cluster's share of the sampled
    completions' probability mass; without it ``p(C_k) = |C_k| / n`` (the
    frequency, which is the mass when every completion is equally likely).
    """
    inv, n_groups = group_index(group_ids)
    se = torch.zeros(n_groups, dtype=torch.float64)
    se_max = torch.zeros(n_groups, dtype=torch.float64)
    ll = None if loglik is None else loglik.double()
    for g in range(n_groups):
        rows = (inv == g).nonzero().flatten().tolist()
        n = len(rows)
        members: dict = {}
        for r in rows:
            members.setdefault(keys[r], []).append(r)
        if ll is None:
            logp = [math.log(len(m) / n) for m in members.values()]
        else:
            total = torch.logsumexp(ll[rows], 0)
            logp = [float(torch.logsumexp(ll[m], 0) - total) for m in members.values()]
        se[g] = -sum(logp) / len(logp)
        se_max[g] = math.log(n) if n > 1 else 0.0
    return se[inv], se_max[inv]


def sequence_loglik(batch, length_normalize: bool) -> torch.Tensor:
    """``[R]`` log pi_old(o_i | q) from the batch's behaviour log-probs: the sum over the row's sampled tokens
    (``token_origin == SAMPLED``, attended to), or their mean with ``length_normalize`` (0 for a row with none)."""
    sampled = (batch.completion_attention_mask > 0) & (batch.token_origin == SAMPLED)
    lp = (batch.behavior_logprobs.double() * sampled).sum(-1)
    return lp / sampled.sum(-1).clamp(min=1) if length_normalize else lp


# the parameters of seed_semantic_entropy
SEED_ALPHA = param(0.5, 'SEED-GRPO: sensitivity alpha; A * f(alpha * SE / SE_max)')
SEED_SCALING = param('linear', 'SEED-GRPO: f(x) = 1 - x (linear), exp(-x) (exponential) or (1 - x)^gamma (focal)',
                     ['linear', 'exponential', 'focal'])
SEED_FOCAL_GAMMA = param(2.0, 'SEED-GRPO: focusing exponent gamma of the focal f(x) = (1 - x)^gamma (gamma = 1 is the '
                              'linear f)')
SEED_EQUIVALENCE = param('last_number', "SEED-GRPO: answer key that clusters completions: 'last_number', "
                                        "'final_line', 'exact' or 'module:function' (text -> key)")
SEED_CLUSTER_PROBABILITY = param('mass', "SEED-GRPO: p(C_k) = the cluster's share of the sampled completions' "
                                         "probability pi_old(o|q) ('mass', the paper's), the same with per-token "
                                         "(length-normalised) probabilities ('token_mass'), or its frequency "
                                         "|C_k|/G ('frequency')", ['mass', 'token_mass', 'frequency'])


def _cluster_loglik(batch, cluster_probability: str) -> torch.Tensor | None:
    """The per-row log-likelihoods that weigh SEED-GRPO's clusters: the sequence's (``mass``) or its per-token mean
    (``token_mass``), :func:`sequence_loglik`; None for cluster frequencies (``frequency``)."""
    if cluster_probability == "frequency":
        return None
    if cluster_probability in ("mass", "token_mass"):
        return sequence_loglik(batch, length_normalize=cluster_probability == "token_mass")
    raise ValueError(f"seed_cluster_probability: '{cluster_probability}' is not valid; valid values: "
                     "mass, token_mass, frequency")


def _seed_factor(x: torch.Tensor, scaling: str, focal_gamma: float) -> torch.Tensor:
    """SEED-GRPO's ``f(x)``: ``1 - x`` (linear), ``exp(-x)`` (exponential) or ``(1 - x)^gamma`` (focal)."""
    if scaling == "linear":
        return 1.0 - x
    if scaling == "exponential":
        return torch.exp(-x)
    if scaling == "focal":
        if focal_gamma < 0:
            raise ValueError(f"seed_focal_gamma: must be >= 0, got {focal_gamma}")
        return (1.0 - x).clamp(min=0.0) ** focal_gamma
    raise ValueError(f"seed_scaling: '{scaling}' is not valid; valid values: linear, exponential, focal")


@WEIGHTINGS.register("seed_semantic_entropy", needs=("text",))
def seed_semantic_entropy(advantages: torch.Tensor, group_ids: torch.Tensor, batch, *,
                          seed_alpha: float = SEED_ALPHA, seed_scaling: str = SEED_SCALING,
                          seed_focal_gamma: float = SEED_FOCAL_GAMMA, seed_equivalence: str = SEED_EQUIVALENCE,
                          seed_cluster_probability: str = SEED_CLUSTER_PROBABILITY) -> torch.Tensor:
    """SEED-GRPO semantic-entropy scaling (Chen et al., 2025, arXiv:2505.12346, seed 000-86).

    ``A'_i = A_i * f(alpha * min(SE(q) / SE_max(q), 1))`` with ``f(x) = 1 - x``
    (linear), ``exp(-x)`` (exponential) or ``(1 - x)^gamma`` (focal, ``gamma =
    seed_focal_gamma``); ``SE(q) = -(1/K) sum_k log p(C_k | q)``
    over the K answer clusters of the prompt's group, ``SE_max = log G``, and
    the cluster probability from the completions' likelihoods under the
    behaviour (old) policy::

        p(C_k | q) = sum_{i in C_k} pi_old(o_i | q) / sum_{j=1..G} pi_old(o_j | q)

    with ``pi_old(o | q) = exp(sum_t log pi_old(o_t | q, o_<t))`` from
    ``batch.behavior_logprobs`` (sampled tokens only). A group whose
    completions all give one answer keeps its advantages; a group where every
    answer differs is damped most. ``seed_cluster_probability``: ``mass``
    (above), ``token_mass`` (``pi_old`` replaced by the per-token geometric
    mean ``exp(mean_t log pi_old)``, the length normalisation commonly used
    for semantic entropy, so that one short completion does not carry all
    the mass), ``frequency`` (``|C_k| / G``: the mass when every completion
    is equally likely; it is not the paper's quantity and not an unbiased
    estimate of it).

    Clusters are equal *answer keys* of the completion text
    (``batch.columns['completion']``): ``seed_equivalence`` names a registered
    key (``last_number``: the last number, else the stripped final line;
    ``final_line``; ``exact``) or ``module:function`` mapping text to a
    hashable key. ``alpha = 0.5`` is our default (``alpha = 1`` with the
    linear f zeroes fully uncertain groups). The focal f is the focal-loss
    modulating factor ``(1 - p)^gamma`` (Lin et al., 2017, "Focal Loss for Dense Object Detection")
    with the normalised uncertainty ``x`` in place of ``p``: ``gamma = 1`` is
    the linear f, ``gamma > 1`` damps uncertain groups more steeply while
    confident ones (small x) stay near 1, ``gamma = 0`` switches the scaling
    off. A group of one row has ``SE_max = 0`` and keeps its advantages.

    Provenance: paper equations — SEED-GRPO: Semantic Entropy Enhanced GRPO
    for Uncertainty-Aware Policy Optimization (arXiv:2505.12346v1), Sec. 3, the
    semantic entropy ``SE(q) ~= -(1/K) sum_k log p(C_k|q)`` with ``p(C_k|q) =
    sum_{o_i in C_k} pi_old(o_i|q)`` and ``A'_i = A_i f(alpha SE(q)/SE_max(q))``,
    read from summaries of the method section (equation numbers not checked,
    the full text was not available here); the authors' repository
    github.com/Dreamer312/SEED-GRPO holds only the paper and a README ("we
    will release our code"), so there is no code to match. Choices: the cluster
    masses are normalised over the G sampled completions (the paper's
    unnormalised sum of sequence probabilities makes ``-log p`` grow with
    length, so even a single-answer group would be damped); ``SE / SE_max`` is
    clipped at 1 (``SE_max`` is the paper's maximum; with masses a rare
    cluster can push the estimate above ``log G``), so f stays in ``[1 -
    alpha, 1]``; answer-key clustering stands in for the paper's semantic
    equivalence check. The paper names three f (linear, exponential, focal)
    but the summaries give no formula for the focal one and there is no code:
    ``(1 - x)^gamma`` with ``gamma = 2`` (focal loss's usual value) is
    grpolab's reconstruction.
    Test: tests/test_seed_focal.py::test_focal_factor_by_hand.
    """
    key = resolve_answer_key(seed_equivalence)
    if "completion" not in batch.columns:
        raise ValueError("seed_semantic_entropy needs batch.columns['completion'] (the completion texts)")
    keys = [key(completion_text(c)) for c in batch.columns["completion"]]
    se, se_max = semantic_entropy(keys, group_ids, _cluster_loglik(batch, seed_cluster_probability))
    x = seed_alpha * torch.where(se_max > 0, (se / se_max.clamp(min=1e-12)).clamp(max=1.0), torch.zeros_like(se))
    f = _seed_factor(x, seed_scaling, seed_focal_gamma).to(advantages.dtype)
    return advantages * (f if advantages.dim() == 1 else f[:, None])


# --------------------------------------------------------------------------- EDGE-GRPO


@WEIGHTINGS.register("edge_entropy_driven", needs=("tokens",))
def edge_entropy_driven(advantages: torch.Tensor, group_ids: torch.Tensor, behavior_logprobs: torch.Tensor,
                        completion_mask: torch.Tensor, *,
                        edge_normalize: str = param('group', "EDGE-GRPO: divide each row's entropy by the mean over "
                                                    "its 'group' (paper) or the whole 'batch' (authors' code)",
                                                    ['group', 'batch']),
                        edge_min_entropy: float = param(1e-06, 'EDGE-GRPO: floor on the per-row entropy estimate')
                        ) -> torch.Tensor:
    """EDGE-GRPO entropy-driven advantage (Zhang et al., 2025, arXiv:2507.21848, seed 000-25).

    ``A'_i = A_i / P̂_i`` with ``P̂_i = P_i / mean_j P_j``: confident (low-entropy)
    responses get larger updates, uncertain ones smaller, so responses with tied
    rewards still differ in their signal.

    Choices: the advantage stage has no logits, so the per-response entropy
    ``P_i`` is estimated as the mean negative log-prob of the sampled tokens
    under the behaviour policy, ``P_i = -(1/|o_i|) sum_t log pi_old(o_it)`` (an
    unbiased estimate of the mean token entropy along the sampled path); the
    authors compute exact token entropies of the current policy at loss time.
    ``mean_j`` runs over the row's group (``edge_normalize: group``, the
    paper's equation) or over the whole batch (``batch``, as in the authors'
    code, which averages over the gathered micro-batch). ``P_i`` is floored at
    ``edge_min_entropy``. Guided Error Correction (a rollout-side mechanism that
    injects text) is not part of this component.

    Provenance: paper equations — EDGE-GRPO (arXiv:2507.21848, seed 000-25), the entropy-driven advantage
    ``A_i / P̂_i`` with ``P̂_i = P_i / mean_j P_j`` over the group (equation number not recorded); the authors'
    code (https://github.com/ZhangXJ199/EDGE-GRPO, trl_edge/trainer/grpo_aha_trainer.py, ``_compute_loss`` with
    EDA) differs in three ways, so it is not claimed: exact token entropies of the current policy at loss time,
    averaged over every completion position of the micro-batch padding included (``torch.mean(per_entropy,
    dim=1)``), divided by the mean over the gathered micro-batch (``edge_normalize: batch``); here the
    sampled-token estimate from the behaviour log-probs, over the completion's own tokens.
    Test: tests/test_advantage_shaping.py::test_edge_entropy_driven.
    """
    P = masked_row_mean(-behavior_logprobs.double(), completion_mask).clamp(min=edge_min_entropy)
    if edge_normalize == "group":
        inv, n_groups = group_index(group_ids)
        total = torch.zeros(n_groups, dtype=torch.float64).index_add_(0, inv, P)
        count = torch.zeros(n_groups, dtype=torch.float64).index_add_(0, inv, torch.ones_like(P))
        ref = (total / count)[inv]
    elif edge_normalize == "batch":
        ref = P.mean().expand_as(P)
    else:
        raise ValueError(f"edge_normalize: '{edge_normalize}' is not valid; valid values: group, batch")
    scale = (ref / P).to(advantages.dtype)
    return advantages * (scale if advantages.dim() == 1 else scale[:, None])


# --------------------------------------------------------------------------- entropy-guided function calling (000-106)


@WEIGHTINGS.register("fc_cot_entropy_advantage", needs=("tokens", "text"))
def fc_cot_entropy_advantage(advantages: torch.Tensor, token_entropy: torch.Tensor, think_token_mask: torch.Tensor,
                             completion_mask: torch.Tensor, *,
                             fc_entropy_lambda: float = param(0.4, 'CoT-entropy advantage (seed 000-106): weight '
                                                              'lambda of the entropy term'),
                             fc_entropy_kappa: float = param(2.0, 'CoT-entropy advantage: the entropy term is '
                                                             'capped at |A_i| / kappa (kappa > 1 keeps the sign '
                                                             'of A_i)'),
                             fc_entropy_span: str = param('think', "CoT-entropy advantage: tokens whose entropy "
                                                          "is averaged: 'think' (inside <think>...</think>) or "
                                                          "'completion' (every model token)",
                                                          ['think', 'completion']),
                             fc_entropy_form: str = param('scale_then_clip', "CoT-entropy advantage: "
                                                          "'scale_then_clip' min(lambda H, |A|/kappa) (Cheng et "
                                                          "al.'s psi) or 'clip_then_scale' lambda min(H, "
                                                          "|A|/kappa)", ['scale_then_clip', 'clip_then_scale'])
                             ) -> torch.Tensor:
    """Entropy-enhanced advantage of entropy-guided GRPO for function calling (FunRL / EGPO, "Exploring
    Superior Function Calls via Reinforcement Learning", later "Reasoning through Exploration: A Reinforcement
    Learning Framework for Robust Function Calling", Hao et al., arXiv:2508.05118, seed 000-106).

    With ``H_i`` the mean vocabulary entropy of row i's chain-of-thought tokens (``token_entropy`` of the
    current policy, averaged over ``think_token_mask``, or over every model token with ``fc_entropy_span:
    completion``; 0 for a row without a ``<think>`` block) and ``A_i`` its GRPO advantage::

        A'_i = A_i + psi(H_i),   psi(H) = min(lambda * H, |A_i| / kappa)          (scale_then_clip)
                                 psi(H) = lambda * min(H, |A_i| / kappa)          (clip_then_scale)

    ``psi >= 0`` is detached (it changes the weight of the policy gradient, not its direction) and
    ``psi <= |A_i| / kappa`` with ``kappa > 1`` never flips the sign of ``A_i``: a success along a more
    uncertain chain of thought is reinforced more, a failure along it is punished less, and an all-equal group
    (``A_i = 0``) gets no term. ``lambda = 0.4``, ``kappa = 2``.

    Provenance: reconstructed from the abstract — with the authors' README and a third-party reading of the
    paper: the authors' repository (https://github.com/BingguangHao/RLFC, README.md and img/pipeline.png, no code:
    "release pending review") shows the objective ``J = J_GRPO(A_i + sigma(H_i))`` with ``H_i`` the entropy of
    rollout i's chain of thought, and the v4 abstract says the entropy bonus "is carefully constrained by a
    clipping mechanism"; the paper's own equation could not be read here. The clip form is that of the
    entropy-based advantage of "Reasoning with Exploration: An Entropy Perspective" (Cheng et al.,
    arXiv:2506.14758: a gradient-detached entropy term capped at ``|A_t| / kappa``,
    ``psi(H_t) = min(alpha * H_t^detach, |A_t| / kappa)``, per token there), applied here per rollout to the
    CoT entropy; lambda = 0.4 and kappa = 2 are the values a third-party reproduction plan
    (github.com/zhangdw156/verl, docs/algo/EGPO_reproduction_plan.md) reports for the paper, whose formula
    there, ``A_i + lambda * clip(H_i, -|A_i|/alpha, |A_i|/alpha)`` with alpha = 2, is the ``clip_then_scale``
    form. The entropy is the policy's at advantage time (on-policy: the behaviour policy);
    with per-token advantages ``[R, T]`` the cap is per token (``|A_it| / kappa``), the entropy per row.
    Test: tests/test_fc_entropy_grpo.py::test_cot_entropy_advantage_hand_computed,
    tests/test_fc_entropy_grpo.py::test_trainer_adds_the_entropy_term_to_grpo_advantages.
    """
    if fc_entropy_kappa <= 1:
        raise ConfigError(f"fc_entropy_kappa: expected > 1 (so the entropy term cannot flip the advantage's "
                          f"sign), got {fc_entropy_kappa}")
    if fc_entropy_lambda < 0:
        raise ConfigError(f"fc_entropy_lambda: expected >= 0, got {fc_entropy_lambda}")
    if fc_entropy_span == "think":
        span = think_token_mask.to(completion_mask.device) * completion_mask
    elif fc_entropy_span == "completion":
        span = completion_mask
    else:
        raise ConfigError(f"fc_entropy_span: '{fc_entropy_span}' is not valid; valid values: think, completion")
    H = masked_row_mean(token_entropy.double().to(completion_mask.device), span)
    if advantages.dim() == 2:
        H = H[:, None]
    cap = advantages.double().abs() / fc_entropy_kappa  # per row ([R]) or per token ([R, T] advantages)
    if fc_entropy_form == "scale_then_clip":
        psi = torch.minimum(fc_entropy_lambda * H, cap)
    elif fc_entropy_form == "clip_then_scale":
        psi = fc_entropy_lambda * torch.minimum(H, cap)
    else:
        raise ConfigError(f"fc_entropy_form: '{fc_entropy_form}' is not valid; valid values: scale_then_clip, "
                          f"clip_then_scale")
    return advantages + psi.to(advantages.dtype)
