"""Difficulty weights: DGPO's question weights (MathForge's DQW), GRPO-LEAD's logistic reweighting, HA-DW's
history-aware difficulty anchor and VITAL's DGRPO task and prompt difficulty weights."""
from __future__ import annotations

import torch

from ...errors import warn_fallback
from ...registry import WEIGHTINGS, param
from ..advantages import group_stats
from ..groups import zero_variance_rows


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


# --------------------------------------------------------------------------- difficulty (DGPO, GRPO-LEAD, HA-DW, DGRPO)


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
                            dgrpo_floor: float = param(0.05, 'DGRPO: lower bound on a difficulty 1 - mean reward')
                            ) -> torch.Tensor:
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
