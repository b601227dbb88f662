"""SGPO (000-49): the step-judge credit column (sgpo_judge), the all-negative-group transform
(sgpo_negative_credit), strict parsing of the judge's reply, the recipe and a smoke run."""
import re

import pytest
import torch

from grpolab.algorithms.advantages import combine_rewards, group_zscore
from grpolab.rewards.step_judge import SGPOStepJudge, parse_step_verdict, sgpo_judge_text, step_credit
from grpolab.rewards.transforms import sgpo_negative_credit

STEP = re.compile(r"^(\d+)\. (-?\d+) ([-+*]) (-?\d+) = (-?\d+)$")


def checker_judge(texts):
    """A stub judge that really checks each numbered step ``a op b = c`` and names the first wrong one."""
    seen = checker_judge.seen = list(texts)
    out = []
    for t in seen:
        reply = "First error: none"
        for line in t.splitlines():
            m = STEP.match(line)
            if m:
                n, a, op, b, c = m.groups()
                if {"+": int(a) + int(b), "-": int(a) - int(b), "*": int(a) * int(b)}[op] != int(c):
                    reply = f"First error: step {n}"
                    break
        out.append(reply)
    return out


def test_parse_step_verdict_is_strict():
    assert parse_step_verdict("First error: step 2", 3) == 1
    assert parse_step_verdict("  first ERROR:  Step 3.\nbecause ...", 3) == 2  # first line, case and spaces free
    assert parse_step_verdict("First error: none", 4) == 4
    assert parse_step_verdict("\n\nFirst error: step 1", 2) == 0  # the first non-empty line
    for bad in ("First error: step 4", "First error: step 0", "the second step", "First error: step 2 and 3",
                "Error: step 1", "", "First error: step two"):
        assert parse_step_verdict(bad, 3) is None, bad
    assert step_credit("First error: step 3", 4) == 0.4  # 2 of 4 steps + the wrong answer right: 2 / 5
    assert step_credit("nonsense", 4) is None


def test_step_credit_column_with_stub_judge():
    """Prompt A: every completion wrong; prompt B: one right. Credit k / (K + 1) (the wrong answer is the last
    step). Hand values: a1 first error at step 2 of 2 -> 1/3; a2 at step 1 -> 0; a3 three right steps, wrong
    answer ('none') -> 3/4; a4 no step -> 0 without a call; a5 error at step 3 of 3 -> 2/4. b1 right -> 1; b2
    wrong but its prompt is solved -> 0, not judged."""
    pa, pb = [{"role": "user", "content": "A"}], [{"role": "user", "content": "B"}]
    comps = ["3 + 4 = 7\n7 * 2 = 15\nAnswer: 15", "3 + 4 = 8\n8 * 2 = 16\nAnswer: 16",
             "3 + 4 = 7\n7 * 2 = 14\n14 - 1 = 13\nAnswer: 13", "Answer: 5",
             "3 + 4 = 7\n7 * 2 = 14\n14 * 2 = 27\nAnswer: 27", "Answer: 5", "2 + 2 = 5\nAnswer: 6"]
    prompts = [pa] * 5 + [pb] * 2
    answers = ["14"] * 5 + ["5"] * 2
    col = SGPOStepJudge(checker_judge)(prompts=prompts, completions=comps, answer=answers)
    assert col == pytest.approx([1 / 3, 0.0, 0.75, 0.0, 0.5, 1.0, 0.0])
    assert len(checker_judge.seen) == 4  # a1, a2, a3, a5
    assert checker_judge.seen[0] == ("Problem: A\nSteps:\n1. 3 + 4 = 7\n2. 7 * 2 = 15\nFind the first incorrect "
                                     "step. Reply with one line: \"First error: step N\" (N from 1 to 2) or "
                                     "\"First error: none\".\n")
    assert sgpo_judge_text("A", ["x"]).endswith("(N from 1 to 1) or \"First error: none\".\n")
    # with only_unsolved off, b2 is judged too (its step 2 + 2 = 5 is wrong: 0 of 1 -> 0)
    SGPOStepJudge(checker_judge, sgpo_judge_only_unsolved=False)(prompts=prompts, completions=comps,
                                                                 answer=answers)
    assert len(checker_judge.seen) == 5
    # an unparseable reply is unscorable (None): the row shows in rewards/sgpo_judge/unscorable
    col = SGPOStepJudge(lambda texts: ["I think step two"] * len(texts))(prompts=prompts, completions=comps,
                                                                          answer=answers)
    assert col == [None, None, None, 0.0, None, 1.0, 0.0]
    with pytest.raises(ValueError, match="replies"):
        SGPOStepJudge(lambda texts: [])(prompts=prompts, completions=comps, answer=answers)


def test_all_negative_group_gets_ordered_advantages():
    """Group 0 is all wrong (accuracy 0, format 1): scalar 0.5 each, GRPO advantages all 0. Credits 0.5, 0, 0.75,
    unparseable (NaN -> +0); lambda = 0.5: rewards 0.75, 0.5, 0.875, 0.5; mean 0.65625; deviations 0.09375,
    -0.15625, 0.21875, -0.15625; squares 0.0087891, 0.0244141, 0.0478516, 0.0244141, sum 0.1054688, / 3 =
    0.0351563, std 0.1875; A = dev / (0.1875 + 1e-4) = 0.49973, -0.83289, 1.16604, -0.83289."""
    names = ["accuracy", "format", "sgpo_judge"]
    nan = float("nan")
    R = torch.tensor([[0., 1., 0.5], [0., 1., 0.0], [0., 1., 0.75], [0., 1., nan]])
    gid = torch.zeros(4, dtype=torch.long)
    base = combine_rewards(R, torch.tensor([1.0, 0.5, 0.0]))
    assert base.tolist() == [0.5] * 4
    assert group_zscore(base, gid).abs().max() == 0  # the GRPO stall
    shaped = sgpo_negative_credit(base, gid, R, names, sgpo_credit_scale=0.5)
    assert shaped.tolist() == [0.75, 0.5, 0.875, 0.5]
    adv = group_zscore(shaped, gid)
    assert adv.tolist() == pytest.approx([0.49973, -0.83289, 1.16604, -0.83289], abs=1e-4)
    assert adv[2] > adv[0] > adv[1] == adv[3]


def test_group_with_a_right_answer_is_unchanged():
    names = ["accuracy", "format", "sgpo_judge"]
    R = torch.tensor([[1., 1., 1.0], [0., 1., 0.7], [0., 0., 0.2],   # group 0: one right answer
                      [0., 1., 0.25], [0., 1., 0.75]])                # group 1: all wrong
    gid = torch.tensor([0, 0, 0, 1, 1])
    base = combine_rewards(R, torch.tensor([1.0, 0.5, 0.0]))  # 1.5, 0.5, 0, 0.5, 0.5
    shaped = sgpo_negative_credit(base, gid, R, names, sgpo_credit_scale=0.5)
    assert shaped[:3].tolist() == base[:3].tolist()
    assert shaped[3:].tolist() == [0.5 + 0.125, 0.5 + 0.375]
    with pytest.raises(ValueError, match="sgpo_judge_column"):
        sgpo_negative_credit(base, gid, R[:, :2], names[:2])


def test_spec_parses_judge_and_weight(tmp_path):
    from grpolab.rewards import parse_reward_spec
    (tmp_path / "stub_judge.py").write_text("def judge(texts):\n    return ['First error: none'] * len(texts)\n")
    spec = parse_reward_spec(f"sgpo_judge:{tmp_path / 'stub_judge.py'}:judge=0")
    assert spec.name == "sgpo_judge" and spec.weight == 0.0
    assert spec.fn(prompts=["p"], completions=["1 + 1 = 3\nAnswer: 3"], answer=["2"]) == [0.5]  # 'none': 1 / 2
    with pytest.raises(ValueError, match="sgpo_judge"):
        parse_reward_spec("sgpo_judge:nojudge")


def test_tiny_model_judge_replies_are_parsed_strictly():
    """A random-init judge writes garbage: every judged row is unscorable, none crashes."""
    fn = SGPOStepJudge("tiny", sgpo_judge_max_new_tokens=6, sgpo_judge_only_unsolved=False)
    col = fn(prompts=["1 + 2"] * 3, completions=["1 + 2 = 4\nAnswer: 4", "1 + 2 = 5\nAnswer: 5", "Answer: 3"],
             answer=["3"] * 3)
    assert len(fn.last_replies) == 2 and col[2] == 1.0
    assert all(r.startswith("First error:") for r in fn.last_replies)  # the prefill starts every reply
    assert all(c is None or 0.0 <= c <= 1.0 for c in col[:2])


def test_sgpo_recipe_smoke(tiny_args):
    from grpolab.config import Config
    from grpolab.recipes import recipe_overrides
    from grpolab.train.trainer import Trainer

    rec = recipe_overrides("sgpo")
    assert rec["reward_transforms"] == ["sgpo_negative_credit"] and rec["reward"] == ["sgpo_judge:self=0"]
    args = {**tiny_args, **rec, "steps": 2, "prompts_per_step": 2, "num_generations": 3,
            "max_completion_length": 8, "sgpo_judge_max_new_tokens": 4}
    t = Trainer(Config.build(args), log=lambda *a: None)
    t.train(progress=False)
    from grpolab.train.metrics import read_metrics
    rows = read_metrics(t.out)
    assert len(rows) == 2 and "rewards/sgpo_judge/unscorable" in rows[-1]
