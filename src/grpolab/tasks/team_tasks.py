"""``split_facts``: a question two roles can answer only together (the cooperative task of the ``team`` rollout).

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

from ..data import completion_text
from ..errors import ConfigError
from ..registry import TASKS, param
from .base import Task
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
    if not 2 <= split_facts_cities <= len(CITIES):
        raise ConfigError(f"split_facts_cities: expected 2..{len(CITIES)}, got {split_facts_cities}")
    if not 0 <= split_facts_eval < split_facts_rows:
        raise ConfigError(f"split_facts_eval: expected 0..{split_facts_rows - 1}, got {split_facts_eval}")
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
