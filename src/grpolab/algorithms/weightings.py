"""Advantage weightings (``WEIGHTINGS``): ``advantages -> advantages``, applied after the estimator.

Signature: ``fn(advantages, **inputs, *, params) -> Tensor`` with ``[R]`` or
``[R, T]`` advantages; inputs are resolved by name (see ``components.py``).
Listed in the config as ``advantage_weightings: [name, ...]``, applied in order.

Every built-in weighting is here (tests/test_architecture.py keeps it so): difficulty weights (DGPO, GRPO-LEAD,
HA-DW, DGRPO, RED-Weight), uncertainty and entropy weights (SEED-GRPO, EDGE-GRPO, entropy-guided exploration
for function calling), token weights (lambda-GRPO, TW-GRPO, LC-R1's compress bonus) and per-span scales
(DeGRPO). NaN rewards are unscorable rows (left out of every statistic); groups may be ragged.
"""
from __future__ import annotations

import math

import torch

from ..batch import SAMPLED
from ..data import completion_text
from ..errors import ConfigError, warn_fallback
from ..registry import WEIGHTINGS, param
from .advantages import group_stats
from .answer_keys import resolve_answer_key
from .groups import group_index, masked_row_mean, zero_variance_rows
from .losses import per_token
from .spans import SPAN_MARK, span_ids_of

# --------------------------------------------------------------------------- helpers


def _scale_rows(advantages: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """Multiply ``[R]`` or ``[R, T]`` advantages by a per-row weight ``[R]``."""
    weight = weight.to(advantages.dtype)
    return advantages * (weight[:, None] if advantages.dim() == 2 else weight)


def _accuracy(rewards: torch.Tensor, reward_matrix: torch.Tensor | None, column: int) -> torch.Tensor:
    """The reward used as per-row accuracy: column ``column`` of the reward matrix, or the combined reward (-1)."""
    if column < 0 or reward_matrix is None:
        return rewards
    if column >= reward_matrix.shape[1]:
        raise ValueError(f"accuracy reward column {column} does not exist ({reward_matrix.shape[1]} reward "
                         f"functions)")
    return reward_matrix[:, column]


# --------------------------------------------------------------------------- difficulty (DGPO, GRPO-LEAD, HA-DW, DGRPO, RED)


@WEIGHTINGS.register("dgpo_question_weight")
def dgpo_question_weight(advantages: torch.Tensor, rewards: torch.Tensor, group_ids: torch.Tensor,
                         reward_matrix: torch.Tensor | None = None, *,
                         dgpo_temperature: float = param(2.0, 'DGPO question weights: softmax temperature T over '
                                                         '-accuracy'),
                         dgpo_accuracy_reward: int = param(0, 'DGPO question weights: reward column used as accuracy '
                                                           '(-1 = combined reward)')) -> torch.Tensor:
    """DGPO difficulty-aware question-level weighting, DQW (MathForge, arXiv:2601.20614; seed 000-05).

    Over the ``M`` groups (questions) whose combined reward is not constant:

    ``w_q = M * softmax_q(-acc_q / T)``,   ``A'_i = w_{q(i)} A_i``

    ``acc_q`` is the group mean of the accuracy reward (column
    ``dgpo_accuracy_reward``, -1 = combined reward); a question whose accuracy
    is 0 gets ``acc_q = 1`` (lowest weight), as in the authors' code, since an
    all-wrong group only varies through auxiliary rewards. The weights average
    to 1 over those questions, so harder questions (lower accuracy) get more
    than 1 and easier ones less. Other groups keep weight 1 (their advantages
    are 0). ``T = 2`` in the authors' scripts.

    Provenance: authors' code — https://github.com/AMAP-ML/MathForge, trl-0.20.0/trl/trainer/grpo_trainer.py
    (DQW: M softmax(-acc / T) over the non-zero-variance questions, accuracy 0 read as 1); T = 2 from the
    authors' scripts.
    Test: tests/test_advantage_baselines.py::test_dgpo_question_weight_hand_computed,
    tests/test_advantage_baselines.py::test_dgpo_question_weight_all_wrong_group_gets_lowest_weight.
    """
    acc = _accuracy(rewards, reward_matrix, dgpo_accuracy_reward)
    acc_q, _, _ = group_stats(acc, group_ids)
    valid = ~zero_variance_rows(rewards, group_ids)
    uniq, inv = torch.unique(group_ids, return_inverse=True)
    first = torch.full((len(uniq),), len(inv), dtype=torch.long).scatter_reduce_(
        0, inv, torch.arange(len(inv)), reduce="amin")  # first row of each group
    gacc = torch.nan_to_num(acc_q[first].double(), nan=0.0)
    gacc = torch.where(torch.isclose(gacc, torch.zeros_like(gacc)), torch.ones_like(gacc), gacc)
    gvalid = valid[first]
    weights = torch.ones(len(uniq), dtype=torch.float64)
    if gvalid.any():
        m = int(gvalid.sum())
        weights[gvalid] = m * torch.softmax(-gacc[gvalid] / dgpo_temperature, dim=0)
    return _scale_rows(advantages, weights[inv])


def lead_logistic(x: torch.Tensor, low: float, high: float, midpoint: float, steepness: float) -> torch.Tensor:
    """GRPO-LEAD's logistic weight ``w(x) = A + (B - A) / (1 + exp(k (x - x0)))``, decreasing in ``x``."""
    return low + (high - low) / (1.0 + torch.exp(steepness * (x - midpoint)))


@WEIGHTINGS.register("lead_difficulty_weight")
def lead_difficulty_weight(advantages: torch.Tensor, rewards: torch.Tensor, group_ids: torch.Tensor, *,
                           lead_weight_min: float = param(0.4, 'GRPO-LEAD: lower asymptote A of the logistic weight'),
                           lead_weight_max: float = param(1.5, 'GRPO-LEAD: upper asymptote B of the logistic weight'),
                           lead_midpoint: float = param(0.75, 'GRPO-LEAD: correct-ratio midpoint rho_0 of the '
                                                        'logistic weight'),
                           lead_steepness: float = param(10.0, 'GRPO-LEAD: steepness k of the logistic weight'),
                           lead_correct_threshold: float = param(0.0, 'GRPO-LEAD: a reward above this (strict >) '
                                                                 "counts as correct; the authors' reward > 0, so it "
                                                                 'overrides the shared success_threshold for '
                                                                 'GRPO-LEAD')) -> torch.Tensor:
    """GRPO-LEAD difficulty-aware advantage reweighting (Zhang & Zuo, 2025, arXiv:2504.09696; seed 000-03).

    ``rho_q`` = share of the group's scored rows with reward ``> lead_correct_threshold``;

    ``A'_i = A_i w(rho_q)``       if ``A_i > 0``
    ``A'_i = A_i w(1 - rho_q)``   otherwise,

    with ``w(x) = A + (B - A) / (1 + exp(k (x - rho_0)))``, ``A = 0.4``,
    ``B = 1.5``, ``rho_0 = 0.75``, ``k = 10`` (authors' code,
    aeroplanepaper/GRPO-LEAD ``logistic_reweight``). Correct answers on hard
    questions (low ``rho``) and wrong answers on easy questions (high ``rho``)
    are amplified. Only the advantage reweighting of GRPO-LEAD lives here; its
    length-dependent accuracy reward and wrong-answer penalty are reward
    transforms. "Correct" is ``reward > 0`` as in the authors' code (their
    wrong answers score -1 or 0), hence GRPO-LEAD's own
    ``lead_correct_threshold`` = 0 with a strict ``>``, not the shared
    ``success_threshold`` (``>= 1.0``).

    Provenance: authors' code — https://github.com/aeroplanepaper/GRPO-LEAD, verl/verl/trainer/ppo/core_algos.py
    (logistic_reweight, A = 0.4, B = 1.5, x0 = 0.75, k = 10); "correct" is reward > 0 as there.
    Test: tests/test_advantage_baselines.py::test_lead_difficulty_weight_hand_computed.
    """
    correct = torch.where(torch.isnan(rewards), rewards, (rewards > lead_correct_threshold).to(rewards.dtype))
    rho, _, _ = group_stats(correct, group_ids)
    rho = torch.nan_to_num(rho, nan=0.0)
    w_pos = lead_logistic(rho, lead_weight_min, lead_weight_max, lead_midpoint, lead_steepness)
    w_neg = lead_logistic(1.0 - rho, lead_weight_min, lead_weight_max, lead_midpoint, lead_steepness)
    if advantages.dim() == 2:
        w_pos, w_neg = w_pos[:, None], w_neg[:, None]
    return advantages * torch.where(advantages > 0, w_pos, w_neg).to(advantages.dtype)


@WEIGHTINGS.register("hadw")
class HistoryAwareDifficultyWeight:
    """HA-DW history-aware adaptive difficulty weighting (Yang et al., 2026, arXiv:2601.08521; seed 000-120).

    Stateful: a difficulty anchor ``C`` (the model's running solve rate)
    evolves across batches. For a batch at step t, with ``C^-`` the anchor
    before the batch, ``p_q`` the group mean accuracy and ``A_i`` the
    advantage:

    ``diff_q = p_q - C^-``,  ``M_q = |diff_q|``,  ``D_i = -sgn(A_i) sgn(diff_q)``
    ``A'_i = A_i * lambda * exp(D_i M_q)``

    so for a prompt harder than the anchor (``p_q < C``) positive advantages
    are amplified and negative ones damped, and the reverse for easier
    prompts: this counters the estimator's bias (under-estimating hard
    prompts, over-estimating easy ones). After weighting, the anchor takes a
    Kalman-style step towards the batch accuracy ``y_t`` (mean accuracy of the
    scored rows):

    ``C^+ = (1 - eta_t) C^- + eta_t y_t``,   ``eta_t = clip(eta * sigma_t, 0, 1)``

    Source checked: the formulas above match the paper's description as
    restated in TRL PR https://github.com/huggingface/trl/pull/4863 (and its
    re-submission #4872; both closed, not merged): ``C^+ = (1 - eta_t) C^- +
    eta_t y_t`` with ``eta_t = eta * sigma_t``, ``Phi = lambda_scale *
    exp(D M)``, ``D = -sgn(A) sgn(diff^his)``, ``M = |p_hat - C^-|``. The
    paper's own code was not found in the searched index, and the stored text
    of arXiv:2601.08521 gives only the abstract and introduction, so these
    remain open and are grpolab's choices: ``eta_t`` is clipped to [0, 1]; ``sigma_t`` is the population std of the last
    ``hadw_window`` batch accuracies (including this one), and ``eta_t = 1`` at
    the very first batch, so the anchor starts at the first observed accuracy
    instead of the arbitrary ``hadw_init_anchor`` (which only weights that
    first batch). Accuracy is the combined reward (``hadw_accuracy_reward =
    -1``) or one reward column, assumed to lie in [0, 1].

    Provenance: paper equations — HA-DW (Yang et al., 2026, arXiv:2601.08521), the anchor update and the weight
    lambda exp(D M) as restated in TRL PR 4863 (equation numbers not recorded); the clip of eta_t, the sigma
    window and the first-batch anchor are grpolab's choices.
    """

    def __init__(self, *,
                 hadw_eta: float = param(1.0, 'HA-DW: anchor step size eta; eta_t = eta * sigma_t (clipped to [0, 1])'),
                 hadw_lambda_scale: float = param(1.0, 'HA-DW: scale lambda of the weight lambda * exp(D * M)'),
                 hadw_window: int = param(8, 'HA-DW: number of recent batch accuracies whose std is sigma_t'),
                 hadw_init_anchor: float = param(0.5, 'HA-DW: difficulty anchor C_0 before the first batch'),
                 hadw_accuracy_reward: int = param(-1, 'HA-DW: reward column used as accuracy (-1 = combined reward)')):
        self.eta = float(hadw_eta)
        self.lambda_scale = float(hadw_lambda_scale)
        self.window = int(hadw_window)
        self.accuracy_reward = int(hadw_accuracy_reward)
        self.anchor = float(hadw_init_anchor)
        self.history: list[float] = []
        self.updates = 0

    def weights(self, advantages: torch.Tensor, accuracy: torch.Tensor, group_ids: torch.Tensor) -> torch.Tensor:
        p, _, _ = group_stats(accuracy, group_ids)
        diff = torch.nan_to_num(p - self.anchor, nan=0.0).to(advantages.dtype)
        if advantages.dim() == 2:
            diff = diff[:, None]
        d = -torch.sign(advantages) * torch.sign(diff)
        return self.lambda_scale * torch.exp(d * diff.abs())

    def update(self, accuracy: torch.Tensor) -> None:
        ok = ~torch.isnan(accuracy)
        if not ok.any():
            return
        y = float(accuracy[ok].mean())
        self.history = (self.history + [y])[-self.window:]
        if self.updates == 0:
            eta_t = 1.0
        else:
            h = torch.tensor(self.history, dtype=torch.float64)
            eta_t = min(max(self.eta * float(h.std(unbiased=False)), 0.0), 1.0)
        self.anchor = (1.0 - eta_t) * self.anchor + eta_t * y
        self.updates += 1

    def __call__(self, advantages: torch.Tensor, rewards: torch.Tensor, group_ids: torch.Tensor,
                 reward_matrix: torch.Tensor | None = None) -> torch.Tensor:
        accuracy = _accuracy(rewards, reward_matrix, self.accuracy_reward)
        ok = accuracy[~torch.isnan(accuracy)]
        if ok.numel() and (float(ok.min()) < 0.0 or float(ok.max()) > 1.0):
            which = "the combined reward" if self.accuracy_reward < 0 else f"reward column {self.accuracy_reward}"
            raise ValueError(f"hadw: the accuracy ({which}) must lie in [0, 1] (the anchor is a solve rate), got "
                             f"values in [{float(ok.min()):g}, {float(ok.max()):g}]; set hadw_accuracy_reward to "
                             f"the task's accuracy column (0 on arithmetic / countdown)")
        out = advantages * self.weights(advantages, accuracy, group_ids)
        self.update(accuracy)
        return out

    def state_dict(self) -> dict:
        return {"anchor": self.anchor, "history": list(self.history), "updates": self.updates}

    def load_state_dict(self, state: dict) -> None:
        self.anchor = float(state["anchor"])
        self.history = [float(v) for v in state["history"]]
        self.updates = int(state["updates"])


@WEIGHTINGS.register("dgrpo_difficulty_weight")
def dgrpo_difficulty_weight(advantages: torch.Tensor, rewards: torch.Tensor, group_ids: torch.Tensor, batch=None, *,
                            dgrpo_task_column: str = param('task', "DGRPO: data column naming each row's task "
                                                           '(missing: one task, reported as a FallbackWarning)'),
                            dgrpo_task_power: float = param(1.0, 'DGRPO: exponent a of the task weight (d_task / '
                                                            'mean d_task)^a'),
                            dgrpo_sample_power: float = param(1.0, 'DGRPO: exponent b of the prompt weight (d_q / '
                                                              'mean d_q)^b'),
                            dgrpo_floor: float = param(0.05, 'DGRPO: lower bound on a difficulty 1 - mean reward')) -> torch.Tensor:
    """VITAL's DGRPO difficulty-aware multi-task weighting (Zhang et al., 2025, arXiv:2508.04416; seed 000-02).

    DGRPO scales the learning signal by a task-level and a sample-level
    difficulty weight so that easy tasks (e.g. video QA) do not dominate hard
    ones (temporal grounding) in multi-task RL. The paper's exact weighting
    rule could not be recovered, so grpolab uses this generic text-LLM form,
    with rewards assumed in [0, 1]. Searched: the stored text of
    arXiv:2508.04416 (html v2: abstract and introduction only; a third-party
    summary says DGRPO "scales rewards based on task and sample difficulty"
    without the formula), the alphaxiv overview, and GitHub
    (zhang9302002/ThinkingWithVideos holds only a README in the searched index;
    its training code, cited by deepwiki.com, was not available):

    ``d_k = max(1 - mean_{i in task k} r_i, floor)``   (task difficulty over the batch)
    ``d_q = max(1 - mean_{i in group q} r_i, floor)``  (prompt difficulty)
    ``A'_i = A_i (d_k / mean_tasks d)^a (d_q / mean_{q' in task k} d_q')^b``

    Both factors average to about 1, so the overall step size stays put while
    harder tasks and harder prompts within a task get more weight. A row's
    task is the data column ``dgrpo_task_column`` (e.g. ``task``); without
    that column every row is one task and only the prompt factor acts.
    ``a = b = 0`` gives GRPO.

    Provenance: reconstructed from the abstract — task and prompt difficulty 1 - mean reward, floored, each
    normalised to mean 1 and raised to a and b; the paper's rule and code were not found.
    """
    n = rewards.shape[0]
    col = None if batch is None else getattr(batch, "columns", {}).get(dgrpo_task_column)
    if col is None and dgrpo_task_power != 0:
        warn_fallback("dgrpo_difficulty_weight", f"the task column '{dgrpo_task_column}' (dgrpo_task_column)",
                      "one task for every row (only the prompt factor acts)")
    names = [str(v) for v in col] if col is not None else ["" for _ in range(n)]
    task_index = {name: i for i, name in enumerate(dict.fromkeys(names))}
    task_ids = torch.tensor([task_index[v] for v in names], dtype=torch.long)

    def difficulty(ids: torch.Tensor) -> torch.Tensor:
        mean, _, _ = group_stats(rewards, ids)
        return torch.nan_to_num(1.0 - mean, nan=1.0).clamp(min=dgrpo_floor).double()

    d_task = difficulty(task_ids)
    d_q = difficulty(group_ids)
    # mean over tasks (each task counted once) and over the prompts of each task (each prompt once)
    first_task = {int(t): i for i, t in reversed(list(enumerate(task_ids.tolist())))}
    task_mean = sum(float(d_task[i]) for i in first_task.values()) / len(first_task)
    w_task = (d_task / task_mean) ** dgrpo_task_power
    w_q = torch.ones(n, dtype=torch.float64)
    for t in first_task:
        rows = torch.nonzero(task_ids == t).flatten()
        firsts = {int(group_ids[i]): int(i) for i in reversed(rows.tolist())}
        mean_q = sum(float(d_q[i]) for i in firsts.values()) / len(firsts)
        w_q[rows] = (d_q[rows] / mean_q) ** dgrpo_sample_power
    return _scale_rows(advantages, w_task * w_q)


@WEIGHTINGS.register("advantage_exp_weight")
def advantage_exp_weight(advantages: torch.Tensor, *,
                         red_temperature: float = param(1.0, 'RED-Weight: temperature tau of the weight exp(A / tau)')) -> torch.Tensor:
    """RED-Weight advantage weighting (Yao et al., 2025, arXiv:2509.24203; seed 000-39).

    ``A'_i = A_i exp(A_i / tau)``   (unnormalised, ``weight: advantage`` in the authors' Trinity-RFT code)

    Off-policy group-relative REINFORCE interpreted as data shaping: samples
    with high advantage are up-weighted and low-advantage samples are
    down-weighted, which the paper justifies as moving the effective data
    distribution towards better responses. ``tau = 1`` in their configs.

    Provenance: authors' code — https://github.com/agentscope-ai/Trinity-RFT,
    trinity/algorithm/policy_loss_fn/rec_policy_loss.py (RECPolicyLossFn, weight "advantage":
    A exp(A / temp), then -A' log pi with clip_mode "none"); temp = 1 as there (recipe red_weight pairs it
    with policy_gradient).
    Test: tests/test_advantage_baselines.py::test_red_weight_hand_computed.
    """
    if red_temperature <= 0 or not math.isfinite(red_temperature):
        raise ValueError(f"red_temperature: must be a positive number, got {red_temperature}")
    return advantages * torch.exp(advantages / red_temperature)


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


@WEIGHTINGS.register("seed_semantic_entropy", needs=("text",))
def seed_semantic_entropy(advantages: torch.Tensor, group_ids: torch.Tensor, batch, *,
                          seed_alpha: float = param(0.5, 'SEED-GRPO: sensitivity alpha; A * f(alpha * SE / SE_max)'),
                          seed_scaling: str = param('linear', 'SEED-GRPO: f(x) = 1 - x (linear), exp(-x) '
                                                    '(exponential) or (1 - x)^gamma (focal)',
                                                    ['linear', 'exponential', 'focal']),
                          seed_focal_gamma: float = param(2.0, 'SEED-GRPO: focusing exponent gamma of the focal f(x) '
                                                          '= (1 - x)^gamma (gamma = 1 is the linear f)'),
                          seed_equivalence: str = param('last_number', 'SEED-GRPO: answer key that clusters '
                                                        "completions: 'last_number', 'final_line', 'exact' or "
                                                        "'module:function' (text -> key)"),
                          seed_cluster_probability: str = param(
                              'mass', "SEED-GRPO: p(C_k) = the cluster's share of the sampled completions' "
                              "probability pi_old(o|q) ('mass', the paper's), the same with per-token "
                              "(length-normalised) probabilities ('token_mass'), or its frequency |C_k|/G "
                              "('frequency')", ['mass', 'token_mass', 'frequency'])) -> torch.Tensor:
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
    if seed_cluster_probability == "frequency":
        loglik = None
    elif seed_cluster_probability in ("mass", "token_mass"):
        loglik = sequence_loglik(batch, length_normalize=seed_cluster_probability == "token_mass")
    else:
        raise ValueError(f"seed_cluster_probability: '{seed_cluster_probability}' is not valid; valid values: "
                         "mass, token_mass, frequency")
    se, se_max = semantic_entropy(keys, group_ids, loglik)
    x = seed_alpha * torch.where(se_max > 0, (se / se_max.clamp(min=1e-12)).clamp(max=1.0), torch.zeros_like(se))
    if seed_scaling == "linear":
        f = 1.0 - x
    elif seed_scaling == "exponential":
        f = torch.exp(-x)
    elif seed_scaling == "focal":
        if seed_focal_gamma < 0:
            raise ValueError(f"seed_focal_gamma: must be >= 0, got {seed_focal_gamma}")
        f = (1.0 - x).clamp(min=0.0) ** seed_focal_gamma
    else:
        raise ValueError(f"seed_scaling: '{seed_scaling}' is not valid; valid values: linear, exponential, focal")
    f = f.to(advantages.dtype)
    return advantages * (f if advantages.dim() == 1 else f[:, None])


# --------------------------------------------------------------------------- EDGE-GRPO


@WEIGHTINGS.register("edge_entropy_driven", needs=("tokens",))
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


# --------------------------------------------------------------------------- lambda-GRPO


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


@WEIGHTINGS.register("lambda_prefix_weight", needs=("tokens",))
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

    Provenance: authors' code — https://github.com/coli-saar/grpo-prm,
    lambda_grpo/utils.py (InfPRMTree.loss_scales: a prefix tree over the
    group's trajectories, every token of a node scaled by 1 / the number of
    trajectories through it, identical trajectories sharing one leaf) and
    lambda_grpo/trainer.py (LambdaGRPOTrainer._step: the clipped surrogate
    times the scale, summed per sequence over its token count, mean over
    sequences = ``seq_mean_token_mean``; defaults in train_utils.py: group 6,
    beta 0, loss_type grpo, scaling on). ``lambda = 1`` is the authors'
    method and ``lambda = 0`` their ``--no_loss_scale``; other exponents are
    grpolab's interpolation. Known difference: with ``beta > 0`` the authors
    also scale the KL term per token; here the weight scales the advantage
    only (the recipe, like the authors' default, has beta 0).
    Test: tests/test_advantage_shaping.py::test_lambda_prefix_weight,
    tests/test_advantage_shaping.py::test_lambda_grpo_loss_matches_the_authors_trainer.
    """
    k = shared_prefix_counts(batch.completion_ids, completion_mask, group_ids).to(torch.float64)
    w = torch.where(k > 0, k.clamp(min=1) ** (-lambda_grpo_power), torch.zeros_like(k)).to(advantages.dtype)
    return per_token(advantages, w) * w


# --------------------------------------------------------------------------- TW-GRPO


@WEIGHTINGS.register("tw_token_weight", needs=("tokens",))
def tw_token_weight(advantages: torch.Tensor, group_ids: torch.Tensor, batch, token_group_divergence: torch.Tensor,
                    *, tw_alpha: float = param(1.7, 'TW-GRPO: maximum token weight; weights min-max map the group '
                                               "divergence to [1, alpha] (>= 1; 1 = GRPO; authors' script uses "
                                               '1.7)')) -> torch.Tensor:
    """TW-GRPO token weights from intra-group divergence (Dang et al., 2025, arXiv:2505.24718, seed 000-95).

    Per group g (its ``G`` rows) and completion position ``t < T_g`` (``T_g`` =
    the group's longest completion), with ``lp_i,t`` row i's full next-token
    log-probability vector (a row that has ended before t takes the uniform
    distribution ``-log V``) and ``m_t = mean_i lp_i,t`` (mean in log space)::

        D_i,t = sum_v k3(m_t,v - lp_i,t,v),   k3(d) = exp(d) - d - 1,  d clamped to [-11, 11]
        s_t   = mean_i D_i,t                                            (all G rows)
        n_t   = (s_t - min_t' s_t') / (max_t' s_t' - min_t' s_t' + 1e-8)  (over t' < T_g)
        w_t   = 1 + (alpha - 1) * n_t                                     (in [1, alpha])

    and every row's advantage at t is multiplied by ``w_t``. Positions where
    the group's next-token distributions agree get weight 1 — whatever tokens
    were sampled there — and the most divergent position gets ``alpha``.
    ``D`` is the input ``token_group_divergence`` ``[R, T]``, which the trainer
    computes from the policy's full distributions when a selected component
    asks for it (:func:`grpolab.model.logprobs.group_token_divergence`: a
    no-grad forward of the batch at the start of the step, reduced to ``D``
    position-chunk by position-chunk, never a stored ``[R, T, V]``).
    ``tw_alpha`` must be >= 1; 1 gives GRPO. Output ``[R, T]``.

    Provenance: authors' code — https://github.com/longmalongma/TW-GRPO, src/open_r1/trainer/grpo_trainer.py
    (compute_token_importance_kl_logs_uniform); matches the weights of
    ``loss_type tw_grpo`` (scripts/tw-grpo.sh: alpha 1.70, beta 0): full
    distributions of the current policy (their ``per_logps`` of the training
    forward, one update per generation batch), uniform padding of ended rows,
    mean over all G rows, min-max over the group's positions (their ``T`` is
    the padded width of a one-prompt device batch: the group's longest
    completion, as here). Known differences: their weights multiply the whole
    per-token loss (KL included; beta = 0 in their script, where the two
    coincide) and keep the gradient of ``per_logps`` (not detached), so their
    gradient has an extra term ``-(1/N) sum_t (sum_{i alive at t} A_i) grad w_t``,
    zero at positions where all rows of the group are alive (z-scored A sums to
    0); grpolab's weights are constants (no_grad) computed once per step, so
    with ``num_iterations > 1`` later passes keep the first pass's weights
    (their trainer has one pass). The soft multi-choice reward and Q/A
    inversion are task-side, not here.
    Test: tests/test_advantage_shaping.py::test_tw_token_weight_issue_example,
    tests/test_advantage_shaping.py::test_tw_token_weight_uniform_padding_ragged_groups.
    """
    if tw_alpha < 1.0:
        raise ValueError(f"tw_alpha: the maximum token weight must be >= 1, got {tw_alpha}")
    inv, n_groups = group_index(group_ids)
    alive = batch.completion_attention_mask > 0
    D = token_group_divergence.to(torch.float64)
    w = torch.ones_like(D)
    for g in range(n_groups):
        rows = (inv == g).nonzero().squeeze(-1)
        Tg = int(alive[rows].sum(-1).max())
        if Tg == 0:
            continue
        s = D[rows, :Tg].mean(0)
        norm = (s - s.min()) / (s.max() - s.min() + 1e-8)
        w[rows, :Tg] = (1.0 + (tw_alpha - 1.0) * norm)[None, :]
    w = w.to(advantages.dtype)
    return per_token(advantages, w) * w


# --------------------------------------------------------------------------- LC-R1


@WEIGHTINGS.register("lc_compress_bonus", needs=("text",))
def lc_compress_bonus(advantages: torch.Tensor, completion_mask: torch.Tensor, batch, *,
                      lc_compress_weight: float = param(1.0, "LC-R1: weight of the compress reward added to the "
                                                        "advantage at the end-of-thinking token (the authors' "
                                                        "add_adv, 1)")) -> torch.Tensor:
    """LC-R1 compress reward, a token-level advantage term (Cheng et al., 2025, arXiv:2506.14755; seed 000-100).

    ``A_i,t = A_i + w * c_i * [t = p_i]``: the row's compress reward
    ``c_i = 1 - |R'|/(|R| + 1e-4)`` (``-1`` when the answer is not in the
    reasoning; 0 for wrong rows) is added, unnormalised, to the advantage of
    the one token ``p_i`` where the reasoning ends (the end-of-thinking marker
    of the cropped sequence), after the group baseline. ``c`` and ``p`` are the
    columns ``lc_compress`` and ``lc_think_end`` written by the ``lc_r1``
    rollout strategy (an error names it when they are missing). Output ``[R, T]``.

    Provenance: authors' code — https://github.com/zxiangx/LC-R1, trl/trainer/grpo_trainer.py
    (_generate_and_score_completions); matches ``advantages = torch.where(inf_mask,
    advantages + self.add_adv * length_compress_ratio, advantages)`` with
    ``inf_mask`` the ``</think>`` position ``max_lengths`` of right rows, after
    the group mean is subtracted.
    Test: tests/test_lc_r1.py::test_lc_compress_bonus_is_added_at_one_token.
    """
    cols = batch.columns
    missing = [c for c in ("lc_compress", "lc_think_end") if c not in cols]
    if missing:
        raise ValueError(f"lc_compress_bonus needs the batch columns {missing}, written by rollout_strategy: lc_r1 "
                         f"(the valid-thinking crop); select it (recipe lc_r1)")
    adv = per_token(advantages, completion_mask).clone()
    T = adv.shape[1]
    for i, (c, p) in enumerate(zip(cols["lc_compress"], cols["lc_think_end"])):
        if c != 0 and 0 <= p < T:
            adv[i, p] = adv[i, p] + lc_compress_weight * c
    return adv


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


# --------------------------------------------------------------------------- advantage clipping (DDPO, Flow-GRPO)


@WEIGHTINGS.register("advantage_clip")
def advantage_clip(advantages: torch.Tensor, *,
                   adv_clip_max: float = param(5.0, 'advantage_clip: advantages are clamped to [-adv_clip_max, '
                                               "adv_clip_max] (DDPO's and Flow-GRPO's train.adv_clip_max, 5)")
                   ) -> torch.Tensor:
    """Advantage clipping of DDPO (Black et al., 2023, arXiv:2305.13301) and Flow-GRPO (Liu et al., 2025,
    arXiv:2505.05470).

    ``A'_i = clamp(A_i, -adv_clip_max, adv_clip_max)``, elementwise on ``[R]`` or ``[R, T]`` advantages;
    ``adv_clip_max = 5`` as in both codes. List it last in ``advantage_weightings``: both codes clamp the
    advantage right before the clipped-ratio loss.

    Provenance: authors' code — https://github.com/kvablack/ddpo-pytorch, scripts/train.py (the training loop:
    ``torch.clamp(sample["advantages"], -config.train.adv_clip_max, config.train.adv_clip_max)`` before the PPO
    loss; ``train.adv_clip_max = 5`` in config/base.py); the same clamp in
    https://github.com/yifan123/flow_grpo scripts/train_sd3.py (on ``sample["advantages"][:, j]``, the
    advantage repeated over the trained steps; ``train.adv_clip_max = 5`` in config/base.py).
    Test: tests/test_image_algorithms.py::test_advantage_clip_hand_computed.
    """
    if not adv_clip_max > 0:
        raise ValueError(f"adv_clip_max: must be > 0, got {adv_clip_max}")
    return advantages.clamp(-adv_clip_max, adv_clip_max)


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


# --------------------------------------------------------------------------- AVATAR: Temporal Advantage Shaping


def tas_weights(completion_mask: torch.Tensor, tas_lambda: float) -> torch.Tensor:
    """AVATAR's TAS weights ``[R, T]``: ``w_it = 1 + lambda * (2 t / max(L_i - 1, 1) - 1)^2``, ``t`` the column
    index (0-based), ``L_i = max(sum_t mask_it, 1)``; all ones when ``lambda <= 0`` (the authors' switch-off)."""
    R, T = completion_mask.shape
    if tas_lambda <= 0:
        return torch.ones(R, T, dtype=torch.float32, device=completion_mask.device)
    t = torch.arange(T, device=completion_mask.device, dtype=torch.float32)[None, :].expand(R, T)
    L = completion_mask.sum(-1).clamp(min=1).to(torch.float32)
    denom = (L - 1).clamp(min=1)[:, None]
    return 1.0 + float(tas_lambda) * (2.0 * t / denom - 1.0) ** 2


@WEIGHTINGS.register("avatar_tas", needs=("tokens",))
def avatar_tas(advantages: torch.Tensor, completion_mask: torch.Tensor, *,
               avatar_tas_lambda: float = param(0.3, "AVATAR TAS: amplitude lambda of the U-shaped token weight "
                                                "1 + lambda (2t/(L-1) - 1)^2 (the authors' tas_lambda 0.3; "
                                                "<= 0 = GRPO)")) -> torch.Tensor:
    """AVATAR Temporal Advantage Shaping, TAS (AVATAR, 2025, arXiv:2508.03100; seed 000-104).

    ``A'_it = A_i * w_it``,  ``w_it = 1 + lambda * (2 t / (L_i - 1) - 1)^2``

    with ``t`` the token's column in the completion (0-based) and ``L_i`` the row's loss-token count
    (:func:`tas_weights`): a U over the completion, ``1 + lambda`` at the first and last token and 1 in the
    middle, so early planning tokens and the final answer weigh more. Not normalised: the weights' mean over a
    row exceeds 1 (for ``L = 3``, ``lambda = 0.3``: 1.3, 1, 1.3). ``L = 1``: the denominator is clamped to 1,
    so the single token gets ``1 + lambda``. ``lambda <= 0`` gives weight 1 (GRPO). Output ``[R, T]``.

    The authors multiply the per-token *loss* (the clipped surrogate, before the KL term is added) by ``w``;
    for ``w > 0`` that equals multiplying the advantage inside the clipped surrogate, since
    ``-min(rho A w, clip(rho) A w) = w * -min(rho A, clip(rho) A)``, so a weighting gives the same loss with
    ``policy_loss: clipped_ratio`` and leaves the KL term unweighted, as theirs.

    Provenance: authors' code — https://github.com/yogkul2000/AVATAR,
    ms-swift/swift/rlhf_trainers/grpo_tas_trainer.py (GRPOTASTrainer._compute_tas_weights: positions are the
    column index over the padded width, ``L = mask.sum().clamp(min=1)``, denominator ``(L - 1).clamp(min=1)``,
    no normalisation; applied to every mini-batch, replayed ones included); lambda 0.3 from args_mixin.py and
    the Qwen2.5-Omni launcher. Known difference: a loss whose per-token term is not linear in the advantage
    (other than the clipped ratio) sees a weighted advantage rather than a weighted loss; the avatar_replay
    stage applies the same weights to the rows it replays.
    Test: tests/test_vision_tools_avatar.py::test_tas_weights_by_hand.
    """
    w = tas_weights(completion_mask, avatar_tas_lambda).to(advantages.dtype)
    return per_token(advantages, completion_mask) * w
