"""grpolab compare: the statistics by hand, budgets, and a 2 x 2 grid on the tiny model that is killed and resumed."""
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from grpolab.compare import at_tokens, budget_args, main, mean_ci, paired, parse_arms, run_state
from grpolab.errors import ConfigError

# Student t 0.975 quantiles from a printed table (df = 1, 2, 4)
T1, T2, T4 = 12.706, 4.303, 2.776


def test_mean_ci_by_hand():
    s = mean_ci([0.5, 0.7, 0.6])
    # mean 0.6; sd = sqrt((0.01 + 0.01 + 0) / 2) = 0.1; half-width = 4.303 * 0.1 / sqrt(3) = 0.24843
    assert s["n"] == 3 and s["mean"] == pytest.approx(0.6) and s["sd"] == pytest.approx(0.1)
    assert s["ci"] == pytest.approx(T2 * 0.1 / 3 ** 0.5, abs=1e-3)
    s = mean_ci([1.0, 3.0])  # sd = sqrt(2); half-width = 12.706 * sqrt(2) / sqrt(2) = 12.706
    assert s["mean"] == 2.0 and s["ci"] == pytest.approx(T1, abs=1e-3)
    assert mean_ci([0.4])["ci"] is None and mean_ci([])["mean"] is None


def test_paired_difference_by_hand():
    arm = {0: 0.6, 1: 0.8, 2: 0.7, 3: 0.9}
    base = {0: 0.5, 1: 0.6, 2: 0.6}  # seed 3 has no baseline run: left out
    p = paired(arm, base)
    # differences 0.1, 0.2, 0.1: mean 0.1333, sd 0.05774, half-width 4.303 * 0.05774 / sqrt(3) = 0.1434 > 0.1333
    assert p["seeds"] == [0, 1, 2]
    assert p["mean"] == pytest.approx(0.4 / 3) and p["sd"] == pytest.approx(0.0577350, abs=1e-6)
    assert p["ci"] == pytest.approx(T2 * 0.0577350 / 3 ** 0.5, abs=1e-3)
    assert p["significant"] is False  # the CI contains 0
    q = paired({s: 0.9 + 0.01 * s for s in range(5)}, {s: 0.5 for s in range(5)})
    # differences 0.40..0.44: mean 0.42, sd 0.01581, half-width 2.776 * 0.01581 / sqrt(5) = 0.0196
    assert q["mean"] == pytest.approx(0.42) and q["ci"] == pytest.approx(T4 * 0.0158114 / 5 ** 0.5, abs=1e-3)
    assert q["significant"] is True


def test_accuracy_at_equal_tokens_takes_the_last_evaluation_within_the_budget():
    evals = [(0, 0, 0.1), (2, 150, 0.3), (4, 320, 0.5)]
    assert at_tokens(evals, 149) == 0.1 and at_tokens(evals, 150) == 0.3 and at_tokens(evals, 10_000) == 0.5


def test_budgets_and_arms_are_checked():
    assert budget_args("steps") == [] and budget_args("tokens=5000") == ["--max_generated_tokens", "5000"]
    assert budget_args("seconds=30") == ["--max_train_seconds", "30.0"]
    for bad in ("tokens", "steps=3", "flops=9", "tokens=-1", "tokens=abc"):
        with pytest.raises(ConfigError, match="--budget"):
            budget_args(bad)
    arms = parse_arms("grpo,dr_grpo", ["g2=--recipe grpo --num_generations 2"])
    assert [a.name for a in arms] == ["grpo", "dr_grpo", "g2"]
    assert arms[2].args == ["--recipe", "grpo", "--num_generations", "2"]
    with pytest.raises(ConfigError, match="unique"):
        parse_arms("grpo,grpo", [])
    with pytest.raises(ConfigError, match="--variant"):
        parse_arms(None, ["no-equals-sign"])


GRID = ["--recipes", "grpo,dr_grpo", "--seeds", "0", "--model", "tiny", "--task", "repeat", "--steps", "5",
        "--prompts_per_step", "2", "--num_generations", "4", "--max_completion_length", "5",
        "--learning_rate", "3e-3", "--eval_problems", "8", "--eval_steps", "2", "--save_steps", "1",
        "--tensorboard", "false", "--no-report"]


def test_a_grid_killed_midway_resumes_without_redoing_finished_runs(tmp_path):
    """Two arms x one seed (each run a subprocess: three of them in all): killed while the second trains, the
    compare resumes it and keeps the first."""
    out = tmp_path / "cmp"
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "PYTHONPATH": str(Path(__file__).parents[1] / "src")}
    proc = subprocess.Popen([sys.executable, "-m", "grpolab", "compare", *GRID, "--out", str(out)], env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    first = out / "runs" / "grpo" / "seed0" / "summary.json"
    second = out / "runs" / "dr_grpo" / "seed0"  # killed between its first checkpoint and its end
    deadline = time.time() + 240
    while time.time() < deadline and not (first.exists() and run_state(second) != "new"):
        time.sleep(0.02)
    os.killpg(proc.pid, signal.SIGKILL)  # the compare process and its running train child
    proc.wait()
    assert first.exists(), "the first run never finished"
    stamp = first.stat().st_mtime_ns
    killed_state = run_state(second)  # "partial" unless the run finished in the instant before the kill

    lines = []
    rc = main([*GRID, "--out", str(out)], log=lines.append)
    assert rc == 0
    assert first.stat().st_mtime_ns == stamp  # not redone
    assert any("grpo seed 0: finished earlier, kept" in line for line in lines)
    expected = {"partial": "dr_grpo seed 0: resuming", "done": "dr_grpo seed 0: finished earlier, kept"}[killed_state]
    assert any(expected in line for line in lines)
    data = json.loads((out / "compare.json").read_text())
    assert sorted((r["arm"], r["seed"]) for r in data["runs"]) == [("dr_grpo", 0), ("grpo", 0)]
    for r in data["runs"]:  # evaluations at step 0 (before), 2 and 4 (eval_steps) and the end
        assert [e[0] for e in r["evals"]] == [0, 2, 4, 5] and r["tokens"] > 0 and r["steps"] == 5
    md = (out / "compare.md").read_text()
    assert "| `dr_grpo` | 1 |" in md and "vs `grpo`" in md
    for png in ("reward.png", "heldout.png", "heldout_vs_tokens.png"):
        assert (out / png).stat().st_size > 1000
    with pytest.raises(ConfigError, match="other settings"):  # another grid into the same folder is refused
        main([*GRID[:3], "1", *GRID[4:], "--out", str(out)], log=lines.append)


def test_budget_stops_the_run_and_totals_survive_a_resume(tiny_args, tmp_path):
    """max_generated_tokens ends the run after the step that spends it; a resumed run continues its totals;
    eval_steps logs held-out metrics during training."""
    from grpolab.config import Config
    from grpolab.train.trainer import Trainer

    quiet = {"log": lambda *a: None}
    cfg = Config.build(tiny_args, {"steps": 6, "save_steps": 1, "eval_steps": 2, "eval_problems": 4,
                                   "max_generated_tokens": 1})
    summary = Trainer(cfg, **quiet).train(progress=False)
    assert summary["spent"]["steps"] == 1 and "max_generated_tokens reached" in summary["stopped_by"]
    rows = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    first = rows[0]["generated_tokens_total"]
    # 4 prompts x 4 completions, each 1..6 tokens
    assert rows[0]["generated_tokens"] == first and 16 <= first <= 96

    cfg = Config.build(tiny_args, {"steps": 4, "save_steps": 1, "eval_steps": 2, "eval_problems": 4})
    summary = Trainer(cfg, resume=True, **quiet).train(progress=False)
    rows = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [1, 2, 3, 4]
    totals = [r["generated_tokens_total"] for r in rows]
    assert totals == [first + sum(r["generated_tokens"] for r in rows[1:k + 1]) for k in range(4)]
    assert summary["spent"]["tokens"] == totals[-1] and "stopped_by" not in summary
    assert "eval/accuracy" in rows[1] and "eval/accuracy" not in rows[2]  # step 2 evaluated; step 4 is the end


def test_reward_flip_flips_the_chosen_share_deterministically():
    import torch
    from grpolab.registry import REWARD_TRANSFORMS
    flip = REWARD_TRANSFORMS.get("reward_flip")
    r = torch.tensor([1.0, 0.0] * 500)
    uids = torch.arange(1000) // 8
    a = flip(r, uids, 3, seed=0, flip_prob=0.2)
    assert torch.equal(a, flip(r, uids, 3, seed=0, flip_prob=0.2))  # same (seed, step, row): same flips
    flipped = (a != r)
    assert 0.15 < flipped.float().mean() < 0.25 and torch.equal(a[flipped], 1 - r[flipped])
    assert torch.equal(flip(r, uids, 3, seed=0, flip_prob=0.0), r) and torch.equal(flip(r, uids, 3, flip_prob=1.0), 1 - r)
    assert not torch.equal(a, flip(r, uids, 4, seed=0, flip_prob=0.2))  # another step, other flips
    with pytest.raises(ValueError, match="0/1"):
        flip(torch.tensor([2.0]), torch.tensor([0]), 0, flip_prob=0.2)


def test_evaluation_reports_lengths_by_correctness_and_pass_at_k(tiny_args):
    from grpolab.config import Config
    from grpolab.train.trainer import Trainer
    t = Trainer(Config.build(tiny_args, {"task": "repeat", "repeat_chars": 1, "eval_problems": 6, "eval_pass_k": 4}),
                log=lambda *a: None)
    res = t.evaluate()
    assert 0.0 <= res["pass@4"] <= 1.0 and 0.0 <= res["sampled_accuracy"] <= res["pass@4"] + 1e-9
    assert ("len_correct" in res) == (res["accuracy"] > 0) and ("len_incorrect" in res) == (res["accuracy"] < 1)
    assert res == t.evaluate() | {"samples": res["samples"]}  # the sampled evaluation is seeded: repeatable
