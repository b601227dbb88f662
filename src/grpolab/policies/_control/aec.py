"""PettingZoo AEC (turn-taking) environments behind the control policies' environment interface: the learner plays
one seat, the other seats are part of the environment.

PettingZoo's classic games (``pettingzoo.classic.tictactoe_v3``, ``connect_four_v3``, ...) are AEC environments:
one agent acts at a time, through ``env.agent_iter()`` / ``env.last()`` / ``env.step(action)`` (PettingZoo's own
API; the module's ``env()`` constructor already wraps the game in PettingZoo's wrappers: order enforcement,
illegal-move termination). :class:`TurnEnv` turns one into a one-agent environment for the learner's seat
(``row["agent"]``, default the first of ``possible_agents``):

- ``reset(seed)`` resets the game with the seed, seeds the other seats' random number generator with it, and lets
  the other seats move until it is the learner's turn;
- ``step(a)`` plays the learner's action, then the other seats' moves until the learner's next turn or the end of
  the game; the step's reward is the learner's reward since its last move (``last()``'s cumulative reward, so the
  final win / loss / draw lands on the learner's last move);
- the other seats play a uniformly random legal move (from their ``action_mask``), drawn from the seeded generator:
  the G episodes of a group face the same opponent randomness, so only the learner's moves differ;
- an observation ``{"observation": ..., "action_mask": ...}`` (the classic games' layout) gives the actor the
  ``observation`` part and ``action_mask`` (``[1, n]`` bool, also read from ``info["action_mask"]`` where the game
  puts it there): the actor samples among legal moves only.

Provenance: grpolab's own adapter of PettingZoo's documented AEC loop (pettingzoo.farama.org, "AEC API": ``for
agent in env.agent_iter(): observation, reward, termination, truncation, info = env.last(); ... env.step(action)``,
with ``mask = observation["action_mask"]``).
"""
from __future__ import annotations

import numpy as np

from ...errors import ConfigError


def _observation_part(space):
    """The ``observation`` sub-space of a Dict observation space with an ``action_mask`` (else the space)."""
    import gymnasium as gym
    if isinstance(space, gym.spaces.Dict) and "observation" in space.spaces:
        return space.spaces["observation"]
    return space


class TurnEnv:
    """One AEC environment as a one-agent environment for the learner's seat (module docstring); the interface
    of :class:`~grpolab.policies._control.envs.Env` (N = 1) plus ``action_mask``."""

    multi = False

    def __init__(self, name: str, kwargs: dict, make, space_info):
        self.name, self.kwargs = name, dict(kwargs or {})
        try:
            self.env = make(**self.kwargs)
        except TypeError as e:
            raise ConfigError(f"env {name}: env_kwargs {self.kwargs} were refused ({e}); give only the "
                              f"environment's own keyword arguments (control_env_kwargs)") from e
        self.seats = list(self.env.possible_agents)
        self.seat = self.seats[0]
        self.agent_names = [self.seat]
        self.obs_space = _observation_part(self.env.observation_space(self.seat))
        self.act_space = self.env.action_space(self.seat)
        self.info = space_info(self.obs_space, self.act_space, 1, name)
        self.last_costs = np.zeros(1, np.float32)
        self.action_mask = None
        self.rng = np.random.default_rng(0)

    def _flat(self, obs) -> np.ndarray:
        from gymnasium.spaces.utils import flatten
        part = obs["observation"] if isinstance(obs, dict) and "observation" in obs else obs
        return np.asarray(flatten(self.obs_space, part), dtype=np.float32)

    @staticmethod
    def _mask(obs, info) -> np.ndarray | None:
        m = obs.get("action_mask") if isinstance(obs, dict) else None
        if m is None and isinstance(info, dict):
            m = info.get("action_mask")
        return None if m is None else np.asarray(m, dtype=bool)

    def _other_move(self, agent, obs, info):
        space = self.env.action_space(agent)
        mask = self._mask(obs, info)
        if mask is not None and mask.any():
            return int(self.rng.choice(np.flatnonzero(mask)))
        if hasattr(space, "n"):
            return int(self.rng.integers(space.n))
        return self.rng.uniform(space.low, space.high).astype(space.dtype)

    def _to_learner(self):
        """The other seats move until the learner's turn: ``(obs [1, D], learner's reward, done, terminal)``."""
        for agent in self.env.agent_iter():
            obs, rew, term, trunc, info = self.env.last()
            if agent == self.seat:
                self.action_mask = None if term or trunc else self._mask(obs, info)
                if self.action_mask is not None and self.action_mask.shape != (self.info.act_dim,):
                    raise ConfigError(f"env {self.name}: action_mask of shape {self.action_mask.shape}; the action "
                                      f"space has {self.info.act_dim} actions")
                return self._flat(obs)[None], float(rew), bool(term or trunc), bool(term)
            self.env.step(None if term or trunc else self._other_move(agent, obs, info))
        return np.zeros((1, self.info.obs_dim), np.float32), float(self.env.rewards.get(self.seat, 0.0)), True, True

    def reset(self, seed: int, seat: str | None = None) -> np.ndarray:
        """``[1, D]``: the learner's first observation of the game drawn from ``seed`` (seat ``seat``, default the
        first agent)."""
        if seat is not None and seat not in self.seats:
            raise ConfigError(f"env {self.name}: a row's 'agent' {seat!r} is none of the seats {self.seats}; give one "
                              f"of them (the seat the learner plays) or leave it out (the first seat)")
        self.seat = seat or self.seats[0]
        self.env.reset(seed=int(seed))
        self.rng = np.random.default_rng(int(seed))
        obs, _, done, _ = self._to_learner()
        if done:
            raise ConfigError(f"env {self.name}: the game ended before seat {self.seat} moved")
        return obs

    def step(self, actions: np.ndarray):
        """``(obs [1, D], rewards [1], done, terminal)`` after the learner's move and the other seats' replies."""
        a = int(actions[0]) if self.info.discrete else np.asarray(actions[0], dtype=np.float32)
        self.env.step(a)
        obs, rew, done, terminal = self._to_learner()
        return obs, np.array([rew], np.float32), done, terminal

    def close(self) -> None:
        self.env.close()
