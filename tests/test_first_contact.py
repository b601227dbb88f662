"""What a newcomer meets first (issue 23, rough edges 1-5), each as it was reported: the documented agent examples
run on the tiny model with the default settings, and a prompt that does not fit is refused at start-up; a --data
run whose environment gives the reward needs no --reward; `grpolab sft --steps` does what it says and `sft --help`
lists sft's options; `grpolab doctor` on a folder that is not a run exits 2; `grpolab eval --model RUN/final`
works from any directory and says clearly when the run has no held-out rows."""
import json
import sys
import textwrap

import pytest

from grpolab.cli import main
from grpolab.config import Config
from grpolab.errors import ConfigError


# ----------------------------------------------------------------------------- 1. tools: prompt length
def multiply(a: int, b: int) -> int:
    """
    Multiplies two integers.

    Args:
        a: The first integer.
        b: The second integer.

    Returns:
        The product of the two integers.
    """
    return a * b


TRL_ROWS = [
    {"prompt": [{"role": "user", "content": "What is 3 multiplied by 4?"}], "answer": 12},
    {"prompt": [{"role": "user", "content": "Calculate 7 times 8."}], "answer": 56},
    {"prompt": [{"role": "user", "content": "Find the product of 5 and 6."}], "answer": 30},
    {"prompt": [{"role": "user", "content": "What do you get when you multiply 9 by 2?"}], "answer": 18},
]


def accuracy(completions, answer, **kwargs):
    predictions = [completion[-1]["content"] for completion in completions]
    return [float(str(ans) in pred) for pred, ans in zip(predictions, answer)]


def _trl_args(tmp_path, **extra):
    from grpolab import GRPOConfig
    return GRPOConfig(output_dir=str(tmp_path / "trl"), max_steps=1, per_device_train_batch_size=2,
                      num_generations=2, max_completion_length=8, report_to="none", max_turns=2, **extra)


def test_trls_own_tools_example_runs_on_the_tiny_model(tmp_path):
    """TRL's `tools=[multiply]` example, unchanged but for the model: its tool schemas push the prompt past
    512 tokens, and an agent run's default prompt length leaves room for them."""
    from grpolab import GRPOTrainer
    trainer = GRPOTrainer(model="tiny", train_dataset=TRL_ROWS, tools=[multiply], reward_funcs=accuracy,
                          args=_trl_args(tmp_path))
    assert trainer.cfg.max_prompt_length > 512
    assert trainer.train().global_step == 1


def test_a_prompt_with_tool_schemas_past_the_limit_is_refused_at_start_up(tmp_path):
    """Before any step (at model load, where the tokenizer is known): the length with the schemas, the limit,
    the fix."""
    from grpolab import GRPOTrainer
    with pytest.raises(ConfigError, match=r"with its tool schemas.* \d+ tokens, more than max_prompt_length=200"
                                          r".*--max_prompt_length"):
        GRPOTrainer(model="tiny", train_dataset=TRL_ROWS, tools=[multiply], reward_funcs=accuracy,
                    args=_trl_args(tmp_path, max_prompt_length=200))


def test_agent_runs_get_their_own_default_prompt_length_and_a_given_one_wins():
    from grpolab.agents.rollout import AGENT_MAX_PROMPT_LENGTH
    assert Config.build({}).max_prompt_length == 512
    assert Config.build({"rollout_strategy": "agent"}).max_prompt_length == AGENT_MAX_PROMPT_LENGTH
    assert Config.build({"task": "calculator", "rollout_strategy": "agent"}).max_prompt_length > 512
    assert Config.build({"rollout_strategy": "agent", "max_prompt_length": 300}).max_prompt_length == 300
    assert Config.build({"rollout_strategy": "agent"}, {"max_prompt_length": 512}).max_prompt_length == 512


def test_search_qa_starts_on_the_tiny_model_with_the_defaults(tmp_path):
    """`--task search_qa` (its prompts carry a worked example and the search tool's schema) starts: every
    prompt, with the schemas, fits the agent default."""
    from grpolab.cli import select_agent_strategy
    from grpolab.train.trainer import Trainer
    layers = {"model": "tiny", "task": "search_qa", "out": str(tmp_path / "sq"), "tensorboard": False}
    select_agent_strategy(layers)
    Trainer(Config.build(layers), log=lambda *a: None)


def test_the_readmes_tools_command_runs_on_the_tiny_model(tmp_path, monkeypatch):
    """README: `grpolab train --task arithmetic --tools my_tools:add`."""
    (tmp_path / "first_contact_tools.py").write_text(textwrap.dedent('''
        def add(a: int, b: int) -> int:
            """Add two integers.

            Args:
                a: the first integer
                b: the second integer
            """
            return a + b
    '''))
    monkeypatch.syspath_prepend(str(tmp_path))
    assert main(["train", "--task", "arithmetic", "--tools", "first_contact_tools:add", "--model", "tiny",
                 "--steps", "1", "--prompts_per_step", "2", "--num_generations", "2", "--max_completion_length", "6",
                 "--max_turns", "2", "--eval_before", "false", "--eval_after", "false", "--tensorboard", "false",
                 "--out", str(tmp_path / "run"), "--quiet"]) == 0


# ----------------------------------------------------------------------------- 2. the environment's reward
GAME = '''
class Game:
    def reset(self, seed=None, **row):
        self.target = str(row.get("target", "7"))
        return "Guess a digit."

    def step(self, action):
        done = action.strip()[-1:] == self.target
        return ("correct" if done else "wrong"), float(done), done, {}
'''


def test_data_with_a_gym_environment_that_rewards_needs_no_reward(tmp_path, monkeypatch, capsys):
    (tmp_path / "first_contact_env.py").write_text(GAME)
    monkeypatch.syspath_prepend(str(tmp_path))
    data = tmp_path / "my.jsonl"
    data.write_text("".join(json.dumps({"prompt": f"guess {i}", "target": str(i % 10)}) + "\n" for i in range(12)))
    out = tmp_path / "run"
    assert main(["train", "--model", "tiny", "--data", str(data), "--env", "first_contact_env:Game", "--steps", "1",
                 "--prompts_per_step", "2", "--num_generations", "2", "--max_completion_length", "4",
                 "--max_turns", "2", "--tensorboard", "false", "--out", str(out), "--quiet"]) == 0
    m = json.loads((out / "metrics.jsonl").read_text().splitlines()[-1])
    assert "rewards/env_reward/mean" in m


def test_data_with_tools_only_still_needs_a_reward_and_says_why(tmp_path):
    data = tmp_path / "my.jsonl"
    data.write_text(json.dumps({"prompt": "x"}) + "\n")
    with pytest.raises(ConfigError, match="--reward"):
        Config.build({"data": str(data), "rollout_strategy": "agent", "tools": ["m:f"]})
    with pytest.raises(ConfigError, match="env_reward_weight"):  # an environment whose reward counts for 0
        Config.build({"data": str(data), "rollout_strategy": "agent", "environment": "m:Game",
                      "env_reward_weight": 0})


# ----------------------------------------------------------------------------- 3. sft --steps
def _sft_data(tmp_path):
    data = tmp_path / "sft.jsonl"
    data.write_text("".join(json.dumps({"prompt": f"{i} + 1 =", "completion": f"Answer: {i + 1}"}) + "\n"
                            for i in range(6)))
    return data


def test_sft_steps_is_the_number_of_steps(tmp_path):
    out = tmp_path / "sft"
    assert main(["sft", "--model", "tiny", "--data", str(_sft_data(tmp_path)), "--out", str(out), "--steps", "2",
                 "--threads", "1"]) == 0
    summary = json.loads((out / "sft_summary.json").read_text())
    assert summary["steps"] == 2 and len(summary["losses"]) == 2


def test_sft_refuses_a_train_key_it_would_ignore(tmp_path, capsys):
    assert main(["sft", "--model", "tiny", "--data", str(_sft_data(tmp_path)), "--out", str(tmp_path / "s"),
                 "--learning_rate", "0.1"]) == 2
    assert "--sft_learning_rate" in capsys.readouterr().err
    assert not (tmp_path / "s").exists()


def test_sft_help_lists_its_options(capsys):
    with pytest.raises(SystemExit) as e:
        main(["sft", "--help"])
    assert e.value.code == 0
    text = capsys.readouterr().out
    for option in ("--steps", "--sft_batch_size", "--sft_learning_rate", "--sft_max_length", "--sft_mode",
                   "--ton_dropout_prob", "--seed"):
        assert option in text, option


# ----------------------------------------------------------------------------- 4. doctor
def test_doctor_on_a_folder_that_is_not_a_run_exits_2(tmp_path, capsys):
    folder = tmp_path / "configs"
    folder.mkdir()
    (folder / "config.yaml").write_text("model: tiny\ntask: repeat\n")  # a user's config, not a run
    assert main(["doctor", str(folder)]) == 2
    err = capsys.readouterr()
    assert "not a run folder" in err.err and "healthy" not in err.out


# ----------------------------------------------------------------------------- 5. eval --model RUN/final
REWARD = '''
def ends_with_digit(completions, **kw):
    return [float(str(c).strip()[-1:].isdigit()) for c in completions]
'''


def _train_from(project, monkeypatch, name, eval_split):
    """A run trained from ``project`` with relative --data and --reward, as a user types them."""
    monkeypatch.chdir(project)
    (project / f"{name}_rewards.py").write_text(REWARD)
    (project / "data").mkdir(exist_ok=True)
    (project / "data" / "my.jsonl").write_text("".join(json.dumps({"prompt": f"say {i}"}) + "\n" for i in range(12)))
    assert main(["train", "--model", "tiny", "--data", "data/my.jsonl", "--reward", f"{name}_rewards:ends_with_digit",
                 "--steps", "1", "--prompts_per_step", "2", "--num_generations", "2", "--max_completion_length", "4",
                 "--eval_split", str(eval_split), "--eval_before", "false", "--eval_after", "false",
                 "--tensorboard", "false", "--out", "runs/r", "--quiet"]) == 0
    return project / "runs" / "r"


def _forget(module: str, folder) -> None:
    """As in a new process started elsewhere: the reward module is not imported and its folder not on sys.path."""
    sys.modules.pop(module, None)
    sys.path[:] = [p for p in sys.path if p not in (str(folder), "")]


def test_eval_of_a_run_from_another_directory(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(sys, "path", list(sys.path))
    project = tmp_path / "project"
    project.mkdir()
    run = _train_from(project, monkeypatch, "fc_eval_a", eval_split=3)
    _forget("fc_eval_a_rewards", project)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    capsys.readouterr()
    assert main(["eval", "--model", str(run / "final"), "--compact"]) == 0
    res = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert res["n"] == 3
    assert "data/my.jsonl" in (run / "config.yaml").read_text()  # the config keeps the paths as typed


def test_eval_of_a_run_without_held_out_rows_says_so(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(sys, "path", list(sys.path))
    project = tmp_path / "project"
    project.mkdir()
    run = _train_from(project, monkeypatch, "fc_eval_b", eval_split=0)
    capsys.readouterr()
    assert main(["eval", "--model", str(run / "final")]) == 2
    err = capsys.readouterr().err
    assert "no held-out rows" in err and "--data" in err and "Traceback" not in err
