"""``mas_build``: the policy builds a multi-agent system for each question, then the system runs (MasHost, seed
000-22).

MasHost (Yang et al., 2025, *MasHost Builds It All: Autonomous Multi-Agent System Directed by Reinforcement
Learning*, arXiv:2506.08507) casts the design of a multi-agent system as a graph search: node by node, the policy
picks an agent's role and the earlier agents it listens to. Here the causal LM writes that construction as text,
one **construction action** per line::

    agent 1: extract <- [query]
    agent 2: add <- [1]
    agent 3: answer <- [2]
    end

``agent N: ROLE <- [INPUTS]``: agent N (numbered 1, 2, 3, ... in order) with a role from the menu :data:`ROLES`;
its inputs are ``query`` (the question) and/or numbers of earlier agents, comma-separated (brackets optional).
``end`` closes the construction; blank lines are skipped and lines after ``end`` are ignored. The task's rows are
small arithmetic questions (the sum, product or largest of 2-4 numbers), so the right system depends on the query.

**Execution** (:func:`run_system`): the agents are rule-based and run in order. ``extract`` reads the integers of
the question (it must listen to ``query``); ``add`` / ``multiply`` / ``max`` combine every number their input
agents produced; ``verify`` passes its one input on unchanged (a checker that here finds nothing to fix: it only
costs); ``answer`` gives its one input, a single number, as the system's answer (the first ``answer`` agent is the
system's output). An agent with a missing or failed input fails, and so does everything downstream.

**Rewards** (columns of the reward matrix; their weighted sum is the system reward ``R`` of MasHost's
trajectory-level objective, accuracy plus efficiency):

* ``accuracy`` (weight 1.0): 1.0 when the system's answer equals the gold number, else 0.0;
* ``agents`` (weight ``-mas_build_agent_cost``, 0.05): agents in the system;
* ``edges`` (weight ``-mas_build_edge_cost``, 0.02): input links of the system (``query`` links included);
* ``irrational`` (weight 0): construction actions that broke a rationality rule (the third objective enters
  training per action, through the advantage ``mashost_hrpo``; this column only reports the count).

so ``R = accuracy - 0.05 agents - 0.02 edges``; the smallest right system (3 agents, 3 links) earns 0.79.

**Rationality of each action** (:func:`parse_construction`, grpolab's rules; the paper's are not public): an
action's faults, any of which makes it *irrational* (action reward -1, else 0):

* ``malformed``: the line matches neither the agent format nor ``end`` (also counted as a malformed line);
* ``unknown role``; ``out of order`` (agent number is not the next one) — such lines add no agent;
* ``duplicate role`` (a role an earlier agent has); ``after the answer`` (an agent after the answer agent);
* ``nonexistent input`` (an input that is not ``query`` nor an earlier agent: itself, a later or unknown
  agent; the link is dropped), ``repeated input``;
* ``extract reads the query only`` (extract without ``query`` or with other inputs), ``query to a non-extract``
  (only extract reads the question), ``no input agent`` (a non-extract agent with no earlier agent as input),
  ``verify takes one input`` / ``answer takes one input``;
* ``output unused`` (an agent, not the answer, that no later agent listens to; known when the construction ends);
* on ``end``: ``no answer agent`` (the system has no answer agent).
"""
from __future__ import annotations

import random
import re
from dataclasses import dataclass, field

from ..data import completion_text
from ..errors import ConfigError
from ..registry import TASKS, param
from .base import Task, check_held_out

ROLES = ("extract", "add", "multiply", "max", "verify", "answer")
OPS = ("add", "multiply", "max")
_AGENT = re.compile(r"^agent\s+(\d+)\s*:\s*([A-Za-z_]+)\s*<-\s*\[?\s*([^\[\]]*?)\s*\]?\s*\.?$", re.IGNORECASE)
_END = re.compile(r"^end\s*\.?$", re.IGNORECASE)
_INT = re.compile(r"\d+")

SYSTEM = ("You design a team of agents that answers the user's question. Write one agent per line as "
          "'agent N: ROLE <- [INPUTS]', numbering the agents 1, 2, 3, ... INPUTS are 'query' (the question) "
          "and/or numbers of earlier agents, comma-separated. Roles: extract (reads the numbers of the query), "
          "add, multiply, max (combine the numbers of their inputs), verify (passes one input on), answer (gives "
          "its one input as the team's answer). Every agent and every link costs: use only what is needed. "
          "End with a line 'end'.\nExample, for 'Which is the largest of 4, 9 and 2?':\n"
          "agent 1: extract <- [query]\nagent 2: max <- [1]\nagent 3: answer <- [2]\nend")


@dataclass
class Action:
    """One construction action: a non-blank line up to ``end``. ``line`` is its 1-based line number in the
    completion (the token span the rollout ``mas_build`` marks); ``kind`` is ``agent``, ``end`` or
    ``malformed``; ``faults`` the rationality rules it broke (empty: rational)."""
    line: int
    text: str
    kind: str
    agent: int | None = None
    role: str | None = None
    inputs: list = field(default_factory=list)
    faults: list[str] = field(default_factory=list)

    @property
    def reward(self) -> float:
        """The action-wise rationality reward: 0.0 for a rational action, -1.0 for one with any fault."""
        return -1.0 if self.faults else 0.0


@dataclass
class Construction:
    """A parsed construction: its actions, the system built (``agents``: id -> (role, inputs), the links kept),
    and whether it ended with ``end``."""
    actions: list[Action]
    agents: dict[int, tuple[str, list]]
    ended: bool

    @property
    def n_agents(self) -> int:
        return len(self.agents)

    @property
    def n_edges(self) -> int:
        return sum(len(ins) for _, ins in self.agents.values())

    @property
    def malformed(self) -> int:
        return sum(a.kind == "malformed" for a in self.actions)

    @property
    def irrational(self) -> int:
        return sum(bool(a.faults) for a in self.actions)


def _inputs(spec: str) -> list | None:
    """``query`` / agent numbers of an input list (``''`` = none), or None when a token is neither."""
    out = []
    for tok in (t.strip().lower() for t in spec.split(",")):
        if tok == "query":
            out.append("query")
        elif tok.isdigit():
            out.append(int(tok))
        elif tok:
            return None
    return out


def parse_construction(text: str) -> Construction:
    """The construction actions of a completion and the system they build (module docstring: the format and
    the rationality rules)."""
    actions: list[Action] = []
    agents: dict[int, tuple[str, list]] = {}
    by_agent: dict[int, Action] = {}
    roles_used: set[str] = set()
    answer_id = None
    ended = False
    for no, raw in enumerate(text.replace("\r\n", "\n").split("\n"), 1):
        s = raw.strip()
        if not s:
            continue
        if _END.match(s):
            actions.append(Action(no, s, "end", faults=[] if answer_id is not None else ["no answer agent"]))
            ended = True
            break
        m = _AGENT.match(s)
        ins = _inputs(m.group(3)) if m else None
        if m is None or ins is None:
            actions.append(Action(no, s, "malformed", faults=["malformed"]))
            continue
        n, role = int(m.group(1)), m.group(2).lower()
        act = Action(no, s, "agent", agent=n, role=role, inputs=ins)
        actions.append(act)
        if role not in ROLES:
            act.faults.append("unknown role")
            continue
        if n != len(agents) + 1:
            act.faults.append("out of order")
            continue
        if answer_id is not None:
            act.faults.append("after the answer")
        if role in roles_used:
            act.faults.append("duplicate role")
        kept: list = []
        for x in ins:
            if x != "query" and not 1 <= x < n:
                act.faults.append("nonexistent input")
            elif x in kept:
                act.faults.append("repeated input")
            else:
                kept.append(x)
        upstream = [x for x in kept if x != "query"]
        if role == "extract":
            if kept != ["query"]:
                act.faults.append("extract reads the query only")
        else:
            if "query" in kept:
                act.faults.append("query to a non-extract")
            if not upstream:
                act.faults.append("no input agent")
            elif role in ("verify", "answer") and len(upstream) != 1:
                act.faults.append(f"{role} takes one input")
        roles_used.add(role)
        agents[n] = (role, kept)
        by_agent[n] = act
        if role == "answer" and answer_id is None:
            answer_id = n
    used = {x for _, ins in agents.values() for x in ins if x != "query"}
    for n, (role, _) in agents.items():
        if role != "answer" and n not in used:
            by_agent[n].faults.append("output unused")
    return Construction(actions, agents, ended)


def run_system(con: Construction, question: str):
    """Run the built system on the question (module docstring); the first answer agent's output (an int), or
    None when the system has no answer agent or it failed."""
    out: dict[int, object] = {}
    for n in sorted(con.agents):
        role, ins = con.agents[n]
        vals = [out.get(x) for x in ins if x != "query"]
        if role == "extract":
            out[n] = [int(v) for v in _INT.findall(question)] if "query" in ins else None
            continue
        if not vals or any(v is None for v in vals):
            out[n] = None
            continue
        if role in ("verify", "answer"):
            out[n] = vals[0] if len(vals) == 1 else None
            continue
        nums = [x for v in vals for x in (v if isinstance(v, list) else [v])]
        if not nums:
            out[n] = None
        elif role == "add":
            out[n] = sum(nums)
        elif role == "max":
            out[n] = max(nums)
        else:
            prod = 1
            for x in nums:
                prod *= x
            out[n] = prod
    answers = [n for n in sorted(con.agents) if con.agents[n][0] == "answer"]
    result = out.get(answers[0]) if answers else None
    return result if isinstance(result, int) else None


def system_accuracy(prompts=None, completions=None, question=None, answer=None, **kwargs) -> list[float]:
    """1.0 when the built system's answer equals the gold number, else 0.0."""
    return [float(run_system(parse_construction(completion_text(c)), q) == int(a))
            for c, q, a in zip(completions, question, answer)]


def system_agents(prompts=None, completions=None, **kwargs) -> list[float]:
    """Agents in the built system."""
    return [float(parse_construction(completion_text(c)).n_agents) for c in completions]


def system_edges(prompts=None, completions=None, **kwargs) -> list[float]:
    """Input links of the built system."""
    return [float(parse_construction(completion_text(c)).n_edges) for c in completions]


def irrational_actions(prompts=None, completions=None, **kwargs) -> list[float]:
    """Construction actions with a rationality fault."""
    return [float(parse_construction(completion_text(c)).irrational) for c in completions]


def _question(rng: random.Random) -> tuple[str, str, int]:
    op = rng.choice(OPS)
    if op == "multiply":
        nums = [rng.randint(2, 9) for _ in range(rng.randint(2, 3))]
        return op, "What is " + " * ".join(map(str, nums)) + "?", eval_op(op, nums)
    nums = rng.sample(range(2, 30), rng.randint(2, 4))
    if op == "add":
        return op, "What is " + " + ".join(map(str, nums)) + "?", eval_op(op, nums)
    listed = ", ".join(map(str, nums[:-1])) + f" and {nums[-1]}"
    return op, f"Which is the largest of {listed}?", eval_op(op, nums)


def eval_op(op: str, nums: list[int]) -> int:
    """The gold answer of a question: the sum, product or largest of its numbers."""
    if op == "add":
        return sum(nums)
    if op == "max":
        return max(nums)
    prod = 1
    for x in nums:
        prod *= x
    return prod


@TASKS.register("mas_build", needs=("text",))
def mas_build(*,
              mas_build_agent_cost: float = param(0.05, "mas_build: cost per agent of the built system (the "
                                                        "'agents' reward column's weight is minus this)"),
              mas_build_edge_cost: float = param(0.02, "mas_build: cost per input link of the built system (the "
                                                       "'edges' reward column's weight is minus this)"),
              mas_build_rows: int = param(500, "mas_build: questions drawn with the seed"),
              mas_build_eval: int = param(50, "mas_build: of them held out for evaluation"),
              mas_build_seed: int = param(1234, "mas_build: seed of the questions (fixes the split)")) -> Task:
    """Questions (sum, product or largest of 2-4 numbers) for which the policy writes a multi-agent system as
    construction lines; the system runs on rule-based roles and is scored on accuracy minus its cost (module
    docstring). The first ``mas_build_eval`` rows are held out.

    Provenance: grpolab's own — a built-in toy task for MasHost's construction episode (seed 000-22; the
    paper's six benchmarks and LLM roles are not used: rule-based roles on arithmetic questions, as the reference
    notes' CPU plan "a small DAG of rule-based roles and the reward task accuracy minus a cost per node/edge").
    """
    check_held_out("mas_build_eval", mas_build_eval, mas_build_rows)
    for key, value in (("mas_build_agent_cost", mas_build_agent_cost), ("mas_build_edge_cost", mas_build_edge_cost)):
        if not value >= 0:
            raise ConfigError(f"{key}: expected a cost >= 0, got {value}")
    rng = random.Random(mas_build_seed)
    rows = []
    for _ in range(mas_build_rows):
        op, q, gold = _question(rng)
        rows.append({"prompt": [{"role": "system", "content": SYSTEM}, {"role": "user", "content": q}],
                     "question": q, "op": op, "answer": str(gold)})
    rewards = [("accuracy", system_accuracy, 1.0), ("agents", system_agents, -float(mas_build_agent_cost)),
               ("edges", system_edges, -float(mas_build_edge_cost)), ("irrational", irrational_actions, 0.0)]
    return Task("mas_build", rows[mas_build_eval:], rows[:mas_build_eval], rewards=rewards,
                accuracy_reward="accuracy",
                description="write a multi-agent system (agent N: ROLE <- [INPUTS] lines, then end) that answers "
                            "a sum / product / largest question; reward accuracy - costs (MasHost, rollout "
                            "mas_build)")
