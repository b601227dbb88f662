"""Tasks for several roles in one run (the ``team`` rollout): ``split_facts`` (cooperative) and ``propose_solve``
(a proposer/solver game).

``split_facts``: a question two roles can answer only together.

Each row asks in which country a person lives. The scout's view (column ``scout_facts``) says the person's
city; the solver's view (``solver_facts``) says the country of ``split_facts_cities`` cities, the person's among
them, in random order. The solver alone can only guess among them (chance ``1 / split_facts_cities``); told the
city by the scout, it can read the answer from its own facts. So the team's accuracy against the same team with
``team_channel: off`` measures what the roles gain by talking.

Rewards:

* ``accuracy`` (weight 1.0): 1.0 if the person's country is a word of the reply (lower-cased words), else 0.0.

Columns: ``person``, ``city``, ``answer`` (the country), ``scout_facts``, ``solver_facts``, ``candidates`` (the
countries the solver sees).
"""
from __future__ import annotations

import random
import re

from ..data import completion_text
from ..errors import ConfigError
from ..registry import TASKS, param
from .base import Task, check_held_out, check_range
from .text_similarity import words

PEOPLE = ["Ann", "Ben", "Cleo", "Dan", "Eva", "Finn", "Gus", "Hana", "Ivan", "Jade", "Kai", "Lena", "Max", "Nora",
          "Omar", "Pia", "Quin", "Rosa", "Sam", "Tara"]
CITIES = [("Paris", "France"), ("Rome", "Italy"), ("Oslo", "Norway"), ("Lima", "Peru"), ("Cairo", "Egypt"),
          ("Tokyo", "Japan"), ("Madrid", "Spain"), ("Athens", "Greece"), ("Havana", "Cuba"), ("Nairobi", "Kenya")]
SCOUT_PROMPT = "You are the scout. Tell your partner where the person lives."
SOLVER_PROMPT = "You are the solver. Use what your partner says and your facts. Answer with the country."


def team_accuracy(prompts=None, completions=None, answer=None, **kwargs) -> list[float]:
    """1.0 when the person's country is a word of the reply, else 0.0."""
    return [1.0 if str(a).lower() in set(words(completion_text(c))) else 0.0 for c, a in zip(completions, answer)]


REWARDS = [("accuracy", team_accuracy, 1.0)]
ROLES = [{"name": "scout", "prompt": SCOUT_PROMPT, "view": "scout_facts"},
         {"name": "solver", "prompt": SOLVER_PROMPT, "view": "solver_facts"}]


@TASKS.register("split_facts", needs=("text",))
def split_facts(*,
                split_facts_cities: int = param(3, "split_facts: cities whose country the solver sees (2..10); "
                                                   "chance without the scout is 1 / this"),
                split_facts_rows: int = param(200, "split_facts: rows (persons x cities drawn with the seed)"),
                split_facts_eval: int = param(40, "split_facts: of them held out for evaluation"),
                split_facts_seed: int = param(1234, "split_facts: seed of the rows (fixes the split)")) -> Task:
    """Rows of (person, city): the scout knows the city, the solver the countries of a few cities (the
    person's among them); the answer is the person's country. The first ``split_facts_eval`` rows are held out.

    Provenance: grpolab's own — a built-in toy task for the multi-role rollout (issue 26's "two roles that each
    see half the facts of a search_qa-style question and must exchange them"); implements no published method.
    """
    check_range("split_facts_cities", split_facts_cities, 2, len(CITIES))
    check_held_out("split_facts_eval", split_facts_eval, split_facts_rows)
    rng = random.Random(split_facts_seed)
    rows = []
    for _ in range(split_facts_rows):
        person = rng.choice(PEOPLE)
        shown = rng.sample(CITIES, split_facts_cities)
        city, country = rng.choice(shown)
        rows.append({"prompt": [{"role": "user", "content": f"In which country does {person} live?"}],
                     "person": person, "city": city, "answer": country,
                     "scout_facts": f"{person} lives in {city}.",
                     "solver_facts": " ".join(f"{c} is in {k}." for c, k in shown),
                     "candidates": [k for _, k in shown]})
    return Task("split_facts", rows[split_facts_eval:], rows[:split_facts_eval], rewards=list(REWARDS),
                accuracy_reward="accuracy",
                description=f"a person's country: the scout knows the city, the solver the countries of "
                            f"{split_facts_cities} cities; they must talk (rollout_strategy team)")


# ------------------------------------------------------------------------------------- proposer / solver
PROPOSER_PROMPT = "You are the proposer. Write one question A+B with whole numbers A and B from 1 to the limit."
SOLVER_GAME_PROMPT = "You are the solver. Answer the proposer's question with one number."
GAME_ROLES = [{"name": "proposer", "prompt": PROPOSER_PROMPT}, {"name": "solver", "prompt": SOLVER_GAME_PROMPT}]
_SUMS = re.compile(r"\d+(?:\s*\+\s*\d+)+")  # every chain of numbers joined by +
_NUMBER = re.compile(r"-?\d+")


def proposed_question(text: str, limit: int) -> tuple[int, int] | None:
    """``(A, B)`` when ``text`` asks exactly one sum, ``A+B``, of whole numbers in 1..limit; else None (no sum,
    two sums, or a chain such as ``1 + 2 + 3``: SmolLM2's proposer learnt to write chains the solver then
    "got wrong", when the first ``A+B`` of any text counted as the question)."""
    sums = _SUMS.findall(str(text))
    if len(sums) != 1:
        return None
    terms = [int(t) for t in _NUMBER.findall(sums[0])]
    if len(terms) != 2:
        return None
    a, b = terms
    return (a, b) if 1 <= a <= limit and 1 <= b <= limit else None


def game_reward(prompts=None, completions=None, role=None, team_transcript=None, limit=None, **kwargs):
    """Per role (``team_reward: per_role``), from the team episode's transcript:

    * solver: 1.0 if the first number of its final message is A + B of the proposer's question, else 0.0;
      unscorable (None) when the proposer asked no valid question (nothing to learn from);
    * proposer: 1.0 for a valid question the solver got wrong, 0.0 for one it solved or an invalid question.
    """
    if role is None or team_transcript is None:
        raise ValueError("propose_solve's reward reads the team rollout's columns 'role' and 'team_transcript' "
                         "(rollout_strategy: team, team_reward: per_role)")
    out = []
    for c, r, team, lim in zip(completions, role, team_transcript, limit):
        seats = {s["role"]: s for s in team}
        asked = seats.get("proposer", {}).get("turns") or [""]
        q = proposed_question(asked[-1], int(lim))
        said = (seats.get("solver", {}).get("turns") or [""])[-1]
        nums = _NUMBER.findall(said)
        solved = q is not None and bool(nums) and int(nums[0]) == q[0] + q[1]
        if r == "solver":
            out.append(None if q is None else float(solved))
        else:
            out.append(float(q is not None and not solved))
    return out


@TASKS.register("propose_solve", needs=("text",))
def propose_solve(*,
                  propose_solve_limits: list = param([9, 20, 50], "propose_solve: the limits a row may set for A "
                                                     "and B (one per row, cycled)"),
                  propose_solve_rows: int = param(60, "propose_solve: rows"),
                  propose_solve_eval: int = param(12, "propose_solve: of them held out")) -> Task:
    """A self-play game for two roles of one model: the proposer writes a question A+B within the row's limit,
    the solver answers it. Per-role rewards (:func:`game_reward`): the solver is right or wrong; the proposer
    wins with a valid question the solver gets wrong. Train with ``rollout_strategy: team`` and
    ``team_reward: per_role`` (the ``propose_solve`` roles: ``roles: [proposer, solver]``).

    Provenance: grpolab's own — a built-in proposer/solver game (issue 26) for the multi-role rollout;
    implements no published method (Dr. Zero's proposer reward, 000-110, is a different rule).
    """
    if not propose_solve_limits or any(int(x) < 1 for x in propose_solve_limits):
        raise ConfigError(f"propose_solve_limits: whole numbers >= 1, got {propose_solve_limits}")
    check_held_out("propose_solve_eval", propose_solve_eval, propose_solve_rows)
    rows = []
    for i in range(propose_solve_rows):
        lim = int(propose_solve_limits[i % len(propose_solve_limits)])
        rows.append({"prompt": [{"role": "user", "content": f"The limit is {lim}."}], "limit": lim,
                     "answer": "", "symbols": "0123456789 +=?"})  # what a tokenizer built from the data needs
    return Task("propose_solve", rows[propose_solve_eval:], rows[:propose_solve_eval],
                rewards=[("game", game_reward, 1.0)], accuracy_reward=None,
                description="proposer/solver self-play: A+B questions within a limit (team rollout, per-role "
                            "rewards)")
