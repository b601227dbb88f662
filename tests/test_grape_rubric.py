"""GRAPE (seed 000-46) with rubrics and critic confidences on text (rewards/rubric.py, advantage grape).

Expected numbers are worked out by hand in the comments, never by calling grpolab's advantage code.
"""
import math

import pytest
import torch

from grpolab.algorithms.adv_grape import grape
from grpolab.batch import RolloutBatch
from grpolab.errors import ConfigError
from grpolab.rewards.judge import JudgeReward
from grpolab.rewards.rubric import JUDGE_QUESTION, RuleCritic, get_critic

ITEMS = ["answer_correct", "answer_format", "concise"]
REPLIES = ["Answer: -4",                   # correct (1, conf 1), format 1, concise 1
           "1 - 5 = -4",                   # no 'Answer:': the critic guesses the last integer -4: (1, conf 0.5)
           "I think 7",                    # guess 7: wrong (0, conf 0.5)
           "no idea",                      # no integer at all: surely wrong (0, conf 1)
           "Let me think about this carefully. Answer: 3"]  # 44 characters: not concise; wrong, well formatted


def _batch(completions, answers):
    b = RolloutBatch.__new__(RolloutBatch)
    b.columns = {"prompt": ["Compute 1 - 5."] * len(completions), "completion": completions, "answer": answers}
    return b


def test_rule_critic_scores_and_confidences_by_hand():
    scores, confs = RuleCritic(ITEMS)(None, REPLIES, answer=["-4"] * 5)
    assert scores == [[1, 1, 1], [1, 0, 1], [0, 0, 1], [0, 0, 1], [0, 1, 0]]
    assert confs == [[1, 1, 1], [0.5, 1, 1], [0.5, 1, 1], [1, 1, 1], [1, 1, 1]]
    with pytest.raises(ConfigError, match="answer_correct, answer_format, concise"):
        RuleCritic(["polite"])
    with pytest.raises(ConfigError, match="'answer' column"):
        RuleCritic(ITEMS)(None, REPLIES, answer=None)


def test_grape_rubric_advantage_by_hand():
    b = _batch(REPLIES[:4], ["-4"] * 4)
    g = torch.zeros(4, dtype=torch.long)
    dummy = torch.zeros(4, 1)  # the run's reward columns: unused when grape_rubric is set
    kw = dict(batch=b, grape_rubric=ITEMS, grape_rubric_weights=[1.0, 0.5, 0.1], grape_critic="rules")
    # mean confidence per item over the group: correct (1 + .5 + .5 + 1) / 4 = 0.75, format 1, concise 1
    # R = 1 * 0.75 * s_correct + 0.5 * s_format + 0.1 * s_concise = [1.35, 0.85, 0.1, 0.1]; mean 0.6
    a = grape(torch.zeros(4), g, dummy, torch.ones(1), grape_scale="none", **kw)
    assert torch.allclose(a, torch.tensor([0.75, 0.25, -0.5, -0.5]), atol=1e-6)
    # std of [0.75, 0.25, -0.5, -0.5] (Bessel) = sqrt(1.125 / 3) = 0.612372 -> 0.75 / (0.612372 + 1e-4) = 1.224545
    a = grape(torch.zeros(4), g, dummy, torch.ones(1), **kw)
    assert torch.allclose(a, torch.tensor([1.224545, 0.408182, -0.816363, -0.816363]), atol=1e-5)
    # leave one out: R_i - (2.4 - R_i) / 3 = [1.0, 0.333333, -0.666667, -0.666667]
    a = grape(torch.zeros(4), g, dummy, torch.ones(1), grape_scale="none", grape_baseline="leave_one_out", **kw)
    assert torch.allclose(a, torch.tensor([1.0, 1 / 3, -2 / 3, -2 / 3]), atol=1e-6)
    # relation: a rubric whose critic is sure of every item (rows 0, 3: confidences all 1) equals grape on the
    # scores as reward columns with no confidence
    b2 = _batch([REPLIES[0], REPLIES[3]], ["-4"] * 2)
    scores = torch.tensor([[1.0, 1.0, 1.0], [0.0, 0.0, 1.0]])
    w = torch.tensor([1.0, 0.5, 0.1])
    g2 = torch.zeros(2, dtype=torch.long)
    assert torch.allclose(grape(torch.zeros(2), g2, dummy[:2], torch.ones(1), **{**kw, "batch": b2}),
                          grape(torch.zeros(2), g2, scores, w))
    with pytest.raises(ConfigError, match="one per item"):
        grape(torch.zeros(4), g, dummy, torch.ones(1), **{**kw, "grape_rubric_weights": [1.0]})
    with pytest.raises(ConfigError, match="grape_critic"):
        grape(torch.zeros(4), g, dummy, torch.ones(1), **{**kw, "grape_critic": "oracle"})


def test_judge_critic_verdict_and_confidence():
    """judge:tiny (random init): per item, score = 1[p >= 0.5] and confidence = max(p, 1 - p) of the judge's
    P(yes) for that item's question (re-asked here with a JudgeReward of its own)."""
    items = ["The reply gives a number.", "The reply is polite."]
    critic = get_critic("judge:tiny", items)
    scores, confs = critic(["Compute 1 - 5."] * 2, ["Answer: -4", "no"])
    for k, item in enumerate(items):
        j = JudgeReward("tiny", judge_question=JUDGE_QUESTION.format(item=item))
        j.model, j.tok, j.yes_id, j.no_id = critic.judge.model, critic.judge.tok, critic.judge.yes_id, critic.judge.no_id
        for i, p in enumerate(j(prompts=["Compute 1 - 5."] * 2, completions=["Answer: -4", "no"])):
            assert scores[i][k] == float(p >= 0.5)
            assert math.isclose(confs[i][k], max(p, 1 - p), rel_tol=1e-6) and 0.5 <= confs[i][k] <= 1.0
