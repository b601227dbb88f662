"""``mardpg``: MARDPG's recurrent deterministic actors with messages (policies/mardpg/model.py) acting in a PettingZoo
environment, with Gaussian exploration noise; one step = one environment step of one agent.

The batch has policy ``control``'s layout (policies/control/policy.py): column ``t * N + i`` = agent i at time t,
``step_data["obs"]`` ``[R, T*N, D]`` (the raw observations: the actors are per agent, no one-hot),
``step_data["action"]`` ``[R, T*N, A]`` (the unclipped noisy action; the environment gets it clipped to
[-1, 1]), ``row_data`` ``step_rewards`` / ``terminal`` / ``last_obs`` ``[R, N, D]`` / ``agents`` /
``agent_returns``; ``columns["completion"]`` the mean over agents of each agent's return (task gym_control's
``episode_return``). The behaviour log-prob of a step is that of the exploration Gaussian,
``log N(a; mu_theta(o_{<=t}), (sigma tau)^2)`` summed over the action's dimensions, so GRPO's losses also run
on this policy; evaluation plays ``mu`` without noise. G episodes of a row start from its seed.

Provenance: reconstructed from the abstract — Feng et al., "Learning to Collaborate: Multi-Scenario Ranking via
Multi-Agent Reinforcement Learning", WWW 2018, as applied in arXiv:2407.02759 (seed 000-92): recurrent
deterministic actors; the Gaussian
exploration noise is DDPG's (Lillicrap et al., 2015, arXiv:1509.02971, with Gaussian instead of
Ornstein-Uhlenbeck noise); see policies/mardpg/model.py for every choice.
"""
from __future__ import annotations

import math
from typing import Any

import torch

from ...config import ConfigError
from .._control.envs import EnvPool, check_saved_spaces, named_envs, row_seed
from .._control.episodes import pack_episodes, start_episodes
from .model import RecurrentActors
from ...registry import POLICIES, param
from ..base import PolicyBase, load_config_module, save_config_module, saved_folder

BUILT_IN = ("mlp", "tiny", "gru")


def _gauss_logprob(a: torch.Tensor, mu: torch.Tensor, std: torch.Tensor) -> torch.Tensor:
    z = (a - mu) / std
    return (-0.5 * z.pow(2) - std.log() - 0.5 * math.log(2 * math.pi)).sum(-1)


@POLICIES.register("mardpg")
class MARDPGPolicy(PolicyBase):
    """Recurrent deterministic actors (one GRU per agent, messages between them) with Gaussian exploration
    (module docstring).

    Provenance: reconstructed from the abstract — arXiv:2407.02759 (seed 000-92) and Feng et al., WWW 2018;
    policies/mardpg/model.py states
    the choices (GRU cells, the message, sizes).
    """

    step = "environment step"
    capabilities = frozenset({"control"})
    description = "MARDPG's recurrent deterministic actors (GRU, messages) in PettingZoo environments with Box actions"
    default_model = "gru"
    default_task = "gym_control"
    float32_only = True

    def __init__(self, *, model: str, temperature: float, max_completion_length: int,
                 mardpg_hidden: int = param(32, "mardpg: hidden units of each agent's GRU actor"),
                 mardpg_message: int = param(4, "mardpg: size of the message each agent sends the others"),
                 mardpg_sigma: float = param(0.2, "mardpg: std of the Gaussian exploration noise (times the "
                                             "temperature)")):
        if mardpg_hidden < 1 or mardpg_message < 0 or not mardpg_sigma > 0:
            raise ConfigError(f"mardpg_hidden >= 1, mardpg_message >= 0 and mardpg_sigma > 0, got {mardpg_hidden}, "
                              f"{mardpg_message}, {mardpg_sigma}")
        self.model_name, self.temperature = model, float(temperature)
        self.max_steps = int(max_completion_length)
        self.hidden, self.msg, self.sigma = int(mardpg_hidden), int(mardpg_message), float(mardpg_sigma)
        self.pool = EnvPool()

    @classmethod
    def api_rows(cls, rows: list[dict], what: str) -> list[dict]:
        """Environment objects in rows given from Python become their registered ids (``_control/envs.py``)."""
        return named_envs(rows, what)

    def load(self, cfg, rows, eval_rows, *, extra_texts=(), log=print):
        """``model``: ``gru`` (new actors sized from the first row's environment) or a folder :meth:`save` wrote.
        A folder loads with no train rows (``grpolab eval --model RUN/final``): its spaces are checked against
        the first held-out row's environment."""
        if not rows and self.model_name not in BUILT_IN:
            return self._load_folder(rows, eval_rows).float()
        if not rows:
            raise ConfigError("policy mardpg: no train rows (model 'gru' sizes the new actors from the first row's "
                              "environment); give rows (task or --data) or a saved run's folder (RUN/final)")
        info = self.pool.info(rows[0])
        if info.discrete:
            raise ConfigError(f"policy mardpg: env {rows[0]['env']} has Discrete actions; MARDPG's deterministic "
                              f"actors output a continuous vector (a Box), e.g. pettingzoo:grpolab.policies.mardpg.rec_env")
        for i, row in enumerate(list(rows) + list(eval_rows)):
            row_seed(row, i)
        if self.model_name in BUILT_IN:
            module = RecurrentActors(info.agents, info.obs_dim, info.act_dim, self.hidden, self.msg)
            log(f"[grpolab] policy mardpg: {info.agents} new GRU actors ({self.hidden} units, messages of "
                f"{self.msg}, {sum(p.numel() for p in module.parameters())} parameters) for {rows[0]['env']}")
        else:
            module = self._load_folder(rows, eval_rows)
        return module.float()

    def _load_folder(self, rows, eval_rows):
        """The actors of a saved folder, their spaces checked against the first row's environment (train rows,
        else held-out rows); every row gets its seed."""
        path = saved_folder(self.model_name, "mardpg", ("config.json",), "a folder it saved",
                            builds="'gru' (new actors)")
        module, c = load_config_module(RecurrentActors, path, "mardpg")
        first = (list(rows) + list(eval_rows))[:1]
        if first:
            check_saved_spaces(path, c, self.pool.info(first[0]), ("agents", "obs_dim", "act_dim"))
        for i, row in enumerate(list(rows) + list(eval_rows)):
            row_seed(row, i)
        return module

    def save(self, module, path) -> None:
        save_config_module(module, path)

    @torch.no_grad()
    def sample(self, module, rows, uids, *, group_offset=0, num_generations, temperature=None, generator=None,
               evaluation=False):
        counts, tau, envs, seeds, cur = start_episodes(  # cur: [R, N, D]
            self.pool, rows, num_generations, temperature if temperature is not None else self.temperature)
        R = sum(counts)
        c = module.config
        N, A, D, Tmax = c["agents"], c["act_dim"], c["obs_dim"], self.max_steps
        std = (self.sigma * tau).clamp_min(1e-6)[:, None, None]  # [R, 1, 1]
        obs, act = torch.zeros(R, Tmax, N, D), torch.zeros(R, Tmax, N, A)
        lps, rew = torch.zeros(R, Tmax, N), torch.zeros(R, Tmax, N)
        lengths = torch.full((R,), Tmax, dtype=torch.long)
        terminal, truncated = torch.zeros(R, dtype=torch.bool), torch.ones(R, dtype=torch.bool)
        alive, state = set(range(R)), None
        for t in range(Tmax):
            if not alive:
                break
            mu, state = module.step(cur, state)  # every episode steps its actors (the ended ones are masked)
            a = mu if evaluation else mu + std * torch.randn(mu.shape, generator=generator)
            obs[:, t], act[:, t] = cur, a
            lps[:, t] = 0.0 if evaluation else _gauss_logprob(a, mu, std)
            for r in sorted(alive):
                o, rw, done, term = envs[r].step(a[r].clamp(-1, 1).numpy())
                rew[r, t] = torch.from_numpy(rw)
                cur[r] = torch.from_numpy(o)
                if done:
                    lengths[r], terminal[r], truncated[r] = t + 1, term, False
                    alive.discard(r)
        return pack_episodes(rows, counts, uids, seeds, group_offset=group_offset, lengths=lengths, obs=obs, act=act,
                             lps=lps, rew=rew, terminal=terminal, truncated=truncated, last_obs=cur.clone())

    def forward(self, module, mb, *, want: frozenset[str] = frozenset(), grad: bool = True) -> dict[str, Any]:
        """Per-step log-probs ``[R, T*N]`` of the stored noisy actions under the exploration Gaussian around the
        actors' ``mu`` (re-run over each episode's observations); 0 off the mask."""
        c = module.config
        R, TN = mb.completion_mask.shape
        N = c["agents"]
        device = next(module.parameters()).device
        obs = mb.step_data["obs"].reshape(R, TN // N, N, -1).to(device)
        a = mb.step_data["action"].reshape(R, TN // N, N, -1).to(device)
        with torch.set_grad_enabled(grad):
            mu = module.rollout(obs)
            lp = _gauss_logprob(a, mu, torch.tensor(self.sigma * self.temperature, device=device)).reshape(R, TN)
        return {"logprobs": lp * mb.completion_attention_mask.to(device)}

    def describe(self, batch, i: int) -> dict:
        return {"prompt": str(batch.columns["prompt"][i]),
                "completion": f"return {batch.columns['completion'][i]:.2f} in "
                              f"{batch.columns['episode_length'][i]} steps"}
