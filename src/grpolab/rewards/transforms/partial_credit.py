"""Credit beyond right / wrong: FGRPR's fuzzy numeric closeness, the unlikeliness reward (a rare correct
sample keeps more of its reward), GCPO's (GeometryZero's) contrastive mask of the auxiliary-construction reward,
BAPO's "I don't know" in a group no completion solves, and E-GRPO's entity matches of wrong answers."""
from __future__ import annotations

import math
import re

import torch

from ...registry import REWARD_TRANSFORMS, param
from ..agentic import data_column
from .common import CORRECT_REWARD, CORRECT_THRESHOLD, _groups, _texts, _to_number, correct_rows


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
                  fuzzy_answer_column: str = param('answer', 'FGRPR: data column with the reference number')
                  ) -> torch.Tensor:
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


# ---------------------------------------------------------------- GCPO-geometry group contrastive masking (000-56)

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
