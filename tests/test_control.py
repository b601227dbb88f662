"""The control policy (policies/control/policy.py), its environments and networks (control/), task gym_control and the
PPO baseline's advantage control_gae (policies/control/critic.py)."""
import math

import pytest
import torch

from grpolab.policies.control.critic import ControlGAE, agent_columns, agent_sequences
from grpolab.algorithms.gae import gae
from grpolab.batch import RolloutBatch
from grpolab.config import Config
from grpolab.errors import ConfigError
from grpolab.policies.control.policy import ControlPolicy
from grpolab.tasks.base import get_task

from _helpers import LEARNING_SEEDS


def policy(max_steps=500, **kw):
    return ControlPolicy(model="mlp", temperature=1.0, max_completion_length=max_steps, **kw)


def rows(env, seeds, **kw):
    return [{"prompt": f"{env} {s}", "env": env, "seed": s, "env_kwargs": kw} for s in seeds]


def test_a_group_is_episodes_from_one_start_state():
    """G episodes of a row start from the same state (its seed); other rows' seeds give other states."""
    p = policy(max_steps=30)
    r = rows("CartPole-v1", [3, 4])
    torch.manual_seed(0)
    m = p.load(None, r, [], log=lambda *a: None)
    b = p.sample(m, r, [0, 1], num_generations=3, generator=torch.Generator().manual_seed(0))
    first = b.step_data["obs"][:, 0]  # [6, 4]
    assert torch.equal(first[0], first[1]) and torch.equal(first[0], first[2])
    assert torch.equal(first[3], first[5]) and not torch.equal(first[0], first[3])
    assert b.group_ids.tolist() == [0, 0, 0, 1, 1, 1]
    # the return is the number of steps (CartPole pays 1 per step), the mask covers exactly those steps
    assert b.columns["completion"] == [float(n) for n in b.columns["episode_length"]]
    assert b.completion_mask.sum(1).tolist() == [float(n) for n in b.columns["episode_length"]]
    assert torch.equal(b.row_data["step_rewards"].sum(1), torch.tensor(b.columns["completion"]))
    # episodes cut by max_completion_length (30) are truncated; the others ended in a terminal state
    for i, n in enumerate(b.columns["episode_length"]):
        assert bool(b.truncated[i]) == (n == 30) and bool(b.row_data["terminal"][i]) == (n < 30)


@pytest.mark.parametrize("env", ["CartPole-v1", "Pendulum-v1"])
def test_forward_recomputes_the_behaviour_logprobs(env):
    p = policy(max_steps=12)
    r = rows(env, [0, 1])
    torch.manual_seed(1)
    m = p.load(None, r, [], log=lambda *a: None)
    b = p.sample(m, r, [0, 1], num_generations=2, generator=torch.Generator().manual_seed(5))
    out = p.forward(m, b, want=frozenset({"entropy"}), grad=False)
    mask = b.completion_mask
    assert torch.allclose(out["logprobs"] * mask, b.behavior_logprobs, atol=1e-5)
    assert (out["entropy"][mask > 0] > 0).all()
    # the same seeded generator draws the same episodes
    b2 = p.sample(m, r, [0, 1], num_generations=2, generator=torch.Generator().manual_seed(5))
    assert torch.equal(b.step_data["action"], b2.step_data["action"])


def test_logprobs_by_hand():
    """A zero output layer: categorical = uniform over CartPole's 2 actions, log 0.5; Gaussian mean 0 with
    log_std = log 0.5: log N(0.3; 0, 0.5) = -0.5 (0.3 / 0.5)^2 - log 0.5 - 0.5 log(2 pi)
    = -0.18 + 0.693147 - 0.918939 = -0.405792."""
    from grpolab.policies.control.nets import ControlActor
    cat = ControlActor(4, 1, True, 2)
    gau = ControlActor(3, 1, False, 1, log_std_init=math.log(0.5))
    for a in (cat, gau):
        torch.nn.init.zeros_(a.net[-1].weight)
    x = torch.randn(1, 4)
    assert math.isclose(float(cat.log_prob(x, torch.tensor([1]))[0].detach()), math.log(0.5), abs_tol=1e-6)
    lp, ent = gau.log_prob(torch.randn(1, 3), torch.tensor([[0.3]]), entropy=True)
    lp, ent = lp.detach(), ent.detach()
    assert math.isclose(float(lp), -0.405792, abs_tol=1e-5)
    # entropy of N(0, 0.5^2) = 0.5 log(2 pi e 0.25) = 0.725791
    assert math.isclose(float(ent), 0.725791, abs_tol=1e-5)
    # temperature 2 doubles the std: log N(0.3; 0, 1) = -0.045 - 0.918939 = -0.963939
    assert math.isclose(float(gau.log_prob(torch.randn(1, 3), torch.tensor([[0.3]]), 2.0)[0].detach()), -0.963939,
                        abs_tol=1e-5)


def test_gae_by_hand():
    # rewards [1, 1, 1], V = 0.5 everywhere, gamma 0.9, lambda 0.8 (gamma lambda = 0.72)
    # bootstrap 0.5: every delta = 1 + 0.45 - 0.5 = 0.95; A2 = 0.95, A1 = 0.95 + 0.72 * 0.95 = 1.634,
    # A0 = 0.95 + 0.72 * 1.634 = 2.12648; terminal (bootstrap 0): delta2 = 0.5, A2 = 0.5, A1 = 0.95 + 0.36 = 1.31,
    # A0 = 0.95 + 0.72 * 1.31 = 1.8932. A row of length 2 in a width-3 batch stops at its own length.
    r = torch.tensor([[1., 1., 1.], [1., 1., 1.], [1., 1., 0.]])
    v = torch.full((3, 3), 0.5)
    adv, ret = gae(r, v, torch.tensor([3, 3, 2]), torch.tensor([0.5, 0.0, 0.0]), 0.9, 0.8)
    assert torch.allclose(adv[0], torch.tensor([2.12648, 1.634, 0.95], dtype=torch.float64))
    assert torch.allclose(adv[1], torch.tensor([1.8932, 1.31, 0.5], dtype=torch.float64))
    # length 2, terminal: A1 = 1 - 0.5 = 0.5, A0 = 0.95 + 0.72 * 0.5 = 1.31, nothing past the end
    assert torch.allclose(adv[2], torch.tensor([1.31, 0.5, 0.0], dtype=torch.float64))
    assert torch.allclose(ret[0], adv[0] + 0.5)


def _hand_batch(agents=1):
    """One episode of 3 steps per agent, rewards 1 per step; observations zeros (the value is its bias)."""
    T, N = 3, agents
    mask = torch.ones(1, T * N)
    return RolloutBatch(prompt_ids=torch.zeros(1, 1, dtype=torch.long), prompt_mask=torch.ones(1, 1, dtype=torch.long),
                        completion_ids=torch.arange(T * N)[None], completion_mask=mask,
                        behavior_logprobs=torch.zeros(1, T * N), completion_attention_mask=mask.long(),
                        group_ids=torch.zeros(1, dtype=torch.long), prompt_uids=torch.zeros(1, dtype=torch.long),
                        truncated=torch.zeros(1, dtype=torch.bool), columns={},
                        step_data={"obs": torch.zeros(1, T * N, 2)},
                        row_data={"step_rewards": torch.tensor([[1., 2.] * 3 if N == 2 else [1.] * 3]),
                                  "terminal": torch.tensor([False]), "last_obs": torch.zeros(1, N, 2),
                                  "agents": torch.tensor([N])})


@pytest.mark.parametrize("agents", [1, 2])
def test_control_gae_by_hand(agents):
    """The value network set to the constant 0.5 (zero weights out, bias 0.5): advantages as test_gae_by_hand's
    bootstrapped row, per agent; with two agents the second agent's rewards are 2 per step: delta = 2 + 0.45 - 0.5
    = 1.95, A2 = 1.95, A1 = 1.95 * 1.72 = 3.354, A0 = 1.95 + 0.72 * 3.354 = 4.36488, in columns t*2 + 1."""
    c = ControlGAE(control_gamma=0.9, control_gae_lambda=0.8, control_whiten=False, control_value_epochs=0)
    c._build(2)
    torch.nn.init.zeros_(c.value.net[-1].weight)
    torch.nn.init.constant_(c.value.net[-1].bias, 0.5)
    b = _hand_batch(agents)
    adv = c(torch.zeros(1), torch.zeros(1, dtype=torch.long), batch=b)
    want0 = [2.12648, 1.634, 0.95]
    if agents == 1:
        assert torch.allclose(adv[0], torch.tensor(want0), atol=1e-5)
    else:
        assert torch.allclose(adv[0, 0::2], torch.tensor(want0), atol=1e-5)
        assert torch.allclose(adv[0, 1::2], torch.tensor([4.36488, 3.354, 1.95]), atol=1e-5)
    # the value fit moves V toward fixed targets: the MSE on them falls
    c2 = ControlGAE(control_value_epochs=50, control_value_minibatch=4)
    c2._build(2)
    x = torch.randn(16, 2, generator=torch.Generator().manual_seed(0))
    y = 2 * x[:, 0] - x[:, 1] + 1
    with torch.no_grad():
        before = float((c2.value(x) - y).pow(2).mean())
    c2._fit(x, y)
    with torch.no_grad():
        assert float((c2.value(x) - y).pow(2).mean()) < 0.5 * before


def test_agent_layout_round_trip():
    x = torch.arange(2 * 6).reshape(2, 6)  # 2 rows, 3 steps x 2 agents
    s = agent_sequences(x, 2)
    assert s.tolist() == [[0, 2, 4], [1, 3, 5], [6, 8, 10], [7, 9, 11]]
    assert torch.equal(agent_columns(s, 2), x)


def test_several_agents_share_one_actor():
    """MPE2 simple_spread (3 agents, 18 numbers each, 5 actions): columns t*3 + i, inputs with the one-hot."""
    p = policy(max_steps=4)
    r = rows("pettingzoo:mpe2.simple_spread_v3", [0], N=3, max_cycles=25)
    torch.manual_seed(0)
    m = p.load(None, r, [], log=lambda *a: None)
    b = p.sample(m, r, [0], num_generations=2, generator=torch.Generator().manual_seed(0))
    assert b.completion_mask.shape == (2, 12) and b.step_data["obs"].shape == (2, 12, 21)
    assert torch.equal(b.step_data["obs"][0, :3, 18:], torch.eye(3))
    assert b.row_data["agent_returns"].shape == (2, 3)
    assert torch.allclose(torch.tensor(b.columns["completion"]), b.row_data["agent_returns"].mean(1))
    out = p.forward(m, b, grad=False)
    assert torch.allclose(out["logprobs"], b.behavior_logprobs, atol=1e-5)


def test_bad_rows_name_the_problem():
    p = policy()
    with pytest.raises(ConfigError, match="no 'env' column"):
        p.load(None, [{"seed": 0}], [], log=lambda *a: None)
    with pytest.raises(ConfigError, match="integer 'seed'"):
        p.load(None, [{"env": "CartPole-v1", "seed": "x"}], [], log=lambda *a: None)
    with pytest.raises(ConfigError, match="gymnasium.make failed"):
        p.load(None, [{"env": "NoSuchEnv-v9", "seed": 0}], [], log=lambda *a: None)
    with pytest.raises(ConfigError, match="env_kwargs .* were refused"):
        p.load(None, rows("CartPole-v1", [0], no_such_option=1), [], log=lambda *a: None)
    with pytest.raises(ConfigError, match="other spaces"):
        p.load(None, rows("CartPole-v1", [0]) + rows("Pendulum-v1", [0]), [], log=lambda *a: None)


def test_task_rows_and_rewards():
    t = get_task("gym_control", control_env="CartPole-v1", control_train_starts=3, control_eval_starts=2)
    assert [r["seed"] for r in t.train_rows] == [0, 1, 2] and [r["seed"] for r in t.eval_rows] == [100000, 100001]
    fns = {n: f for n, f, _ in t.rewards}
    assert fns["episode_return"](completions=[3.0, 500.0]) == [3.0, 500.0]
    assert fns["episode_solved"](completions=[474.0, 475.0]) == [0.0, 1.0]  # CartPole-v1's threshold: 475
    with pytest.raises(ValueError, match="episode's return"):
        fns["episode_return"](completions=["text"])


def test_save_and_load_round_trip(tmp_path):
    p = policy(max_steps=5)
    r = rows("CartPole-v1", [0])
    m = p.load(None, r, [], log=lambda *a: None)
    p.save(m, tmp_path / "m")
    q = ControlPolicy(model=str(tmp_path / "m"), temperature=1.0, max_completion_length=5)
    m2 = q.load(None, r, [], log=lambda *a: None)
    assert all(torch.equal(a, b) for a, b in zip(m.state_dict().values(), m2.state_dict().values()))
    with pytest.raises(ConfigError, match="was saved for"):
        q.load(None, rows("Acrobot-v1", [0]), [], log=lambda *a: None)


@pytest.mark.parametrize("seed", LEARNING_SEEDS)
@pytest.mark.parametrize("recipe", ["grpo_control", "ppo_control"])
def test_control_recipes_raise_the_held_out_return_on_every_seed(tmp_path, recipe, seed):
    """CartPole-v1, 8 steps of 32 episodes; the deterministic policy's mean return on the 8 held-out starts.
    Measured (`python` with Trainer, one thread; before -> after, seeds 0 / 1 / 2): grpo_control 8.6 -> 203.5,
    213.3 -> 323.1, 108.5 -> 228.5 (smallest rise 110); ppo_control 8.6 -> 266.4, 213.3 -> 421.1,
    108.5 -> 399.8 (smallest rise 208). Asserted: a rise of 60."""
    from grpolab.recipes import recipe_overrides
    from grpolab.train.trainer import Trainer

    cfg = Config.build({**recipe_overrides(recipe), "steps": 8, "seed": seed, "save_steps": 100,
                        "out": str(tmp_path / "run"), "stall_steps": 0, "threads": 1})
    s = Trainer(cfg, log=lambda *a: None).train(progress=False)
    before, after = s["before"]["reward_mean"], s["after"]["reward_mean"]
    assert after > before + 60, (before, after)


def test_compare_runs_control_recipes_and_shows_returns_unscaled(tmp_path):
    """grpolab compare on GRPO against PPO (one seed, 2 steps): the table shows the
    held-out return as it is (a return is not a share, so not in points). Episodes of at most 20 steps."""
    import json

    from grpolab.compare import main

    out = tmp_path / "cmp"
    rc = main(["--recipes", "grpo_control,ppo_control", "--seeds", "0", "--steps", "2", "--metric", "reward_mean",
               "--max_completion_length", "20", "--prompts_per_step", "2", "--num_generations", "2",
               "--control_eval_starts", "2", "--threads", "1", "--tensorboard", "false", "--no-report", "--out", str(out)], log=lambda *a: None)
    assert rc == 0
    md = (out / "compare.md").read_text()
    assert "in points" not in md
    for arm in ("grpo_control", "ppo_control"):
        after = json.loads((out / "runs" / arm / "seed0" / "summary.json").read_text())["after"]["reward_mean"]
        row = next(line for line in md.splitlines() if line.startswith(f"| `{arm}` |"))
        assert f"| {after:.1f} (n=1) |" in row, (row, after)


def test_env_kwargs_from_the_command_line_and_a_failed_compare_run(tmp_path):
    """--control_env_kwargs takes a JSON object on the command line; compare reports a run that fails at start-up
    (here an environment option the environment does not take) as a failure instead of crashing."""
    from grpolab.compare import main
    from grpolab.recipes import recipe_overrides

    r = recipe_overrides("grpo_control")
    assert Config.build({**r, "control_env_kwargs": '{"N": 3}'}).params["control_env_kwargs"] == {"N": 3}
    with pytest.raises(ConfigError, match="control_env_kwargs.*JSON object"):
        Config.build({**r, "control_env_kwargs": "{N: 3"})
    lines = []
    rc = main(["--recipes", "grpo_control", "--seeds", "0", "--steps", "1", "--metric", "reward_mean",
               "--control_env_kwargs", '{"no_such_option": 1}', "--no-report", "--out", str(tmp_path / "c")],
              log=lines.append)
    assert rc != 0 and any("FAILED" in str(x) for x in lines), lines
