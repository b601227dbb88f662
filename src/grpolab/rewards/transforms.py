"""Reward transforms (``REWARD_TRANSFORMS``): the combined scalar reward per row -> a shaped reward.

Signature: ``fn(rewards [R], **inputs, *, params) -> [R]`` with inputs
``lengths`` (completion tokens), ``truncated``, ``group_ids``, ``prompt_uids``,
``reward_matrix``, ``reward_names``, ``batch`` (completion texts and data
columns in ``batch.columns``), ``step`` resolved by name; keyword-only parameters come from
config keys of the same name (declared in each transform's signature with ``param()``).
Listed as ``reward_transforms: [name, ...]`` and applied in order, before advantages
(and before dynamic sampling's filter). Unscorable rows (NaN) stay NaN.

Every built-in transform is here (tests/test_architecture.py keeps it so): overlong
shaping (DAPO), noise (ReDit, reward flips), length terms (GRPO-LEAD, LC-R1,
GCPO), partial credit (FGRPR, E-GRPO), rarity (unlikeliness), IDK (BAPO),
Bradley-Terry scoring (IRPO), paraphrase consistency, the Thinkless mode reward
and the agent transforms that need the group's episodes or the step (OTC, SEM,
GraphRAG-R1; the episode helpers are in ``agentic.py``).

"Correct" means: the reward column named ``shaping_correct_reward`` (default
``accuracy``, the built-in tasks' accuracy reward) is ``>= shaping_correct_threshold``.
This is not the shared core key ``success_threshold`` (a completion's combined
*scalar* reward ``>=`` it, which samplers and rollout strategies count): a
transform runs before the scalar reward exists (it makes it), so it tests one
reward column, 0 / 1 on the built-in tasks, at its own threshold 0.5.
Transforms that read the answer use the data column ``answer`` through
``batch.columns`` (tasks ``arithmetic`` and ``countdown`` have one).
"""
from __future__ import annotations

import math
import re
from fractions import Fraction

import torch

from ..data import completion_text
from ..errors import ConfigError, warn_fallback
from ..registry import REWARD_TRANSFORMS, param
from ..roles import TEAM_ANSWER_ROLE
from .agentic import ANSWER_COLUMN, count_tool_calls, data_column, episodes_of, final_text, token_f1, tool_names
from .answers import extract_answer

CORRECT_REWARD = param('accuracy', 'reward shaping: reward column whose value marks a correct row')
CORRECT_THRESHOLD = param(0.5, 'reward shaping: that column >= this value counts as correct (it tests one reward '
                               'column, before the transforms make the scalar reward, so the reward transforms use it '
                               'instead of the shared success_threshold)')

def correct_rows(reward_matrix: torch.Tensor, reward_names: list[str], column: str,
                 threshold: float) -> torch.Tensor:
    """Bool ``[R]``: the reward column ``column`` is scored and ``>= threshold``."""
    if column not in reward_names:
        raise ValueError(f"shaping_correct_reward: no reward column '{column}' (reward functions: "
                         f"{', '.join(reward_names) or 'none'})")
    v = reward_matrix[:, reward_names.index(column)]
    return torch.nan_to_num(v, nan=-math.inf) >= threshold


def _groups(group_ids: torch.Tensor):
    """The row indices (a ``[n]`` tensor) of each group, in ``torch.unique`` order of the group ids."""
    for g in torch.unique(group_ids):
        yield (group_ids == g).nonzero().squeeze(-1)


def _texts(batch) -> list[str]:
    return [completion_text(c) for c in batch.columns["completion"]]


def _to_number(text) -> float | None:
    try:
        return float(Fraction(str(text).strip()))
    except (ValueError, ZeroDivisionError):
        return None


# ---------------------------------------------------------------- DAPO overlong shaping

@REWARD_TRANSFORMS.register("overlong_penalty", needs=("tokens",))
def overlong_penalty(rewards: torch.Tensor, lengths: torch.Tensor, *, max_completion_length: int,
                     overlong_buffer: int = param(4, "overlong_penalty: the last L_cache tokens before "
                                                  "max_completion_length are penalised linearly (DAPO)"),
                     overlong_penalty_factor: float = param(1.0, "overlong_penalty: scale of the penalty (DAPO)")
                     ) -> torch.Tensor:
    """DAPO soft overlong punishment (Yu et al., 2025, arXiv:2503.14476, Eq. 13).

    With ``L_max = max_completion_length`` and ``L_cache = overlong_buffer``::

        R_len(y) = 0                                  if |y| <= L_max - L_cache
                 = ((L_max - L_cache) - |y|) / L_cache  if L_max - L_cache < |y| <= L_max
                 = -1                                 if |y| > L_max

    scaled by ``overlong_penalty_factor`` and added to the reward (TRL's
    ``get_soft_overlong_punishment``; verl's ``overlong_buffer``). ``|y|`` counts
    generated tokens including EOS. Unscorable (NaN) rows stay NaN.

    Provenance: paper equations — DAPO (Yu et al., 2025, arXiv:2503.14476), Eq. (13); the same as TRL
    get_soft_overlong_punishment and verl overlong_buffer.
    """
    if not 0 < overlong_buffer <= max_completion_length:
        raise ValueError(f"overlong_buffer: must be in 1..max_completion_length ({max_completion_length}), "
                         f"got {overlong_buffer}")
    start = max_completion_length - overlong_buffer
    y = lengths.to(rewards.dtype)
    pen = torch.where(y <= start, torch.zeros_like(y), (start - y) / overlong_buffer)
    pen = torch.where(y > max_completion_length, torch.full_like(y, -1.0), pen)
    return rewards + overlong_penalty_factor * pen


# ---------------------------------------------------------------- ReDit (004-06)

def _row_seed(seed: int, step: int, uid: int, k: int) -> int:
    h = 1469598103934665603
    for x in (seed, step, uid, k):  # FNV-1a over the four integers: no global RNG, stable across runs
        h = ((h ^ (x & 0xFFFFFFFFFFFF)) * 1099511628211) % (1 << 63)
    return h


@REWARD_TRANSFORMS.register("redit")
def redit(rewards: torch.Tensor, prompt_uids: torch.Tensor, step: int, *, seed: int = 0,
          redit_distribution: str = param('gaussian', 'ReDit: noise distribution', ['gaussian', 'uniform']),
          redit_scale: float = param(0.05, 'ReDit: noise std (gaussian) or half-width (uniform)')) -> torch.Tensor:
    """ReDit reward dithering (Wei et al., 2025, arXiv:2506.18631; seed 004-06).

    ``r~_i = r_i + eps_i`` with zero-mean noise: ``eps ~ N(0, scale^2)``
    (``redit_distribution: gaussian``) or ``eps ~ U(-scale, scale)`` (``uniform``),
    the two dithers the paper studies. Dithering breaks ties in flat reward
    regions, so a group of equal discrete rewards still gets (small) advantages.

    Deterministic without hidden RNG state: ``eps_i`` is drawn from a generator
    seeded by (config ``seed``, ``step``, the row's prompt uid, the row's
    occurrence index among rows of that uid), so a resumed run dithers exactly
    as an uninterrupted one, and the same row gets the same noise when the
    transform is evaluated twice in a step (dynamic sampling's filter and the
    advantages). Note that noisy rewards are never tied, so DAPO's dynamic
    sampling drops no group after ReDit. NaN rows stay NaN.

    Provenance: paper equations — ReDit (Wei et al., 2025, arXiv:2506.18631), additive zero-mean Gaussian or
    uniform dithering of the discrete reward (equation number not recorded); the deterministic per-row seeding
    is grpolab's.
    """
    if redit_distribution not in ("gaussian", "uniform"):
        raise ValueError(f"redit_distribution: expected gaussian or uniform, got '{redit_distribution}'")
    seen: dict[int, int] = {}
    eps = torch.empty(len(rewards), dtype=torch.float64)
    for i, uid in enumerate(prompt_uids.tolist()):
        k = seen.get(uid, 0)
        seen[uid] = k + 1
        gen = torch.Generator().manual_seed(_row_seed(int(seed), int(step), int(uid), k))
        if redit_distribution == "gaussian":
            eps[i] = torch.randn(1, generator=gen, dtype=torch.float64)[0]
        else:
            eps[i] = torch.rand(1, generator=gen, dtype=torch.float64)[0] * 2 - 1
    return rewards + (redit_scale * eps).to(rewards.dtype)


@REWARD_TRANSFORMS.register("reward_flip")
def reward_flip(rewards: torch.Tensor, prompt_uids: torch.Tensor, step: int, *, seed: int = 0,
                flip_prob: float = param(0.2, 'reward_flip: probability that a row\'s 0/1 reward is flipped')
                ) -> torch.Tensor:
    """Synthetic reward noise: each row's 0/1 reward is flipped (``r -> 1 - r``) with probability ``flip_prob``.

    The noise model of S-GRPO's headline experiment (seed 000-32: "standard GRPO fails under 20% synthetic
    reward noise"), for testing a method's robustness (docs/science.md). The draw is a pure function of
    (config ``seed``, ``step``, prompt uid, the row's occurrence index), as ReDit's, salted so the two never
    share noise; a resumed run flips exactly as an uninterrupted one. Rewards must lie in [0, 1] (a shaped or
    fractional reward is flipped as ``1 - r`` too); NaN rows stay NaN. Held-out evaluation is never flipped.

    Provenance: reconstructed from the abstract — S-GRPO (Shen et al., 2025, seed 000-32) names "20% synthetic
    reward noise" on a binary verifier reward without the exact process; the symmetric, independent per-row
    flip is grpolab's choice.
    """
    if not 0.0 <= flip_prob <= 1.0:
        raise ValueError(f"flip_prob: must be in [0, 1], got {flip_prob}")
    finite = rewards[~torch.isnan(rewards)]
    if bool(((finite < 0) | (finite > 1)).any()):
        raise ValueError("reward_flip: rewards must lie in [0, 1] (a 0/1 verifier reward); got "
                         f"{finite.min().item():g}..{finite.max().item():g}")
    seen: dict[int, int] = {}
    flip = torch.zeros(len(rewards), dtype=torch.bool)
    for i, uid in enumerate(prompt_uids.tolist()):
        k = seen.get(uid, 0)
        seen[uid] = k + 1
        gen = torch.Generator().manual_seed(_row_seed(int(seed) + 0x5F11, int(step), int(uid), k))
        flip[i] = bool(torch.rand(1, generator=gen, dtype=torch.float64)[0] < flip_prob)
    return torch.where(flip, 1 - rewards, rewards)


# ---------------------------------------------------------------- GRPO-LEAD (000-03)

@REWARD_TRANSFORMS.register("lead_length_reward", needs=("tokens",))
def lead_length_reward(rewards: torch.Tensor, lengths: torch.Tensor, group_ids: torch.Tensor,
                       reward_matrix: torch.Tensor, reward_names: list[str], *,
                       lead_len_alpha: float = param(0.05, 'GRPO-LEAD: length penalty strength alpha in exp(-alpha z)'),
                       lead_len_wrong_penalty: float = param(1.0, 'GRPO-LEAD: reward of a wrong answer is -this'),
                       lead_len_epsilon: float = param(1e-06, 'GRPO-LEAD: epsilon in z = (L - mu) / (sigma + eps)'),
                       lead_len_threshold: float = param(4000.0, "GRPO-LEAD: the length term applies only to groups "
                                                         "whose three shortest completions average more than this "
                                                         "many tokens (the authors' 4000)"),
                       shaping_correct_reward: str = CORRECT_REWARD,
                       shaping_correct_threshold: float = CORRECT_THRESHOLD) -> torch.Tensor:
    """GRPO-LEAD length-dependent accuracy and explicit penalty (Zhang & Zuo, 2025, arXiv:2504.09696; 000-03).

    Paper (Sec. 3): with ``mu, sigma`` the mean and std of the token lengths of
    the *correct* responses of the group, ``z_i = (|o_i| - mu) / (sigma + eps)``::

        R_acc(o_i) = exp(-alpha z_i)   if o_i is correct
                   = -1                if o_i is wrong   (explicit penalty, ``lead_len_wrong_penalty``)

    Matches the authors' code (github.com/aeroplanepaper/GRPO-LEAD,
    ``verl/verl/trainer/main_ppo.py``, ``RewardManager.get_reweight_rewards``):

    * ``sigma`` is the sample (Bessel, ``n - 1``) std of the correct lengths;
      with a single correct row the code uses ``sigma = 1``, so ``z = 0`` and
      the row is unchanged (equal lengths also give ``z = 0``);
    * gate: the length term is applied only when the mean of the group's
      three shortest completions (over *all* rows of the group, correct or
      not, as the code tracks ``min1..min3`` before testing correctness)
      exceeds ``lead_len_threshold`` (strict ``>``; the code skips the group
      when it is ``<= 4000``). A group of fewer than three rows has
      ``min3 = inf`` in the code, so it always passes the gate;
    * the wrong-answer penalty is applied to every group, gated or not.

    As a transform of the combined reward this is added as
    ``r + (exp(-alpha z) - 1)`` for correct rows and ``r - penalty`` for wrong
    ones: with the task's 0/1 accuracy reward at weight 1 that is exactly the
    code's ``1 * exp(-alpha z)`` / ``-1`` and keeps the other terms (format).
    NaN rows (and rows whose accuracy is unscorable) are left unchanged.

    Provenance: authors' code — https://github.com/aeroplanepaper/GRPO-LEAD, verl/verl/trainer/main_ppo.py
    (RewardManager.get_reweight_rewards); Bessel std, the 4000-token gate (lead_len_threshold) and the -1
    penalty as there.
    Test: tests/test_rewards_shaping.py::test_lead_length_reward_hand_computed.
    """
    correct = correct_rows(reward_matrix, reward_names, shaping_correct_reward, shaping_correct_threshold)
    acc = reward_matrix[:, reward_names.index(shaping_correct_reward)]
    out = rewards.clone()
    y = lengths.to(torch.float64)
    for idx in _groups(group_ids):
        c = idx[correct[idx]]
        shortest = torch.sort(y[idx]).values[:3]
        gated_on = len(idx) < 3 or float(shortest.mean()) > lead_len_threshold
        if len(c) and gated_on:
            mu = y[c].mean()
            sigma = y[c].std(unbiased=True) if len(c) > 1 else torch.ones((), dtype=torch.float64)
            z = (y[c] - mu) / (sigma + lead_len_epsilon)
            out[c] = rewards[c] + (torch.exp(-lead_len_alpha * z) - 1).to(rewards.dtype)
        w = idx[~correct[idx] & ~torch.isnan(acc[idx])]
        out[w] = rewards[w] - lead_len_wrong_penalty
    return out


# ---------------------------------------------------------------- FGRPR fuzzy numeric (000-66)

def fuzzy_score(pred: float | None, target: float, floor: float = 1.0, top: float = 1.5,
                max_error: float = 0.5) -> float:
    """``top - e`` if ``e < max_error`` else 0, ``e = |pred - target| / max(|target|, floor)``; 0 when nothing
    was parsed (FGRPR authors: ``1.5 - gap`` for ``gap < 0.5``)."""
    if pred is None or not math.isfinite(pred):
        return 0.0
    e = abs(pred - target) / max(abs(target), floor)
    return top - e if e < max_error else 0.0


@REWARD_TRANSFORMS.register("fuzzy_numeric", needs=("text",))
def fuzzy_numeric(rewards: torch.Tensor, batch, *,
                  fuzzy_weight: float = param(1.0, 'FGRPR: weight of the fuzzy closeness reward'),
                  fuzzy_pattern: str = param('Answer:\\s*(-?\\d+(?:\\.\\d+)?(?:/\\d+)?)', 'FGRPR: regex whose first '
                                             'group (last match) is the predicted number'),
                  fuzzy_floor: float = param(1.0, 'FGRPR: relative error is |y_hat - y| / max(|y|, floor)'),
                  fuzzy_max_reward: float = param(1.5, 'FGRPR: reward of an exact answer; it falls by the relative '
                                                  "error (authors: 1.5)"),
                  fuzzy_max_error: float = param(0.5, 'FGRPR: relative errors at or above this get 0 (authors: 0.5)'),
                  fuzzy_answer_column: str = param('answer', 'FGRPR: data column with the reference number')) -> torch.Tensor:
    """FGRPR fuzzy numeric reward (Wang et al., 2025, CrowdVLM-R1, arXiv:2504.03724; seed 000-66).

    Instead of 0/1 exact match, a numeric answer earns credit by closeness::

        e = |y_hat - y| / max(|y|, floor)
        R_fuzzy = 1.5 - e   if e < 0.5,   else 0

    (1.5 for the exact answer, 1.0 just inside 50 % relative error, 0 from
    there on). ``y_hat`` = the number captured by the last match of
    ``fuzzy_pattern`` in the completion (none -> 0); ``y`` = the data column
    ``fuzzy_answer_column``. Added as ``r + fuzzy_weight * R_fuzzy``; to
    *replace* the 0/1 accuracy as the paper does, give the accuracy reward
    weight 0 (``reward_weights``), as the ``fgrpr`` recipe does.

    Provenance: authors' code — https://github.com/yeyimilk/CrowdVLM-R1,
    VLM-R1/src/open-r1-multimodal/src/open_r1/grpo_rec.py (count_reward,
    registered as the "accuracy" reward: ``abs_gap = abs(sol - answer) / sol``,
    ``reward = 1.5 - abs_gap`` if ``abs_gap < 0.5`` else 0). Known
    differences: the authors parse ``<answer>(\\d+)</answer>`` (an integer
    count) where ``fuzzy_pattern`` is configurable; their target 0 raises a
    division by zero that gives reward 0, here ``floor`` (1) divides instead.
    Test: tests/test_rewards_shaping.py::test_fuzzy_numeric_hand_computed.
    """
    answers = data_column(batch.columns, fuzzy_answer_column, "fuzzy_numeric", "fuzzy_answer_column")
    pat = re.compile(fuzzy_pattern)
    bonus = []
    for text, a in zip(_texts(batch), answers):
        found = pat.findall(text)
        target = _to_number(a)
        pred = _to_number(found[-1]) if found else None
        bonus.append(0.0 if target is None else fuzzy_score(pred, target, fuzzy_floor, fuzzy_max_reward,
                                                             fuzzy_max_error))
    return rewards + fuzzy_weight * torch.tensor(bonus, dtype=rewards.dtype)


# ---------------------------------------------------------------- LC-R1 (000-100)

LC_THINK_END = param('</think>', "LC-R1: end-of-thinking marker; the reasoning R is the text before its first "
                     "occurrence, and a row counts as correct only if it appears exactly once (the authors' "
                     "'</think>' and format reward)")
LC_EPS = 1e-4  # the authors' denominators: max correct length + 1e-4, |R| + 1e-4


def lc_correct(reward_matrix: torch.Tensor, reward_names: list[str], texts: list[str], column: str,
               threshold: float, marker: str) -> torch.Tensor:
    """Bool ``[R]``: LC-R1's correct rows, as the authors' ``rewards == 2`` (format and accuracy both 1).

    The reward column ``column`` is ``>= threshold`` (:func:`correct_rows`) and the
    completion contains the end-of-thinking ``marker`` exactly once (the
    authors' format reward: ``completion.count('</think>') == 1``).
    """
    if not marker:
        raise ValueError("lc_think_end: LC-R1 needs a non-empty end-of-thinking marker (the authors' '</think>'; "
                         "'Answer:' for the arithmetic task)")
    ok = correct_rows(reward_matrix, reward_names, column, threshold)
    once = torch.tensor([t.count(marker) == 1 for t in texts], dtype=torch.bool)
    return ok & once


@REWARD_TRANSFORMS.register("lc_length", needs=("text",))
def lc_length(rewards: torch.Tensor, lengths: torch.Tensor, truncated: torch.Tensor, group_ids: torch.Tensor,
              reward_matrix: torch.Tensor, reward_names: list[str], batch, *,
              lc_length_weight: float = param(1.0, "LC-R1: weight of the length reward (the authors' "
                                              "len_penalty_coef, 1.0 in their train.py)"),
              lc_think_end: str = LC_THINK_END,
              shaping_correct_reward: str = CORRECT_REWARD,
              shaping_correct_threshold: float = CORRECT_THRESHOLD) -> torch.Tensor:
    """LC-R1 length reward (Cheng et al., 2025, arXiv:2506.14755; seed 000-100).

    In every group that has at least one correct row (:func:`lc_correct`), *every*
    row, correct or not, gets::

        r_i + w * (1 - L_i / (max_{j correct in group} L_j + 1e-4))

    with ``L`` the number of completion tokens before the EOS (all tokens of a
    truncated row) of the sequence that is trained on (after the ``lc_r1``
    rollout's crop). A wrong row longer than the longest correct one gets a
    negative term (max correct 200: a wrong row of 50 tokens gets +0.75, one of
    400 gets -1.0). Groups without a correct row are unchanged. The group
    mean is then subtracted by the advantage (``advantage: group_mean``; the
    authors run ``scale_rewards=False``: no std). Unscorable (NaN) rows stay NaN.

    Provenance: authors' code — https://github.com/zxiangx/LC-R1, trl/trainer/grpo_trainer.py
    (_generate_and_score_completions); matches the ``len_penalty_coef`` block
    (``_lengths = 1 - eos_idx / (max over right rows + 1e-4)`` for all rows of a
    group with a right row, else 0, added to the summed rewards before the
    group mean is subtracted), including the 1e-4. Known differences:
    "correct" is the reward column ``shaping_correct_reward`` plus the marker
    condition instead of their ``format + accuracy == 2``; groups are
    ``group_ids`` (ragged groups allowed) instead of ``view(-1, num_generations)``;
    for a truncated row ``L`` is its own token count, where their ``eos_idx`` is
    the padded width of the local batch.
    Test: tests/test_rewards_shaping.py::test_lc_length_hand_computed.
    """
    correct = lc_correct(reward_matrix, reward_names, _texts(batch), shaping_correct_reward,
                         shaping_correct_threshold, lc_think_end)
    y = (lengths.to(torch.float64) - (~truncated.bool()).to(torch.float64)).clamp(min=0)
    term = torch.zeros(len(rewards), dtype=torch.float64)
    for idx in _groups(group_ids):
        c = idx[correct[idx]]
        if len(c):
            term[idx] = 1 - y[idx] / (y[c].max() + LC_EPS)
    return rewards + (lc_length_weight * term).to(rewards.dtype)


# ---------------------------------------------------------------- Unlikeliness reward (000-62)

@REWARD_TRANSFORMS.register("unlikeliness")
def unlikeliness(rewards: torch.Tensor, group_ids: torch.Tensor, batch, *,
                 unlikely_beta: float = param(0.25, 'Unlikeliness: beta_rank, the reward cut of the most likely '
                                              'sample')) -> torch.Tensor:
    """Unlikeliness reward (He et al., 2025, "Rewarding the Unlikely", arXiv:2506.02355; seed 000-62).

    Within each group, rank the rows by the mean token log-probability of the
    completion under the sampling policy (``behavior_logprobs`` over
    ``completion_mask``), ascending: rank 0 = least likely. Then::

        r~_i = r_i * (1 - beta_rank * rank_i / G)

    so the most likely correct sample loses most and a rare correct sample
    keeps its reward; wrong samples (r = 0) are unchanged. Exactly the authors'
    code (``rank_penalty``, ``argsort(argsort(mean logprob)) / G``, all rows of
    the group ranked). NaN rows stay NaN and still take a rank, as there.

    Provenance: authors' code — https://github.com/AndreHe02/rewarding-unlikely-release,
    verl/trainer/ppo/ray_lean_trainer.py (rank_penalty: scores * (1 - rank * penalty), ranks by
    argsort(argsort(mean logprob)) / G).
    Test: tests/test_rewards_shaping.py::test_unlikeliness_hand_computed.
    """
    m = batch.completion_mask
    mean_lp = (batch.behavior_logprobs * m).sum(-1) / m.sum(-1).clamp_min(1)
    out = rewards.clone()
    for idx in _groups(group_ids):
        ranks = torch.argsort(torch.argsort(mean_lp[idx], stable=True), stable=True).to(rewards.dtype)
        out[idx] = rewards[idx] * (1 - unlikely_beta * ranks / len(idx))
    return out


# ---------------------------------------------------------------- GCPO-geometry length reward (000-56)

@REWARD_TRANSFORMS.register("gcpo_length", needs=("tokens",))
def gcpo_length(rewards: torch.Tensor, lengths: torch.Tensor, reward_matrix: torch.Tensor, reward_names: list[str], *,
                gcpo_len_weight: float = param(0.5, 'GCPO-geometry: weight of the length reward'),
                gcpo_len_sign: float = param(1.0, 'GCPO-geometry: +1 rewards longer completions, -1 shorter'),
                gcpo_len_target: int = param(64, 'GCPO-geometry: token length at which the length reward saturates'),
                gcpo_len_correct_only: bool = param(True, 'GCPO-geometry: give the length reward to correct rows only'),
                shaping_correct_reward: str = CORRECT_REWARD,
                shaping_correct_threshold: float = CORRECT_THRESHOLD) -> torch.Tensor:
    """GCPO length reward (Wang et al., 2025, GeometryZero, arXiv:2506.07160; seed 000-56).

    GeometryZero adds a length reward that *promotes longer* reasoning chains::

        R_len = sign * weight * min(L / L_target, 1)

    with ``L`` the completion's token count, ``L_target = gcpo_len_target``,
    ``sign = gcpo_len_sign`` (+1 as in the paper: longer is better; -1 turns it
    into a brevity reward), added to the reward — by default only for correct
    rows (``gcpo_len_correct_only``), so length cannot be farmed with wrong
    answers. The paper's other component, Group Contrastive Masking of the
    auxiliary-construction reward, is ``gcpo_aux_mask``.

    Provenance: reconstructed from the abstract — "a length reward that
    promotes longer reasoning chains"; the saturating linear ramp, its
    target length, weight and the correct-only gate are grpolab's choices.
    The authors' code (github.com/ekonwang/GeometryZero, named in the paper)
    is not in the searched store (index, snapshot fetch); the stored paper
    pages (arXiv html v2, themoonlight review) show the auxiliary reward (Eq.
    3) but not the length reward's formula.
    """
    if gcpo_len_target <= 0:
        raise ValueError(f"gcpo_len_target: must be positive, got {gcpo_len_target}")
    term = (lengths.to(torch.float64) / gcpo_len_target).clamp(max=1.0)
    if gcpo_len_correct_only:
        term = term * correct_rows(reward_matrix, reward_names, shaping_correct_reward,
                                   shaping_correct_threshold)
    return rewards + (gcpo_len_sign * gcpo_len_weight * term).to(rewards.dtype)


GCPO_AUX_PATTERN = param(r"<aux>.*?</aux>", "GCPO-geometry: regex (re.S) whose match in a completion marks it as "
                                             "using the auxiliary construction (arithmetic_aux's <aux>...</aux>)")


def gcpo_contrastive_mask(correct: torch.Tensor, uses_aux: torch.Tensor, group_ids: torch.Tensor,
                          margin: float = 0.0) -> torch.Tensor:
    """Per-row mask ``M`` in {-1, 0, +1} of the group it belongs to (see :func:`gcpo_aux_mask`).

    ``correct`` and ``uses_aux``: bool ``[R]``; a group with no row on one side of the contrast gets ``M = 0``.
    """
    mask = torch.zeros(len(correct), dtype=torch.float64)
    for idx in _groups(group_ids):
        c, a = correct[idx].to(torch.float64), uses_aux[idx]
        if a.all() or not a.any():
            continue
        diff = float(c[a].mean() - c[~a].mean())
        mask[idx] = 1.0 if diff > margin else (-1.0 if diff < -margin else 0.0)
    return mask


@REWARD_TRANSFORMS.register("gcpo_aux_mask", needs=("text",))
def gcpo_aux_mask(rewards: torch.Tensor, group_ids: torch.Tensor, reward_matrix: torch.Tensor,
                  reward_names: list[str], batch, *,
                  gcpo_aux_weight: float = param(0.5, 'GCPO-geometry: weight of the masked auxiliary-construction '
                                                 'reward'),
                  gcpo_aux_margin: float = param(0.0, 'GCPO-geometry: the with/without-construction accuracy '
                                                 'difference must exceed this for a +1 / -1 mask (else 0)'),
                  gcpo_aux_pattern: str = GCPO_AUX_PATTERN,
                  shaping_correct_reward: str = CORRECT_REWARD,
                  shaping_correct_threshold: float = CORRECT_THRESHOLD) -> torch.Tensor:
    """GCPO Group Contrastive Masking (Wang et al., 2025, GeometryZero, arXiv:2506.07160; seed 000-56).

    The unconditional auxiliary reward ``R_aux(o_i) = 1`` if completion ``o_i``
    uses the auxiliary construction, else 0 (the paper's Eq. 3), is multiplied
    by a mask judged within the group of the prompt. With ``A`` the group's
    rows that use the construction and ``N`` those that do not::

        d     = acc(A) - acc(N)        (acc: fraction of correct rows)
        M     = +1 if d > margin, -1 if d < -margin, else 0
                 (0 also when A or N is empty: no contrast to judge)
        r_i  <- r_i + weight * M * R_aux(o_i)

    so a construction is rewarded where, in this group, completions that use
    it succeed more often than those that do not, penalised where they
    succeed less often, and left alone otherwise; rows without it are
    unchanged. "Uses the construction" is a match of ``gcpo_aux_pattern``
    (default: an ``<aux>...</aux>`` span, the ``arithmetic_aux`` task's
    marker); "correct" is the reward column ``shaping_correct_reward`` >=
    ``shaping_correct_threshold`` (an unscorable row counts as wrong). NaN
    rewards stay NaN.

    Provenance: reconstructed from the abstract — "Group Contrastive Masking,
    which adaptively provides positive or negative reward signals for
    auxiliary construction based on contextual utility"; the unconditional
    R_aux (1 if the output constructs auxiliary lines, else 0; Eq. 3) is from
    a stored review of the paper (themoonlight.io). The contrast (accuracy
    with minus without the construction in the group), the margin (default 0),
    M = 0 for a one-sided group, the additive weight 0.5 and the regex marker
    are grpolab's choices, not checked against the paper's masking equation
    or the authors' code (github.com/ekonwang/GeometryZero: not in the
    searched store; snapshot fetch refused). Test:
    tests/test_gcpo_aux.py::test_gcpo_aux_mask_hand_computed.
    """
    try:
        pattern = re.compile(gcpo_aux_pattern, re.S)
    except re.error as exc:
        raise ValueError(f"gcpo_aux_pattern: not a regular expression ({exc}): {gcpo_aux_pattern!r}") from exc
    correct = correct_rows(reward_matrix, reward_names, shaping_correct_reward, shaping_correct_threshold)
    uses_aux = torch.tensor([pattern.search(t) is not None for t in _texts(batch)], dtype=torch.bool)
    mask = gcpo_contrastive_mask(correct, uses_aux, group_ids.cpu(), gcpo_aux_margin)
    bonus = gcpo_aux_weight * mask * uses_aux.to(torch.float64)
    return rewards + bonus.to(device=rewards.device, dtype=rewards.dtype)


# ---------------------------------------------------------------- BAPO IDK boundary reward (000-109)

@REWARD_TRANSFORMS.register("bapo_idk", needs=("text",))
def bapo_idk(rewards: torch.Tensor, group_ids: torch.Tensor, reward_matrix: torch.Tensor, reward_names: list[str],
             batch, step: int, *,
             bapo_idk_reward: float = param(0.5, 'BAPO: reward of an IDK answer in a group with no correct answer'),
             bapo_idk_pattern: str = param("I DON'?T KNOW", 'BAPO: regex (case-insensitive) marking an IDK answer'),
             bapo_exploration_steps: int = param(0, 'BAPO: steps of the exploration stage (modulator active)'),
             bapo_max_idk_ratio: float = param(0.3, 'BAPO: in exploration, IDK reward is off when the batch IDK '
                                               'ratio exceeds this'),
             shaping_correct_reward: str = CORRECT_REWARD,
             shaping_correct_threshold: float = CORRECT_THRESHOLD) -> torch.Tensor:
    """BAPO group-based boundary-aware IDK reward (Liu et al., 2026, arXiv:2601.11037; seed 000-109).

    A completion that answers "I DON'T KNOW" (regex ``bapo_idk_pattern``,
    case-insensitive) earns ``R_IDK = bapo_idk_reward`` (paper: 0.5) **only if no
    completion of its group is correct** — the group's outcomes say the question
    is beyond the model's boundary; otherwise it gets nothing extra (it is wrong).

    Adaptive reward modulator: during the exploration stage
    (``step < bapo_exploration_steps``) R_IDK is suspended for the whole batch
    when the batch's IDK ratio exceeds ``bapo_max_idk_ratio``, so IDK cannot
    become a shortcut before the model has explored. The paper's plateau-stage
    rule (suspending by rollout diversity) is not specified in the available
    sources and is not implemented: after exploration R_IDK is always on.

    Provenance: paper equations — BAPO (Liu et al., 2026, arXiv:2601.11037), the group-based IDK reward R_IDK =
    0.5 when no completion is correct and the exploration-stage modulator (equation numbers not recorded); the
    plateau-stage rule is not specified in the sources read and not implemented.
    """
    correct = correct_rows(reward_matrix, reward_names, shaping_correct_reward, shaping_correct_threshold)
    pat = re.compile(bapo_idk_pattern, re.IGNORECASE)
    idk = torch.tensor([bool(pat.search(t)) for t in _texts(batch)])
    if step < bapo_exploration_steps and float(idk.float().mean()) > bapo_max_idk_ratio:
        return rewards.clone()
    bonus = torch.zeros(len(rewards), dtype=rewards.dtype)
    for idx in _groups(group_ids):
        if not correct[idx].any():
            bonus[idx] = bapo_idk_reward * idk[idx].to(rewards.dtype)
    return rewards + bonus


# ---------------------------------------------------------------- IRPO Bradley-Terry scoring (000-21)

@REWARD_TRANSFORMS.register("irpo_bradley_terry")
def irpo_bradley_terry(rewards: torch.Tensor, group_ids: torch.Tensor, reward_matrix: torch.Tensor,
                       reward_names: list[str], *,
                       irpo_reward_column: str = param('rm', 'IRPO: reward column with the pointwise reward-model '
                                                       'scores'),
                       irpo_weight: float = param(1.0, 'IRPO: weight of the Bradley-Terry win probability added to '
                                                  'the reward'),
                       irpo_scale: float = param(1.0, 'IRPO: k in P(i beats j) = sigmoid(k (s_i - s_j))')) -> torch.Tensor:
    """IRPO pointwise Bradley-Terry scoring (Song et al., 2026, arXiv:2601.00677; seed 000-21).

    A pointwise reward model gives each completion a score ``s_i`` (the reward
    column ``irpo_reward_column``, e.g. a :class:`grpolab.rewards.models.RewardModelFn`
    named ``rm``). Under Bradley-Terry, ``P(i > j) = sigmoid(k (s_i - s_j))`` with
    ``k = irpo_scale``; the reward of row i is its mean win probability against
    the *other* scored rows of its group::

        p_i = 1/(n-1) * sum_{j in group, j != i, s_j scored} sigmoid(k (s_i - s_j))

    (``p_i = 0.5`` when i is the only scored row). This needs only n pointwise
    scores per group instead of n(n-1)/2 pairwise judgements — the point of
    IRPO. Added as ``r + irpo_weight * p_i``; to make the BT probability *the*
    reward, give the raw reward-model column weight 0 (``reward_weights``), as
    fgrpr does for its accuracy. Rows whose score is unscorable (NaN) get no
    bonus and are left out of the others' means. Choices: j = i is excluded
    (a self-comparison is always 0.5 and only shrinks the spread); the scale
    ``k`` is grpolab's knob (1 = plain BT on the model's logits).

    Provenance: reconstructed from the abstract — pointwise scores turned into each row's mean Bradley-Terry win
    probability against the other scored rows of its group (j = i excluded), with a scale k; the paper's exact
    aggregation was not available.
    """
    if irpo_reward_column not in reward_names:
        raise ValueError(f"irpo_reward_column: no reward column '{irpo_reward_column}' (reward functions: "
                         f"{', '.join(reward_names) or 'none'}); add a reward model, e.g. --reward rm:PATH")
    s = reward_matrix[:, reward_names.index(irpo_reward_column)].to(torch.float64)
    p = torch.zeros(len(rewards), dtype=torch.float64)
    for idx in _groups(group_ids):
        ok = idx[~torch.isnan(s[idx])]
        if len(ok) == 1:
            p[ok] = 0.5
        elif len(ok) > 1:
            d = torch.sigmoid(irpo_scale * (s[ok][:, None] - s[ok][None, :]))  # [n, n], P(i beats j)
            p[ok] = (d.sum(1) - 0.5) / (len(ok) - 1)  # drop the diagonal sigmoid(0) = 0.5
    return rewards + (irpo_weight * p).to(rewards.dtype)


# ---------------------------------------------------------------- GRPO-S dynamic reward scaling (DR-IRL, 000-43)

@REWARD_TRANSFORMS.register("grpo_s_scaling")
def grpo_s_scaling(rewards: torch.Tensor, group_ids: torch.Tensor, reward_matrix: torch.Tensor,
                   reward_names: list[str], batch, *,
                   grpo_s_reward_column: str = param('drirl', 'GRPO-S: reward column of the (category) reward model '
                                                     'whose gap to the demonstration measures responsiveness'),
                   grpo_s_hardness_column: str = param('hardness', 'GRPO-S: data column with the data-level '
                                                       'hardness h(x) in [0, 1]'),
                   grpo_s_demo_reward_column: str = param('demo_reward', "GRPO-S: data column with the reward "
                                                          "r(x, y*) of the prompt's demonstration"),
                   grpo_s_alpha: float = param(1.0, 'GRPO-S: weight of the data-level hardness in the scale'),
                   grpo_s_beta: float = param(1.0, 'GRPO-S: weight of the model-level responsiveness in the '
                                                   'scale')) -> torch.Tensor:
    """GRPO-S reward scaling by task difficulty (DR-IRL, Cheng et al., 2025, arXiv:2503.18991; seed 000-43).

    Each group (the G completions of prompt x) has its reward multiplied by one scale::

        gap(x)   = r(x, y*) - mean_{i in group, scored} r_i        (r = column grpo_s_reward_column)
        s(x)     = 1 + alpha * h(x) + beta * tanh(max(gap(x), 0))
        r'_i     = s(x) * r_i

    ``h(x)`` is the data-level hardness (data column ``grpo_s_hardness_column``; task ``drirl_safety``:
    ``1 - cos`` of the request and its demonstration) and the reward gap between the demonstration and the
    policy's completions is the model-level responsiveness: the further the policy is from the demonstration's
    reward, the harder the prompt for it now and the larger its scale. ``tanh`` bounds that term by ``beta``, so
    ``1 <= s(x) <= 1 + alpha + beta`` (for h in [0, 1]). A group with no scored row gets ``gap = 0``. NaN
    rewards stay NaN.

    A per-group scale cancels in group_zscore's ``(r - mean) / std``: use it with an advantage that does not
    divide by the group's std (``group_mean``, recipe ``grpo_s``), where it scales the group's advantages by
    ``s(x)`` (tested).

    Provenance: reconstructed from the abstract — GRPO-S (arXiv:2503.18991, seed 000-43) "scales the reward ...
    to task difficulty -- data-level hardness measured by CLIP similarity and model-level responsiveness
    measured by reward gaps"; the multiplicative form 1 + alpha h + beta tanh(max(gap, 0)), the gap to the
    demonstration's reward and the hashed-word cosine in place of CLIP are grpolab's choices; no authors' code
    found (searched the code index for DR-IRL, GRPO-S, the title and the arXiv id).
    """
    if grpo_s_reward_column not in reward_names:
        raise ConfigError(f"grpo_s_reward_column: no reward column '{grpo_s_reward_column}' (reward functions: "
                          f"{', '.join(reward_names) or 'none'}); task drirl_safety has 'drirl'")
    who = "grpo_s_scaling"
    h = torch.tensor([float(v) for v in data_column(batch.columns, grpo_s_hardness_column, who,
                                                    "grpo_s_hardness_column")], dtype=torch.float64)
    demo = torch.tensor([float(v) for v in data_column(batch.columns, grpo_s_demo_reward_column, who,
                                                       "grpo_s_demo_reward_column")], dtype=torch.float64)
    r = reward_matrix[:, reward_names.index(grpo_s_reward_column)].to(torch.float64)
    scale = torch.ones(len(rewards), dtype=torch.float64)
    for idx in _groups(group_ids):
        ok = idx[~torch.isnan(r[idx])]
        gap = float(demo[idx[0]] - r[ok].mean()) if len(ok) else 0.0
        scale[idx] = 1.0 + grpo_s_alpha * h[idx] + grpo_s_beta * math.tanh(max(gap, 0.0))
    return rewards * scale.to(rewards.dtype)


# ---------------------------------------------------------------- E-GRPO entity-match partial reward (000-54)

def entity_match_rate(text: str, entities) -> float:
    """Fraction of the gold entities mentioned in ``text`` (case-insensitive, whole words).

    An entity matches when it occurs with no letter/digit/underscore directly
    before or after it (word boundaries that also work for entities that start
    or end with punctuation). Duplicates count once; empty entities are ignored;
    no entities -> 0.
    """
    if entities is None or isinstance(entities, (str, bytes)):
        entities = [] if entities is None else [entities]
    ents = {str(e).strip().casefold() for e in entities if str(e).strip()}
    if not ents:
        return 0.0
    low = text.casefold()
    hit = sum(1 for e in ents if re.search(r"(?<!\w)" + re.escape(e) + r"(?!\w)", low))
    return hit / len(ents)


@REWARD_TRANSFORMS.register("egrpo_entity", needs=("text",))
def egrpo_entity(rewards: torch.Tensor, group_ids: torch.Tensor, reward_matrix: torch.Tensor, reward_names: list[str],
                 batch, *,
                 egrpo_alpha: float = param(0.3, 'E-GRPO: wrong rows earn alpha * normalised entity match rate'),
                 egrpo_entity_column: str = param('entities', 'E-GRPO: data column with the gold entities (list of '
                                                  'strings)'),
                 egrpo_normalize: str = param('group_max', "E-GRPO: normalise the match rate by the group's maximum, "
                                              'or not',
                                              ['group_max', 'none']),
                 shaping_correct_reward: str = CORRECT_REWARD,
                 shaping_correct_threshold: float = CORRECT_THRESHOLD) -> torch.Tensor:
    """E-GRPO entity-aware partial reward (Zhao et al., 2025, arXiv:2510.24694; seed 000-54).

    With ``gamma_i`` the entity match rate of completion i (fraction of the
    data column ``egrpo_entity_column``'s gold entities mentioned in it, see
    :func:`entity_match_rate`) and ``gamma_hat_i`` its group-normalised form,
    the paper's reward is::

        R_i = 1                       if o_i is correct
            = alpha * gamma_hat_i     if o_i is wrong
            = 0                       on an error (format / overlength)

    Here: ``r + alpha * gamma_hat_i`` on wrong rows (accuracy column scored and
    below ``shaping_correct_threshold``), nothing on correct or unscorable rows;
    with the 0/1 accuracy reward that is exactly the paper's ``R``. Normalisation
    (``egrpo_normalize``): ``group_max`` -> ``gamma_hat_i = gamma_i / max_{j in
    group} gamma_j`` (0 when no row of the group matches anything) — our reading
    of the paper's "normalised entity match rate" (the exact normaliser is not
    in the sources we could read); ``none`` -> ``gamma_hat = gamma``. Default
    ``alpha = 0.3``, the paper's best value. Entities are matched as whole
    words, case-insensitively, in the whole completion (the paper matches in
    the agent's reasoning; a plain reply has no separate trace).

    Provenance: paper equations — E-GRPO (Zhao et al., 2025, arXiv:2510.24694), the entity-aware reward R = 1 /
    alpha gamma_hat / 0 (equation number not recorded); the normaliser of gamma_hat (group max) and
    whole-completion matching are grpolab's reading.
    """
    if egrpo_normalize not in ("group_max", "none"):
        raise ValueError(f"egrpo_normalize: expected group_max or none, got '{egrpo_normalize}'")
    correct = correct_rows(reward_matrix, reward_names, shaping_correct_reward, shaping_correct_threshold)
    acc = reward_matrix[:, reward_names.index(shaping_correct_reward)]
    entities = data_column(batch.columns, egrpo_entity_column, "egrpo_entity", "egrpo_entity_column")
    gamma = torch.tensor([entity_match_rate(t, e) for t, e in zip(_texts(batch), entities)], dtype=torch.float64)
    if egrpo_normalize == "group_max":
        for idx in _groups(group_ids):
            m = gamma[idx].max()
            gamma[idx] = gamma[idx] / m if m > 0 else torch.zeros_like(gamma[idx])
    wrong = ~correct & ~torch.isnan(acc)
    return rewards + (egrpo_alpha * gamma * wrong).to(rewards.dtype)


# ---------------------------------------------------------------- paraphrase-set consistency (000-77, 000-30)

PARAPHRASE_GROUP_COLUMN = param('paraphrase_group', "paraphrase consistency: data column naming each row's "
                                                    "paraphrase set")
PARAPHRASE_MODES = ("agreement", "entropy")
PARAPHRASE_SIMILARITIES = ("answer", "bleu")


def _final_answer(text: str, pattern: re.Pattern) -> str | None:
    from .answers import last_boxed
    boxed = last_boxed(text)
    if boxed is not None:
        return boxed.strip()
    found = pattern.findall(text)
    return found[-1].strip() if found else None


def paraphrase_sets(batch, prompt_uids: torch.Tensor, column: str, who: str, param_name: str) -> dict:
    """``{set key: [row, ...]}``: the rows of each paraphrase set (rows whose data column ``column`` holds the
    same value), in row order. A set whose rows all come from one prompt (one wording) is reported once per
    call (FallbackWarning: its other wordings are not in the batch)."""
    sets = data_column(batch.columns, column, who, param_name)
    uids = prompt_uids.tolist()
    members: dict = {}
    for i, key in enumerate(sets):
        members.setdefault(str(key), []).append(i)
    lone = [k for k, rows in members.items() if len({uids[i] for i in rows}) < 2]
    if lone:
        warn_fallback(who, f"other paraphrases of {len(lone)} set(s) in the batch (e.g. '{lone[0]}')",
                      "no consistency term from the missing wordings; draw whole sets with prompt_sampler: "
                      "paraphrase_sets")
    return members


def group_similarity(i: int, rows: list[int], uids: list[int], sim, *, paraphrases: int = 0, rollouts: int = 0,
                     generator: torch.Generator | None = None) -> float:
    """PS-GRPO's group similarity reward of row ``i`` within its paraphrase set ``rows`` (000-77).

    The other wordings ``u`` (prompt uids other than ``uids[i]``) have ``N_u`` rows each, ``N = sum_u N_u``.
    Full reward (``paraphrases = rollouts = 0``)::

        r_i = (1 / N) sum_{u != uid_i} sum_{j in u} sim(i, j)

    — the paper's ``1 / ((n - 1) g) sum_{u != i} sum_m sim(o_ij, o_um)`` when every wording has ``g`` rows.
    Approximation (``paraphrases = kappa``, ``rollouts = s``): draw ``kappa`` of the ``n - 1`` other wordings
    uniformly without replacement (all when 0 or more than there are), then ``s_u = min(s, N_u)`` rows of each
    (all when 0), and return ``(n - 1) / (kappa N) sum_{u in K} N_u mean_{j in S_u} sim(i, j)``, which is
    the paper's ``1 / (kappa s) sum_{u in K} sum_{m in S_u} sim(o_ij, o_um)`` when every ``N_u = g`` and
    unbiased for ``r_i`` in any case (each wording is drawn with probability ``kappa / (n - 1)``, each row of
    it with ``s_u / N_u``). 0 when no other wording is present.
    """
    own = uids[i]
    others: dict[int, list[int]] = {}
    for j in rows:
        if uids[j] != own:
            others.setdefault(uids[j], []).append(j)
    if not others:
        return 0.0
    wordings = list(others)
    n_other, total = len(wordings), sum(len(v) for v in others.values())
    if 0 < paraphrases < n_other:
        pick = torch.randperm(n_other, generator=generator)[:paraphrases].tolist()
        chosen = [wordings[k] for k in sorted(pick)]
    else:
        chosen = wordings
    acc = 0.0
    for u in chosen:
        members = others[u]
        if 0 < rollouts < len(members):
            pick = torch.randperm(len(members), generator=generator)[:rollouts].tolist()
            members_s = [members[k] for k in sorted(pick)]
        else:
            members_s = members
        acc += len(members) * sum(sim(i, j) for j in members_s) / len(members_s)
    return n_other * acc / (len(chosen) * total)


@REWARD_TRANSFORMS.register("paraphrase_consistency", needs=("text",))
def paraphrase_consistency(rewards: torch.Tensor, prompt_uids: torch.Tensor, batch, step: int = 0, *,
                           seed: int = 0,
                           paraphrase_weight: float = param(0.5, 'paraphrase consistency: weight of the consistency '
                                                            'reward'),
                           paraphrase_mode: str = param('agreement', 'paraphrase consistency: PS-GRPO group '
                                                        'similarity with the other paraphrases (agreement) or '
                                                        "grpolab's 1 - normalised final-answer entropy over the "
                                                        'set (entropy)', list(PARAPHRASE_MODES)),
                           paraphrase_similarity: str = param('answer', 'paraphrase consistency (agreement): '
                                                              'sim of two outputs: final-answer equality (answer) or '
                                                              'sentence BLEU of the free-form texts (bleu, PS-GRPO)',
                                                              list(PARAPHRASE_SIMILARITIES)),
                           paraphrase_bleu_order: int = param(2, 'paraphrase consistency (bleu): BLEU-N order (the '
                                                              "paper's ablation found BLEU-1/2 best)"),
                           paraphrase_bleu_smoothing: str = param('none', 'paraphrase consistency (bleu): none, or '
                                                                  'add_one for n >= 2 (BLEU+1)', ['none', 'add_one']),
                           paraphrase_sample_paraphrases: int = param(0, 'paraphrase consistency (agreement): PS-GRPO '
                                                                      'approximation: other paraphrases drawn per '
                                                                      'output, kappa (0 = all)'),
                           paraphrase_sample_rollouts: int = param(0, 'paraphrase consistency (agreement): PS-GRPO '
                                                                   'approximation: outputs drawn per drawn '
                                                                   'paraphrase, s (0 = all)'),
                           paraphrase_group_column: str = PARAPHRASE_GROUP_COLUMN,
                           paraphrase_answer_pattern: str = param('Answer:\\s*([^\\n]+)', 'paraphrase consistency: '
                                                                  'regex whose first group (last match) is the final '
                                                                  'answer when there is no \\boxed{}')) -> torch.Tensor:
    """Paraphrase-set consistency reward: PS-GRPO's group similarity reward (Hamman et al., 2025, "Improving
    Consistency in Retrieval-Augmented Systems with Group Similarity Rewards", arXiv:2510.04392, seed 000-77),
    and a final-answer entropy variant.

    Rows whose data column ``paraphrase_group_column`` holds the same value form
    a *paraphrase set*: outputs of semantically equivalent prompts (each
    paraphrase is its own prompt, ``prompt_uids``).

    ``paraphrase_mode: agreement`` (PS-GRPO): each output ``o_ij`` (wording
    ``i``, sample ``j``) gets its similarity to the outputs of the *other*
    wordings of its set, :func:`group_similarity`::

        c_ij = 1 / ((n - 1) g) sum_{u != i} sum_m sim(o_ij, o_um)

    with the paper's scalable approximation when ``paraphrase_sample_paraphrases``
    (kappa) / ``paraphrase_sample_rollouts`` (s) are set: kappa other wordings
    and s outputs of each drawn per output, ``1 / (kappa s) sum sum sim``
    (unbiased; the draws are seeded by config ``seed``, ``step``, the row's
    prompt uid and its occurrence among that uid's rows, so a row gets the same
    value when the transform runs twice in a step). ``sim``:
    ``paraphrase_similarity: bleu`` — sentence BLEU-N
    (:func:`grpolab.tasks.text_similarity.sentence_bleu`, N =
    ``paraphrase_bleu_order``, default 2) of the two free-form completion texts,
    ``o_ij`` the hypothesis; ``answer`` — 1 when the final answers (last
    ``\\boxed{}`` or else last match of ``paraphrase_answer_pattern``) are equal
    under :func:`grpolab.rewards.answers.math_equal`, 0 otherwise or when either
    is missing. A row with no other wording in the batch gets 0.

    ``paraphrase_mode: entropy`` (grpolab's final-answer variant): with ``H``
    the entropy of the distribution of final answers over the set (missing
    answers each count as their own class) and ``n`` its size,
    ``c_i = 1 - H / log(n)`` for every row of the set (1 = all agree, 0 = all
    differ; a set of one row gets 0). 000-30's own rewards (entropy-based
    helpfulness and the entropy-gap stability) are ``information_consistency``.

    Added as ``r + paraphrase_weight * c_i`` — the paper's joint reward
    ``alpha r_cons + gamma Acc`` with the task's rewards as the accuracy term.
    NaN rows stay NaN.

    Provenance: reconstructed from the abstract — the paper's own text and code were not available, so the
    formulas below are as a secondary source quotes them, not checked against the paper: PS-GRPO (Hamman et al.,
    2025, arXiv:2510.04392), the group similarity reward
    r_ij = 1/((n-1)g) sum_{u != i} sum_m sim(o_ij, o_um), the relaxed approximation 1/(kappa s) sum_{u in K}
    sum_{m in S_u} sim(o_ij, o_um), BLEU as sim (BLEU-2 best in the paper's ablation) and the joint reward
    alpha r_cons + gamma Acc, as given by the paper note
    https://en.papernotes.org/NeurIPS2025/information_retrieval/improving_consistency_in_retrieval-augmented_systems_with_group_similarity_rewar/
    (equation numbers not recorded; the paper's own text and code were not available: the note says "Code: To
    be confirmed"); the BLEU tokenisation (lower-cased words), smoothing and the unbiased ragged-set weighting
    are grpolab's; the answer-equality sim and the entropy mode are grpolab's own variants. Test:
    tests/test_paraphrase_groups.py::test_ps_grpo_bleu_similarity_hand_computed,
    tests/test_paraphrase_groups.py::test_ps_grpo_subsampling_is_unbiased.
    """
    if paraphrase_mode not in PARAPHRASE_MODES:
        raise ConfigError(f"paraphrase_mode: expected one of {', '.join(PARAPHRASE_MODES)}, got '{paraphrase_mode}'")
    if paraphrase_similarity not in PARAPHRASE_SIMILARITIES:
        raise ConfigError(f"paraphrase_similarity: expected one of {', '.join(PARAPHRASE_SIMILARITIES)}, got "
                         f"'{paraphrase_similarity}'")
    if paraphrase_sample_paraphrases < 0 or paraphrase_sample_rollouts < 0:
        raise ConfigError(f"paraphrase_sample_paraphrases / paraphrase_sample_rollouts: expected >= 0 (0 = all), "
                         f"got {paraphrase_sample_paraphrases} / {paraphrase_sample_rollouts}")
    from .answers import math_equal
    from ..tasks.text_similarity import sentence_bleu

    members = paraphrase_sets(batch, prompt_uids, paraphrase_group_column, "paraphrase_consistency",
                              "paraphrase_group_column")
    texts = _texts(batch)
    pat = re.compile(paraphrase_answer_pattern)
    answers = [_final_answer(t, pat) for t in texts]
    uids = prompt_uids.tolist()
    c = torch.zeros(len(rewards), dtype=torch.float64)
    if paraphrase_mode == "agreement":
        if paraphrase_similarity == "bleu":
            def sim(i, j):
                return sentence_bleu(texts[i], texts[j], paraphrase_bleu_order, paraphrase_bleu_smoothing)
        else:
            def sim(i, j):
                return float(answers[i] is not None and answers[j] is not None and math_equal(answers[i], answers[j]))
        seen: dict[int, int] = {}
        for rows in members.values():
            for i in rows:
                k = seen.get(uids[i], 0)
                seen[uids[i]] = k + 1
                gen = torch.Generator().manual_seed(_row_seed(int(seed) + 0x9A5E, int(step), int(uids[i]), k))
                c[i] = group_similarity(i, rows, uids, sim, paraphrases=paraphrase_sample_paraphrases,
                                        rollouts=paraphrase_sample_rollouts, generator=gen)
    else:
        for rows in members.values():
            n = len(rows)
            if n < 2:
                continue
            classes: list[list[int]] = []  # answer-equivalence classes (math_equal), missing = singleton
            for i in rows:
                for cl in classes:
                    j = cl[0]
                    if answers[i] is not None and answers[j] is not None and math_equal(answers[i], answers[j]):
                        cl.append(i)
                        break
                else:
                    classes.append([i])
            probs = [len(cl) / n for cl in classes]
            h = -sum(p * math.log(p) for p in probs)
            c[rows] = 1.0 - h / math.log(n)
    return rewards + (paraphrase_weight * c).to(rewards.dtype)


@REWARD_TRANSFORMS.register("information_consistency", needs=("text",))
def information_consistency(rewards: torch.Tensor, prompt_uids: torch.Tensor, batch, *,
                            info_helpfulness_weight: float = param(0.5, 'information consistency: weight alpha of '
                                                                   'the entropy helpfulness reward H_norm'),
                            info_stability_weight: float = param(0.5, 'information consistency: weight beta of the '
                                                                 'entropy-gap stability reward F_norm'),
                            paraphrase_group_column: str = PARAPHRASE_GROUP_COLUMN) -> torch.Tensor:
    """Entropy-based helpfulness and stability rewards of information-consistency GRPO (Prabhune, Padmanabhan
    and Dutta, 2025, "Information-Consistent Language Model Recommendations through Group Relative Policy
    Optimization", arXiv:2512.12858, seed 000-30).

    ``H(r) = -sum_v p(v) log p(v)`` is the Shannon entropy of a response's word
    distribution (:func:`grpolab.tasks.text_similarity.word_entropy`; the paper:
    "higher entropy indicates information-rich, complete responses").

    Helpfulness: ``H_norm(r) = (H(r) - H_min) / (H_max - H_min)``, ``H_min`` and
    ``H_max`` over the scored rows of the batch (0 for every row when they are equal).

    Stability over a paraphrase set (rows sharing ``paraphrase_group_column``;
    the set of semantically equivalent prompts, each its own prompt with no
    conversational history — the paper's context reset)::

        F_norm(i) = 1 - mean_{j in set, prompt(j) != prompt(i)} |H(r_i) - H(r_j)| / MAX_GAP

    ``MAX_GAP`` = the largest ``|H(r_a) - H(r_b)|`` over the set's pairs of
    different wordings (``F = 1`` when it is 0); a row with no other wording in
    the batch gets ``F = 0``. The mean of ``F_norm`` over a set's rows is the
    paper's aggregate ``1 - (1/K) sum_k |H(r(q_k^i)) - H(r(q_k^j))| / MAX_GAP``
    over its pairs.

    Reward: ``r + alpha H_norm + beta F_norm`` (``info_helpfulness_weight``,
    ``info_stability_weight``); give the task's rewards weight 0 for the paper's
    ``alpha H_norm + beta F_norm`` alone. NaN rows stay NaN and are left out of
    ``H_min`` / ``H_max``. The paper forms the GRPO groups over the prompt
    variants: rollout strategy ``paraphrase_groups``.

    Provenance: reconstructed from the abstract — the paper's own text was not available, so the formulas are
    as a secondary source quotes them, not checked against the paper: information-consistency GRPO (Prabhune et
    al., 2025, arXiv:2512.12858),
    H(r) = -sum_v p(v) log p(v), H_norm = (H - H_min)/(H_max - H_min), the entropy gap |H(r^a) - H(r^b)|, F_norm
    = 1 - (1/K) sum_k gap_k / MAX_GAP and the weighted sum alpha H_norm + beta F_norm, as quoted from the paper by
    a third-party reading note in the public code index (file id 63467514345, "LLM consistency/robustness"; the
    paper's own text and code were not available here; equation numbers not recorded); the word tokenisation,
    H_min/H_max over the batch, MAX_GAP over the set's cross-wording pairs, F per row (mean over its
    cross-wording gaps) and the weights 0.5/0.5 are grpolab's choices. Test:
    tests/test_paraphrase_groups.py::test_information_consistency_hand_computed.
    """
    from ..tasks.text_similarity import word_entropy

    members = paraphrase_sets(batch, prompt_uids, paraphrase_group_column, "information_consistency",
                              "paraphrase_group_column")
    uids = prompt_uids.tolist()
    h = torch.tensor([word_entropy(t) for t in _texts(batch)], dtype=torch.float64)
    scored = ~torch.isnan(rewards)
    helpful = torch.zeros(len(rewards), dtype=torch.float64)
    if scored.any():
        lo, hi = h[scored].min(), h[scored].max()
        if hi > lo:
            helpful = (h - lo) / (hi - lo)
    stable = torch.zeros(len(rewards), dtype=torch.float64)
    for rows in members.values():
        rows = [i for i in rows if scored[i]]
        pairs = [(a, b) for a in rows for b in rows if uids[a] != uids[b]]
        if not pairs:
            continue
        max_gap = max(float(abs(h[a] - h[b])) for a, b in pairs)
        for i in rows:
            gaps = [float(abs(h[i] - h[j])) for j in rows if uids[j] != uids[i]]
            if gaps:
                stable[i] = 1.0 if max_gap == 0 else 1.0 - sum(gaps) / len(gaps) / max_gap
    return rewards + (info_helpfulness_weight * helpful + info_stability_weight * stable).to(rewards.dtype)


# ---------------------------------------------------------------- Thinkless mode reward (004-12)

THINKLESS_SHORT_TOKEN = param('<short>', 'Thinkless: control token of the short mode')
THINKLESS_THINK_TOKEN = param('<think>', 'Thinkless: control token of the thinking mode')


def control_mode(text: str, short_token: str = "<short>", think_token: str = "<think>") -> str | None:
    """``"short"`` / ``"think"`` when the completion starts with that control token, else ``None``."""
    t = text.lstrip()
    if t.startswith(short_token):
        return "short"
    if t.startswith(think_token):
        return "think"
    return None


@REWARD_TRANSFORMS.register("thinkless_mode_reward", needs=("text",))
def thinkless_mode_reward(rewards: torch.Tensor, reward_matrix: torch.Tensor, reward_names: list[str], batch, *,
                          thinkless_gamma: float = param(0.1, 'Thinkless reward: a correct <think> answer earns 1 - '
                                                         'gamma, a correct <short> one 1, a wrong one -1'),
                          thinkless_short_token: str = THINKLESS_SHORT_TOKEN,
                          thinkless_think_token: str = THINKLESS_THINK_TOKEN,
                          shaping_correct_reward: str = CORRECT_REWARD,
                          shaping_correct_threshold: float = CORRECT_THRESHOLD) -> torch.Tensor:
    """Thinkless reward (Fang, Ma and Wang, 2025, arXiv:2505.13379; seed 004-12)::

        r = 1          if the completion starts with <short> and is correct
          = 1 - gamma  if it starts with <think> and is correct
          = -1         if it is wrong

    so that, at equal correctness, the short mode is preferred. It *replaces*
    the combined reward (as in the paper, where it is the only reward). A
    completion without a control token counts as ``<think>`` (no brevity
    bonus). "Correct" is the reward column ``shaping_correct_reward`` >=
    ``shaping_correct_threshold``; rows whose correctness is unscorable stay NaN.
    The control tokens are added to the vocabulary by ``grpolab sft
    --sft_mode thinkless`` as atomic added tokens that decoding keeps, so the
    mode is read from the completion text. The paper's gamma was not
    available to us; 0.1 is grpolab's default (``thinkless_gamma``).

    Provenance: paper equations — Thinkless (Fang, Ma and Wang, 2025, arXiv:2505.13379), the mode-dependent
    reward 1 / 1 - gamma / -1 (equation number not recorded); gamma = 0.1 is grpolab's default (the paper's
    value was not available).
    """
    correct = correct_rows(reward_matrix, reward_names, shaping_correct_reward, shaping_correct_threshold)
    acc = reward_matrix[:, reward_names.index(shaping_correct_reward)]
    out = torch.empty_like(rewards)
    for i, c in enumerate(batch.columns["completion"]):
        if math.isnan(float(acc[i])):
            out[i] = float("nan")
        elif not correct[i]:
            out[i] = -1.0
        else:
            mode = control_mode(completion_text(c), thinkless_short_token, thinkless_think_token)
            out[i] = 1.0 if mode == "short" else 1.0 - thinkless_gamma
    return out


# ---------------------------------------------------------------- OTC tool-integrated reward (000-68)

def otc_ppo_tool_reward(m: int, c: float = 1.0) -> float:
    """OTC-PPO tool reward ``cos(m pi / (2m + c))`` (1 for ``m = 0``, falling towards 0 as ``m`` grows)."""
    return math.cos(m * math.pi / (2 * m + c))


def otc_grpo_tool_reward(m: int, n: int, c: float = 1.0) -> float:
    """OTC-GRPO tool reward for ``m`` calls when the group's optimal count is ``n``::

        f(m, n) = 0 if m = n = 0;  m if n = 0;  2 n m / (m + n) otherwise
        r_tool  = 1 if f(m, n) = n = 0;  cos(m pi / (2m + c)) if n = 0;  sin(f(m, n) pi / (2n)) otherwise
    """
    if n == 0:
        return 1.0 if m == 0 else otc_ppo_tool_reward(m, c)
    f = 2.0 * n * m / (m + n)
    return math.sin(f * math.pi / (2 * n))


@REWARD_TRANSFORMS.register("otc_tool_reward", needs=("text",))
def otc_tool_reward(rewards: torch.Tensor, group_ids: torch.Tensor, reward_matrix: torch.Tensor,
                    reward_names: list[str], batch, *,
                    otc_variant: str = param('grpo', 'OTC: grpo (optimal count n = fewest calls among the '
                                             "group's correct episodes) or ppo (n = 0: every call costs)",
                                             ['grpo', 'ppo']),
                    otc_c: float = param(1.0, 'OTC: smoothing constant c in cos(m pi / (2m + c))'),
                    otc_alpha: float = param(1.0, 'OTC: scale alpha of the tool-integrated reward'),
                    otc_tools: str = param('', 'OTC: comma-separated tool names whose calls count (empty: every '
                                           'tool call)'),
                    shaping_correct_reward: str = CORRECT_REWARD,
                    shaping_correct_threshold: float = CORRECT_THRESHOLD) -> torch.Tensor:
    """OTC tool-integrated reward (Wang et al., 2025, "Acting Less is Reasoning More! Teaching Model to Act
    Efficiently" / "OTC: Optimal Tool Calls via Reinforcement Learning", arXiv:2504.14870; seed 000-68).

    ``r' = alpha * r_tool(m, n) * r``: the task reward ``r`` (the combined reward of the row) scaled by the
    tool productivity term, with ``m`` the number of tool calls of the episode::

        OTC-PPO:   r_tool = cos(m pi / (2m + c))
        OTC-GRPO:  f(m, n) = 0 if m = n = 0;  m if n = 0;  2nm / (m + n) otherwise
                   r_tool = 1 if f(m, n) = n = 0;  cos(m pi / (2m + c)) if n = 0;  sin(f(m, n) pi / (2n)) otherwise

    OTC-GRPO's optimal count ``n`` is the fewest tool calls among the *correct* episodes of the row's group
    (the G episodes of one question); ``sin(f pi / 2n)`` is 1 at ``m = n`` and falls on both sides (too few
    and too many calls), ``cos`` punishes any call when the question needs none. Because ``r_tool``
    multiplies ``r``, a wrong answer (``r = 0``) earns nothing whatever its calls. Choices: a group with no
    correct episode has no optimal count; its rows are left unchanged (``r_tool = 1``). ``otc_tools`` limits
    the count to some tools (default every call). NaN rows stay NaN.

    Provenance: paper equations — OTC (Wang et al., 2025, arXiv:2504.14870), the OTC-PPO and OTC-GRPO tool
    rewards and r = alpha * r_tool * r_phi (equation numbers not recorded); no authors' code was found (the code
    index has only third-party reimplementations, which agree on these formulas); the unchanged group without a
    correct episode is grpolab's choice. Test: tests/test_agent_rewards.py::test_otc_tool_reward_hand_computed.
    """
    if otc_variant not in ("grpo", "ppo"):
        raise ValueError(f"otc_variant: expected grpo or ppo, got '{otc_variant}'")
    eps = episodes_of(batch.columns, "otc_tool_reward")
    names = tool_names(otc_tools)
    m = [count_tool_calls(e, names) for e in eps]
    correct = correct_rows(reward_matrix, reward_names, shaping_correct_reward, shaping_correct_threshold)
    factor = torch.ones(len(rewards), dtype=torch.float64)
    for idx in _groups(group_ids):
        idx = idx.tolist()
        if otc_variant == "ppo":
            for i in idx:
                factor[i] = otc_ppo_tool_reward(m[i], otc_c)
            continue
        good = [m[i] for i in idx if correct[i]]
        if not good:
            continue
        n = min(good)
        for i in idx:
            factor[i] = otc_grpo_tool_reward(m[i], n, otc_c)
    return rewards * (otc_alpha * factor).to(rewards.dtype)


# ---------------------------------------------------------------- SEM search efficiency (000-71)

@REWARD_TRANSFORMS.register("sem_search_reward", needs=("text",))
def sem_search_reward(rewards: torch.Tensor, group_ids: torch.Tensor, reward_matrix: torch.Tensor,
                      reward_names: list[str], batch, *,
                      sem_search_tools: str = param('search', 'SEM: comma-separated names of the search tools'),
                      sem_unnecessary_penalty: float = param(0.5, 'SEM: subtracted from a correct answer that '
                                                             'searched when the question needed no search'),
                      sem_missing_penalty: float = param(0.0, 'SEM: subtracted from a wrong answer that did not '
                                                         'search when the question needed it'),
                      sem_need_column: str = param('', "SEM: boolean data column 'this question needs retrieval' "
                                                   "(empty: decided from the group, see the docstring)"),
                      shaping_correct_reward: str = CORRECT_REWARD,
                      shaping_correct_threshold: float = CORRECT_THRESHOLD) -> torch.Tensor:
    """SEM search-efficiency reward (Sha, Cui and Wang, 2025, "SEM: Reinforcement Learning for Search-Efficient
    Large Language Models", arXiv:2505.07903; seed 000-71).

    The reward "encourages accurate answering without unnecessary search while promoting effective retrieval
    when needed". With ``s_i`` = the episode called a search tool, ``c_i`` = correct and ``need`` = the
    question needs retrieval::

        r'_i = r_i - sem_unnecessary_penalty   if c_i and s_i and not need   (redundant search)
             = r_i - sem_missing_penalty       if not c_i and not s_i and need  (should have searched)
             = r_i                             otherwise (correct without search, or with a needed search)

    ``need`` comes from the boolean data column ``sem_need_column`` when set (the paper's data mixes MuSiQue,
    which needs retrieval, and MMLU, which does not); otherwise from the group: the question needs no search
    when at least one *correct* episode of its group used none (the model showed it can answer from its own
    knowledge), and needs it otherwise. NaN rows stay NaN.

    Provenance: reconstructed from the abstract — the penalty for a correct answer reached with an unnecessary
    search, the optional penalty for a missing needed search, and the group-based decision of "needed" (or a
    data column) are grpolab's; the paper's exact reward, template and constants are not reproduced.
    """
    eps = episodes_of(batch.columns, "sem_search_reward")
    names = tool_names(sem_search_tools)
    searched = [count_tool_calls(e, names) > 0 for e in eps]
    correct = correct_rows(reward_matrix, reward_names, shaping_correct_reward, shaping_correct_threshold).tolist()
    need = [True] * len(rewards)
    if sem_need_column:
        col = data_column(batch.columns, sem_need_column, "sem_search_reward", "sem_need_column")
        need = [bool(v) for v in col]
    else:
        for idx in _groups(group_ids):
            idx = idx.tolist()
            direct = any(correct[i] and not searched[i] for i in idx)
            for i in idx:
                need[i] = not direct
    out = rewards.clone()
    for i in range(len(rewards)):
        if correct[i] and searched[i] and not need[i]:
            out[i] = rewards[i] - sem_unnecessary_penalty
        elif not correct[i] and not searched[i] and need[i]:
            out[i] = rewards[i] - sem_missing_penalty
    return out


# ---------------------------------------------------------------- GraphRAG-R1 phases (000-63)

def pra_reward(n: int, gamma: float) -> float:
    """Progressive retrieval attenuation: the k-th retrieval earns ``(1 - gamma) gamma^(k-1)``, so ``n``
    retrievals earn ``1 - gamma^n`` (0 for none, rising with diminishing steps towards 1)."""
    return 1.0 - gamma ** n


def caf_reward(f1: float, n: int, lam: float) -> float:
    """Cost-aware F1: ``F1 * exp(-lambda n)`` for ``n`` retrievals."""
    return f1 * math.exp(-lam * n)


def graphrag_phase(step: int, pra_start: int, caf_start: int) -> int:
    """Training phase at ``step``: 1 cold start (``step < pra_start``), 2 PRA, 3 CAF (``step >= caf_start``)."""
    if caf_start < pra_start:
        raise ValueError(f"graphrag_caf_start ({caf_start}) must be >= graphrag_pra_start ({pra_start})")
    return 1 if step < pra_start else (2 if step < caf_start else 3)


@REWARD_TRANSFORMS.register("graphrag_r1_phases", needs=("text",))
def graphrag_r1_phases(rewards: torch.Tensor, batch, step: int, *,
                       graphrag_pra_start: int = param(20, 'GraphRAG-R1: first step of phase 2 (PRA reward); '
                                                       'steps before it are the cold start'),
                       graphrag_caf_start: int = param(40, 'GraphRAG-R1: first step of phase 3 (CAF reward '
                                                       'instead of PRA)'),
                       graphrag_pra_gamma: float = param(0.5, 'GraphRAG-R1: attenuation gamma of each further '
                                                         'retrieval in PRA'),
                       graphrag_pra_weight: float = param(0.5, 'GraphRAG-R1: weight of the PRA reward in phase 2'),
                       graphrag_caf_lambda: float = param(0.1, 'GraphRAG-R1: cost rate lambda of CAF, '
                                                          'F1 * exp(-lambda n)'),
                       graphrag_caf_weight: float = param(1.0, 'GraphRAG-R1: weight of the CAF reward in phase 3'),
                       graphrag_retrieval_tools: str = param('search', 'GraphRAG-R1: comma-separated names of '
                                                             'the retrieval tools (empty: every tool call)'),
                       agent_answer_column: str = ANSWER_COLUMN) -> torch.Tensor:
    """GraphRAG-R1 PRA and CAF rewards with the phase-dependent schedule (Yu et al., 2025, "GraphRAG-R1:
    Graph Retrieval-Augmented Generation with Process-Constrained Reinforcement Learning", arXiv:2507.23581;
    seed 000-63).

    Three training phases by the training ``step`` (the scorer passes it; the schedule is a pure function of
    it, so a resumed run continues in the right phase), with ``n`` = retrieval calls of the episode and
    ``F1`` = token F1 of the final answer (``Answer:`` line or ``\\boxed{}``) against ``agent_answer_column``::

        phase 1, step < pra_start:              r' = r                                (cold start: task rewards)
        phase 2, pra_start <= step < caf_start: r' = r + w_pra * PRA(n),  PRA(n) = 1 - gamma^n
        phase 3, step >= caf_start:             r' = r + w_caf * CAF,     CAF = F1 * exp(-lambda n)

    PRA ("encourage essential retrievals", against shallow retrieval): each further retrieval is worth
    ``gamma`` times the previous one, so the first calls pay and extra calls pay less and less. CAF ("balance
    performance with computational cost", against over-thinking): the answer's F1 discounted by the number of
    retrievals. ``r`` is the task's own reward (accuracy, format). NaN rows stay NaN.

    Provenance: reconstructed from the abstract — the three phases and the two reward names are the paper's;
    the functional forms 1 - gamma^n and F1 * exp(-lambda n), adding them to the task reward, the phase
    boundaries and constants are grpolab's (the authors' repository, https://github.com/ycygit/GraphRAG-R1,
    holds evaluation and retrieval-server code but no training reward).
    """
    phase = graphrag_phase(int(step), graphrag_pra_start, graphrag_caf_start)
    if phase == 1:
        return rewards
    eps = episodes_of(batch.columns, "graphrag_r1_phases")
    names = tool_names(graphrag_retrieval_tools)
    n = [count_tool_calls(e, names) for e in eps]
    if phase == 2:
        bonus = [graphrag_pra_weight * pra_reward(k, graphrag_pra_gamma) for k in n]
    else:
        gold = data_column(batch.columns, agent_answer_column, "graphrag_r1_phases", "agent_answer_column")
        comps = batch.columns.get("completion", [None] * len(eps))
        bonus = []
        for e, k, g, c in zip(eps, n, gold, comps):
            pred = extract_answer(final_text(e, c))
            bonus.append(graphrag_caf_weight * caf_reward(token_f1(pred, g) if pred is not None else 0.0, k,
                                                          graphrag_caf_lambda))
    return rewards + torch.tensor(bonus, dtype=rewards.dtype)


# ---------------------------------------------------------------- Self-Paced GRPO (000-36)

def self_paced_weights(c: float, thresholds=(1 / 3, 2 / 3), temperature: float = 0.1) -> list[float]:
    """The stage weights ``[w_1, w_2, w_3]`` at competence ``c``: logistic transitions
    g_k(c) = σ((c − τ_k)/κ) (k = 1, 2), w_1 = 1 − g_1, w_2 = g_1 − g_2, w_3 = g_2 (non-negative when
    τ_1 ≤ τ_2; they sum to 1)."""
    t1, t2 = (float(x) for x in thresholds)
    g1 = 1 / (1 + math.exp(-(c - t1) / temperature))
    g2 = 1 / (1 + math.exp(-(c - t2) / temperature))
    return [1 - g1, g1 - g2, g2]


def _check_self_paced(cfg) -> None:
    from ..config import ConfigError
    cols, th = list(cfg.self_paced_columns), list(cfg.self_paced_thresholds)
    if len(cols) != 3:
        raise ConfigError(f"self_paced_columns: three reward columns (fidelity, temporal coherence, alignment), "
                          f"got {cols}")
    if len(th) != 2 or not float(th[0]) <= float(th[1]):
        raise ConfigError(f"self_paced_thresholds: two competences tau_1 <= tau_2, got {th}")
    if not cfg.self_paced_temperature > 0:
        raise ConfigError(f"self_paced_temperature: must be > 0, got {cfg.self_paced_temperature}")
    if not 0 <= cfg.self_paced_momentum < 1:
        raise ConfigError(f"self_paced_momentum: must be in [0, 1), got {cfg.self_paced_momentum}")
    lo, hi = (float(x) for x in cfg.self_paced_fidelity_range)
    if not hi > lo:
        raise ConfigError(f"self_paced_fidelity_range: [low, high] with high > low, got {[lo, hi]}")


@REWARD_TRANSFORMS.register("self_paced", check=_check_self_paced)
class SelfPaced:
    """Self-Paced GRPO's progressive reward (Li et al., 2025, *Growing with the Generator: Self-paced GRPO for
    Video Generation*, arXiv:2511.19356; seed 000-36): the scalar reward moves its weight from coarse visual
    fidelity to temporal coherence to semantic alignment as the generator's competence grows.

    With R_1, R_2, R_3 the reward columns named by ``self_paced_columns`` (default the ``digit_frames`` task's
    ``frame_fidelity``, ``frame_coherence``, ``frame_alignment``), per step::

        ĉ   = clip((mean_i R_1,i − lo) / (hi − lo), 0, 1)      batch competence, [lo, hi] = self_paced_fidelity_range
        c   ← m·c + (1 − m)·ĉ                                   EMA, m = self_paced_momentum (the first batch: c = ĉ)
        g_k = σ((c − τ_k) / κ),  k = 1, 2                       τ = self_paced_thresholds, κ = self_paced_temperature
        w   = (1 − g_1,  g_1 − g_2,  g_2)
        r_i = Σ_j w_j · R_j,i

    (the task's own weighted sum, the input ``rewards``, is replaced). At c = 0, ½, 1 with the defaults
    (τ = ⅓, ⅔; κ = 0.1) w ≈ (0.966, 0.033, 0.001), (0.159, 0.682, 0.159), (0.001, 0.033, 0.966).
    The competence is updated once per training step: a second call in the same step (a collector or rollout
    strategy scoring twice) recomputes the step's update from the competence before it, so the last call wins.
    The competence and the step are checkpointed (``state_dict``). Rows with a NaN column stay NaN and are left
    out of ĉ; a step with no scored row keeps c.

    Provenance: reconstructed from the abstract — seed 000-36 (arXiv:2511.19356) and the reference notes: a
    competence-aware weighting Σ_j w_j(c)·R_j over three stages (fidelity → temporal coherence → alignment)
    with transition functions; no authors' code found (searched the code index for "Self-Paced GRPO",
    "self-paced" repositories and the arXiv id: only paper pages and a third party's re-implementation).
    Our choices: competence = EMA of the batch-mean fidelity min-max normalised to [lo, hi]; two logistic
    transitions at fixed thresholds whose differences are the three weights (summing to 1); the EMA's
    initialisation by the first batch; the once-per-step update. The paper's dynamic group-wise evaluation is
    left out.
    Test: tests/test_self_paced_planner.py::test_self_paced_hand_weights,
    tests/test_self_paced_planner.py::test_self_paced_state_round_trip.
    """

    def __init__(self, *,
                 self_paced_columns: list = param(["frame_fidelity", "frame_coherence", "frame_alignment"],
                                                  "self_paced: the three reward columns, in curriculum order "
                                                  "(fidelity, temporal coherence, alignment)"),
                 self_paced_momentum: float = param(0.9, "self_paced: EMA momentum m of the competence "
                                                    "c <- m c + (1 - m) c_batch"),
                 self_paced_thresholds: list = param([1 / 3, 2 / 3], "self_paced: competences tau_1 <= tau_2 at "
                                                     "which the weight passes fidelity -> coherence -> alignment"),
                 self_paced_temperature: float = param(0.1, "self_paced: width kappa of the logistic transitions"),
                 self_paced_fidelity_range: list = param([0.0, 1.0], "self_paced: [low, high] of the fidelity "
                                                         "column, mapped to competence 0 and 1")):
        self.columns = [str(c) for c in self_paced_columns]
        self.momentum, self.temperature = float(self_paced_momentum), float(self_paced_temperature)
        self.thresholds = [float(x) for x in self_paced_thresholds]
        self.lo, self.hi = (float(x) for x in self_paced_fidelity_range)
        self.competence, self.before, self.step, self.seen = 0.0, 0.0, -1, False
        self.seen_before = False

    def weights(self) -> list[float]:
        """The current stage weights w(c)."""
        return self_paced_weights(self.competence, self.thresholds, self.temperature)

    def __call__(self, rewards: torch.Tensor, reward_matrix: torch.Tensor, reward_names: list[str],
                 step: int = 0) -> torch.Tensor:
        missing = [c for c in self.columns if c not in reward_names]
        if missing:
            raise ValueError(f"self_paced: no reward column {', '.join(map(repr, missing))} (reward functions: "
                             f"{', '.join(reward_names) or 'none'}); set self_paced_columns")
        R = reward_matrix[:, [reward_names.index(c) for c in self.columns]].double()  # [rows, 3]
        if int(step) != self.step:  # a new step: its update starts from the competence after the last one
            self.before, self.seen_before, self.step = self.competence, self.seen, int(step)
        fid = R[:, 0][~torch.isnan(R).any(-1)]
        if fid.numel():
            c_hat = min(max((float(fid.mean()) - self.lo) / (self.hi - self.lo), 0.0), 1.0)
            self.competence = (self.momentum * self.before + (1 - self.momentum) * c_hat if self.seen_before
                               else c_hat)
            self.seen = True
        else:
            self.competence, self.seen = self.before, self.seen_before
        w = torch.tensor(self.weights(), dtype=torch.float64)
        return (R * w).sum(-1).to(rewards.dtype)  # a NaN column leaves the row NaN

    def state_dict(self) -> dict:
        return {"competence": self.competence, "before": self.before, "step": self.step, "seen": int(self.seen),
                "seen_before": int(self.seen_before)}

    def load_state_dict(self, state: dict) -> None:
        self.competence, self.before = float(state["competence"]), float(state["before"])
        self.step, self.seen, self.seen_before = int(state["step"]), bool(state["seen"]), bool(state["seen_before"])


# ---------------------------------------------------------------- Open-RS cosine length-scaled reward (000-60)

def cosine_scaled_value(length: float, correct: bool, max_len: float, min_value_wrong: float,
                        max_value_wrong: float, min_value_correct: float, max_value_correct: float) -> float:
    """One row of the cosine length-scaled reward (formula: :func:`cosine_length_reward`)."""
    cos = math.cos(math.pi * length / max_len)
    lo, hi = (min_value_correct, max_value_correct) if correct else (max_value_wrong, min_value_wrong)
    return lo + 0.5 * (hi - lo) * (1.0 + cos)


@REWARD_TRANSFORMS.register("cosine_length_reward", needs=("text",))
def cosine_length_reward(rewards: torch.Tensor, reward_matrix: torch.Tensor, reward_names: list[str], batch, *,
                         cosine_min_value_wrong: float = param(0.0, "cosine length reward: a wrong answer's reward "
                                                               "at length 0 (authors' script default 0.0)"),
                         cosine_max_value_wrong: float = param(-0.5, "cosine length reward: a wrong answer's "
                                                               "reward at length cosine_max_len"),
                         cosine_min_value_correct: float = param(0.5, "cosine length reward: a correct answer's "
                                                                 "reward at length cosine_max_len"),
                         cosine_max_value_correct: float = param(1.0, "cosine length reward: a correct answer's "
                                                                 "reward at length 0"),
                         cosine_max_len: int = param(1000, "cosine length reward: length scale in characters of "
                                                     "the completion text (the authors' len(content))"),
                         cosine_reward_weight: float = param(2.0, "cosine length reward: weight of the term added "
                                                             "to the combined reward (Open-RS recipe: 2.0)"),
                         shaping_correct_reward: str = CORRECT_REWARD,
                         shaping_correct_threshold: float = CORRECT_THRESHOLD) -> torch.Tensor:
    """Cosine length-scaled accuracy reward, as used by Open-RS (Dang & Ngo, 2025, arXiv:2503.16219; 000-60).

    With ``L`` the completion's length in *characters* (the authors' ``len(content)``), ``L_max =
    cosine_max_len`` and ``c = cos(pi * L / L_max)``::

        R_cos = lo + 0.5 * (hi - lo) * (1 + c)
        correct: lo = cosine_min_value_correct, hi = cosine_max_value_correct   (defaults 0.5, 1.0)
        wrong:   lo = cosine_max_value_wrong,   hi = cosine_min_value_wrong     (defaults -0.5, 0.0)

    so at ``L = 0`` a correct row gets ``hi`` = 1.0 and at ``L = L_max`` it gets 0.5; a wrong row gets 0.0
    at ``L = 0`` and -0.5 at ``L = L_max``. The swap of min and max for wrong rows is the authors'; with
    their *script* defaults (``cosine_min_value_wrong = 0.0``, ``cosine_max_value_wrong = -0.5``) it makes
    longer wrong answers score *lower* (with the function's own defaults -1.0 / -0.5 it is the reverse); the
    defaults here are the script's, which the Open-RS runs used. ``L`` is not clamped: past ``L_max`` the
    cosine rises again (period ``2 L_max``), as in the authors' code.

    Returned: ``rewards + cosine_reward_weight * R_cos``. The Open-RS recipe trains on ``format`` (weight 1)
    + ``cosine`` (weight 2) with no separate accuracy term, which is this transform with the accuracy
    column at reward weight 0 (recipe ``open_rs``). "Correct" is the reward column
    ``shaping_correct_reward`` ``>= shaping_correct_threshold`` (the authors use math-verify's
    ``verify``). Rows whose combined reward is NaN, or whose accuracy column is unscorable, are unchanged.

    Provenance: authors' code — https://github.com/knoveleng/open-rs, src/open_r1/rewards.py
    (get_cosine_scaled_reward) and src/open_r1/grpo.py (the cosine_* defaults); character length, the
    wrong-row swap and the unclamped cosine as there; correctness from the task's accuracy column instead of
    math-verify.
    Test: tests/test_open_rs.py::test_cosine_length_reward_hand_computed.
    """
    if cosine_max_len <= 0:
        raise ValueError(f"cosine_max_len: must be > 0, got {cosine_max_len}")
    correct = correct_rows(reward_matrix, reward_names, shaping_correct_reward, shaping_correct_threshold)
    acc = reward_matrix[:, reward_names.index(shaping_correct_reward)]
    texts = _texts(batch)
    out = rewards.clone()
    for i, text in enumerate(texts):
        if math.isnan(float(acc[i])) or math.isnan(float(rewards[i])):
            continue
        v = cosine_scaled_value(len(text), bool(correct[i]), float(cosine_max_len), cosine_min_value_wrong,
                                cosine_max_value_wrong, cosine_min_value_correct, cosine_max_value_correct)
        out[i] = rewards[i] + cosine_reward_weight * v
    return out


# ---------------------------------------------------------------- SGPO step credit in all-negative groups (000-49)

@REWARD_TRANSFORMS.register("sgpo_negative_credit")
def sgpo_negative_credit(rewards: torch.Tensor, group_ids: torch.Tensor, reward_matrix: torch.Tensor,
                         reward_names: list[str], *,
                         sgpo_judge_column: str = param('sgpo_judge', 'sgpo_negative_credit: reward column with the '
                                                        "step judge's credit c_i in [0, 1] (--reward sgpo_judge:...)"),
                         sgpo_credit_scale: float = param(0.5, 'sgpo_negative_credit: lambda, the reward a wrong '
                                                          'completion gains at full step credit (below the 1 of a '
                                                          'right answer)')) -> torch.Tensor:
    """SGPO: partial credit from a step-wise judge in all-negative groups (Chen et al., 2025, *Spectral Policy
    Optimization: Coloring your Incorrect Reasoning in GRPO* / *Stepwise Guided Policy Optimization*,
    arXiv:2505.11595; seed 000-49).

    For each group ``g`` with no correct row (an all-negative-sample group; a row is correct when its credit
    ``c_i = 1``: the judge column marks a right final answer 1 and every wrong completion below 1)::

        r_i <- r_i + lambda * c_i        (i in g; c_i = the sgpo_judge column, NaN -> 0)

    and every group with a correct row is unchanged, so GRPO's advantages are non-zero in an all-negative group
    whenever the judge tells its completions apart, and ordered by the credit. ``c_i`` is the share of a wrong
    completion's steps (its wrong final answer the last) before the first one the judge marks wrong
    (``rewards/step_judge.py``); an unparseable judge reply leaves ``c_i`` NaN and the row gains nothing.
    ``lambda = sgpo_credit_scale`` < 1 keeps every wrong completion below a right one. The judge column should
    have reward weight 0 (recipe ``sgpo``), so it reaches the scalar reward only here. Rows whose reward is NaN
    stay NaN.

    Provenance: reconstructed from the abstract — SGPO (arXiv:2505.11595; seed 000-49): the judge's diversity is
    applied to all-negative groups only; our choices: additive credit lambda * c_i on the task reward with
    lambda = 0.5, unparseable replies add nothing, correctness read from the judge column (the answer
    checked against the data's answer) instead of the task's accuracy column; no authors' code found (searched
    the code index for "Spectral Policy Optimization", "Stepwise Guided Policy Optimization", "SGPO" and the
    arXiv id).
    Test: tests/test_sgpo.py::test_all_negative_group_gets_ordered_advantages,
    tests/test_sgpo.py::test_group_with_a_right_answer_is_unchanged.
    """
    if sgpo_judge_column not in reward_names:
        raise ValueError(f"sgpo_judge_column: no reward column '{sgpo_judge_column}' (reward functions: "
                         f"{', '.join(reward_names) or 'none'}); add --reward sgpo_judge:self=0 (or another judge)")
    credit = torch.nan_to_num(reward_matrix[:, reward_names.index(sgpo_judge_column)], nan=0.0).to(rewards.dtype)
    correct = credit >= 1.0
    out = rewards.clone()
    for idx in _groups(group_ids):
        if not correct[idx].any():
            out[idx] = rewards[idx] + sgpo_credit_scale * credit[idx]
    return out


# ---------------------------------------------------------------------------------------- CTDE joint reward
def ctde_costs(transcript: list[dict], answer_role: str | None) -> tuple[int, int]:
    """``(turns, coordination characters)`` of one team episode's transcript (``team_transcript``): every turn
    of every role, and the characters of every message but the answer role's last (its answer)."""
    turns = sum(len(seat["turns"]) for seat in transcript)
    answer = answer_role if answer_role is not None else transcript[-1]["role"]
    chars = 0
    for seat in transcript:
        msgs = seat["turns"][:-1] if seat["role"] == answer else seat["turns"]
        chars += sum(len(m) for m in msgs)
    return turns, chars


@REWARD_TRANSFORMS.register("ctde_joint_reward", needs=("text",))
def ctde_joint_reward(rewards: torch.Tensor, batch, *,
                      ctde_quality_weight: float = param(1.0, "CTDE joint reward: weight of the task quality (the "
                                                         "combined task reward)"),
                      ctde_speed_weight: float = param(0.05, "CTDE joint reward: cost per turn the team took"),
                      ctde_cost_weight: float = param(0.05, "CTDE joint reward: cost per 100 characters of "
                                                      "coordination messages"),
                      team_answer_role: str | None = TEAM_ANSWER_ROLE) -> torch.Tensor:
    """The simplified joint reward of CTDE multi-agent GRPO (LLM cooperation as a Dec-POMDP, centralised
    training with decentralised execution; seed 000-09), for the ``team`` rollout::

        R_joint = w_q R  -  w_s (turns of the team episode)  -  w_c (coordination characters / 100)

    ``R`` is the team's task reward (shared by every role with ``team_reward: cooperative``), turns count every
    role's turns, coordination characters every message but the answer role's final one
    (:func:`ctde_costs`, read from the column ``team_transcript``). Every role of a team episode gets the same
    ``R_joint`` (the global signal of centralised training); each role still acts on its own observation
    (decentralised execution: the team rollout). NaN rows stay NaN.

    Provenance: reconstructed from the abstract — the abstract names a "simplified joint reward that balances task
    quality, speed, and coordination cost" and GRPO with global signals under CTDE; the paper and its code were
    not located (searched: the code corpus for CTDE multi-agent GRPO); the linear form, the two counts and the
    weights are grpolab's choices.
    """
    transcripts = data_column(batch.columns, "team_transcript", "ctde_joint_reward", "rollout_strategy team")
    cost = torch.tensor([ctde_speed_weight * t + ctde_cost_weight * c / 100.0
                         for t, c in (ctde_costs(tr, team_answer_role) for tr in transcripts)],
                        dtype=rewards.dtype)
    return ctde_quality_weight * rewards - cost


# ------------------------------------------------------------------------------------ LM programs (mmGRPO)

LM_PROGRAM_FAILURE_KEY = "lm_program_failure"  # row_data key the lm_program rollout (rollouts/lm_program.py) writes


@REWARD_TRANSFORMS.register("lm_program_failures")
def lm_program_failures(rewards: torch.Tensor, batch) -> torch.Tensor:
    """The failure scores of the ``lm_program`` rollout: a call of a run whose program raised gets its fixed
    score, every other call keeps its reward::

        r_i' = f_i  if the run of call i failed (f_i = lm_program_format_failure_score after a FormatFailure,
                    lm_program_failure_score after another exception with lm_program_on_error: score)
        r_i' = r_i  otherwise

    ``f_i`` is ``batch.row_data['lm_program_failure']`` (NaN: the run did not fail), written by the rollout;
    the transform must come last, so no other transform changes a failure score.

    Provenance: authors' code — https://github.com/stanfordnlp/dspy dspy/teleprompt/bootstrap_trace.py
    (bootstrap_trace_data: a FailedPrediction scores its format_reward or format_failure_score) and
    dspy/teleprompt/grpo.py (GRPO: failure_score 0, format_failure_score -1, failure_score > format_failure_score);
    notes: the scores are set on the combined reward of every call of the failed run. Test:
    tests/test_lm_program.py::test_interrupted_and_format_failed_runs.
    """
    fixed = batch.row_data.get(LM_PROGRAM_FAILURE_KEY) if batch is not None else None
    if fixed is None:
        raise ValueError("lm_program_failures: the batch has no row_data['lm_program_failure']; this transform "
                         "goes with rollout_strategy: lm_program")
    fixed = fixed.to(rewards.dtype)
    return torch.where(torch.isnan(fixed), rewards, fixed)
