"""``repeat``: a toy task a random-init model learns from scratch in seconds.

The prompt names a digit; the reward ``match`` is the share of the first four
completion characters that are that digit. A random policy scores about
1/vocabulary, so rewards vary within every group and GRPO has signal from the
first step. Used by the test suite with ``--model tiny``.
"""
from __future__ import annotations

import random

from ..registry import TASKS, param
from .base import Task
from ..data import completion_text


def match(prompts=None, completions=None, digit=None, chars: int = 4, mode: str = "share", **kwargs) -> list[float]:
    """Share of the first ``chars`` characters that are the row's digit (``mode="all"``: 1 if all are, else 0)."""
    out = []
    for c, d in zip(completions, digit):
        hits = sum(ch == d for ch in completion_text(c)[:chars])
        out.append(hits / chars if mode == "share" else float(hits == chars))
    return out


@TASKS.register("repeat", needs=("text",))
def repeat(n_train: int = 200, n_eval: int = 40, seed: int = 0, *,
           repeat_chars: int = param(4, "repeat: leading completion characters the reward checks (1 = a 0/1 "
                                        "reward a random-init model can learn; 4 with repeat_reward all = groups "
                                        "that are almost always all wrong)"),
           repeat_reward: str = param("share", "repeat: 'share' = the share of those characters that are the "
                                               "digit; 'all' = 1 only if all are (a 0/1 reward)",
                                      ["share", "all"])) -> Task:
    """The ``repeat`` toy task: ``n_train`` / ``n_eval`` "say D:" rows drawn with ``seed`` (module docstring).

    Rows carry ``solution`` (the digit ``repeat_chars`` times) and two ``hints``, so the hint recipes (Scaf-GRPO,
    Guide, GHPO) run on it.

    Provenance: grpolab's own — a toy task a random-init model learns from scratch (used by the test suite);
    implements no published method.
    """
    if repeat_chars < 1:
        raise ValueError(f"repeat_chars: must be >= 1, got {repeat_chars}")
    rng = random.Random(seed)

    def row():
        d = str(rng.randint(0, 9))
        return {"prompt": f"say {d}:", "digit": d, "solution": d * repeat_chars,
                "hints": [f"the digit is {d}", f"write {d * repeat_chars}"]}

    def reward(prompts=None, completions=None, digit=None, **kwargs) -> list[float]:
        return match(prompts, completions, digit, chars=repeat_chars, mode=repeat_reward)

    reward.__name__ = "match"
    return Task("repeat", [row() for _ in range(n_train)], [row() for _ in range(n_eval)],
                rewards=[("match", reward, 1.0)], accuracy_reward="match",
                description="repeat a digit (toy, learnable from scratch)")
