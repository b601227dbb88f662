"""Control runs as a user drives them (issue 42): `grpolab eval` of a saved control run, PettingZoo AEC
(turn-taking) games with action masks, and `--data` rows of start states from the command line."""
import json

import gymnasium as gym
import numpy as np
import pytest
import torch

from grpolab.cli import main
from grpolab.policies.control.policy import ControlPolicy

TTT = "pettingzoo:pettingzoo.classic.tictactoe_v3"
SMALL = ["--max_completion_length", "20", "--prompts_per_step", "2", "--num_generations", "2", "--threads", "1",
         "--tensorboard", "false"]


@pytest.mark.parametrize("recipe, extra", [("grpo_control", SMALL),
                                           ("mardpg", ["--threads", "1", "--tensorboard", "false"])])
def test_eval_of_a_saved_control_run_equals_its_after_evaluation(tmp_path, capsys, recipe, extra):
    """RUN/final of policy control or mardpg loads with no train rows (its spaces checked against the held-out rows'
    environment), and `grpolab eval` gives the run's own `after` numbers."""
    out = tmp_path / "run"
    assert main(["train", "--recipe", recipe, "--steps", "2", "--control_eval_starts", "3", *extra,
                 "--out", str(out)]) == 0
    after = json.loads((out / "summary.json").read_text())["after"]
    capsys.readouterr()
    assert main(["eval", "--model", str(out / "final"), "--compact"]) == 0
    res = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert res["n"] == 3 and res["reward_mean"] == pytest.approx(after["reward_mean"], abs=1e-9), (res, after)


def test_aec_game_moves_are_legal_and_logprobs_recomputed():
    """tic-tac-toe through PettingZoo's AEC API: the learner's sampled moves are legal under each step's
    action_mask, the masked log-probs are recomputed by forward, the seat comes from the row's 'agent'."""
    p = ControlPolicy(model="mlp", temperature=1.0, max_completion_length=9)
    rows = [{"env": TTT, "seed": 0}, {"env": TTT, "seed": 1, "agent": "player_2"}]
    m = p.load(None, rows, [], log=lambda *a: None)
    b = p.sample(m, rows, [0, 1], num_generations=4, generator=torch.Generator().manual_seed(0))
    mask, act, on = b.step_data["action_mask"], b.step_data["action"], b.completion_attention_mask > 0
    assert mask[on].gather(-1, act[on][:, None]).all()
    assert not mask[on].all()  # later moves have fewer legal squares
    assert set(b.columns["completion"]) <= {-1.0, 0.0, 1.0}
    out = p.forward(m, b, grad=False)
    assert torch.allclose(out["logprobs"], b.behavior_logprobs, atol=1e-5)
    # the same seed, the same seat: the same first observation; player_2 sees player_1's first move
    first = b.step_data["obs"][:, 0]
    assert torch.equal(first[0], first[3]) and first[0].sum() == 0 and first[4].sum() == 1


def test_documented_data_rows_train_from_the_command_line(tmp_path):
    data = tmp_path / "rows.jsonl"
    data.write_text("".join(json.dumps({"prompt": f"CartPole-v1 seed {s}", "env": "CartPole-v1", "env_kwargs": {},
                                        "seed": s}) + "\n" for s in range(6)))
    out = tmp_path / "run"
    assert main(["train", "--recipe", "grpo_control", "--data", str(data), "--reward",
                 "grpolab.policies.control.tasks:episode_return", "--steps", "1", *SMALL, "--out", str(out)]) == 0
    assert json.loads((out / "summary.json").read_text())["after"]["reward_mean"] > 0


def test_a_gru_mardpg_without_train_rows_names_what_to_give():
    from grpolab.errors import ConfigError
    from grpolab.policies.mardpg.policy import MARDPGPolicy

    with pytest.raises(ConfigError, match="no train rows .* a saved run's folder"):
        MARDPGPolicy(model="gru", temperature=1.0, max_completion_length=10).load(None, [], [], log=lambda *a: None)


class Coin(gym.Env):
    """A one-step Gymnasium game: observation [bias], action 0/1, reward 1 for the action the bias favours."""
    observation_space = gym.spaces.Box(-1.0, 1.0, (1,), np.float32)
    action_space = gym.spaces.Discrete(2)

    def __init__(self, bias: float = 0.5):
        self.bias = bias

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        return np.array([self.bias], np.float32), {}

    def step(self, action):
        return np.array([self.bias], np.float32), float(int(action) == int(self.bias > 0)), True, False, {}


@pytest.mark.parametrize("given", ["instance", "factory", "id"])
def test_the_python_api_takes_an_environment_by_instance_factory_or_id(tmp_path, given):
    """GRPOTrainer rows with an 'env' column select policy control; 'env' may be a gymnasium.Env instance, a
    factory (called with the row's env_kwargs) or a registered id; the run trains and saves its actor."""
    from grpolab import GRPOConfig, GRPOTrainer
    from grpolab.policies.control.tasks import episode_return

    env = {"instance": Coin(0.5), "factory": lambda bias=0.0: Coin(bias), "id": "CartPole-v1"}[given]
    kwargs = {"factory": {"bias": -0.5}}.get(given, {})
    rows = [{"prompt": f"start {s}", "env": env, "env_kwargs": kwargs, "seed": s} for s in range(4)]
    args = GRPOConfig(output_dir=str(tmp_path / "run"), max_steps=1, per_device_train_batch_size=4,
                      num_generations=2, max_completion_length=20, report_to="none", threads=1)
    trainer = GRPOTrainer(model="mlp", reward_funcs=episode_return, train_dataset=rows, args=args)
    assert trainer.cfg.policy == "control"
    trainer.train()
    assert (tmp_path / "run" / "final" / "config.json").exists()
    if given != "id":  # the registered id names the object, once
        from grpolab.policies._control.envs import env_id_of
        assert env_id_of(env, "x") == env_id_of(env, "y") and env_id_of(env, "x").startswith("grpolab_user/")


def test_an_environment_instance_refuses_env_kwargs_and_a_non_env_is_named():
    from grpolab.errors import ConfigError
    from grpolab.policies._control.envs import env_id_of, make_env

    with pytest.raises(ConfigError, match="env_kwargs .* cannot be applied to an environment instance"):
        make_env(env_id_of(Coin(0.5), "row 0"), {"bias": 1.0})
    with pytest.raises(ConfigError, match="'env' must be a Gymnasium id"):
        env_id_of(3, "row 0")
