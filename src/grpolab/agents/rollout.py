"""The ``agent`` rollout strategy: G multi-turn episodes per task instance, batched turn by turn.

For every prompt row, ``G`` episodes (the row's budget, ragged like
``plain``) each get their own environment (``factory(row)``), reset with the
row and their own seed. Then, turn by turn, every live episode's context is
continued in one batched call (:meth:`RolloutContext.continue_` ->
:func:`grpolab.generation.turns.continue_sequences`, the native sampler or
the vLLM engine), stopping at ``</tool_call>`` or EOS; each turn's text goes to
its environment's ``step`` (guarded: wall-clock limit, errors become error
observations or end that episode only); the observation is tokenised as the
chat template renders a tool / user message plus the next assistant header
(:meth:`grpolab.agents.parsing.Renderer.observation`) and appended as
``ENVIRONMENT`` tokens (loss mask 0). An episode ends when its environment
says done, at ``max_turns``, when ``max_episode_tokens`` completion tokens
(model + observation) are used, on an empty turn (``no_action``) or when its
environment fails (``error``).

The batch (:func:`~grpolab.generation.turns.pack_episodes`) has one row per
episode; ``columns["episode"]`` the :class:`~grpolab.agents.base.EpisodeRecord`
dicts; ``columns["completion"]`` the *final model turn's* text (the answer
the task's reward functions score; the whole episode text is
``columns["episode_text"]``). The strategy scores the batch itself: the
task's reward functions plus, with weight ``env_reward_weight``, the
environment's summed step rewards (reward column ``env_reward``, added by the
trainer through :func:`extra_rewards`).
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Callable

import torch

from ..batch import RolloutBatch
from ..errors import ConfigError
from ..generation.plain import eos_token_ids
from ..generation.sampling import completion_counts, per_prompt
from ..generation.turns import Continuation, Episode, pack_episodes
from ..registry import ROLLOUT_STRATEGIES, param
from .adapters import ENV_KINDS, TOOL_ISOLATION, CallTimeout, ToolLimits, cut, environment_factory, guarded
from .base import EPISODE_COLUMN, AgentEnv, EpisodeRecord, StepResult, ToolCall, TurnRecord
from .parsing import TOOL_CALL_CLOSE, Renderer, hermes_tools_text, tool_schemas

# the agent keys, declared once (other agent strategies reuse these constants)
MAX_TURNS = param(4, "agent: model turns per episode at most (the episode then ends with ended_by max_turns)")
MAX_EPISODE_TOKENS = param(1024, "agent: completion tokens per episode at most, model turns and observations "
                           "together (then ended_by token_budget)")
MAX_TURN_TOKENS = param(0, "agent: new tokens per model turn at most (0 = max_completion_length)")
TOOL_TIMEOUT = param(10.0, "agent: wall-clock seconds per tool call and per environment call (reset / step); a "
                     "call past it is abandoned and reported as a timeout")
TOOL_OUTPUT_CHARS = param(2000, "agent: a tool's output (and an observation) is cut to this many characters")
MAX_TOOL_CALLS = param(8, "agent: tool calls executed per model turn; further calls get an error text")
ENV_REWARD_WEIGHT = param(1.0, "agent: weight of the environment's summed step rewards (reward column env_reward) "
                          "next to the task's reward functions on the final answer")
TOOLS = param([], "agent: tool functions module:function (comma-separated on the command line: --tools)")
ENVIRONMENT = param(None, "agent: environment class module:Class (--env); default: the task's own environment")
ENVIRONMENT_KIND = param("auto", "agent: how to drive `environment`: auto (gym-style if it has step(), else "
                         "TRL-style reset(**row) + public tool methods), gym, trl, agent (an AgentEnv)",
                         list(ENV_KINDS))
TOOL_ISOLATION_KEY = param("thread", "agent: where tool functions run: thread (a watched worker thread, abandoned "
                           "on timeout) or sandbox (grpolab.sandbox child process with CPU/memory limits; "
                           "module-level functions with JSON results only)", list(TOOL_ISOLATION))
ENDED_SHARES = ("done", "max_turns", "token_budget", "no_action", "error")
# an agent run's default max_prompt_length (when no layer sets it; Config.build reads the strategy's
# ``max_prompt_length``): the first prompt carries the tool schemas (about 600 characters for one tool in the
# Hermes system message) and, in the built-in agent tasks, a worked example; 512 (the single-turn default) is
# too short for TRL's own `tools=[multiply]` example on a character-level tokenizer
AGENT_MAX_PROMPT_LENGTH = 2048


@dataclass
class AgentSettings:
    """One run's agent settings (the config keys above)."""
    max_turns: int = 4
    max_episode_tokens: int = 1024
    max_turn_tokens: int = 64
    limits: ToolLimits = field(default_factory=ToolLimits)


@dataclass
class LiveEpisode:
    """An episode being played: its environment, token sequence, record and chat state."""
    env: AgentEnv | None
    episode: Episode
    record: EpisodeRecord
    row: dict
    uid: int
    group: int
    temperature: float
    chat: bool
    finished: bool = False

    def end(self, how: str) -> None:
        self.finished = True
        self.record.ended_by = how


# ----------------------------------------------------------------------------- environment resolution
def resolve_factory(ctx, *, tools, environment, environment_kind, limits: ToolLimits) -> Callable[[dict], AgentEnv]:
    """The episode factory: the user's ``tools`` / ``environment`` keys win, else ``ctx.environment`` (the API's
    objects or the task's ``extra["environment"]``), else an error naming both options."""
    if tools or environment:
        try:
            return environment_factory(tools=tools, environment=environment, kind=environment_kind, limits=limits)
        except (ValueError, TypeError) as e:
            raise ConfigError(f"agent: {e}") from e
    env = getattr(ctx, "environment", None)
    if env is None:
        raise ConfigError("agent: no environment for this run. Give tools (--tools module:function[,...], "
                          "GRPOTrainer(tools=[...])) or an environment class (--env module:Class, "
                          "GRPOTrainer(environment_factory=Class)), or use a task that provides one "
                          "(Task.extra['environment'], e.g. an agent task)")
    if isinstance(env, dict):  # the Python API's objects: GRPOTrainer(tools=[...], environment_factory=Class)
        try:
            return environment_factory(tools=env.get("tools"), environment=env.get("environment"),
                                       kind=env.get("kind", "auto") if environment_kind == "auto"
                                       else environment_kind, limits=limits)
        except (ValueError, TypeError) as e:
            raise ConfigError(f"agent: {e}") from e
    if callable(env) and not isinstance(env, type):
        return env
    return environment_factory(environment=env, kind=environment_kind, limits=limits)


def prompt_tools(cfg, environment, row: dict) -> list[dict]:
    """The tool schemas an episode's first prompt shows, known before any step: those of one environment made
    for ``row`` (not reset, then closed). ``[]`` when it has no tools or cannot be made: the rollout reports
    that per episode (or, with no environment at all, as the error naming both options)."""
    from types import SimpleNamespace

    last = _PROBED[0]
    if last is not None and last[0] is cfg and last[1] is environment:  # one environment made per run
        return last[2]
    p = cfg.params
    env = None
    schemas: list[dict] = []
    try:
        factory = resolve_factory(SimpleNamespace(environment=environment), tools=p.get("tools"),
                                  environment=p.get("environment"),
                                  environment_kind=p.get("environment_kind", "auto"), limits=ToolLimits())
        env = factory(row)
        schemas = tool_schemas(getattr(env, "tools", None) or [])
    except Exception:  # noqa: BLE001 - the rollout raises or reports it, where it happens
        schemas = []
    finally:
        if env is not None:
            try:
                guarded(env.close, timeout=float(p.get("tool_timeout", TOOL_TIMEOUT.default)))
            except Exception:  # noqa: BLE001
                pass
    _PROBED[0] = (cfg, environment, schemas)
    return schemas


_PROBED: list = [None]  # (cfg, environment, schemas) of the last prompt_tools call


def first_prompts(cfg, environment, tokenizer, rows: list[dict]) -> list[str] | None:
    """The first prompt of an episode for each row as the rollout renders it, with the tool schemas (the first
    observation, known only after ``reset``, is not in it); None when the episodes show no tools. The trainer's
    start-up length check (:func:`grpolab.train.checks.check_lengths`) measures these."""
    schemas = prompt_tools(cfg, environment, rows[0]) if rows else []
    if not schemas:
        return None
    renderer = Renderer(tokenizer, log=lambda *a: None)
    return [renderer.prompt(r["prompt"], schemas) for r in rows]


def tool_texts(cfg, environment, rows: list[dict]) -> list[str]:
    """Text the episodes show besides the data (the tools' description), for a tokenizer built from the run's
    text (``--model tiny``)."""
    schemas = prompt_tools(cfg, environment, rows[0]) if rows else []
    return [hermes_tools_text(schemas)] if schemas else []


def _configure(env: AgentEnv, limits: ToolLimits) -> None:
    if isinstance(getattr(env, "limits", None), ToolLimits):
        env.limits = limits


# ----------------------------------------------------------------------------- sampling one turn
def sample_turns(ctx, contexts: list[list[int]], max_new_tokens: list[int], temperatures: list[float],
                 stop_strings: list[str], model=None) -> Continuation:
    """One model turn for every live episode, in one batched call (the behaviour policy or the vLLM engine;
    ``model``: that model, natively, e.g. for evaluation). Tests replace it to script a policy."""
    return ctx.continue_(contexts, max_new_tokens=max_new_tokens, temperature=temperatures,
                         stop_strings=stop_strings, model=model)


# ----------------------------------------------------------------------------- the episode loop
def start_episodes(ctx, rows, uids, group_offset, counts, temps, factory, settings: AgentSettings,
                   renderer: Renderer, seeds: list[int] | None = None) -> list[LiveEpisode]:
    """Make, reset and render the first prompt of every episode (``counts[i]`` for row ``i``). Each
    episode's environment seed is drawn from the run's generator, or ``seeds[i]`` for row ``i``."""
    tok = ctx.tokenizer
    cfg = ctx.cfg
    lim = settings.limits
    out = []
    for i, (row, uid, n, temp) in enumerate(zip(rows, uids, counts, temps)):
        for _ in range(n):
            seed = (int(torch.randint(0, 2 ** 31 - 1, (1,), generator=ctx.generator)) if seeds is None
                    else int(seeds[i]))
            rec = EpisodeRecord()
            rec.info["seed"] = seed
            chat = not isinstance(row["prompt"], str)
            env, first = None, ""
            try:
                env = guarded(factory, row, timeout=lim.timeout)
                _configure(env, lim)
                first = guarded(env.reset, row, seed, timeout=lim.timeout) or ""
                first = cut(str(first), lim.output_chars)
            except CallTimeout as e:
                rec.tool_timeouts += 1
                rec.info["error"] = f"reset: {e}"
            except Exception as e:  # noqa: BLE001 - a user's environment may raise anything
                rec.tool_errors += 1
                rec.info["error"] = f"reset raised {type(e).__name__}: {e}"
            schemas = tool_schemas(getattr(env, "tools", None) or []) if env is not None else []
            rec.info["tools"] = [sc["function"]["name"] for sc in schemas]
            text = renderer.prompt(row["prompt"], schemas, first)
            ids = tok(text, add_special_tokens=False)["input_ids"]
            if len(ids) > cfg.max_prompt_length:
                raise ConfigError(f"agent: an episode's prompt (with its tool schemas and first observation) has "
                                  f"{len(ids)} tokens, more than max_prompt_length={cfg.max_prompt_length}; "
                                  f"raise --max_prompt_length (GRPOConfig(max_prompt_length=...)) or shorten "
                                  f"the prompt or the environment's first observation")
            live = LiveEpisode(env, Episode(ids), rec, row, uid, group_offset + i, float(temp), chat)
            if "error" in rec.info:
                live.end("error")
            out.append(live)
    return out


def apply_step(live: LiveEpisode, text: str, last_id: int | None, ctx, settings: AgentSettings,
               renderer: Renderer, eos: set[int], state: str | None) -> None:
    """Give the model turn ``text`` to the episode's environment and append its answer (the turn was
    already added to ``live.episode``); updates the record and ends the episode when it is over."""
    lim = settings.limits
    rec = live.record
    turn = TurnRecord(span=live.episode.turns, text=text, state=state)
    rec.turns.append(turn)
    steps = max(1, min(lim.max_calls, text.count(TOOL_CALL_CLOSE) + 1)) + 1  # a tools env runs its calls inside
    try:
        result = guarded(live.env.step, text, timeout=lim.timeout * steps)
        if not isinstance(result, StepResult):
            raise TypeError(f"{type(live.env).__name__}.step must return a StepResult, got "
                            f"{type(result).__name__}")
    except CallTimeout as e:
        rec.tool_timeouts += 1
        rec.info["error"] = f"step: {e}"
        live.end("error")
        return
    except Exception as e:  # noqa: BLE001
        rec.tool_errors += 1
        rec.info["error"] = f"step raised {type(e).__name__}: {cut(str(e), 500)}"
        live.end("error")
        return
    info = dict(result.info or {})
    calls: list[ToolCall] = list(info.pop("tool_calls", []) or [])
    messages = info.pop("messages", None)
    turn.tool_calls = calls
    rec.tool_errors += sum(1 for c in calls if c.error and not c.timed_out)
    rec.tool_timeouts += sum(1 for c in calls if c.timed_out)
    if result.reward is not None:
        turn.reward = float(result.reward)
        rec.env_reward += float(result.reward)
    rec.info.update(info)
    if result.done:
        turn.done = True
        live.end("done")
        return
    role = getattr(live.env, "observation_role", "user")
    if not messages:
        obs = result.observation
        messages = [{"role": role, "content": cut("" if obs is None else str(obs), lim.output_chars)}]
    messages = [renderer.tool_message(m.get("name", ""), m["content"]) if m.get("role") == "tool" else m
                for m in messages]
    eos_text = ctx.tokenizer.decode([last_id]) if last_id is not None and last_id in eos else None
    text_obs = renderer.observation(messages, live.chat, eos_text)
    ids = ctx.tokenizer(text_obs, add_special_tokens=False)["input_ids"]
    if len(live.episode) + len(ids) >= settings.max_episode_tokens:
        live.end("token_budget")  # no room for the observation and a next turn
        return
    live.episode.add_observation(ids)
    turn.observation = text_obs
    turn.obs_span = live.episode.turns


def play(ctx, episodes: list[LiveEpisode], settings: AgentSettings, renderer: Renderer, model=None) -> None:
    """Play every episode to its end, one batched model turn at a time (sampled from the behaviour policy,
    or from ``model``)."""
    tok = ctx.tokenizer
    eos = set(eos_token_ids(tok, model if model is not None else ctx.policy))
    for _ in range(settings.max_turns):
        live = [e for e in episodes if not e.finished]
        budgets = []
        for e in live:
            b = min(settings.max_turn_tokens, settings.max_episode_tokens - len(e.episode))
            if b <= 0:
                e.end("token_budget")
            budgets.append(b)
        live, budgets = [e for e in live if not e.finished], [b for b in budgets if b > 0]
        if not live:
            return
        states = []
        for e in live:
            fn = getattr(e.env, "state_key", None)
            if getattr(type(e.env), "state_key", None) is AgentEnv.state_key:
                fn = None  # the protocol's default: no anchor states
            try:
                states.append(None if fn is None else guarded(fn, timeout=settings.limits.timeout))
            except Exception:  # noqa: BLE001 - an anchor state is optional
                states.append(None)
        out = sample_turns(ctx, [e.episode.context() for e in live], budgets, [e.temperature for e in live],
                           [TOOL_CALL_CLOSE], model=model)
        for e, ids, lps, reason, state in zip(live, out.ids, out.logprobs, out.finish_reasons, states):
            if not ids:
                e.end("no_action")
                continue
            e.episode.add_model_turn(ids, lps, finish_reason=reason, engine=out.from_engine)
            text = tok.decode(ids, skip_special_tokens=True)
            apply_step(e, text, ids[-1], ctx, settings, renderer, eos, None if state is None else str(state))
    for e in episodes:
        if not e.finished:
            e.end("max_turns")


def close_all(episodes: list[LiveEpisode], timeout: float) -> None:
    for e in episodes:
        if e.env is None:
            continue
        try:
            guarded(e.env.close, timeout=timeout)
        except Exception:  # noqa: BLE001 - closing a broken environment must not stop the run
            pass


def pack(ctx, episodes: list[LiveEpisode], settings: AgentSettings) -> RolloutBatch:
    """The batch: one row per episode, the episode records, the final answers as ``completion``."""
    tok = ctx.tokenizer
    batch = pack_episodes(tok, [e.episode for e in episodes], [e.row for e in episodes],
                          uids=[e.uid for e in episodes], group_ids=[e.group for e in episodes],
                          max_length=settings.max_episode_tokens, logprobs_fn=ctx.logprobs,
                          is_cap=ctx.cfg.vllm_is_cap)
    batch.columns["episode_text"] = [c[0]["content"] if isinstance(c, list) else c
                                     for c in batch.columns["completion"]]
    finals = [e.record.turns[-1].text if e.record.turns else "" for e in episodes]
    batch.columns["completion"] = [[{"role": "assistant", "content": t}] if e.chat else t
                                   for e, t in zip(episodes, finals)]
    batch.columns[EPISODE_COLUMN] = [e.record.as_dict() for e in episodes]
    batch.truncated = torch.tensor([e.record.ended_by in ("max_turns", "token_budget") or e.episode.truncated
                                    for e in episodes], dtype=torch.bool)
    return batch


def log_metrics(ctx, records: list[dict], scalar: torch.Tensor | None) -> None:
    """Turns, tool calls (total and by tool), errors, timeouts, env vs final reward, how episodes ended."""
    n = max(1, len(records))
    ctx.metric("agent/turns_per_episode", sum(r["num_turns"] for r in records) / n)
    calls = [c for r in records for t in r["turns"] for c in t["tool_calls"]]
    ctx.metric("agent/tool_calls_per_episode", len(calls) / n)
    known = {t for r in records for t in r["info"].get("tools", [])}

    def bucket(call: dict) -> str:   # a name the model made up is no metric key of its own (unbounded keys)
        return call["name"] if call["name"] in known else "<unknown>" if call["name"] else "<unparsed>"
    names = known | {bucket(c) for c in calls}
    for name in sorted(names):
        ctx.metric(f"agent/tool_calls/{name}", sum(1 for c in calls if bucket(c) == name) / n)
    ctx.metric("agent/tool_errors", sum(r["tool_errors"] for r in records))
    ctx.metric("agent/tool_timeouts", sum(r["tool_timeouts"] for r in records))
    ctx.metric("agent/env_reward_mean", sum(r["env_reward"] for r in records) / n)
    if scalar is not None and scalar.numel():
        ctx.metric("agent/final_reward_mean", float(torch.nanmean(scalar.float())))
    for how in ENDED_SHARES:
        ctx.metric(f"agent/ended_by_{how}", sum(1 for r in records if r["ended_by"] == how) / n)


def run_episodes(ctx, rows, uids, group_offset, budgets, temperatures, factory, settings: AgentSettings,
                 renderer: Renderer | None = None, *, model=None, seeds: list[int] | None = None) -> RolloutBatch:
    """Everything the strategy does but scoring: start, play, close, pack (``model`` / ``seeds``: see
    :func:`play` and :func:`start_episodes`)."""
    cfg = ctx.cfg
    counts = completion_counts(cfg.num_generations if budgets is None else budgets, len(rows))
    temps = per_prompt(cfg.temperature if temperatures is None else temperatures, len(rows), "temperature")
    renderer = renderer or Renderer(ctx.tokenizer, log=ctx.log)
    episodes = start_episodes(ctx, rows, uids, group_offset, counts, temps, factory, settings, renderer, seeds)
    try:
        play(ctx, episodes, settings, renderer, model)
    finally:
        close_all(episodes, settings.limits.timeout)
    return pack(ctx, episodes, settings)


def eval_rollout(ctx, model, rows, uids, *, max_turns, max_episode_tokens, max_turn_tokens, tool_timeout,
                 tool_output_chars, max_tool_calls, tool_isolation, tools, environment, environment_kind,
                 **_ignored) -> RolloutBatch:
    """Held-out evaluation: one greedy episode per row with ``model`` (environment seed = the row's index,
    so every evaluation plays the same episodes); the trainer's ``evaluate`` scores it like plain rows."""
    settings, factory = episode_setup(ctx, max_turns=max_turns, max_episode_tokens=max_episode_tokens,
                                      max_turn_tokens=max_turn_tokens, tool_timeout=tool_timeout,
                                      tool_output_chars=tool_output_chars, max_tool_calls=max_tool_calls,
                                      tool_isolation=tool_isolation, tools=tools, environment=environment,
                                      environment_kind=environment_kind)
    return run_episodes(ctx, rows, uids, 0, [1] * len(rows), [0.0] * len(rows), factory, settings,
                        _Renderers.get(ctx), model=model, seeds=list(uids))


def _check(cfg) -> None:
    bad = [f"{k} must be >= 1 (got {getattr(cfg, k)})" for k in ("max_turns", "max_episode_tokens")
           if getattr(cfg, k) < 1]
    bad += [f"{k} must be >= 0 (got {getattr(cfg, k)})" for k in ("max_turn_tokens", "tool_output_chars")
            if getattr(cfg, k) < 0]
    if not cfg.tool_timeout > 0:
        bad.append(f"tool_timeout must be > 0 seconds (got {cfg.tool_timeout})")
    if bad:
        raise ConfigError("agent: " + "; ".join(bad))


class _Renderers:
    """One :class:`Renderer` per tokenizer (so the 'no tools support' note is logged once per run)."""
    by_tok: dict[int, Renderer] = {}

    @classmethod
    def get(cls, ctx) -> Renderer:
        r = cls.by_tok.get(id(ctx.tokenizer))
        if r is None or r.tok is not ctx.tokenizer:
            r = cls.by_tok[id(ctx.tokenizer)] = Renderer(ctx.tokenizer, log=ctx.log)
        return r


def episode_setup(ctx, *, max_turns, max_episode_tokens, max_turn_tokens, tool_timeout, tool_output_chars,
                  max_tool_calls, tool_isolation, tools, environment, environment_kind):
    """``(settings, environment factory)`` of a run from the agent config keys (the ``agent`` rollout, its
    held-out evaluation and the tree rollouts share it)."""
    settings = settings_of(ctx.cfg, max_turns=max_turns, max_episode_tokens=max_episode_tokens,
                           max_turn_tokens=max_turn_tokens, tool_timeout=tool_timeout,
                           tool_output_chars=tool_output_chars, max_tool_calls=max_tool_calls,
                           tool_isolation=tool_isolation, sandbox=_sandbox(ctx, tool_isolation, tool_timeout))
    factory = resolve_factory(ctx, tools=tools, environment=environment, environment_kind=environment_kind,
                              limits=settings.limits)
    return settings, factory


def settings_of(cfg, *, max_turns, max_episode_tokens, max_turn_tokens, tool_timeout, tool_output_chars,
                max_tool_calls, tool_isolation, sandbox=None) -> AgentSettings:
    return AgentSettings(max_turns=max_turns, max_episode_tokens=max_episode_tokens,
                         max_turn_tokens=max_turn_tokens or cfg.max_completion_length,
                         limits=ToolLimits(timeout=tool_timeout, output_chars=tool_output_chars,
                                           max_calls=max_tool_calls, isolation=tool_isolation, sandbox=sandbox))


def _sandbox(ctx, isolation: str, timeout: float):
    if isolation != "sandbox":
        return None
    box = getattr(ctx, "agent_sandbox", None)
    if box is None:
        from ..sandbox import Limits, Sandbox
        box = Sandbox(limits=Limits(cpu_s=timeout, wall_s=timeout))
        ctx.agent_sandbox = box
    return box


@ROLLOUT_STRATEGIES.register("agent", check=_check, needs=("text",))
def agent(ctx, rows, uids, group_offset, budgets=None, temperatures=None, *,
          max_turns: int = MAX_TURNS, max_episode_tokens: int = MAX_EPISODE_TOKENS,
          max_turn_tokens: int = MAX_TURN_TOKENS, tool_timeout: float = TOOL_TIMEOUT,
          tool_output_chars: int = TOOL_OUTPUT_CHARS, max_tool_calls: int = MAX_TOOL_CALLS,
          env_reward_weight: float = ENV_REWARD_WEIGHT, tools: list = TOOLS, environment: str | None = ENVIRONMENT,
          environment_kind: str = ENVIRONMENT_KIND, tool_isolation: str = TOOL_ISOLATION_KEY):
    """G multi-turn episodes per prompt with tools or an environment (the module docstring has the loop).

    Model turns are SAMPLED with their exact behaviour log-probs (loss mask 1),
    observations ENVIRONMENT (loss mask 0); ``span_ids`` number turns and
    observations from 1; ``columns["episode"]`` holds the episode records. The
    batch is scored here: the task's reward functions on the final answer
    (``completion``) plus ``env_reward_weight`` x the environment's summed step
    rewards (column ``env_reward``). Environment: ``tools`` / ``environment``
    (``--tools`` / ``--env``) if given, else the task's. Groups are the G
    episodes of one task instance, as in GRPO.

    Provenance: reconstructed from the abstract — the episode rollout the agentic seeds train on (GiGPO,
    Group-in-Group Policy Optimization for LLM Agent Training, seed 000-47: G complete trajectories per task
    instance, grouped for episode-level advantages; Tree-GRPO 000-10: an agent step = thought + tool call +
    observation); grpolab's choices: the Hermes <tool_call> format, observations rendered by the chat template
    as ENVIRONMENT tokens, the per-episode limits (max_turns, max_episode_tokens) and the final answer scored by
    the task's reward functions.
    """
    settings, factory = episode_setup(ctx, max_turns=max_turns, max_episode_tokens=max_episode_tokens,
                                      max_turn_tokens=max_turn_tokens, tool_timeout=tool_timeout,
                                      tool_output_chars=tool_output_chars, max_tool_calls=max_tool_calls,
                                      tool_isolation=tool_isolation, tools=tools, environment=environment,
                                      environment_kind=environment_kind)
    batch = run_episodes(ctx, rows, uids, group_offset, budgets, temperatures, factory, settings,
                         _Renderers.get(ctx))
    scalar = ctx.score(batch)
    log_metrics(ctx, batch.columns[EPISODE_COLUMN], scalar)
    return batch


def strategy_for_agents(strategy: str | None, given: list[str]) -> str | None:
    """The rollout strategy to set when a run has tools or an environment (``given``: which of them): ``agent``
    when none is named, ``None`` when the named one runs them; a strategy that cannot is a ConfigError."""
    if not given:
        return None
    if strategy is None:
        return "agent"
    if strategy in ROLLOUT_STRATEGIES and not all(k in ROLLOUT_STRATEGIES.params(strategy) for k in given):
        raise ConfigError(f"{' and '.join(given)} need a multi-turn rollout strategy, but rollout_strategy is "
                          f"'{strategy}', which runs no tools or environments; remove rollout_strategy (tools and "
                          f"environments select 'agent') or set rollout_strategy: agent")
    return None


def env_reward(completions, episode=None, **kwargs) -> list[float | None]:
    """The environment's summed step rewards of each episode (``episode["env_reward"]``)."""
    if episode is None:
        return [None] * len(completions)
    return [float(e["env_reward"]) if e is not None else None for e in episode]


def extra_rewards(cfg) -> list[tuple[str, Callable, float]]:
    """Reward functions the ``agent`` strategy adds to the task's: ``env_reward`` with weight
    ``env_reward_weight`` (none when it is 0)."""
    w = float(cfg.params.get("env_reward_weight", ENV_REWARD_WEIGHT.default))
    return [] if w == 0 or math.isnan(w) else [("env_reward", env_reward, w)]


agent.extra_rewards = extra_rewards
agent.eval_rollout = eval_rollout
agent.columns = (EPISODE_COLUMN, "episode_text")  # reward functions may take them
agent.max_prompt_length = AGENT_MAX_PROMPT_LENGTH  # this strategy's default (Config.build)
agent.first_prompts = first_prompts  # measured at start-up (train/checks.py)
agent.model_texts = tool_texts  # what a tokenizer built from the run's text must cover
