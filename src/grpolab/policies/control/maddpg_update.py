"""MADDPG as an update strategy on the control policy's rollouts (update strategy ``maddpg``), seed 000-99."""
from __future__ import annotations

import torch

from .._control.maddpg import MADDPG, critic_input, td_target
from ...errors import ConfigError
from ...registry import UPDATE_STRATEGIES, param


def _check(cfg) -> None:
    if cfg.policy != "control":
        raise ConfigError(f"update_strategy: maddpg trains the control policy's actor with centralised critics; it "
                          f"needs policy: control (got {cfg.policy})")


def batch_transitions(batch) -> tuple[torch.Tensor, ...]:
    """The joint transitions of a control batch: ``(x [B, N, Din], a [B, N], r [B, N], x' [B, N, Din],
    done [B])`` for every step of every episode (policy control's layout: column ``t * N + i``). ``x'`` of an
    episode's last step is ``row_data["last_obs"]``; ``done`` is 1 only there and only when the episode ended
    in a terminal state (a time limit bootstraps, as the authors' loop)."""
    rd, sd = batch.row_data, batch.step_data
    if rd is None or "last_obs" not in rd or sd is None or "obs" not in sd:
        raise ConfigError("update_strategy: maddpg needs the control policy's step_data (obs, action) and "
                          "row_data (step_rewards, terminal, last_obs, agents)")
    R, TN = batch.completion_mask.shape
    N = int(rd["agents"][0])
    T = TN // N
    x = sd["obs"].reshape(R, T, N, -1)
    if x.dtype == torch.long or sd["action"].dim() != 2:
        raise ConfigError("update_strategy: maddpg acts in Discrete action spaces (Gumbel-softmax actors)")
    a = sd["action"].reshape(R, T, N)
    r = rd["step_rewards"].reshape(R, T, N)
    lengths = batch.completion_attention_mask.reshape(R, T, N)[:, :, 0].sum(1).long()
    xs, as_, rs, x2s, ds = [], [], [], [], []
    for j in range(R):
        L = int(lengths[j])
        if L == 0:
            continue
        nxt = torch.cat([x[j, 1:L], rd["last_obs"][j][None].to(x.dtype)], 0)
        done = torch.zeros(L)
        done[-1] = float(bool(rd["terminal"][j]))
        xs.append(x[j, :L]), as_.append(a[j, :L]), rs.append(r[j, :L]), x2s.append(nxt), ds.append(done)
    return torch.cat(xs), torch.cat(as_).long(), torch.cat(rs), torch.cat(x2s), torch.cat(ds)


@UPDATE_STRATEGIES.register("maddpg", check=_check)
class MADDPGUpdate:
    """MADDPG's training on the control policy's episodes (the formulas: policies/_control/maddpg.py). Each step adds the
    batch's joint transitions to the replay buffer (:func:`batch_transitions`), counts them as environment
    steps, and for every ``maddpg_update_every`` steps counted once the buffer holds ``maddpg_warmup``
    transitions runs one MADDPG update: for each agent i, a critic step of ``Q_i(o_1..o_N, a_1..a_N)`` to the TD
    target ``r_i + gamma (1 - done) Q_i'(o', a')`` (``a'`` Gumbel-softmax samples of the target actor) and an
    actor step of ``-mean Q_i(.., gumbel_softmax(z_i), ..) + 1e-3 mean z_i^2``, each variable's gradient
    clipped at 0.5 on its own (``maddpg_clip_mode``), the agent's targets moved by tau right after its own update
    (``maddpg_target_update``), as the authors'. The actor is the control policy's one shared MLP (the agent's
    one-hot in its input; its logits are the MADDPG actor's, its categorical draws are the Gumbel-max draws
    of the relaxation), so the agents' actor losses are summed into one step of it; the critics (one per agent,
    2 x ``maddpg_hidden`` ReLU, over the observations without the one-hot), the target actor and critics,
    their Adam optimisers (lr ``maddpg_lr``) and the buffer are this component's state (``state_dict``).
    ``maddpg_local_q``: the DDPG baseline, each critic sees only ``(o_i, a_i)``.

    Not used: the trainer's optimiser and ``learning_rate``, ``num_iterations``, the advantages and the policy
    loss (rollouts are the exploration; ``temperature`` scales the exploration draw only). ``loss`` is the mean
    critic loss of the step's updates, or, before the first update, the critics' mean squared TD error on the
    step's new transitions. Metrics: ``maddpg/q_loss``, ``maddpg/p_loss``, ``maddpg/updates`` (this step),
    ``maddpg/buffer`` (transitions held). Policy ensembles run in ``train_maddpg`` (policies/_control/maddpg.py), not
    here: the control policy draws every agent's action from one actor.

    Paper: Lowe et al., "Multi-Agent Actor-Critic for Mixed Cooperative-Competitive Environments", NeurIPS
    2017, arXiv:1706.02275 (seed 000-99).

    Provenance: authors' code — https://github.com/openai/maddpg maddpg/trainer/maddpg.py (q_train, p_train,
    make_update_exp, MADDPGAgentTrainer.update: every 100 steps once the buffer holds batch_size x
    max_episode_len), maddpg/common/distributions.py (SoftCategoricalPd); read, not copied. Our choices: one
    actor shared by the agents (the control policy's; the authors: one per agent), a tanh actor with CleanRL's
    initialisation (the control policy's; the authors: ReLU), the hard action played and its one-hot stored;
    batch, warm-up and update interval as parameters (the recipe: smaller than the authors' 1024 / 25 600 /
    100). Test: tests/test_maddpg.py::test_td_target_and_actor_loss_by_hand,
    tests/test_maddpg.py::test_gumbel_softmax_by_hand, tests/test_maddpg.py::test_polyak_update_by_hand,
    tests/test_maddpg.py::test_centralised_critic_sees_every_agents_observation_and_action,
    tests/test_maddpg.py::test_update_strategy_trains_and_checkpoints_its_state.
    """

    def __init__(self, *,
                 maddpg_gamma: float = param(0.95, "MADDPG: discount (the authors' 0.95)"),
                 maddpg_tau: float = param(0.01, "MADDPG: Polyak rate of the target networks (the authors' 0.01)"),
                 maddpg_lr: float = param(1e-2, "MADDPG: Adam learning rate of the actor and the critics (1e-2)"),
                 maddpg_hidden: int = param(64, "MADDPG: hidden units of the critics' two ReLU layers (64)"),
                 maddpg_batch_size: int = param(1024, "MADDPG: transitions per critic / actor step (1024)"),
                 maddpg_buffer_size: int = param(1_000_000, "MADDPG: replay buffer capacity in transitions (1e6)"),
                 maddpg_update_every: int = param(100, "MADDPG: environment steps between updates (100)"),
                 maddpg_warmup: int = param(25_600, "MADDPG: transitions in the buffer before the first update "
                                            "(the authors' batch_size x max_episode_len = 25600)"),
                 maddpg_grad_clip: float = param(0.5, "MADDPG: gradient-norm clip of every step (0.5)"),
                 maddpg_local_q: bool = param(False, "MADDPG: critics see only the agent's own observation and "
                                              "action (the paper's DDPG baseline)"),
                 maddpg_clip_mode: str = param("per_variable", "MADDPG: clip each variable's gradient norm on its "
                                               "own (per_variable, the authors' tf.clip_by_norm per variable) or "
                                               "their global norm (global, clip_grad_norm_)",
                                               ["per_variable", "global"]),
                 maddpg_target_update: str = param("per_agent", "MADDPG: move an agent's target networks right "
                                                   "after its own update (per_agent, the authors') or all "
                                                   "after every agent's (after_all)", ["per_agent", "after_all"]),
                 seed: int = 0):
        if maddpg_batch_size < 1 or maddpg_update_every < 1 or maddpg_buffer_size < 1 or maddpg_warmup < 0:
            raise ConfigError(f"maddpg_batch_size, maddpg_update_every, maddpg_buffer_size >= 1 and maddpg_warmup "
                              f">= 0, got {maddpg_batch_size}, {maddpg_update_every}, {maddpg_buffer_size}, "
                              f"{maddpg_warmup}")
        if not 0 < maddpg_tau <= 1 or not 0 <= maddpg_gamma <= 1:
            raise ConfigError(f"maddpg_tau in (0, 1] and maddpg_gamma in [0, 1], got {maddpg_tau}, {maddpg_gamma}")
        self.kw = dict(gamma=maddpg_gamma, tau=maddpg_tau, lr=maddpg_lr, hidden=maddpg_hidden,
                       batch_size=maddpg_batch_size, buffer_size=maddpg_buffer_size, grad_clip=maddpg_grad_clip,
                       local_q=maddpg_local_q, seed=seed, clip_mode=maddpg_clip_mode,
                       target_update=maddpg_target_update)
        self.update_every, self.warmup = int(maddpg_update_every), int(maddpg_warmup)
        self.learner: MADDPG | None = None
        self.steps = 0
        self._pending: dict | None = None

    def _build(self, model) -> MADDPG:
        c = model.config
        if not c["discrete"]:
            raise ConfigError("update_strategy: maddpg acts in Discrete action spaces (Gumbel-softmax actors); "
                              "the control policy's environment has a Box")
        learner = MADDPG([[model] * c["agents"]], c["obs_dim"], c["act_dim"], **self.kw)
        if self._pending is not None:
            learner.load_state_dict(self._pending)
            self._pending = None
        return learner

    @torch.no_grad()
    def td_error(self, x, a, r, x2, done) -> float:
        """The critics' mean squared TD error on transitions (target actions: the target actor's argmax)."""
        L, out = self.learner, []
        A, D = L.act_dim, L.obs_dim
        onehot = torch.nn.functional.one_hot(a, A).float()
        a2 = torch.stack([torch.nn.functional.one_hot(L.target_actor(0, j)(x2[:, j]).argmax(-1), A).float()
                          for j in range(L.N)], 1)
        for i in range(L.N):
            q = L.critics[0][i](critic_input(x[..., :D], onehot, i, L.local_q))[:, 0]
            q2 = L.target_critics[0][i](critic_input(x2[..., :D], a2, i, L.local_q))[:, 0]
            out.append(float((q - td_target(r[:, i], done, q2, L.gamma)).pow(2).mean()))
        return sum(out) / len(out)

    def __call__(self, batch, model, ctx):
        if self.learner is None:
            self.learner = self._build(model)
        L = self.learner
        x, a, r, x2, done = batch_transitions(batch)
        dev = next(model.parameters()).device
        if dev.type != "cpu":
            raise ConfigError("update_strategy: maddpg runs on the CPU (device: cpu)")
        L.add(x, a, r, x2, done, torch.zeros(len(x), L.N, dtype=torch.long))
        before = self.steps // self.update_every
        self.steps += len(x)
        n_upd = self.steps // self.update_every - before if L.ready(max(self.warmup, 1)) else 0
        model.train()
        stats = [L.update() for _ in range(n_upd)]
        model.eval()
        q = sum(s["q_loss"] for s in stats) / len(stats) if stats else self.td_error(x, a, r, x2, done)
        p = sum(s["p_loss"] for s in stats) / len(stats) if stats else None
        return {"loss": q, "grad_norm": None, "skipped": 0, "kl": None, "entropy": None, "clip_frac_low": 0.0,
                "clip_frac_high": 0.0, "maddpg/q_loss": q, "maddpg/p_loss": p, "maddpg/updates": n_upd,
                "maddpg/buffer": len(L.buffers[0][0])}

    def state_dict(self) -> dict:
        s = self.learner.state_dict() if self.learner is not None else self._pending
        return {"steps": self.steps, "learner": s}

    def load_state_dict(self, s: dict) -> None:
        self.steps = int(s["steps"])
        if self.learner is not None and s["learner"] is not None:
            self.learner.load_state_dict(s["learner"])
        else:
            self._pending = s["learner"]
