"""``delegate_facts``: a question a main agent answers best by calling a sub-agent (the ``m_grpo`` rollout).

Each row asks in which country a person lives. The main agent's view (column ``main_facts``) gives the country
of ``delegate_facts_cities`` cities, the person's city among them; the sub-agent's view (``sub_facts``) is a small
directory of where ``delegate_facts_people`` people live, the asked person among them. Alone, the main agent can
only guess among its cities (chance ``1 / delegate_facts_cities``); if it calls the sub-agent with a subtask that
names the person (``<call>Where does Ann live?</call>``) and the sub-agent reads its directory, the main agent can
read the country from its own facts and answer ``<answer>Italy</answer>``. The sub-agent must read the subtask:
its directory lists several people.

Rewards (the main agent's final message; the sub-agent's rows get the reward of the main rollout that called them):

* ``accuracy`` (weight 1.0): 1.0 if the person's country is a word of the text inside ``<answer>...</answer>``
  (the text after ``<answer>`` when it is not closed), else 0.0 (no ``<answer>``: 0.0);
* ``format`` (weight 0.2): 1.0 if the final message holds ``<answer>...</answer>``, else 0.0.

Columns: ``person``, ``city``, ``answer`` (the country), ``main_facts``, ``sub_facts``, ``candidates``.

``delegate_sums``: a question whose answer needs the sub-agent's notes *and* its calculator (the sub-agent's tool,
``m_grpo_sub_tools: [calculator]``). Each row asks what a person pays; the sub-agent's view (``sub_facts``) lists
the orders of ``delegate_sums_people`` people (``Ann buys 17 pens at 23 coins each plus 4 coins shipping.``), the
main agent's view (``main_facts``) only says how totals are made. The answer is ``quantity * price + shipping``.
Rewards: ``accuracy`` (1.0): the total is a number of the ``<answer>`` text; ``format`` (0.2) as above.
"""
from __future__ import annotations

import random
import re

from ..data import completion_text
from ..registry import TASKS, param
from .base import Task, check_held_out, check_range
from .team_tasks import CITIES, PEOPLE
from .text_similarity import words

ITEMS = ["pens", "cups", "books", "lamps", "bags", "hats", "plates", "shirts"]
SUMS_MAIN_FACTS = "A total is the quantity times the price plus the shipping."
SUMS_ROLES = [{"name": "main", "prompt": "You are the main agent. Your helper knows what people buy and has a "
               "calculator: ask it with <call>question</call>. Then answer with the total: <answer>number</answer>.",
               "view": "main_facts"},
              {"name": "sub", "prompt": "You are the helper. Find the person's order in your notes, compute the total "
               "with the calculator tool, then reply with the total in one sentence.", "view": "sub_facts"}]
_NUMBER = re.compile(r"-?\d+")

MAIN_PROMPT = ("You are the main agent. Your helper knows where people live: ask it with <call>question</call>. "
               "Then answer with the country: <answer>country</answer>.")
SUB_PROMPT = "You are the helper. Answer the question from your notes in one sentence."
ROLES = [{"name": "main", "prompt": MAIN_PROMPT, "view": "main_facts"},
         {"name": "sub", "prompt": SUB_PROMPT, "view": "sub_facts"}]
_ANSWER = re.compile(r"<answer>(.*?)(?:</answer>|$)", re.S)


def answer_text(text: str) -> str | None:
    """The text inside the first ``<answer>...</answer>`` of ``text`` (to the end when unclosed), or None."""
    m = _ANSWER.search(str(text))
    return None if m is None else m.group(1).strip()


def delegate_accuracy(prompts=None, completions=None, answer=None, **kwargs) -> list[float]:
    """1.0 when the person's country is a word of the ``<answer>`` text, else 0.0."""
    out = []
    for c, a in zip(completions, answer):
        said = answer_text(completion_text(c))
        out.append(1.0 if said is not None and str(a).lower() in set(words(said)) else 0.0)
    return out


def delegate_format(prompts=None, completions=None, **kwargs) -> list[float]:
    """1.0 when the final message holds a closed ``<answer>...</answer>``, else 0.0."""
    return [1.0 if re.search(r"<answer>.*?</answer>", completion_text(c), re.S) else 0.0 for c in completions]


REWARDS = [("accuracy", delegate_accuracy, 1.0), ("format", delegate_format, 0.2)]


def sums_accuracy(prompts=None, completions=None, answer=None, **kwargs) -> list[float]:
    """1.0 when the total is one of the numbers of the ``<answer>`` text, else 0.0."""
    out = []
    for c, a in zip(completions, answer):
        said = answer_text(completion_text(c))
        out.append(1.0 if said is not None and str(a) in _NUMBER.findall(said.replace(",", "")) else 0.0)
    return out


SUMS_REWARDS = [("accuracy", sums_accuracy, 1.0), ("format", delegate_format, 0.2)]


@TASKS.register("delegate_facts", needs=("text",))
def delegate_facts(*,
                   delegate_facts_cities: int = param(3, "delegate_facts: cities whose country the main agent "
                                                         "sees (2..10); chance without the sub-agent is 1 / this"),
                   delegate_facts_people: int = param(3, "delegate_facts: people in the sub-agent's directory "
                                                         "(1..20), the asked one among them"),
                   delegate_facts_rows: int = param(200, "delegate_facts: rows (drawn with the seed)"),
                   delegate_facts_eval: int = param(40, "delegate_facts: of them held out for evaluation"),
                   delegate_facts_seed: int = param(1234, "delegate_facts: seed of the rows (fixes the split)")
                   ) -> Task:
    """Rows of (person, city): the main agent knows the countries of a few cities, the sub-agent a directory of
    where a few people live; the answer is the person's country. The first ``delegate_facts_eval`` rows are held
    out.

    Provenance: grpolab's own — a built-in toy task for the hierarchical main / sub-agent rollout (M-GRPO,
    seed 000-65, where the sub-agents are the ones with the tools, search and browse): here the sub-agent's
    "tool" is the directory only it sees; implements no published method.
    """
    check_range("delegate_facts_cities", delegate_facts_cities, 2, len(CITIES))
    check_range("delegate_facts_people", delegate_facts_people, 1, len(PEOPLE))
    check_held_out("delegate_facts_eval", delegate_facts_eval, delegate_facts_rows)
    rng = random.Random(delegate_facts_seed)
    rows = []
    for _ in range(delegate_facts_rows):
        shown = rng.sample(CITIES, delegate_facts_cities)
        city, country = rng.choice(shown)
        people = rng.sample(PEOPLE, delegate_facts_people)
        person = people[0]
        homes = {person: city} | {p: rng.choice(CITIES)[0] for p in people[1:]}
        rng.shuffle(people)
        rows.append({"prompt": [{"role": "user", "content": f"In which country does {person} live?"}],
                     "person": person, "city": city, "answer": country,
                     "main_facts": " ".join(f"{c} is in {k}." for c, k in shown),
                     "sub_facts": " ".join(f"{p} lives in {homes[p]}." for p in people),
                     "candidates": [k for _, k in shown]})
    return Task("delegate_facts", rows[delegate_facts_eval:], rows[:delegate_facts_eval], rewards=list(REWARDS),
                accuracy_reward="accuracy",
                description=f"a person's country: the main agent knows the countries of {delegate_facts_cities} "
                            f"cities, its sub-agent where {delegate_facts_people} people live; the main agent "
                            f"must call it (rollout_strategy m_grpo)")


@TASKS.register("delegate_sums", needs=("text",))
def delegate_sums(*,
                  delegate_sums_people: int = param(3, "delegate_sums: orders in the sub-agent's notes (1..20), the "
                                                       "asked person's among them"),
                  delegate_sums_rows: int = param(200, "delegate_sums: rows (drawn with the seed)"),
                  delegate_sums_eval: int = param(40, "delegate_sums: of them held out for evaluation"),
                  delegate_sums_seed: int = param(4321, "delegate_sums: seed of the rows (fixes the split)")) -> Task:
    """Rows of (person, order): the sub-agent's notes list a few people's orders (quantity 11..49, price 11..49,
    shipping 1..9), the answer is the asked person's total ``quantity * price + shipping``. The first
    ``delegate_sums_eval`` rows are held out.

    Provenance: grpolab's own — a built-in toy task for the hierarchical rollout with a multi-turn, tool-using
    sub-agent (M-GRPO, seed 000-65, whose sub-agents execute tools): only the sub-agent sees the orders, and the
    products are large enough that its calculator helps; implements no published method.
    """
    check_range("delegate_sums_people", delegate_sums_people, 1, len(PEOPLE))
    check_held_out("delegate_sums_eval", delegate_sums_eval, delegate_sums_rows)
    rng = random.Random(delegate_sums_seed)
    rows = []
    for _ in range(delegate_sums_rows):
        people = rng.sample(PEOPLE, delegate_sums_people)
        orders = {p: (rng.randint(11, 49), rng.choice(ITEMS), rng.randint(11, 49), rng.randint(1, 9)) for p in people}
        person = people[0]
        q, item, price, ship = orders[person]
        rng.shuffle(people)
        rows.append({"prompt": [{"role": "user", "content": f"How much does {person} pay in total?"}],
                     "person": person, "answer": str(q * price + ship), "main_facts": SUMS_MAIN_FACTS,
                     "sub_facts": " ".join(f"{p} buys {orders[p][0]} {orders[p][1]} at {orders[p][2]} coins each "
                                           f"plus {orders[p][3]} coins shipping." for p in people)})
    return Task("delegate_sums", rows[delegate_sums_eval:], rows[:delegate_sums_eval], rewards=list(SUMS_REWARDS),
                accuracy_reward="accuracy",
                description=f"a person's total: the sub-agent knows the orders of {delegate_sums_people} people and "
                            f"has the calculator; the main agent must call it (rollout_strategy m_grpo, "
                            f"m_grpo_sub_tools [calculator])")
