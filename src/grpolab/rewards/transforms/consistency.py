"""Paraphrase-set consistency: PS-GRPO's group similarity reward (and a final-answer entropy variant), and the
entropy-based helpfulness and stability rewards of information-consistency GRPO. A paraphrase set is the rows
whose data column ``paraphrase_group_column`` holds the same value (one prompt per wording)."""
from __future__ import annotations

import math
import re

import torch

from ...errors import ConfigError, warn_fallback
from ...registry import REWARD_TRANSFORMS, param
from ..agentic import data_column
from .common import _row_seed, _texts


# ---------------------------------------------------------------- paraphrase-set consistency (000-77, 000-30)

PARAPHRASE_GROUP_COLUMN = param('paraphrase_group', "paraphrase consistency: data column naming each row's "
                                                    "paraphrase set")
PARAPHRASE_MODES = ("agreement", "entropy")
PARAPHRASE_SIMILARITIES = ("answer", "bleu")


def _final_answer(text: str, pattern: re.Pattern) -> str | None:
    from ..answers import last_boxed
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


# the parameters of paraphrase_consistency (PARAPHRASE_GROUP_COLUMN is information_consistency's too)
PARAPHRASE_WEIGHT = param(0.5, 'paraphrase consistency: weight of the consistency reward')
PARAPHRASE_MODE = param('agreement', 'paraphrase consistency: PS-GRPO group similarity with the other paraphrases '
                        "(agreement) or grpolab's 1 - normalised final-answer entropy over the set (entropy)",
                        list(PARAPHRASE_MODES))
PARAPHRASE_SIMILARITY = param('answer', 'paraphrase consistency (agreement): sim of two outputs: final-answer '
                              'equality (answer) or sentence BLEU of the free-form texts (bleu, PS-GRPO)',
                              list(PARAPHRASE_SIMILARITIES))
PARAPHRASE_BLEU_ORDER = param(2, "paraphrase consistency (bleu): BLEU-N order (the paper's ablation found BLEU-1/2 "
                                 "best)")
PARAPHRASE_BLEU_SMOOTHING = param('none', 'paraphrase consistency (bleu): none, or add_one for n >= 2 (BLEU+1)',
                                  ['none', 'add_one'])
PARAPHRASE_SAMPLE_PARAPHRASES = param(0, 'paraphrase consistency (agreement): PS-GRPO approximation: other '
                                         'paraphrases drawn per output, kappa (0 = all)')
PARAPHRASE_SAMPLE_ROLLOUTS = param(0, 'paraphrase consistency (agreement): PS-GRPO approximation: outputs drawn per '
                                      'drawn paraphrase, s (0 = all)')
PARAPHRASE_ANSWER_PATTERN = param('Answer:\\s*([^\\n]+)', 'paraphrase consistency: regex whose first group (last '
                                  'match) is the final answer when there is no \\boxed{}')


def _check_paraphrase_options(mode: str, similarity: str, sample_paraphrases: int, sample_rollouts: int) -> None:
    """paraphrase_consistency's settings, checked before anything is computed."""
    if mode not in PARAPHRASE_MODES:
        raise ConfigError(f"paraphrase_mode: expected one of {', '.join(PARAPHRASE_MODES)}, got '{mode}'")
    if similarity not in PARAPHRASE_SIMILARITIES:
        raise ConfigError(f"paraphrase_similarity: expected one of {', '.join(PARAPHRASE_SIMILARITIES)}, got "
                          f"'{similarity}'")
    if sample_paraphrases < 0 or sample_rollouts < 0:
        raise ConfigError(f"paraphrase_sample_paraphrases / paraphrase_sample_rollouts: expected >= 0 (0 = all), "
                          f"got {sample_paraphrases} / {sample_rollouts}")


def _similarity(kind: str, texts: list[str], answers: list, bleu_order: int, bleu_smoothing: str):
    """``sim(i, j)`` of two rows: the sentence BLEU of their texts, row ``i`` the hypothesis (``bleu``), or 1.0 when
    their final answers are both present and equal under ``math_equal``, else 0.0 (``answer``)."""
    from ..answers import math_equal
    from ...tasks.text_similarity import sentence_bleu

    if kind == "bleu":
        def sim(i, j):
            return sentence_bleu(texts[i], texts[j], bleu_order, bleu_smoothing)
    else:
        def sim(i, j):
            return float(answers[i] is not None and answers[j] is not None and math_equal(answers[i], answers[j]))
    return sim


def _agreement(n_rows: int, members: dict, uids: list[int], sim, seed: int, step: int, paraphrases: int,
               rollouts: int) -> torch.Tensor:
    """``[n_rows]``: each row's :func:`group_similarity` within its paraphrase set (``paraphrase_mode:
    agreement``); the subsampling draws are seeded by (``seed``, ``step``, the row's prompt uid, its occurrence
    among that uid's rows)."""
    c = torch.zeros(n_rows, dtype=torch.float64)
    seen: dict[int, int] = {}
    for rows in members.values():
        for i in rows:
            k = seen.get(uids[i], 0)
            seen[uids[i]] = k + 1
            gen = torch.Generator().manual_seed(_row_seed(int(seed) + 0x9A5E, int(step), int(uids[i]), k))
            c[i] = group_similarity(i, rows, uids, sim, paraphrases=paraphrases, rollouts=rollouts, generator=gen)
    return c


def _answer_entropy(n_rows: int, members: dict, answers: list) -> torch.Tensor:
    """``[n_rows]``: ``1 - H / log(n)`` on every row of each paraphrase set of ``n >= 2`` rows, ``H`` the entropy of
    the set's final answers (classes by ``math_equal``, a missing answer its own class); 0 elsewhere
    (``paraphrase_mode: entropy``)."""
    from ..answers import math_equal

    c = torch.zeros(n_rows, dtype=torch.float64)
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
    return c


@REWARD_TRANSFORMS.register("paraphrase_consistency", needs=("text",))
def paraphrase_consistency(rewards: torch.Tensor, prompt_uids: torch.Tensor, batch, step: int = 0, *,
                           seed: int = 0, paraphrase_weight: float = PARAPHRASE_WEIGHT,
                           paraphrase_mode: str = PARAPHRASE_MODE, paraphrase_similarity: str = PARAPHRASE_SIMILARITY,
                           paraphrase_bleu_order: int = PARAPHRASE_BLEU_ORDER,
                           paraphrase_bleu_smoothing: str = PARAPHRASE_BLEU_SMOOTHING,
                           paraphrase_sample_paraphrases: int = PARAPHRASE_SAMPLE_PARAPHRASES,
                           paraphrase_sample_rollouts: int = PARAPHRASE_SAMPLE_ROLLOUTS,
                           paraphrase_group_column: str = PARAPHRASE_GROUP_COLUMN,
                           paraphrase_answer_pattern: str = PARAPHRASE_ANSWER_PATTERN) -> torch.Tensor:
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
    _check_paraphrase_options(paraphrase_mode, paraphrase_similarity, paraphrase_sample_paraphrases,
                              paraphrase_sample_rollouts)
    members = paraphrase_sets(batch, prompt_uids, paraphrase_group_column, "paraphrase_consistency",
                              "paraphrase_group_column")
    texts = _texts(batch)
    pat = re.compile(paraphrase_answer_pattern)
    answers = [_final_answer(t, pat) for t in texts]
    if paraphrase_mode == "agreement":
        sim = _similarity(paraphrase_similarity, texts, answers, paraphrase_bleu_order, paraphrase_bleu_smoothing)
        c = _agreement(len(rewards), members, prompt_uids.tolist(), sim, seed, step, paraphrase_sample_paraphrases,
                       paraphrase_sample_rollouts)
    else:
        c = _answer_entropy(len(rewards), members, answers)
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
    from ...tasks.text_similarity import word_entropy

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
