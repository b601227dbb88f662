"""Built-in agent tasks: ``calculator``, ``search_qa`` and ``gridworld``, each with its environment.

Every task is generated in-process from a seed (same seed, same rows), has a
held-out split disjoint from the training split, and hands the agent rollout
its environment as ``Task.extra["environment"]``: a factory ``factory(row)``
that returns a fresh :class:`~grpolab.agents.base.AgentEnv` for one episode
(the tool tasks: :class:`~grpolab.agents.adapters.ToolsEnv` with their one
tool; ``gridworld``: :class:`GridWorldEnv`). The task functions are marked
with :func:`~grpolab.tasks.base.provides_environment`, so ``--task NAME``
alone selects the ``agent`` rollout strategy. The ``calculator`` and
``search_qa`` prompts start with one worked example (``demo``, see
:func:`demonstration`).

* ``calculator``: products of two 5-8 digit numbers, some followed by ``+ c``
  or ``- c``. Too large to multiply reliably in one's head; the environment
  offers the exact :func:`~grpolab.agents.tools.calculator` tool. Rewards as
  ``arithmetic``: ``accuracy`` (1.0, the integer after the last ``Answer:``
  equals the result), ``format`` (0.5).
* ``search_qa``: questions about the fictional world of
  :mod:`grpolab.agents.knowledge`, following a chain of 1 to 3 relations
  ("In which country are the headquarters of the company Mira Tolvane works
  for?"). The environment offers the BM25 :func:`~grpolab.agents.tools.search`
  tool over that world's documents. Some one-relation questions come with the
  entity's document in the prompt (``searches_needed`` 0: no search needed);
  the others need one search per relation (``searches_needed`` = ``hops``),
  checked on the document texts when the questions are generated (a question is
  kept only if no shorter chain of documents leads to its answer). Held-out
  questions start from entities no training question starts from. Rewards:
  ``accuracy`` (1.0, exact match of the normalised text after the last
  ``Answer:``), ``format`` (0.5).
* ``gridworld``: find a key hidden in one room of a small square house (3 x 3
  rooms by default), a text game in gym style. Each turn the model names one
  action: ``move north|south|east|west`` (costs 1 unit of *time*), or ``ask``
  (a person says where the key is relative to you; costs 2 units of their
  *attention*). An unrecognised action costs 1 unit of time and changes
  nothing. The episode ends when the key is found or after ``max_steps``
  actions. Per-step reward ``1.0`` on finding the key minus
  ``0.05 x`` the action's cost; each step's ``info`` states ``cost`` (the
  action's total cost), ``costs`` (per kind: ``time``, ``attention``),
  ``total_cost`` and ``total_costs`` (per kind) so far, ``action``,
  ``position``, ``success`` (the episode record keeps the last step's
  ``info``, so it holds the episode's totals). ``state_key()`` is the
  room the agent is in (with the instance's start and key), so the same state
  recurs across the episodes of a group (for anchor-state methods such as
  GiGPO). Reward: ``success`` (1.0, read from the episode record: the key was
  found).
"""
from __future__ import annotations

import json
import random
import re
from typing import Callable

from ..agents.adapters import ToolsEnv
from ..agents.base import AgentEnv, StepResult
from ..agents.parsing import TOOL_CALL_CLOSE, TOOL_CALL_OPEN
from ..agents.knowledge import DocumentLinks, KnowledgeBase, generate, normalise
from ..agents.tools import calculator as calculator_tool
from ..agents.tools import make_search_tool
from ..data import completion_text
from ..registry import TASKS, param
from .arithmetic import REWARDS as ARITHMETIC_REWARDS, lenient_accuracy
from .base import Task, provides_environment
from .gym import FORMAT, extract_answer

def tool_call_syntax(name: str, arguments: dict) -> str:
    """How a prompt shows a tool call (the Hermes/Qwen form the rollout parses)."""
    return f"{TOOL_CALL_OPEN}{json.dumps({'name': name, 'arguments': arguments})}{TOOL_CALL_CLOSE}"


def tool_env(tool: Callable) -> Callable[[dict], AgentEnv]:
    """The environment factory of a task that offers one tool: a fresh :class:`ToolsEnv` per episode (a turn
    with tool calls gets their answers; a turn without one is the final answer and ends the episode)."""
    return lambda row: ToolsEnv([tool])


def tool_answer(output: str) -> dict:
    """A tool's answer in a worked example, as the agent rollout shows it to a model whose chat template has no
    tools support (SmolLM2, the tiny test model): a ``tool`` message wrapped in ``<tool_response>`` tags."""
    return {"role": "tool", "content": f"<tool_response>\n{output}\n</tool_response>"}


def demonstration(turns: list[tuple[str, str]]) -> list[dict]:
    """The chat messages of a worked example given as ``(role, content)`` pairs (question, tool calls and
    answers, final answer); role ``tool`` becomes :func:`tool_answer`."""
    return [tool_answer(content) if role == "tool" else {"role": role, "content": content}
            for role, content in turns]


# -------------------------------------------------------------- calculator
CALC_SYSTEM = ("You are a helpful assistant with a calculator tool for exact arithmetic. To use it, reply with " +
               tool_call_syntax("calculator", {"expression": "..."}) +
               " and wait for the result. Then reply with 'Answer:' followed by the number.")
CALC_DEMO = demonstration([
    ("user", "Compute 123456 * 654321 + 999."),
    ("assistant", tool_call_syntax("calculator", {"expression": "123456 * 654321 + 999"})),
    ("tool", str(123456 * 654321 + 999)),
    ("assistant", f"Answer: {123456 * 654321 + 999}"),
])


def _calc_prompt(question: str, demo: bool) -> list[dict]:
    content = f"Compute {question}."
    return ([{"role": "system", "content": CALC_SYSTEM}] + (list(CALC_DEMO) if demo else []) +
            [{"role": "user", "content": content}])


def calc_problem(rng: random.Random, min_digits: int = 5, max_digits: int = 8, demo: bool = True) -> dict:
    """``a * b`` with ``a, b`` of ``min_digits..max_digits`` digits; half of them followed by ``+ c`` or ``- c``."""
    def number():
        d = rng.randint(min_digits, max_digits)
        return rng.randint(10 ** (d - 1), 10 ** d - 1)

    a, b = number(), number()
    question, value = f"{a} * {b}", a * b
    if rng.random() < 0.5:
        c, op = number(), rng.choice("+-")
        question, value = f"{question} {op} {c}", value + c if op == "+" else value - c
    return {"prompt": _calc_prompt(question, demo), "question": question, "answer": str(value),
            "level": question.count(" ") // 2}


@TASKS.register("calculator", needs=("text",))
@provides_environment
def calculator(n_train: int = 2000, n_eval: int = 200, seed: int = 1234, min_digits: int = 5,
               max_digits: int = 8, demo: bool = True) -> Task:
    """``n_train + n_eval`` distinct large-number problems drawn with ``seed``; the first ``n_eval`` are held out.
    The environment offers the calculator tool; ``demo``: the prompt starts with one worked example (a tool call,
    its answer, the final answer) as chat turns.

    Provenance: grpolab's own — a built-in agent task (large products that need a calculator tool) for tests
    and demos; implements no published method.
    """
    rng = random.Random(seed)
    rows, seen = [], set()
    while len(rows) < n_train + n_eval:
        row = calc_problem(rng, min_digits, max_digits, demo)
        if row["question"] not in seen:
            seen.add(row["question"])
            rows.append(row)
    return Task("calculator", rows[n_eval:], rows[:n_eval], rewards=list(ARITHMETIC_REWARDS),
                accuracy_reward="accuracy",
                description=f"a * b (+/- c) with {min_digits}-{max_digits} digit numbers, calculator tool, "
                            f"'Answer: N' format",
                extra={"environment": tool_env(calculator_tool),
                       "lenient_accuracy": lenient_accuracy})


# --------------------------------------------------------------- search_qa
# (start kind, relations, question template): the question follows the relations from the start entity
CHAINS = [
    ("person", ("born_in",), "In which city was {x} born?"),
    ("person", ("works_for",), "Which company does {x} work for?"),
    ("person", ("birth_year",), "In which year was {x} born?"),
    ("person", ("profession",), "What is the profession of {x}?"),
    ("company", ("headquarters",), "In which city are the headquarters of {x}?"),
    ("company", ("founded",), "In which year was {x} founded?"),
    ("company", ("founder",), "Who founded {x}?"),
    ("city", ("country",), "In which country is {x}?"),
    ("city", ("population",), "What is the population of {x}?"),
    ("country", ("capital",), "What is the capital of {x}?"),
    ("country", ("language",), "What is the official language of {x}?"),
    ("person", ("born_in", "country"), "In which country was {x} born?"),
    ("person", ("born_in", "population"), "What is the population of the city where {x} was born?"),
    ("person", ("works_for", "headquarters"), "In which city are the headquarters of the company {x} works for?"),
    ("person", ("works_for", "founder"), "Who founded the company {x} works for?"),
    ("person", ("works_for", "founded"), "In which year was the company {x} works for founded?"),
    ("company", ("headquarters", "country"), "In which country are the headquarters of {x}?"),
    ("company", ("founder", "born_in"), "In which city was the founder of {x} born?"),
    ("company", ("founder", "birth_year"), "In which year was the founder of {x} born?"),
    ("city", ("country", "capital"), "What is the capital of the country {x} is in?"),
    ("city", ("country", "language"), "What is the official language of the country {x} is in?"),
    ("person", ("works_for", "headquarters", "country"),
     "In which country are the headquarters of the company {x} works for?"),
    ("person", ("born_in", "country", "capital"), "What is the capital of the country where {x} was born?"),
    ("person", ("born_in", "country", "language"),
     "What is the official language of the country where {x} was born?"),
    ("person", ("works_for", "founder", "born_in"), "In which city was the founder of the company {x} works for born?"),
    ("company", ("founder", "born_in", "country"), "In which country was the founder of {x} born?"),
]
SEARCH_SYSTEM = ("You answer questions about a fictional world whose facts you cannot know: look them up with the "
                 "search tool, which returns encyclopedia entries. To search, reply with " +
                 tool_call_syntax("search", {"query": "a name"}) +
                 " and wait for the result; search once for each fact you need. When you know the answer, reply "
                 "with 'Answer:' followed by the answer.")
# a worked two-hop example about people and places that are not in any generated world (no syllable matches)
SEARCH_DEMO = demonstration([
    ("user", "In which country was Anna Pold born?"),
    ("assistant", tool_call_syntax("search", {"query": "Anna Pold"})),
    ("tool", "[1] Anna Pold: Anna Pold is a baker who was born in 1970 in the city of Brenn. Anna Pold "
                       "works for Quill Works.\n[2] Quill Works: Quill Works is a textile company founded in 1921 "
                       "by Anna Pold. The headquarters of Quill Works are in Brenn."),
    ("assistant", tool_call_syntax("search", {"query": "Brenn"})),
    ("tool", "[1] Brenn: Brenn is a city in Oster with a population of 120381.\n[2] Anna Pold: Anna "
                       "Pold is a baker who was born in 1970 in the city of Brenn. Anna Pold works for Quill Works."),
    ("assistant", "Answer: Oster"),
])


def qa_questions(kb: KnowledgeBase) -> list[dict]:
    """Every question of :data:`CHAINS` about ``kb`` whose answer needs exactly one document per relation."""
    links = DocumentLinks(kb.documents, kb.names())
    out = []
    for kind, relations, template in CHAINS:
        for x in kb.names(kind):
            path = kb.follow(x, relations)
            if x in path or len(set(path)) < len(path):   # a chain that comes back is no multi-hop question
                continue
            if links.needed(x, path[-1]) != len(relations):
                continue
            out.append({"question": template.format(x=x), "answer": path[-1], "entity": x,
                        "relations": list(relations), "path": path, "hops": len(relations)})
    return out


def _qa_row(q: dict, context: str, demo: bool) -> dict:
    user = (f"Encyclopedia entry: {context}\n\n" if context else "") + q["question"]
    prompt = ([{"role": "system", "content": SEARCH_SYSTEM}] + (list(SEARCH_DEMO) if demo else []) +
              [{"role": "user", "content": user}])
    return {**q, "prompt": prompt, "context": context, "searches_needed": 0 if context else q["hops"]}


def qa_accuracy(prompts=None, completions=None, answer=None, **kwargs) -> list[float]:
    out = []
    for c, a in zip(completions, answer):
        got = extract_answer(completion_text(c))
        out.append(1.0 if got is not None and normalise(got) == normalise(a) else 0.0)
    return out


def qa_lenient_accuracy(prompts=None, completions=None, answer=None, **kwargs) -> list[float]:
    """Evaluation only: 1.0 if the final reply's answer (after the last ``Answer:``, or the whole reply when there
    is none) *begins* with the true answer after normalising, whatever follows it (``Answer: Brenn, a city`` is
    right; a copied entry that starts with a name is not), so a gain in finding the answer is told apart from a
    gain in the format."""
    out = []
    for c, a in zip(completions, answer):
        text = completion_text(c)
        got, want = normalise(extract_answer(text) or text), normalise(a)
        out.append(1.0 if want and (got == want or got.startswith(want + " ")) else 0.0)
    return out


def qa_format(prompts=None, completions=None, **kwargs) -> list[float]:
    return [1.0 if FORMAT.search(completion_text(c)) else 0.0 for c in completions]


@TASKS.register("search_qa", needs=("text",))
@provides_environment
def search_qa(n_eval: int = 200, seed: int = 1234, kb_seed: int = 0, eval_share: float = 0.2,
              context_share: float = 0.4, demo: bool = True, *,
              search_qa_hops: list = param([1, 2, 3], "search_qa: the chain lengths (hops) to keep, e.g. 1 "
                                                      "(--search_qa_hops 1) for one-hop questions only")) -> Task:
    """Every question of the world ``kb_seed`` (see :func:`qa_questions`), shuffled with ``seed``. Start
    entities are split with ``seed``: about ``eval_share`` of them give the held-out questions (at most
    ``n_eval``, the others are dropped), the rest the training questions. A one-relation question shows its
    entity's document in the prompt with probability ``context_share`` (no search needed). ``demo``: the prompt
    starts with one worked two-hop example (two searches, their results, the answer) as chat turns.
    ``search_qa_hops``: only questions of these chain lengths are kept (after the split and the shuffle, so the
    kept rows keep their order and their prompts).

    Provenance: grpolab's own — a built-in agent task (multi-hop questions over a generated knowledge base with
    a BM25 search tool) for tests and demos; implements no published method.
    """
    try:
        hops = {int(h) for h in search_qa_hops}
    except (TypeError, ValueError):
        hops = set()
    if not hops or not hops <= {1, 2, 3}:
        raise ValueError(f"search_qa_hops: a non-empty list of chain lengths from 1, 2, 3, got {search_qa_hops!r}")
    kb = generate(kb_seed)
    rng = random.Random(seed)
    starts = kb.names()
    rng.shuffle(starts)
    held = set(starts[:round(eval_share * len(starts))])
    train, evals = [], []
    for q in qa_questions(kb):
        context = kb.doc(q["entity"]) if q["hops"] == 1 and rng.random() < context_share else ""
        (evals if q["entity"] in held else train).append(_qa_row(q, context, demo))
    rng.shuffle(train)
    rng.shuffle(evals)
    train, evals = [r for r in train if r["hops"] in hops], [r for r in evals if r["hops"] in hops]
    return Task("search_qa", train, evals[:n_eval],
                rewards=[("accuracy", qa_accuracy, 1.0), ("format", qa_format, 0.5)], accuracy_reward="accuracy",
                description="1-3 hop questions over a generated knowledge base, BM25 search tool, "
                            "'Answer: ...' format (exact match)",
                extra={"environment": tool_env(make_search_tool(kb)), "lenient_accuracy": qa_lenient_accuracy})


# --------------------------------------------------------------- gridworld
MOVES = {"north": (-1, 0), "south": (1, 0), "west": (0, -1), "east": (0, 1)}
COSTS = {**{m: {"time": 1.0} for m in MOVES}, "ask": {"attention": 2.0}, None: {"time": 1.0}}
GOAL_REWARD = 1.0      # step reward for finding the key
COST_PENALTY = 0.05    # step reward -= COST_PENALTY * the action's total cost
ACTION = re.compile(r"\b(?:(?:move|go)\s+)?(north|south|east|west)\b|\b(ask)\b", re.I)
GRID_SYSTEM = "You play a text game. Each turn, reply with exactly one action."


def _where(r: int, c: int) -> str:
    return f"room (row {r + 1}, column {c + 1})"


def _exits(size: int, r: int, c: int) -> str:
    return ", ".join(m for m, (dr, dc) in MOVES.items() if 0 <= r + dr < size and 0 <= c + dc < size)


def parse_action(text: str) -> str | None:
    """The action of a turn: the first one named after the last ``Action:``, else the first one in the text."""
    tail = text[text.rfind("Action:"):] if "Action:" in text else text
    m = ACTION.search(tail)
    return None if m is None else (m.group(1) or m.group(2)).lower()


class GridWorldEnv(AgentEnv):
    """One episode of ``gridworld`` for a row (``size``, ``start``, ``key``, ``max_steps``)."""
    tools: list = []

    def reset(self, row: dict, seed: int) -> str:
        self.size, self.key, self.max_steps = int(row["size"]), tuple(row["key"]), int(row["max_steps"])
        self.start = self.pos = tuple(row["start"])
        self.steps, self.total_cost, self.found = 0, 0.0, False
        self.total_costs = {"time": 0.0, "attention": 0.0}
        return ""

    def state_key(self) -> str:
        return f"{self.size}x{self.size} start={self.start} key={self.key} at={self.pos}"

    def step(self, action: str) -> StepResult:
        act = parse_action(action)
        costs = dict(COSTS[act])
        cost = sum(costs.values())
        self.steps += 1
        self.total_cost += cost
        for kind, c in costs.items():
            self.total_costs[kind] += c
        r, c = self.pos
        if act is None:
            obs = "That is not an action. Reply with one of: move north, move south, move east, move west, ask."
        elif act == "ask":
            dr, dc = self.key[0] - r, self.key[1] - c
            parts = [f"{abs(dr)} {'room' if abs(dr) == 1 else 'rooms'} {'south' if dr > 0 else 'north'}"] if dr else []
            parts += [f"{abs(dc)} {'room' if abs(dc) == 1 else 'rooms'} {'east' if dc > 0 else 'west'}"] if dc else []
            obs = f"A helper says: the key is {' and '.join(parts)} of you."
        else:
            dr, dc = MOVES[act]
            if 0 <= r + dr < self.size and 0 <= c + dc < self.size:
                self.pos = (r + dr, c + dc)
                obs = f"You go {act}."
            else:
                obs = f"There is a wall to the {act}."
            if self.pos == self.key:
                self.found = True
        if self.found:
            obs += f" You are in {_where(*self.pos)}. You found the key!"
        else:
            obs += f" You are in {_where(*self.pos)}. Exits: {_exits(self.size, *self.pos)}."
        done = self.found or self.steps >= self.max_steps
        if done and not self.found:
            obs += " You are out of time: the game is over."
        reward = (GOAL_REWARD if self.found else 0.0) - COST_PENALTY * cost
        info = {"action": act, "cost": cost, "costs": costs, "total_cost": self.total_cost,
                "total_costs": dict(self.total_costs),
                "position": list(self.pos), "success": self.found, "invalid": act is None}
        return StepResult(observation=obs, reward=reward, done=done, info=info)


def _grid_prompt(size: int, start: tuple, max_steps: int) -> list[dict]:
    content = (f"A key is hidden in one room of a house of {size} x {size} rooms (row 1 is the north side, "
               f"column 1 the west side). You are in {_where(*start)}; exits: {_exits(size, *start)}. Find the key "
               f"within {max_steps} actions. Actions: 'move north', 'move south', 'move east', 'move west' (each "
               f"costs 1 minute), or 'ask' (a helper tells you where the key is; costs 2 units of their "
               f"attention). Use as little time and attention as you can. Reply with 'Action:' followed by one "
               f"action.")
    return [{"role": "system", "content": GRID_SYSTEM}, {"role": "user", "content": content}]


def grid_success(prompts=None, completions=None, episode=None, **kwargs) -> list[float]:
    """1.0 if the episode found the key (the last step's ``info["success"]``), else 0.0."""
    if episode is None:
        raise ValueError("gridworld's 'success' reward reads the episode record (keyword 'episode'); train or "
                         "evaluate it with the agent rollout (rollout_strategy: agent)")
    return [1.0 if (ep or {}).get("info", {}).get("success") else 0.0 for ep in episode]


@TASKS.register("gridworld", needs=("text",))
@provides_environment
def gridworld(size: int = 3, n_eval: int = 12, seed: int = 1234, max_steps: int = 10) -> Task:
    """Every (start, key) pair of distinct rooms of a ``size`` x ``size`` house (72 for 3 x 3), shuffled with
    ``seed``; the first ``n_eval`` are held out. A gym-style text environment with costed actions.

    Provenance: grpolab's own — a built-in stateful text game (find a key on a small grid with costed move / ask
    actions) for tests and demos of agent methods; implements no published method.
    """
    if size < 2 or max_steps < 1:
        raise ValueError(f"gridworld: expected size >= 2 and max_steps >= 1, got size={size}, max_steps={max_steps}")
    cells = [(r, c) for r in range(size) for c in range(size)]
    pairs = [(s, k) for s in cells for k in cells if s != k]
    random.Random(seed).shuffle(pairs)
    if not 0 < n_eval < len(pairs):
        raise ValueError(f"gridworld: n_eval must be 1..{len(pairs) - 1} for size {size}, got {n_eval}")
    rows = [{"prompt": _grid_prompt(size, s, max_steps), "question": f"start {_where(*s)}, key {_where(*k)}",
             "size": size, "start": list(s), "key": list(k), "max_steps": max_steps,
             "optimal_moves": abs(s[0] - k[0]) + abs(s[1] - k[1])} for s, k in pairs]
    return Task("gridworld", rows[n_eval:], rows[:n_eval], rewards=[("success", grid_success, 1.0)],
                accuracy_reward="success",
                description=f"find a key in a {size} x {size} house: move (time cost 1) / ask (attention cost 2), "
                            f"per-step rewards, state_key = the room",
                extra={"environment": lambda row: GridWorldEnv()})
