"""``irpo_prefs``: train a pointwise *generative* reward model (GRM) with GRPO under a Bradley-Terry preference
model — the reward-model phase of IRPO (Song et al., 2026, "IRPO: Scaling the Bradley-Terry Model via
Reinforcement Learning", arXiv:2601.00677; seed 000-21).

The policy of this task *is the reward model*. Its data are preference pairs ``(question, chosen, rejected)``
built from the ``arithmetic`` task: the chosen response is ``Answer: v`` (the right value), the rejected one
``Answer: w`` with ``w = v + d``, ``d`` drawn from ``±1..±3`` per pair with ``irpo_prefs_seed``. Each pair gives
TWO prompt rows, one per response, both asking the GRM to judge one (question, response)::

    system: JUDGE_SYSTEM
    user:   Question: Compute a + b.
            Response: Answer: v
            Judge the response, then end with 'Score: N' (N an integer from 0 to 10).

The rows of a pair share the data column ``irpo_pair`` (the pair id) and differ in ``irpo_side`` (1 = the
chosen response, 0 = the rejected one). Draw whole pairs with ``prompt_sampler: paraphrase_sets`` and
``paraphrase_set_column: irpo_pair`` (recipe ``irpo_grm``), so both responses of a pair are judged in the same
step: G judgements of the chosen response form one GRPO group, G of the rejected one another.

Rewards (all see the whole batch, so they read the other response's judgements through the pair columns):

* ``irpo_bt`` (weight 1): the intergroup Bradley-Terry reward :func:`intergroup_bt_rewards` of the parsed
  scores;
* ``judge_format`` (weight 0, a metric): 1.0 where the judgement ends with a parseable score
  (:func:`parse_judge_score`), else 0.0 — its mean is the share of parseable judgements;
* ``pair_accuracy`` (weight 0, the accuracy reward): 1.0 where the row's score is on the right side of the
  opposing group's mean score (above it for the chosen response, below for the rejected one), 0.0 where not or
  unparseable, unscorable (None) when the batch holds no parseable judgement of the other response.

A GRM too small to write the format (the tiny test model, SmolLM2-135M) first gets a label-free format cold
start: :func:`format_warmup_rows` -> JSONL -> ``grpolab sft --data`` -> ``--model`` of the ``irpo_grm`` run.

The trained GRM (the run's ``OUT/final`` folder) then scores a policy's completions pointwise through the reward
spec ``grm:PATH`` (:mod:`grpolab.rewards.grm`, recipe ``irpo_policy``), with the same prompt
(:func:`judge_prompt`) and parser.
"""
from __future__ import annotations

import math
import random
import re

from ..data import completion_text
from ..registry import TASKS, param
from .arithmetic import arithmetic
from .base import Task

JUDGE_SYSTEM = "You are a strict judge of answers to arithmetic questions."
SCORE_MIN, SCORE_MAX = 0, 10
_SCORE = re.compile(r"(?:^|\s)Score:\s*(\d{1,2})\s*$")


def judge_prompt(question: str, response: str) -> list[dict]:
    """The GRM's chat prompt for one (question, response): the same in training (``irpo_prefs``) and use
    (``grm:PATH``)."""
    user = (f"Question: {question}\nResponse: {response}\n"
            f"Judge the response, then end with 'Score: N' (N an integer from {SCORE_MIN} to {SCORE_MAX}).")
    return [{"role": "system", "content": JUDGE_SYSTEM}, {"role": "user", "content": user}]


def parse_judge_score(text) -> float | None:
    """The score of a judgement, strictly: the text (stripped) must END with ``Score: N``, ``N`` an integer in
    ``SCORE_MIN..SCORE_MAX`` (0..10) preceded by nothing or white space; anything else is None (unparseable):
    ``"ok. Score: 7"`` -> 7.0, ``"Score: 7."``, ``"Score: 11"``, ``"Score: 7 then more"``, ``"MyScore: 7"`` -> None."""
    m = _SCORE.search(completion_text(text).strip())
    if m is None:
        return None
    v = int(m.group(1))
    return float(v) if SCORE_MIN <= v <= SCORE_MAX else None


def _sigmoid(x: float) -> float:
    return 1.0 / (1.0 + math.exp(-x)) if x >= 0 else math.exp(x) / (1.0 + math.exp(x))


def intergroup_bt_rewards(scores: list, pairs: list, sides: list, scale: float = 1.0,
                          unparseable: float = 0.0) -> list[float]:
    """IRPO's intergroup Bradley-Terry reward of each judgement.

    For a pair with parsed chosen-side scores ``C`` and rejected-side scores ``R`` (the judgements of that pair
    in the batch; None = unparseable, left out), a chosen-side judgement with score ``s`` gets the mean
    Bradley-Terry likelihood of the known preference (chosen beats rejected) against every judgement of the
    other side, and a rejected-side judgement the same from the other end::

        chosen:   r(s) = 1/|R| * sum_{t in R} sigmoid(k (s - t))
        rejected: r(s) = 1/|C| * sum_{c in C} sigmoid(k (c - s))

    ``k = scale``. A parseable judgement whose pair has no parseable judgement on the other side gets 0.5 (no
    evidence either way); an unparseable one gets ``unparseable`` (0.0, the lowest BT reward, so the GRM
    learns the format). n judgements cost n generations and one comparison per (chosen, rejected) judgement
    pair inside one preference pair — no pairwise *generation* (the O(n^2) GRM calls IRPO removes).
    """
    by_pair: dict = {}
    for s, p, side in zip(scores, pairs, sides):
        if s is not None:
            by_pair.setdefault(p, ([], []))[0 if int(side) == 1 else 1].append(float(s))
    out = []
    for s, p, side in zip(scores, pairs, sides):
        if s is None:
            out.append(float(unparseable))
            continue
        chosen, rejected = by_pair[p]
        other = rejected if int(side) == 1 else chosen
        if not other:
            out.append(0.5)
        elif int(side) == 1:
            out.append(sum(_sigmoid(scale * (s - t)) for t in other) / len(other))
        else:
            out.append(sum(_sigmoid(scale * (c - s)) for c in other) / len(other))
    return out


def irpo_bt(prompts=None, completions=None, irpo_pair=None, irpo_side=None, **kwargs) -> list[float]:
    """The intergroup Bradley-Terry reward of each judgement (:func:`intergroup_bt_rewards`, k = 1).

    Raises (the scorer reports it every step) when no pair of the batch has both responses in it: the prompts
    were drawn one by one, so no judgement can be compared (select ``prompt_sampler: paraphrase_sets`` with
    ``paraphrase_set_column: irpo_pair``, as recipe ``irpo_grm`` does)."""
    sides: dict = {}
    for p, side in zip(irpo_pair, irpo_side):
        sides.setdefault(p, set()).add(int(side))
    if sides and not any(len(v) == 2 for v in sides.values()):
        raise ValueError("irpo_bt: no preference pair has both responses in this batch; draw whole pairs with "
                         "prompt_sampler: paraphrase_sets and paraphrase_set_column: irpo_pair (recipe irpo_grm)")
    return intergroup_bt_rewards([parse_judge_score(c) for c in completions], irpo_pair, irpo_side)


def judge_format(prompts=None, completions=None, **kwargs) -> list[float]:
    """1.0 where the judgement ends with a parseable score, else 0.0 (the share of parseable judgements)."""
    return [float(parse_judge_score(c) is not None) for c in completions]


def pair_accuracy(prompts=None, completions=None, irpo_pair=None, irpo_side=None, **kwargs) -> list:
    """1.0 where the row's score is on the right side of the mean score of the other response's judgements
    (chosen: strictly above; rejected: strictly below), 0.0 where not or unparseable; None (unscorable) where
    the batch holds no parseable judgement of the other response."""
    scores = [parse_judge_score(c) for c in completions]
    by_pair: dict = {}
    for s, p, side in zip(scores, irpo_pair, irpo_side):
        if s is not None:
            by_pair.setdefault((p, int(side)), []).append(s)
    out: list = []
    for s, p, side in zip(scores, irpo_pair, irpo_side):
        other = by_pair.get((p, 1 - int(side)))
        if not other:
            out.append(None)
        elif s is None:
            out.append(0.0)
        else:
            m = sum(other) / len(other)
            out.append(float(s > m if int(side) == 1 else s < m))
    return out


def format_warmup_rows(rows: list[dict], seed: int = 0) -> list[dict]:
    """A label-free format cold start for a GRM too small to follow the format (``grpolab sft --data``): each
    judging prompt of ``rows`` with the target ``Score: k``, ``k`` uniform in ``SCORE_MIN..SCORE_MAX`` drawn with
    ``random.Random(seed)`` in row order, independent of the row's side — it teaches the format and a spread of
    scores, and nothing about which response is preferred (that is left to the IRPO reward)."""
    rng = random.Random(seed)
    return [{"prompt": r["prompt"], "completion": f"Score: {rng.randint(SCORE_MIN, SCORE_MAX)}"} for r in rows]


def _pair_rows(row: dict, pair_id: str, wrong: int) -> list[dict]:
    chosen, rejected = f"Answer: {row['answer']}", f"Answer: {wrong}"
    return [{"prompt": judge_prompt(row["question"], resp), "question": row["question"], "answer": row["answer"],
             "response": resp, "chosen": chosen, "rejected": rejected, "irpo_pair": pair_id, "irpo_side": side}
            for resp, side in ((chosen, 1), (rejected, 0))]


@TASKS.register("irpo_prefs", needs=("text",))
def irpo_prefs(*, irpo_prefs_seed: int = param(0, "irpo_prefs: seed of the wrong answers of the rejected "
                                                  "responses")) -> Task:
    """Preference pairs (right vs wrong arithmetic answers) as pointwise judging prompts for a generative reward
    model trained with IRPO (module docstring).

    Provenance: reconstructed from the abstract — IRPO (Song et al., 2026, arXiv:2601.00677, seed 000-21): a
    pointwise GRM trained with GRPO and a Bradley-Terry model over its scores; the paper's exact reward was not
    read. Choices: G judgements per response form a group; a judgement's reward is its mean BT likelihood of the
    known preference against the other response's judgements in the step (``intergroup_bt_rewards``), 0 when
    unparseable, 0.5 with no opposing score; scores are integers 0..10 ending the judgement. The data (arithmetic
    right vs wrong answers) are grpolab's own.
    """
    base = arithmetic()
    rng = random.Random(irpo_prefs_seed)

    def rows(src, tag):
        out = []
        for i, row in enumerate(src):
            d = rng.choice((-3, -2, -1, 1, 2, 3))
            out += _pair_rows(row, f"{tag}{i}", int(row["answer"]) + d)
        return out

    return Task("irpo_prefs", rows(base.train_rows, "t"), rows(base.eval_rows, "e"),
                rewards=[("irpo_bt", irpo_bt, 1.0), ("judge_format", judge_format, 0.0),
                         ("pair_accuracy", pair_accuracy, 0.0)],
                accuracy_reward="pair_accuracy",
                description="a generative reward model judges arithmetic answers (right vs wrong) pointwise, "
                            "ending with 'Score: N'; rewarded by the Bradley-Terry likelihood of the known "
                            "preference between the two responses' scores (IRPO)")
