"""OUT/completions.jsonl: content, cadence, seeded group choice, resume (no duplicated or lost lines)."""
import json

import pytest
import torch

from grpolab.batch import RolloutBatch
from grpolab.config import Config, ConfigError, load_yaml
from grpolab.train.metrics import CompletionsLog, completions_table, read_completions, read_metrics
from grpolab.train.trainer import Trainer


class _Tok:
    def decode(self, ids, skip_special_tokens=True):
        return " ".join(str(int(i)) for i in ids)


def _describe():
    """The causal LM policy's view of a row (prompt and completion tokens decoded), with the stand-in tokenizer."""
    from grpolab.components import Component
    from grpolab.policies import POLICIES

    policy = Component(POLICIES.get("causal_lm"), Config.build(), "causal_lm").fn
    policy.tokenizer = _Tok()
    return policy.describe


def _batch():
    # 2 groups of 2 rows; unequal lengths and left-padded prompts
    pi = torch.tensor([[0, 5, 6], [0, 5, 6], [7, 8, 9], [7, 8, 9]])
    pm = torch.tensor([[0, 1, 1], [0, 1, 1], [1, 1, 1], [1, 1, 1]])
    ci = torch.tensor([[11, 12, 13], [14, 0, 0], [15, 16, 0], [17, 18, 19]])
    cm = torch.tensor([[1, 1, 1], [1, 0, 0], [1, 1, 0], [1, 1, 1]]).float()
    b = RolloutBatch(prompt_ids=pi, prompt_mask=pm, completion_ids=ci, completion_mask=cm,
                     behavior_logprobs=torch.zeros(4, 3), group_ids=torch.tensor([0, 0, 1, 1]),
                     prompt_uids=torch.tensor([3, 3, 4, 4]), truncated=torch.tensor([True, False, False, True]))
    b.rewards = torch.tensor([[1.0, 0.5], [0.0, float("nan")], [1.0, 1.0], [0.0, 0.0]])
    b.reward_names = ["acc", "fmt"]
    b.scalar_rewards = torch.tensor([1.5, 0.0, 2.0, 0.0])
    # per-token advantages that differ along the row: the logged value is their mean over the completion tokens
    b.advantages = torch.tensor([[1.0, 2.0, 3.0], [-1.0, 9.0, 9.0], [0.5, 0.5, 7.0], [-0.5, -0.5, -0.5]])
    return b


def test_records_content_and_table(tmp_path):
    log = CompletionsLog(tmp_path, every=2, groups=0)
    recs = log.records(_batch(), _describe(), step=4)
    assert [r["group"] for r in recs] == [0, 0, 1, 1]
    r0, r1, r2 = recs[0], recs[1], recs[2]
    assert r0["prompt"] == "5 6" and r0["completion"] == "11 12 13" and r1["completion"] == "14"
    assert r0["rewards"] == {"acc": 1.0, "fmt": 0.5} and r1["rewards"] == {"acc": 0.0, "fmt": None}
    assert r0["reward"] == 1.5 and r2["reward"] == 2.0
    assert r0["advantage"] == pytest.approx(2.0) and r1["advantage"] == pytest.approx(-1.0)
    assert r2["advantage"] == pytest.approx(0.5)
    assert [r["tokens"] for r in recs] == [3, 1, 2, 3]
    assert r0["truncated"] is True and r0["step"] == 4
    log.write(recs)
    lines = (tmp_path / "completions.jsonl").read_text().splitlines()
    assert len(lines) == 4 and json.loads(lines[1])["rewards"]["fmt"] is None
    cols, rows = completions_table(recs)
    assert cols == ["step", "group", "prompt", "completion", "rewards/acc", "rewards/fmt", "reward", "advantage",
                    "tokens", "truncated"]
    assert rows[0] == [4, 0, "5 6", "11 12 13", 1.0, 0.5, 1.5, pytest.approx(2.0), 3, True]


def test_cadence_and_seeded_choice(tmp_path):
    log = CompletionsLog(tmp_path, every=3, groups=1, seed=7)
    assert [s for s in range(1, 10) if log.due(s)] == [1, 3, 6, 9]  # the first step too
    assert log.due(7, last=True) and not log.due(7)
    assert not CompletionsLog(tmp_path, every=0, groups=1).due(3)
    assert not CompletionsLog(tmp_path, every=0, groups=1).due(1, last=True)
    a = {r["group"] for r in log.records(_batch(), _describe(), step=3)}
    b = {r["group"] for r in CompletionsLog(tmp_path, every=3, groups=1, seed=7).records(_batch(), _describe(), step=3)}
    assert len(a) == 1 and a == b  # the same groups for the same seed and step (a resumed run logs the same)
    picks = {next(iter({r["group"] for r in log.records(_batch(), _describe(), step=s)})) for s in range(1, 40)}
    assert picks == {0, 1}  # the choice changes with the step


def test_negative_settings_refused(tiny_args):
    with pytest.raises(ConfigError, match="log_completions_steps"):
        Config.build({**tiny_args, "log_completions_steps": -1})


def _train(args, resume=False):
    cfg = Config.build(load_yaml(args["out"] + "/config.yaml"), {"steps": args["steps"]}) if resume \
        else Config.build(args)
    return Trainer(cfg, resume=resume, log=lambda *a: None).train(progress=False)


def test_tiny_run_writes_completions_every_n_steps(tiny_args):
    args = {**tiny_args, "steps": 3, "save_steps": 1, "log_completions_steps": 2, "log_completions_groups": 2}
    _train(args)
    recs = read_completions(args["out"])
    assert {r["step"] for r in recs} == {1, 2, 3}  # every 2nd step, and the first and the last
    recs = [r for r in recs if r["step"] == 2]
    assert len(recs) == 2 * args["num_generations"]
    assert len({r["group"] for r in recs}) == 2
    for r in recs:
        assert set(r) == {"step", "group", "prompt", "completion", "rewards", "reward", "advantage", "tokens",
                          "truncated"}
        assert r["prompt"] and 1 <= r["tokens"] <= args["max_completion_length"]
        assert list(r["rewards"]) and all(isinstance(v, (float, type(None))) for v in r["rewards"].values())
    for g in {r["group"] for r in recs}:  # group-relative advantages: mean 0 within a group (default estimator)
        assert abs(sum(r["advantage"] for r in recs if r["group"] == g)) < 1e-4
    # off: no file
    off = {**args, "out": args["out"] + "_off", "log_completions_steps": 0}
    _train(off)
    assert read_completions(off["out"]) == []


def test_a_run_shorter_than_the_cadence_logs_its_first_and_last_step(tiny_args):
    """Issue 23: with the default cadence (10) a newcomer's 3-step run logged no completions at all, so neither
    completions.jsonl nor the report showed any text. The first and the last step are always logged."""
    args = {**tiny_args, "steps": 3, "log_completions_groups": 1}
    assert Config.build(args).log_completions_steps == 10
    _train(args)
    assert sorted({r["step"] for r in read_completions(args["out"])}) == [1, 3]


def test_a_run_stopped_by_its_budget_logs_its_last_step(tiny_args):
    per_step = tiny_args["prompts_per_step"] * tiny_args["num_generations"]
    args = {**tiny_args, "steps": 6, "max_completions": 2 * per_step, "log_completions_groups": 1}
    summary = _train(args)
    assert summary.get("stopped_by") and [m["step"] for m in read_metrics(args["out"])] == [1, 2]
    assert sorted({r["step"] for r in read_completions(args["out"])}) == [1, 2]


def test_resume_neither_duplicates_nor_loses_lines(tiny_args):
    args = {**tiny_args, "steps": 4, "save_steps": 2, "log_completions_steps": 1, "log_completions_groups": 1}
    ref = {**args, "out": args["out"] + "_ref"}
    _train(ref)
    _train({**args, "steps": 3})  # stops after step 3; its last checkpoint is step 2
    import shutil
    from pathlib import Path
    assert (Path(args["out"]) / "checkpoints" / "step_000003").is_dir()
    shutil.rmtree(Path(args["out"]) / "checkpoints" / "step_000003")  # as if killed after step 3
    shutil.rmtree(Path(args["out"]) / "final", ignore_errors=True)
    assert {r["step"] for r in read_completions(args["out"])} == {1, 2, 3}
    # a line cut short by a kill is dropped too
    with open(Path(args["out"]) / "completions.jsonl", "a") as fh:
        fh.write('{"step": 3, "group"')
    _train(args, resume=True)
    a, b = read_completions(ref["out"]), read_completions(args["out"])
    n = args["num_generations"]  # one group of n rows per step
    assert [r["step"] for r in b] == [s for s in (1, 2, 3, 4) for _ in range(n)]
    assert [(r["step"], r["group"], r["completion"], r["reward"]) for r in a] == \
        [(r["step"], r["group"], r["completion"], r["reward"]) for r in b]
    assert [r["step"] for r in read_metrics(args["out"])] == [1, 2, 3, 4]
