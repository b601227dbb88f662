"""``arithmetic``: integer arithmetic with a strict answer format, one or several steps.

The model is asked to answer as ``Answer: <number>``. Rewards:

* ``accuracy`` (weight 1.0): 1.0 if the number after the last ``Answer:`` equals
  the true result, else 0.0. The format is part of correctness, like GSM8K's
  "strict match": an answer that cannot be parsed is wrong.
* ``format`` (weight 0.5): 1.0 if the reply contains ``Answer: <integer>`` and
  nothing but whitespace after it.

``eval`` also reports ``lenient_accuracy`` (the last integer anywhere in the
reply), so a gain from learning the format is told apart from a gain in
arithmetic.

Two tasks:

* ``arithmetic`` (the default job): every ``a + b`` / ``a - b`` with operands
  0..30, level 1. Its rows, their order and its rewards are those of the
  measured default run (README); the rows also carry ``level`` (1),
  ``solution`` (worked solution ``"a op b = v\\nAnswer: v"``) and ``hints``
  (three strings, abstract to concrete).
* ``arithmetic_multistep``: expressions of ``k`` operations (``k`` from the
  config key ``arithmetic_levels``, default 2, 3, 4) over ``+ - *``; each step
  of the worked solution is one line ``x op n = y`` (left to right, parentheses
  first), the last line ``Answer: N``. Problems are distinct, drawn with
  ``arithmetic_seed``; the first ``arithmetic_n_eval`` are held out.

Columns: ``question``, ``answer``, ``level`` (number of operations),
``solution``, ``hints``.
"""
from __future__ import annotations

import random
import re

from ..registry import TASKS
from .base import Task
from ..data import completion_text, last_int
from ..registry import param

ANSWER = re.compile(r"Answer:\s*(-?\d+)")
FORMAT = re.compile(r"Answer:\s*-?\d+\s*\.?\s*$")  # the reply ends with the answer
SYSTEM = "You are a helpful assistant that solves arithmetic problems."
_APPLY = {"+": lambda x, n: x + n, "-": lambda x, n: x - n, "*": lambda x, n: x * n}


def _prompt(question: str) -> list[dict]:
    content = f"Compute {question}. Finish your reply with 'Answer:' followed by the number."
    return [{"role": "system", "content": SYSTEM}, {"role": "user", "content": content}]


def _level1_hints(a: int, op: str, b: int) -> list[str]:
    tens, ones = (b // 10) * 10, b % 10
    verb = "add" if op == "+" else "subtract"
    if tens:
        middle = f"{verb.capitalize()} the tens of {b} first, then its ones."
        concrete = f"{a} {op} {tens} = {_APPLY[op](a, tens)}, then {verb} {ones}."
    elif b:
        middle = f"Count {b} {'up' if op == '+' else 'down'} from {a}."
        concrete = f"The first count is {a} {op} 1 = {_APPLY[op](a, 1)}."
    else:
        middle, concrete = f"You {verb} zero.", f"{verb.capitalize()}ing 0 leaves {a} unchanged."
    return ["Work out the single operation carefully, digit by digit.", middle, concrete]


def make_row(a: int, op: str, b: int) -> dict:
    """One level-1 row (the default task's prompt, question and answer, plus solution and hints)."""
    value = a + b if op == "+" else a - b
    question = f"{a} {op} {b}"
    return {"prompt": _prompt(question), "question": question, "answer": str(value), "level": 1,
            "solution": f"{question} = {value}\nAnswer: {value}", "hints": _level1_hints(a, op, b)}


def make_multistep(rng: random.Random, steps: int, max_operand: int = 30) -> dict:
    """A ``steps``-operation problem; multiplication uses a factor 2..5 and parenthesises what precedes it."""
    x = rng.randint(0, max_operand)
    expr, lines, value = str(x), [], x
    for _ in range(steps):
        op = rng.choice("+-*")
        n = rng.randint(2, 5) if op == "*" else rng.randint(0, max_operand)
        new = _APPLY[op](value, n)
        lines.append(f"{value} {op} {n} = {new}")
        if op == "*" and not expr.isdigit():
            expr = f"({expr}) * {n}"
        else:
            expr = f"{expr} {op} {n}"
        value = new
    first = lines[0].split(" = ")[0]
    hints = ["Work left to right, one operation at a time (parentheses first).",
             f"There are {steps} operations; start with {first}.",
             f"The first step is {lines[0]}."]
    return {"prompt": _prompt(expr), "question": expr, "answer": str(value), "level": steps,
            "solution": "\n".join(lines + [f"Answer: {value}"]), "hints": hints}


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


REWARDS = [("accuracy", accuracy, 1.0), ("format", format_reward, 0.5)]


@TASKS.register("arithmetic", needs=("text",))
def arithmetic(max_operand: int = 30, n_eval: int = 200, seed: int = 1234) -> Task:
    """Every problem ``a op b`` with ``0 <= a, b <= max_operand``, shuffled by ``seed``;
    the first ``n_eval`` are held out, the rest (1,722 by default) are for training.

    Provenance: grpolab's own — a built-in toy task (a +/- b, strict 'Answer: N' format) for tests and demos;
    implements no published method.
    """
    problems = [(a, op, b) for a in range(max_operand + 1) for b in range(max_operand + 1) for op in "+-"]
    random.Random(seed).shuffle(problems)
    rows = [make_row(*p) for p in problems]
    return Task("arithmetic", rows[n_eval:], rows[:n_eval], rewards=list(REWARDS), accuracy_reward="accuracy",
                description=f"a + b / a - b with operands 0..{max_operand}, strict 'Answer: N' format",
                extra={"lenient_accuracy": lenient_accuracy})


# The default job's settings: `grpolab train` / `grpolab config` on this task with no recipe and no --data take
# them as their lowest layer (cli._recipe_layers; any option or --config key wins; the Python API and Config.build
# do not).
# Without them (lr 2e-5, no dynamic sampling) the format reward, paid whether N is right, turns most replies into a
# bare `Answer: N` within a step or two; most groups then carry no accuracy signal and some seeds drift to one
# number, ending below the 33.0% lenient accuracy they start from. Dynamic sampling (DAPO; stages/collectors.py) on
# the accuracy reward trains every step on groups whose accuracy varies, and the halved learning rate keeps the
# drift small: held-out accuracy rose on all 5 seeds measured (README, "The default job").
arithmetic.run_defaults = {"dynamic_sampling": True, "learning_rate": 1e-5}


def multistep_rows(levels: list[int], max_operand: int, seed: int, need: int, task: str) -> list[dict]:
    """``need`` distinct problems with 1..k operations (``k`` drawn from ``levels``) on operands 0..max_operand,
    from ``random.Random(seed)``; an error naming ``task`` when there are not that many."""
    rng = random.Random(seed)
    rows, seen, tries = [], set(), 0
    while len(rows) < need:
        tries += 1
        if tries > 50 * need:
            raise ValueError(f"{task}: only {len(rows)} distinct problems for levels {levels} "
                             f"and operands 0..{max_operand}; ask for fewer rows")
        k = rng.choice(levels)
        if k == 1:
            row = make_row(rng.randint(0, max_operand), rng.choice("+-"), rng.randint(0, max_operand))
        else:
            row = make_multistep(rng, k, max_operand)
        if row["question"] not in seen:
            seen.add(row["question"])
            rows.append(row)
    return rows


@TASKS.register("arithmetic_multistep", needs=("text",))
def arithmetic_multistep(*,
                         arithmetic_levels: list = param([2, 3, 4], 'arithmetic_multistep: operation counts to draw '
                                                         "problems from (1 = the default task's a +/- b)"),
                         arithmetic_max_operand: int = param(30, 'arithmetic_multistep: operands are 0..this '
                                                             '(factors 2..5)'),
                         arithmetic_n_train: int = param(2000, 'arithmetic_multistep: training problems'),
                         arithmetic_n_eval: int = param(200, 'arithmetic_multistep: held-out problems'),
                         arithmetic_seed: int = param(1234, 'arithmetic_multistep: seed that fixes the problems and '
                                                      'the split')) -> Task:
    """``n_train + n_eval`` distinct problems, each of a level drawn uniformly from ``arithmetic_levels``
    (level 1 = the default task's ``a +/- b``), drawn with ``arithmetic_seed``; the first
    ``arithmetic_n_eval`` are held out. Same seed, same rows.

    Provenance: grpolab's own — a built-in toy task (multi-operation arithmetic) for tests and demos; implements
    no published method.
    """
    levels = sorted({int(x) for x in arithmetic_levels})
    if not levels or levels[0] < 1:
        raise ValueError(f"arithmetic_levels: expected operation counts >= 1, got {arithmetic_levels}")
    rows = multistep_rows(levels, arithmetic_max_operand, arithmetic_seed, arithmetic_n_train + arithmetic_n_eval,
                          "arithmetic_multistep")
    n_eval = arithmetic_n_eval
    return Task("arithmetic_multistep", rows[n_eval:], rows[:n_eval], rewards=list(REWARDS),
                accuracy_reward="accuracy",
                description=f"{'/'.join(map(str, levels))}-step + - * problems with worked solutions, "
                            f"strict 'Answer: N' format",
                extra={"lenient_accuracy": lenient_accuracy})


PARAPHRASES = [
    "Compute {q}. Finish your reply with 'Answer:' followed by the number.",
    "What is {q}? End your reply with 'Answer:' and the number.",
    "Work out the value of {q} and finish with 'Answer:' followed by the result.",
    "Evaluate the expression {q}. Your reply must end with 'Answer:' and the number.",
]


@TASKS.register("arithmetic_paraphrase", needs=("text",))
def arithmetic_paraphrase(*,
                          arithmetic_paraphrases: int = param(2, "arithmetic_paraphrase: wordings per problem (2..4): "
                                                              "each is its own prompt, one paraphrase set")) -> Task:
    """The ``arithmetic`` problems, each asked in ``arithmetic_paraphrases`` wordings (a paraphrase set).

    Every wording is its own row (own prompt) with the column ``paraphrase_group`` naming its set (the
    problem), for the paraphrase-consistency rewards; sets are contiguous in the rows, and the
    ``paraphrase_sets`` prompt sampler draws whole sets. Rewards and other columns as ``arithmetic``.

    Provenance: grpolab's own — a built-in toy task (arithmetic asked in several wordings) for the
    paraphrase-consistency recipes; implements no published method.
    """
    if not 2 <= arithmetic_paraphrases <= len(PARAPHRASES):
        raise ValueError(f"arithmetic_paraphrases: expected 2..{len(PARAPHRASES)}, got {arithmetic_paraphrases}")
    base = arithmetic()

    def expand(rows):
        out = []
        for row in rows:
            for k in range(arithmetic_paraphrases):
                content = PARAPHRASES[k].format(q=row["question"])
                out.append({**row, "prompt": [{"role": "system", "content": SYSTEM},
                                              {"role": "user", "content": content}],
                            "paraphrase_group": row["question"], "paraphrase_id": k})
        return out

    return Task("arithmetic_paraphrase", expand(base.train_rows), expand(base.eval_rows), rewards=list(REWARDS),
                accuracy_reward="accuracy", extra=dict(base.extra),
                description=f"arithmetic problems, each in {arithmetic_paraphrases} wordings (paraphrase sets)")
