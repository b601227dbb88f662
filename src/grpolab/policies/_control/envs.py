"""Environments of the control policies: one interface over Gymnasium (one agent), PettingZoo parallel
environments (several agents) and PettingZoo AEC (turn-taking) environments (the learner's seat; ``aec.py``), with
seeded resets so that G episodes of a group start from the same state.

An environment is named by a row's ``env`` column:

- a Gymnasium id (``CartPole-v1``, ``Pendulum-v1``, or ``"my_pkg.envs:MyEnv-v0"``: Gymnasium imports the module,
  which registers the id), made by ``gymnasium.make(id, **env_kwargs)``;
- ``pettingzoo:<module>``: a PettingZoo parallel environment, ``<module>.parallel_env(**env_kwargs)``, e.g.
  ``pettingzoo:mpe2.simple_spread_v3`` or ``pettingzoo:pettingzoo.butterfly.cooperative_pong_v5``;
- from Python (``grpolab.GRPOTrainer`` rows), a ``gymnasium.Env`` instance, an ``Env`` subclass or a factory
  (a callable that returns one): :func:`env_id_of` registers it once in Gymnasium's registry as
  ``grpolab_user/<Name>-v<k>`` and the row names that id.

Both become an :class:`Env` with agents ``0..N-1`` (N = 1 for Gymnasium): ``reset(seed)`` returns ``[N, D]``
observations, ``step(actions [N, ...])`` returns ``(obs [N, D], rewards [N], done, terminal)``, where ``done``
ends the episode and ``terminal`` says it ended in a terminal state (no bootstrap; a time limit is done but not
terminal). Observations are flattened to float32 vectors. ``last_costs`` ([N]) holds each agent's
``info["cost"]`` of the last step (0 when the environment reports none: the per-step cost of a constrained
task, policies/control/gymenvs/safety.py). Every agent of a PettingZoo environment must have the
same observation and action spaces (one shared actor; the agent's index is appended as a one-hot by the
policy); an environment whose agents leave before the episode ends is refused.
"""
from __future__ import annotations

import importlib
from dataclasses import dataclass

import numpy as np

from ...errors import ConfigError

PETTINGZOO = "pettingzoo:"
#: Environments given from Python: ``id(object) -> (object, its Gymnasium id)`` (the object is kept, so its id is
#: never reused while the process lives)
_USER_ENVS: dict[int, tuple[object, str]] = {}


def named_envs(rows: list[dict], what: str) -> list[dict]:
    """``rows`` with each ``env`` that is an environment object replaced by its id (:func:`env_id_of`)."""
    return [r if isinstance(r.get("env"), (str, type(None))) else {**r, "env": env_id_of(r["env"], f"{what} row {i}")}
            for i, r in enumerate(rows)]


def env_id_of(value, where: str) -> str:
    """A row's ``env`` as a name :func:`make_env` takes: a string as it is; a ``gymnasium.Env`` instance (each
    episode's environment is a ``copy.deepcopy`` of it), an ``Env`` subclass or a factory (called with the row's
    ``env_kwargs``) registered in Gymnasium's registry once per object as ``grpolab_user/<Name>-v<k>``."""
    import copy

    import gymnasium as gym

    if isinstance(value, str):
        return value
    known = _USER_ENVS.get(id(value))
    if known is not None:
        return known[1]
    if isinstance(value, gym.Env):
        def entry(**kwargs):
            if kwargs:
                raise ConfigError(f"{where}: env_kwargs {kwargs} cannot be applied to an environment instance; "
                                  f"give its class or a factory to have them passed")
            return copy.deepcopy(value)
        name = type(value).__name__
    elif callable(value):
        entry, name = value, getattr(value, "__name__", type(value).__name__)
    else:
        raise ConfigError(f"{where}: 'env' must be a Gymnasium id, pettingzoo:<module>, a gymnasium.Env instance, an "
                          f"Env class or a factory returning one; got {type(value).__name__}")
    name = "".join(c if c.isalnum() or c == "_" else "_" for c in name) or "Env"
    env_id = f"grpolab_user/{name}-v{len(_USER_ENVS)}"
    gym.register(id=env_id, entry_point=entry, disable_env_checker=True)
    _USER_ENVS[id(value)] = (value, env_id)
    return env_id


@dataclass(frozen=True)
class SpaceInfo:
    """What the actor needs to know of an environment: ``obs_dim``, ``agents`` (N), ``discrete`` (else a Box),
    ``act_dim`` (the number of discrete actions, or the Box's size), the Box's ``low`` / ``high``."""
    obs_dim: int
    agents: int
    discrete: bool
    act_dim: int
    low: tuple = ()
    high: tuple = ()


def check_saved_spaces(path, config: dict, info: SpaceInfo, keys: tuple[str, ...], env: str | None = None) -> None:
    """A ConfigError unless the ``keys`` (fields of :class:`SpaceInfo`) of a saved actor's ``config`` (its folder
    ``path``) are those of the rows' environment ``info`` (named ``env`` in the message when given)."""
    saved, want = tuple(config[k] for k in keys), tuple(getattr(info, k) for k in keys)
    if saved != want:
        where = "environment" if env is None else f"environment {env}"
        raise ConfigError(f"model: {path} was saved for ({', '.join(keys)}) = {saved}; the rows' {where} has {want}")


def _space_info(obs_space, act_space, agents: int, name: str) -> SpaceInfo:
    import gymnasium as gym
    from gymnasium.spaces.utils import flatdim
    if isinstance(act_space, gym.spaces.Discrete):
        return SpaceInfo(flatdim(obs_space), agents, True, int(act_space.n))
    if isinstance(act_space, gym.spaces.Box) and len(act_space.shape) == 1:
        return SpaceInfo(flatdim(obs_space), agents, False, int(act_space.shape[0]),
                         tuple(float(x) for x in act_space.low), tuple(float(x) for x in act_space.high))
    raise ConfigError(f"env {name}: action space {act_space} is not supported; the control policy acts in a "
                      f"Discrete space (categorical) or a 1-D Box (Gaussian)")


def pettingzoo_module(name: str):
    """The module of ``pettingzoo:<module>``, imported (a ConfigError naming the forms that work when it cannot
    be or has neither ``parallel_env`` nor ``env``)."""
    mod = name[len(PETTINGZOO):]
    try:
        module = importlib.import_module(mod)
    except ImportError as e:
        raise ConfigError(f"env {name}: cannot import {mod} ({e}); PettingZoo environments are named "
                          f"pettingzoo:<module>, a module with parallel_env() (e.g. pettingzoo:mpe2.simple_spread_v3) "
                          f"or with env() for a turn-taking AEC game (e.g. pettingzoo:pettingzoo.classic.tictactoe_v3) "
                          f"(pip install 'grpolab[control]')") from e
    if not hasattr(module, "parallel_env") and not hasattr(module, "env"):
        raise ConfigError(f"env {name}: module {mod} has neither parallel_env() (a parallel environment) nor env() "
                          f"(an AEC environment); name a PettingZoo environment module, e.g. "
                          f"pettingzoo:mpe2.simple_spread_v3 or pettingzoo:pettingzoo.classic.connect_four_v3")
    return module


def make_env(name: str, kwargs: dict | None = None):
    """The environment a row names: :class:`Env` (Gymnasium, PettingZoo parallel) or, for a PettingZoo module
    with ``env()`` but no ``parallel_env()`` (the classic turn-taking games), :class:`~.aec.TurnEnv`."""
    if isinstance(name, str) and name.startswith(PETTINGZOO):
        module = pettingzoo_module(name)
        if not hasattr(module, "parallel_env"):
            from .aec import TurnEnv
            return TurnEnv(name, kwargs, module.env, _space_info)
    return Env(name, kwargs)


class Env:
    """One environment instance behind the common interface (module docstring)."""

    def __init__(self, name: str, kwargs: dict | None = None):
        self.name, self.kwargs = name, dict(kwargs or {})
        if name.startswith(PETTINGZOO):
            try:
                self.env = pettingzoo_module(name).parallel_env(**self.kwargs)
            except TypeError as e:
                raise ConfigError(f"env {name}: env_kwargs {self.kwargs} were refused ({e}); give only the "
                                  f"environment's own keyword arguments (control_env_kwargs)") from e
            self.agent_names = list(self.env.possible_agents)
            spaces = {(str(self.env.observation_space(a)), str(self.env.action_space(a))) for a in self.agent_names}
            if len(spaces) != 1:
                raise ConfigError(f"env {name}: the agents' observation / action spaces differ ({sorted(spaces)}); "
                                  f"the control policy shares one actor between agents, which needs equal spaces")
            a0 = self.agent_names[0]
            self.obs_space, self.act_space = self.env.observation_space(a0), self.env.action_space(a0)
            self.multi = True
        else:
            import gymnasium as gym
            try:
                self.env = gym.make(name, **self.kwargs)
            except gym.error.Error as e:
                raise ConfigError(f"env {name}: gymnasium.make failed ({e}); name a registered Gymnasium id (e.g. "
                                  f"CartPole-v1), 'module:Id' for an environment your module registers, or "
                                  f"pettingzoo:<module> for a PettingZoo parallel environment") from e
            except TypeError as e:
                raise ConfigError(f"env {name}: env_kwargs {self.kwargs} were refused ({e}); give only the "
                                  f"environment's own keyword arguments (control_env_kwargs)") from e
            self.agent_names = ["agent"]
            self.obs_space, self.act_space = self.env.observation_space, self.env.action_space
            self.multi = False
        self.info = _space_info(self.obs_space, self.act_space, len(self.agent_names), name)
        self.last_costs = np.zeros(len(self.agent_names), np.float32)
        self.action_mask = None  # legal actions of the next step, [N, n] bool (AEC games only: aec.py)

    def _flat(self, obs) -> np.ndarray:
        from gymnasium.spaces.utils import flatten
        return np.asarray(flatten(self.obs_space, obs), dtype=np.float32)

    def reset(self, seed: int, seat: str | None = None) -> np.ndarray:
        """``[N, D]`` observations of the start state drawn from ``seed`` (the same seed, the same state); ``seat``
        (a row's ``agent``) is for turn-taking games only (aec.py)."""
        obs, _ = self.env.reset(seed=int(seed))
        if self.multi:
            return np.stack([self._flat(obs[a]) for a in self.agent_names])
        if hasattr(self.act_space, "seed"):
            self.act_space.seed(int(seed))
        return self._flat(obs)[None]

    def step(self, actions: np.ndarray):
        """``(obs [N, D], rewards [N], done, terminal)`` after every agent's action (``actions[i]``)."""
        if self.multi:
            act = {a: (int(actions[i]) if self.info.discrete else np.asarray(actions[i], dtype=np.float32))
                   for i, a in enumerate(self.agent_names)}
            obs, rew, term, trunc, infos = self.env.step(act)
            self.last_costs = np.array([float((infos.get(a) or {}).get("cost", 0.0)) for a in self.agent_names],
                                       np.float32)
            left = [a for a in self.agent_names if a not in obs]
            done_any = any(term.values()) or any(trunc.values())
            if left and not done_any:
                raise ConfigError(f"env {self.name}: agents {left} left before the episode ended; the control "
                                  f"policy needs every agent in every step")
            done = all(term.get(a, True) or trunc.get(a, True) for a in self.agent_names)
            terminal = all(term.get(a, False) for a in self.agent_names)
            o = np.stack([self._flat(obs[a]) if a in obs else np.zeros(self.info.obs_dim, np.float32)
                          for a in self.agent_names])
            return o, np.array([float(rew.get(a, 0.0)) for a in self.agent_names], np.float32), done, terminal
        a = int(actions[0]) if self.info.discrete else np.asarray(actions[0], dtype=np.float32)
        obs, rew, term, trunc, info = self.env.step(a)
        self.last_costs = np.array([float(info.get("cost", 0.0))], np.float32)
        return self._flat(obs)[None], np.array([float(rew)], np.float32), bool(term or trunc), bool(term)

    def close(self) -> None:
        self.env.close()


def env_key(row: dict) -> tuple:
    """The (name, kwargs) of a row's environment, hashable; a missing or empty ``env`` is an error."""
    name = row.get("env")
    if not isinstance(name, str) or not name:
        raise ConfigError(f"policy control: a row has no 'env' column (got {name!r}); each row names its "
                          f"environment (a Gymnasium id or pettingzoo:<module>) and a start 'seed' "
                          f"(task gym_control makes such rows)")
    kw = row.get("env_kwargs") or {}
    if not isinstance(kw, dict):
        raise ConfigError(f"policy control: env_kwargs of a row must be a mapping, got {kw!r}")
    return name, tuple(sorted((k, repr(v)) for k, v in kw.items())), kw


def row_seed(row: dict, i: int) -> int:
    s = row.get("seed")
    if isinstance(s, bool) or not isinstance(s, (int, np.integer)):
        raise ConfigError(f"policy control: row {i} has no integer 'seed' column (got {s!r}); the seed picks the "
                          f"start state every episode of the row's group starts from")
    return int(s)


class EnvPool:
    """Environment instances reused across steps, per (name, kwargs): ``take(rows_keys)`` hands one instance per
    episode (more are made as needed), so a step of many episodes builds no environment after the first."""

    def __init__(self):
        self.free: dict[tuple, list[Env]] = {}

    def take(self, keys: list[tuple]) -> list[Env]:
        out, used = [], {}
        for name, h, kw in keys:
            k = (name, h)
            n = used.get(k, 0)
            pool = self.free.setdefault(k, [])
            while len(pool) <= n:
                pool.append(make_env(name, kw))
            out.append(pool[n])
            used[k] = n + 1
        return out

    def info(self, row: dict) -> SpaceInfo:
        return self.take([env_key(row)])[0].info
