"""A synthetic two-scenario recommendation environment (PettingZoo parallel API) for MARDPG (seed 000-92).

``parallel_env(**kwargs)`` makes it, so the control policies reach it as ``pettingzoo:grpolab.policies.mardpg.rec_env``.
Two agents rank items for one user in two scenarios (agent 0 ``main_search``, agent 1 ``in_shop``), every step
both. At ``reset(seed)`` the seed draws each scenario's ``items`` item feature vectors ``f`` and the user's hidden
preference ``p`` (unit vectors in R^dim). Each step, agent i's action ``w_i in [-1, 1]^dim`` (a ranking-weight
vector) scores scenario i's items ``s_m = w_i . f_m``; the ``slots`` best (ties: the lower index) are shown, the
item at position k (0-based) with affinity ``u = p . f_m`` is

- clicked with probability ``c = (1 / (k + 1)) * sigmoid(4 u)`` (position bias times interest);
- bought, once clicked, with probability ``b = sigmoid(4 u - 2)``;

and agent i's reward is its scenario's clicks plus purchases (expected value per shown item ``c (1 + b)``; with
``stochastic=False`` the environment pays and applies exactly these expectations). The scenarios interact
through the user: after the step the preference drifts towards what was clicked in either scenario,
``p <- unit(p + drift * sum_clicked f)``, so one scenario's ranking changes the other's later rewards (the
shared objective is the sum of both agents' rewards). Agent i observes only its own scenario: ``[sum of the
features of the items clicked there so far / max(clicks so far, 1), the same over its last shown list only,
t / horizon]`` (clicks are the expectations when ``stochastic=False``; ``2 dim + 1`` numbers); the user's
preference is never observed, so a ranker must infer it from the interaction history (hence recurrent
actors) and from the other scenario (hence a message). The
session ends (terminal) after ``horizon`` steps.

Provenance: reconstructed from the abstract — Feng et al., "Learning to Collaborate: Multi-Scenario Ranking via
Multi-Agent Reinforcement Learning", WWW 2018, which trains rankers of Taobao's main search and in-shop search
on logged users, and arXiv:2407.02759 (2024; seed 000-92's abstract: search, recommendation, advertising);
no simulator or code is public (searched: the search tool's code, issues and docs corpora, find_repos for
mardpg / multi-scenario ranking). Every number above (item counts, the click and
purchase models, the position bias, the drift, the observation) is our choice for a small CPU-sized stand-in
of that setting.
"""
from __future__ import annotations

import numpy as np

AGENTS = ("main_search", "in_shop")


def _unit(v: np.ndarray) -> np.ndarray:
    return v / np.maximum(np.linalg.norm(v, axis=-1, keepdims=True), 1e-8)


def _sigmoid(x):
    return 1.0 / (1.0 + np.exp(-x))


def shown(features: np.ndarray, w: np.ndarray, slots: int) -> np.ndarray:
    """Indices of the ``slots`` items with the highest score ``f_m . w`` (ties: the lower index first)."""
    return np.argsort(-(features @ w), kind="stable")[:slots]


def click_probs(features: np.ndarray, idx: np.ndarray, p: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``(c, b)`` of the shown items ``idx`` in order: click ``c_k = sigmoid(4 u) / (k + 1)``, purchase given a
    click ``b_k = sigmoid(4 u - 2)``, ``u = p . f``."""
    u = features[idx] @ p
    return _sigmoid(4 * u) / (np.arange(len(idx)) + 1.0), _sigmoid(4 * u - 2)


class MultiScenarioRec:
    """The environment of the module docstring (PettingZoo ``ParallelEnv`` API)."""

    metadata = {"name": "multi_scenario_rec_v0", "render_modes": []}

    def __init__(self, items: int = 12, dim: int = 4, slots: int = 3, horizon: int = 10, drift: float = 0.3,
                 stochastic: bool = True):
        from gymnasium.spaces import Box
        if items < slots or slots < 1 or dim < 1 or horizon < 1:
            raise ValueError(f"multi_scenario_rec: need items >= slots >= 1, dim >= 1, horizon >= 1; got items "
                             f"{items}, slots {slots}, dim {dim}, horizon {horizon}")
        self.items, self.dim, self.slots, self.horizon = int(items), int(dim), int(slots), int(horizon)
        self.drift, self.stochastic = float(drift), bool(stochastic)
        self.possible_agents = list(AGENTS)
        self.agents = list(AGENTS)
        self._obs = Box(-1.0, 1.0, (2 * self.dim + 1,), np.float32)
        self._act = Box(-1.0, 1.0, (self.dim,), np.float32)
        self.reset(seed=0)

    @property
    def unwrapped(self):
        return self

    @property
    def num_agents(self) -> int:
        return len(self.agents)

    @property
    def max_num_agents(self) -> int:
        return len(self.possible_agents)

    def state(self) -> np.ndarray:
        """The hidden state: the user's preference and both scenarios' item features, flattened."""
        return np.concatenate([self.p, self.features.ravel()]).astype(np.float32)

    def observation_space(self, agent):
        return self._obs

    def action_space(self, agent):
        return self._act

    def _observe(self) -> dict:
        t = np.float32(self.t / self.horizon)
        return {a: np.concatenate([self.click_sum[i] / max(self.clicks[i], 1.0), self.last[i], [t]]).astype(np.float32)
                for i, a in enumerate(AGENTS)}

    def reset(self, seed=None, options=None):
        rng = np.random.default_rng(seed)
        self.features = _unit(rng.normal(size=(2, self.items, self.dim)))
        self.p = _unit(rng.normal(size=self.dim))
        self.rng = np.random.default_rng(rng.integers(2**63))
        self.t = 0
        self.click_sum = np.zeros((2, self.dim))
        self.clicks = np.zeros(2)
        self.last = np.zeros((2, self.dim))
        self.agents = list(AGENTS)
        return self._observe(), {a: {} for a in AGENTS}

    def step(self, actions: dict):
        rewards, pulled = {}, np.zeros(self.dim)
        for i, a in enumerate(AGENTS):
            w = np.clip(np.asarray(actions[a], dtype=np.float64), -1.0, 1.0)
            idx = shown(self.features[i], w, self.slots)
            c, b = click_probs(self.features[i], idx, self.p)
            if self.stochastic:
                click = (self.rng.random(len(idx)) < c).astype(np.float64)
                buy = click * (self.rng.random(len(idx)) < b)
            else:
                click, buy = c, c * b
            rewards[a] = float(click.sum() + buy.sum())
            f = self.features[i][idx]
            self.click_sum[i] += click @ f
            self.clicks[i] += click.sum()
            self.last[i] = click @ f / max(click.sum(), 1.0)
            pulled += click @ f
        self.p = _unit(self.p + self.drift * pulled)
        self.t += 1
        end = self.t >= self.horizon
        obs = self._observe()
        if end:
            self.agents = []
        return (obs, rewards, {a: end for a in AGENTS}, {a: False for a in AGENTS}, {a: {} for a in AGENTS})

    def close(self) -> None:
        pass


def parallel_env(**kwargs) -> MultiScenarioRec:
    """The environment (``pettingzoo:grpolab.policies.mardpg.rec_env``)."""
    return MultiScenarioRec(**kwargs)
