"""CAL: off-policy primal-dual safe RL on the control policy (update strategy ``cal``), seed 000-102.

SAC (twin Q, automatic entropy temperature) with an ensemble of cost critics, their UCB cost estimate and the
conservative augmented-Lagrangian actor loss; transitions of the batches policy ``control`` samples go to a
replay buffer, and each step runs gradient updates on minibatches drawn from it.
"""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from ...errors import ConfigError
from ...registry import UPDATE_STRATEGIES, param


# ------------------------------------------------------------------ the formulas (hand-tested)
def ucb_cost(qcs: torch.Tensor, k: float) -> torch.Tensor:
    """``Q_c^UCB = mean_E Q_c + k std_E Q_c`` over the ensemble's first dimension ``[E, ...]`` (the std with
    Bessel's correction, ``torch.std_mean``'s default as in the authors' code; 0 when ``E = 1``)."""
    if qcs.shape[0] == 1:
        return qcs[0]
    std, mean = torch.std_mean(qcs, dim=0)
    return mean + k * std


def rectification(c: float, budget: float, qc_taken: torch.Tensor, lam: float) -> torch.Tensor:
    """``rect = min(c * mean(d - Q_c^UCB(s, a_taken)), lambda)`` (no gradient)."""
    return torch.clamp(c * torch.mean(budget - qc_taken.detach()), max=float(lam))


def actor_loss(alpha: float, logp: torch.Tensor, q_min: torch.Tensor, lam: float, rect: torch.Tensor,
               qc_pi: torch.Tensor) -> torch.Tensor:
    """``mean[alpha log pi(a|s) - min(Q1, Q2)(s, a) + (lambda - rect) Q_c^UCB(s, a)]``, ``a ~ pi(.|s)``
    (reparameterised)."""
    return torch.mean(alpha * logp - q_min + (lam - rect) * qc_pi)


def dual_loss(log_lam: torch.Tensor, budget: float, qc_taken: torch.Tensor) -> torch.Tensor:
    """``mean[lambda (d - Q_c^UCB(s, a_taken))]`` with ``lambda = exp(log_lam)``: a descent step on ``log_lam``
    lowers lambda while the constraint is slack (``Q_c < d``) and raises it while violated."""
    return torch.mean(log_lam.exp() * (budget - qc_taken.detach()))


def cost_budget(episode_limit: float, gamma_c: float, horizon: int) -> float:
    """The per-state budget ``d`` of ``Q_c`` from an episode cost limit: ``limit (1 - gamma_c^T) / (1 - gamma_c)
    / T`` (the authors' Safety-Gym conversion; ``limit`` when ``gamma_c = 1``)."""
    if gamma_c >= 1:
        return float(episode_limit)
    return float(episode_limit) * (1 - gamma_c ** horizon) / (1 - gamma_c) / horizon


# ------------------------------------------------------------------ networks
class EnsembleLinear(nn.Module):
    """``E`` independent linear layers applied to ``[E, B, in]`` at once."""

    def __init__(self, e: int, i: int, o: int):
        super().__init__()
        self.weight = nn.Parameter(torch.empty(e, i, o))
        self.bias = nn.Parameter(torch.empty(e, 1, o))
        bound = 1 / math.sqrt(i)  # nn.Linear's default initialisation, per member
        nn.init.uniform_(self.weight, -bound, bound)
        nn.init.uniform_(self.bias, -bound, bound)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.baddbmm(self.bias, x, self.weight)


class QEnsemble(nn.Module):
    """``E`` Q networks ``Q_e(s, a)`` (ReLU MLPs, 2 hidden layers); ``forward`` -> ``[E, B]``."""

    def __init__(self, obs_dim: int, act_dim: int, e: int, hidden: int):
        super().__init__()
        self.e = e
        self.net = nn.Sequential(EnsembleLinear(e, obs_dim + act_dim, hidden), nn.ReLU(),
                                 EnsembleLinear(e, hidden, hidden), nn.ReLU(), EnsembleLinear(e, hidden, 1))

    def forward(self, s: torch.Tensor, a: torch.Tensor) -> torch.Tensor:
        x = torch.cat([s, a], -1).float()
        return self.net(x[None].expand(self.e, *x.shape))[..., 0]


def _soft_update(target: nn.Module, source: nn.Module, tau: float) -> None:
    with torch.no_grad():
        for t, s in zip(target.parameters(), source.parameters()):
            t.mul_(1 - tau).add_(s, alpha=tau)


def transitions(batch) -> dict[str, torch.Tensor]:
    """The batch's environment steps as transitions ``(s, a, r, c, s', done)``: ``s' = `` the next step's
    observation, or ``row_data["last_obs"]`` after an episode's last step; ``done`` = 1 only at the last step of
    an episode that ended in a terminal state (a time limit bootstraps)."""
    obs, act = batch.step_data["obs"].float(), batch.step_data["action"].float()
    R, T = obs.shape[:2]
    valid = batch.completion_attention_mask > 0
    lengths = valid.sum(1)
    nxt = torch.cat([obs[:, 1:], torch.zeros_like(obs[:, :1])], 1)
    last = batch.row_data["last_obs"].float().reshape(R, -1)
    idx = torch.arange(R)
    nxt[idx, lengths - 1] = last
    done = torch.zeros(R, T)
    done[idx, lengths - 1] = batch.row_data["terminal"].float()
    costs = batch.row_data.get("step_costs")
    costs = torch.zeros(R, T) if costs is None else costs.float()
    return {"s": obs[valid], "a": act[valid], "r": batch.row_data["step_rewards"].float()[valid],
            "c": costs[valid], "s2": nxt[valid], "d": done[valid]}


def _check(cfg) -> None:
    if cfg.policy != "control":
        raise ConfigError(f"update_strategy: cal trains policy control's Gaussian actor (SAC-style) on a replay "
                          f"buffer; set policy: control (got {cfg.policy})")
    if cfg.cal_ensemble < 1 or cfg.cal_batch_size < 1 or cfg.cal_utd <= 0 or cfg.cal_buffer_size < 1:
        raise ConfigError(f"cal_ensemble >= 1, cal_batch_size >= 1, cal_utd > 0, cal_buffer_size >= 1; got "
                          f"{cfg.cal_ensemble}, {cfg.cal_batch_size}, {cfg.cal_utd}, {cfg.cal_buffer_size}")
    if not (0 <= cfg.cal_gamma <= 1 and 0 <= cfg.cal_cost_gamma <= 1 and 0 < cfg.cal_tau <= 1):
        raise ConfigError(f"cal_gamma, cal_cost_gamma in [0, 1] and cal_tau in (0, 1]; got {cfg.cal_gamma}, "
                          f"{cfg.cal_cost_gamma}, {cfg.cal_tau}")


@UPDATE_STRATEGIES.register("cal", check=_check, needs=("control",))
class CAL:
    """CAL's update: SAC with a UCB cost-critic ensemble and a conservative augmented-Lagrangian actor loss.

    Each step's batch (episodes of policy ``control`` from the current actor) is added to a replay buffer
    (``cal_buffer_size`` transitions, FIFO; :func:`transitions`, costs from ``row_data["step_costs"]`` =
    the environment's ``info["cost"]``). Once it holds ``cal_warmup`` transitions, ``ceil(cal_utd x new
    transitions)`` updates run, each on ``cal_batch_size`` transitions drawn uniformly::

        reward critics:  y = r + gamma (1 - done) (min_i Q'_i(s', a') - alpha log pi(a'|s')),  a' ~ pi(.|s')
                         L_Q = sum_i MSE(Q_i(s, a), y)
        cost critics:    y_e = c + gamma_c (1 - done) Q'_{c,e}(s', a')   (each member its own target)
                         L_Qc = mean_e MSE(Q_{c,e}(s, a), y_e)
        UCB:             Q_c^UCB = mean_e Q_{c,e} + k std_e Q_{c,e}                      (:func:`ucb_cost`)
        rectification:   rect = min(c mean(d - Q_c^UCB(s, a_taken)), lambda)            (:func:`rectification`)
        actor:           L_pi = mean[alpha log pi(a|s) - min_i Q_i(s, a) + (lambda - rect) Q_c^UCB(s, a)],
                         a ~ pi(.|s) reparameterised                                     (:func:`actor_loss`)
        temperature:     L_alpha = mean[alpha (-log pi(a|s) - H_target)],  H_target = -dim(A)
        dual:            L_lambda = mean[lambda (d - Q_c^UCB(s, a_taken))]               (:func:`dual_loss`)

    with ``alpha = exp(log_alpha)`` and ``lambda = exp(log_lambda)`` each stepped by Adam (``cal_lr``), the
    critics by Adam (``cal_lr`` / ``cal_cost_lr``), targets ``Q'`` by Polyak averaging (``cal_tau``) every
    ``cal_target_every`` updates, and the actor by the run's optimiser (``learning_rate``). ``(lambda - rect)``
    is the multiplier of the augmented Lagrangian with its quadratic term linearised: it shrinks when the
    constraint is slack (``rect`` > 0) and grows when it is violated (``rect`` < 0, unbounded below). The
    budget ``d`` is :func:`cost_budget` of ``cal_cost_limit`` (an episode's expected cost) over
    ``max_completion_length`` steps.

    The actor is policy control's Gaussian: mean ``mu(s)`` and a state-independent ``log_std``, no tanh
    squashing (SAC's and the authors' actor: a state-dependent std and ``tanh``). The environment receives the
    action clipped to the Box, and the critics read the *unclipped* action (the clip is part of the
    environment as they see it), so ``log pi`` is the plain Gaussian's, without the tanh Jacobian; the
    temperature tuning keeps the std bounded. Q networks: ReLU MLPs (``cal_hidden`` x 2); the cost ensemble's
    members share nothing.

    Metrics: ``cal/lambda``, ``cal/alpha``, ``cal/rect``, ``cal/qc_ucb`` (Q_c^UCB of the taken actions, last
    update), ``cal/budget`` (d), ``cal/q_loss``, ``cal/qc_loss``, ``cal/episode_cost`` (the batch's mean
    episode cost), ``cal/buffer``, ``cal/updates``; ``loss`` is the last actor loss.

    Paper: Wu et al., "Off-Policy Primal-Dual Safe Reinforcement Learning", ICLR 2024 (seed 000-102).

    Provenance: authors' code — https://github.com/ZifanWu/CAL agent/cal.py (``update_critic``: twin-Q soft
    target, the cost ensemble's targets with ``intrgt_max`` off; ``update_actor``: ``std_mean`` over the
    ensemble, ``current_QC`` at the buffer's actions, ``rect = clamp(c mean(target_cost - current_QC),
    max=lam)``, the actor, alpha and ``log_lam`` losses; ``update_parameters``: soft target updates every
    ``critic_target_update_frequency``), arguments.py (k 0.5, qc_ens_size 4, c 10, gamma 0.99, tau 0.005, lr
    3e-4, target update every 2, hidden 256), ``log_lam`` initialised at log 0.6931, ``log_alpha`` at 0; read,
    not copied. Differences: policy control's Gaussian actor (no tanh, state-independent std; see above)
    stepped by the run's optimiser; the replay is fed by whole batches of episodes per step, not one
    environment step at a time with ``num_train_repeat`` updates, and the initial exploration is the initial
    actor, not uniform random actions; no weight decay on the cost ensemble (the authors' ``EnsembleFC`` has
    a decay term); the cost critics' ``(1 - done)`` mask is kept (the authors drop it on Safety-Gym, whose
    episodes end only by time). The Safety-Gym / MuJoCo tasks are replaced by grpolab's constrained
    Gymnasium tasks (policies/control/gymenvs/safety.py; safety-gymnasium pins gymnasium 0.28).
    Test: tests/test_cal.py::test_ucb_cost_by_hand, tests/test_cal.py::test_rect_and_actor_loss_by_hand,
    tests/test_cal.py::test_dual_update_by_hand, tests/test_cal.py::test_cal_raises_return_within_budget.
    """

    def __init__(self, *, cal_k: float = param(0.5, "cal: UCB width k of the cost ensemble (mean + k std)"),
                 cal_ensemble: int = param(4, "cal: cost critics in the ensemble"),
                 cal_c: float = param(10.0, "cal: c, the augmented Lagrangian's penalty coefficient"),
                 cal_cost_limit: float = param(2.0, "cal: the episode cost limit (expected sum of costs)"),
                 cal_gamma: float = param(0.99, "cal: discount of the reward critics"),
                 cal_cost_gamma: float = param(0.99, "cal: discount of the cost critics"),
                 cal_tau: float = param(0.005, "cal: Polyak rate of the target critics"),
                 cal_target_every: int = param(2, "cal: updates between target-critic updates"),
                 cal_lr: float = param(3e-4, "cal: Adam learning rate of the reward critics, alpha and lambda"),
                 cal_cost_lr: float = param(3e-4, "cal: Adam learning rate of the cost critics"),
                 cal_hidden: int = param(256, "cal: hidden units of each critic layer (2 layers)"),
                 cal_batch_size: int = param(256, "cal: transitions per update"),
                 cal_utd: float = param(1.0, "cal: updates per new environment step"),
                 cal_warmup: int = param(1000, "cal: transitions in the buffer before the first update"),
                 cal_buffer_size: int = param(100_000, "cal: replay buffer capacity (transitions)"),
                 cal_lambda_init: float = param(0.6931, "cal: initial lambda (the authors' log(2))"),
                 cal_seed: int = param(0, "cal: seed of the critics' initialisation and the minibatch draws"),
                 max_completion_length: int):
        self.k, self.E, self.c = float(cal_k), int(cal_ensemble), float(cal_c)
        self.gamma, self.gamma_c, self.tau = float(cal_gamma), float(cal_cost_gamma), float(cal_tau)
        self.target_every, self.lr, self.cost_lr = max(int(cal_target_every), 1), float(cal_lr), float(cal_cost_lr)
        self.hidden, self.bs, self.utd = int(cal_hidden), int(cal_batch_size), float(cal_utd)
        self.warmup, self.capacity, self.seed = int(cal_warmup), int(cal_buffer_size), int(cal_seed)
        self.budget = cost_budget(cal_cost_limit, self.gamma_c, int(max_completion_length))
        self.cost_limit = float(cal_cost_limit)
        self.lam_init = float(cal_lambda_init)
        self.built = False
        self.updates = 0
        self.buf: dict[str, torch.Tensor] = {}
        self.size, self.ptr = 0, 0

    # -------------------------------------------------------------- state
    def _build(self, obs_dim: int, act_dim: int) -> None:
        state = torch.random.get_rng_state()
        torch.manual_seed(self.seed)
        self.q = QEnsemble(obs_dim, act_dim, 2, self.hidden)
        self.q_targ = QEnsemble(obs_dim, act_dim, 2, self.hidden)
        self.qc = QEnsemble(obs_dim, act_dim, self.E, self.hidden)
        self.qc_targ = QEnsemble(obs_dim, act_dim, self.E, self.hidden)
        torch.random.set_rng_state(state)
        self.q_targ.load_state_dict(self.q.state_dict())
        self.qc_targ.load_state_dict(self.qc.state_dict())
        self.log_alpha = torch.zeros(1, requires_grad=True)
        self.log_lam = torch.full((1,), math.log(max(self.lam_init, 1e-8)), requires_grad=True)
        self.q_opt = torch.optim.Adam(self.q.parameters(), lr=self.lr)
        self.qc_opt = torch.optim.Adam(self.qc.parameters(), lr=self.cost_lr)
        self.alpha_opt = torch.optim.Adam([self.log_alpha], lr=self.lr)
        self.lam_opt = torch.optim.Adam([self.log_lam], lr=self.lr)
        self.obs_dim, self.act_dim = obs_dim, act_dim
        self.buf = {"s": torch.zeros(self.capacity, obs_dim), "a": torch.zeros(self.capacity, act_dim),
                    "r": torch.zeros(self.capacity), "c": torch.zeros(self.capacity),
                    "s2": torch.zeros(self.capacity, obs_dim), "d": torch.zeros(self.capacity)}
        self.gen = torch.Generator().manual_seed(self.seed)
        self.built = True

    def _nets(self) -> dict:
        return {"q": self.q, "q_targ": self.q_targ, "qc": self.qc, "qc_targ": self.qc_targ}

    def _opts(self) -> dict:
        return {"q_opt": self.q_opt, "qc_opt": self.qc_opt, "alpha_opt": self.alpha_opt, "lam_opt": self.lam_opt}

    def state_dict(self) -> dict:
        if not self.built:
            return {"built": False}
        n = self.size
        return {"built": True, "dims": (self.obs_dim, self.act_dim), "updates": self.updates, "size": n,
                "ptr": self.ptr, "buffer": {k: v[:n].clone() for k, v in self.buf.items()},
                "log_alpha": self.log_alpha.detach().clone(), "log_lam": self.log_lam.detach().clone(),
                "gen": self.gen.get_state(),
                **{k: m.state_dict() for k, m in self._nets().items()},
                **{k: o.state_dict() for k, o in self._opts().items()}}

    def load_state_dict(self, state: dict) -> None:
        if not state.get("built"):
            self.built = False
            return
        self._build(*state["dims"])
        for k, m in self._nets().items():
            m.load_state_dict(state[k])
        with torch.no_grad():
            self.log_alpha.copy_(state["log_alpha"])
            self.log_lam.copy_(state["log_lam"])
        for k, o in self._opts().items():
            o.load_state_dict(state[k])
        self.updates, self.size, self.ptr = int(state["updates"]), int(state["size"]), int(state["ptr"])
        for k, v in state["buffer"].items():
            self.buf[k][:len(v)] = v
        self.gen.set_state(state["gen"])

    # -------------------------------------------------------------- the step
    def _add(self, tr: dict) -> None:
        n = len(tr["s"])
        idx = (self.ptr + torch.arange(n)) % self.capacity
        for k, v in tr.items():
            self.buf[k][idx] = v.reshape(self.buf[k][idx].shape)
        self.ptr = int((self.ptr + n) % self.capacity)
        self.size = min(self.size + n, self.capacity)

    def _policy_sample(self, model, s: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        mu = model(s).float()
        std = model.log_std.float().exp()
        a = mu + std * torch.randn(mu.shape, generator=self.gen)
        logp = (-0.5 * ((a - mu) / std).pow(2) - model.log_std.float() - 0.5 * math.log(2 * math.pi)).sum(-1)
        return a, logp

    def update_once(self, model, optimizer, b: dict) -> dict:
        """One CAL update on the minibatch ``b`` (class docstring)."""
        s, a, r, c, s2, d = b["s"], b["a"], b["r"], b["c"], b["s2"], b["d"]
        alpha = float(self.log_alpha.detach().exp())
        with torch.no_grad():
            a2, logp2 = self._policy_sample(model, s2)
            y = r + self.gamma * (1 - d) * (self.q_targ(s2, a2).min(0).values - alpha * logp2)
            yc = c[None] + self.gamma_c * (1 - d[None]) * self.qc_targ(s2, a2)
        q_loss = F.mse_loss(self.q(s, a), y[None].expand(2, -1), reduction="none").mean(1).sum()
        self.q_opt.zero_grad(set_to_none=True)
        q_loss.backward()
        self.q_opt.step()
        qc_loss = F.mse_loss(self.qc(s, a), yc)
        self.qc_opt.zero_grad(set_to_none=True)
        qc_loss.backward()
        self.qc_opt.step()

        api, logp = self._policy_sample(model, s)
        q_min = self.q(s, api).min(0).values
        qc_pi = ucb_cost(self.qc(s, api), self.k)
        with torch.no_grad():
            qc_taken = ucb_cost(self.qc(s, a), self.k)
        lam = float(self.log_lam.detach().exp())
        rect = rectification(self.c, self.budget, qc_taken, lam)
        loss = actor_loss(alpha, logp, q_min, lam, rect, qc_pi)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        for p in list(self.q.parameters()) + list(self.qc.parameters()):
            p.grad = None  # the actor's backward reached the critics; their gradients are not used

        alpha_loss = torch.mean(self.log_alpha.exp() * (-logp.detach() + self.act_dim))
        self.alpha_opt.zero_grad(set_to_none=True)
        alpha_loss.backward()
        self.alpha_opt.step()
        lam_loss = dual_loss(self.log_lam, self.budget, qc_taken)
        self.lam_opt.zero_grad(set_to_none=True)
        lam_loss.backward()
        self.lam_opt.step()

        self.updates += 1
        if self.updates % self.target_every == 0:
            _soft_update(self.q_targ, self.q, self.tau)
            _soft_update(self.qc_targ, self.qc, self.tau)
        return {"loss": float(loss.detach()), "cal/q_loss": float(q_loss.detach()),
                "cal/qc_loss": float(qc_loss.detach()), "cal/rect": float(rect), "cal/qc_ucb": float(qc_taken.mean())}

    def __call__(self, batch, model, optimizer):
        if model.config["discrete"] or model.config["agents"] != 1:
            raise ConfigError("update_strategy: cal needs one agent with a Box action space (a Gaussian actor); "
                              f"this environment has discrete={model.config['discrete']}, "
                              f"agents={model.config['agents']}")
        tr = transitions(batch)
        if not self.built:
            self._build(tr["s"].shape[-1], tr["a"].shape[-1])
        self._add(tr)
        model.train()
        n = math.ceil(self.utd * len(tr["s"])) if self.size >= self.warmup else 0
        out: dict = {"loss": 0.0}
        for _ in range(n):
            i = torch.randint(self.size, (min(self.bs, self.size),), generator=self.gen)
            out = self.update_once(model, optimizer, {k: v[i] for k, v in self.buf.items()})
        model.eval()
        ep_cost = float(batch.row_data.get("step_costs", torch.zeros(1, 1)).sum(1).mean())
        # grad_norm: not measured (the critics' and actor's own optimisers), null rather than a 0 that reads as
        # "nothing trained" (report/doctor.py)
        return {**out, "grad_norm": None, "skipped": 0, "kl": None, "entropy": None, "clip_frac_low": 0.0,
                "clip_frac_high": 0.0, "cal/lambda": float(self.log_lam.detach().exp()),
                "cal/alpha": float(self.log_alpha.detach().exp()),
                "cal/budget": self.budget, "cal/episode_cost": ep_cost, "cal/buffer": float(self.size),
                "cal/updates": float(n)}
