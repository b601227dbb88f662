"""MADDPG: decentralised actors, centralised critics, Gumbel-softmax actions, target networks, replay, policy
ensembles (seed 000-99).

*Multi-Agent Actor-Critic for Mixed Cooperative-Competitive Environments* (Lowe, Wu, Tamar, Harb, Abbeel,
Mordatch, NeurIPS 2017, arXiv:1706.02275), seed 000-99. For N agents with observations ``o_j``, one-hot (or
relaxed) actions ``a_j`` and actors ``mu_j`` that output logits ``z_j = mu_j(o_j)``:

- centralised critic of agent i: ``Q_i(x, a_1..a_N)`` with ``x = (o_1..o_N)``; its input is the concatenation
  ``[o_1, .., o_N, a_1, .., a_N]`` (:func:`critic_input`); with ``local_q`` (the paper's DDPG baseline, the
  authors' ``local_q_func``) it is ``[o_i, a_i]``;
- critic loss ``L(Q_i) = mean (Q_i(x, a) - y)^2`` with the TD target (:func:`td_target`)
  ``y = r_i + gamma (1 - done) Q_i'(x', a_1'..a_N')``, ``a_j' = gumbel_softmax(mu_j'(o_j'))`` from the target
  actors;
- actor loss (:func:`actor_loss`) ``L(mu_i) = -mean Q_i(x, a_1..a_i = gumbel_softmax(z_i)..a_N) +
  1e-3 mean z_i^2`` (the other agents' actions from the replay sample);
- Gumbel-softmax relaxation (:func:`gumbel_softmax`, temperature 1): ``softmax(z - log(-log u))``, ``u ~
  U(0, 1)``; its argmax is a draw from ``softmax(z)`` (the Gumbel-max trick), so the environment gets that
  hard action;
- target networks by Polyak averaging (:func:`polyak_update`) ``theta' <- (1 - tau) theta' + tau theta``,
  ``tau = 0.01``, each agent's targets moved right after its own update; each variable's gradient norm
  clipped at 0.5 on its own (:func:`clip_gradients`); Adam, lr 1e-2, gamma 0.95, 2 x 64 ReLU MLPs;
- policy ensembles: each agent keeps K sub-policies (actor, critic, targets, replay buffer each); one is drawn
  uniformly per agent per episode and the episode's transitions go to the drawn sub-policy's buffer; the
  critic of agent i's sub-policy k bootstraps with the target actors of the sub-policies the other agents
  used in that transition (stored with it).

:class:`MADDPG` holds the networks, optimisers and buffers (``state_dict``/``load_state_dict`` carry them);
:func:`train_maddpg` is the authors' loop (experiments/train.py) on a grpolab environment (policies/_control/envs.py);
update strategy ``maddpg`` (policies/control/maddpg_update.py) runs the same learner on the control policy's rollouts.

Provenance: authors' code — https://github.com/openai/maddpg maddpg/trainer/maddpg.py (``q_train``: MSE to
``rew + gamma (1 - done) target_q``, ``q_input = concat(obs_n + act_n)`` or ``[obs_i, act_i]`` with
``local_q_func``; ``p_train``: ``-mean(q) + 1e-3 mean(flatparam^2)`` with the agent's action replaced by a
sample of its distribution; ``make_update_exp``: polyak 1 - 1e-2; ``grad_norm_clipping=0.5``; update every 100
steps once the buffer holds ``batch_size * max_episode_len``), maddpg/common/distributions.py
(``SoftCategoricalPd.sample``: ``softmax(logits - log(-log(u)))``), experiments/train.py (lr 1e-2, gamma 0.95,
batch 1024, 64 units; done from the environment, never at the time limit); read, not copied. Our choices: the
environment receives the hard (argmax) action of the Gumbel-softmax sample and the buffer stores its one-hot
(the authors' MPE took the soft vector as a continuous force; mpe2's default discrete action space takes an
integer); the policy ensembles are the paper's Section 4.3 and NOT in the authors' repository (its README says
the ensemble code was released separately): the per-sub-policy buffers follow the paper, the choice of the
other agents' target sub-policies (those stored with the transition) is ours. With a shared actor (update
strategy ``maddpg`` on the control policy: one actor for every agent, the agent's one-hot in its input) the
agents' actor losses are summed into one step of that actor. ``batch_size``, ``update_every`` and the warm-up
are parameters (the tests use smaller ones than the authors' 1024 / 100 / 25 600).
"""
from __future__ import annotations

import copy

import numpy as np
import torch
from torch import nn

from ...errors import ConfigError

REG = 1e-3  # the authors' p_reg weight on mean(logits^2)


# ------------------------------------------------------------------ the formulas
def gumbel_softmax(logits: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
    """``softmax(z - log(-log u))`` over the last axis (``u`` uniform in (0, 1), the logits' shape)."""
    return torch.softmax(logits - torch.log(-torch.log(u)), -1)


def td_target(rew: torch.Tensor, done: torch.Tensor, q_next: torch.Tensor, gamma: float) -> torch.Tensor:
    """``y = r + gamma (1 - done) Q'(x', a')``."""
    return rew + gamma * (1.0 - done.float()) * q_next


def actor_loss(q: torch.Tensor, logits: torch.Tensor, reg: float = REG) -> torch.Tensor:
    """``-mean Q + reg * mean(z^2)`` (``z``: the actor's logits)."""
    return -q.mean() + reg * logits.pow(2).mean()


@torch.no_grad()
def polyak_update(target: nn.Module, source: nn.Module, tau: float) -> None:
    """``theta' <- (1 - tau) theta' + tau theta`` for every parameter."""
    for pt, p in zip(target.parameters(), source.parameters()):
        pt.mul_(1.0 - tau).add_(p, alpha=tau)


CLIP_MODES = ("per_variable", "global")
TARGET_UPDATES = ("per_agent", "after_all")


def clip_gradients(params, max_norm: float, mode: str = "per_variable") -> None:
    """Gradient clipping at ``max_norm``: ``per_variable`` (the authors': openai/maddpg
    maddpg/common/tf_util.py ``minimize_and_clip`` applies ``tf.clip_by_norm(grad, clip_val)`` to each variable's
    gradient on its own, ``g <- g * min(1, c / ||g||)`` per tensor) or ``global`` (``clip_grad_norm_``: one
    factor ``min(1, c / ||(g_1..g_n)||)`` for all). Test:
    tests/test_maddpg.py::test_per_variable_clipping_and_per_agent_targets_as_the_authors."""
    params = [p for p in params if p.grad is not None]
    if mode == "global":
        nn.utils.clip_grad_norm_(params, max_norm)
        return
    for p in params:
        nn.utils.clip_grad_norm_([p], max_norm)


def critic_input(obs: torch.Tensor, act: torch.Tensor, i: int, local: bool = False) -> torch.Tensor:
    """``[o_1..o_N, a_1..a_N]`` (``obs [B, N, D]``, ``act [B, N, A]``) or, ``local``, ``[o_i, a_i]``."""
    if local:
        return torch.cat([obs[:, i], act[:, i]], -1)
    return torch.cat([obs.flatten(1), act.flatten(1)], -1)


def relu_mlp(inp: int, hidden: int, out: int) -> nn.Sequential:
    """The authors' ``mlp_model``: two ReLU layers of ``hidden`` units, a linear output."""
    return nn.Sequential(nn.Linear(inp, hidden), nn.ReLU(), nn.Linear(hidden, hidden), nn.ReLU(),
                         nn.Linear(hidden, out))


# ------------------------------------------------------------------ replay
class ReplayBuffer:
    """A ring buffer of joint transitions ``(x [N, Din], a [N] int, r [N], x' [N, Din], done, ks [N])``
    (``ks``: each agent's sub-policy in that episode)."""

    def __init__(self, size: int, agents: int, din: int):
        self.size, self.n, self.pos = int(size), 0, 0
        self.x = torch.zeros(self.size, agents, din)
        self.a = torch.zeros(self.size, agents, dtype=torch.long)
        self.r = torch.zeros(self.size, agents)
        self.x2 = torch.zeros(self.size, agents, din)
        self.done = torch.zeros(self.size)
        self.ks = torch.zeros(self.size, agents, dtype=torch.long)

    def __len__(self) -> int:
        return self.n

    def add(self, x, a, r, x2, done, ks) -> None:
        """Add ``B`` transitions (leading axis B)."""
        B = len(x)
        if B > self.size:  # only the newest ``size`` fit
            x, a, r, x2, done, ks = (v[-self.size:] for v in (x, a, r, x2, done, ks))
            B = self.size
        p = (self.pos + torch.arange(B)) % self.size
        self.x[p], self.a[p], self.r[p], self.x2[p] = x, a, r, x2
        self.done[p], self.ks[p] = torch.as_tensor(done, dtype=torch.float32), ks
        self.pos = (self.pos + B) % self.size
        self.n = min(self.n + B, self.size)

    def sample(self, batch: int, generator: torch.Generator):
        idx = torch.randint(0, self.n, (batch,), generator=generator)
        return self.x[idx], self.a[idx], self.r[idx], self.x2[idx], self.done[idx], self.ks[idx]

    def state_dict(self) -> dict:
        return {"n": self.n, "pos": self.pos, **{k: getattr(self, k)[:self.n].clone()
                                                  for k in ("x", "a", "r", "x2", "done", "ks")}}

    def load_state_dict(self, s: dict) -> None:
        self.n, self.pos = int(s["n"]), int(s["pos"])
        for k in ("x", "a", "r", "x2", "done", "ks"):
            getattr(self, k)[:self.n] = s[k]


# ------------------------------------------------------------------ the learner
class MADDPG:
    """Actors ``actors[k][i]`` (modules from an agent's input ``[B, Din]`` to logits ``[B, A]``; one module may
    serve several agents), centralised critics ``critics[k][i]``, their targets, Adam optimisers and one replay
    buffer per (sub-policy k, agent i). ``obs_dim``: the part of an agent's input the critics see (the first
    ``obs_dim`` entries; the shared actor's agent one-hot is left out)."""

    def __init__(self, actors: list[list[nn.Module]], obs_dim: int, act_dim: int, *, gamma: float = 0.95,
                 tau: float = 0.01, lr: float = 1e-2, hidden: int = 64, batch_size: int = 1024,
                 buffer_size: int = 1_000_000, grad_clip: float = 0.5, local_q: bool = False, seed: int = 0,
                 clip_mode: str = "per_variable", target_update: str = "per_agent"):
        if not actors or not actors[0]:
            raise ConfigError("maddpg: no actors")
        self.K, self.N = len(actors), len(actors[0])
        self.obs_dim, self.act_dim = int(obs_dim), int(act_dim)
        self.gamma, self.tau, self.grad_clip, self.local_q = float(gamma), float(tau), float(grad_clip), local_q
        if clip_mode not in CLIP_MODES or target_update not in TARGET_UPDATES:
            raise ConfigError(f"maddpg: clip mode one of {CLIP_MODES} (got {clip_mode!r}), target update one of "
                              f"{TARGET_UPDATES} (got {target_update!r})")
        self.clip_mode, self.target_update = clip_mode, target_update
        self.batch_size = int(batch_size)
        self.actors = actors
        uniq = {id(m): m for row in actors for m in row}
        self.actor_modules = list(uniq.values())
        self.target_of = {mid: copy.deepcopy(m).requires_grad_(False) for mid, m in uniq.items()}
        cin = (self.obs_dim + self.act_dim) * (1 if local_q else self.N)
        torch.manual_seed(seed)
        self.critics = [[relu_mlp(cin, hidden, 1) for _ in range(self.N)] for _ in range(self.K)]
        self.target_critics = [[copy.deepcopy(c).requires_grad_(False) for c in row] for row in self.critics]
        self.actor_opt = {mid: torch.optim.Adam(m.parameters(), lr=lr) for mid, m in uniq.items()}
        self.critic_opt = [[torch.optim.Adam(c.parameters(), lr=lr) for c in row] for row in self.critics]
        self.buffer_size = int(buffer_size)
        self.buffers: list[list[ReplayBuffer]] | None = None
        self.generator = torch.Generator().manual_seed(seed)
        self.updates = 0

    # ---- acting
    def target_actor(self, k: int, i: int) -> nn.Module:
        return self.target_of[id(self.actors[k][i])]

    def _buffers(self, din: int) -> list[list[ReplayBuffer]]:
        if self.buffers is None:
            self.buffers = [[ReplayBuffer(self.buffer_size, self.N, din) for _ in range(self.N)]
                            for _ in range(self.K)]
        return self.buffers

    def add(self, x, a, r, x2, done, ks) -> None:
        """Store ``B`` joint transitions; each goes to the buffer of every agent's sub-policy ``ks[:, i]``."""
        bufs = self._buffers(x.shape[-1])
        ks = torch.as_tensor(ks, dtype=torch.long)
        for k in range(self.K):
            for i in range(self.N):
                sel = (ks[:, i] == k).nonzero(as_tuple=True)[0]
                if len(sel):
                    bufs[k][i].add(x[sel], a[sel], r[sel], x2[sel], done[sel], ks[sel])

    def ready(self, min_size: int) -> bool:
        return self.buffers is not None and all(len(b) >= max(min_size, 1) for row in self.buffers for b in row)

    def _u(self, shape) -> torch.Tensor:
        return torch.rand(shape, generator=self.generator).clamp(1e-12, 1 - 1e-7)

    # ---- one update of every (k, i)
    def update(self) -> dict:
        """One critic and one actor step for every agent's every sub-policy, on a fresh sample of its own
        buffer, each target moving by ``tau``: with ``target_update`` ``per_agent`` (the authors': in
        experiments/train.py each ``agent.update`` ends with its own ``p_update``/``q_update``, so a later agent's
        TD target already reads the earlier agents' moved target actors) right after its own update (an actor
        module shared by several agents moves once, after the last of them); with ``after_all`` every target
        after all the updates. Returns the mean critic and actor losses."""
        q_losses, p_losses = [], []
        order = [(k, i) for k in range(self.K) for i in range(self.N)]
        last = {id(self.actors[k][i]): (k, i) for k, i in order}
        for k, i in order:
            ql, pl = self._update_one(k, i)
            q_losses.append(ql)
            p_losses.append(pl)
            if self.target_update == "per_agent":
                polyak_update(self.target_critics[k][i], self.critics[k][i], self.tau)
                if last[id(self.actors[k][i])] == (k, i):
                    polyak_update(self.target_actor(k, i), self.actors[k][i], self.tau)
        if self.target_update == "after_all":
            for mid, m in zip(self.target_of, self.actor_modules):
                polyak_update(self.target_of[mid], m, self.tau)
            for row, trow in zip(self.critics, self.target_critics):
                for c, ct in zip(row, trow):
                    polyak_update(ct, c, self.tau)
        self.updates += 1
        return {"q_loss": float(np.mean(q_losses)), "p_loss": float(np.mean(p_losses))}

    def _update_one(self, k: int, i: int) -> tuple[float, float]:
        x, a, r, x2, done, ks = self.buffers[k][i].sample(self.batch_size, self.generator)
        A, D = self.act_dim, self.obs_dim
        onehot = torch.nn.functional.one_hot(a, A).float()  # [B, N, A]
        with torch.no_grad():  # next actions from the target actors of the stored sub-policies
            a2 = torch.zeros_like(onehot)
            for j in range(self.N):
                for kj in range(self.K):
                    sel = ks[:, j] == kj
                    if sel.any():
                        z = self.target_actor(kj, j)(x2[sel, j])
                        a2[sel, j] = gumbel_softmax(z, self._u(z.shape))
            q_next = self.target_critics[k][i](critic_input(x2[..., :D], a2, i, self.local_q))[:, 0]
            y = td_target(r[:, i], done, q_next, self.gamma)
        critic, opt = self.critics[k][i], self.critic_opt[k][i]
        q = critic(critic_input(x[..., :D], onehot, i, self.local_q))[:, 0]
        q_loss = (q - y).pow(2).mean()
        opt.zero_grad(set_to_none=True)
        q_loss.backward()
        clip_gradients(critic.parameters(), self.grad_clip, self.clip_mode)
        opt.step()
        # actor: agent i's action relaxed through the Gumbel-softmax, the others' from the replay sample
        actor = self.actors[k][i]
        z = actor(x[:, i])
        act = onehot.clone()
        act[:, i] = gumbel_softmax(z, self._u(z.shape))
        p_loss = actor_loss(critic(critic_input(x[..., :D], act, i, self.local_q))[:, 0], z)
        aopt = self.actor_opt[id(actor)]
        aopt.zero_grad(set_to_none=True)
        critic.zero_grad(set_to_none=True)
        p_loss.backward()
        clip_gradients(actor.parameters(), self.grad_clip, self.clip_mode)
        aopt.step()
        critic.zero_grad(set_to_none=True)
        return float(q_loss.detach()), float(p_loss.detach())

    # ---- checkpoints
    def state_dict(self) -> dict:
        return {"critics": [[c.state_dict() for c in row] for row in self.critics],
                "target_critics": [[c.state_dict() for c in row] for row in self.target_critics],
                "target_actors": [t.state_dict() for t in self.target_of.values()],
                "actor_opt": [o.state_dict() for o in self.actor_opt.values()],
                "critic_opt": [[o.state_dict() for o in row] for row in self.critic_opt],
                "buffers": None if self.buffers is None else [[b.state_dict() for b in row] for row in self.buffers],
                "buffer_din": None if self.buffers is None else self.buffers[0][0].x.shape[-1],
                "generator": self.generator.get_state(), "updates": self.updates}

    def load_state_dict(self, s: dict) -> None:
        for row, srow in zip(self.critics, s["critics"]):
            for c, sc in zip(row, srow):
                c.load_state_dict(sc)
        for row, srow in zip(self.target_critics, s["target_critics"]):
            for c, sc in zip(row, srow):
                c.load_state_dict(sc)
        for t, st in zip(self.target_of.values(), s["target_actors"]):
            t.load_state_dict(st)
        for o, so in zip(self.actor_opt.values(), s["actor_opt"]):
            o.load_state_dict(so)
        for row, srow in zip(self.critic_opt, s["critic_opt"]):
            for o, so in zip(row, srow):
                o.load_state_dict(so)
        if s["buffers"] is not None:
            bufs = self._buffers(int(s["buffer_din"]))
            for row, srow in zip(bufs, s["buffers"]):
                for b, sb in zip(row, srow):
                    b.load_state_dict(sb)
        self.generator.set_state(s["generator"])
        self.updates = int(s["updates"])


# ------------------------------------------------------------------ the authors' loop
def train_maddpg(env: str = "pettingzoo:mpe2.simple_spread_v3", env_kwargs: dict | None = None, *,
                 episodes: int = 1000, ensemble: int = 1, local_q: bool = False, seed: int = 0,
                 lr: float = 1e-2, gamma: float = 0.95, tau: float = 0.01, hidden: int = 64,
                 batch_size: int = 1024, update_every: int = 100, warmup: int | None = None,
                 buffer_size: int = 1_000_000, max_steps: int = 25) -> dict:
    """MADDPG as in the authors' experiments/train.py on a grpolab environment (policies/_control/envs.py): per agent K =
    ``ensemble`` sub-policies (own 2 x ``hidden`` ReLU actors), one drawn per agent per episode; the hard
    Gumbel-max action is played; after every environment step, once every buffer holds ``warmup`` transitions
    (default ``batch_size * max_steps``, the authors'), every ``update_every``-th step runs :meth:`MADDPG.update`.
    Returns ``{"returns": [per episode, the mean over agents of each agent's summed reward], "updates": n}``."""
    from .envs import Env
    e = Env(env, {"N": 3, "max_cycles": 25} if env_kwargs is None else env_kwargs)
    info = e.info
    if not info.discrete:
        raise ConfigError(f"maddpg: env {env} has a continuous action space; MADDPG's Gumbel-softmax actors here "
                          f"act in Discrete spaces")
    N, D, A = info.agents, info.obs_dim, info.act_dim
    torch.manual_seed(seed)
    actors = [[relu_mlp(D, hidden, A) for _ in range(N)] for _ in range(ensemble)]
    learner = MADDPG(actors, D, A, gamma=gamma, tau=tau, lr=lr, hidden=hidden, batch_size=batch_size,
                     buffer_size=buffer_size, local_q=local_q, seed=seed)
    warmup = batch_size * max_steps if warmup is None else warmup
    rng = np.random.default_rng(seed)
    returns, t = [], 0
    for ep in range(episodes):
        ks = rng.integers(0, ensemble, N)
        o = torch.from_numpy(e.reset(seed * 1_000_003 + ep))
        total = np.zeros(N)
        for _ in range(max_steps):
            with torch.no_grad():
                a = torch.stack([gumbel_softmax(z, learner._u(z.shape)).argmax(-1) for z in
                                 (actors[ks[i]][i](o[i]) for i in range(N))])
            o2, rew, done, term = e.step(a.numpy())
            o2 = torch.from_numpy(o2)
            learner.add(o[None], a[None], torch.from_numpy(rew)[None], o2[None], torch.tensor([float(term)]),
                        torch.from_numpy(ks)[None])
            total += rew
            o, t = o2, t + 1
            if learner.ready(warmup) and t % update_every == 0:
                learner.update()
            if done:
                break
        returns.append(float(total.mean()))
    return {"returns": returns, "updates": learner.updates, "learner": learner}


if __name__ == "__main__":  # python -m grpolab.policies._control.maddpg EPISODES SEED [K] [local]
    import sys
    args = sys.argv[1:]
    out = train_maddpg(episodes=int(args[0]) if args else 1000, seed=int(args[1]) if len(args) > 1 else 0,
                       ensemble=int(args[2]) if len(args) > 2 else 1, local_q=len(args) > 3 and args[3] == "local",
                       batch_size=128, update_every=4, warmup=128)
    r = out["returns"]
    print(f"episodes {len(r)}, updates {out['updates']}; mean return per 50 episodes: "
          f"{[round(float(np.mean(r[i:i + 50])), 2) for i in range(0, len(r), 50)]}", file=sys.stderr)
