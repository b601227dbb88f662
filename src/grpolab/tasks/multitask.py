"""``multitask_mix``: two task types of different difficulty in one data set, each row naming its type.

Multi-task RL methods such as DGRPO (VITAL, seed 000-02: temporal grounding and video QA trained jointly) weigh
the learning signal by task; they need a data column naming each row's task. This built-in task mixes, in equal
numbers and alternating order:

* ``copy`` (easy): "Repeat the number N." with N a 3-4 digit number; the answer is N.
* ``multistep`` (hard): a 3-operation arithmetic problem as in ``arithmetic_multistep``
  (:func:`~grpolab.tasks.arithmetic.make_multistep`, operands 0..30, factors 2..5).

Both ask for 'Answer:' followed by the number, so one reward scores both: ``accuracy`` (1.0, the integer after
the last ``Answer:`` equals ``answer``) and ``format`` (0.5), as ``arithmetic``. Every row has ``prompt``,
``question``, ``answer`` and ``task`` (``copy`` or ``multistep``).
"""
from __future__ import annotations

import random

from ..registry import TASKS
from .arithmetic import REWARDS as ARITHMETIC_REWARDS, SYSTEM, lenient_accuracy, make_multistep
from .base import Task

TASK_TYPES = ("copy", "multistep")


def _copy_row(rng: random.Random) -> dict:
    n = rng.randint(100, 9999)
    content = f"Repeat the number {n}. Finish your reply with 'Answer:' followed by the number."
    prompt = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": content}]
    return {"prompt": prompt, "question": f"repeat {n}", "answer": str(n), "task": "copy"}


def _multistep_row(rng: random.Random) -> dict:
    row = make_multistep(rng, 3)
    return {"prompt": row["prompt"], "question": row["question"], "answer": row["answer"], "task": "multistep"}


@TASKS.register("multitask_mix", needs=("text",))
def multitask_mix(n_train: int = 1000, n_eval: int = 100, seed: int = 1234) -> Task:
    """``n_train + n_eval`` distinct rows drawn with ``seed``, alternating ``copy`` and ``multistep``; the first
    ``n_eval`` are held out (no question is in both splits). The ``task`` column names each row's type (module
    docstring).

    Provenance: grpolab's own — a built-in multi-task mix (an easy and a hard task type, one answer format) for
    the task-weighted recipes (``dgrpo_vital``); implements no published method.
    """
    rng = random.Random(seed)
    makers = (_copy_row, _multistep_row)
    rows, seen = [], set()
    while len(rows) < n_train + n_eval:
        row = makers[len(rows) % 2](rng)
        if row["question"] not in seen:
            seen.add(row["question"])
            rows.append(row)
    return Task("multitask_mix", rows[n_eval:], rows[:n_eval], rewards=list(ARITHMETIC_REWARDS),
                accuracy_reward="accuracy",
                description="copy a number (easy) and 3-step arithmetic (hard), mixed, 'task' column, "
                            "'Answer: N' format",
                extra={"lenient_accuracy": lenient_accuracy})
