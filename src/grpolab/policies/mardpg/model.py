"""MARDPG: recurrent deterministic actors with a learned message, one shared centralised critic, DDPG-style
training (seed 000-92).

*Learning to Collaborate: Multi-Scenario Ranking via Multi-Agent Reinforcement Learning* (Feng, Li, Zeng, Yao,
Cai, Yang, Ma, WWW 2018): Multi-Agent Recurrent Deterministic Policy Gradient, applied in arXiv:2407.02759
("Multi-Scenario Combination Based on Multi-Agent Reinforcement Learning to Optimize the Advertising
Recommendation System", 2024), whose abstract is seed 000-92. With N agents,
agent i's observation ``o_t^i``, hidden state ``h_t^i`` and message ``m_t^i``:

- actor (:class:`RecurrentActors`): ``h_t^i = GRU_i([o_t^i, mbar_{t-1}^i], h_{t-1}^i)``, action
  ``a_t^i = tanh(W_i h_t^i)`` (a deterministic ranking-weight vector), message ``m_t^i = tanh(U_i h_t^i)``;
  ``mbar_{t-1}^i`` is the mean of the other agents' messages of the previous step (0 at t = 0), so a message is
  learned end to end through the critic's action gradient;
- shared centralised critic (:class:`SharedCritic`): ``c_t = GRU_c([o_t^1..o_t^N], c_{t-1})`` over the joint
  observation history, ``Q(c_t, a_t^1..a_t^N) = MLP([c_t, a_t^1..a_t^N])``, trained on the shared objective
  ``r_t = sum_i r_t^i`` (:func:`critic_loss`)::

      y_t = r_t + gamma (1 - done_t) Q'(c'_{t+1}, mu'(o_{<=t+1})),   L(Q) = mean_{b,t} (Q(c_t, a_t) - y_t)^2

  (``Q'``, ``mu'``: target networks run over the same episode);
- actors (:func:`actor_objective`): ``L(mu) = -mean_{b,t} Q(c_t, mu^1(o^1_{<=t}), .., mu^N(o^N_{<=t}))`` with
  ``c_t`` held fixed, backpropagated through the actors' GRUs and messages over the whole episode;
- targets by Polyak averaging ``theta' <- (1 - tau) theta' + tau theta`` (policies/_control/maddpg.py ``polyak_update``);
  exploration ``a = clip(mu + sigma eps, -1, 1)``; replay of whole episodes (:class:`EpisodeBuffer`).

:func:`train_mardpg` runs it on the two-scenario recommendation environment (policies/mardpg/rec_env.py); policy
``mardpg`` (policies/mardpg/policy.py) and update strategy ``mardpg`` (policies/mardpg/update.py) run the same networks and
updates in the grpolab pipeline (recipe ``mardpg``).

Provenance: reconstructed from the abstract — arXiv:2407.02759 (seed 000-92) and Feng et al., WWW 2018; no
public code (searched: the search tool's code / issues / docs corpora and find_repos for "mardpg",
"multi-scenario ranking", "learning to collaborate"; the MARDPG-* repositories found are unrelated UAV
projects). What the abstracts give: one ranking agent per scenario, deterministic actors over the interaction
history with recurrent networks, a shared centralised critic over the agents' histories and actions,
communication between agents, DDPG-style training on the joint objective. Our choices: GRU cells (the 2018
paper: LSTM-style recurrence), the message as a tanh projection of the actor's hidden state read by the other
agents at the next step, the critic's own GRU over the joint observations, whole-episode replay with
back-propagation through time, Gaussian exploration noise, sizes (hidden 32, message 4), Adam lr 1e-3,
gamma 0.9, tau 0.05, no gradient clipping.
"""
from __future__ import annotations

import copy

import torch
from torch import nn

from ...errors import ConfigError
from .._control.maddpg import polyak_update, td_target


class RecurrentActors(nn.Module):
    """N recurrent deterministic actors with messages (module docstring). ``rollout(obs [B, T, N, D])`` gives
    actions ``[B, T, N, A]``; ``step(o [B, N, D], state)`` one step (``state``: hidden states and the last
    messages, None at the start)."""

    def __init__(self, agents: int, obs_dim: int, act_dim: int, hidden: int = 32, msg_dim: int = 4):
        super().__init__()
        self.config = {"agents": int(agents), "obs_dim": int(obs_dim), "act_dim": int(act_dim),
                       "hidden": int(hidden), "msg_dim": int(msg_dim)}
        self.cells = nn.ModuleList([nn.GRUCell(obs_dim + msg_dim, hidden) for _ in range(agents)])
        self.heads = nn.ModuleList([nn.Linear(hidden, act_dim) for _ in range(agents)])
        self.msgs = nn.ModuleList([nn.Linear(hidden, msg_dim) for _ in range(agents)])

    def step(self, o: torch.Tensor, state=None):
        c = self.config
        B, N = o.shape[0], c["agents"]
        if state is None:
            state = (o.new_zeros(B, N, c["hidden"]), o.new_zeros(B, N, c["msg_dim"]))
        h, m = state
        mbar = (m.sum(1, keepdim=True) - m) / max(N - 1, 1)  # the other agents' messages, averaged
        hs, acts, ms = [], [], []
        for i in range(N):
            hi = self.cells[i](torch.cat([o[:, i], mbar[:, i]], -1), h[:, i])
            hs.append(hi)
            acts.append(torch.tanh(self.heads[i](hi)))
            ms.append(torch.tanh(self.msgs[i](hi)))
        return torch.stack(acts, 1), (torch.stack(hs, 1), torch.stack(ms, 1))

    def rollout(self, obs: torch.Tensor) -> torch.Tensor:
        state, out = None, []
        for t in range(obs.shape[1]):
            a, state = self.step(obs[:, t], state)
            out.append(a)
        return torch.stack(out, 1)


class SharedCritic(nn.Module):
    """``Q(c_t, a_t)`` with ``c_t`` a GRU over the joint observations (module docstring)."""

    def __init__(self, agents: int, obs_dim: int, act_dim: int, hidden: int = 32):
        super().__init__()
        self.gru = nn.GRU(agents * obs_dim, hidden, batch_first=True)
        self.q = nn.Sequential(nn.Linear(hidden + agents * act_dim, hidden), nn.ReLU(), nn.Linear(hidden, 1))

    def history(self, obs: torch.Tensor) -> torch.Tensor:
        """``c_t`` ``[B, T, H]`` from joint observations ``[B, T, N, D]``."""
        return self.gru(obs.flatten(2))[0]

    def value(self, c: torch.Tensor, act: torch.Tensor) -> torch.Tensor:
        """``Q`` ``[B, T]`` from histories ``[B, T, H]`` and joint actions ``[B, T, N, A]``."""
        return self.q(torch.cat([c, act.flatten(2)], -1))[..., 0]


def critic_loss(critic: SharedCritic, target_critic: SharedCritic, target_actors: RecurrentActors,
                obs: torch.Tensor, act: torch.Tensor, rew: torch.Tensor, done: torch.Tensor,
                gamma: float) -> torch.Tensor:
    """``mean_{b,t} (Q(c_t, a_t) - y_t)^2``, ``y_t = r_t + gamma (1 - done_t) Q'(c'_{t+1}, mu'_{t+1})``;
    ``obs [B, T + 1, N, D]`` (the observation after the last step included), ``act [B, T, N, A]``,
    ``rew [B, T]`` (the shared reward), ``done [B, T]``."""
    T = act.shape[1]
    with torch.no_grad():
        a_next = target_actors.rollout(obs)[:, 1:]
        q_next = target_critic.value(target_critic.history(obs)[:, 1:], a_next)
        y = td_target(rew, done, q_next, gamma)
    q = critic.value(critic.history(obs[:, :T]), act)
    return (q - y).pow(2).mean()


def actor_objective(critic: SharedCritic, actors: RecurrentActors, obs: torch.Tensor) -> torch.Tensor:
    """``-mean_{b,t} Q(c_t, mu(o_{<=t}))`` with the critic's history ``c_t`` fixed (``obs [B, T, N, D]``)."""
    with torch.no_grad():
        c = critic.history(obs)
    return -critic.value(c, actors.rollout(obs)).mean()


class EpisodeBuffer:
    """Whole episodes of one length T: ``obs [T + 1, N, D]``, ``act [T, N, A]``, ``rew [T]``, ``done [T]``."""

    def __init__(self, size: int):
        self.size, self.data, self.pos = int(size), [], 0

    def __len__(self) -> int:
        return len(self.data)

    def add(self, obs, act, rew, done) -> None:
        """Add ``B`` episodes (leading axis B)."""
        for j in range(len(obs)):
            ep = (obs[j].clone(), act[j].clone(), rew[j].clone(), done[j].clone())
            if self.data and ep[1].shape != self.data[0][1].shape:
                raise ConfigError(f"mardpg: episodes of {ep[1].shape[0]} steps in a buffer of "
                                  f"{self.data[0][1].shape[0]}-step episodes; MARDPG replays whole episodes of "
                                  f"one length (the environment's "
                                  f"horizon; set max_completion_length >= it)")
            if len(self.data) < self.size:
                self.data.append(ep)
            else:
                self.data[self.pos] = ep
            self.pos = (self.pos + 1) % self.size

    def sample(self, batch: int, generator: torch.Generator):
        idx = torch.randint(0, len(self.data), (batch,), generator=generator).tolist()
        return tuple(torch.stack([self.data[i][k] for i in idx]) for k in range(4))

    def state_dict(self) -> dict:
        return {"pos": self.pos, "data": [list(d) for d in self.data]}

    def load_state_dict(self, s: dict) -> None:
        self.pos, self.data = int(s["pos"]), [tuple(d) for d in s["data"]]


class MARDPG:
    """The learner: ``actors`` (a :class:`RecurrentActors`, trained here), a :class:`SharedCritic`, their
    targets, Adam optimisers and the episode buffer (``state_dict`` / ``load_state_dict``)."""

    def __init__(self, actors: RecurrentActors, *, hidden: int = 32, gamma: float = 0.9, tau: float = 0.05,
                 lr: float = 1e-3, batch_size: int = 32, buffer_size: int = 10_000, seed: int = 0):
        c = actors.config
        self.actors, self.gamma, self.tau, self.batch_size = actors, float(gamma), float(tau), int(batch_size)
        torch.manual_seed(seed)
        self.critic = SharedCritic(c["agents"], c["obs_dim"], c["act_dim"], hidden)
        self.target_actors = copy.deepcopy(actors).requires_grad_(False)
        self.target_critic = copy.deepcopy(self.critic).requires_grad_(False)
        self.actor_opt = torch.optim.Adam(actors.parameters(), lr=lr)
        self.critic_opt = torch.optim.Adam(self.critic.parameters(), lr=lr)
        self.buffer = EpisodeBuffer(buffer_size)
        self.generator = torch.Generator().manual_seed(seed)
        self.updates = 0

    def update(self) -> dict:
        """One critic step and one actor step on ``batch_size`` replayed episodes, then the Polyak updates."""
        obs, act, rew, done = self.buffer.sample(self.batch_size, self.generator)
        q_loss = critic_loss(self.critic, self.target_critic, self.target_actors, obs, act, rew, done, self.gamma)
        self.critic_opt.zero_grad(set_to_none=True)
        q_loss.backward()
        self.critic_opt.step()
        p_loss = actor_objective(self.critic, self.actors, obs[:, :-1])
        self.actor_opt.zero_grad(set_to_none=True)
        p_loss.backward()
        self.actor_opt.step()
        self.critic.zero_grad(set_to_none=True)
        polyak_update(self.target_actors, self.actors, self.tau)
        polyak_update(self.target_critic, self.critic, self.tau)
        self.updates += 1
        return {"q_loss": float(q_loss.detach()), "p_loss": float(p_loss.detach())}

    def state_dict(self) -> dict:
        return {"critic": self.critic.state_dict(), "target_critic": self.target_critic.state_dict(),
                "target_actors": self.target_actors.state_dict(), "actor_opt": self.actor_opt.state_dict(),
                "critic_opt": self.critic_opt.state_dict(), "buffer": self.buffer.state_dict(),
                "generator": self.generator.get_state(), "updates": self.updates}

    def load_state_dict(self, s: dict) -> None:
        self.critic.load_state_dict(s["critic"])
        self.target_critic.load_state_dict(s["target_critic"])
        self.target_actors.load_state_dict(s["target_actors"])
        self.actor_opt.load_state_dict(s["actor_opt"])
        self.critic_opt.load_state_dict(s["critic_opt"])
        self.buffer.load_state_dict(s["buffer"])
        self.generator.set_state(s["generator"])
        self.updates = int(s["updates"])


@torch.no_grad()
def play(env, actors: RecurrentActors, seeds: list[int], sigma: float = 0.0,
         generator: torch.Generator | None = None):
    """Episodes of ``env`` (a policies/_control/envs.py ``Env``) from ``seeds`` with the recurrent actors (noise ``sigma``):
    ``obs [B, T + 1, N, D]``, ``act [B, T, N, A]``, ``rew [B, T, N]``, ``done [B, T]`` (all episodes must have
    the same length)."""
    eps = []
    for s in seeds:
        o = torch.from_numpy(env.reset(s))
        obs, acts, rews, dones, state, done = [o], [], [], [], None, False
        while not done:
            a, state = actors.step(o[None], state)
            a = a[0]
            if sigma > 0:
                a = (a + sigma * torch.randn(a.shape, generator=generator)).clamp(-1, 1)
            o2, r, done, term = env.step(a.numpy())
            o = torch.from_numpy(o2)
            obs.append(o), acts.append(a), rews.append(torch.from_numpy(r))
            dones.append(float(done and term))
        eps.append((torch.stack(obs), torch.stack(acts), torch.stack(rews), torch.tensor(dones)))
    return tuple(torch.stack([e[k] for e in eps]) for k in range(4))


def train_mardpg(env_kwargs: dict | None = None, *, episodes: int = 240, episodes_per_round: int = 8,
                 updates_per_round: int = 8, sigma: float = 0.2, seed: int = 0, eval_seeds: int = 32,
                 hidden: int = 32, msg_dim: int = 4, **learner_kw) -> dict:
    """MARDPG on the recommendation environment (policies/mardpg/rec_env.py): rounds of ``episodes_per_round`` noisy
    episodes into the buffer, then ``updates_per_round`` updates. Returns the training returns per episode (the
    shared objective: the sum of both agents' rewards) and the noiseless policy's mean shared return on
    ``eval_seeds`` held-out users before and after training."""
    from .._control.envs import Env
    env = Env("pettingzoo:grpolab.policies.mardpg.rec_env", env_kwargs or {})
    info = env.info
    torch.manual_seed(seed)
    actors = RecurrentActors(info.agents, info.obs_dim, info.act_dim, hidden, msg_dim)
    learner = MARDPG(actors, hidden=hidden, seed=seed, **learner_kw)
    gen = torch.Generator().manual_seed(seed + 1)
    held_out = list(range(10**6, 10**6 + eval_seeds))

    def evaluate() -> float:
        return float(play(env, actors, held_out)[2].sum((1, 2)).mean())

    before, returns, n = evaluate(), [], 0
    while n < episodes:
        seeds = list(range(seed * 10**5 + n, seed * 10**5 + n + episodes_per_round))
        obs, act, rew, done = play(env, actors, seeds, sigma, gen)
        learner.buffer.add(obs, act, rew.sum(-1), done)
        returns += rew.sum((1, 2)).tolist()
        n += len(seeds)
        if len(learner.buffer) >= learner.batch_size:
            for _ in range(updates_per_round):
                learner.update()
    return {"returns": returns, "before": before, "after": evaluate(), "updates": learner.updates,
            "learner": learner}


if __name__ == "__main__":  # python -m grpolab.policies.mardpg.model EPISODES SEED
    import sys
    a = sys.argv[1:]
    res = train_mardpg(episodes=int(a[0]) if a else 240, seed=int(a[1]) if len(a) > 1 else 0, eval_seeds=16)
    print(f"held-out shared return before {res['before']:.3f} after {res['after']:.3f} "
          f"({res['updates']} updates)", file=sys.stderr)
