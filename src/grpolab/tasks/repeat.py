"""``repeat``: a toy task a random-init model learns from scratch in seconds.

The prompt names a digit; the reward ``match`` is the share of the first four
completion characters that are that digit. A random policy scores about
1/vocabulary, so rewards vary within every group and GRPO has signal from the
first step. Used by the test suite with ``--model tiny``.
"""
from __future__ import annotations

import random

from ..registry import TASKS
from .base import Task
from ..data import completion_text


def match(prompts=None, completions=None, digit=None, **kwargs) -> list[float]:
    out = []
    for c, d in zip(completions, digit):
        text = completion_text(c)[:4]
        out.append(sum(ch == d for ch in text) / 4.0)
    return out


@TASKS.register("repeat")
def repeat(n_train: int = 200, n_eval: int = 40, seed: int = 0) -> Task:
    """The ``repeat`` toy task: ``n_train`` / ``n_eval`` "say D:" rows drawn with ``seed`` (module docstring).

    Provenance: grpolab's own — a toy task a random-init model learns from scratch (used by the test suite);
    implements no published method.
    """
    rng = random.Random(seed)

    def row():
        d = str(rng.randint(0, 9))
        return {"prompt": f"say {d}:", "digit": d}

    return Task("repeat", [row() for _ in range(n_train)], [row() for _ in range(n_eval)],
                rewards=[("match", match, 1.0)], accuracy_reward="match",
                description="repeat a digit (toy, learnable from scratch)")
