"""Advantage shaping: uncertainty, entropy, token-level, stateful and span-decoupled advantages.

Advantage estimators (``advantage: name``) and weightings (``advantage_weightings:
[name]``) of the GRPO variants that scale advantages by an uncertainty or entropy
estimate, give each token its own advantage (``[R, T]``), keep state across
steps, or treat token spans separately. Every function states its formula, its
seed id, and the choices made where the paper or abstract leaves one open.

Spans: ``batch.span_ids`` is ``[R, T]`` with 0 = no span. A rollout strategy
(multi-turn tools, control tokens) writes the ids; the plain rollout leaves
them all 0. ``span_mark: first_token`` marks the first completion token as span
1 (a Thinkless-style control token) and the rest as span 2 without any rollout
support.
"""
from __future__ import annotations

import importlib
import math
import os
import re
import sys
from typing import Callable

import torch

from ..errors import warn_fallback
from ..registry import ANSWER_KEYS
from .losses import per_token
from ..data import completion_text
from .advantages import ADVANTAGES, group_stats, group_zscore
from .weightings import WEIGHTINGS
from ..registry import param

SPAN_MARK = param('batch', "spans from batch.span_ids, or 'first_token' (1 = first completion token, 2 = the rest; Thinkless control token)", ['batch', 'first_token'])

# ----------------------------------------------------------------- helpers


def _group_index(group_ids: torch.Tensor):
    """``(inv, n_groups)``: row -> dense group index 0..n_groups-1."""
    uniq, inv = torch.unique(group_ids, return_inverse=True)
    return inv, uniq.numel()


def _masked_row_mean(values: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    m = mask.to(values.dtype)
    return (values * m).sum(-1) / m.sum(-1).clamp(min=1)


def reward_column(reward_matrix: torch.Tensor, names: list[str], spec: str) -> torch.Tensor:
    """Column ``spec`` of the reward matrix: a reward name or an integer index (``-1`` = last)."""
    spec = str(spec).strip()
    if spec in names:
        return reward_matrix[:, names.index(spec)]
    try:
        idx = int(spec)
    except ValueError:
        raise ValueError(f"reward column '{spec}' is neither a reward name ({', '.join(names) or 'none'}) "
                         f"nor an integer index") from None
    K = reward_matrix.shape[1]
    if not -K <= idx < K:
        raise ValueError(f"reward column index {idx} is out of range for {K} reward function(s) "
                         f"({', '.join(names) or 'unnamed'})")
    return reward_matrix[:, idx]


def _reward_names(batch, reward_matrix: torch.Tensor) -> list[str]:
    names = list(getattr(batch, "reward_names", []) or []) if batch is not None else []
    return names if len(names) == reward_matrix.shape[1] else []


# ------------------------------------------------- answer equivalence (SEED)

_NUMBER = re.compile(r"-?\d+(?:\.\d+)?(?:/\d+)?")


@ANSWER_KEYS.register("final_line")
def final_line_key(text: str) -> str:
    """The last non-empty line, stripped ('' for an empty completion).

    Provenance: grpolab's own — a clustering key for answer-based components (SEED-GRPO); implements no
    published method.
    """
    lines = [ln.strip() for ln in text.strip().splitlines() if ln.strip()]
    return lines[-1] if lines else ""


@ANSWER_KEYS.register("last_number")
def last_number_key(text: str) -> str:
    """The last number in the text (``3``, ``3.0`` and ``3.00`` are one answer; ``a/b`` kept as
    written); the stripped final line when the text has no number.

    Provenance: grpolab's own — a clustering key for answer-based components (SEED-GRPO); implements no
    published method.
    """
    found = _NUMBER.findall(text)
    if not found:
        return final_line_key(text)
    s = found[-1]
    if "/" in s:
        return s
    v = float(s)
    return str(int(v)) if v.is_integer() else repr(v)


@ANSWER_KEYS.register("exact")
def exact_key(text: str) -> str:
    """The whole completion, stripped.

    Provenance: grpolab's own — a clustering key for answer-based components (SEED-GRPO); implements no
    published method.
    """
    return text.strip()


def resolve_answer_key(spec: str) -> Callable[[str], object]:
    """A registered answer-key name or ``module:function`` (``text -> hashable key``)."""
    if spec in ANSWER_KEYS:
        return ANSWER_KEYS.get(spec)
    module_name, _, func_name = spec.partition(":")
    if not module_name or not func_name:
        raise ValueError(f"seed_equivalence: '{spec}' is neither a registered answer key "
                         f"({', '.join(ANSWER_KEYS.names())}) nor module:function")
    if os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())
    try:
        fn = getattr(importlib.import_module(module_name), func_name)
    except (ImportError, AttributeError) as e:
        raise ValueError(f"seed_equivalence: cannot load '{spec}' ({e})") from None
    if not callable(fn):
        raise ValueError(f"seed_equivalence: '{spec}' is not callable")
    return fn


def semantic_entropy(keys: list, group_ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-row ``(SE, SE_max)`` of the row's group, clustering rows with equal keys.

    ``p(C_k) = |C_k| / n`` (n = rows of the group), ``SE = -(1/K) sum_k log p(C_k)``
    over the K clusters (the Monte-Carlo estimator SEED-GRPO uses), ``SE_max = log n``.
    """
    inv, n_groups = _group_index(group_ids)
    se = torch.zeros(n_groups, dtype=torch.float64)
    se_max = torch.zeros(n_groups, dtype=torch.float64)
    for g in range(n_groups):
        rows = (inv == g).nonzero().flatten().tolist()
        n = len(rows)
        counts: dict = {}
        for r in rows:
            counts[keys[r]] = counts.get(keys[r], 0) + 1
        se[g] = -sum(math.log(c / n) for c in counts.values()) / len(counts)
        se_max[g] = math.log(n) if n > 1 else 0.0
    return se[inv], se_max[inv]


@WEIGHTINGS.register("seed_semantic_entropy")
def seed_semantic_entropy(advantages: torch.Tensor, group_ids: torch.Tensor, batch, *,
                          seed_alpha: float = param(0.5, 'SEED-GRPO: sensitivity alpha; A * f(alpha * SE / SE_max)'),
                          seed_scaling: str = param('linear', 'SEED-GRPO: f(x) = 1 - x (linear) or exp(-x) '
                                                    '(exponential)', ['linear', 'exponential']),
                          seed_equivalence: str = param('last_number', 'SEED-GRPO: answer key that clusters '
                                                        "completions: 'last_number', 'final_line', 'exact' or "
                                                        "'module:function' (text -> key)")) -> torch.Tensor:
    """SEED-GRPO semantic-entropy scaling (Chen et al., 2025, arXiv:2505.12346, seed 000-86).

    ``A'_i = A_i * f(alpha * SE(q) / SE_max(q))`` with ``f(x) = 1 - x`` (linear)
    or ``exp(-x)`` (exponential); ``SE(q) = -(1/K) sum_k log p(C_k | q)`` over the
    K answer clusters of the prompt's group and ``SE_max = log G``. A group whose
    completions all give one answer keeps its advantages; a group where every
    answer differs is damped most.

    Choices: completions are clustered by an *answer key* of the completion
    text (``batch.columns['completion']``): ``seed_equivalence`` names a
    registered key (``last_number``: the last number, else the stripped final
    line; ``final_line``; ``exact``) or ``module:function`` mapping text to a
    hashable key; equal keys = one cluster. The paper weighs clusters by the
    old policy's sequence probability; we use the empirical frequency
    ``|C_k|/G`` (sequence probabilities of different lengths are not
    comparable, and the MC estimator over G samples is the same in
    expectation). ``alpha = 0.5`` is our default (``alpha = 1`` with the linear
    f zeroes fully uncertain groups). The paper's third f ("focal") is not
    implemented. A group of one row has ``SE_max = 0`` and keeps its advantages.

    Provenance: reconstructed from the abstract — clusters by an answer key of the completion text, cluster
    probability by empirical frequency (the paper weighs by sequence probability), alpha = 0.5; being revised by
    a parallel change.
    """
    key = resolve_answer_key(seed_equivalence)
    if "completion" not in batch.columns:
        raise ValueError("seed_semantic_entropy needs batch.columns['completion'] (the completion texts)")
    keys = [key(completion_text(c)) for c in batch.columns["completion"]]
    se, se_max = semantic_entropy(keys, group_ids)
    x = seed_alpha * torch.where(se_max > 0, se / se_max.clamp(min=1e-12), torch.zeros_like(se))
    if seed_scaling == "linear":
        f = 1.0 - x
    elif seed_scaling == "exponential":
        f = torch.exp(-x)
    else:
        raise ValueError(f"seed_scaling: '{seed_scaling}' is not valid; valid values: linear, exponential")
    f = f.to(advantages.dtype)
    return advantages * (f if advantages.dim() == 1 else f[:, None])


# ------------------------------------------------------------------ S-GRPO


def sgrpo_weight(n: torch.Tensor, k: torch.Tensor, p: float, eps: float = 1e-8) -> torch.Tensor:
    """S-GRPO optimal group weight ``w*(n, k, p)`` (authors' ``group_weight``).

    ``q = k / n`` (observed success rate), ``t = clip((q - p) / (1 - 2p), 0, 1)``
    (noise-corrected true rate), ``w* = (1 - 2p) t (1 - t) /
    (sqrt(q (1 - q) + eps) * sqrt(t (1 - t) + eps))``; ``w* = 0`` for ``n = 0``.
    """
    if not 0.0 <= p < 0.5:
        raise ValueError(f"sgrpo_noise_p: must be in [0, 0.5), got {p}")
    n = n.double()
    q = k.double() / n.clamp(min=1)
    t = ((q - p) / (1.0 - 2.0 * p)).clamp(0.0, 1.0)
    w = (1.0 - 2.0 * p) * t * (1.0 - t) / (torch.sqrt(q * (1 - q) + eps) * torch.sqrt(t * (1 - t) + eps))
    return torch.where(n > 0, w, torch.zeros_like(w))


@ADVANTAGES.register("sgrpo_noise_aware")
def sgrpo_noise_aware(rewards: torch.Tensor, group_ids: torch.Tensor, *, advantage_epsilon: float = 1e-4,
                      sgrpo_noise_p: float = param(0.1, 'S-GRPO: symmetric reward-flip probability p in [0, 0.5)'),
                      sgrpo_success_threshold: float = param(0.0, 'S-GRPO: a reward above this counts as a success '
                                                             '(k)')) -> torch.Tensor:
    """S-GRPO noise-aware advantage (Shen et al., 2025, seed 000-32; github.com/shenpeijun0212/S-GRPO).

    ``A_i = w*(n, k, p) * (r_i - mean_g r) / (std_g r + epsilon)`` where ``n`` is
    the group's scored rows, ``k`` the rows with ``r > sgrpo_success_threshold``
    and ``w*`` :func:`sgrpo_weight` under a symmetric reward-flip probability
    ``p``. Unbalanced groups (k near 0 or n), whose few successes are most
    likely flipped labels, are down-weighted; at ``p = 0`` ``w* ~= 1`` (GRPO).

    As in the authors' code (``compute_monte_carlo_advantages``) the weight
    multiplies the GRPO z-score (it recovers GRPO's std); binary rewards are
    assumed, counting ``reward > 0`` as a success as they do. ``p = 0.1`` is our
    default (the authors' flag defaults to 0 = off).

    Provenance: authors' code — https://github.com/shenpeijun0212/S-GRPO, train/train_S-GRPO.py (group_weight,
    compute_monte_carlo_advantages); p = 0.1 is grpolab's default (the authors' flag defaults to 0).
    """
    adv = group_zscore(rewards, group_ids, advantage_epsilon=advantage_epsilon)
    scored = ~torch.isnan(rewards)
    inv, n_groups = _group_index(group_ids)
    n = torch.zeros(n_groups, dtype=torch.float64).index_add_(0, inv, scored.double())
    succ = (scored & (torch.nan_to_num(rewards, nan=0.0) > sgrpo_success_threshold)).double()
    k = torch.zeros(n_groups, dtype=torch.float64).index_add_(0, inv, succ)
    return adv * sgrpo_weight(n, k, sgrpo_noise_p)[inv].to(adv.dtype)


# --------------------------------------------------------------- EDGE-GRPO


@WEIGHTINGS.register("edge_entropy_driven")
def edge_entropy_driven(advantages: torch.Tensor, group_ids: torch.Tensor, behavior_logprobs: torch.Tensor,
                        completion_mask: torch.Tensor, *,
                        edge_normalize: str = param('group', "EDGE-GRPO: divide each row's entropy by the mean over "
                                                    "its 'group' (paper) or the whole 'batch' (authors' code)",
                                                    ['group', 'batch']),
                        edge_min_entropy: float = param(1e-06, 'EDGE-GRPO: floor on the per-row entropy estimate')) -> torch.Tensor:
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

    Provenance: authors' code — https://github.com/ZhangXJ199/EDGE-GRPO, trl_edge/trainer/grpo_aha_trainer.py
    (entropy-driven advantage); known difference: the response entropy is estimated from the behaviour log-probs
    of the sampled tokens, the authors compute exact token entropies at loss time.
    """
    P = _masked_row_mean(-behavior_logprobs.double(), completion_mask).clamp(min=edge_min_entropy)
    if edge_normalize == "group":
        inv, n_groups = _group_index(group_ids)
        total = torch.zeros(n_groups, dtype=torch.float64).index_add_(0, inv, P)
        count = torch.zeros(n_groups, dtype=torch.float64).index_add_(0, inv, torch.ones_like(P))
        ref = (total / count)[inv]
    elif edge_normalize == "batch":
        ref = P.mean().expand_as(P)
    else:
        raise ValueError(f"edge_normalize: '{edge_normalize}' is not valid; valid values: group, batch")
    scale = (ref / P).to(advantages.dtype)
    return advantages * (scale if advantages.dim() == 1 else scale[:, None])


# ------------------------------------------------------ SPO single stream


@ADVANTAGES.register("spo_single_stream")
class SPOValueTracker:
    """SPO single-stream advantage with a persistent per-prompt value tracker
    (Single-stream Policy Optimization, Xu & Ding, 2025, arXiv:2509.13232, seed 000-113).

    Per prompt ``x`` (keyed by ``prompt_uids``) a Beta posterior ``(a, b)`` of the
    success rate; ``v(x) = a / (a + b)``. For each row, before this batch updates
    the tracker::

        A_i = r_i - v(x_i)                            (no group baseline)
        A~  = (A - mean_B A) / (std_B A + epsilon)     (batch-global z-score)

    then, per prompt in the batch, ``a <- rho a + sum r``, ``b <- rho b + sum (1 - r)``
    with the KL-adaptive forgetting ``rho = clip(2^(-D / D_half), rho_min, rho_max)``.
    Works with any number of completions per prompt (``num_generations: 1``
    is the paper's setting; with G > 1 all rows of a prompt share the baseline).

    Choices: (1) the drift ``D`` should be the KL between the current policy and
    the one that last saw ``x``; the advantage stage only has behaviour
    log-probs of new samples, so we use the change of the prompt's mean
    per-token negative log-likelihood since its last visit, ``D = |nll_now -
    nll_last|`` (0 on a stale-free revisit, large when the policy moved). (2)
    A new prompt starts from ``v = spo_prior_value`` with the effective count
    ``N0 = 1 / (1 - rho_min)`` (the paper estimates it from extra rollouts
    of the initial policy). (3) Rewards must lie in [0, 1] (success rates).
    (4) The tracker's prioritised prompt sampling is a sampler feature and is
    not part of this component. Unscorable (NaN) rows get A = 0 and do not
    update the tracker.

    Provenance: reconstructed from the abstract — the Beta tracker and batch z-score follow the paper's
    description; the drift D from the change of the prompt's mean NLL, the prior count N0 and the [0, 1] reward
    assumption are grpolab's choices.
    """

    def __init__(self, *,
                 spo_rho_min: float = param(0.875, 'SPO: lower clip of the forgetting factor rho'),
                 spo_rho_max: float = param(0.96, 'SPO: upper clip of the forgetting factor rho'),
                 spo_kl_half: float = param(0.06, 'SPO: policy drift D_half at which rho = 1/2 before clipping'),
                 spo_prior_value: float = param(0.5, 'SPO: value estimate of a prompt never seen before'),
                 spo_normalize: str = param('batch', 'SPO: z-score advantages over the whole batch, or not',
                                            ['batch', 'none'])):
        if not 0.0 < spo_rho_min <= spo_rho_max < 1.0:
            raise ValueError(f"spo_rho_min/spo_rho_max: need 0 < rho_min <= rho_max < 1, "
                             f"got {spo_rho_min}, {spo_rho_max}")
        if spo_kl_half <= 0:
            raise ValueError(f"spo_kl_half: must be > 0, got {spo_kl_half}")
        if not 0.0 <= spo_prior_value <= 1.0:
            raise ValueError(f"spo_prior_value: must be in [0, 1], got {spo_prior_value}")
        if spo_normalize not in ("batch", "none"):
            raise ValueError(f"spo_normalize: '{spo_normalize}' is not valid; valid values: batch, none")
        self.rho_min, self.rho_max, self.kl_half = spo_rho_min, spo_rho_max, spo_kl_half
        self.prior, self.normalize = spo_prior_value, spo_normalize
        self.table: dict[int, tuple[float, float, float]] = {}  # uid -> (a, b, nll at last visit)

    def value(self, uid: int) -> float:
        if uid in self.table:
            a, b, _ = self.table[uid]
            return a / (a + b)
        return self.prior

    def rho(self, drift: float) -> float:
        return min(max(2.0 ** (-drift / self.kl_half), self.rho_min), self.rho_max)

    def __call__(self, rewards: torch.Tensor, prompt_uids: torch.Tensor, behavior_logprobs: torch.Tensor,
                 completion_mask: torch.Tensor, *, advantage_epsilon: float = 1e-4) -> torch.Tensor:
        scored = ~torch.isnan(rewards)
        r = rewards.double()
        if bool(((r[scored] < 0) | (r[scored] > 1)).any()):
            raise ValueError("spo_single_stream: rewards must lie in [0, 1] (the tracker estimates success rates)")
        nll = _masked_row_mean(-behavior_logprobs.double(), completion_mask)
        uids = prompt_uids.tolist()
        baseline = torch.tensor([self.value(u) for u in uids], dtype=torch.float64)
        adv = torch.where(scored, r - baseline, torch.zeros_like(r))
        for uid in dict.fromkeys(uids):  # batch order, each prompt once
            rows = [i for i, u in enumerate(uids) if u == uid and bool(scored[i])]
            if not rows:
                continue
            succ = float(r[rows].sum())
            fail = len(rows) - succ
            nll_now = float(nll[rows].mean())
            if uid in self.table:
                a, b, nll_last = self.table[uid]
                rho = self.rho(abs(nll_now - nll_last))
                a, b = rho * a, rho * b
            else:
                n0 = 1.0 / (1.0 - self.rho_min)
                a, b = self.prior * n0, (1.0 - self.prior) * n0
            self.table[uid] = (a + succ, b + fail, nll_now)
        if self.normalize == "batch":
            mean, std, count = group_stats(torch.where(scored, adv, torch.full_like(adv, float("nan"))),
                                           torch.zeros_like(prompt_uids))
            adv = torch.nan_to_num((adv - mean) / (std + advantage_epsilon), nan=0.0) * scored
        return adv.to(rewards.dtype)

    def state_dict(self) -> dict:
        return {"table": {int(k): list(v) for k, v in self.table.items()}}

    def load_state_dict(self, state: dict) -> None:
        self.table = {int(k): tuple(float(x) for x in v) for k, v in state["table"].items()}


# --------------------------------------------------------------- lambda-GRPO


def shared_prefix_counts(completion_ids: torch.Tensor, completion_mask: torch.Tensor,
                         group_ids: torch.Tensor) -> torch.Tensor:
    """``k[i, t]`` = rows of i's group whose first t+1 completion tokens equal row i's
    (i itself included; only rows that still have a token at t count). 0 on padding."""
    R, T = completion_ids.shape
    alive = completion_mask > 0
    same_group = group_ids[:, None] == group_ids[None, :]                            # [R, R]
    eq = (completion_ids[:, None, :] == completion_ids[None, :, :]) & alive[:, None, :] & alive[None, :, :]
    prefix_eq = torch.cumprod(eq.to(torch.int64), dim=-1).bool()                     # [R, R, T]
    k = (prefix_eq & same_group[:, :, None]).sum(1)
    return k * alive


@WEIGHTINGS.register("lambda_prefix_weight")
def lambda_prefix_weight(advantages: torch.Tensor, group_ids: torch.Tensor, completion_mask: torch.Tensor, batch, *,
                         lambda_grpo_power: float = param(1.0, 'lambda-GRPO: token weight k^-lambda, k = group '
                                                          "completions sharing the token's prefix (0 = GRPO)")) -> torch.Tensor:
    """λ-GRPO shared-prefix weighting ("GRPO is secretly a PRM", 2025, seed 004-03).

    ``A'_it = A_i * k_it^(-lambda)``, ``k_it`` = number of completions in i's group
    sharing i's prefix up to and including token t (:func:`shared_prefix_counts`).
    A shared prefix is one "process step" of GRPO's implicit PRM; vanilla GRPO
    counts a step shared by k completions k times. With ``lambda = 1`` each
    step counts once (its tokens' total weight is the mean of the sharing
    completions' advantages, the step's Monte-Carlo process reward); ``lambda = 0``
    is GRPO. Output ``[R, T]``.

    Choices: the seed gives the frequency-normalisation idea; the 1/k token
    scaling follows the authors' project page, and the exponent ``lambda``
    (interpolating to GRPO) is our parameterisation.

    Provenance: reconstructed from the abstract — the 1/k token scaling of the authors' project page,
    generalised to k^(-lambda) by grpolab (lambda = 0 is GRPO).
    """
    k = shared_prefix_counts(batch.completion_ids, completion_mask, group_ids).to(torch.float64)
    w = torch.where(k > 0, k.clamp(min=1) ** (-lambda_grpo_power), torch.zeros_like(k)).to(advantages.dtype)
    return per_token(advantages, w) * w


# ----------------------------------------------------------------- TW-GRPO


@WEIGHTINGS.register("tw_token_weight")
def tw_token_weight(advantages: torch.Tensor, group_ids: torch.Tensor, behavior_logprobs: torch.Tensor,
                    completion_mask: torch.Tensor, *,
                    tw_alpha: float = param(1.7, 'TW-GRPO: maximum token weight; weights min-max map the group '
                                            "divergence to [1, alpha] (>= 1; 1 = GRPO; authors' script uses 1.7)")) -> torch.Tensor:
    """TW-GRPO token weights from intra-group divergence (Dang et al., 2025, arXiv:2505.24718, seed 000-95).

    Source: the authors' code, https://github.com/longmalongma/TW-GRPO,
    ``src/open_r1/trainer/grpo_trainer.py``, ``compute_token_importance_kl_logs_uniform``
    (``loss_type tw_grpo``; ``scripts/tw-grpo.sh`` uses ``--alpha 1.70``, ``--beta 0``).
    There, per group g and position t, with ``lp_i`` row i's full-vocabulary
    log-probs and ``m = mean_i lp_i`` (mean in log space over the group's G rows)::

        s_t   = mean_i sum_v k3(m_v - lp_i,v),   k3(d) = exp(d) - d - 1,  d clamped to [-11, 11]
        n_t   = (s_t - min_t' s_t') / (max_t' s_t' - min_t' s_t' + 1e-8)     (min-max over positions)
        w_t   = 1 + (alpha - 1) * n_t                                        (weights in [1, alpha])

    and the per-token loss is multiplied by ``w_t`` (same weight for every row
    of the group). Positions where the group's distributions agree (generic
    prefixes) get weight 1; the most divergent position gets ``alpha``.

    grpolab adaptation (the weighting stage sees only ``behavior_logprobs``,
    the sampled token's log-prob, not the full distribution): the sum over the
    vocabulary is reduced to each row's own sampled token, ``x_it``::

        s_t = mean_{i alive at t} k3(m_t - x_it),   m_t = mean_{i alive at t} x_it

    The min-max map to ``[1, alpha]`` is the authors'. Choices: the authors pad
    dead positions with a uniform distribution and let them take part; here
    only rows alive at t enter ``s_t``, positions with fewer than two alive rows
    get weight 1 and are left out of the min/max; a group whose scores are all
    equal gets weight 1 everywhere. Since grpolab weights the advantage (not
    the whole per-token loss), the KL term is not weighted; the authors run
    with ``beta = 0``, where the two coincide. ``alpha = 1`` gives GRPO;
    ``tw_alpha`` must be >= 1. Output ``[R, T]``. The soft multi-choice reward
    and Q/A inversion are task-side, not here.

    Provenance: authors' code — https://github.com/longmalongma/TW-GRPO, src/open_r1/trainer/grpo_trainer.py
    (compute_token_importance_kl_logs_uniform); known difference: grpolab scores a position from the sampled
    tokens' log-probs, not the full distributions (being fixed by a parallel change).
    """
    if tw_alpha < 1.0:
        raise ValueError(f"tw_alpha: the maximum token weight must be >= 1, got {tw_alpha}")
    inv, n_groups = _group_index(group_ids)
    alive = (completion_mask > 0).double()
    lp = behavior_logprobs.double() * alive
    w = torch.ones_like(lp)
    for g in range(n_groups):
        rows = inv == g
        a, x = alive[rows], lp[rows]
        n = a.sum(0)
        mean = x.sum(0) / n.clamp(min=1)
        d = (mean[None, :] - x).clamp(-11.0, 11.0)
        score = ((torch.exp(d) - d - 1) * a).sum(0) / n.clamp(min=1)
        defined = n >= 2
        if not bool(defined.any()):
            continue
        lo, hi = score[defined].min(), score[defined].max()
        norm = (score - lo) / (hi - lo + 1e-8)
        wg = torch.where(defined, 1.0 + (tw_alpha - 1.0) * norm, torch.ones_like(score))
        w[rows] = wg[None, :].expand(int(rows.sum()), -1)
    w = (w * alive).to(advantages.dtype)
    return per_token(advantages, w) * w


# -------------------------------------------------------------- TempSamp-R1


def asymmetric_soft_reward(rewards: torch.Tensor, tau: float, alpha_pos: float, alpha_neg: float) -> torch.Tensor:
    """``r >= tau: tau + log(1 + alpha_pos (r - tau)) / alpha_pos`` (compress);
    ``r < tau: tau - (exp(alpha_neg (tau - r)) - 1) / alpha_neg`` (expand). Slope 1 at tau."""
    if alpha_pos <= 0 or alpha_neg <= 0:
        raise ValueError(f"tempsamp_alpha_pos/neg: must be > 0, got {alpha_pos}, {alpha_neg}")
    d = rewards - tau
    up = tau + torch.log1p(alpha_pos * d.clamp(min=0)) / alpha_pos
    down = tau - torch.expm1(alpha_neg * (-d).clamp(min=0)) / alpha_neg
    return torch.where(d >= 0, up, down)


@ADVANTAGES.register("tempsamp_soft_advantage")
def tempsamp_soft_advantage(rewards: torch.Tensor, group_ids: torch.Tensor, *, advantage_epsilon: float = 1e-4,
                            tempsamp_tau: float = param(0.5, 'TempSamp-R1: reward pivot of the asymmetric transform'),
                            tempsamp_alpha_pos: float = param(1.0, 'TempSamp-R1: log-compression strength above the '
                                                              'pivot'),
                            tempsamp_alpha_neg: float = param(1.0, 'TempSamp-R1: exp-expansion strength below the '
                                                              'pivot')) -> torch.Tensor:
    """TempSamp-R1 non-linear soft advantage (Li et al., 2025, arXiv:2509.18056, seed 000-112).

    ``A_i = zscore_g(phi(r)_i)`` with the asymmetric transform ``phi``
    (:func:`asymmetric_soft_reward`): rewards above the pivot ``tau`` are
    log-compressed, so a near-perfect (e.g. injected ground-truth) completion
    does not dominate the group and squash the others' advantages; rewards
    below ``tau`` are exp-expanded, so differences among poor completions
    still count. ``phi`` is monotone with slope 1 at ``tau``.

    Choices: the abstract only says "non-linear soft advantage ... asymmetric
    transformation"; the log/exp pair around a pivot is our reading. The
    published equation was NOT found: searched the stored text of
    arXiv:2509.18056 (html v2: abstract and introduction only), the
    papernotes.org NeurIPS-2025 summary, sciencestack/hyper.ai abstract pages,
    and GitHub code (HVision-NKU/TempSamp-R1 is not in the searched index; the
    re-implementation ZhangZikun6666/TempSamp-R1 ``verl/trainer/core_algos.py``
    uses plain GRPO z-scores with the ground-truth row in the group and no
    soft transform). Check against the paper's method section before relying
    on the exact shape. The off-policy ground-truth
    injection and hybrid CoT training are rollout/data features, not part of
    this component.

    Provenance: reconstructed from the abstract — a log/exp pair around a pivot tau as the asymmetric soft
    transform, then group_zscore; the published equation and the authors' code were not found.
    """
    shaped = asymmetric_soft_reward(rewards, tempsamp_tau, tempsamp_alpha_pos, tempsamp_alpha_neg)
    return group_zscore(shaped, group_ids, advantage_epsilon=advantage_epsilon)


# --------------------------------------------------------------------- AAPO


@ADVANTAGES.register("aapo_momentum")
class AAPOMomentum:
    """AAPO advantage momentum / margin (Xiong et al., 2025, arXiv:2505.14264, seed 000-48).

    Source: the authors' code, https://github.com/JianxXiong/AAPO,
    ``open-rs/trainer/AAPOTrainer.py`` (same in ``open-r1/``). For every policy
    completion ``o_i`` the trainer also samples one completion ``o^ref_i`` of
    the same prompt from the frozen reference model and scores it, then::

        A_i = (r_i - mean_g r) / (std_g r + 1e-4) + clip(r_i - r^ref_i, -0.2, 0.28)

    (paired by index within the group), optimised with the plain cross-entropy
    loss ``-A_i log pi(o_i)`` averaged over all tokens (no ratio, no clip: use
    ``policy_loss: policy_gradient`` with ``loss_aggregation: token_mean``).
    The "momentum" (renamed "advantage margin" in the latest arXiv version) is
    the reward gap to the reference model: when the group advantage vanishes
    (all rewards equal) it still says whether the policy beats the reference.

    Here ``A_i = zscore_g(r)_i + eta * clip(r_i - b_i, -clip_low, clip_high)``:

    * ``b_i`` = the reference reward of row i from the batch column
      ``aapo_ref_column`` (default ``ref_reward``) when the rollout provides it
      (the published form; a missing/None entry gives term 0).
    * grpolab's plain rollout does not sample from the reference model, so
      without that column ``b_i`` falls back to ``m(x_i)``, an exponential
      moving average of prompt x's group-mean reward over its previous visits
      (``m <- mu m + (1 - mu) mean_g r``; term 0 on a first visit; ``mu = 1``
      freezes ``m`` at the first visit, the closest stand-in for a fixed
      reference). This fallback is grpolab's choice, not the paper's.

    ``eta = 1`` and clip bounds ``0.2 / 0.28`` are the authors' values.
    Unscorable rows get A = 0 and do not enter the EMA.

    Provenance: authors' code — https://github.com/JianxXiong/AAPO, open-rs/trainer/AAPOTrainer.py; the margin
    term matches when the rollout supplies the reference reward column, without it grpolab's per-prompt EMA
    stands in (grpolab's choice, being replaced by a reference rollout on branch fid-aapo).
    """

    def __init__(self, *,
                 aapo_momentum: float = param(0.9, "AAPO: EMA momentum of each prompt's mean reward (fallback "
                                              'baseline when no reference-reward column; 1 = frozen at first visit)')):
        if not 0.0 <= aapo_momentum <= 1.0:
            raise ValueError(f"aapo_momentum: must be in [0, 1], got {aapo_momentum}")
        self.mu = aapo_momentum
        self.ema: dict[int, float] = {}

    def __call__(self, rewards: torch.Tensor, group_ids: torch.Tensor, prompt_uids: torch.Tensor, batch=None, *,
                 advantage_epsilon: float = 1e-4,
                 aapo_eta: float = param(1.0, 'AAPO: weight of the clipped margin term clip(r - r_ref)'),
                 aapo_clip_low: float = param(0.2, 'AAPO: margin r - r_ref is clipped below at -clip_low (authors: '
                                              '0.2)'),
                 aapo_clip_high: float = param(0.28, 'AAPO: margin r - r_ref is clipped above at clip_high (authors: '
                                               '0.28)'),
                 aapo_ref_column: str = param('ref_reward', "AAPO: batch column with the reference model's reward "
                                              'per row (missing = per-prompt EMA fallback)')) -> torch.Tensor:
        if aapo_clip_low < 0 or aapo_clip_high < 0:
            raise ValueError(f"aapo_clip_low/high: must be >= 0, got {aapo_clip_low}, {aapo_clip_high}")
        adv = group_zscore(rewards, group_ids, advantage_epsilon=advantage_epsilon).double()
        mean, _, _ = group_stats(rewards.double(), group_ids)
        uids = prompt_uids.tolist()
        col = None if batch is None else getattr(batch, "columns", {}).get(aapo_ref_column)
        if col is not None:
            base = torch.tensor([float("nan") if v is None else float(v) for v in col], dtype=torch.float64)
        else:
            warn_fallback("aapo_momentum", f"the reference-model reward column '{aapo_ref_column}'",
                          "a per-prompt EMA of past group means as r_ref")
            base = torch.tensor([self.ema.get(u, float("nan")) for u in uids], dtype=torch.float64)
        margin = torch.nan_to_num(rewards.double() - base, nan=0.0).clamp(-aapo_clip_low, aapo_clip_high)
        out = adv + aapo_eta * margin
        updates: dict[int, list[float]] = {}
        for i, u in enumerate(uids):
            if not math.isnan(float(mean[i])):
                updates.setdefault(u, []).append(float(mean[i]))
        for u, means in updates.items():  # one update per prompt per step (its groups' mean)
            m_now = sum(means) / len(means)
            self.ema[u] = m_now if u not in self.ema else self.mu * self.ema[u] + (1 - self.mu) * m_now
        return out.to(rewards.dtype)

    def state_dict(self) -> dict:
        return {"ema": {int(k): float(v) for k, v in self.ema.items()}}

    def load_state_dict(self, state: dict) -> None:
        self.ema = {int(k): float(v) for k, v in state["ema"].items()}


# --------------------------------------------------------------------- AWPO


@ADVANTAGES.register("awpo_gated")
def awpo_gated(reward_matrix: torch.Tensor, group_ids: torch.Tensor, batch, *, advantage_epsilon: float = 1e-4,
               awpo_outcome_reward: str = param('0', 'AWPO: outcome reward column (name or index)'),
               awpo_reasoning_reward: str = param('-1', 'AWPO: reasoning reward column (name or index)'),
               awpo_lambda: float = param(0.5, 'AWPO: weight of the gated reasoning advantage'),
               awpo_var_cap: float = param(0.25, 'AWPO: outcome variance at which the gate closes (0.25 = Bernoulli '
                                           'max)')) -> torch.Tensor:
    """AWPO variance-gated, difficulty-weighted reasoning advantage (Lin et al., 2025, arXiv:2512.19126, seed 000-118).

    With outcome reward ``o`` and reasoning reward ``z`` (two columns of the
    reward matrix) and per-group statistics::

        A_i = zscore_g(o)_i + lambda * gate_g * diff_g * zscore_g(z)_i
        gate_g = clip(1 - var_g(o) / var_cap, 0, 1)     (variance-aware gating)
        diff_g = clip(1 - mean_g(o), 0, 1)               (difficulty weighting)

    The reasoning signal is let through where the outcome gives little signal
    (low outcome variance, e.g. all-fail groups) and weighted up on hard
    prompts; where outcomes already separate the completions it is gated off,
    so it cannot conflict with the primary objective.

    Choices: the abstract names "variance-aware gating and difficulty-aware
    weighting ... based on group-relative statistics"; the linear gate, the
    ``1 - mean`` difficulty and ``var_cap = 0.25`` (Bernoulli maximum) are our
    reading. The published equations were NOT found: searched the stored text
    of arXiv:2512.19126 (html v2/v3: abstract and introduction only), the
    emergentmind.com AWPO topic page (describes a "hyper-advantage" without
    its formula) and GitHub code (no authors' repository found). Columns are
    chosen by reward name
    or index (``awpo_outcome_reward``/``awpo_reasoning_reward``); naming the
    same column twice is allowed (the reasoning term then re-weights the
    outcome advantage). ``var`` is the Bessel-corrected group variance from
    :func:`group_stats`. The paper's tailored clipping is a loss feature, not
    part of this component.

    Provenance: reconstructed from the abstract — the linear variance gate clip(1 - var/var_cap), the 1 - mean
    difficulty factor and var_cap = 0.25 are grpolab's reading of "variance-aware gating and difficulty-aware
    weighting"; the published equations and code were not found.
    """
    names = _reward_names(batch, reward_matrix)
    o = reward_column(reward_matrix, names, awpo_outcome_reward)
    z = reward_column(reward_matrix, names, awpo_reasoning_reward)
    a_o = group_zscore(o, group_ids, advantage_epsilon=advantage_epsilon)
    a_z = group_zscore(z, group_ids, advantage_epsilon=advantage_epsilon)
    mean_o, std_o, _ = group_stats(o, group_ids)
    gate = torch.nan_to_num(1.0 - std_o ** 2 / awpo_var_cap, nan=0.0).clamp(0.0, 1.0)
    diff = torch.nan_to_num(1.0 - mean_o, nan=0.0).clamp(0.0, 1.0)
    return a_o + awpo_lambda * gate * diff * a_z


# ------------------------------------------------------------------- DaGRPO


@ADVANTAGES.register("dagrpo_distinct_pairs")
def dagrpo_distinct_pairs(rewards: torch.Tensor, group_ids: torch.Tensor, *,
                          advantage_epsilon: float = 1e-4,
                          dagrpo_delta: float = param(0.1, 'DaGRPO: pairs with |r_i - r_j| < delta are masked')) -> torch.Tensor:
    """DaGRPO distinctiveness masking of low-contrast pairs (Xie et al., 2025, arXiv:2512.06337, seed 000-17).

    GRPO's centred reward is an average of pairwise differences,
    ``r_i - mean_g r = (1/n) sum_j (r_i - r_j)``. DaGRPO's sequence-level gradient
    rectification masks pairs whose scores are too close to be distinguished::

        A_i = (1/n) sum_{j in g} 1[|r_i - r_j| >= delta] (r_i - r_j) / (std_g r + epsilon)

    ``delta = 0`` gives GRPO's ``group_zscore`` exactly; a group whose rewards
    all lie within ``delta`` of each other gets A = 0 (no conflicting updates
    from homogeneous groups).

    Choices: the pairwise decomposition with a hard threshold ``delta`` on the
    fine-grained score is our reading of "mask sample pairs with low
    distinctiveness"; we keep GRPO's ``1/n`` and std normalisation. The
    published rule was NOT found: searched the stored text of arXiv:2512.06337
    (html v1: abstract and introduction only), sciencestack/arxivlens summaries
    and GitHub code (no authors' repository found).
    Off-policy anchor augmentation is a rollout feature, not part of this
    component. Unscorable rows get A = 0 and take part in no pair.

    Provenance: reconstructed from the abstract — the pairwise decomposition of the centred reward with a hard
    threshold delta, GRPO's 1/n and std normalisation; the published rule and code were not found.
    """
    _, std, count = group_stats(rewards, group_ids)
    scored = ~torch.isnan(rewards)
    r = torch.nan_to_num(rewards.double(), nan=0.0)
    diff = r[:, None] - r[None, :]
    pair = (group_ids[:, None] == group_ids[None, :]) & scored[:, None] & scored[None, :]
    keep = pair & (diff.abs() >= dagrpo_delta)
    num = (diff * keep).sum(1) / count.double().clamp(min=1)
    adv = num / (std.double() + advantage_epsilon)
    return torch.nan_to_num(adv * scored, nan=0.0).to(rewards.dtype)


# ---------------------------------------------------------- span-decoupled


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
    raise ValueError(f"span_mark: '{span_mark}' is not valid; valid values: batch, first_token")


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


@ADVANTAGES.register("span_decoupled_advantage")
def span_decoupled_advantage(rewards: torch.Tensor, group_ids: torch.Tensor, reward_matrix: torch.Tensor,
                             completion_mask: torch.Tensor, batch, *, advantage_epsilon: float = 1e-4,
                             span_mark: str = SPAN_MARK,
                             span_reward_columns: list = param([''], 'DTPO: reward column (name or index) per span '
                                                               "id; '' = combined reward")) -> torch.Tensor:
    """Separate advantages per token span (DTPO in AdaptVision, 2025, seed 004-05).

    ``A_it = zscore_g(R_s)_i`` for token t in span ``s = span_id[i, t]``, where
    ``R_s`` is the reward column ``span_reward_columns[s]`` (name or index;
    ``''`` or ids past the list = the combined reward). DTPO decouples tool
    learning from answer accuracy: tool-call tokens learn from the tool reward,
    answer tokens from the accuracy reward, each with its own group
    normalisation. Output ``[R, T]``.

    Spans are marked by the rollout in ``batch.span_ids`` (e.g. 1 = tool-call
    turn, 2 = answer; a multi-turn tool environment writes them), or with
    ``span_mark: first_token``. Unmarked tokens (id 0) use column 0 of the
    list. Choices: the generic text-LLM mechanism; the crop tool and visual
    tokens of the paper are domain-specific and not part of this component.

    Provenance: reconstructed from the abstract — per-span reward columns, each group-normalised, for the
    generic text-LLM case; the paper's crop tool and visual tokens are not included.
    """
    ids = span_ids_of(batch, completion_mask, span_mark)
    names = _reward_names(batch, reward_matrix)
    cols = list(span_reward_columns)
    out = torch.zeros(ids.shape, dtype=rewards.dtype)
    alive = completion_mask > 0
    for s in torch.unique(ids[alive]).tolist():
        spec = str(cols[s]).strip() if s < len(cols) else ""
        r = rewards if spec == "" else reward_column(reward_matrix, names, spec)
        adv = group_zscore(r, group_ids, advantage_epsilon=advantage_epsilon)
        in_s = alive & (ids == s)
        out = torch.where(in_s, adv[:, None].to(out.dtype).expand_as(out), out)
    return out
