"""Crafter (Hafner, "Benchmarking the Spectrum of Agent Capabilities", arXiv:2109.06780) as a Gymnasium
environment, for policy ``control`` and achievement distillation. Importing this module registers
``grpolab/Crafter-v0`` (rows name it ``"grpolab.policies.control.gymenvs.crafter_env:grpolab/Crafter-v0"``).

17 discrete actions; the reward is Crafter's (+1 the first time in an episode each of the 22 achievements is
unlocked, +-0.1 per point of health gained / lost); an episode ends at death (terminal) or after ``length``
steps (default 10000 as in Crafter; a time limit). ``info["achievements_unlocked"]`` counts the achievements
unlocked so far in the episode. Keyword arguments:

- ``obs``: ``"semantic"`` (default): the player's local 9 x 7 view of Crafter's semantic map (one-hot over its
  19 material / object ids, 0 outside the world) followed by the 16 inventory counts / 9, a float vector of
  9 * 7 * 19 + 16 = 1213 entries; it skips Crafter's image rendering, the cost of most of a step.
  ``"pixels"``: Crafter's RGB image, ``size`` x ``size`` x 3 (default 64, at least 27: smaller views cannot
  draw the inventory), scaled to [0, 1];
- ``area`` (default 64: Crafter's 64 x 64 world; smaller worlds generate faster), ``length``.

``reset(seed=s)`` generates the world from ``s`` (Crafter's world seed is ``hash((seed, episode))``; the
episode counter is reset with it), so the same seed gives the same world. World generation (pure-Python
simplex noise, ``opensimplex``) is the cost: measured on one core, 0.1-0.2 s for a 16 x 16 world, 0.3 s for
24 x 24, 0.5 s for 32 x 32 and about 2 s for 64 x 64, against 0.3-2 ms for a step (the step grows with the
world: Crafter updates every object of the world each step). So the generated state of each (constructor
arguments, seed) is cached for the whole process (``WORLDS``, shared by every instance: policy control keeps
one instance per episode of a batch, and each would otherwise generate every world again), at most ``cache``
entries (default 64, the oldest dropped first), and a later reset with that seed restores a copy (a deep copy,
about 2 ms): the same start state. Later steps repeat too, from one process to the next: Crafter keeps each
chunk's creatures in a ``set`` (ordered by object ids, i.e. memory addresses) and despawns
``creatures[random.randint(len(creatures))]`` of it, so the same random draw removed another creature in
another run; the wrapper's world (``_World``, a subclass of ``crafter.Env``) hands each chunk's creatures to
Crafter's own balancing sorted by position instead. The same game (a uniformly drawn creature is removed),
drawn in an order that does not depend on memory addresses.
"""
from __future__ import annotations

import copy

import crafter
import gymnasium as gym
import numpy as np
from crafter import constants
from gymnasium import spaces

VIEW_W, VIEW_H = 9, 7

class _World(crafter.Env):
    """``crafter.Env`` whose creature balancing sees each chunk's creatures sorted by position (module
    docstring: a set's order would make runs differ)."""

    def _balance_chunk(self, chunk, objs):
        super()._balance_chunk(chunk, sorted(objs, key=lambda o: (int(o.pos[0]), int(o.pos[1]))))


#: The generated start states, ``{(area, size, length, seed): crafter.Env}``, shared by every instance (module
#: docstring); insertion-ordered, so the oldest entry is dropped first.
WORLDS: dict = {}


class CrafterEnv(gym.Env):
    """Crafter behind the Gymnasium API (module docstring)."""

    metadata = {"render_modes": []}

    def __init__(self, obs: str = "semantic", size: int = 64, area: int = 64, length: int = 10000,
                 cache: int = 64):
        if obs not in ("semantic", "pixels"):
            raise ValueError(f"grpolab/Crafter-v0: obs must be 'semantic' or 'pixels', got {obs!r}")
        if obs == "pixels" and size < 27:
            raise ValueError(f"grpolab/Crafter-v0: size >= 27 for obs 'pixels' (Crafter draws a 9 x 9 grid of "
                             f"textures), got {size}")
        self.mode, self.cache_size, self.key = obs, int(cache), (int(area), int(size), int(length))
        self.env = _World(area=(area, area), size=(size, size), length=length, seed=0)
        self.n_ids = 1 + len(constants.materials) + 6  # None, the materials, 6 object kinds (SemanticView)
        self.n_items = len(constants.items)
        if obs == "semantic":
            d = VIEW_W * VIEW_H * self.n_ids + self.n_items
            self.observation_space = spaces.Box(0.0, 1.0, (d,), np.float32)
        else:
            self.observation_space = spaces.Box(0.0, 1.0, (size, size, 3), np.float32)
        self.action_space = spaces.Discrete(len(constants.actions))
        if obs == "semantic":  # skip the image: step() and reset() return env._obs()
            self.env._obs = lambda: None

    def _observe(self, pixels) -> np.ndarray:
        if self.mode == "pixels":
            return np.asarray(pixels, np.float32) / 255.0
        e = self.env
        sem = e._sem_view()
        x, y = e._player.pos
        pad = np.zeros((sem.shape[0] + VIEW_W, sem.shape[1] + VIEW_H), np.int64)
        pad[VIEW_W // 2:VIEW_W // 2 + sem.shape[0], VIEW_H // 2:VIEW_H // 2 + sem.shape[1]] = sem
        local = pad[x:x + VIEW_W, y:y + VIEW_H]
        onehot = np.eye(self.n_ids, dtype=np.float32)[np.clip(local, 0, self.n_ids - 1)].reshape(-1)
        inv = np.array([e._player.inventory[k] for k in constants.items], np.float32) / 9.0
        return np.concatenate([onehot, inv])

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        key = None if seed is None else (*self.key, int(seed))
        if key is not None and key in WORLDS:
            self.env = copy.deepcopy(WORLDS[key])
            if self.mode == "semantic":
                self.env._obs = lambda: None
            return self._observe(self.env._obs() if self.mode == "pixels" else None), {"achievements_unlocked": 0}
        if seed is not None:
            self.env._seed, self.env._episode = int(seed), 0
        pixels = self.env.reset()
        if key is not None and self.cache_size > 0:
            while len(WORLDS) >= self.cache_size:
                WORLDS.pop(next(iter(WORLDS)))
            saved = self.env.__dict__.pop("_obs", None)
            WORLDS[key] = copy.deepcopy(self.env)
            if saved is not None:
                self.env._obs = saved
        return self._observe(pixels), {"achievements_unlocked": 0}

    def step(self, action):
        pixels, reward, done, info = self.env.step(int(action))
        dead = self.env._player.health <= 0
        out = {"achievements_unlocked": len(self.env._unlocked), "discount": info["discount"]}
        return self._observe(pixels), float(reward), bool(done and dead), bool(done and not dead), out


if "grpolab/Crafter-v0" not in gym.registry:
    gym.register("grpolab/Crafter-v0", entry_point=CrafterEnv)
