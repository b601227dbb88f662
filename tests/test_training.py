"""End-to-end training on the tiny model: learning, metrics, recipes, bad input, resume."""
import json
import os
import signal
import subprocess
import sys
import time
import warnings
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from grpolab.algorithms import POLICY_LOSSES
from grpolab.cli import main
from grpolab.config import Config
from grpolab.errors import FallbackWarning, OptionalDependencyWarning
from grpolab.recipes import recipe_names, recipe_overrides
from grpolab.train.metrics import read_metrics
from grpolab.train.trainer import Trainer

REQUIRED = ["step", "reward_mean", "reward_std", "reward_errors", "frac_zero_std_groups", "loss", "kl", "entropy",
            "clip_frac_low", "clip_frac_high", "completion_len_mean", "completion_len_max", "frac_truncated",
            "rollout_s", "train_s", "tokens_per_s"]
TIMING = {"rollout_s", "train_s", "tokens_per_s", "train_seconds_total", "peak_rss_mb"}


def run(layers):
    cfg = Config.build(layers)
    t = Trainer(cfg, log=lambda *a: None)
    return t, t.train(progress=False)


LEARN_SEEDS = (0, 1, 2)


def test_tiny_model_learns_repeat_task(tiny_args, tmp_path):
    """Held-out accuracy improves and mean reward rises on a task learnable from scratch, on average over seeds.

    How far a random-init model gets in a few dozen steps is luck of the seed and of the CPU's kernels (one seed
    rose +0.17 with AVX512 kernels and +0.27 with AVX2 ones, another +0.06: asserting +0.25 for seed 0 failed on an
    AVX512-BF16 CPU, issue 22), so the margins are on the mean over LEARN_SEEDS, measured on every code path."""
    rises, gains = [], []
    for seed in LEARN_SEEDS:
        args = {**tiny_args, "steps": 40, "prompts_per_step": 8, "num_generations": 8, "learning_rate": 1e-2,
                "max_completion_length": 4, "save_steps": 40, "micro_batch_size": 64, "eval_before": True,
                "eval_after": True, "stall_steps": 0, "seed": seed, "out": str(tmp_path / f"seed{seed}")}
        t, summary = run(args)
        rows = read_metrics(args["out"])
        first = sum(r["reward_mean"] for r in rows[:10]) / 10
        last = sum(r["reward_mean"] for r in rows[-10:]) / 10
        rises.append(last - first)
        gains.append(summary["after"]["accuracy"] - summary["before"]["accuracy"])  # greedy held-out accuracy
        if seed != LEARN_SEEDS[0]:
            continue
        for key in REQUIRED + ["rewards/match/mean", "rewards/match/unscorable"]:
            assert key in rows[0], key
        assert rows[0]["kl"] is None  # beta = 0: no reference model
        assert t.ref_model is None
        out = Path(args["out"])
        assert (out / "reward_curve.png").stat().st_size > 1000
        assert (out / "final" / "config.json").exists()
        # grpolab eval on the saved model reproduces the trainer's after-eval
        res = json.loads(_capture(["eval", "--model", str(out / "final"), "--task", "repeat", "--compact",
                                   "--max_completion_length", "4"]))
        assert res["accuracy"] == pytest.approx(summary["after"]["accuracy"])
    # measured (issue 22; reward rise = mean of the last 10 steps - the first 10; accuracy gain = after - before):
    #                                 seed 0        seed 1        seed 2        mean of 0-2
    #   float32, AVX512 kernels       +0.161/+0.15  +0.244/+0.175 +0.031/+0.125 +0.145/+0.150
    #   bf16 autocast (AVX512-BF16)   +0.364/+0.35  +0.215/+0.225 +0.024/+0.10  +0.201/+0.225
    #   float32, AVX2 kernels         +0.154/+0.15  +0.254/+0.20  +0.031/+0.125 +0.146/+0.158
    #   (AVX2: ATEN_CPU_CAPABILITY=avx2 MKL_ENABLE_INSTRUCTIONS=AVX2 ONEDNN_MAX_CPU_ISA=AVX2.) Seeds 3 and 4, as other
    #   trajectories a CPU kind not measured here could take: float32 +0.089/+0.10, -0.023/+0.05; bf16 +0.150/+0.125,
    #   +0.010/+0.05. The suite runs float32 (conftest); the bf16 row is dtype auto on an AVX512-BF16 CPU.
    # Single seeds range from -0.02 to +0.36 (reward) and +0.05 to +0.35 (accuracy; 0 before training on every
    # seed). The margins are on the mean of three seeds, about 3x below the lowest mean of any three of the five
    # seeds measured on any path (+0.032 reward, float32 seeds 2-4; +0.092 accuracy).
    mean_rise, mean_gain = sum(rises) / len(rises), sum(gains) / len(gains)
    assert mean_rise > 0.01, rises
    assert mean_gain > 0.03, gains


def _capture(argv):
    import contextlib
    import io
    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        assert main(argv) == 0
    return buf.getvalue()


# The rollout strategies that play multi-turn episodes (grpolab/agents): on the tiny model (one token per
# character) an episode is its prompt (the tools' schemas and a worked example: gridworld 520, calculator 1170,
# search_qa 1850 tokens) plus every turn's observation, so with tiny_args' 4 prompts x 4 generations and the
# recipes' max_turns (up to 8) such a recipe cost 5-15x a plain one here (turn_ppo 19 s, hc_grpo 19 s). Their
# smoke run takes 2 prompts x 2 generations (two groups; every advantage's min_group is 2) and at most 2 turns
# (a turn boundary, an observation and a second turn: every multi-turn code path).
AGENT_STRATEGIES = {"agent", "tree_grpo", "mcts_staged"}
AGENT_SMOKE = {"prompts_per_step": 2, "num_generations": 2, "max_turns": 2}


def grm(completions, **kwargs):
    """A stand-in pointwise judge for irpo_policy's smoke run: a 0-10 score from the reply's length."""
    return [float(min(len(str(c)), 10)) for c in completions]


@pytest.mark.parametrize("recipe", recipe_names())
def test_every_recipe_trains(tiny_args, recipe, tmp_path):
    """Every recipe trains 2 steps x 2 passes on the tiny model, and no component uses a stand-in for a missing
    defining input (a FallbackWarning is an error here; tests/test_no_fallbacks.py checks the recipes whose
    input no built-in task provides stop without allow_stand_ins)."""
    from test_no_fallbacks import NEEDS_USER_DATA

    rec = recipe_overrides(recipe)
    args = {**rec, **tiny_args, "steps": 2, "num_iterations": 2}
    if rec.get("rollout_strategy") in AGENT_STRATEGIES:
        args.update(AGENT_SMOKE)
    if recipe == "irpo":  # IRPO needs a pointwise reward model ('rm' column): a tiny local one
        from test_reward_models import _save_tiny_rm
        _save_tiny_rm(tmp_path / "rm")
        args["reward"] = [f"rm:{tmp_path / 'rm'}"]
    if recipe == "irpo_policy":  # phase 2 of IRPO scores with phase 1's trained GRM (tests/test_irpo_grm.py runs
        args["reward"] = ["test_training:grm"]  # both phases); here a stand-in judge fills the 'grm' column
    if rec.get("update_strategy") == "mask_reseed":  # d1's passes come from mask_reseed_iterations (num_iterations 1)
        args["num_iterations"] = 1
    if rec.get("policy") == "vision_language":  # the smoke runs' tiny VLM: 5 pre-training steps, no backbone
        args["vlm_pretrain_steps"] = 5
    if rec.get("update_strategy") == "training_free":  # repeat's reference answer is 'digit'; short LM replies
        args.update(training_free_answer_column="digit", training_free_max_new_tokens=8)
    if "task" in rec:  # a recipe built around its own task (e.g. countdown) keeps it
        args["task"] = rec["task"]
    if "model" in rec:  # and its own built-in model (asr_grpo_audio: the tiny model on audio)
        args["model"] = rec["model"]
    with warnings.catch_warnings():
        if recipe in NEEDS_USER_DATA:
            args["allow_stand_ins"] = True
        else:
            warnings.simplefilter("error", FallbackWarning)
            warnings.simplefilter("default", OptionalDependencyWarning)  # visible, not an error
        t, _ = run(args)
    rows = read_metrics(args["out"])
    assert len(rows) == 2 and all(r["skipped"] == 0 for r in rows)
    if args.get("beta", 0) > 0:
        assert t.ref_model is not None and rows[0]["kl"] is not None and rows[0]["kl"] >= 0
    if rec.get("update_strategy") == "training_free":  # no optimiser step, so no loss (the weights: its own test)
        assert all(r["loss"] is None and "training_free/experiences" in r for r in rows)
        return
    # the second pass is off-policy: clipping can now act, and the loss is finite
    assert all(r["loss"] is not None for r in rows)


def test_weights_change_and_tensorboard(tiny_args):
    args = {**tiny_args, "tensorboard": True, "steps": 2}
    cfg = Config.build(args)
    t = Trainer(cfg, log=lambda *a: None)
    before = {n: p.detach().clone() for n, p in t.model.named_parameters()}
    t.train(progress=False)
    changed = sum(not torch.equal(before[n], p) for n, p in t.model.named_parameters())
    assert changed == len(before)
    assert list((Path(args["out"]) / "tensorboard").glob("events.out.tfevents.*"))


def test_lora_trains_only_adapters(tiny_args):
    args = {**tiny_args, "use_lora": True, "lora_target_modules": "q_proj,v_proj", "steps": 2,
            "beta": 0.1}
    t, _ = run(args)
    trainable = [n for n, p in t.model.named_parameters() if p.requires_grad]
    assert trainable and all("lora_" in n for n in trainable)
    assert read_metrics(args["out"])[0]["kl"] is not None  # reference = adapters disabled
    assert (Path(args["out"]) / "final" / "config.json").exists()  # merged model


def test_user_data_and_reward_module(tiny_args, tmp_path, monkeypatch):
    data = tmp_path / "d.jsonl"
    data.write_text("".join(json.dumps({"prompt": f"say {i % 10}:", "target": str(i % 10)}) + "\n"
                            for i in range(20)))
    (tmp_path / "my_rewards.py").write_text(
        "def hit(prompts, completions, target, **kw):\n"
        "    return [float(t in c) for c, t in zip(completions, target)]\n"
        "def flaky(prompts, completions, **kw):\n"
        "    raise RuntimeError('flaky judge')\n"
        "def picky(completions, **kw):\n"
        "    return [None if i % 2 else 0.5 for i in range(len(completions))]\n")
    monkeypatch.chdir(tmp_path)
    out = tmp_path / "run"
    rc = main(["train", "--model", "tiny", "--data", str(data), "--reward", "my_rewards:hit",
               "--reward", "my_rewards:flaky=2", "--reward", "my_rewards:picky", "--steps", "2",
               "--num_generations", "4", "--max_completion_length", "4", "--eval_before", "false",
               "--eval_after", "false", "--tensorboard", "false", "--out", str(out), "--quiet"])
    assert rc == 0
    rows = read_metrics(out)
    assert rows[0]["reward_errors"] == 1  # flaky raised once per step ...
    assert rows[0]["rewards/flaky/unscorable"] == 16  # ... its rows are unscorable ...
    assert rows[0]["rewards/picky/unscorable"] == 8  # None = unscorable
    assert len(rows) == 2  # ... and the run went on


def test_reward_param_missing_column_rejected_before_training(tmp_path, monkeypatch, capsys):
    data = tmp_path / "d.jsonl"
    data.write_text(json.dumps({"prompt": "hi", "answer": "1"}) + "\n")
    (tmp_path / "r.py").write_text("def f(prompts, completions, solution):\n    return [0.0]*len(completions)\n")
    monkeypatch.chdir(tmp_path)
    rc = main(["train", "--model", "tiny", "--data", str(data), "--reward", "r:f", "--out", str(tmp_path / "o")])
    assert rc == 2
    assert "parameter 'solution'" in capsys.readouterr().err
    assert not (tmp_path / "o" / "metrics.jsonl").exists()


def test_malformed_data_cli(tmp_path, capsys):
    data = tmp_path / "d.jsonl"
    data.write_text('{"prompt": "ok"}\n{"prompt": oops}\n')
    rc = main(["train", "--model", "tiny", "--data", str(data), "--reward", "x:y", "--out", str(tmp_path / "o")])
    assert rc == 2 and "d.jsonl:2" in capsys.readouterr().err


def test_nan_loss_skips_step_weights_untouched(tiny_args):
    name = "nan_for_test"  # registered for this test only (conftest's _forget_test_components removes it)

    @POLICY_LOSSES.register(name)
    def nan_loss(logprobs, old_logprobs, advantages, mask):
        return logprobs * float("nan"), {}
    args = {**tiny_args, "policy_loss": name, "steps": 2}
    cfg = Config.build(args)
    t = Trainer(cfg, log=lambda *a: None)
    before = {n: p.detach().clone() for n, p in t.model.named_parameters()}
    t.train(progress=False)
    assert all(torch.equal(before[n], p) for n, p in t.model.named_parameters())
    rows = read_metrics(args["out"])
    assert [r["skipped"] for r in rows] == [1, 1] and rows[0]["loss"] is None
    assert all(not s for s in t.optimizer.state.values())  # no optimiser state was created


def test_existing_run_is_not_overwritten(tiny_args, capsys):
    run({**tiny_args, "steps": 2})
    before = Path(tiny_args["out"], "metrics.jsonl").read_text()
    rc = main(["train", "--model", "tiny", "--task", "repeat", "--out", tiny_args["out"]])
    assert rc == 2 and "--resume" in capsys.readouterr().err
    assert Path(tiny_args["out"], "metrics.jsonl").read_text() == before


def _cli(out, steps, extra=()):
    return [sys.executable, "-m", "grpolab", "train", "--model", "tiny", "--task", "repeat",
            "--steps", str(steps), "--prompts_per_step", "4", "--num_generations", "4",
            "--max_completion_length", "6", "--learning_rate", "3e-3", "--eval_before", "false",
            "--eval_after", "false", "--tensorboard", "false", "--save_steps", "2", "--threads", "1",
            "--num_iterations", "2", "--dtype", "float32", "--out", str(out), "--quiet", *extra]


def test_kill_9_and_resume_matches_uninterrupted_run(tmp_path):
    """A run killed with SIGKILL (its own process) and resumed matches the uninterrupted run step for step and
    weight for weight. Only the killed run needs a process of its own: the reference run and the resume are
    the same command line run in this process (``main``; a process start-up costs 3-5 s on 2 busy cores)."""
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    steps = 7
    ref = tmp_path / "ref"
    assert main(_cli(ref, steps)[3:]) == 0  # grpolab train ... (argv after "python -m grpolab")
    # same run, killed with SIGKILL after its 3rd step (between checkpoints 2 and 4)
    out = tmp_path / "killed"
    proc = subprocess.Popen(_cli(out, steps), env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.time() + 240
    while time.time() < deadline:
        if len(read_metrics(out)) >= 3:
            break
        time.sleep(0.01)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    assert len(read_metrics(out)) < steps
    assert main(["train", "--resume", str(out), "--quiet"]) == 0
    a, b = read_metrics(ref), read_metrics(out)
    assert [r["step"] for r in b] == list(range(1, steps + 1))
    for ra, rb in zip(a, b):
        assert {k: v for k, v in ra.items() if k not in TIMING} == {k: v for k, v in rb.items() if k not in TIMING}
    wa = load_file(str(ref / "final" / "model.safetensors"))
    wb = load_file(str(out / "final" / "model.safetensors"))
    assert all(torch.equal(wa[k], wb[k]) for k in wa)


def test_default_out_folder_is_never_overwritten(tiny_args, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    argv = ["train", "--model", "tiny", "--task", "repeat", "--steps", "1", "--num_generations", "2",
            "--prompts_per_step", "2", "--max_completion_length", "3", "--eval_before", "false",
            "--eval_after", "false", "--tensorboard", "false", "--quiet"]
    assert main(argv) == 0 and main(argv) == 0
    assert (tmp_path / "runs" / "default" / "metrics.jsonl").exists()
    assert (tmp_path / "runs" / "default-2" / "metrics.jsonl").exists()


def test_rollout_strategy_metrics_reach_metrics_jsonl(tiny_args):
    """ctx.metric(name, v) in a rollout strategy is logged as rollout/<name>; hint strategies log
    rollout/frac_hinted (share of rows trained with a hint in the context) themselves."""
    from grpolab.rollouts.strategies import ROLLOUT_STRATEGIES, plain

    @ROLLOUT_STRATEGIES.register("_metric_probe")
    def probe(ctx, rows, uids, group_offset, budgets, temperatures, step):
        ctx.metric("probe", 10 + step)
        ctx.metric("rows", len(rows))
        return plain(ctx=ctx, rows=rows, uids=uids, group_offset=group_offset, budgets=budgets,
                     temperatures=temperatures)
    try:
        run({**tiny_args, "rollout_strategy": "_metric_probe", "steps": 2})
    finally:
        ROLLOUT_STRATEGIES._items.pop("_metric_probe")
    ms = read_metrics(tiny_args["out"])
    assert [m["rollout/probe"] for m in ms] == [10.0, 11.0]
    assert all(m["rollout/rows"] == tiny_args["prompts_per_step"] for m in ms)
    assert all("rollout/frac_hinted" not in m and "frac_hinted" not in m for m in ms)

    out = str(Path(tiny_args["out"]).parent / "guide")
    run({**tiny_args, **recipe_overrides("guide_grpo"), "task": "arithmetic", "steps": 1, "out": out})
    (m,) = read_metrics(out)
    assert 0.0 <= m["rollout/frac_hinted"] <= 1.0 and "frac_hinted" not in m
