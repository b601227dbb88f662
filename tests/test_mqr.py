"""Seed 000-05 (MathForge, arXiv:2601.20614): MQR, multi-aspect question reformulation — the built-in
arithmetic reformulator (each aspect keeps the gold answer and changes the question as the aspect says), the
model-driven augmentation with its answer check, `grpolab mqr`, and the dgpo_mathforge recipe on arithmetic_mqr."""
import json
import math
import re
import subprocess
import sys

import pytest

from grpolab.config import Config, ConfigError
from grpolab.recipes import recipe_overrides
from grpolab.tasks import get_task
from grpolab.tasks.mqr import (ASPECT_INSTRUCTIONS, ASPECTS, MARKER, arithmetic_reformulation, judge_prompt, mqr_augment,
                               parse_reformulation, parse_verdict, reformulation_prompt)
from grpolab.train.trainer import Trainer


# ----------------------------------------------------------------------------- the built-in reformulator, by hand

def test_background_keeps_the_expression_and_adds_an_unneeded_number():
    text = arithmetic_reformulation(12, "+", 7, "background")
    assert text == ("Lena has kept bees for 15 years. At the village fair Lena chalks the puzzle 12 + 7 on the "
                    "honey stall's price board. What number does the puzzle on the board equal?")
    # the asked value is the puzzle 12 + 7 = 19; 15 (years) is a number the problem does not need
    text = arithmetic_reformulation(5, "-", 0, "background")
    assert "5 - 0" in text and "day 17" in text  # 5 - 0 = 5; 17 is the unneeded number


def test_term_defines_the_operation_as_a_new_word():
    text = arithmetic_reformulation(30, "-", 25, "term")
    assert text == ("For whole numbers x and y, the brisk of (x, y) is the number reached by starting at x and "
                    "taking y unit steps down the number line. What is the brisk of (30, 25)?")
    # starting at 30 and taking 25 unit steps down: 30 - 25 = 5 (the gold answer); the operator is gone
    assert "30 - 25" not in text
    text = arithmetic_reformulation(17, "+", 29, "term")
    assert "steps up" in text and "of (17, 29)?" in text and "17 + 29" not in text  # 17 + 29 = 46


def test_sub_problem_replaces_the_second_operand_by_a_problem_whose_answer_it_is():
    # number theory: 88 = 9 * 9 + 7, so the remainder is n = 7 and 12 + n = 19 = 12 + 7
    assert arithmetic_reformulation(12, "+", 7, "sub_problem") == \
        "Let n be the remainder when 88 is divided by 9. Compute 12 + n."
    # algebra: 9n + 17 = 242 -> 9n = 225 -> n = 25, and 30 - n = 5 = 30 - 25
    assert arithmetic_reformulation(30, "-", 25, "sub_problem") == \
        "Let n be the solution of 9n + 17 = 242. Compute 30 - n."
    # zero operand: 8n + 1 = 1 -> n = 0, 5 - n = 5
    assert arithmetic_reformulation(5, "-", 0, "sub_problem") == \
        "Let n be the solution of 8n + 1 = 1. Compute 5 - n."
    # 325 = 8 * 37 + 29: n = 29, 17 + n = 46 = 17 + 29
    assert arithmetic_reformulation(17, "+", 29, "sub_problem") == \
        "Let n be the remainder when 325 is divided by 37. Compute 17 + n."


def test_same_inputs_same_text_and_a_bad_aspect_names_the_valid_ones():
    assert arithmetic_reformulation(3, "+", 4, "term", seed=2) == arithmetic_reformulation(3, "+", 4, "term", seed=2)
    with pytest.raises(ConfigError, match="background, term, sub_problem"):
        arithmetic_reformulation(3, "+", 4, "paraphrase")


def solve(text: str) -> int:
    """An independent reader of the three template families (the test's own parsing, not the generator's)."""
    m = re.search(r"the (\S+) of \(x, y\) is the number reached by starting at x and taking y unit steps (up|down)",
                  text)
    if m:
        x, y = map(int, re.search(r"What is the \S+ of \((\d+), (\d+)\)\?", text).groups())
        return x + y if m.group(2) == "up" else x - y
    m = re.search(r"Let n be the solution of (\d+)n \+ (\d+) = (\d+)\.", text)
    if m:
        k, c, r = map(int, m.groups())
        assert (r - c) % k == 0
        n = (r - c) // k
    else:
        m = re.search(r"Let n be the remainder when (\d+) is divided by (\d+)\.", text)
        if m:
            n = int(m.group(1)) % int(m.group(2))
        else:  # background: the one expression a op b in the story
            (a, op, b), = re.findall(r"(\d+) ([+-]) (\d+)", text)
            return int(a) + int(b) if op == "+" else int(a) - int(b)
    a, op = re.search(r"Compute (\d+) ([+-]) n\.", text).groups()
    return int(a) + n if op == "+" else int(a) - n


def test_arithmetic_mqr_task_keeps_every_gold_answer_and_mixes_as_the_authors():
    base, task = get_task("arithmetic"), get_task("arithmetic_mqr")
    n = len(base.train_rows)  # 1722
    # the authors' augmented set: originals + one reformulation per aspect = 4x
    assert len(task.train_rows) == 4 * n
    assert [r["mqr_aspect"] for r in task.train_rows[::n]] == ["original", *ASPECTS]
    assert task.eval_rows == base.eval_rows  # held-out: the original problems only
    for r in task.train_rows:
        src = base.train_rows[r["mqr_source"]]
        assert r["answer"] == src["answer"]
        if r["mqr_aspect"] == "original":
            assert r["prompt"] == src["prompt"]
        else:
            assert r["question"] != src["question"]
            assert solve(r["question"]) == int(src["answer"])  # the gold answer, read back from the text
            assert r["question"] in r["prompt"][-1]["content"]
    only = get_task("arithmetic_mqr", mqr_aspects=["term"])
    assert len(only.train_rows) == 2 * n and {r["mqr_aspect"] for r in only.train_rows} == {"original", "term"}
    with pytest.raises(ConfigError, match="mqr_aspects"):
        get_task("arithmetic_mqr", mqr_aspects=[])


# ----------------------------------------------------------------------------- model-driven augmentation

ROWS = [{"prompt": [{"role": "system", "content": "Solve."}, {"role": "user", "content": "What is 2 + 3?"}],
         "answer": "5", "level": 1},
        {"prompt": "What is 10 - 4?", "answer": "6"}]


def test_prompts_carry_the_aspect_instruction_question_and_answer():
    msg = reformulation_prompt("What is 2 + 3?", "5", "sub_problem")[-1]["content"]
    assert "exactly 5" in msg and "What is 2 + 3?" in msg and "sub-problem" in msg and MARKER in msg
    assert parse_reformulation(f"thinking...\n{MARKER}  Let n = 1 + 2. What is n + 2?\n") == \
        "Let n = 1 + 2. What is n + 2?"
    assert parse_reformulation("no marker here") is None and parse_reformulation(f"{MARKER}   ") is None
    assert parse_verdict("Yes.") and parse_verdict(" yes, it is") and not parse_verdict("No") \
        and not parse_verdict("")
    assert "exactly 5" in judge_prompt("q", "r", "5")[-1]["content"]


def test_augment_keeps_only_parsed_changed_and_answer_preserving_rewrites():
    calls = []

    def reformulate(prompts):  # scripted: row 0 gets a rewrite, row 1 an unparsable reply (background), or
        calls.append(len(prompts))  # its own text back (term), or a rewrite (sub_problem)
        aspect = next(a for a, text in ASPECT_INSTRUCTIONS.items() if text in prompts[0][-1]["content"])
        second = {"background": "sorry", "term": f"{MARKER} What is 10 - 4?",
                  "sub_problem": f"{MARKER} Let n be 2 + 2. What is 10 - n?"}[aspect]
        return [f"{MARKER} A farmer asks: what is 2 + 3? ({aspect})", second]

    def judge(prompts):  # says the sub-problem rewrite of row 1 changed the answer (10 - 4 = 6, 10 - n = 6: the
        return ["no" if "10 - n" in p[-1]["content"] else "yes" for p in prompts]  # judge is wrong; we obey it)

    rep = mqr_augment(ROWS, reformulate, judge=judge)
    assert calls == [2, 2, 2]  # one batch per aspect
    assert rep.kept == {"background": 1, "term": 1, "sub_problem": 1}
    assert rep.dropped == {"background": {"unparsed": 1, "unchanged": 0, "answer_changed": 0},
                           "term": {"unparsed": 0, "unchanged": 1, "answer_changed": 0},
                           "sub_problem": {"unparsed": 0, "unchanged": 0, "answer_changed": 1}}
    assert [r["mqr_aspect"] for r in rep.rows] == ["original", "original", *ASPECTS]
    new = rep.rows[2]
    assert new["answer"] == "5" and new["level"] == 1 and new["mqr_source"] == 0
    assert new["prompt"][0] == ROWS[0]["prompt"][0]  # the system message is kept, the user message replaced
    assert new["prompt"][1] == {"role": "user", "content": "A farmer asks: what is 2 + 3? (background)"}
    assert rep.summary() == {"original": 2, "kept": rep.kept, "dropped": rep.dropped, "rows": 5}
    # check none keeps every parsed, changed rewrite: row 1's sub-problem too; a string prompt stays a string
    rep = mqr_augment(ROWS, reformulate, check="none")
    assert rep.kept["sub_problem"] == 2 and rep.rows[-1]["prompt"] == "Let n be 2 + 2. What is 10 - n?"
    with pytest.raises(ConfigError, match="judge, none"):
        mqr_augment(ROWS, reformulate, check="solve")
    with pytest.raises(ConfigError, match="'gold'"):
        mqr_augment(ROWS, reformulate, answer_column="gold")


def test_grpolab_mqr_runs_a_model_and_writes_the_rows(tmp_path):
    """`grpolab mqr` with the tiny random model: its replies carry no marker, so every reformulation is
    dropped as unparsed and the file holds the originals (a real model folder goes in --model the same way)."""
    data = tmp_path / "rows.jsonl"  # one prompt format per file (docs/data.md)
    chat = [ROWS[0], {**ROWS[1], "prompt": [{"role": "user", "content": ROWS[1]["prompt"]}]}]
    data.write_text("".join(json.dumps(r) + "\n" for r in chat))
    out = tmp_path / "aug.jsonl"
    res = subprocess.run([sys.executable, "-m", "grpolab", "mqr", "--model", "tiny", "--data", str(data),
                          "--out", str(out), "--aspects", "term,sub_problem", "--max-new-tokens", "4"],
                         capture_output=True, text=True, timeout=600, env={**__import__("os").environ,
                                                                           "OMP_NUM_THREADS": "1"})
    assert res.returncode == 0, res.stderr
    summary = json.loads(res.stdout.strip().splitlines()[-1])
    assert summary["original"] == 2 and summary["rows"] == 2
    assert summary["dropped"]["term"]["unparsed"] == 2 and summary["kept"] == {"term": 0, "sub_problem": 0}
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert [r["answer"] for r in rows] == ["5", "6"] and rows[0]["mqr_aspect"] == "original"
    bad = subprocess.run([sys.executable, "-m", "grpolab", "mqr", "--model", "tiny", "--data", str(data),
                          "--out", str(out), "--aspects", "story"], capture_output=True, text=True, timeout=300)
    assert bad.returncode == 2 and "background, term, sub_problem" in bad.stderr


# ----------------------------------------------------------------------------- the recipe

def test_dgpo_mathforge_recipe_trains_on_original_and_reformulated_questions(tiny_args):
    over = recipe_overrides("dgpo_mathforge")
    assert over["task"] == "arithmetic_mqr" and over["advantage"] == "group_mad"
    # on user data the recipe's task settings drop out (the method applies to any data)
    assert "task" not in recipe_overrides("dgpo_mathforge", user_data=True)
    assert "mqr_aspects" not in recipe_overrides("dgpo_mathforge", user_data=True)
    args = {**tiny_args, **over, "steps": 2, "save_steps": 2, "max_completion_length": 4,
            "prompts_per_step": 2, "num_generations": 2}
    t = Trainer(Config.build(args), log=lambda *a: None)
    assert {r["mqr_aspect"] for r in t.rows} == {"original", *ASPECTS}
    for _ in range(2):
        m = t.train_step()
        assert math.isfinite(m["loss"])
