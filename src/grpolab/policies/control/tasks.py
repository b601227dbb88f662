"""``gym_control``: start states of a Gymnasium or PettingZoo environment, for policy ``control``.

Rows: ``{"prompt": "CartPole-v1 seed 3", "env": "CartPole-v1", "env_kwargs": {...}, "seed": 3}``; train seeds
``0 .. control_train_starts - 1``, held-out seeds ``100000 + 0 .. control_eval_starts - 1`` (the same for every
run seed: the run's ``seed`` draws the network and the actions, not the instances). Rewards:

* ``episode_return`` (weight 1): the episode's return (policy control's completion; the mean over agents of
  each agent's summed reward);
* ``episode_solved`` (the accuracy, when a threshold is known): 1.0 when the return reaches
  ``control_success_return`` (default: the environment's registered ``reward_threshold``, e.g. 475 for
  CartPole-v1; none for PettingZoo environments).
"""
from __future__ import annotations

import math

from ...errors import ConfigError
from ...registry import TASKS, param
from ...tasks.base import Task

EVAL_SEED_BASE = 100_000


def _returns(reward: str, completions) -> list[float]:
    if completions is None:
        raise ValueError(f"reward '{reward}': no completions given (expected episode returns, numbers)")
    out = []
    for c in completions:
        try:
            v = float(c)
        except (TypeError, ValueError):
            raise ValueError(f"reward '{reward}' scores episodes: each completion must be the episode's return "
                             f"(a number), as policy control passes it; got {type(c).__name__}") from None
        out.append(v)
    return out


def episode_return(prompts=None, completions=None, **kwargs) -> list[float]:
    """The episode's return, as policy control reports it. Source: [ours]."""
    return _returns("episode_return", completions)


def solved(threshold: float):
    def episode_solved(prompts=None, completions=None, **kwargs) -> list[float]:
        """1.0 when the return reaches the success threshold. Source: [ours]."""
        return [float(v >= threshold) for v in _returns("episode_solved", completions)]
    return episode_solved


def reward_threshold(env: str) -> float | None:
    """The registered ``reward_threshold`` of a Gymnasium id (None for PettingZoo or when unset)."""
    if env.startswith("pettingzoo:"):
        return None
    import gymnasium as gym
    try:
        spec = gym.spec(env)
    except gym.error.Error:
        return None
    return spec.reward_threshold


@TASKS.register("gym_control", needs=("control",))
def gym_control(*, control_env: str = param("CartPole-v1", "gym_control: the environment, a Gymnasium id or "
                                            "pettingzoo:<module> (e.g. pettingzoo:mpe2.simple_spread_v3)"),
                control_env_kwargs: dict = param({}, "gym_control: keyword arguments of the environment's "
                                                 "constructor (gymnasium.make / parallel_env)"),
                control_train_starts: int = param(64, "gym_control: train rows (start seeds 0..n-1)"),
                control_eval_starts: int = param(8, "gym_control: held-out rows (start seeds 100000..)"),
                control_success_return: float | None = param(None, "gym_control: a return at or above it counts "
                                                             "as solved (the accuracy); default the environment's "
                                                             "registered reward_threshold")) -> Task:
    """Start states of one environment (module docstring); for policy ``control``.

    Provenance: grpolab's own — a task instance is a seeded start state, so a GRPO group is G episodes from it.
    """
    if control_train_starts < 1 or control_eval_starts < 0:
        raise ConfigError(f"control_train_starts >= 1 and control_eval_starts >= 0, got {control_train_starts}, "
                          f"{control_eval_starts}")
    kw = dict(control_env_kwargs or {})

    def row(seed: int) -> dict:
        return {"prompt": f"{control_env} seed {seed}", "env": control_env, "env_kwargs": kw, "seed": seed}

    threshold = control_success_return if control_success_return is not None else reward_threshold(control_env)
    rewards = [("episode_return", episode_return, 1.0)]
    if threshold is not None and math.isfinite(float(threshold)):
        rewards.append(("episode_solved", solved(float(threshold)), 0.0))
    return Task("gym_control", [row(s) for s in range(control_train_starts)],
                [row(EVAL_SEED_BASE + s) for s in range(control_eval_starts)], rewards=rewards,
                accuracy_reward="episode_solved" if len(rewards) > 1 else None,
                description=f"start states of {control_env}", extra={})
