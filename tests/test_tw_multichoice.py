"""TW-GRPO (seed 000-95): the multi-choice soft reward, question-answer inversion and the ``multichoice`` task."""
import random
import re

import pytest

from grpolab.tasks.multichoice import (choice_set, exact_choice_score, invert_choices, mc_soft_reward,
                                    soft_choice_score, think_answer_format)
from grpolab.rewards.scoring import parse_reward_spec
from grpolab.tasks import get_task


def authors_rule(content: str, sol: str) -> float:
    """The string-matching branch of the authors' accuracy_reward (src/open_r1/grpo.py), re-derived in plain
    python: the first <answer> tag (else the whole text), spaces removed, comma split, subset -> |P| / |K|."""
    s = re.search(r"<answer>(.*?)</answer>", sol, re.DOTALL)
    gold = s.group(1).strip() if s else sol.strip()
    c = re.search(r"<answer>(.*?)</answer>", content, re.DOTALL)
    pred = c.group(1).strip() if c else content.strip()
    g = set(o.strip() for o in gold.replace(" ", "").split(","))
    p = set(o.strip() for o in pred.replace(" ", "").split(","))
    return len(p) / len(g) if p.issubset(g) else 0.0


# (reply, key, expected by hand)
CASES = [
    ("<think>x</think><answer>A</answer>", "A,C", 0.5),       # 1 of 2 right, no wrong pick: 1/2
    ("<think>x</think><answer>A,C</answer>", "A,C", 1.0),     # the whole key
    ("<answer>C, A</answer>", "A,C", 1.0),                    # order and spaces do not matter
    ("<answer>A,B</answer>", "A,C", 0.0),                     # one wrong pick: nothing
    ("<answer>A,C,D</answer>", "A,C", 0.0),                   # a superset is a wrong pick too
    ("<answer></answer>", "A,C", 0.0),                        # the empty choice {""} is in no key
    ("A", "A,C", 0.5),                                        # no tag: the whole reply is the answer
    ("<answer>D</answer>", "B,C,D", 1 / 3),                   # 1 of 3
    ("<answer>B,D</answer>", "<answer>B,C,D</answer>", 2 / 3),  # the key may carry the tags too
    ("<answer>A,A</answer>", "A,C", 0.5),                     # a repeated letter counts once
    ("<answer>A</answer> then <answer>A,C</answer>", "A,C", 0.5),  # the first tag is the answer
    ("<answer>a</answer>", "A", 0.0),                         # letters compared as written
    ("<answer>B</answer>", "B", 1.0),                         # single choice: right
    ("<answer>C</answer>", "B", 0.0),                         # single choice: wrong
]


def test_soft_score_matches_authors_rule():
    for reply, key, want in CASES:
        assert soft_choice_score(reply, key) == pytest.approx(want), (reply, key)
        assert authors_rule(reply, key) == pytest.approx(want), (reply, key)  # the hand values are the authors'
    assert choice_set("<answer> A , C </answer>") == {"A", "C"}


def test_exact_score_is_the_soft_score_at_one():
    for reply, key, want in CASES:
        assert exact_choice_score(reply, key) == (1.0 if want == 1.0 else 0.0), (reply, key)
    # the soft score differs from the binary one exactly on the partial-credit cases
    partial = [(r, k) for r, k, w in CASES if 0 < w < 1]
    assert len(partial) == 6 and all(exact_choice_score(r, k) == 0.0 for r, k in partial)


def test_soft_reward_function_and_spec():
    comps = [[{"role": "assistant", "content": "<answer>A</answer>"}], "<answer>B,C</answer>", "<answer>D</answer>"]
    assert mc_soft_reward(completions=comps, answer=["A,C", "B,C,D", "A"]) == pytest.approx([0.5, 2 / 3, 0.0])
    fn = parse_reward_spec("tw_mc_soft=2").fn
    assert parse_reward_spec("tw_mc_soft=2").weight == 2.0
    assert fn(prompts=["p", "p"], completions=comps[1:], answer=["B,C,D", "D"]) == pytest.approx([2 / 3, 1.0])
    with pytest.raises(ValueError, match="tw_answer_column"):
        fn(prompts=["p"], completions=comps[:1], key=["A"])


def test_think_answer_format():
    texts = ["<think>a</think> <answer>A</answer>", "<think>a</think><answer>A</answer> extra",
             "<answer>A</answer>", "<think>a</think><think>b</think><answer>A</answer>",
             "<think>a</think>\n<answer>A,B</answer>\n"]
    assert think_answer_format(completions=texts) == [1.0, 0.0, 0.0, 0.0, 1.0]


def test_inversion_keeps_all_wrong_options():
    opts = ["12", "11", "13", "15"]  # "12" right (A)
    new, key = invert_choices(opts, "A", random.Random(0), num_keep=3)
    assert sorted(new) == sorted(opts)
    letters = key.split(",")
    assert len(letters) == 3 and new["ABCD".index(next(c for c in "ABCD" if c not in letters))] == "12"
    assert all(new["ABCD".index(c)] != "12" for c in letters)
    new1, key1 = invert_choices(opts, "A", random.Random(1), num_keep=1)
    assert len(new1) == 2 and "12" in new1 and len(key1) == 1 and new1["AB".index(key1)] != "12"


def test_inversion_random_drop_draws_every_count():
    opts, counts = ["a", "b", "c", "d"], set()  # "c" right
    for seed in range(60):
        new, key = invert_choices(opts, "C", random.Random(seed))
        letters = key.split(",")
        counts.add(len(letters))
        assert len(new) == len(letters) + 1 and "c" in new and new.index("c") not in ["ABCD".index(c) for c in letters]
        assert set(new) <= set(opts)
        # the inverted question's soft reward: every kept option is full credit, the old right one is no credit
        assert soft_choice_score(f"<answer>{key}</answer>", key) == 1.0
        assert soft_choice_score(f"<answer>{'ABCD'[new.index('c')]}</answer>", key) == 0.0
    assert counts == {1, 2, 3}  # the authors' random drop: 1..n-1 kept


def test_inversion_rejects_multi_answer_rows():
    with pytest.raises(ValueError, match="single-choice"):
        invert_choices(["a", "b", "c"], "A,B", random.Random(0))
    with pytest.raises(ValueError, match="num_keep"):
        invert_choices(["a", "b", "c"], "A", random.Random(0), num_keep=3)


def _value(expr: str) -> int:
    a, op, b = expr.split()
    return int(a) + int(b) if op == "+" else int(a) - int(b)


def test_multichoice_task_rows_and_split():
    t = get_task("multichoice")
    rows = t.train_rows + t.eval_rows
    assert len(rows) == 31 * 31 * 2 and len(t.eval_rows) == 200
    assert not {r["expression"] for r in t.train_rows} & {r["expression"] for r in t.eval_rows}
    inverted = sum(r["inverted"] for r in rows)
    assert 0.45 * len(rows) < inverted < 0.55 * len(rows)  # multichoice_invert 0.5
    for r in rows:
        v, letters = str(_value(r["expression"])), r["answer"].split(",")
        idx = ["ABCD".index(c) for c in letters]
        assert len(set(r["options"])) == len(r["options"])
        if r["inverted"]:
            assert "NOT" in r["question"] and 2 <= len(r["options"]) <= 4 and len(letters) == len(r["options"]) - 1
            assert all(r["options"][i] != v for i in idx) and v in r["options"]
        else:
            assert len(r["options"]) == 4 and len(idx) == 1 and r["options"][idx[0]] == v
        assert r["question"] in r["prompt"][-1]["content"]
    again = get_task("multichoice")
    assert [r["answer"] for r in again.train_rows[:50]] == [r["answer"] for r in t.train_rows[:50]]


def test_multichoice_options():
    none = get_task("multichoice", multichoice_invert=0.0)
    assert not any(r["inverted"] for r in none.train_rows)
    every = get_task("multichoice", multichoice_invert=1.0)
    assert all(r["inverted"] for r in every.train_rows)
    soft, binary = get_task("multichoice"), get_task("multichoice", multichoice_soft=False)
    acc_soft, acc_bin = dict((n, f) for n, f, _ in soft.rewards)["accuracy"], dict(
        (n, f) for n, f, _ in binary.rewards)["accuracy"]
    assert acc_soft(completions=["<answer>A</answer>"], answer=["A,C"]) == [0.5]
    assert acc_bin(completions=["<answer>A</answer>"], answer=["A,C"]) == [0.0]
    with pytest.raises(ValueError, match="multichoice_invert"):
        get_task("multichoice", multichoice_invert=1.5)
