"""LM programs (issue 26): the ``lm_program`` rollout, mmGRPO's grouping (000-23) and AgentFlow's modules (000-79).

Expected values are worked out by hand from dspy's GRPO.compile (stanfordnlp/dspy dspy/teleprompt/grpo.py) and
AgentFlow's per-turn samples grouped by query, never read back from grpolab."""
import json

import pytest
import torch

from grpolab.agents.programs import FormatFailure, expression_in
from grpolab.batch import SAMPLED
from grpolab.catalog import parse_provenance
from grpolab.config import Config, ConfigError
from grpolab.generation.turns import Continuation
from grpolab.recipes import recipe_overrides
from grpolab.registry import REWARD_TRANSFORMS, ROLLOUT_STRATEGIES
from grpolab.rollouts import lm_program as lp
from grpolab.rollouts.lm_program import invocation_groups
from grpolab.train.trainer import Trainer

from _helpers import own_data_args, scripted_strategy_step

EPS = 1e-4


def test_invocation_groups_by_hand():
    # three runs of one input call module p 3, 1 and 2 times
    runs = [["a1", "a2", "a3"], ["b1"], ["c1", "c2"]]
    # truncate (dspy's default): cut to the smallest count, 1: one group; 2 + 0 + 1 = 3 calls left out
    assert invocation_groups(runs) == ([["a1", "b1", "c1"]], 3)
    # fill, strategy max (dspy: a run's last invocation): b -> b1 b1 b1, c -> c1 c2 c2; 3 groups of 3
    assert invocation_groups(runs, variable_calls="fill", fill="max") == (
        [["a1", "b1", "c1"], ["a2", "b1", "c2"], ["a3", "b1", "c2"]], 0)
    # fill, randint: every filled member is one of its own run's calls
    gen = torch.Generator().manual_seed(0)
    groups, out = invocation_groups(runs, variable_calls="fill", fill="randint", generator=gen)
    assert out == 0 and len(groups) == 3 and all(len(g) == 3 for g in groups)
    assert [g[1] for g in groups] == ["b1"] * 3 and all(g[2] in ("c1", "c2") for g in groups) and groups[1][2] == "c2"
    # ragged: group k holds the runs that made a k-th call: (a1 b1 c1), (a2 c2), (a3)
    assert invocation_groups(runs, variable_calls="ragged") == ([["a1", "b1", "c1"], ["a2", "c2"], ["a3"]], 0)
    # dspy pads a group shorter than G by repeating group[:missing]: (a2 c2) -> (a2 c2 a2); (a3) -> (a3 a3 a3)
    assert invocation_groups(runs, variable_calls="ragged", pad_to=3)[0] == [
        ["a1", "b1", "c1"], ["a2", "c2", "a2"], ["a3", "a3", "a3"]]
    # pad to 5: (a2 c2) -> (a2 c2) + (a2 c2) -> + (a2): five members
    assert invocation_groups([["a1", "a2"], ["c1", "c2"]], variable_calls="ragged", pad_to=5)[0][1] == [
        "a2", "c2", "a2", "c2", "a2"]
    # a run that never called p: no group for this input in any mode (dspy skips the example), both calls out
    for mode in ("truncate", "fill", "ragged"):
        assert invocation_groups([["a1", "a2"], []], variable_calls=mode) == ([], 2)
    with pytest.raises(ValueError, match="valid values: truncate, fill, ragged"):
        invocation_groups(runs, variable_calls="cut")


# ----------------------------------------------------------------------------- a scripted program on user data


def looping(lm, row):
    """plan until a reply says go (at most 3 calls), then solve with the plan; 'boom' crashes, 'bad' is a format
    failure."""
    for k in range(3):
        t = lm("plan", row["prompt"])
        if "go" in t:
            break
    if "boom" in t:
        raise RuntimeError("the tool crashed")
    if "bad" in t:
        raise FormatFailure("no plan in the reply")
    return lm("solve", f"{row['prompt']} plan {t}")


def scripted(batches):
    """Replies by batch: batch k answers its waiting calls (in run order) with ``batches[k]``."""
    def sample(ctx, contexts, budgets, temperatures, model=None):
        k = len(sample.calls)
        sample.calls.append([ctx.tokenizer.decode(c) for c in contexts])
        assert len(contexts) == len(batches[k]), (k, sample.calls[-1])
        ids = [ctx.tokenizer(t, add_special_tokens=False)["input_ids"][:b] for t, b in zip(batches[k], budgets)]
        return Continuation(ids, [[-1.0] * len(a) for a in ids], ["stop_string"] * len(ids))
    sample.calls = []
    return sample


def hit(completions, answer, **kw):
    return [1.0 if a in c else 0.0 for c, a in zip(completions, answer)]


def user_rows(tmp_path):
    tmp_path.mkdir(parents=True, exist_ok=True)
    path = tmp_path / "programs.jsonl"
    path.write_text("".join(json.dumps({"prompt": f"q{i}:", "answer": "yes", "note": "go boom bad yes no plan x"})
                            + "\n" for i in range(4)))
    return str(path)


def program_step(tmp_path, tiny_args, monkeypatch, batches, **extra):
    args = {**own_data_args(tiny_args, user_rows(tmp_path)),
            "reward": ["test_lm_program:hit"], "rollout_strategy": "lm_program", "program": "test_lm_program:looping",
            "reward_transforms": ["lm_program_failures"], "prompts_per_step": 2, "num_generations": 2,
            "max_completion_length": 10, "advantage": "group_mean", "out": str(tmp_path / "run"), **extra}
    fake = scripted(batches)
    tr, b = scripted_strategy_step(args, monkeypatch, lp, "sample_calls", fake)
    return tr, b, fake


# runs 0, 1 (prompt q0) and 2, 3 (prompt q1). Batch 0: every run's first plan call; run 0 says x (plans again),
# the others go. Batch 1: run 0's second plan (go) and the solves of runs 1-3. Batch 2: run 0's solve.
VARIABLE = [["x", "go", "go", "go"], ["go", "no", "no", "yes"], ["yes"]]


def test_calls_are_rows_grouped_by_invocation_with_the_program_reward(tmp_path, tiny_args, monkeypatch):
    tr, b, fake = program_step(tmp_path, tiny_args, monkeypatch, VARIABLE)
    # the waiting calls of all live runs are sampled together: 4, 4, then 1
    assert [len(c) for c in fake.calls] == [4, 4, 1]
    # rewards: run 0 answers yes (1), run 1 no (0), run 2 no (0), run 3 yes (1)
    # truncate: prompt q0's plan calls are 2 (run 0) and 1 (run 1): one plan group (first calls), run 0's second
    # plan call left out; rows by input, then module in order of first call, then invocation
    assert b.columns["module"] == ["plan", "plan", "solve", "solve"] * 2
    assert b.rewards[:, 0].tolist() == [1, 0, 1, 0, 0, 1, 0, 1]  # every call gets its run's program reward
    g = b.group_ids.tolist()
    assert g[0] == g[1] and g[2] == g[3] and g[4] == g[5] and g[6] == g[7] and len(set(g)) == 4
    assert b.prompt_uids.tolist() == [0, 0, 0, 0, 1, 1, 1, 1]
    assert b.columns["lm_program_call"] == [0] * 8 and b.columns["lm_program_answer"][:2] == ["yes", "no"]
    # a row is the call: its prompt, its sampled tokens (SAMPLED) with their behaviour log-probs (-1 scripted)
    tok = tr.ctx.tokenizer
    assert tok.decode(b.prompt_ids[2][b.prompt_mask[2].bool()]) == "q0: plan go"  # run 0's solve prompt
    assert b.columns["completion"][:4] == ["x", "go", "yes", "no"]
    for i in range(8):
        n = int(b.completion_attention_mask[i].sum())
        assert (b.token_origin[i, :n] == SAMPLED).all() and (b.behavior_logprobs[i, :n] == -1.0).all()
    # group_mean: R - mean of each 2-member group: (1, 0) -> +-.5, (0, 1) -> -+.5
    adv = tr.compute_advantages(b)
    assert [float(adv[i, 0]) for i in range(8)] == pytest.approx([.5, -.5, .5, -.5, -.5, .5, -.5, .5])
    m = tr.ctx.metrics
    # calls per run: plan 5 / 4 runs, solve 4 / 4; 1 call left out; the runs' mean reward 2 / 4
    assert m["lm_program/plan/calls"] == 1.25 and m["lm_program/solve/calls"] == 1.0
    assert m["lm_program/calls_left_out"] == 1 and m["lm_program/reward"] == 0.5


def test_fill_ragged_by_input_and_frozen_modules(tmp_path, tiny_args, monkeypatch):
    # fill (max): run 1's plan calls (1) filled to 2 with its last: plan groups (r0p0, r1p0), (r0p1, r1p0)
    _, b, _ = program_step(tmp_path / "f", tiny_args, monkeypatch, VARIABLE, lm_program_variable_calls="fill")
    assert b.columns["module"][:6] == ["plan", "plan", "plan", "plan", "solve", "solve"] and len(b.columns["module"]) == 10
    assert b.columns["completion"][:4] == ["x", "go", "go", "go"] and b.columns["lm_program_call"][:4] == [0, 0, 1, 0]
    # ragged without padding: (r0p0, r1p0), (r0p1) alone: 9 rows; with dspy's padding (r0p1, r0p1): 10 rows
    _, b, _ = program_step(tmp_path / "r", tiny_args, monkeypatch, VARIABLE, lm_program_variable_calls="ragged",
                           lm_program_pad_groups=False)
    assert len(b.columns["module"]) == 9 and b.group_ids.tolist()[2] not in b.group_ids.tolist()[:2]
    _, b, _ = program_step(tmp_path / "rp", tiny_args, monkeypatch, VARIABLE, lm_program_variable_calls="ragged")
    assert len(b.columns["module"]) == 10 and b.columns["completion"][2:4] == ["go", "go"]
    # by_input: all plan calls of q0 (run 0's two, run 1's one) in one group
    _, b, _ = program_step(tmp_path / "i", tiny_args, monkeypatch, VARIABLE, lm_program_grouping="by_input")
    assert b.columns["module"][:3] == ["plan"] * 3 and len(set(b.group_ids.tolist()[:3])) == 1
    assert b.rewards[:3, 0].tolist() == [1, 1, 0] and len(b.columns["module"]) == 9
    # a frozen module plays, then its calls leave the batch
    tr, b, _ = program_step(tmp_path / "z", tiny_args, monkeypatch, VARIABLE,
                            lm_program_modules=["plan", {"name": "solve", "trainable": False}])
    assert b.columns["module"] == ["plan"] * 4 and tr.ctx.metrics["lm_program/frozen_calls"] == 4


# batch 0: run 3 says "go boom" (or "go bad") and raises after its one plan call; batch 1: the others' solves
def failing(word):
    return [["go", "go", "go", f"go {word}"], ["yes", "no", "yes"]]


def test_interrupted_and_format_failed_runs(tmp_path, tiny_args, monkeypatch):
    # drop (dspy's GRPO loses a crashed run): run 3 leaves; q1's groups (run 2 alone) are padded to G = 2
    tr, b, _ = program_step(tmp_path / "d", tiny_args, monkeypatch, failing("boom"))
    assert b.columns["module"] == ["plan", "plan", "solve", "solve"] * 2 and b.prompt_uids.tolist()[4:] == [1] * 4
    assert b.columns["completion"][4:] == ["go", "go", "yes", "yes"]  # run 2's calls, each twice
    assert tr.ctx.metrics["lm_program/dropped_runs"] == 1 and tr.ctx.metrics["lm_program/failed_runs"] == 1
    # score: run 3's plan call stays with lm_program_failure_score; run 3 made no solve call, so q1's solve module
    # has no group (dspy's skip) and run 2's solve is left out
    tr, b, _ = program_step(tmp_path / "s", tiny_args, monkeypatch, failing("boom"), lm_program_on_error="score",
                            lm_program_failure_score=0.25)
    assert b.columns["module"] == ["plan", "plan", "solve", "solve", "plan", "plan"]
    assert b.scalar_rewards.tolist() == [1, 0, 1, 0, 1, 0.25] and tr.ctx.metrics["lm_program/calls_left_out"] == 1
    # a FormatFailure keeps the run's calls with lm_program_format_failure_score (-1), in either on_error mode
    tr, b, _ = program_step(tmp_path / "x", tiny_args, monkeypatch, failing("bad"))
    assert b.scalar_rewards.tolist() == [1, 0, 1, 0, 1, -1] and tr.ctx.metrics["lm_program/format_failures"] == 1
    # the transform alone: NaN keeps the reward, a number replaces it
    fn = REWARD_TRANSFORMS.get("lm_program_failures")
    fake = type("B", (), {"row_data": {"lm_program_failure": torch.tensor([float("nan"), -1.0, 0.0])}})()
    assert fn(torch.tensor([0.5, 1.0, 1.0]), batch=fake).tolist() == [0.5, -1.0, 0.0]


def test_config_errors_name_the_field(tmp_path, tiny_args, monkeypatch):
    base = {"rollout_strategy": "lm_program", "reward_transforms": ["lm_program_failures"]}
    with pytest.raises(ConfigError, match="lm_program_grouping: 'by_module' is not valid; valid values: by_invocation"):
        Config.build({**base, "lm_program_grouping": "by_module"})
    with pytest.raises(ConfigError, match="must be greater than lm_program_format_failure_score"):
        Config.build({**base, "lm_program_failure_score": -2})
    with pytest.raises(ConfigError, match="lm_program_on_error: score gives failed runs a fixed reward.*must end"):
        Config.build({"rollout_strategy": "lm_program", "lm_program_on_error": "score"})
    Config.build({"rollout_strategy": "lm_program"})  # the defaults (drop) build without the transform
    # ... but a FormatFailure then stops the run, naming the fix
    with pytest.raises(ConfigError, match="raised FormatFailure gives failed runs a fixed reward"):
        program_step(tmp_path / "t", tiny_args, monkeypatch, failing("bad"), reward_transforms=[])
    with pytest.raises(ConfigError, match="neither a built-in program"):
        Config.build({**base, "program": "nothing"})
    with pytest.raises(ConfigError, match="every module has trainable: false"):
        Config.build({**base, "lm_program_modules": [{"name": "a", "trainable": False}]})
    # a module the list does not name stops the run (a program's own except cannot hide it)
    with pytest.raises(ConfigError, match="module 'solve', which lm_program_modules does not list"):
        program_step(tmp_path, tiny_args, monkeypatch, VARIABLE, lm_program_modules=["plan"])


def test_provenance_names_the_authors_code():
    for doc in (ROLLOUT_STRATEGIES.get("lm_program").__doc__, REWARD_TRANSFORMS.get("lm_program_failures").__doc__,
                invocation_groups.__doc__):
        p = parse_provenance(doc)
        assert p["kind"] == "authors' code" and p["url"] == "https://github.com/stanfordnlp/dspy"
        assert p["path"].startswith("dspy/teleprompt/") and p["tests"]


# -------------------------------------------------------------------------------------------------- AgentFlow


def agentflow_fake():
    """Replies by module (read from the prompt), in the order the calls are made (batches in run order)."""
    queues = {"planner": ["add"] * 6, "executor": ["2 + 3"] * 6,
              # turn 1: run 0 continues, runs 1-3 stop; run 0's turns 2 and 3: continue, (turn 3 is the last) stop
              "verifier": ["CONTINUE", "STOP", "STOP", "STOP", "CONTINUE", "STOP"],
              # generators of runs 1, 2, 3 (turn 1), then run 0's: q0's answer is 5, q1's 7
              "generator": ["Answer: 4", "Answer: 7", "Answer: 1", "Answer: 5"]}

    def sample(ctx, contexts, budgets, temperatures, model=None):
        texts = [ctx.tokenizer.decode(c) for c in contexts]
        sample.prompts.extend(texts)
        out = [queues[next(m for m in queues if f"You are the {m}" in t)].pop(0) for t in texts]
        ids = [ctx.tokenizer(t, add_special_tokens=False)["input_ids"] for t in out]
        return Continuation(ids, [[-0.5] * len(a) for a in ids], ["eos"] * len(ids))
    sample.prompts = []
    return sample


def exact(completions, answer, **kw):
    texts = [c if isinstance(c, str) else c[-1]["content"] for c in completions]
    return [1.0 if f"Answer: {a}" in t else 0.0 for t, a in zip(texts, answer)]


def test_agentflow_trains_only_the_planner_with_the_outcome_broadcast_by_query(tmp_path, tiny_args, monkeypatch):
    path = tmp_path / "af.jsonl"
    path.write_text("".join(json.dumps({"prompt": [{"role": "user", "content": f"Compute {q}."}], "question": q,
                                        "answer": a}) + "\n" for q, a in (("2+3", "5"), ("3+4", "7"))))
    args = {**recipe_overrides("agentflow"), **own_data_args(tiny_args, str(path)),
            "reward": ["test_lm_program:exact"], "prompts_per_step": 2,
            "num_generations": 2, "max_completion_length": 8, "out": str(tmp_path / "af")}
    fake = agentflow_fake()
    tr, b = scripted_strategy_step(args, monkeypatch, lp, "sample_calls", fake)
    # planner rows only: run 0 made 3 planner calls, runs 1-3 one each; frozen calls (executor, verifier per turn,
    # one generator): run 0 3 * 2 + 1 = 7, runs 1-3 1 * 2 + 1 = 3 each: 16
    assert b.columns["module"] == ["planner"] * 6 and tr.ctx.metrics["lm_program/frozen_calls"] == 16
    # the trajectory's outcome on every planner turn: run 0 (5, right) 1, run 1 (4) 0, run 2 (7) 1, run 3 (1) 0
    assert b.rewards[:, 0].tolist() == [1, 1, 1, 0, 1, 0]
    # grouped by query: q0's 4 planner turns in one group, q1's 2 in another
    g = b.group_ids.tolist()
    assert len(set(g[:4])) == 1 and len(set(g[4:])) == 1 and g[0] != g[4]
    # the memory: run 0's second planner prompt holds step 1 and the calculator's result
    assert any("Step 1: add -> calculator(2 + 3) = 5" in p and "You are the planner" in p for p in fake.prompts)
    # flow_grpo over turn samples: q0 pool (1, 1, 1, 0): mean .75, Bessel std sqrt((3 * .0625 + .5625) / 3) = .5
    # -> run 0's turns .25 / (.5 + 1e-4), run 1's -.75 / (.5 + 1e-4); q1 (1, 0): mean .5, std sqrt(.5) -> +-.5 / (.70711 + 1e-4)
    adv = tr.compute_advantages(b)
    expected = [.25 / (.5 + EPS)] * 3 + [-.75 / (.5 + EPS), .5 / (0.5 ** .5 + EPS), -.5 / (0.5 ** .5 + EPS)]
    assert [float(adv[i, 0]) for i in range(6)] == pytest.approx(expected, rel=1e-5)


def test_expression_in_the_executor_reply():
    assert expression_in("compute 12 * (3 + 4) now") == "12 * (3 + 4)"
    assert expression_in("the answer is 42") == "42" and expression_in("no digits") is None


@pytest.mark.parametrize("recipe", ["mmgrpo", "agentflow"])
def test_recipe_smoke_step(recipe, tiny_args, tmp_path):
    from grpolab.train.metrics import read_metrics
    args = {**recipe_overrides(recipe), **tiny_args, "task": "arithmetic", "steps": 1, "prompts_per_step": 2,
            "num_generations": 2, "max_completion_length": 4, "eval_after": True, "eval_problems": 2,
            "out": str(tmp_path / recipe)}
    tr = Trainer(Config.build(args), log=lambda *a: None)
    summary = tr.train(progress=False)
    step = [r for r in read_metrics(args["out"]) if r.get("step") == 1][0]
    assert step["loss"] is not None and "rollout/lm_program/reward" in step
    # held-out evaluation runs the program once per row (greedy) and scores its answer
    assert summary["after"]["n"] == 2 and 0.0 <= summary["after"]["accuracy"] <= 1.0


def test_runs_are_deterministic_across_thread_schedules(tmp_path, tiny_args):
    """The tiny model samples every call (no script): two identical steps give identical rows, whatever order the
    program threads ran in (calls are batched only once every live run waits, in run order)."""
    def step(out):
        args = {**recipe_overrides("agentflow"), **tiny_args, "task": "arithmetic", "prompts_per_step": 2,
                "num_generations": 3, "max_completion_length": 4, "out": str(tmp_path / out)}
        tr = Trainer(Config.build(args), log=lambda *a: None)
        tr.ctx.new_step()
        return tr.strategy(ctx=tr.ctx, rows=tr.rows[:2], uids=[0, 1], group_offset=tr.ctx.allocate_groups(2),
                           budgets=None, temperatures=None)
    a, b = step("a"), step("b")
    assert torch.equal(a.completion_ids, b.completion_ids) and torch.equal(a.behavior_logprobs, b.behavior_logprobs)
    assert a.group_ids.tolist() == b.group_ids.tolist() and set(a.columns["module"]) == {"planner"}
