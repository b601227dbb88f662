"""PM4GRPO process-conformance reward (Park, Lee and Bae, 2025, "Reasoning-Aware GRPO using
Process Mining", arXiv:2510.25065; seed 000-87).

PM4GRPO adds to the answer and format rewards a conformance reward ``R^c``
measuring how closely the policy's reasoning *procedure* follows a teacher's.
The paper treats a reasoning trace as an event log (one event per reasoning
step), discovers a process model from the policy's trace with the Inductive
Miner and checks the teacher's trace against it with alignment-based
conformance; the reward is the harmonic mean of fitness and precision::

    R^c_i = 2 * fitness_i * precision_i / (fitness_i + precision_i)

grpolab computes the same quantities without a process-mining library, for
the case the Inductive Miner reduces to on one trace whose steps do not
repeat: the policy's process model is the *sequence* of its steps. With ``s``
the policy's step sequence, ``t`` the teacher's, and ``L = LCS(s, t)`` the
number of synchronous moves of an optimal alignment (unit cost for a move on
log only or on model only, 0 for a synchronous move):

* ``fitness = 1 - cost_opt / cost_worst`` with ``cost_opt = |s| + |t| - 2L``
  and ``cost_worst = |s| + |t|`` (every step a move on one side only) — the
  standard alignment fitness, i.e. ``2L / (|s| + |t|)``;
* ``precision = L / |s|``: the share of the policy model's behaviour (its
  steps) that the teacher's trace actually uses (extra, unsupported steps
  lower it);
* ``f1`` = their harmonic mean (the paper's ``R^c``; ``pm4grpo_measure``
  chooses ``f1``, ``fitness`` or ``precision``).

Both traces empty -> 1.0; exactly one empty -> 0.0. Worked example (tested):
``s = [a, b, c]``, ``t = [a, c]``: ``L = 2``, cost 1, fitness ``1 - 1/5 = 0.8``,
precision ``2/3``, f1 ``2 * 0.8 * (2/3) / (0.8 + 2/3) = 0.7273``.

Steps: the reasoning part of a text (think tags and control tokens removed,
every ``Answer:`` line dropped — the answer has its own reward), split into
lines and sentences; each step is lower-cased with whitespace collapsed and a
trailing period removed; with ``pm4grpo_abstract_numbers`` every number
becomes ``#`` so that the *procedure* ("x + n = y") is compared, not the values.
Activities (steps) match when their normalised texts are equal — the paper
labels steps by their content as well; grpolab's label is the step text itself.

The teacher trace is a data column (``pm4grpo_teacher_column``, default
``solution``: the worked solutions of ``arithmetic`` / ``arithmetic_multistep``;
for a teacher *model* put its traces into a JSONL column). Rows without a
trace are unscorable (``None``).
"""
from __future__ import annotations

import re

from ..data import completion_text
from ..registry import REWARD_SPECS, declared_params, param
from .scoring import RewardFn

_TAGS = re.compile(r"</?think>|<short>|</?reasoning>|</?answer>")
_SENTENCE = re.compile(r"(?<=[.!?])\s+(?=\S)")
_NUMBER = re.compile(r"-?\d+(?:\.\d+)?")


def reasoning_steps(text: str, abstract_numbers: bool = False) -> list[str]:
    """The normalised reasoning steps of ``text`` (see the module docstring)."""
    text = _TAGS.sub("\n", text or "")
    steps = []
    for line in text.splitlines():
        if line.strip().startswith("Answer:"):
            continue
        for sent in _SENTENCE.split(line):
            s = re.sub(r"\s+", " ", sent).strip().rstrip(".").strip().lower()
            if abstract_numbers:
                s = _NUMBER.sub("#", s)
            if s:
                steps.append(s)
    return steps


def lcs_length(a: list, b: list) -> int:
    """Length of the longest common subsequence (dynamic programming, O(|a| |b|))."""
    prev = [0] * (len(b) + 1)
    for x in a:
        cur = [0]
        for j, y in enumerate(b):
            cur.append(prev[j] + 1 if x == y else max(prev[j + 1], cur[j]))
        prev = cur
    return prev[-1]


def conformance(policy_steps: list, teacher_steps: list) -> dict[str, float]:
    """``{"fitness", "precision", "f1"}`` of the policy's step sequence against the teacher's."""
    s, t = len(policy_steps), len(teacher_steps)
    if s == 0 and t == 0:
        return {"fitness": 1.0, "precision": 1.0, "f1": 1.0}
    if s == 0 or t == 0:
        return {"fitness": 0.0, "precision": 0.0, "f1": 0.0}
    L = lcs_length(policy_steps, teacher_steps)
    fitness = 1.0 - (s + t - 2 * L) / (s + t)
    precision = L / s
    f1 = 0.0 if fitness + precision == 0 else 2 * fitness * precision / (fitness + precision)
    return {"fitness": fitness, "precision": precision, "f1": f1}


class PM4GRPOReward:
    """The conformance reward as a TRL-contract reward function (spec ``pm4grpo[=weight]``)."""

    def __init__(self, *,
                 pm4grpo_teacher_column: str = param('solution', "PM4GRPO: data column holding the teacher's "
                                                     'reasoning trace'),
                 pm4grpo_measure: str = param('f1', 'PM4GRPO: conformance score: f1 (paper: harmonic mean of fitness '
                                              'and precision), fitness or precision', ['f1', 'fitness', 'precision']),
                 pm4grpo_abstract_numbers: bool = param(False, 'PM4GRPO: compare steps with every number replaced by '
                                                        "'#' (procedure, not values)")):
        if pm4grpo_measure not in ("f1", "fitness", "precision"):
            raise ValueError(f"pm4grpo_measure: expected f1, fitness or precision, got '{pm4grpo_measure}'")
        self.column = pm4grpo_teacher_column
        self.measure = pm4grpo_measure
        self.abstract = pm4grpo_abstract_numbers
        self.__name__ = "pm4grpo"

    def __call__(self, prompts=None, completions=None, **columns) -> list[float | None]:
        if self.column not in columns:
            raise ValueError(f"pm4grpo: no data column '{self.column}' with the teacher's trace (columns: "
                             f"{', '.join(sorted(columns)) or 'none'}); set pm4grpo_teacher_column or use a task "
                             f"with worked solutions (arithmetic, arithmetic_multistep)")
        out: list[float | None] = []
        for c, trace in zip(completions, columns[self.column]):
            if trace is None:
                out.append(None)
                continue
            score = conformance(reasoning_steps(completion_text(c), self.abstract),
                                reasoning_steps(str(trace), self.abstract))
            out.append(score[self.measure])
        return out


def pm4grpo_conformance(prompts=None, completions=None, solution=None, **kwargs) -> list[float | None]:
    """PM4GRPO f1 conformance to the ``solution`` column with the default settings
    (``--reward grpolab.rewards.process:pm4grpo_conformance``)."""
    cols = {} if solution is None else {"solution": solution}
    return PM4GRPOReward()(prompts=prompts, completions=completions, **cols)


def parse_pm4grpo_spec(spec: str, cfg=None, **opts):
    """``pm4grpo[=weight]`` -> the conformance reward as :class:`~grpolab.rewards.scoring.RewardFn`.

    Provenance: reconstructed from the abstract — the conformance reward as the harmonic mean of alignment
    fitness and precision, computed on step sequences with an LCS alignment instead of the Inductive Miner and a
    process-mining library.
    """
    weight = spec.partition("=")[2]
    try:
        w = float(weight) if weight else 1.0
    except ValueError:
        raise ValueError(f"--reward '{spec}': weight '{weight}' is not a number") from None
    return RewardFn("pm4grpo", PM4GRPOReward(**opts), w)


parse_pm4grpo_spec.__grpolab_params__ = declared_params(PM4GRPOReward)  # its options are the reward's
REWARD_SPECS.register("pm4grpo", needs=("text",))(parse_pm4grpo_spec)
