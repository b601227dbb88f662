"""The ``lm_program`` rollout strategy: programs of several LM modules written as plain Python (mmGRPO, AgentFlow).

The user gives ``program``: a built-in name (``plan_solve``, ``agentflow``: grpolab/agents/programs.py) or
``MODULE:FUNCTION``, a function ``program(lm, row) -> answer text``. ``lm(module, messages_or_text,
max_new_tokens=None) -> text`` samples one reply of the run's model: a chat (a list of ``{"role", "content"}``
messages, rendered with the tokenizer's chat template) or a plain text prompt (tokenized as it is), at most
``max_new_tokens`` (default ``max_completion_length``) new tokens, at the prompt's temperature.

For every prompt row, G runs of the program are made. The runs of all the step's prompts execute at the same
time (one thread each); whenever every live run waits on an ``lm`` call, the waiting calls are sampled in one
batch (ordered by run), so a step costs as many batched generations as its longest run has calls. Every call is
recorded: its module, its prompt tokens, its sampled tokens with their behaviour log-probs.

**Rows.** Each call becomes one batch row: its prompt, its sampled tokens (``SAMPLED``, one span). Columns:
``module`` (the call's module), ``lm_program_call`` (its index among the run's calls of that module),
``lm_program_answer`` (the run's answer), ``completion`` (the call's own text) and ``episode`` (a one-turn
episode record, so the turn estimators such as ``flow_grpo`` read it). Calls of modules with ``trainable:
false`` (``lm_program_modules``) and calls that sampled no token leave the batch.

**Reward.** The task's reward functions score each run's answer once; every call of the run gets that reward
(the whole program's reward). A run whose program raised (``lm_program/failed_runs``):

* :class:`~grpolab.agents.programs.FormatFailure` (a module reply the program could not use, dspy's
  ``AdapterParseError``): the run keeps its calls, the failing one included, and gets
  ``lm_program_format_failure_score`` (-1);
* any other exception (an interrupted run): ``lm_program_on_error: drop`` (default) removes the run and its
  calls, as dspy's GRPO does (its traces lose a crashed run, and the run's group is formed from the other runs);
  ``score`` keeps the calls made before the exception and gives them ``lm_program_failure_score`` (0).

The fixed scores replace the combined reward through the reward transform ``lm_program_failures``, which must be
the last of ``reward_transforms`` (the recipes have it; without it, ``lm_program_on_error: score`` is refused at
startup and a FormatFailure stops the run with an error naming the fix).

**Groups** (``lm_program_grouping``):

* ``by_invocation`` (mmGRPO, dspy's GRPO): for module p and input e, the k-th calls of p across the G runs form
  one group. When runs call p a different number of times (``lm_program_variable_calls``): ``truncate`` cuts
  every run to the smallest count; ``fill`` pads each run up to the largest count with copies of its own calls
  (``lm_program_fill``: ``max``, its last call, or ``randint``, a random one of its calls); ``ragged`` keeps
  every call, group k holding the runs that made a k-th call. A module that some run never called gets no group
  for that input (dspy skips it). With ``lm_program_pad_groups`` a group with fewer members than the prompt's G
  runs is padded by repeating its members in order, as dspy pads before the training step.
* ``by_input`` (Flow-GRPO, AgentFlow): all calls of module p for input e across the G runs form one group.

**Prompts.** With ``update_strategy: better_together`` (mmGRPO composed with prompt optimisation, as dspy's
BetterTogether: grpolab/stages/update_better_together.py) every call's prompt gets its module's optimised few-shot
demonstrations in front (:func:`grpolab.agents.programs.with_demos`); a row's prompt is the prompt as shown, demos
included. The update strategy keeps them (``lm_program_demos(ctx, training)``, found through ``ctx.components``)
and checkpoints them; held-out evaluation uses the demos as they are then.

Metrics: ``lm_program/reward`` (the runs' combined reward), ``lm_program/<module>/calls`` (calls per run),
``lm_program/failed_runs``, ``lm_program/format_failures``, ``lm_program/dropped_runs``,
``lm_program/calls_left_out`` (calls cut by ``truncate`` or a skipped module), ``lm_program/frozen_calls``.
Held-out evaluation runs the program once per row (greedy) and scores its answer.
"""
from __future__ import annotations

import copy
import math
import threading
from dataclasses import dataclass, field

import torch

from ..agents.adapters import load_object
from ..agents.programs import BUILTIN_PROGRAMS, TEXTS, FormatFailure, with_demos
from ..algorithms.advantages import combine_rewards
from ..errors import ConfigError
from ..generation.plain import eos_token_ids
from ..generation.sampling import completion_counts, per_prompt
from ..generation.turns import Episode, pack_episodes
from ..registry import ROLLOUT_STRATEGIES, param
from ..rewards.transforms import LM_PROGRAM_FAILURE_KEY as FAILURE_KEY

GROUPINGS = ("by_invocation", "by_input")
VARIABLE_CALLS = ("truncate", "fill", "ragged")
FILLS = ("max", "randint")
ON_ERROR = ("drop", "score")
FAILURE_TRANSFORM = "lm_program_failures"


@dataclass
class Call:
    """One ``lm`` call of one run."""
    module: str
    prompt_ids: list[int]
    ids: list[int]
    logprobs: list[float]
    finish_reason: str
    text: str
    engine: bool = False
    prompt: object = None  # the program's own prompt (a text or a chat), before any few-shot demos


@dataclass
class Run:
    """One run of the program on one input."""
    prompt: int  # index of the input among the step's rows
    row: dict
    uid: int
    temperature: float
    calls: list[Call] = field(default_factory=list)
    answer: str = ""
    failure: str = ""  # "", "error" or "format"
    error: str = ""
    fatal: BaseException | None = None  # a configuration error raised through lm: stops the run (the training run)


class _Aborted(BaseException):
    """Unblocks a waiting program thread when sampling failed (never caught by a program's ``except Exception``)."""


def parse_modules(spec) -> dict[str, bool]:
    """``lm_program_modules`` as ``{name: trainable}``; empty: every module the program calls is trained."""
    form = ("lm_program_modules: a list of module names or {name, trainable} mappings, e.g. [planner, {name: "
            "executor, trainable: false}]")
    if spec in (None, "", []):
        return {}
    if isinstance(spec, str):
        spec = [s.strip() for s in spec.split(",") if s.strip()]
    if not isinstance(spec, (list, tuple)):
        raise ConfigError(f"{form}; got {spec!r}")
    out: dict[str, bool] = {}
    for i, m in enumerate(spec):
        m = {"name": m} if isinstance(m, str) else m
        if not isinstance(m, dict) or not isinstance(m.get("name"), str) or not m["name"]:
            raise ConfigError(f"lm_program_modules[{i}]: {m!r} has no name; {form}")
        unknown = sorted(set(m) - {"name", "trainable"})
        if unknown:
            raise ConfigError(f"lm_program_modules[{i}] ({m['name']}): unknown key(s) {', '.join(unknown)}; valid "
                              f"keys: name, trainable")
        if not isinstance(m.get("trainable", True), bool):
            raise ConfigError(f"lm_program_modules[{i}] ({m['name']}): trainable must be true or false")
        if m["name"] in out:
            raise ConfigError(f"lm_program_modules: module {m['name']} appears more than once")
        out[m["name"]] = m.get("trainable", True)
    if not any(out.values()):
        raise ConfigError("lm_program_modules: every module has trainable: false; at least one must be trained")
    return out


def load_program(spec: str):
    """A built-in program by name, or ``MODULE:FUNCTION`` imported."""
    if spec in BUILTIN_PROGRAMS:
        return BUILTIN_PROGRAMS[spec]
    if not isinstance(spec, str) or ":" not in spec:
        raise ConfigError(f"program: '{spec}' is neither a built-in program ({', '.join(BUILTIN_PROGRAMS)}) nor "
                          f"MODULE:FUNCTION")
    try:
        fn = load_object(spec, "program")
    except ValueError as e:
        raise ConfigError(str(e)) from e
    if not callable(fn):
        raise ConfigError(f"program: '{spec}' is not callable; give a function program(lm, row) -> answer text")
    return fn


# ------------------------------------------------------------------------------------------------- grouping


def invocation_groups(per_run: list[list], *, variable_calls: str = "truncate", fill: str = "max",
                      pad_to: int | None = None, generator: torch.Generator | None = None) -> tuple[list[list], int]:
    """mmGRPO's groups of one module for one input: ``per_run[j]`` is run j's calls of the module, in order.

    Returns ``(groups, left_out)``: group k lists the k-th calls across the runs (after ``truncate`` / ``fill`` /
    ``ragged``, see the module docstring), padded to ``pad_to`` members by repeating its members in order when
    given; ``left_out`` counts the calls in no group. No group at all when a run made no call (dspy's skip).

    Provenance: authors' code — https://github.com/stanfordnlp/dspy dspy/teleprompt/grpo.py (GRPO.compile: the
    k-th invocations of a predictor across the rollouts of one example form a group; variably_invoked_predictor
    _grouping_mode truncate / fill / ragged, fill strategies randint / max, an example skipped when some rollout
    has no invocation, groups shorter than num_rollouts_per_grpo_step padded with group[:missing] until full);
    notes: their ragged loop indexes every rollout up to the largest count (an IndexError for shorter ones), so
    here group k holds the runs that made a k-th call, the evident intent; randint draws from the run's seeded
    generator. Test: tests/test_lm_program.py::test_invocation_groups_by_hand.
    """
    if variable_calls not in VARIABLE_CALLS:
        raise ValueError(f"lm_program_variable_calls: '{variable_calls}' is not valid; valid values: "
                         f"{', '.join(VARIABLE_CALLS)}")
    if fill not in FILLS:
        raise ValueError(f"lm_program_fill: '{fill}' is not valid; valid values: {', '.join(FILLS)}")
    total = sum(len(c) for c in per_run)
    if not per_run or min(len(c) for c in per_run) == 0:
        return [], total
    lo, hi = min(len(c) for c in per_run), max(len(c) for c in per_run)
    if variable_calls == "truncate":
        per_run = [c[:lo] for c in per_run]
    elif variable_calls == "fill":
        def pick(c):
            if fill == "max":
                return c[-1]
            return c[int(torch.randint(len(c), (1,), generator=generator))]
        per_run = [list(c) + [pick(c) for _ in range(hi - len(c))] for c in per_run]
    groups = [[c[k] for c in per_run if len(c) > k] for k in range(max(len(c) for c in per_run))]
    if pad_to is not None:
        for g in groups:
            while len(g) < pad_to:
                g.extend(g[:min(pad_to - len(g), len(g))])
    left_out = total - len({x for c in per_run for x in c})  # calls are distinct values (run, call index)
    return groups, left_out


def call_groups(runs: list[Run], sizes: list[int], *, grouping: str, variable_calls: str = "truncate",
                fill: str = "max", pad: bool = True, generator=None) -> tuple[list[list[tuple[int, int]]], int]:
    """The groups of the step's calls, each a list of ``(run index, call index)`` (a call may repeat: ``fill``,
    padding), ordered by input, then module (in order of first call), then invocation; and the calls left out.
    ``runs`` are the kept runs (a dropped run is not among them); ``sizes[p]`` is input p's number of runs G (a
    group is padded to it, as dspy pads to num_rollouts_per_grpo_step)."""
    groups, left_out = [], 0
    for p in range(len(sizes)):
        mine = [(j, r) for j, r in enumerate(runs) if r.prompt == p]
        modules = list(dict.fromkeys(c.module for _, r in mine for c in r.calls))
        for m in modules:
            per_run = [[(j, i) for i, c in enumerate(r.calls) if c.module == m] for j, r in mine]
            if grouping == "by_input":
                flat = [x for c in per_run for x in c]
                if flat:
                    groups.append(flat)
                continue
            gs, out = invocation_groups(per_run, variable_calls=variable_calls, fill=fill,
                                        pad_to=sizes[p] if pad else None, generator=generator)
            groups.extend(gs)
            left_out += out
    return groups, left_out


# ------------------------------------------------------------------------------------------------ execution


def sample_calls(ctx, contexts, budgets, temperatures, model=None):
    """The waiting calls of every live run, sampled in one batch (tests replace it to script the modules)."""
    return ctx.continue_(contexts, max_new_tokens=budgets, temperature=temperatures, stop_strings=[], model=model)


def render(tok, prompt) -> list[int]:
    """A call's prompt token ids: a chat through the chat template (with the generation prompt), a text as is."""
    if isinstance(prompt, str):
        text = prompt
    elif isinstance(prompt, (list, tuple)) and all(isinstance(m, dict) and "role" in m and "content" in m
                                                   for m in prompt):
        text = tok.apply_chat_template([dict(m) for m in prompt], tokenize=False, add_generation_prompt=True)
    else:
        raise ConfigError(f"lm: the prompt must be a text or a list of {{'role', 'content'}} messages, got "
                          f"{type(prompt).__name__}")
    return tok(text, add_special_tokens=False)["input_ids"]


def run_programs(ctx, program, runs: list[Run], *, modules: dict[str, bool], turn_tokens: int, model=None,
                 demos: dict | None = None) -> None:
    """Every run of ``program`` to its end, the waiting ``lm`` calls sampled in batches (the module docstring).
    ``demos``: ``{module: [{"prompt", "reply"}, ...]}``, few-shot demonstrations put in front of that module's
    prompts (:func:`grpolab.agents.programs.with_demos`; the prompt optimiser's, update_strategy better_together)."""
    sched = _Scheduler(ctx, runs, modules, turn_tokens, model, demos)
    threads = [threading.Thread(target=sched.body, args=(program, j, r), daemon=True) for j, r in enumerate(runs)]
    for t in threads:
        t.start()
    try:
        sched.serve()
    except BaseException:
        with sched.cond:
            sched.abort = True
            sched.cond.notify_all()
        raise
    finally:
        for t in threads:
            t.join()
    for r in runs:
        if r.fatal is not None:
            raise r.fatal


class _Scheduler:
    """What the program threads of one step share with the sampling loop: the waiting calls (``waiting[run]``:
    the call's prompt ids, budget and, once sampled, its output), the count of runs still computing (``busy``)
    and the abort flag, under one condition."""

    def __init__(self, ctx, runs: list[Run], modules: dict[str, bool], turn_tokens: int, model, demos=None):
        self.ctx, self.runs, self.modules, self.turn_tokens, self.model = ctx, runs, modules, turn_tokens, model
        self.demos = demos or {}
        self.tok = ctx.tokenizer
        self.eos = set(eos_token_ids(self.tok, model if model is not None else ctx.policy))
        self.cond = threading.Condition()
        # a fast tokenizer used from several threads at once can fail ("Already borrowed")
        self.tok_lock = threading.Lock()
        self.waiting: dict[int, dict] = {}
        self.busy = len(runs)
        self.abort = False

    def lm(self, j: int, run: Run, module: str, prompt, max_new_tokens: int | None = None) -> str:
        """Run ``j``'s ``lm`` call: wait until the sampling loop has sampled it, record it, return its text."""
        if self.modules and module not in self.modules:
            run.fatal = ConfigError(f"program called module '{module}', which lm_program_modules does not list "
                                    f"(listed: {', '.join(self.modules)}); add it, with trainable: false to leave "
                                    f"its calls out of training")
            raise run.fatal
        with self.tok_lock:
            ids = render(self.tok, with_demos(prompt, self.demos.get(module)))
        limit = self.ctx.cfg.max_prompt_length
        if len(ids) > limit:
            run.fatal = ConfigError(f"lm_program: a prompt of module '{module}' has {len(ids)} tokens, more "
                                    f"than max_prompt_length={limit}; raise "
                                    f"--max_prompt_length or shorten the program's prompts")
            raise run.fatal
        slot = {"ids": ids, "budget": int(max_new_tokens or self.turn_tokens), "out": None}
        with self.cond:
            self.waiting[j] = slot
            self.busy -= 1
            self.cond.notify_all()
            while slot["out"] is None and not self.abort:
                self.cond.wait()
            if slot["out"] is None:
                raise _Aborted()
        new, lps, reason, engine = slot["out"]
        with self.tok_lock:
            text = self.tok.decode([t for t in new if t not in self.eos], skip_special_tokens=True)
        run.calls.append(Call(module, ids, list(new), list(lps), reason, text, engine, copy.deepcopy(prompt)))
        return text

    def body(self, program, j: int, run: Run) -> None:
        """One program thread: run ``j`` to its answer or its failure."""
        def lm(module: str, prompt, max_new_tokens: int | None = None) -> str:
            return self.lm(j, run, module, prompt, max_new_tokens)
        try:
            answer = program(lm, copy.deepcopy(run.row))
            if not isinstance(answer, str):
                run.fatal = ConfigError(f"program: returned {type(answer).__name__}; a program returns the answer "
                                        f"text (str)")
            run.answer = answer if isinstance(answer, str) else ""
        except _Aborted:
            pass
        except FormatFailure as e:
            run.failure, run.error = "format", f"FormatFailure: {e}"
        except Exception as e:  # an interrupted run (lm_program_on_error decides)
            run.failure, run.error = "error", f"{type(e).__name__}: {e}"
        finally:
            with self.cond:
                self.busy -= 1
                self.cond.notify_all()

    def serve(self) -> None:
        """Whenever no run computes, sample every waiting call in one batch (ordered by run) and wake them; stop
        when none waits or a run hit a configuration error."""
        runs = self.runs
        while True:
            with self.cond:
                while self.busy > 0:
                    self.cond.wait()
                if not self.waiting or any(r.fatal is not None for r in runs):
                    self.abort = True  # a configuration error stops every run
                    self.cond.notify_all()
                    break
                order = sorted(self.waiting)
                slots = [self.waiting.pop(j) for j in order]
            out = sample_calls(self.ctx, [s["ids"] for s in slots], [s["budget"] for s in slots],
                               [runs[j].temperature for j in order], model=self.model)
            with self.cond:
                for s, ids, lps, reason in zip(slots, out.ids, out.logprobs, out.finish_reasons):
                    s["out"] = (ids, lps, reason, out.from_engine)
                self.busy += len(slots)
                self.cond.notify_all()


# --------------------------------------------------------------------------------------------------- rollout


def _check(cfg) -> None:
    p = cfg.params
    load_program(p.get("program", "plan_solve"))
    parse_modules(p.get("lm_program_modules"))
    for key, valid, default in (("lm_program_grouping", GROUPINGS, "by_invocation"),
                                ("lm_program_variable_calls", VARIABLE_CALLS, "truncate"),
                                ("lm_program_fill", FILLS, "max"), ("lm_program_on_error", ON_ERROR, "drop")):
        if p.get(key, default) not in valid:
            raise ConfigError(f"{key}: '{p.get(key)}' is not valid; valid values: {', '.join(valid)}")
    fail, fmt = float(p.get("lm_program_failure_score", 0.0)), float(p.get("lm_program_format_failure_score", -1.0))
    if not fail > fmt:
        raise ConfigError(f"lm_program_failure_score ({fail}) must be greater than lm_program_format_failure_score "
                          f"({fmt}), as dspy requires")
    transforms = list(cfg.reward_transforms or [])
    if (p.get("lm_program_on_error") == "score" or FAILURE_TRANSFORM in transforms) and \
            transforms[-1:] != [FAILURE_TRANSFORM]:
        raise ConfigError(_needs_transform("lm_program_on_error: score", transforms))


def _needs_transform(why: str, transforms: list[str]) -> str:
    fix = ",".join([t for t in transforms if t != FAILURE_TRANSFORM] + [FAILURE_TRANSFORM])
    return (f"{why} gives failed runs a fixed reward, which the reward transform {FAILURE_TRANSFORM} sets: "
            f"reward_transforms must end with it (got {transforms}); e.g. --reward_transforms {fix}")


def answers_batch(ctx, runs: list[Run]):
    """One row per run, its answer as the completion (what the task's reward functions score)."""
    tok = ctx.tokenizer
    eps = []
    for r in runs:
        ep = Episode(render(tok, r.row["prompt"]))
        ids = tok(r.answer, add_special_tokens=False)["input_ids"] if r.answer else []
        eps.append(ep.add_model_turn(ids, [0.0] * len(ids)))
    batch = pack_episodes(tok, eps, [r.row for r in runs], uids=[r.uid for r in runs],
                          group_ids=[r.prompt for r in runs])
    batch.columns["completion"] = [[{"role": "assistant", "content": r.answer}]
                                   if not isinstance(r.row["prompt"], str) else r.answer for r in runs]
    return batch


@ROLLOUT_STRATEGIES.register("lm_program", check=_check, needs=("text",))
def lm_program(ctx, rows, uids, group_offset, budgets=None, temperatures=None, *,
               program: str = param("plan_solve", "lm_program: the program, a built-in (plan_solve, agentflow) or "
                                    "MODULE:FUNCTION; program(lm, row) -> answer text, with lm(module, "
                                    "messages_or_text, max_new_tokens=None) -> text"),
               lm_program_modules: list = param([], "lm_program: the modules (names, or {name, trainable} "
                                                "mappings); calls of a trainable: false module leave the batch; "
                                                "empty: every module the program calls is trained"),
               lm_program_grouping: str = param("by_invocation", "lm_program: by_invocation (mmGRPO: the k-th calls "
                                                "of a module across the runs of one input form a group) or "
                                                "by_input (Flow-GRPO: all calls of a module for one input)",
                                                list(GROUPINGS)),
               lm_program_variable_calls: str = param("truncate", "lm_program by_invocation, runs with different "
                                                      "call counts: truncate (to the smallest), fill (to the "
                                                      "largest, with copies) or ragged (as they are), as dspy",
                                                      list(VARIABLE_CALLS)),
               lm_program_fill: str = param("max", "lm_program fill: pad a run with its last call (max) or a random "
                                            "one of its calls (randint), as dspy's fill strategies", list(FILLS)),
               lm_program_pad_groups: bool = param(True, "lm_program by_invocation: pad a group with fewer members "
                                                   "than the input's runs by repeating its members, as dspy"),
               lm_program_on_error: str = param("drop", "lm_program: a run whose program raised: drop it (as dspy's "
                                                "GRPO) or score its calls with lm_program_failure_score",
                                                list(ON_ERROR)),
               lm_program_failure_score: float = param(0.0, "lm_program: the reward of an interrupted run's calls "
                                                       "(lm_program_on_error: score), dspy's failure_score"),
               lm_program_format_failure_score: float = param(-1.0, "lm_program: the reward of the calls of a run "
                                                              "whose program raised FormatFailure, dspy's "
                                                              "format_failure_score")):
    """G runs of an LM program per prompt, one row per LM call, groups per module (the module docstring).

    Provenance: authors' code — https://github.com/stanfordnlp/dspy dspy/teleprompt/grpo.py (GRPO.compile) and
    dspy/teleprompt/bootstrap_trace.py (bootstrap_trace_data); notes: mmGRPO (Multi-module GRPO: Composing Policy
    Gradients and Prompt Optimization for Language Model Programs, arXiv:2508.04660, seed 000-23): every
    invocation of a module is one sample whose reward is the whole program's score, grouped by module, input and
    invocation index (:func:`invocation_groups`); a parse failure gets format_failure_score (-1) and the run's
    calls are kept; a program that raises is lost from dspy's traces (Evaluate scores it failure_score, 0, for
    reporting only), so drop is the default. grpolab's choices: programs are plain Python functions calling
    ``lm(module, prompt)`` instead of dspy predictors with signatures and adapters; the program's runs are
    batched through threads; all modules share the run's model (dspy's multitask=True, one LM); ``by_input``
    grouping for AgentFlow (Flow-GRPO, arXiv:2510.05592, seed 000-79; lupantech/AgentFlow groups a query's
    planner turns by uid).
    Test: tests/test_lm_program.py::test_calls_are_rows_grouped_by_invocation_with_the_program_reward.
    """
    cfg = ctx.cfg
    modules = parse_modules(lm_program_modules)
    fn = load_program(program)
    counts = completion_counts(cfg.num_generations if budgets is None else budgets, len(rows))
    temps = per_prompt(cfg.temperature if temperatures is None else temperatures, len(rows), "temperature")
    runs = [Run(i, row, uid, float(t)) for i, (row, uid, c, t) in enumerate(zip(rows, uids, counts, temps))
            for _ in range(c)]
    source = prompt_source(ctx)
    run_programs(ctx, fn, runs, modules=modules, turn_tokens=cfg.max_completion_length,
                 demos=source.lm_program_demos(ctx, training=True) if source is not None else None)
    for r in runs:
        if r.failure:
            ctx.log(f"lm_program: a run of prompt {r.uid} failed after {len(r.calls)} call(s): {r.error}")
    dropped = [r for r in runs if r.failure == "error" and lm_program_on_error == "drop"]
    kept = [r for r in runs if not (r.failure == "error" and lm_program_on_error == "drop")]
    fixed = {"error": lm_program_failure_score, "format": lm_program_format_failure_score}
    run_batch, run_reward = _score_runs(ctx, kept, fixed)

    groups, left_out = call_groups(kept, counts, grouping=lm_program_grouping,
                                   variable_calls=lm_program_variable_calls, fill=lm_program_fill,
                                   pad=lm_program_pad_groups, generator=ctx.generator)
    frozen = sum(1 for r in kept for c in r.calls if modules and not modules[c.module])
    members, gids = _trainable_members(ctx, kept, groups, modules, group_offset)
    _metrics(ctx, runs, kept, dropped, run_reward, left_out, frozen)
    if not members:
        raise ValueError("lm_program: no LM call of this step can be trained (every run failed, called no trainable "
                         "module, or sampled no token); check the program and lm_program_modules")
    return _call_batch(ctx, kept, members, gids, run_batch, fixed)


def prompt_source(ctx):
    """The run's component that keeps the modules' optimised prompts (it has ``lm_program_demos(ctx, training)
    -> {module: demos}``: update_strategy better_together), or None."""
    found = [c.fn for c in getattr(ctx, "components", {}).values() if hasattr(c.fn, "lm_program_demos")]
    return found[0] if found else None


def _score_runs(ctx, kept: list[Run], fixed: dict):
    """The runs' batch scored by the task's reward functions, and each run's combined reward (a failed run's:
    its fixed score, ``fixed[failure]``)."""
    transforms = list(ctx.cfg.reward_transforms or [])
    if any(r.failure for r in kept) and transforms[-1:] != [FAILURE_TRANSFORM]:
        raise ConfigError(_needs_transform("a run whose program raised FormatFailure", transforms))
    run_batch = answers_batch(ctx, kept)
    ctx.reward_errors += ctx.scorer.score(run_batch)
    run_reward = combine_rewards(run_batch.rewards, ctx.scorer.weights).double()
    for j, r in enumerate(kept):
        if r.failure:
            run_reward[j] = fixed[r.failure]
    return run_batch, run_reward


def _trainable_members(ctx, kept: list[Run], groups, modules: dict[str, bool], group_offset: int):
    """The ``(run, call)`` rows of the batch and their group ids: the groups of trainable modules, less the calls
    that sampled no token; an input's first group takes its id ``group_offset + input``, its others new ids."""
    members, gids = [], []
    first_group = {}
    for g in groups:
        (j, i) = g[0]
        c = kept[j].calls[i]
        if modules and not modules[c.module]:
            continue
        p = kept[j].prompt
        gid = group_offset + p if p not in first_group else ctx.allocate_groups(1)
        first_group.setdefault(p, gid)
        for j, i in g:
            if kept[j].calls[i].ids:
                members.append((j, i))
                gids.append(gid)
    return members, gids


def _call_batch(ctx, kept: list[Run], members, gids, run_batch, fixed: dict):
    """One row per member call: its prompt and sampled tokens, its run's rewards and the columns of the module
    docstring."""
    eps = []
    for j, i in members:
        c = kept[j].calls[i]
        eps.append(Episode(c.prompt_ids).add_model_turn(c.ids, c.logprobs, finish_reason=c.finish_reason,
                                                        engine=c.engine))
    batch = pack_episodes(ctx.tokenizer, eps, [kept[j].row for j, _ in members],
                          uids=[kept[j].uid for j, _ in members], group_ids=gids, logprobs_fn=ctx.logprobs,
                          is_cap=ctx.cfg.vllm_is_cap)
    idx = torch.tensor([j for j, _ in members], dtype=torch.long)
    batch.rewards = run_batch.rewards[idx].clone()
    batch.reward_names = list(run_batch.reward_names)
    batch.row_data[FAILURE_KEY] = torch.tensor([fixed[kept[j].failure] if kept[j].failure else math.nan
                                                for j, _ in members], dtype=torch.float64)
    calls = [kept[j].calls[i] for j, i in members]
    batch.columns["module"] = [c.module for c in calls]
    batch.columns["lm_program_call"] = [sum(1 for d in kept[j].calls[:i] if d.module == kept[j].calls[i].module)
                                        for j, i in members]
    batch.columns["lm_program_answer"] = [kept[j].answer for j, _ in members]
    batch.columns["episode"] = [{"turns": [{"span": 1, "text": c.text}], "num_turns": 1} for c in calls]
    return batch


def _metrics(ctx, runs, kept, dropped, run_reward, left_out, frozen) -> None:
    if kept:
        ctx.metric("lm_program/reward", float(torch.nanmean(run_reward)))
    for m in dict.fromkeys(c.module for r in runs for c in r.calls):
        ctx.metric(f"lm_program/{m}/calls", sum(1 for r in runs for c in r.calls if c.module == m) / len(runs))
    ctx.metric("lm_program/failed_runs", float(sum(1 for r in runs if r.failure)))
    ctx.metric("lm_program/format_failures", float(sum(1 for r in runs if r.failure == "format")))
    ctx.metric("lm_program/dropped_runs", float(len(dropped)))
    ctx.metric("lm_program/calls_left_out", float(left_out))
    ctx.metric("lm_program/frozen_calls", float(frozen))


def eval_rollout(ctx, model, rows, uids, *, program, lm_program_modules, **_ignored):
    """Held-out evaluation: one greedy run of the program per row; one row per run, its answer as the completion
    (a run that raised answers the empty text)."""
    runs = [Run(i, row, uid, 0.0) for i, (row, uid) in enumerate(zip(rows, uids))]
    source = prompt_source(ctx)
    run_programs(ctx, load_program(program), runs, modules=parse_modules(lm_program_modules),
                 turn_tokens=ctx.cfg.max_completion_length, model=model,
                 demos=source.lm_program_demos(ctx, training=False) if source is not None else None)
    return answers_batch(ctx, runs)


def model_texts(cfg, environment, rows: list[dict]) -> list[str]:
    """The built-in programs' instructions, for a tokenizer built from the run's text (``--model tiny``)."""
    return list(TEXTS)


def greedy_runs(ctx, program: str, modules, rows: list[dict], *, turn_tokens: int, demos: dict):
    """One greedy run of ``program`` (a ``lm_program_path`` value) with ``modules`` (``lm_program_modules``) per
    row, the modules' prompts with ``demos``: ``(runs, batch)``, the :class:`Run` of each row and the scorable batch
    of their answers (:func:`answers_batch`). For the update strategy ``better_together``
    (``stages/update_better_together.py``), which reads it from the registered rollout (stages do not import
    rollouts: layers point one way)."""
    runs = [Run(i, row, i, 0.0) for i, row in enumerate(rows)]
    run_programs(ctx, load_program(program), runs, modules=parse_modules(modules), turn_tokens=turn_tokens,
                 demos=demos)
    return runs, answers_batch(ctx, runs)


lm_program.eval_rollout = eval_rollout
lm_program.model_texts = model_texts
lm_program.greedy_runs = greedy_runs
