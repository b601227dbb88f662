"""Fail early and loud (issue 16, sections 1, 2, 5, 6): runs that cannot learn, checks that used to wait until
mid-run, one-line errors instead of tracebacks, strict JSON, settings you can find and precedence you can trust.

Each test is a probe from the issue: it failed on the code before the fix."""
import json
import re
import sys
from pathlib import Path

import pytest
import torch

from grpolab.cli import main
from grpolab.config import Config, ConfigError
from grpolab.data import DataError, load_jsonl
from grpolab.errors import RunStalled
from grpolab.rewards import RewardFn, RewardScorer, parse_reward_spec
from grpolab.train.metrics import read_metrics
from grpolab.train.trainer import Trainer

README = Path(__file__).resolve().parent.parent / "README.md"
FAST = ["--model", "tiny", "--steps", "2", "--prompts_per_step", "2", "--num_generations", "2",
        "--max_completion_length", "4", "--eval_before", "false", "--eval_after", "false", "--tensorboard", "false",
        "--quiet"]


def strict_json(text: str):
    """json.loads that rejects NaN / Infinity (what most JSON tools do)."""
    def bad(token):
        raise ValueError(f"non-standard JSON token {token}")
    return json.loads(text, parse_constant=bad)


def write_rows(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def module(tmp_path: Path, monkeypatch, name: str, source: str) -> str:
    """A reward module ``name`` importable from the current directory (a fresh name per test)."""
    (tmp_path / f"{name}.py").write_text(source)
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    sys.modules.pop(name, None)
    return name


def one_line_error(err: str) -> str:
    lines = [ln for ln in err.strip().splitlines() if ln.startswith("grpolab: error:")]
    assert lines and "Traceback" not in err, err
    return lines[-1]


# ----------------------------------------------------------------- 1. runs that learn nothing
@pytest.mark.parametrize("advantage", ["group_zscore", "leave_one_out", "group_mean", "batch_zscore", "gdpo",
                                       "group_mad", "dagrpo_distinct_pairs"])
def test_group_estimator_with_one_completion_is_rejected(advantage):
    with pytest.raises(ConfigError, match=rf"num_generations: .*'{advantage}'.* at least 2 .* got 1"):
        Config.build({"advantage": advantage, "num_generations": 1})


def test_rloo_recipe_with_one_completion_cli(tmp_path, capsys):
    rc = main(["train", "--recipe", "rloo", "--num_generations", "1", "--out", str(tmp_path / "o")] + FAST[:2])
    assert rc == 2
    assert "num_generations" in one_line_error(capsys.readouterr().err)
    assert not (tmp_path / "o").exists()


def test_single_stream_estimator_still_allows_one_completion():
    assert Config.build({"advantage": "spo_single_stream", "num_generations": 1}).num_generations == 1


def test_min_group_size_is_declared_where_one_completion_gives_zero_advantage():
    """The declaration matches the estimator: with one completion per group its advantage is 0."""
    from grpolab.registry import ADVANTAGES
    r = torch.tensor([0.0, 1.0, 0.5, 0.2])
    g = torch.arange(4)
    for name in ("group_zscore", "group_mean", "leave_one_out", "batch_zscore", "group_mean_batch_std", "gpg",
                 "group_mad", "sgrpo_noise_aware", "tempsamp_soft_advantage", "dagrpo_distinct_pairs"):
        assert ADVANTAGES.min_group_size(name) == 2, name
        assert torch.all(ADVANTAGES.get(name)(r, g) == 0), name
    assert ADVANTAGES.min_group_size("spo_single_stream") == 1


def test_temperature_zero_is_rejected():
    with pytest.raises(ConfigError, match="temperature: 0 .*temperature > 0"):
        Config.build({"temperature": 0})


@pytest.mark.parametrize("layers", [{"reward_weights": [float("nan")]}, {"reward_weights": "1,nan"},
                                    {"learning_rate": float("nan")}, {"beta": float("inf")},
                                    {"advantage": "gpg", "advantage_epsilon": float("nan")}])
def test_non_finite_settings_are_rejected(layers):
    with pytest.raises(ConfigError, match="must be"):
        Config.build(layers)


def test_infinite_clip_range_still_means_no_clipping():
    assert Config.build({"epsilon": float("inf")}).epsilon == float("inf")
    with pytest.raises(ConfigError, match="epsilon: must be a number"):
        Config.build({"epsilon": float("nan")})


def test_nan_reward_spec_weight_is_rejected(tmp_path, monkeypatch):
    name = module(tmp_path, monkeypatch, "fe_weight_mod", "def f(completions, **kw):\n    return [0.0]*len(completions)\n")
    with pytest.raises(ValueError, match="not a finite number"):
        parse_reward_spec(f"{name}:f=nan")


def _stall_run(tmp_path, monkeypatch, name, source, **over):
    mod = module(tmp_path, monkeypatch, name, source)
    data = write_rows(tmp_path / "d.jsonl", [{"prompt": f"say {i}:", "answer": str(i)} for i in range(6)])
    layers = {"model": "tiny", "data": str(data), "reward": [f"{mod}:f"], "steps": 6, "prompts_per_step": 2,
              "num_generations": 2, "max_completion_length": 3, "eval_before": False, "eval_after": False,
              "tensorboard": False, "save_steps": 100, "stall_steps": 4, "out": str(tmp_path / "run"), **over}
    logs = []
    t = Trainer(Config.build(layers), log=lambda *a: logs.append(" ".join(map(str, a))))
    return t, logs


def test_reward_that_always_raises_stops_the_run(tmp_path, monkeypatch):
    t, logs = _stall_run(tmp_path, monkeypatch, "fe_raises",
                         "def f(completions, **kw):\n    raise RuntimeError('boom')\n")
    with pytest.raises(RunStalled, match="every reward call failed in the last 4 steps.*stall_steps 0"):
        t.train(progress=False)
    assert t.step == 4
    assert [m["step"] for m in read_metrics(tmp_path / "run")] == [1, 2, 3, 4]  # metrics kept
    assert (tmp_path / "run" / "checkpoints" / "step_000004").exists()  # stopped cleanly, with a checkpoint
    assert any("warning: every reward call failed in the last 2 steps" in line for line in logs)


def test_constant_reward_stops_the_run_with_zero_spread(tmp_path, monkeypatch):
    t, _ = _stall_run(tmp_path, monkeypatch, "fe_const", "def f(completions, **kw):\n    return [0.0]*len(completions)\n")
    with pytest.raises(RunStalled, match="zero reward spread .*every advantage was 0.*list of messages"):
        t.train(progress=False)
    assert t.step == 4


def test_cli_reports_a_stalled_run_in_one_line(tmp_path, monkeypatch, capsys):
    mod = module(tmp_path, monkeypatch, "fe_const_cli", "def f(completions, **kw):\n    return [1.0]*len(completions)\n")
    data = write_rows(tmp_path / "d.jsonl", [{"prompt": f"say {i}:"} for i in range(4)])
    rc = main(["train", "--data", str(data), "--reward", f"{mod}:f", "--out", str(tmp_path / "o"),
               "--stall_steps", "2"] + FAST)
    assert rc == 1
    assert "zero reward spread" in one_line_error(capsys.readouterr().err)


def test_stall_guard_off_with_zero(tmp_path, monkeypatch):
    t, _ = _stall_run(tmp_path, monkeypatch, "fe_const_off",
                      "def f(completions, **kw):\n    return [0.0]*len(completions)\n", stall_steps=0, steps=3)
    t.train(progress=False)
    assert t.step == 3


def _readme_reward():
    """The example reward function of README.md, executed as written."""
    block = re.search(r"```python\n(# my_rewards\.py.*?)```", README.read_text(), re.S)
    assert block, "README.md lost its my_rewards.py example"
    ns: dict = {}
    exec(block.group(1), ns)
    return ns["correct"]


def test_readme_example_reward_scores_plain_and_chat_completions():
    correct = _readme_reward()
    plain = correct(prompts=["2+2=", "3+3="], completions=["The answer is 4", "it is 7"], answer=[4, 6])
    chat = correct(prompts=[[{"role": "user", "content": "2+2="}]] * 2,
                   completions=[[{"role": "assistant", "content": "The answer is 4"}],
                                [{"role": "assistant", "content": "it is 7"}]], answer=["4", "6"])
    assert plain == chat == [1.0, 0.0]


def test_readme_example_reward_on_grpolab_chat_completions():
    """Through grpolab's own scoring of a chat-prompt rollout: completions arrive as messages and still score."""
    from grpolab.generation.plain import plain_rollout
    from grpolab.model.loading import load_policy
    rows = [{"prompt": [{"role": "user", "content": "say 1:"}], "answer": "1"}]
    model, tok = load_policy("tiny", task_texts=["say 1:", "1"], seed=0)
    batch = plain_rollout(model, tok, rows, [0], num_generations=2, max_completion_length=3, max_prompt_length=512,
                          temperature=1.0, generator=torch.Generator().manual_seed(0))
    assert isinstance(batch.columns["completion"][0], list)  # a chat completion is a list of messages
    text = batch.columns["completion"][0][-1]["content"]
    batch.columns["answer"] = [text, "never-in-it"]
    m, errors = RewardScorer([RewardFn("correct", _readme_reward())]).score_batch(batch)
    assert errors == 0 and m[:, 0].tolist() == [1.0, 0.0]


# ----------------------------------------------------------------- 2. checks that waited until mid-run
@pytest.mark.parametrize("recipe,column", [("scaf_grpo", "hints"), ("guide_grpo", "hints"), ("ghpo", "solution")])
def test_hint_strategies_check_their_column_before_training(tmp_path, capsys, recipe, column):
    rows = [{"prompt": f"say {i}:", "hints": ["a"], "solution": "s"} for i in range(5)]
    del rows[3][column]  # line 4 of the file
    data = write_rows(tmp_path / "d.jsonl", rows)
    (tmp_path / "r.py").write_text("def f(completions, **kw):\n    return [0.0]*len(completions)\n")
    rc = main(["train", "--recipe", recipe, "--data", str(data), "--reward", str(tmp_path / "r.py") + ":f",
               "--out", str(tmp_path / "o"), "--model", "tiny", "--eval_before", "true", "--quiet"])
    assert rc == 2
    err = one_line_error(capsys.readouterr().err)
    assert f"d.jsonl:4 has no '{column}' column" in err and "rollout strategy" in err
    assert not (tmp_path / "o" / "metrics.jsonl").exists()


def test_injection_template_columns_checked_before_training(tmp_path):
    data = write_rows(tmp_path / "d.jsonl", [{"prompt": "say 1:", "answer": "1"}])
    cfg = Config.build({"model": "tiny", "data": str(data), "reward": ["x:y"], "rollout_strategy": "gcpo_reference",
                        "injection_reference_template": "Answer: {solution}"})
    assert cfg.required_columns() == {"rollout strategy 'gcpo_reference'": ["solution"]}


def test_over_long_prompt_is_found_before_training_and_on_resume(tmp_path, monkeypatch, capsys):
    mod = module(tmp_path, monkeypatch, "fe_len", "def f(completions, **kw):\n    return [0.0]*len(completions)\n")
    data = tmp_path / "d.jsonl"
    rows = [{"prompt": f"say {i}:"} for i in range(6)]
    write_rows(data, rows)
    out = tmp_path / "o"
    args = ["--data", str(data), "--reward", f"{mod}:f", "--max_prompt_length", "20"]
    assert main(["train", "--out", str(out), "--stall_steps", "0"] + args + FAST) == 0
    rows[4]["prompt"] = "say " + "9" * 40 + ":"
    write_rows(data, rows)
    capsys.readouterr()
    rc = main(["train", "--resume", str(out), "--steps", "3", "--quiet"])
    assert rc == 2
    err = one_line_error(capsys.readouterr().err)
    assert "d.jsonl:5: the prompt has" in err and "max_prompt_length=20" in err
    rc = main(["train", "--out", str(tmp_path / "fresh")] + args + FAST)
    assert rc == 2 and "d.jsonl:5" in one_line_error(capsys.readouterr().err)


def test_completion_budget_beyond_the_model_context_is_an_error_at_start(tmp_path, capsys):
    rc = main(["train", "--task", "repeat", "--out", str(tmp_path / "o"), "--max_completion_length", "100000"]
              + FAST[:2])
    assert rc == 2
    err = one_line_error(capsys.readouterr().err)
    assert "max_completion_length" in err and "context of 512 positions" in err
    assert not (tmp_path / "o" / "metrics.jsonl").exists()


# ----------------------------------------------------------------- 5. one line, not a traceback
def _scorer(fn, logs):
    return RewardScorer([RewardFn("r", fn)], log=lambda *a: logs.append(" ".join(map(str, a))))


def test_reward_returning_a_huge_int_is_one_line():
    logs = []
    m, errors = _scorer(lambda completions, **kw: [10 ** 400, 1], logs).score(["p", "q"], ["a", "b"], [[1], [2]], {})
    assert torch.isnan(m[0, 0]) and m[1, 0] == 1.0
    assert len(logs) == 1 and "too large for a float" in logs[0] and "Traceback" not in logs[0]


def test_reward_that_empties_its_inputs_cannot_damage_the_batch():
    def empties(prompts, completions, answer, **kw):
        prompts.clear(), completions.clear(), answer.clear()
        return []
    logs = []
    prompts, completions, cols = ["p", "q"], ["a", "b"], {"answer": ["1", "2"]}
    m, errors = _scorer(empties, logs).score(prompts, completions, [[1], [2]], cols)
    assert prompts == ["p", "q"] and completions == ["a", "b"] and cols["answer"] == ["1", "2"]
    assert errors == 1 and torch.isnan(m).all()
    assert len(logs) == 1 and "returned 0 values for 2 completions" in logs[0] and "Traceback" not in logs[0]


def test_reward_that_empties_its_inputs_in_a_run(tmp_path, monkeypatch, capsys):
    mod = module(tmp_path, monkeypatch, "fe_empties",
                 "def f(prompts, completions, **kw):\n    prompts.clear(); completions.clear()\n    return []\n")
    data = write_rows(tmp_path / "d.jsonl", [{"prompt": f"say {i}:"} for i in range(4)])
    rc = main(["train", "--data", str(data), "--reward", f"{mod}:f", "--out", str(tmp_path / "o")] + FAST)
    err = capsys.readouterr().err
    assert rc == 0 and "Traceback" not in err and "returned 0 values" in err


def test_chat_content_that_is_not_a_string(tmp_path):
    data = write_rows(tmp_path / "d.jsonl", [{"prompt": "ok"}, {"prompt": [{"role": "user", "content": 5}]}])
    with pytest.raises(DataError, match=r"d.jsonl:2: message 1 of 'prompt' has a 'content' of type int"):
        load_jsonl(data)


@pytest.mark.parametrize("key", ["top_k", "threads"])
def test_negative_top_k_or_threads(key, tmp_path, capsys):
    rc = main(["train", "--task", "repeat", "--out", str(tmp_path / "o"), f"--{key}", "-1"] + FAST[:2])
    assert rc == 2 and f"{key}: must be >= 0" in one_line_error(capsys.readouterr().err)


def test_out_that_is_a_file(tmp_path, capsys):
    (tmp_path / "f").write_text("mine")
    rc = main(["train", "--task", "repeat", "--out", str(tmp_path / "f")] + FAST)
    assert rc == 2 and "is a file" in one_line_error(capsys.readouterr().err)
    assert (tmp_path / "f").read_text() == "mine"


def test_out_in_a_read_only_folder(tmp_path, capsys, monkeypatch):
    import grpolab.train.checks as checks
    ro = tmp_path / "ro"
    ro.mkdir()
    ro.chmod(0o555)

    def refuse(dir=None, **kw):  # what a read-only folder does for a non-root user (tests may run as root)
        raise PermissionError(13, "Permission denied")
    monkeypatch.setattr(checks.tempfile, "TemporaryFile", refuse)
    try:
        rc = main(["train", "--task", "repeat", "--out", str(ro / "run")] + FAST)
    finally:
        ro.chmod(0o755)
    assert rc == 2 and "cannot write in" in one_line_error(capsys.readouterr().err)


def test_reward_given_as_a_path(tmp_path, monkeypatch, capsys):
    (tmp_path / "pathmod_fe.py").write_text("def f(completions, **kw):\n    return [0.5]*len(completions)\n")
    monkeypatch.chdir(tmp_path)
    for spec in ("./pathmod_fe:f", "./pathmod_fe.py:f", str(tmp_path / "pathmod_fe.py") + ":f=2"):
        r = parse_reward_spec(spec)
        assert r.name == "f" and r.fn(completions=["a"]) == [0.5]
    assert parse_reward_spec(str(tmp_path / "pathmod_fe.py") + ":f=2").weight == 2.0
    rc = main(["train", "--task", "repeat", "--reward", "./nothere:f", "--out", str(tmp_path / "o")] + FAST)
    assert rc == 2 and "no Python file ./nothere.py" in one_line_error(capsys.readouterr().err)


def test_reward_module_failing_at_import(tmp_path, monkeypatch, capsys):
    module(tmp_path, monkeypatch, "fe_broken", "import math\nx = 1 / 0\n")
    rc = main(["train", "--task", "repeat", "--reward", "fe_broken:f", "--out", str(tmp_path / "o")] + FAST)
    err = one_line_error(capsys.readouterr().err)
    assert rc == 2 and "ZeroDivisionError: division by zero" in err and "fe_broken.py, line 2" in err


def test_eval_stdout_is_strict_json_even_when_a_reward_raises(tmp_path, monkeypatch, capsys):
    mod = module(tmp_path, monkeypatch, "fe_eval_raise", "def f(completions, **kw):\n    raise KeyError('x')\n")
    data = write_rows(tmp_path / "d.jsonl", [{"prompt": f"say {i}:"} for i in range(3)])
    rc = main(["eval", "--model", "tiny", "--data", str(data), "--reward", f"{mod}:f", "--max_completion_length", "3"])
    out, err = capsys.readouterr()
    assert rc == 0
    res = strict_json(out)  # no traceback, no NaN
    assert res["reward_mean"] is None and res["rewards/f/mean"] is None
    assert "KeyError" in err


def test_run_files_have_null_not_nan(tmp_path, monkeypatch):
    mod = module(tmp_path, monkeypatch, "fe_none", "def f(completions, **kw):\n    return [None]*len(completions)\n")
    data = write_rows(tmp_path / "d.jsonl", [{"prompt": f"say {i}:"} for i in range(6)])
    out = tmp_path / "o"
    assert main(["train", "--data", str(data), "--reward", f"{mod}:f", "--out", str(out)] + FAST
                + ["--eval_after", "true", "--eval_problems", "2", "--eval_split", "2"]) == 0
    for line in (out / "metrics.jsonl").read_text().splitlines():
        strict_json(line)
    summary = strict_json((out / "summary.json").read_text())
    assert summary["after"]["reward_mean"] is None


# ----------------------------------------------------------------- 6. settings you can find
def test_train_help_lists_the_options_a_user_needs(capsys):
    with pytest.raises(SystemExit):
        main(["train", "--help"])
    text = capsys.readouterr().out
    for opt in ("--model", "--data", "--task", "--reward", "--recipe", "--steps", "--out", "--config", "--resume",
                "--learning_rate", "--num_generations", "--max_completion_length", "--stall_steps"):
        assert re.search(rf"^\s+{opt} ", text, re.M), opt
    assert "grpolab config KEY" in text and "Precedence" in text


def test_config_key_answers_about_that_key(capsys):
    assert main(["config", "temperature"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("temperature: 0.7") and "sampling temperature" in out and "num_generations" not in out
    assert main(["config", "--recipe", "gpg", "gpg_alpha"]) == 0
    assert "advantage estimator/gpg" in capsys.readouterr().out
    assert main(["config", "gpg_alpha"]) == 0
    assert "which it does not select" in capsys.readouterr().out
    assert main(["config", "temprature"]) == 2
    assert "did you mean temperature" in capsys.readouterr().err


def test_recipes_name_answers_about_that_recipe(capsys):
    assert main(["recipes", "gspo"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("gspo: Group Sequence Policy Optimization") and "sequence_ratio" in out
    assert "dapo" not in out
    assert main(["recipes", "nope"]) == 2
    assert "unknown recipe 'nope'" in capsys.readouterr().err


def test_eval_reads_the_run_settings(tmp_path, capsys):
    out = tmp_path / "o"
    assert main(["train", "--task", "repeat", "--out", str(out)] + FAST
                + ["--max_completion_length", "3", "--eval_problems", "5", "--eval_after", "true"]) == 0
    summary = strict_json((out / "summary.json").read_text())
    capsys.readouterr()
    assert main(["eval", "--model", str(out / "final"), "--compact"]) == 0
    res, err = capsys.readouterr()
    res = strict_json(res)
    assert "settings of the run" in err
    assert res["n"] == 5 and res["accuracy"] == pytest.approx(summary["after"]["accuracy"])
    assert main(["eval", "--model", str(out / "final"), "--compact", "--max_completion_length", "4"]) == 0
    assert strict_json(capsys.readouterr().out)["n"] == 5


def test_cli_recipe_wins_over_the_config_file_recipe(tmp_path):
    cfg_file = tmp_path / "c.yaml"
    cfg_file.write_text("recipe: dapo\n")
    out = tmp_path / "o"
    assert main(["train", "--config", str(cfg_file), "--recipe", "gspo", "--task", "repeat", "--out", str(out),
                 "--steps", "1"] + FAST[:2] + FAST[4:]) == 0
    import yaml
    saved = yaml.safe_load((out / "config.yaml").read_text())
    assert saved["recipe"] == "gspo" and saved["policy_loss"] == "sequence_ratio"
    assert saved["dynamic_sampling"] is False and saved["epsilon"] == pytest.approx(3e-4)  # no DAPO left


def test_config_command_follows_the_same_precedence(tmp_path, capsys):
    cfg_file = tmp_path / "c.yaml"
    cfg_file.write_text("recipe: dapo\n")
    assert main(["config", "--config", str(cfg_file)]) == 0
    assert "dynamic_sampling: true" in capsys.readouterr().out
    assert main(["config", "--config", str(cfg_file), "--recipe", "gspo", "policy_loss"]) == 0
    assert capsys.readouterr().out.startswith("policy_loss: 'sequence_ratio'")


def test_resume_refuses_what_changes_the_algorithm_and_extends_steps(tmp_path, capsys):
    out = tmp_path / "o"
    assert main(["train", "--task", "repeat", "--out", str(out), "--stall_steps", "0"] + FAST) == 0
    capsys.readouterr()
    for extra in (["--recipe", "gspo"], ["--config", str(tmp_path / "c.yaml")], ["--learning_rate", "0.5"],
                  ["--advantage", "leave_one_out"]):
        (tmp_path / "c.yaml").write_text("beta: 0.1\n")
        assert main(["train", "--resume", str(out), "--quiet"] + extra) == 2, extra
        err = one_line_error(capsys.readouterr().err)
        assert "would change what the run trains" in err and "--steps" in err, err
    assert main(["train", "--resume", str(out), "--steps", "3", "--learning_rate", "2e-5", "--quiet"]) == 0
    assert [m["step"] for m in read_metrics(out)] == [1, 2, 3]
