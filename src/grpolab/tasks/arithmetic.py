"""``arithmetic``: integer addition and subtraction with a strict answer format.

The model is asked to answer as ``Answer: <number>``. Rewards:

* ``accuracy`` (weight 1.0): 1.0 if the number after the last ``Answer:`` equals
  the true result, else 0.0. The format is part of correctness, like GSM8K's
  "strict match": an answer that cannot be parsed is wrong.
* ``format`` (weight 0.5): 1.0 if the reply contains ``Answer: <integer>`` and
  nothing but whitespace after it.

``eval`` also reports ``lenient_accuracy`` (the last integer anywhere in the
reply), so a gain from learning the format is told apart from a gain in
arithmetic.
"""
from __future__ import annotations

import random
import re

from . import TASKS, Task
from .common import completion_text, last_int

ANSWER = re.compile(r"Answer:\s*(-?\d+)")
FORMAT = re.compile(r"Answer:\s*-?\d+\s*\.?\s*$")  # the reply ends with the answer
SYSTEM = "You are a helpful assistant that solves arithmetic problems."


def make_row(a: int, op: str, b: int) -> dict:
    value = a + b if op == "+" else a - b
    question = f"{a} {op} {b}"
    content = f"Compute {question}. Finish your reply with 'Answer:' followed by the number."
    return {"prompt": [{"role": "system", "content": SYSTEM}, {"role": "user", "content": content}],
            "question": question, "answer": str(value)}


def accuracy(prompts=None, completions=None, answer=None, **kwargs) -> list[float]:
    out = []
    for c, a in zip(completions, answer):
        found = ANSWER.findall(completion_text(c))
        out.append(1.0 if found and int(found[-1]) == int(a) else 0.0)
    return out


def format_reward(prompts=None, completions=None, **kwargs) -> list[float]:
    return [1.0 if FORMAT.search(completion_text(c)) else 0.0 for c in completions]


def lenient_accuracy(prompts=None, completions=None, answer=None, **kwargs) -> list[float]:
    return [1.0 if last_int(completion_text(c)) == int(a) else 0.0 for c, a in zip(completions, answer)]


@TASKS.register("arithmetic")
def arithmetic(max_operand: int = 30, n_eval: int = 200, seed: int = 1234) -> Task:
    """Every problem ``a op b`` with ``0 <= a, b <= max_operand``, shuffled by ``seed``;
    the first ``n_eval`` are held out, the rest (1,722 by default) are for training."""
    problems = [(a, op, b) for a in range(max_operand + 1) for b in range(max_operand + 1) for op in "+-"]
    random.Random(seed).shuffle(problems)
    rows = [make_row(*p) for p in problems]
    return Task("arithmetic", rows[n_eval:], rows[:n_eval],
                rewards=[("accuracy", accuracy, 1.0), ("format", format_reward, 0.5)],
                accuracy_reward="accuracy",
                description=f"a + b / a - b with operands 0..{max_operand}, strict 'Answer: N' format",
                extra={"lenient_accuracy": lenient_accuracy})
