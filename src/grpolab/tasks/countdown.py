"""``countdown``: reach a target number with the given numbers and + - * /.

Each problem gives 3 or 4 numbers and a target that some expression over a
subset of them reaches (each number used at most once). The model answers as
``Answer: <expression>``, e.g. ``Answer: (7 - 3) * 5``. Rewards:

* ``accuracy`` (weight 1.0): 1.0 if the expression after the last ``Answer:``
  uses only + - * / and parentheses, uses each given number at most once (as a
  multiset), and evaluates exactly (rational arithmetic) to the target; else 0.
* ``format`` (weight 0.5): 1.0 if the reply ends with ``Answer: <expression>``
  made only of digits, operators, parentheses and spaces.

Columns: ``numbers`` (list of ints), ``target`` (str), ``answer`` (= target, so
answer-reading transforms work), ``solution`` (a reference expression),
``level`` (difficulty: how many numbers the reference uses, 2..4) and ``hints``
(tiered, abstract to concrete). Splits are fixed by ``seed`` and disjoint.
"""
from __future__ import annotations

import ast
import random
import re
from collections import Counter
from fractions import Fraction

from ..registry import TASKS
from .base import Task
from ..data import completion_text

ANSWER = re.compile(r"Answer:\s*([0-9+\-*/() ]+)")
FORMAT = re.compile(r"Answer:\s*[0-9+\-*/() ]*[0-9)]\s*\.?\s*$")
SYSTEM = "You are a helpful assistant that solves number puzzles."
_OPS = {ast.Add: lambda a, b: a + b, ast.Sub: lambda a, b: a - b, ast.Mult: lambda a, b: a * b,
        ast.Div: lambda a, b: a / b}


def evaluate(expr: str) -> tuple[Fraction, list[int]] | None:
    """Exact value and the integer literals of ``expr``; None if not a plain arithmetic expression."""
    try:
        tree = ast.parse(expr.strip(), mode="eval")
    except (SyntaxError, ValueError):
        return None
    used: list[int] = []

    def ev(node):
        if isinstance(node, ast.BinOp) and type(node.op) in _OPS:
            return _OPS[type(node.op)](ev(node.left), ev(node.right))
        if isinstance(node, ast.Constant) and type(node.value) is int:
            used.append(node.value)
            return Fraction(node.value)
        raise ValueError("not allowed")

    try:
        return ev(tree.body), used
    except (ValueError, ZeroDivisionError):
        return None


def check(expr: str, numbers: list[int], target: int) -> bool:
    result = evaluate(expr)
    if result is None:
        return False
    value, used = result
    return value == target and not (Counter(used) - Counter(numbers))


def accuracy(prompts=None, completions=None, numbers=None, target=None, **kwargs) -> list[float]:
    out = []
    for c, nums, t in zip(completions, numbers, target):
        found = ANSWER.findall(completion_text(c))
        out.append(1.0 if found and check(found[-1], list(nums), int(t)) else 0.0)
    return out


def format_reward(prompts=None, completions=None, **kwargs) -> list[float]:
    return [1.0 if FORMAT.search(completion_text(c)) else 0.0 for c in completions]


def _random_expression(rng: random.Random, numbers: list[int]) -> tuple[str, Fraction, str]:
    """Combine the numbers left to right in a random order with random ops -> (expr, value, first step)."""
    order = numbers[:]
    rng.shuffle(order)
    expr, value, first = str(order[0]), Fraction(order[0]), ""
    for n in order[1:]:
        ops = ["+", "-", "*"] + (["/"] if value % n == 0 else [])
        op = rng.choice(ops)
        value = _OPS[{"+": ast.Add, "-": ast.Sub, "*": ast.Mult, "/": ast.Div}[op]](value, Fraction(n))
        expr = f"({expr} {op} {n})" if op in "+-" else f"{expr} {op} {n}"
        first = first or expr
    if expr.startswith("(") and evaluate(expr[1:-1]) is not None and evaluate(expr[1:-1])[0] == value:
        expr = expr[1:-1]
    return expr, value, first


def make_problem(rng: random.Random, max_number: int = 20, max_target: int = 100) -> dict:
    while True:
        n = rng.choice([3, 4])
        numbers = [rng.randint(1, max_number) for _ in range(n)]
        k = rng.randint(2, n)  # the reference uses k of the n numbers
        expr, value, first = _random_expression(rng, rng.sample(numbers, k))
        if value.denominator == 1 and 1 <= value <= max_target:
            break
    target = int(value)
    shown = ", ".join(map(str, numbers))
    content = (f"Using the numbers {shown}, each at most once, and + - * / with parentheses, make {target}. "
               f"Finish your reply with 'Answer:' followed by the expression.")
    hints = ["Not every number has to be used.",
             f"One solution uses {k} of the numbers.",
             f"One solution starts with {first}."]
    return {"prompt": [{"role": "system", "content": SYSTEM}, {"role": "user", "content": content}],
            "question": f"{shown} -> {target}", "numbers": numbers, "target": str(target),
            "answer": str(target), "solution": expr, "level": k, "hints": hints}


@TASKS.register("countdown", needs=("text",))
def countdown(n_train: int = 2000, n_eval: int = 200, seed: int = 1234, max_number: int = 20,
              max_target: int = 100) -> Task:
    """``n_train + n_eval`` distinct problems (by numbers and target) drawn with ``seed``;
    the first ``n_eval`` are held out.

    Provenance: grpolab's own — a built-in countdown task in the style of TinyZero's (numbers, target, + - * /),
    generated and scored by grpolab; implements no published method.
    """
    rng = random.Random(seed)
    rows, seen = [], set()
    while len(rows) < n_train + n_eval:
        row = make_problem(rng, max_number, max_target)
        key = (tuple(sorted(row["numbers"])), row["target"])
        if key not in seen:
            seen.add(key)
            rows.append(row)
    return Task("countdown", rows[n_eval:], rows[:n_eval],
                rewards=[("accuracy", accuracy, 1.0), ("format", format_reward, 0.5)],
                accuracy_reward="accuracy",
                description=f"reach a target (1..{max_target}) with 3-4 numbers (1..{max_number}) and + - * /, "
                            f"'Answer: <expression>' format")
