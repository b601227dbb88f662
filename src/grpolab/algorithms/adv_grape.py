"""GRAPE's generalised relative advantage (Patel, 2025, arXiv:2509.04501; seed 000-46)."""
from __future__ import annotations

import torch

from ..errors import ConfigError
from ..registry import param
from .advantages import ADVANTAGES, group_stats


def _check(name: str, value: str, valid: tuple[str, ...]) -> None:
    if value not in valid:
        raise ConfigError(f"{name} must be one of {', '.join(valid)}; got {value!r}")


@ADVANTAGES.register("grape", min_group_size=2)
def grape(rewards: torch.Tensor, group_ids: torch.Tensor, reward_matrix: torch.Tensor, reward_weights: torch.Tensor,
          confidence: torch.Tensor | None = None, batch=None, *,
          grape_rubric: list = param([], "GRAPE: rubric items scored per completion by grape_critic (with a "
                                     "confidence per item), replacing the reward columns as the items; empty: the "
                                     "reward columns are the items, confidence 1"),
          grape_rubric_weights: list = param([], "GRAPE: one weight per grape_rubric item (empty: 1 each)"),
          grape_critic: str = param("rules", "GRAPE: the critic that scores grape_rubric: 'rules' (the arithmetic "
                                    "replies' rule critic: items answer_correct, answer_format, concise) or "
                                    "'judge:PATH' / 'judge:tiny' / 'judge:smollm2' (a yes/no LM judge per item; "
                                    "confidence = its probability of its verdict)"),
          grape_baseline: str = param("mean", "GRAPE: the group baseline each response is compared with: 'mean' "
                                      "(the group's mean reward, GRPO) or 'leave_one_out' (the mean of the other "
                                      "responses to the same prompt)", choices=["mean", "leave_one_out"]),
          grape_scale: str = param("std", "GRAPE: divide the relative reward by the group's std ('std', GRPO) "
                                   "or not ('none')", choices=["std", "none"]),
          advantage_epsilon: float = 1e-4) -> torch.Tensor:
    """GRAPE generalised relative advantage: rubric items, confidence-weighted, compared within the group.

    Each reward column ``k`` is one rubric item (``s_ik``, the score of response ``i`` on item ``k``), weighted by
    the rubric's weight ``w_k`` (``reward_weights``) and by the critic's average confidence on that item over the
    group's responses, ``cbar_gk = mean_{j in g} c_jk`` (``confidence [R, K]``; all ones when not given, as in
    the pipeline, where no critic reports a confidence)::

        R_i = sum_{k scored} w_k cbar_{g(i)k} s_ik
        A_i = (R_i - b_i) / (std_g(R) + epsilon)     grape_scale = "std"
        A_i =  R_i - b_i                             grape_scale = "none"
        b_i = mean_g(R)  (grape_baseline = "mean")   or   (sum_{j in g} R_j - R_i) / (n_g - 1)  ("leave_one_out")

    Rubrics and critic confidences (``grape_rubric``): the items are text criteria and a critic
    (``grape_critic``, ``rewards/rubric.py``) returns each completion's score ``s_ik`` and its confidence
    ``c_ik`` per item, which replace the reward columns and the all-ones confidence above, with ``w_k`` =
    ``grape_rubric_weights``; the run's rewards are then only logged and evaluated. The ``rules`` critic scores
    the arithmetic tasks' replies (its confidence falls to 0.5 on ``answer_correct`` when the reply has no
    ``Answer:`` and the critic guesses its last integer); ``judge:...`` asks an LM judge one yes/no question per
    item, ``s = 1[P(yes) >= 0.5]``, ``c = max(P(yes), 1 - P(yes))``.

    With one reward column, weight 1 and no confidence, ``mean`` and ``std`` give exactly ``group_zscore`` (GRPO
    is the special case of GRAPE whose "rubric" is a single score), and ``leave_one_out`` with ``none`` gives
    RLOO's ``leave_one_out``. Unscorable items (NaN) are left out of the sum (a row with every item unscorable
    is unscorable) and out of the confidence means; unscorable rows and one-row groups get 0; ``std_g`` is the
    Bessel-corrected std of the group's scored rows, as in ``group_zscore``.

    Provenance: reconstructed from the abstract — the abstract only names GRAPE (Generalized Relative Advantage
    Policy Evolution) as research ideas; the rubric items as reward columns, the weighting of each item by the
    critic's mean confidence over the group's samples and the advantage relative to the other responses of the
    same prompt follow a secondary summary of the paper's GRAPE section (B. Bessi, "From PPO to GRAPE", 2025),
    not the paper's equations; grape_baseline and grape_scale are grpolab's options spanning its "relative to
    the average of the other responses" and GRPO's z-score. The critics are grpolab's: a rule critic for the
    built-in arithmetic task and a yes/no LM judge per item whose confidence is the probability of its verdict
    (the paper's critic model and how it reports confidence are not in the abstract). Not built: the paper's
    category-specific rubrics and the automated pipeline that writes rubrics per prompt category.
    Test: tests/test_control_theory.py::test_grape_special_cases, tests/test_control_theory.py::test_grape_hand_values,
    tests/test_grape_rubric.py::test_grape_rubric_advantage_by_hand.
    """
    del rewards  # recomputed from the rubric items with the confidence weights
    _check("grape_baseline", grape_baseline, ("mean", "leave_one_out"))
    _check("grape_scale", grape_scale, ("std", "none"))
    if grape_rubric:
        reward_matrix, reward_weights, confidence = rubric_scores(batch, list(grape_rubric),
                                                                  list(grape_rubric_weights), grape_critic)
    scored = ~torch.isnan(reward_matrix)
    w = reward_weights.to(reward_matrix.dtype)
    if confidence is None:
        cbar = torch.ones_like(reward_matrix)
    else:
        conf = torch.where(scored, confidence.to(reward_matrix.dtype), torch.nan)
        cbar = torch.stack([group_stats(conf[:, k], group_ids)[0] for k in range(conf.shape[1])], dim=1)
        cbar = torch.nan_to_num(cbar, nan=0.0)
    total = (torch.where(scored, reward_matrix, 0.0) * cbar * w).sum(-1)
    R = torch.where(scored.any(-1), total, torch.full_like(total, float("nan")))
    mean, std, count = group_stats(R, group_ids)
    if grape_baseline == "mean":
        rel = R - mean
    else:
        rel = (R - mean) * count / (count - 1)   # R_i - (n mean - R_i) / (n - 1); NaN (-> 0) for one-row groups
    adv = rel / (std + advantage_epsilon) if grape_scale == "std" else rel
    return torch.nan_to_num(adv, nan=0.0, posinf=0.0, neginf=0.0)


def rubric_scores(batch, items: list, weights: list, critic: str):
    """``(scores [R, K], weights [K], confidences [R, K])`` of ``batch``'s completions on the rubric ``items``
    from the critic ``critic`` (``rewards/rubric.py``)."""
    from ..registry import RUBRIC_CRITICS
    get_critic = RUBRIC_CRITICS["get"]  # rewards/rubric.py
    if weights and len(weights) != len(items):
        raise ConfigError(f"grape_rubric_weights: {len(weights)} weights for {len(items)} grape_rubric items; give "
                          f"one per item (or none: 1 each)")
    if batch is None or "completion" not in batch.columns:
        raise ConfigError("grape_rubric: the critic reads each row's prompt and completion text, which this "
                          "policy's batches do not have (a text policy is needed)")
    cols = batch.columns
    scores, confs = get_critic(critic, items)(cols.get("prompt"), cols["completion"], answer=cols.get("answer"))
    w = torch.tensor([float(x) for x in weights] if weights else [1.0] * len(items))
    return (torch.tensor(scores, dtype=torch.float32), w, torch.tensor(confs, dtype=torch.float32))
