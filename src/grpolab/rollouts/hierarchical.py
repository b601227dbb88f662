"""The ``m_grpo`` rollout strategy: a main agent that calls a sub-agent, with hierarchical credit and trajectory
alignment (M-GRPO, "Multi-Agent Deep Research: Training Multi-Agent Systems with M-GRPO", Hong et al., 2025,
arXiv:2511.13288, seed 000-65).

A vertical system of two roles (``roles``: exactly two; the first is the **main agent**, the second the
**sub-agent**), each the run's model with its own instruction and view, and with ``role_adapters: lora`` each its
own LoRA adapter on the shared base (the paper's agents are distinct LLMs; grpolab/roles.py).

For each query, ``G`` main-agent rollouts. In each, the main agent speaks in turns; a turn that writes
``<call>subtask</call>`` runs one **sub-agent episode** (the sub-agent's instruction, the subtask as its question,
its view; one turn), and the sub-agent's reply goes back to the main agent as an observation (``"sub: ..."``, a
user message, ``ENVIRONMENT`` tokens). A turn with ``<answer>`` ends the rollout, as does a turn with neither tag
(its text is the final message), a call past ``m_grpo_max_calls`` (not run), or the token budget. So a rollout
calls the sub-agent 0..``m_grpo_max_calls`` times.

**Hierarchical credit.** The main agent's rows are scored by the task's reward functions on their final message
(``R_main``); each sub-agent trajectory gets the reward matrix of the main rollout that called it (the final
outcome). Groups:

* main level: the ``G`` main rollouts of a query are one group (the query's own group id);
* sub level: the sub-agent trajectories of all ``G`` rollouts of the same query are one group (a fresh group id
  per query),

so the run's advantage (``group_zscore`` in the recipe: ``A = (R - mean_g R) / (std_g R + eps)``) is
group-relative at each level on its own.

**Trajectory alignment.** A query's ``G`` rollouts call the sub-agent ``n`` times in all, a number that varies.
:func:`align_trajectories` makes it the fixed target ``D`` (``m_grpo_sub_trajectories``): ``n > D``: ``D`` of them
kept, chosen at random (the rest dropped); ``0 < n < D``: all kept and ``D - n`` more drawn at random, with
replacement, among them and duplicated (identical rows); ``n = 0``: nothing to duplicate, the query has no
sub-agent rows. Random draws come from the run's seeded, checkpointed CPU generator (``ctx.generator``), so they are
the same on every run and after ``--resume``. The batch then has ``G`` main rows and ``D`` sub rows per query that
called the sub-agent at all.

Rows: main rows first (query-major, ``G`` each), then sub rows (query-major, ``D`` each). ``row_data["role"]``:
0 for main rows, 1 for sub rows; ``step_data["role"]``: the producing role of every completion token (a main
row's observations are the sub-agent's, 1); ``columns["role"]``; ``columns["m_grpo"]``: ``{"level": "main" |
"sub", "rollout": j, "call": c, "duplicate": bool}`` (``j`` the main rollout within its query, ``c`` the call
within it); ``columns["team_transcript"]``: the main rollout's turns and its calls (reward functions may read it).
A role with ``trainable: false`` plays and is scored, then leaves the batch (``sub`` frozen: the paper's baseline
"multi-agent GRPO with frozen sub-agents").

Metrics: ``m_grpo/main/reward``, ``m_grpo/sub/reward`` (mean over the aligned sub rows), ``m_grpo/calls`` (mean
sub-agent calls per main rollout), ``m_grpo/sub_sampled`` (sub trajectories sampled, before alignment),
``m_grpo/sub_dropped``, ``m_grpo/sub_duplicated``, ``m_grpo/queries_without_calls``. Held-out evaluation plays one
greedy main rollout per row (greedy sub-agent calls) and scores the main agent's final message.
"""
from __future__ import annotations

import itertools
import json
import os
import re
import time
from dataclasses import dataclass, field
from pathlib import Path

import torch

from ..agents import tools as builtin_tools
from ..agents.adapters import ToolLimits, load_object, run_tool
from ..agents.parsing import Renderer, hermes_tools_text, parse_tool_calls, tool_schema, with_tools_system
from ..agents.rollout import MAX_EPISODE_TOKENS, MAX_TURN_TOKENS
from ..errors import ConfigError
from ..generation.plain import eos_token_ids
from ..generation.sampling import completion_counts, per_prompt
from ..generation.turns import Episode
from ..registry import ROLLOUT_STRATEGIES, param
from ..roles import ROLE_ADAPTERS, ROLES, Role, parse_roles
from .team import (Seat, _first_prompt, _observation, _pack, check_role_adapters, lora_adapters, play_turn,
                   role_models)

M_GRPO_COLUMN = "m_grpo"
STOP_STRINGS = ("</call>", "</answer>")
TOOL_STOP = ("</tool_call>",)
BUILTIN_TOOLS = ("calculator", "python", "search")  # grpolab/agents/tools.py
_CALL = re.compile(r"<call>(.*?)(?:</call>|$)", re.S)


def align_trajectories(n: int, target: int, generator: torch.Generator | None = None) -> list[int]:
    """Indices into a query's ``n`` sampled sub-agent trajectories that make exactly ``target`` rows (M-GRPO's
    trajectory alignment; the module docstring).

    ``n == target``: ``[0, ..., n-1]``; ``n > target``: ``target`` distinct indices drawn uniformly (a random
    permutation's first ``target``), in increasing order, the rest dropped; ``0 < n < target``: ``[0, ..., n-1]``
    then ``target - n`` indices drawn uniformly with replacement (duplicates); ``n == 0``: ``[]`` (nothing to
    duplicate). ``generator`` seeds the draws.

    Provenance: reconstructed from the abstract — "a trajectory-alignment scheme that generates fixed-size batches
    despite variable sub-agent invocations" (Multi-Agent Deep Research: Training Multi-Agent Systems with M-GRPO,
    arXiv:2511.13288, seed 000-65); the drop-extra / duplicate-missing rule is as the project's reference notes
    describe it; grpolab's choices: uniform draws (kept ones without, duplicates with replacement), the kept
    trajectories keep their order, a query with no sub-agent call contributes no sub rows; no authors' code was
    found. Test: tests/test_m_grpo.py::test_alignment_by_hand.
    """
    if n < 0 or target < 1:
        raise ConfigError(f"m_grpo_sub_trajectories must be >= 1, got {target}")
    if n == 0:
        return []
    if n == target:
        return list(range(n))
    if n > target:
        return sorted(torch.randperm(n, generator=generator)[:target].tolist())
    return list(range(n)) + torch.randint(0, n, (target - n,), generator=generator).tolist()


def parse_action(text: str) -> tuple[str, str]:
    """``("answer", text)``, ``("call", subtask)`` or ``("none", text)``: whichever tag comes first in a main
    agent's turn (an unclosed ``<call>`` runs to the end of the turn)."""
    a, c = text.find("<answer>"), text.find("<call>")
    if a >= 0 and (c < 0 or a < c):
        return "answer", text
    if c >= 0:
        return "call", _CALL.search(text, c).group(1).strip()
    return "none", text


def sample_turns(ctx, contexts, budgets, temperatures, stop_strings=(), model=None):
    """One turn for each context, batched (tests replace it to script the agents)."""
    return ctx.continue_(contexts, max_new_tokens=budgets, temperature=temperatures, stop_strings=list(stop_strings),
                         model=model)


@dataclass
class MainRollout:
    """One main-agent rollout: its seat (role 0) and the sub-agent episodes it called (role 1), in order."""
    seat: Seat
    query: int
    calls: list[Seat] = field(default_factory=list)


def sub_tools(spec) -> dict:
    """``m_grpo_sub_tools`` as ``{name: function}``: grpolab's tools by name (``calculator``, ``python``,
    ``search``: grpolab/agents/tools.py) or ``MODULE:FUNCTION`` (a TRL-style tool: type hints and a Google-style
    docstring)."""
    if spec in (None, "", []):
        return {}
    if isinstance(spec, str):
        spec = [t.strip() for t in spec.split(",") if t.strip()]
    out = {}
    for t in spec:
        if t in BUILTIN_TOOLS:
            fn = getattr(builtin_tools, t)
        else:
            try:
                fn = load_object(t, "m_grpo_sub_tools")
            except ValueError as e:
                raise ConfigError(f"{e}; or one of grpolab's tools: {', '.join(BUILTIN_TOOLS)}") from e
        out[t if t in BUILTIN_TOOLS else getattr(fn, "__name__", t)] = fn
    return out


@dataclass
class SubStats:
    """What the sub-agent episodes of one step did (metrics)."""
    episodes: int = 0
    turns: int = 0
    tool_calls: int = 0
    tool_errors: int = 0


def _sub_first_prompt(role: Role, row: dict, roles: list[Role], tok, schemas: list[dict]) -> str:
    """The sub-agent's first prompt (:func:`grpolab.rollouts.team._first_prompt`), with the tools' Hermes text in
    front of a text prompt or in the system message of a chat when it has tools."""
    if schemas:
        p = row["prompt"]
        row = {**row, "prompt": f"{hermes_tools_text(schemas)}\n\n{p}" if isinstance(p, str)
               else with_tools_system(p, schemas)}
    return _first_prompt(role, row, [], roles, tok)


def play_sub_episodes(ctx, subs: list[Seat], roles: list[Role], *, turns: int, tools: dict, turn_tokens: int,
                      episode_tokens: int, renderer, module, adapters: str, given: bool, text_of,
                      stats: SubStats) -> None:
    """Every sub-agent episode of ``subs`` to its end, batched turn by turn: at most ``turns`` turns; a turn that
    writes ``<tool_call>{"name": ..., "arguments": {...}}</tool_call>`` runs the tools (each call's answer, or its
    error text, back as a ``tool`` message: ``ENVIRONMENT`` tokens) and the episode goes on; a turn without a tool
    call is the reply; the last turn allowed is the reply whatever it holds (its tool calls are not run). Every
    turn is capped at ``turn_tokens``, the episode at ``episode_tokens``."""
    tok = ctx.tokenizer
    sub_role = roles[1]
    schemas = [tool_schema(fn) for fn in tools.values()]
    limits = ToolLimits()
    for sub in subs:
        sub.episode = Episode(tok(_sub_first_prompt(sub_role, sub.row, roles, tok, schemas),
                                  add_special_tokens=False)["input_ids"])
    stats.episodes += len(subs)
    stop = TOOL_STOP if tools else ()
    for t in range(turns):
        wrote = play_turn(ctx, subs, sub_role.name, 1,
                          lambda c, b, temps, m: sample_turns(ctx, c, b, temps, stop, model=m),
                          turn_tokens=turn_tokens, episode_tokens=episode_tokens, module=module, adapters=adapters,
                          given=given, text_of=text_of)
        if wrote is None:
            break
        for i, text in wrote:
            s = subs[i]
            stats.turns += 1
            calls = parse_tool_calls(text) if tools else []
            if not calls:
                s.finished, s.ended_by = True, "answered"
                continue
            if t == turns - 1:
                s.finished, s.ended_by = True, "max_turns"
                continue
            done = [run_tool(c, tools, limits) for c in calls[:limits.max_calls]]
            stats.tool_calls += len(done)
            stats.tool_errors += sum(1 for c in done if c.error)
            chat = not isinstance(s.row["prompt"], str)
            obs = renderer.observation([renderer.tool_message(c.name, c.output) for c in done], chat)
            s.episode.add_observation(tok(obs, add_special_tokens=False)["input_ids"])
            s.authors.append(1)
    for s in subs:
        if not s.finished:
            s.finished, s.ended_by = True, "max_turns"


def _subtask_row(row: dict, subtask: str) -> dict:
    """The sub-agent's data row: the main row with the subtask as its prompt (a chat when the row's is)."""
    prompt = subtask if isinstance(row["prompt"], str) else [{"role": "user", "content": subtask}]
    return {**row, "prompt": prompt}


def play_hierarchy(ctx, rollouts: list[MainRollout], roles: list[Role], *, max_calls: int, turn_tokens: int,
                   episode_tokens: int, renderer, model=None, adapters: str = "shared", sub_turns: int = 1,
                   tools: dict | None = None, stats: SubStats | None = None, sub_agent=None) -> None:
    """Every main rollout to its end, each ``<call>`` answered by one sub-agent episode (batched per main turn:
    :func:`play_sub_episodes`, at most ``sub_turns`` turns with ``tools``). ``adapters``: the ``role_adapters``
    value, which model samples a role's turns (:func:`grpolab.roles.acting`). ``sub_agent``: the sub-agent runs
    elsewhere (``m_grpo_decoupled: main``): ``sub_agent(requests) -> replies`` answers the main turn's calls,
    ``requests`` a list of ``{"query", "rollout", "call", "row"}``; the calls' seats then hold only the reply."""
    stats = stats if stats is not None else SubStats()
    tok = ctx.tokenizer
    module = model if model is not None else ctx.policy
    eos = set(eos_token_ids(tok, module))
    main_role = roles[0]

    def text_of(ids):
        return tok.decode([t for t in ids if t not in eos], skip_special_tokens=True).strip()

    for ro in rollouts:
        ids = tok(_first_prompt(main_role, ro.seat.row, [], roles, tok), add_special_tokens=False)["input_ids"]
        if len(ids) > ctx.cfg.max_prompt_length:
            raise ConfigError(f"m_grpo: the main agent's first prompt has {len(ids)} tokens, more than "
                              f"max_prompt_length={ctx.cfg.max_prompt_length}; raise --max_prompt_length or shorten "
                              f"the role prompt / view")
        ro.seat.episode = Episode(ids)
    seats = [ro.seat for ro in rollouts]
    while True:
        wrote = play_turn(ctx, seats, main_role.name, 0,
                          lambda c, b, temps, m: sample_turns(ctx, c, b, temps, STOP_STRINGS, model=m),
                          turn_tokens=turn_tokens, episode_tokens=episode_tokens, module=module, adapters=adapters,
                          given=model is not None, text_of=text_of)
        if wrote is None:
            break
        pending = []
        for i, text in wrote:
            ro, s = rollouts[i], seats[i]
            kind, body = parse_action(text)
            if kind == "answer":
                s.finished, s.ended_by = True, "answer"
            elif kind == "none":
                s.finished, s.ended_by = True, "no_call"
            elif len(ro.calls) >= max_calls:
                s.finished, s.ended_by = True, "max_calls"
            else:
                pending.append((ro, body))
        if not pending:
            continue
        subs = [Seat(1, _subtask_row(ro.seat.row, body), ro.seat.uid, ro.seat.temperature) for ro, body in pending]
        if sub_agent is not None:
            replies = sub_agent([{"query": ro.query, "rollout": rollouts.index(ro), "call": len(ro.calls),
                                  "row": sub.row, "uid": sub.uid, "temperature": sub.temperature}
                                 for (ro, _), sub in zip(pending, subs)])
            for sub, reply in zip(subs, replies):
                sub.turns, sub.finished, sub.ended_by = ([reply] if reply else []), True, "remote"
        else:
            play_sub_episodes(ctx, subs, roles, turns=sub_turns, tools=tools or {}, turn_tokens=turn_tokens,
                              episode_tokens=episode_tokens, renderer=renderer, module=module, adapters=adapters,
                              given=model is not None, text_of=text_of, stats=stats)
        for (ro, _), sub in zip(pending, subs):
            text = sub.turns[-1] if sub.turns else ""
            ro.calls.append(sub)
            chat = not isinstance(ro.seat.row["prompt"], str)
            obs = tok(_observation([(1, text)], roles, chat, renderer), add_special_tokens=False)["input_ids"]
            ro.seat.episode.add_observation(obs)
            ro.seat.authors.append(1)


def _transcript(ro: MainRollout, roles: list[Role]) -> list[dict]:
    return [{"role": roles[0].name, "turns": list(ro.seat.turns), "ended_by": ro.seat.ended_by}] + [
        {"role": roles[1].name, "turns": list(s.turns), "ended_by": s.ended_by, "subtask": s.row["prompt"]}
        for s in ro.calls]


DECOUPLED = ("", "main", "sub")


class StatsStore:
    """The directory two decoupled processes share (``m_grpo_decoupled``: main in one, sub in the other). Per
    training step ``S`` (``step{S}/``), each file written whole (a temporary name, then ``os.replace``):

    * ``calls{k}.json`` (main -> sub): the sub-agent calls of the main agent's ``k``-th turn, each ``{"query",
      "rollout", "call", "row", "uid", "temperature"}`` (``row``: the data row with the subtask as its prompt);
    * ``replies{k}.json`` (sub -> main): the sub-agent's final reply to each, in order;
    * ``stats.json`` (main -> sub, the step's end): the statistics the sub-agent's training needs, each main
      rollout's reward row (``rewards``, ``[G * queries][K]``, NaN for unscorable) and the ``reward_names``.

    No weights, gradients, log-probs or token ids pass between the processes."""

    def __init__(self, root, timeout: float, poll: float = 0.005):
        if not root:
            raise ConfigError("m_grpo_decoupled: needs m_grpo_store, a directory both processes can read and write")
        self.root, self.timeout, self.poll = Path(root), float(timeout), poll
        self.root.mkdir(parents=True, exist_ok=True)

    def put(self, name: str, obj) -> None:
        path = self.root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
        tmp.write_text(json.dumps(obj))
        os.replace(tmp, path)

    def wait(self, names: list[str], who: str) -> tuple[str, object]:
        """The first of ``names`` to exist, read: ``(name, value)``; after ``timeout`` seconds an error naming the
        process that should have written it."""
        end = time.monotonic() + self.timeout
        while True:
            for n in names:
                path = self.root / n
                if path.exists():
                    return n, json.loads(path.read_text())
            if time.monotonic() > end:
                raise RuntimeError(f"m_grpo_decoupled: the {who} process wrote none of {', '.join(names)} in "
                                   f"{self.root} within m_grpo_store_timeout={self.timeout:g} s; is it running, with "
                                   f"the same m_grpo_store, task, seed and steps, and was the store emptied before "
                                   f"a resumed pair started?")
            time.sleep(self.poll)


def _check(cfg) -> None:
    p = cfg.params
    roles = parse_roles(p.get("roles"))
    if len(roles) != 2:
        raise ConfigError(f"roles: m_grpo needs exactly two roles, the main agent then the sub-agent; got "
                          f"{len(roles)} ({', '.join(r.name for r in roles)})")
    if int(p.get("m_grpo_max_calls", 2)) < 0:
        raise ConfigError(f"m_grpo_max_calls must be >= 0, got {p.get('m_grpo_max_calls')}")
    if int(p.get("m_grpo_sub_trajectories", 4)) < 1:
        raise ConfigError(f"m_grpo_sub_trajectories must be >= 1, got {p.get('m_grpo_sub_trajectories')}")
    if int(p.get("m_grpo_sub_turns", 1)) < 1:
        raise ConfigError(f"m_grpo_sub_turns must be >= 1, got {p.get('m_grpo_sub_turns')}")
    sub_tools(p.get("m_grpo_sub_tools"))
    mode = p.get("m_grpo_decoupled", "")
    if mode not in DECOUPLED:
        raise ConfigError(f"m_grpo_decoupled: '{mode}' is not valid; valid values: '' (one process), main, sub")
    if mode:
        if not p.get("m_grpo_store"):
            raise ConfigError("m_grpo_decoupled: needs m_grpo_store, a directory both processes can read and write")
        if p.get("role_adapters", "shared") != "shared":
            raise ConfigError(f"m_grpo_decoupled {mode}: this process's model is its one agent; set role_adapters "
                              f"shared (got {p.get('role_adapters')})")
        if cfg.eval_before or cfg.eval_after or cfg.eval_steps:
            raise ConfigError(f"m_grpo_decoupled {mode}: the held-out evaluation plays both agents, which live in "
                              f"two processes; set --eval_before false --eval_after false --eval_steps 0")
        if cfg.dynamic_sampling or cfg.steps_per_generation > 1:
            raise ConfigError(f"m_grpo_decoupled {mode}: the two processes exchange one rollout round per step; "
                              f"turn dynamic_sampling and steps_per_generation off")
    check_role_adapters(cfg)  # lora needs use_lora; separate one process and the native sampler


@ROLLOUT_STRATEGIES.register("m_grpo", check=_check, needs=("text",))
def m_grpo(ctx, rows, uids, group_offset, budgets=None, temperatures=None, *,
           roles: list = ROLES, role_adapters: str = ROLE_ADAPTERS,
           m_grpo_max_calls: int = param(2, "m_grpo: sub-agent calls per main-agent rollout at most (a call past it "
                                         "ends the rollout, not run)"),
           m_grpo_sub_trajectories: int = param(4, "m_grpo: D, the fixed number of sub-agent rows per query "
                                                "(trajectory alignment: extra ones dropped at random, missing ones "
                                                "filled by duplicating sampled ones)"),
           m_grpo_sub_turns: int = param(1, "m_grpo: turns of one sub-agent episode at most (a turn with a tool "
                                          "call runs the tools and the episode goes on; 1: one reply)"),
           m_grpo_sub_tools: list = param([], "m_grpo: the sub-agent's tools, grpolab's (calculator, python, "
                                          "search) or MODULE:FUNCTION, called as <tool_call>{json}</tool_call>"),
           m_grpo_decoupled: str = param("", "m_grpo: '' (one process trains both agents), main or sub: this "
                                         "process trains that agent only, the other runs in a second process and "
                                         "the two exchange the sub-agent calls and the rewards through "
                                         "m_grpo_store", list(DECOUPLED)),
           m_grpo_store: str = param("", "m_grpo decoupled: the directory both processes share"),
           m_grpo_store_timeout: float = param(600.0, "m_grpo decoupled: seconds to wait for the other process"),
           max_turn_tokens: int = MAX_TURN_TOKENS, max_episode_tokens: int = MAX_EPISODE_TOKENS):
    """G main-agent rollouts per query with sub-agent calls; main rows grouped per query, sub rows grouped per
    query and aligned to D per query; every sub row gets the outcome reward of its main rollout (the module
    docstring).

    Group-relative advantages at both levels (the recipe's ``group_zscore``):
    ``A_main(j) = (R_j - mean_{j'} R_j') / (std_{j'} R_j' + eps)`` over the ``G`` main rollouts of a query, and
    ``A_sub(t) = (R_{m(t)} - mean_{t'} R_{m(t')}) / (std_{t'} R_{m(t')} + eps)`` over the query's ``D`` aligned sub
    trajectories ``t``, ``m(t)`` the main rollout that called ``t``.

    Provenance: reconstructed from the abstract — Multi-Agent Deep Research: Training Multi-Agent Systems with
    M-GRPO (Hong et al., 2025, arXiv:2511.13288, seed 000-65): "group-relative advantages for both main and
    sub-agents, maintaining hierarchical credit assignment", "a trajectory-alignment scheme that generates
    fixed-size batches despite variable sub-agent invocations", multi-turn tool-executing sub-agents, and
    "a decoupled training pipeline in which agents run on separate servers and exchange minimal statistics via a
    shared store"; grpolab's choices: the sub-agent's reward is the main rollout's outcome reward only (secondary
    summaries of the paper describe a sub-agent reward that also scores the sub-agent's own output; not built),
    a sub-agent episode is at most ``m_grpo_sub_turns`` turns with TRL-style tools in the Hermes
    ``<tool_call>`` format (the paper's sub-agents search and browse), calls are ``<call>...</call>`` and answers
    ``<answer>...</answer>`` tags, the sub-agent's final reply comes back as a ``sub: ...`` user message; in one
    process both roles share the run's base model (with ``role_adapters: lora`` one adapter each); decoupled
    (``m_grpo_decoupled``), two processes each train their own model and exchange through a directory
    (:class:`StatsStore`) only the sub-agent calls and replies (text) and the main rollouts' rewards (the
    statistics the sub-agent's advantages need); no authors' code was found (code search for M-GRPO main /
    sub-agent trajectory alignment). Test: tests/test_m_grpo.py::test_two_level_advantages_by_hand,
    tests/test_m_grpo.py::test_sub_agent_runs_tools_over_several_turns,
    tests/test_m_grpo.py::test_decoupled_processes_share_only_statistics.
    """
    role_list = parse_roles(roles)
    cfg = ctx.cfg
    tools = sub_tools(m_grpo_sub_tools)
    stats = SubStats()
    turn_tokens = max_turn_tokens or cfg.max_completion_length
    renderer = Renderer(ctx.tokenizer, log=ctx.log)
    store = StatsStore(m_grpo_store, m_grpo_store_timeout) if m_grpo_decoupled else None
    if m_grpo_decoupled == "sub":
        return _serve_sub_agent(ctx, store, role_list, m_grpo_sub_trajectories, sub_turns=m_grpo_sub_turns,
                                tools=tools, turn_tokens=turn_tokens, episode_tokens=max_episode_tokens,
                                renderer=renderer, adapters=role_adapters, stats=stats)
    counts = completion_counts(cfg.num_generations if budgets is None else budgets, len(rows))
    temps = per_prompt(cfg.temperature if temperatures is None else temperatures, len(rows), "temperature")
    sub_base = ctx.allocate_groups(len(rows))
    rollouts = [MainRollout(Seat(0, row, uid, float(t)), i)
                for i, (row, uid, c, t) in enumerate(zip(rows, uids, counts, temps)) for _ in range(c)]
    remote = None if store is None else _remote_sub_agent(ctx, store)
    play_hierarchy(ctx, rollouts, role_list, max_calls=m_grpo_max_calls, turn_tokens=turn_tokens,
                   episode_tokens=max_episode_tokens, renderer=renderer, adapters=role_adapters,
                   sub_turns=m_grpo_sub_turns, tools=tools, stats=stats, sub_agent=remote)
    seats, gids, src, info, tally = _main_and_aligned_sub_rows(
        ctx, rollouts, len(rows), group_offset, sub_base, m_grpo_sub_trajectories, align=store is None)
    batch = _pack(ctx, [[s] for s in seats], role_list, [[g] for g in gids], max_episode_tokens)
    batch.columns[M_GRPO_COLUMN] = info
    batch.columns["team_transcript"] = [_transcript(rollouts[j], role_list) for j in src]
    main = batch.select(list(range(len(rollouts))))
    ctx.score(main)
    if store is not None:  # the step's statistics for the sub-agent's training; this process trains the main rows
        store.put(f"step{ctx.step}/stats.json", {"rewards": main.rewards.tolist(),
                                                  "reward_names": list(main.reward_names)})
    batch.rewards, batch.reward_names = main.rewards[torch.tensor(src, dtype=torch.long)], main.reward_names
    _level_metrics(ctx, batch, rollouts, tally, aligned=store is None)
    _sub_metrics(ctx, stats, tools, m_grpo_sub_turns)
    keep = [i for i, r in enumerate(batch.row_data["role"].tolist()) if role_list[r].trainable]
    return batch if len(keep) == len(seats) else batch.select(keep)


def _remote_sub_agent(ctx, store: StatsStore):
    """Decoupled main process: the sub-agent's calls go to the other process through ``store``; the k-th call
    batch of a step is ``step{N}/calls{k}.json``, its replies ``step{N}/replies{k}.json``."""
    calls = itertools.count()

    def remote(requests):
        k = next(calls)
        store.put(f"step{ctx.step}/calls{k}.json", requests)
        return store.wait([f"step{ctx.step}/replies{k}.json"], "sub-agent (m_grpo_decoupled: sub)")[1]
    return remote


def _main_and_aligned_sub_rows(ctx, rollouts: list, n_queries: int, group_offset: int, sub_base: int,
                               sub_trajectories: int, *, align: bool):
    """The step's rows: every main rollout (group ``group_offset + query``), then, when ``align``, each query's
    sub-agent episodes aligned to ``sub_trajectories`` (group ``sub_base + query``). Returns ``(seats, gids, src,
    info, counts)``: ``src`` each row's main rollout (whose reward it gets), ``info`` the M_GRPO_COLUMN entries,
    ``counts`` the sampled / dropped / duplicated sub episodes and the queries without a call."""
    first = {}  # the index of each query's first main rollout
    for j, ro in enumerate(rollouts):
        first.setdefault(ro.query, j)
    seats = [ro.seat for ro in rollouts]
    gids = [group_offset + ro.query for ro in rollouts]
    src = list(range(len(rollouts)))
    info = [{"level": "main", "rollout": j - first[ro.query], "call": -1, "duplicate": False}
            for j, ro in enumerate(rollouts)]
    counts = {"sampled": 0, "dropped": 0, "duplicated": 0, "empty": 0}
    for q in range(n_queries):
        mine = [(j, c, sub) for j, ro in enumerate(rollouts) if ro.query == q for c, sub in enumerate(ro.calls)]
        counts["sampled"] += len(mine)
        if not align:  # aligned and trained in the sub-agent's process
            continue
        pick = align_trajectories(len(mine), sub_trajectories, ctx.generator)
        counts["dropped"] += len(mine) - len(set(pick))
        counts["duplicated"] += len(pick) - len(set(pick))
        counts["empty"] += not mine
        seen = set()
        for k in pick:
            j, c, sub = mine[k]
            seats.append(sub)
            gids.append(sub_base + q)
            src.append(j)
            info.append({"level": "sub", "rollout": j - first[q], "call": c, "duplicate": k in seen})
            seen.add(k)
    return seats, gids, src, info, counts


def _level_metrics(ctx, batch, rollouts: list, counts: dict, *, aligned: bool) -> None:
    scalar = ctx.scalar(batch)
    is_sub = batch.row_data["role"] == 1
    ctx.metric("m_grpo/main/reward", float(torch.nanmean(scalar[~is_sub])))
    if aligned:
        ctx.metric("m_grpo/sub/reward", float(torch.nanmean(scalar[is_sub])) if bool(is_sub.any())
                   else float("nan"))
        ctx.metric("m_grpo/sub_dropped", float(counts["dropped"]))
        ctx.metric("m_grpo/sub_duplicated", float(counts["duplicated"]))
        ctx.metric("m_grpo/queries_without_calls", float(counts["empty"]))
    ctx.metric("m_grpo/calls", sum(len(ro.calls) for ro in rollouts) / max(1, len(rollouts)))
    ctx.metric("m_grpo/sub_sampled", float(counts["sampled"]))


def _sub_metrics(ctx, stats: SubStats, tools: dict, sub_turns: int) -> None:
    if stats.episodes and (tools or sub_turns > 1):
        ctx.metric("m_grpo/sub/turns", stats.turns / stats.episodes)
        ctx.metric("m_grpo/sub/tool_calls", stats.tool_calls / stats.episodes)
        ctx.metric("m_grpo/sub/tool_errors", float(stats.tool_errors))


def _serve_sub_agent(ctx, store: StatsStore, roles: list[Role], target: int, *, sub_turns: int, tools: dict,
                     turn_tokens: int, episode_tokens: int, renderer, adapters: str, stats: SubStats):
    """The sub-agent's process (``m_grpo_decoupled: sub``), step ``S``: answer every ``calls{k}.json`` of the main
    process with this process's model (:func:`play_sub_episodes`), until ``stats.json`` ends the step; then each
    sub-agent trajectory gets the reward row of the main rollout that called it, a query's trajectories are
    aligned to ``D`` and grouped (one group per query), and the batch holds only sub-agent rows. No call this
    step: None (the step is skipped)."""
    tok = ctx.tokenizer
    eos = set(eos_token_ids(tok, ctx.policy))

    def text_of(ids):
        return tok.decode([t for t in ids if t not in eos], skip_special_tokens=True).strip()

    served, k = [], 0
    while True:
        name, obj = store.wait([f"step{ctx.step}/calls{k}.json", f"step{ctx.step}/stats.json"],
                               "main-agent (m_grpo_decoupled: main)")
        if name.endswith("stats.json"):
            break
        subs = [Seat(1, r["row"], int(r["uid"]), float(r["temperature"])) for r in obj]
        play_sub_episodes(ctx, subs, roles, turns=sub_turns, tools=tools, turn_tokens=turn_tokens,
                          episode_tokens=episode_tokens, renderer=renderer, module=ctx.policy, adapters=adapters,
                          given=False, text_of=text_of, stats=stats)
        store.put(f"step{ctx.step}/replies{k}.json", [s.turns[-1] if s.turns else "" for s in subs])
        served.extend(zip(obj, subs))
        k += 1
    ctx.metric("m_grpo/sub_sampled", float(len(served)))
    _sub_metrics(ctx, stats, tools, sub_turns)
    if not served:
        return None
    rewards = torch.tensor(obj["rewards"], dtype=torch.float32)
    seats, gids, src, info = [], [], [], []
    dropped = duplicated = 0
    queries = list(dict.fromkeys(r["query"] for r, _ in served))
    base = ctx.allocate_groups(len(queries))
    for qi, q in enumerate(queries):
        mine = [(r, s) for r, s in served if r["query"] == q]
        pick = align_trajectories(len(mine), target, ctx.generator)
        dropped += len(mine) - len(set(pick))
        duplicated += len(pick) - len(set(pick))
        seen = set()
        for i in pick:
            r, s = mine[i]
            seats.append(s)
            gids.append(base + qi)
            src.append(int(r["rollout"]))
            info.append({"level": "sub", "rollout": int(r["rollout"]), "call": int(r["call"]),
                         "duplicate": i in seen})
            seen.add(i)
    batch = _pack(ctx, [[s] for s in seats], roles, [[g] for g in gids], episode_tokens)
    batch.columns[M_GRPO_COLUMN] = info
    batch.columns["team_transcript"] = [[{"role": roles[1].name, "turns": list(s.turns), "ended_by": s.ended_by,
                                          "subtask": s.row["prompt"]}] for s in seats]
    batch.rewards, batch.reward_names = rewards[torch.tensor(src, dtype=torch.long)], list(obj["reward_names"])
    scalar = ctx.scalar(batch)
    ctx.metric("m_grpo/sub/reward", float(torch.nanmean(scalar)))
    ctx.metric("m_grpo/sub_dropped", float(dropped))
    ctx.metric("m_grpo/sub_duplicated", float(duplicated))
    return batch


def eval_rollout(ctx, model, rows, uids, *, roles, m_grpo_max_calls, max_turn_tokens, max_episode_tokens,
                 role_adapters="shared", m_grpo_sub_turns=1, m_grpo_sub_tools=(), **_ignored):
    """Held-out evaluation: one greedy main rollout per row (greedy sub-agent episodes); the main rows, scored by
    the trainer."""
    role_list = parse_roles(roles)
    rollouts = [MainRollout(Seat(0, row, uid, 0.0), i) for i, (row, uid) in enumerate(zip(rows, uids))]
    play_hierarchy(ctx, rollouts, role_list, max_calls=m_grpo_max_calls,
                   turn_tokens=max_turn_tokens or ctx.cfg.max_completion_length, episode_tokens=max_episode_tokens,
                   renderer=Renderer(ctx.tokenizer, log=ctx.log), model=model, adapters=role_adapters,
                   sub_turns=m_grpo_sub_turns, tools=sub_tools(m_grpo_sub_tools))
    batch = _pack(ctx, [[ro.seat] for ro in rollouts], role_list, [[i] for i in range(len(rows))],
                  max_episode_tokens)
    batch.columns["team_transcript"] = [_transcript(ro, role_list) for ro in rollouts]
    return batch


def model_texts(cfg, environment, rows: list[dict]) -> list[str]:
    """Text the rollout shows besides the data (role instructions, the tags, ``name: message``), for a tokenizer
    built from the run's text (``--model tiny``)."""
    roles = parse_roles(cfg.params.get("roles"))
    texts = [f"{r.name}: {r.prompt}" for r in roles] + ["<call></call><answer></answer>"]
    tools = sub_tools(cfg.params.get("m_grpo_sub_tools"))
    if tools:
        texts += [hermes_tools_text([tool_schema(fn) for fn in tools.values()]),
                  '<tool_call>{"name": "", "arguments": {}}</tool_call><tool_response>\n</tool_response>',
                  "0123456789 +-*/().= Error: unknown tool 'x'; the tools are: bad arguments for"]
    return texts


m_grpo.eval_rollout = eval_rollout
m_grpo.lora_adapters = lora_adapters
m_grpo.role_models = role_models
m_grpo.model_texts = model_texts
m_grpo.columns = ("role", "team_transcript", M_GRPO_COLUMN)  # reward functions may take them
