"""Constrained Gymnasium tasks: each step reports a cost in ``info["cost"]`` beside the reward (the
constrained MDP of safe RL: maximise the return subject to ``E[sum of costs] <= limit``). Importing this module
registers:

- ``grpolab/SpeedLimitPoint-v0``: a point running along a line, velocity ``a_t in [-1, 1]`` (the action,
  clipped), ``x_{t+1} = x_t + 0.25 a_t``, start ``x_0 = U(-0.1, 0.1)``; reward the velocity ``a_t``; cost
  ``1[|a_t| > 0.5]`` (a speed limit: CAL's velocity-constrained MuJoCo tasks in miniature, reward = forward
  velocity, cost = speeding); 20 steps (a time limit, no terminal state); observation ``[x_t / 5, t / 20]``.
  Full speed: return 20, cost 20 per episode; at the limit: return 10, cost 0; a budget B allows about
  ``10 + B / 2``.
- ``grpolab/SafePendulum-v1``: Pendulum-v1 with cost ``1[|a_t| > cost_threshold]`` (default 1.0 of the torque
  range [-2, 2]), via :class:`ActionCostWrapper`.

Why not safety-gymnasium: its 1.0.0 release pins gymnasium 0.28.1 and mujoco 2.3.3 (wheel metadata), and
grpolab's control extra ships gymnasium 1.3.0.
"""
from __future__ import annotations

import gymnasium as gym
import numpy as np
from gymnasium import spaces


class SpeedLimitPoint(gym.Env):
    """The 1-D speed-limited reach task (module docstring)."""

    metadata = {"render_modes": []}

    def __init__(self, speed_limit: float = 0.5, step_size: float = 0.25, horizon: int = 20):
        self.speed_limit, self.step_size, self.horizon = float(speed_limit), float(step_size), int(horizon)
        self.observation_space = spaces.Box(np.array([-1.0, 0.0], np.float32), np.array([1.0, 1.0], np.float32))
        self.action_space = spaces.Box(-1.0, 1.0, (1,), np.float32)
        self.x, self.t = -1.0, 0

    def _obs(self) -> np.ndarray:
        return np.array([self.x / 5, self.t / self.horizon], np.float32)

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.x, self.t = float(self.np_random.uniform(-0.1, 0.1)), 0
        return self._obs(), {}

    def step(self, action):
        a = float(np.clip(np.asarray(action, np.float32).reshape(-1)[0], -1.0, 1.0))
        self.x += self.step_size * a
        self.t += 1
        cost = float(abs(a) > self.speed_limit)
        return self._obs(), a, False, self.t >= self.horizon, {"cost": cost}


class ActionCostWrapper(gym.Wrapper):
    """Adds ``info["cost"] = 1[max_j |a_j| > cost_threshold]`` to any Box-action environment."""

    def __init__(self, env, cost_threshold: float = 1.0):
        super().__init__(env)
        self.cost_threshold = float(cost_threshold)

    def step(self, action):
        obs, rew, term, trunc, info = self.env.step(action)
        info = dict(info)
        info["cost"] = float(np.abs(np.asarray(action, np.float32)).max() > self.cost_threshold)
        return obs, rew, term, trunc, info


def _safe_pendulum(cost_threshold: float = 1.0, **kw):
    return ActionCostWrapper(gym.make("Pendulum-v1", **kw), cost_threshold)


for _id, _entry in (("grpolab/SpeedLimitPoint-v0", SpeedLimitPoint), ("grpolab/SafePendulum-v1", _safe_pendulum)):
    if _id not in gym.registry:
        gym.register(_id, entry_point=_entry, max_episode_steps=None if _id.endswith("Point-v0") else 200)
