"""Length and brevity transforms: DAPO's overlong penalty, GRPO-LEAD's length-dependent accuracy, LC-R1's
length reward, GCPO's (GeometryZero's) length reward, the Thinkless mode reward (the short mode preferred at
equal correctness) and Open-RS's cosine length-scaled reward."""
from __future__ import annotations

import math

import torch

from ...data import completion_text
from ...registry import REWARD_TRANSFORMS, param
from .common import CORRECT_REWARD, CORRECT_THRESHOLD, _groups, _texts, correct_rows


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
