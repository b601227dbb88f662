"""The ``dr_zero`` rollout strategy: Dr. Zero's data-free self-evolution, a proposer and a solver of one base model
trained in alternating phases (seed 000-110).

Two roles, ``proposer`` and ``solver``: the run's model, or with ``role_adapters: lora`` (and ``use_lora: true``)
one LoRA adapter each on the shared base (the authors train two copies of the base model). Training alternates
in phases of ``dr_zero_steps_per_phase`` steps, the proposer first: step ``t`` trains

``role(t) = proposer if floor(t / dr_zero_steps_per_phase) is even, else solver``

and the other role is frozen for that step (its rows are not in the batch, so with LoRA adapters its adapter
gets no gradient and keeps its weights). Each step's prompts are documents of the search corpus with a hop count
``n`` (the ``dr_zero_docs`` task: columns ``hops``, ``document``).

* **Proposer step.** For every document the proposer plays ``dr_zero_proposer_samples`` agent episodes with the
  search tool (the ``agent`` rollout's episode loop and settings: ``max_turns``, ``max_turn_tokens``, ...) and
  ends with ``<question> ... </question> <answer> ... </answer>``. A question that passes the format check
  (:func:`grpolab.tasks.dr_zero_docs.proposer_format` > 0) is put to the frozen solver
  ``dr_zero_solver_samples`` times (search episodes at the run's temperature, not trained); the solver's exact
  matches with the proposer's answer are the column ``dr_zero_hits``, and the proposer's reward is ``0.5 *
  format + difficulty(hits)`` (the task's reward ``dr_zero``). The batch holds the proposer's episodes; train
  them with the ``dr_zero_hrpo`` advantage (hop clusters, as the authors' proposer).
* **Solver step.** The frozen proposer writes one question per document (sampled, not trained; a document
  whose question fails the format check is dropped, and all the documents are asked again, up to
  ``dr_zero_question_attempts`` times in all, until at least one question passes). Each kept question is a
  solver prompt (``search_qa``'s search instruction and the question; reference answer: the proposer's; column
  ``hops``: the document's), played ``num_generations`` times; the batch holds the solver's episodes, rewarded by
  exact match.

Rows carry ``columns['role']`` (``proposer`` / ``solver``) and ``row_data['role']`` (0 / 1, the adapter each row's
log-probs go through). Metrics: ``dr_zero/phase`` (0 proposer, 1 solver), ``dr_zero/valid_questions`` (share of
proposals that pass the format check), ``dr_zero/solver_success`` (the solver's mean success on the questions it
was asked), ``dr_zero/proposer/format``, ``dr_zero/proposer/difficulty``, ``dr_zero/reward``. Held-out evaluation
plays one greedy solver episode per held-out row (``dr_zero_docs``: ``search_qa``'s held-out questions).
"""
from __future__ import annotations

import contextlib

import torch

from ..agents.base import EPISODE_COLUMN
from ..agents.parsing import Renderer
from ..agents.rollout import (AGENT_MAX_PROMPT_LENGTH, ENVIRONMENT, ENVIRONMENT_KIND, MAX_EPISODE_TOKENS,
                              MAX_TOOL_CALLS, MAX_TURN_TOKENS, MAX_TURNS, TOOL_ISOLATION_KEY, TOOL_OUTPUT_CHARS,
                              TOOL_TIMEOUT, TOOLS, close_all, episode_setup, first_prompts, play, run_episodes,
                              start_episodes, tool_texts)
from ..errors import ConfigError
from ..generation.sampling import completion_counts, per_prompt
from ..registry import ROLLOUT_STRATEGIES, param
from ..roles import ROLE_ADAPTERS, role_adapter
from ..tasks.agent_tasks import qa_accuracy
from ..tasks.dr_zero_docs import PROPOSER, PROPOSER_SYSTEM, SOLVER, difficulty_score, proposal_of, solver_row

ROLES = (PROPOSER, SOLVER)  # row_data["role"] indexes this (and the LoRA adapters, in this order)
HITS_COLUMN = "dr_zero_hits"


def phase(step: int, steps_per_phase: int) -> str:
    """The role trained at step ``step`` (0-based): the proposer in even phases, the solver in odd ones."""
    return ROLES[(int(step) // int(steps_per_phase)) % 2]


@contextlib.contextmanager
def _acting(policy, role: str, lora: bool):
    with role_adapter(policy, role if lora else None), torch.no_grad():
        yield


def _play(ctx, rows, uids, counts, temps, factory, settings, renderer, model=None):
    """Episodes that are not trained (the frozen role's): started, played and closed, never packed."""
    episodes = start_episodes(ctx, rows, uids, 0, counts, temps, factory, settings, renderer)
    try:
        play(ctx, episodes, settings, renderer, model)
    finally:
        close_all(episodes, settings.limits.timeout)
    return episodes


def _final(e) -> str:
    return e.record.turns[-1].text if e.record.turns else ""


def _mark(batch, role: str) -> None:
    n = batch.completion_ids.shape[0]
    batch.columns["role"] = [role] * n
    batch.row_data["role"] = torch.full((n,), ROLES.index(role), dtype=torch.long)


def _ask_solver(ctx, questions, factory, settings, renderer, samples: int, lora: bool) -> list[list[float]]:
    """The frozen solver's 0/1 results, ``samples`` episodes per ``(question, answer, hops)``."""
    if not questions:
        return []
    rows = [solver_row(q, a, h) for q, a, h in questions]
    temps = [float(ctx.cfg.temperature)] * len(rows)
    with _acting(ctx.policy, SOLVER, lora):
        eps = _play(ctx, rows, list(range(len(rows))), [samples] * len(rows), temps, factory, settings, renderer)
    got = qa_accuracy(completions=[_final(e) for e in eps], answer=[r["answer"] for r in rows for _ in range(samples)])
    return [got[i * samples:(i + 1) * samples] for i in range(len(rows))]


def _check(cfg) -> None:
    p = cfg.params
    for key, low in (("dr_zero_steps_per_phase", 1), ("dr_zero_proposer_samples", 1), ("dr_zero_solver_samples", 2),
                     ("dr_zero_question_attempts", 1)):
        v = p.get(key)
        if v is not None and int(v) < low:
            raise ConfigError(f"{key} must be >= {low}, got {v}")
    mode = p.get("role_adapters", "shared")
    if mode not in ("shared", "lora"):
        raise ConfigError(f"role_adapters: '{mode}' is not valid for rollout_strategy dr_zero; valid values: shared, "
                          f"lora")
    if mode == "lora" and not cfg.use_lora:
        raise ConfigError("role_adapters: lora gives the proposer and the solver a LoRA adapter each and needs "
                          "use_lora: true (--use_lora true); or set role_adapters: shared")


@ROLLOUT_STRATEGIES.register("dr_zero", check=_check, needs=("text",))
def dr_zero(ctx, rows, uids, group_offset, budgets=None, temperatures=None, *,
            dr_zero_steps_per_phase: int = param(10, "dr_zero: steps per phase; training alternates proposer phase, "
                                                 "solver phase, ... (the proposer first)"),
            dr_zero_proposer_samples: int = param(1, "dr_zero: proposer episodes per document in a proposer step "
                                                  "(the authors' 1: HRPO's hop clusters are the baseline)"),
            dr_zero_solver_samples: int = param(5, "dr_zero: solver episodes per proposed question that measure its "
                                                "difficulty in a proposer step (the authors' reward_rollout_n 5)"),
            dr_zero_question_attempts: int = param(3, "dr_zero: in a solver step, how often the proposer is asked "
                                                   "for the documents' questions until one passes the format check"),
            role_adapters: str = ROLE_ADAPTERS,
            max_turns: int = MAX_TURNS, max_episode_tokens: int = MAX_EPISODE_TOKENS,
            max_turn_tokens: int = MAX_TURN_TOKENS, tool_timeout: float = TOOL_TIMEOUT,
            tool_output_chars: int = TOOL_OUTPUT_CHARS, max_tool_calls: int = MAX_TOOL_CALLS, tools: list = TOOLS,
            environment: str | None = ENVIRONMENT, environment_kind: str = ENVIRONMENT_KIND,
            tool_isolation: str = TOOL_ISOLATION_KEY):
    """One step of Dr. Zero's alternation: a proposer step or a solver step (the module docstring).

    Provenance: authors' code — https://github.com/facebookresearch/drzero verl/custom_reward/reward_function.py
    (compute_challenger_score_batch: the proposer's questions that pass the format check are answered
    reward_rollout_n = 5 times by the solver, reward 0.5 x format + difficulty; iter*_challenger.sh /
    iter*_gen_data.sh / iter*_solver.sh: proposer and solver trained in turn, the proposer with grpo_batch and one
    sample per document, the solver with GRPO and 5 samples per generated question); grpolab's choices: both roles
    in one run (the authors run one verl job per phase and iteration, each role its own copy of the base model,
    a whole epoch per phase) alternating every dr_zero_steps_per_phase steps on LoRA adapters of one base; a solver
    step writes its questions on the fly (the authors generate a data set per iteration); the built-in BM25 search
    world for the e5 Wikipedia retriever; the search_qa 'Answer:' format for the solver's answer. Test:
    tests/test_dr_zero.py::test_rows_roles_and_rewards_of_each_phase,
    tests/test_dr_zero.py::test_alternating_run_trains_one_role_per_step_and_resumes_exactly.
    """
    cfg = ctx.cfg
    lora = role_adapters == "lora"
    missing = [k for k in ("hops", "document") if any(k not in r for r in rows)]
    if missing:
        raise ConfigError(f"dr_zero: every row needs the column(s) {', '.join(missing)} (the proposer's source "
                          f"document and the hop count to ask for); the built-in task dr_zero_docs has them")
    settings, factory = episode_setup(ctx, max_turns=max_turns, max_episode_tokens=max_episode_tokens,
                                      max_turn_tokens=max_turn_tokens, tool_timeout=tool_timeout,
                                      tool_output_chars=tool_output_chars, max_tool_calls=max_tool_calls,
                                      tool_isolation=tool_isolation, tools=tools, environment=environment,
                                      environment_kind=environment_kind)
    renderer = Renderer(ctx.tokenizer, log=ctx.log)
    temps = per_prompt(cfg.temperature if temperatures is None else temperatures, len(rows), "temperature")
    role = phase(ctx.step or 0, dr_zero_steps_per_phase)
    ctx.metric("dr_zero/phase", float(ROLES.index(role)))
    if role == PROPOSER:
        batch = _proposer_step(ctx, rows, uids, group_offset, temps, factory, settings, renderer,
                               dr_zero_proposer_samples, dr_zero_solver_samples, lora)
    else:
        batch = _solver_step(ctx, rows, uids, group_offset, budgets, temps, factory, settings, renderer,
                             dr_zero_question_attempts, lora)
        if batch is None:
            return None
    scalar = ctx.score(batch)
    ctx.metric("dr_zero/reward", float(torch.nanmean(scalar.float())))
    return batch


def _proposer_step(ctx, rows, uids, group_offset, temps, factory, settings, renderer, samples: int,
                   solver_samples: int, lora: bool):
    """The proposer's episodes (``samples`` per document), their questions put to the frozen solver
    (``columns["dr_zero_hits"]``) and the proposer metrics."""
    with role_adapter(ctx.policy, PROPOSER if lora else None):
        batch = run_episodes(ctx, rows, uids, group_offset, [samples] * len(rows), temps,
                             factory, settings, renderer)
    finals = [c[0]["content"] if isinstance(c, list) else c for c in batch.columns["completion"]]
    props = [proposal_of(ep, h, d, f) for ep, h, d, f in zip(batch.columns[EPISODE_COLUMN], batch.columns["hops"],
                                                              batch.columns["document"], finals)]
    asked = [i for i, (_, _, fmt) in enumerate(props) if fmt > 0]
    hits = _ask_solver(ctx, [(props[i][0], props[i][1], batch.columns["hops"][i]) for i in asked], factory,
                       settings, renderer, solver_samples, lora)
    column = [None] * len(props)
    for i, h in zip(asked, hits):
        column[i] = h
    batch.columns[HITS_COLUMN] = column
    _mark(batch, PROPOSER)
    ctx.metric("dr_zero/valid_questions", len(asked) / max(1, len(props)))
    ctx.metric("dr_zero/proposer/format", sum(f for _, _, f in props) / max(1, len(props)))
    if hits:
        ctx.metric("dr_zero/solver_success", sum(sum(h) / len(h) for h in hits) / len(hits))
        ctx.metric("dr_zero/proposer/difficulty", sum(difficulty_score(h) for h in hits) / len(hits))
    return batch


def _solver_step(ctx, rows, uids, group_offset, budgets, temps, factory, settings, renderer, attempts: int,
                 lora: bool):
    """The frozen proposer's questions (up to ``attempts`` tries until one passes the format check), then the
    solver's episodes on them; None (the step is skipped) when no question passed."""
    questions = []
    for _ in range(attempts):
        with _acting(ctx.policy, PROPOSER, lora):
            eps = _play(ctx, rows, uids, [1] * len(rows), temps, factory, settings, renderer)
        props = [proposal_of(e.record.as_dict(), r["hops"], r["document"], _final(e)) for e, r in zip(eps, rows)]
        ctx.metric("dr_zero/valid_questions", sum(1 for p in props if p[2] > 0) / max(1, len(props)))
        questions = [(i, p) for i, p in enumerate(props) if p[2] > 0]
        if questions:
            break
    if not questions:  # nothing for the solver: the step is skipped (the trainer's "skipped" metric)
        ctx.log(f"[grpolab] warning: dr_zero: solver step {ctx.step}: the proposer wrote no question that passes "
                f"the format check for any of the {len(rows)} documents in {attempts} attempts "
                f"(dr_zero_question_attempts); the step is skipped. If this repeats, train the proposer longer "
                f"first (dr_zero_steps_per_phase), draw more documents per step (prompts_per_step) or start "
                f"from a model that follows the <question>/<answer> format")
        return None
    srows = [solver_row(p[0], p[1], rows[i]["hops"]) for i, p in questions]
    counts = completion_counts(ctx.cfg.num_generations if budgets is None else budgets, len(rows))
    with role_adapter(ctx.policy, SOLVER if lora else None):
        batch = run_episodes(ctx, srows, [uids[i] for i, _ in questions], group_offset,
                             [counts[i] for i, _ in questions], [temps[i] for i, _ in questions], factory,
                             settings, renderer)
    _mark(batch, SOLVER)
    return batch


def eval_rollout(ctx, model, rows, uids, *, role_adapters="shared", max_turns, max_episode_tokens, max_turn_tokens,
                 tool_timeout, tool_output_chars, max_tool_calls, tool_isolation, tools, environment, environment_kind,
                 **_ignored):
    """Held-out evaluation of the solver: one greedy search episode per row with the solver (its adapter)."""
    settings, factory = episode_setup(ctx, max_turns=max_turns, max_episode_tokens=max_episode_tokens,
                                      max_turn_tokens=max_turn_tokens, tool_timeout=tool_timeout,
                                      tool_output_chars=tool_output_chars, max_tool_calls=max_tool_calls,
                                      tool_isolation=tool_isolation, tools=tools, environment=environment,
                                      environment_kind=environment_kind)
    with role_adapter(model, SOLVER if role_adapters == "lora" else None):
        batch = run_episodes(ctx, rows, uids, 0, [1] * len(rows), [0.0] * len(rows), factory, settings,
                             Renderer(ctx.tokenizer, log=ctx.log), model=model, seeds=list(uids))
    _mark(batch, SOLVER)
    return batch


def model_texts(cfg, environment, rows: list[dict]) -> list[str]:
    """Text the rollout shows besides the data (the tool's description, the proposer's instruction), for a
    tokenizer built from the run's text (``--model tiny``)."""
    return tool_texts(cfg, environment, rows) + [PROPOSER_SYSTEM]


def lora_adapters(cfg) -> list[str]:
    """The LoRA adapters of the run (``role_adapters: lora``): proposer and solver, in the order of ``ROLES``."""
    return list(ROLES) if cfg.params.get("role_adapters") == "lora" else []


dr_zero.eval_rollout = eval_rollout
dr_zero.lora_adapters = lora_adapters
dr_zero.model_texts = model_texts
dr_zero.first_prompts = first_prompts  # the proposer's prompts with the tool schemas, measured at start-up
dr_zero.max_prompt_length = AGENT_MAX_PROMPT_LENGTH
dr_zero.columns = (EPISODE_COLUMN, "episode_text", "role", HITS_COLUMN)  # reward functions may take them
