"""The agent rollout (grpolab/agents): parsing, the three user interfaces, safety, training, log-prob equality."""
import json
import time

import pytest
import torch

from grpolab.agents import adapters, parsing
from grpolab.agents import rollout as agent_rollout
from grpolab.agents.adapters import GymTextEnv, ToolLimits, ToolsEnv, TRLEnvironment, environment_factory
from grpolab.agents.base import EPISODE_COLUMN
from grpolab.agents.parsing import parse_tool_calls, tool_schema
from grpolab.batch import ENVIRONMENT, INJECTED, SAMPLED
from grpolab.config import Config
from grpolab.model.logprobs import completion_logprobs
from grpolab.train.trainer import Trainer

from _helpers import teacher_forced_turns


# ------------------------------------------------------------------ a user's own tools and environments
def add(a: int, b: int) -> int:
    """Add two integers.

    Args:
        a: the first integer
        b: the second integer
    """
    return a + b


def boom(x: int) -> int:
    """Always raises.

    Args:
        x: anything
    """
    raise RuntimeError("tool exploded")


def sleepy(seconds: float) -> str:
    """Sleeps.

    Args:
        seconds: how long
    """
    time.sleep(seconds)
    return "woke up"


def huge(n: int) -> str:
    """Returns n characters.

    Args:
        n: how many
    """
    return "x" * n


class CountdownGame:
    """A user's gym-style text environment: say a number; done when it equals the target (reward 1)."""

    def reset(self, seed=None, **row):
        self.target = 3
        self.moves = 0
        return "Say 3."

    def step(self, action):
        self.moves += 1
        done = action.strip().endswith("3")
        return ("right" if done else "again"), (1.0 if done else 0.0), done, {"moves": self.moves}

    def state_key(self):
        return f"moves={self.moves}"


class NeverEnding(CountdownGame):
    def step(self, action):
        return "go on", 0.0, False, {}


class RaisesOnStep(CountdownGame):
    def step(self, action):
        raise ValueError("environment broke")


class HangsOnStep(CountdownGame):
    def step(self, action):
        time.sleep(5)
        return "late", 0.0, False, {}


class HugeObservation(CountdownGame):
    def step(self, action):
        return "y" * 1_000_000, None, False, {}


class Calculator:
    """A user's TRL-style environment_factory class: reset(**row); public methods are the tools."""

    def reset(self, **row):
        self.calls = 0
        return None

    def multiply(self, a: int, b: int) -> int:
        """Multiply.

        Args:
            a: a
            b: b
        """
        self.calls += 1
        return a * b


# ------------------------------------------------------------------ parsing and schemas
def test_schema_from_hints_and_docstring_and_a_clear_error_without():
    s = tool_schema(add)
    assert s["function"]["name"] == "add" and s["function"]["parameters"]["required"] == ["a", "b"]
    assert s["function"]["parameters"]["properties"]["a"]["type"] == "integer"

    def nodoc(a: int) -> int:
        return a

    with pytest.raises(TypeError, match="nodoc.*docstring"):
        tool_schema(nodoc)


def test_parse_one_several_and_malformed_calls():
    one = parse_tool_calls('I will add. <tool_call>{"name": "add", "arguments": {"a": 1, "b": 2}}</tool_call>')
    assert [(c.name, c.arguments, c.error) for c in one] == [("add", {"a": 1, "b": 2}, None)]
    two = parse_tool_calls('<tool_call>\n{"name": "add", "arguments": {"a": 1, "b": 2}}\n</tool_call>'
                           '<tool_call>{"name": "huge", "arguments": "{\\"n\\": 3}"}</tool_call>')
    assert [(c.name, c.arguments) for c in two] == [("add", {"a": 1, "b": 2}), ("huge", {"n": 3})]
    bad = parse_tool_calls('<tool_call>{"name": "add", "arguments": {"a": 1,</tool_call> and text')
    assert len(bad) == 1 and bad[0].name == "add" and bad[0].arguments is None and "not valid JSON" in bad[0].error
    assert parse_tool_calls("no call here, Answer: 4") == []
    notobj = parse_tool_calls('<tool_call>[1, 2]</tool_call><tool_call>{"name": "add", "arguments": 5}</tool_call>')
    assert all(c.arguments is None and c.error for c in notobj)


def test_prompt_rendering_native_tools_template_and_the_hermes_system_message():
    class Tok:  # a chat template that reads `tools`
        chat_template = "{% if tools %}TOOLS{% endif %}{% for m in messages %}{{ m.content }}{% endfor %}"

        def apply_chat_template(self, msgs, tools=None, tokenize=False, add_generation_prompt=True):
            return ("T:" + json.dumps(tools) if tools else "") + "|".join(m["content"] for m in msgs) + "|A:"

    logs = []
    r = parsing.Renderer(Tok(), log=logs.append)
    assert r.native_tools
    text = r.prompt([{"role": "user", "content": "q"}], [tool_schema(add)])
    assert text.startswith("T:") and '"add"' in text and not logs

    class Plain(Tok):
        chat_template = "{% for m in messages %}{{ m.content }}{% endfor %}"

    r = parsing.Renderer(Plain(), log=logs.append)
    assert not r.native_tools
    text = r.prompt([{"role": "user", "content": "q"}], [tool_schema(add)])
    assert "<tools>" in text and '"name":"add"' in text and "<tool_call>" in text and text.endswith("q|A:")
    r.prompt([{"role": "user", "content": "q2"}], [tool_schema(add)])
    assert len(logs) == 1  # the documented rendering choice is logged once
    assert r.tool_message("add", "3")["content"] == "<tool_response>\n3\n</tool_response>"


# ------------------------------------------------------------------ adapters and safety
def test_tools_env_runs_calls_and_a_turn_without_a_call_is_final():
    env = ToolsEnv([add])
    r = env.step('<tool_call>{"name": "add", "arguments": {"a": 2, "b": 40}}</tool_call>')
    assert not r.done and r.observation == "42" and r.info["messages"][0] == {"role": "tool", "name": "add",
                                                                                "content": "42"}
    assert env.step("Answer: 42").done


def test_every_kind_of_bad_tool_call_is_an_error_observation_only():
    """raise, hang, huge output, bad arguments, invalid JSON, unknown tool: each an error text, the env goes on."""
    env = ToolsEnv([add, boom, sleepy, huge], ToolLimits(timeout=0.5, output_chars=100))
    t0 = time.perf_counter()
    r = env.step('<tool_call>{"name": "boom", "arguments": {"x": 1}}</tool_call>'
                 '<tool_call>{"name": "sleepy", "arguments": {"seconds": 3}}</tool_call>'
                 '<tool_call>{"name": "huge", "arguments": {"n": 5000000}}</tool_call>'
                 '<tool_call>{"name": "add", "arguments": {"a": 1, "c": 2}}</tool_call>'
                 '<tool_call>{"name": "add", "arguments": {"a": 1 "b": 2}}</tool_call>'
                 '<tool_call>{"name": "nope", "arguments": {}}</tool_call>'
                 '<tool_call>{"name": "add", "arguments": {"a": 1, "b": 2}}</tool_call>')
    assert time.perf_counter() - t0 < 2.5  # the hung tool was abandoned at its limit
    c = r.info["tool_calls"]
    assert "raised RuntimeError: tool exploded" in c[0].error and not c[0].timed_out
    assert c[1].timed_out and "timed out" in c[1].error
    assert c[2].error is None and len(c[2].output) < 200 and "output cut: 4999900 more characters" in c[2].output
    assert "bad arguments for add" in c[3].error
    assert c[4].arguments is None and "not valid JSON" in c[4].error
    assert "unknown tool 'nope'" in c[5].error
    assert c[6].output == "3" and c[6].error is None
    assert not r.done and all(m["content"].startswith("Error:") for m in r.info["messages"][:2])


def test_trl_environment_factory_one_instance_per_episode_methods_are_tools():
    f = environment_factory(environment=Calculator)
    e1, e2 = f({"prompt": "p"}), f({"prompt": "p"})
    assert isinstance(e1, TRLEnvironment) and e1.instance is not e2.instance
    assert [t.__name__ for t in e1.tools] == ["multiply"]
    e1.reset({"prompt": "p", "x": 1}, seed=0)
    e2.reset({"prompt": "p"}, seed=1)
    r = e1.step('<tool_call>{"name": "multiply", "arguments": {"a": 6, "b": 7}}</tool_call>')
    assert r.observation == "42" and e1.instance.calls == 1 and e2.instance.calls == 0


def test_gym_env_adapter_and_kind_detection():
    assert adapters.environment_kind(CountdownGame) == "gym" and adapters.environment_kind(Calculator) == "trl"
    env = environment_factory(environment=CountdownGame)({"prompt": "p"})
    assert isinstance(env, GymTextEnv) and env.reset({"prompt": "p"}, seed=1) == "Say 3."
    assert env.state_key() == "moves=0"
    r = env.step("2")
    assert (r.observation, r.reward, r.done, r.info) == ("again", 0.0, False, {"moves": 1})
    assert env.step("3").done


# ------------------------------------------------------------------ the rollout with a scripted policy
def answer_is_3(completions, **kw):
    """The data's reward: the final answer ends with 3."""
    return [float(str(c).strip().endswith("3")) for c in completions]


def _trainer(tmp_path, tiny_args, extra, name="run", data=False):
    """A tiny-model trainer; ``data``: on rows whose text holds every character of the scripted tool calls
    (the tiny tokenizer is built from the data's characters)."""
    args = {**tiny_args, "out": str(tmp_path / name), "steps": 2, "prompts_per_step": 2, "num_generations": 2,
            **extra}
    if data:
        path = tmp_path / f"{name}.jsonl"
        path.write_text("".join(json.dumps({"prompt": f"add 1 and {i}", "note": ROW_TEXT}) + "\n"
                                for i in range(8)))
        args.update({"data": str(path), "reward": ["test_agent_core:answer_is_3"]})
        args.pop("task", None)
    return Trainer(Config.build(args), log=lambda *a: None)


def scripted(texts_by_turn):
    """A tokenizer-free 'policy': turn k of every episode is texts_by_turn[k]; its tokens get the policy's
    teacher-forced log-probs (so the batch is what a sampler drawing these tokens would produce)."""
    turn = {"k": 0}

    def sample(ctx, contexts, max_new_tokens, temperatures, stop_strings, model=None):
        text = texts_by_turn[min(turn["k"], len(texts_by_turn) - 1)]
        turn["k"] += 1
        turns = [ctx.tokenizer(text, add_special_tokens=False)["input_ids"][:m] for m in max_new_tokens]
        return teacher_forced_turns(ctx, contexts, turns, temperatures)
    return sample


ROW_TEXT = '<tool_call>{"name": "add", "arguments": {"a": 1, "b": 2}}</tool_call> Answer: 3 ()[],.:-_0123456789'


def test_rollout_plays_tool_episodes_spans_origins_and_records(tmp_path, tiny_args, monkeypatch):
    tr = _trainer(tmp_path, tiny_args, {"rollout_strategy": "agent", "tools": ["test_agent_core:add"],
                                        "max_turns": 3, "max_episode_tokens": 400, "max_turn_tokens": 80},
                  data=True)
    monkeypatch.setattr(agent_rollout, "sample_turns", scripted([
        '<tool_call>{"name": "add", "arguments": {"a": 1, "b": 2}}</tool_call>', "3"]))
    tr.ctx.new_step()
    rows = tr.rows[:2]
    batch = tr.strategy(ctx=tr.ctx, rows=rows, uids=[0, 1], group_offset=0, budgets=None, temperatures=None)
    assert batch.num_rows == 4 and batch.group_ids.tolist() == [0, 0, 1, 1]
    for i, ep in enumerate(batch.columns[EPISODE_COLUMN]):
        assert ep["ended_by"] == "done" and ep["num_turns"] == 2
        t1, t2 = ep["turns"]
        assert t1["tool_calls"][0]["name"] == "add" and t1["tool_calls"][0]["output"] == "3"
        assert (t1["span"], t1["obs_span"], t2["span"]) == (1, 2, 3) and t2["observation"] is None
        assert t2["done"]
        spans = batch.span_ids[i][batch.completion_attention_mask[i] > 0].tolist()
        origins = batch.token_origin[i][batch.completion_attention_mask[i] > 0].tolist()
        assert sorted(set(spans)) == [1, 2, 3]
        assert all((o == ENVIRONMENT) == (s == 2) for s, o in zip(spans, origins))
        assert all((o == SAMPLED) == (m > 0) for o, m in zip(origins, batch.completion_mask[i][:len(origins)]))
        assert batch.columns["completion"][i] == "3"
        assert "<tool_call>" in batch.columns["episode_text"][i]
    assert batch.rewards is not None and "env_reward" in batch.reward_names
    m = tr.ctx.metrics
    assert m["agent/turns_per_episode"] == 2 and m["agent/tool_calls_per_episode"] == 1
    assert m["agent/tool_calls/add"] == 1 and m["agent/ended_by_done"] == 1


def test_bad_environments_end_their_episode_only(tmp_path, tiny_args):
    """An environment that never ends stops at max_turns / max_episode_tokens; one that raises or hangs in
    step ends that episode with ended_by 'error'; the others of the batch go on."""
    tr = _trainer(tmp_path, tiny_args, {"max_completion_length": 4})
    s = agent_rollout.settings_of(tr.cfg, max_turns=3, max_episode_tokens=200, max_turn_tokens=4,
                                  tool_timeout=0.5, tool_output_chars=50, max_tool_calls=4, tool_isolation="thread")
    kinds = {0: NeverEnding, 1: RaisesOnStep, 2: HangsOnStep, 3: CountdownGame, 4: HugeObservation}
    made = iter(range(5))

    def factory(row):
        return GymTextEnv(kinds[next(made)])
    tr.ctx.new_step()
    t0 = time.perf_counter()
    batch = agent_rollout.run_episodes(tr.ctx, tr.rows[:1], [0], 0, [5], None, factory, s)
    assert time.perf_counter() - t0 < 30
    eps = batch.columns[EPISODE_COLUMN]
    assert eps[0]["ended_by"] == "max_turns" and eps[0]["num_turns"] == 3
    assert eps[1]["ended_by"] == "error" and "environment broke" in eps[1]["info"]["error"]
    assert eps[1]["tool_errors"] == 1
    assert eps[2]["ended_by"] == "error" and eps[2]["tool_timeouts"] == 1
    assert eps[3]["ended_by"] in ("done", "max_turns") and eps[3]["turns"][0]["state"] == "moves=0"
    obs = eps[4]["turns"][0]["observation"]  # a megabyte observation is cut to tool_output_chars
    assert obs.count("y") == 50 and "output cut: 999950 more characters" in obs
    # a tight token budget ends a never-ending environment too
    made = iter([0] * 2)
    s.max_episode_tokens, s.max_turns = 9, 50
    b2 = agent_rollout.run_episodes(tr.ctx, tr.rows[:1], [0], 0, [2], None, factory, s)
    assert all(e["ended_by"] == "token_budget" for e in b2.columns[EPISODE_COLUMN])
    assert b2.completion_attention_mask.sum(-1).max() <= 9


def test_reset_that_raises_ends_the_episode_with_error(tmp_path, tiny_args):
    class BadReset(CountdownGame):
        def reset(self, seed=None, **row):
            raise KeyError("no such level")
    tr = _trainer(tmp_path, tiny_args, {})
    s = agent_rollout.settings_of(tr.cfg, max_turns=2, max_episode_tokens=100, max_turn_tokens=4,
                                  tool_timeout=1.0, tool_output_chars=50, max_tool_calls=4, tool_isolation="thread")
    tr.ctx.new_step()
    b = agent_rollout.run_episodes(tr.ctx, tr.rows[:1], [0], 0, [2], None, lambda row: GymTextEnv(BadReset), s)
    assert all(e["ended_by"] == "error" and e["num_turns"] == 0 for e in b.columns[EPISODE_COLUMN])


# ------------------------------------------------------------------ training with no glue code
def _metrics(tmp_path, name):
    return [json.loads(line) for line in (tmp_path / name / "metrics.jsonl").read_text().splitlines()]


def test_a_users_tool_function_trains(tmp_path, tiny_args):
    tr = _trainer(tmp_path, tiny_args, {"rollout_strategy": "agent", "tools": ["test_agent_core:add"],
                                        "max_turns": 2, "max_episode_tokens": 24, "eval_after": True,
                                        "eval_problems": 3}, "tools")
    calls = []
    orig = agent_rollout.eval_rollout
    tr.strategy.fn.eval_rollout = lambda *a, **k: calls.append(a[3]) or orig(*a, **k)
    try:
        summary = tr.train(progress=False)
    finally:
        tr.strategy.fn.eval_rollout = orig
    assert calls == [[0, 1, 2]]  # held-out evaluation plays greedy episodes, one per row
    assert summary["after"]["n"] == 3 and "rewards/env_reward/mean" in summary["after"]
    m = _metrics(tmp_path, "tools")
    assert len(m) == 2 and m[-1]["rollout/agent/tool_calls/add"] == 0  # every tool is logged, called or not
    for key in ("rollout/agent/turns_per_episode", "rollout/agent/tool_calls_per_episode", "rollout/agent/tool_errors",
                "rollout/agent/tool_timeouts", "rollout/agent/env_reward_mean", "rollout/agent/final_reward_mean",
                "rollout/agent/ended_by_max_turns", "rollout/agent/ended_by_token_budget"):
        assert key in m[-1], key


def test_a_users_gym_environment_trains_from_the_cli(tmp_path, tiny_args):
    from grpolab.cli import main
    argv = ["train", "--model", "tiny", "--task", "repeat", "--steps", "2", "--prompts_per_step", "2",
            "--num_generations", "2", "--max_completion_length", "4", "--out", str(tmp_path / "gym"),
            "--env", "test_agent_core:CountdownGame", "--max_turns", "2", "--eval_before", "false",
            "--eval_after", "false", "--tensorboard", "false", "--quiet"]
    assert main(argv) == 0
    m = _metrics(tmp_path, "gym")
    assert len(m) == 2 and m[-1]["rollout/agent/turns_per_episode"] >= 1
    assert "rewards/env_reward/mean" in m[-1]


def test_a_trl_environment_factory_trains_through_the_api(tmp_path):
    from grpolab import GRPOConfig, GRPOTrainer
    rows = [{"prompt": f"multiply {i} by 2", "answer": str(2 * i)} for i in range(6)]

    seen = []

    def correct(completions, answer, episode, **kw):  # a user reward may read the episode records
        seen.extend(e["ended_by"] for e in episode)
        return [float(c.strip().endswith(a)) for c, a in zip(completions, answer)]
    args = GRPOConfig(output_dir=str(tmp_path / "api"), per_device_train_batch_size=4, num_generations=2,
                      max_completion_length=4, max_steps=2, report_to="none", max_turns=2)
    t = GRPOTrainer(model="tiny", reward_funcs=[correct], args=args, train_dataset=rows,
                    environment_factory=Calculator)
    assert t.cfg.rollout_strategy == "agent"
    out = t.train()
    assert out.global_step == 2 and len(seen) == 8 and set(seen) <= {"done", "max_turns", "token_budget",
                                                                        "no_action"}
    assert "rollout/agent/turns_per_episode" in _metrics(tmp_path, "api")[-1]


def test_tools_with_another_strategy_is_an_error_naming_the_fix():
    from grpolab.errors import ConfigError
    with pytest.raises(ConfigError, match="rollout_strategy: agent"):
        agent_rollout.strategy_for_agents("plain", ["tools"])
    assert agent_rollout.strategy_for_agents(None, ["environment"]) == "agent"
    assert agent_rollout.strategy_for_agents("agent", ["tools"]) is None


def test_no_environment_is_an_error_naming_both_options(tmp_path, tiny_args):
    from grpolab.errors import ConfigError
    tr = _trainer(tmp_path, tiny_args, {"rollout_strategy": "agent"})
    tr.ctx.new_step()
    with pytest.raises(ConfigError, match="--tools.*--env"):
        tr.rollout()


def test_scripted_tool_policy_trains_two_steps(tmp_path, tiny_args, monkeypatch):
    monkeypatch.setattr(agent_rollout, "sample_turns", scripted([
        '<tool_call>{"name": "add", "arguments": {"a": 1, "b": 2}}</tool_call>',
        '<tool_call>{"name": "add", "arguments": {"a": 1 "b": 2}}</tool_call>', "3"]))
    tr = _trainer(tmp_path, tiny_args, {"rollout_strategy": "agent", "tools": ["test_agent_core:add"],
                                        "max_turns": 3, "max_episode_tokens": 400, "max_turn_tokens": 80},
                  "scripted", data=True)
    tr.train(progress=False)
    m = _metrics(tmp_path, "scripted")
    assert m[0]["rollout/agent/tool_calls/add"] == 2 and m[0]["rollout/agent/tool_errors"] == 4  # 1 malformed each
    assert all(x["loss"] is not None for x in m)


def test_tool_output_tokens_are_environment_tokens_not_injected(tmp_path, tiny_args, monkeypatch):
    """A tool call's output is ENVIRONMENT (never INJECTED) in the batch, and the step's metrics count it as
    ``frac_environment_tokens``; ``frac_injected_tokens`` (hints, references) is absent from an agent run."""
    monkeypatch.setattr(agent_rollout, "sample_turns", scripted([
        '<tool_call>{"name": "add", "arguments": {"a": 1, "b": 2}}</tool_call>', "3"]))
    tr = _trainer(tmp_path, tiny_args, {"rollout_strategy": "agent", "tools": ["test_agent_core:add"],
                                        "max_turns": 3, "max_episode_tokens": 400, "max_turn_tokens": 80,
                                        "steps": 1}, "env_tokens", data=True)
    tr.ctx.new_step()
    batch = tr.strategy(ctx=tr.ctx, rows=tr.rows[:2], uids=[0, 1], group_offset=0, budgets=None, temperatures=None)
    present = batch.completion_attention_mask > 0
    assert not bool((batch.token_origin[present] == INJECTED).any())
    for i, ep in enumerate(batch.columns[EPISODE_COLUMN]):
        obs = present[i] & (batch.span_ids[i] == ep["turns"][0]["obs_span"])
        assert obs.any() and bool((batch.token_origin[i][obs] == ENVIRONMENT).all())
    monkeypatch.setattr(agent_rollout, "sample_turns", scripted([  # the same episodes again, in a training step
        '<tool_call>{"name": "add", "arguments": {"a": 1, "b": 2}}</tool_call>', "3"]))
    tr.train(progress=False)
    m = _metrics(tmp_path, "env_tokens")[0]
    assert "frac_injected_tokens" not in m
    assert 0 < m["frac_environment_tokens"] < 1


# ------------------------------------------------------------------ log-prob equality
@pytest.mark.parametrize("shared_prefix", [False, True])
def test_training_forward_over_episodes_gives_the_samplers_logprobs(tmp_path, tiny_args, shared_prefix):
    """Sampled multi-turn episodes (observations in the sequence): the training forward's log-probs on model
    tokens equal the behaviour log-probs recorded while sampling (mean |diff| reported)."""
    tr = _trainer(tmp_path, tiny_args, {"max_completion_length": 5, "temperature": 0.7})
    tr.model.eval()
    s = agent_rollout.settings_of(tr.cfg, max_turns=3, max_episode_tokens=60, max_turn_tokens=5,
                                  tool_timeout=5.0, tool_output_chars=50, max_tool_calls=4, tool_isolation="thread")
    tr.ctx.new_step()
    batch = agent_rollout.run_episodes(tr.ctx, tr.rows[:3], [0, 1, 2], 0, [2, 2, 2], None,
                                       lambda row: GymTextEnv(NeverEnding), s)
    assert (batch.token_origin == ENVIRONMENT).any() and batch.span_ids.max() >= 3
    forced, _ = completion_logprobs(tr.model, batch, 0.7, shared_prefix=shared_prefix)
    model_tok = (batch.token_origin == SAMPLED) & (batch.completion_attention_mask > 0)
    diff = (forced - batch.behavior_logprobs).abs()[model_tok]
    print(f"agent episodes, shared_prefix={shared_prefix}: mean |diff| {diff.mean():.2e}, max {diff.max():.2e} "
          f"over {int(model_tok.sum())} model tokens")
    assert diff.max() < 1e-4, diff.max()
    assert (batch.behavior_logprobs[batch.token_origin == ENVIRONMENT] == 0).all()
    assert (batch.completion_mask[batch.token_origin == ENVIRONMENT] == 0).all()


def test_agent_rollout_through_the_vllm_stand_in_engine(tmp_path, tiny_args, monkeypatch):
    """With generation_engine: vllm the turns are the engine's (one continue_ call per turn, stop string
    </tool_call>); model tokens get the trainer's behaviour log-probs and the truncated importance weight,
    observations stay ENVIRONMENT with weight 1."""
    import sys

    from grpolab.model.loading import save_policy
    from test_vllm_engine import SHIFT, fake_vllm_module

    monkeypatch.setitem(sys.modules, "vllm", fake_vllm_module())
    init = _trainer(tmp_path, tiny_args, {}, "init")
    save_policy(init.model, init.tok, tmp_path / "model")
    tr = _trainer(tmp_path, tiny_args, {"model": str(tmp_path / "model"), "generation_engine": "vllm",
                                        "vllm_is_cap": 2.0, "max_completion_length": 4,
                                        "rollout_strategy": "agent", "environment": "test_agent_core:NeverEnding",
                                        "max_turns": 2, "max_episode_tokens": 60}, "engine")
    tr.model.eval()
    calls = []
    orig = tr.engine.continue_
    monkeypatch.setattr(tr.engine, "continue_", lambda *a, **k: calls.append(k) or orig(*a, **k))
    tr.ctx.new_step()
    b = tr.strategy(ctx=tr.ctx, rows=tr.rows[:2], uids=[0, 1], group_offset=0, budgets=None, temperatures=None)
    assert len(calls) == 2 and all(c["stop"] == ["</tool_call>"] for c in calls)
    model_tok = (b.token_origin == SAMPLED) & (b.completion_attention_mask > 0)
    assert (b.token_origin == ENVIRONMENT).any() and model_tok.any()
    own = tr.ctx.logprobs(b)
    assert torch.allclose(b.behavior_logprobs, own * (b.token_origin != ENVIRONMENT), atol=1e-5)
    w = b.token_weights
    assert torch.allclose(w[model_tok], torch.full_like(w[model_tok], float(torch.exp(torch.tensor(SHIFT)))),
                          atol=1e-4)
    assert (w[b.token_origin == ENVIRONMENT] == 1).all()


def test_a_tasks_own_environment_is_used_and_a_users_wins(tmp_path, tiny_args, monkeypatch):
    """Task(extra={"environment": factory}) drives the agent rollout (and is no eval reward); --env wins."""
    import grpolab.train.trainer as trainer_mod
    from grpolab.tasks import get_task
    made = []

    def factory(row):
        made.append(row["prompt"])
        return GymTextEnv(CountdownGame)

    def task_with_env(name, cfg=None):
        t = get_task(name, cfg=cfg)
        t.extra = {**t.extra, "environment": factory}
        return t
    monkeypatch.setattr(trainer_mod, "get_task", task_with_env)
    tr = _trainer(tmp_path, tiny_args, {"rollout_strategy": "agent", "max_turns": 1}, "task")
    assert "environment" not in tr.eval_extra and tr.ctx.environment is factory
    assert len(made) == 1  # one environment made at start-up: its tools are in the prompt-length check
    made.clear()
    tr.ctx.new_step()
    b = tr.rollout()
    assert len(made) == b.num_rows == 4
    tr2 = _trainer(tmp_path, tiny_args, {"rollout_strategy": "agent", "max_turns": 1,
                                         "environment": "test_agent_core:NeverEnding"}, "task2")
    tr2.ctx.new_step()
    made.clear()
    b = tr2.rollout()
    assert not made and all(e["ended_by"] == "max_turns" for e in b.columns[EPISODE_COLUMN])


def test_sandbox_isolation_runs_pure_tools_in_a_limited_child(tmp_path, monkeypatch):
    """tool_isolation: sandbox: a module-level tool runs in a fresh grpolab.sandbox child; a hung one is killed
    at tool_timeout (timed_out), a raising one is an error, the result is cut like any tool output."""
    from grpolab.sandbox import Limits, Sandbox
    (tmp_path / "sbtools.py").write_text(
        "import os, time\n\n"
        "def pid(n: int) -> str:\n    \"\"\"Process id.\n\n    Args:\n        n: repeat\n    \"\"\"\n"
        "    return str(os.getpid()) * n\n\n"
        "def hang(s: float) -> str:\n    \"\"\"Hang.\n\n    Args:\n        s: seconds\n    \"\"\"\n"
        "    time.sleep(s)\n    return 'late'\n\n"
        "def fail(x: int) -> int:\n    \"\"\"Fail.\n\n    Args:\n        x: x\n    \"\"\"\n"
        "    raise ValueError('no')\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    import sbtools
    box = Sandbox(limits=Limits(cpu_s=2, wall_s=2))
    try:
        env = ToolsEnv([sbtools.pid, sbtools.hang, sbtools.fail],
                       ToolLimits(timeout=2, output_chars=30, isolation="sandbox", sandbox=box))
        r = env.step('<tool_call>{"name": "pid", "arguments": {"n": 40}}</tool_call>'
                     '<tool_call>{"name": "hang", "arguments": {"s": 30}}</tool_call>'
                     '<tool_call>{"name": "fail", "arguments": {"x": 1}}</tool_call>')
    finally:
        box.close()
    c = r.info["tool_calls"]
    import os
    assert c[0].error is None and not c[0].output.startswith(str(os.getpid())) and "output cut" in c[0].output
    assert c[1].timed_out and "timed out" in c[1].error
    assert c[2].error and "ValueError" in c[2].error and not c[2].timed_out


def test_cli_tools_flag_selects_the_agent_strategy(capsys):
    from grpolab.cli import main
    assert main(["config", "rollout_strategy", "--tools", "test_agent_core:add"]) == 0
    assert "agent" in capsys.readouterr().out
    assert main(["config", "rollout_strategy", "--tools", "test_agent_core:add", "--rollout_strategy", "motif"]) == 2
    assert "set rollout_strategy: agent" in capsys.readouterr().err


def test_tool_names_the_model_makes_up_share_one_metric_key():
    """Metric keys come from the run's tools, never from model output (a made-up name would add a key per step)."""
    class Ctx:
        def __init__(self):
            self.metrics = {}

        def metric(self, k, v):
            self.metrics[k] = v
    calls = [{"name": "search"}, {"name": "Brenn"}, {"name": "2022-02-07"}, {"name": None}]
    records = [{"num_turns": 2, "turns": [{"tool_calls": calls[:2]}, {"tool_calls": calls[2:]}],
                "info": {"tools": ["search", "lookup"]}, "tool_errors": 3, "tool_timeouts": 0, "env_reward": 0.0,
                "ended_by": "done"},
               {"num_turns": 1, "turns": [{"tool_calls": []}], "info": {"tools": ["search", "lookup"]},
                "tool_errors": 0, "tool_timeouts": 0, "env_reward": 0.0, "ended_by": "done"}]
    ctx = Ctx()
    agent_rollout.log_metrics(ctx, records, None)
    keys = sorted(k for k in ctx.metrics if k.startswith("agent/tool_calls/"))
    assert keys == ["agent/tool_calls/<unknown>", "agent/tool_calls/<unparsed>", "agent/tool_calls/lookup",
                    "agent/tool_calls/search"]
    assert ctx.metrics["agent/tool_calls/<unknown>"] == 1.0 and ctx.metrics["agent/tool_calls/search"] == 0.5
    assert ctx.metrics["agent/tool_calls/lookup"] == 0 and ctx.metrics["agent/tool_calls_per_episode"] == 2
