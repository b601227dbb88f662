"""``control_gae``: PPO's advantage for the control policies — a learned value function over observations and
GAE over each agent's environment steps (the baseline users compare GRPO with)."""
from __future__ import annotations

import torch

from ...algorithms.gae import gae, masked_whiten
from ...errors import ConfigError
from ...registry import ADVANTAGES, param
from .nets import ValueMLP


def agent_sequences(x: torch.Tensor, agents: int) -> torch.Tensor:
    """``[R, T*N, ...]`` (column ``t*N + i``) -> ``[R*N, T, ...]``: each agent's steps in time order."""
    R, TN = x.shape[:2]
    T = TN // agents
    y = x.reshape(R, T, agents, *x.shape[2:]).transpose(1, 2)
    return y.reshape(R * agents, T, *x.shape[2:])


def agent_columns(y: torch.Tensor, agents: int) -> torch.Tensor:
    """The inverse of :func:`agent_sequences`: ``[R*N, T, ...]`` -> ``[R, T*N, ...]``."""
    RN, T = y.shape[:2]
    R = RN // agents
    return y.reshape(R, agents, T, *y.shape[2:]).transpose(1, 2).reshape(R, T * agents, *y.shape[2:])


@ADVANTAGES.register("control_gae", needs=("control",))
class ControlGAE:
    """PPO's advantage on a control policy: GAE(gamma, lambda) with a learned state value ``V_phi(o)``.

    For each agent's steps ``t = 0..L-1`` of an episode (rewards ``r_t`` from ``row_data["step_rewards"]``),
    ``V_t = V_phi(o_t)`` and the value after the last step ``V_L = V_phi(o_L)`` unless the episode ended in a
    terminal state (then 0; a time limit or the ``max_completion_length`` cap bootstraps)::

        delta_t = r_t + gamma V_{t+1} - V_t,   A_t = delta_t + gamma lambda A_{t+1},   R_t = A_t + V_t

    (algorithms/gae.py). ``A`` is whitened over the batch's steps (``control_whiten``), and ``V_phi`` is then
    fitted to the targets ``R_t`` (computed before the fit) with ``control_value_epochs`` passes of shuffled
    minibatches of ``control_value_minibatch`` steps, loss ``0.5 (V_phi(o_t) - R_t)^2``, Adam
    (``control_value_lr``, eps 1e-5), gradient norm clipped at 0.5. The policy's loss is the recipe's (PPO:
    ``policy_loss: clipped_ratio``, ``loss_aggregation: token_mean`` = the mean over steps). Groups play no part
    (``num_generations`` may be 1). The value MLP (``control_value_hidden`` x ``control_value_layers``, tanh,
    CleanRL's initialisation) reads the actor's inputs (with the agent one-hot when there are several agents),
    is built on the first call with a generator seeded by ``control_value_seed``, and its weights and optimiser
    travel in checkpoints.

    Paper: Schulman et al., "Proximal Policy Optimization Algorithms", arXiv:1707.06347 (the GAE paper:
    arXiv:1506.02438).

    Provenance: paper equations — PPO (arXiv:1707.06347) Algorithm 1 with GAE (arXiv:1506.02438, eq. 16),
    checked against CleanRL's vwxyzjn/cleanrl cleanrl/ppo.py (advantages with the value before the update,
    ``returns = advantages + values``, advantage normalisation, 0.5 MSE value loss, Adam eps 1e-5, grad norm 0.5,
    defaults gamma 0.99, lambda 0.95); differences: a separate value network and optimiser (CleanRL's shares
    the optimiser; its networks are separate too), the value loss unclipped (CleanRL's clip_vloss is on by
    default), advantages whitened over the whole batch instead of per minibatch, and a time-limit end
    bootstraps from ``V(o_L)`` (CleanRL treats it as terminal).
    Test: tests/test_control.py::test_control_gae_by_hand.
    """

    def __init__(self, *, control_gamma: float = param(0.99, "control_gae: discount gamma"),
                 control_gae_lambda: float = param(0.95, "control_gae: GAE lambda"),
                 control_value_lr: float = param(1e-3, "control_gae: Adam learning rate of the value network"),
                 control_value_epochs: int = param(4, "control_gae: passes over the batch's steps per fit"),
                 control_value_minibatch: int = param(256, "control_gae: steps per value minibatch"),
                 control_value_hidden: int = param(64, "control_gae: hidden units of the value MLP"),
                 control_value_layers: int = param(2, "control_gae: hidden layers of the value MLP"),
                 control_value_seed: int = param(0, "control_gae: seed of the value network's initialisation and "
                                                    "of its minibatch order"),
                 control_whiten: bool = param(True, "control_gae: whiten the advantages over the batch's steps")):
        if not (0 <= control_gamma <= 1 and 0 <= control_gae_lambda <= 1):
            raise ConfigError(f"control_gamma and control_gae_lambda: in [0, 1], got {control_gamma}, "
                              f"{control_gae_lambda}")
        if control_value_epochs < 0 or control_value_minibatch < 1:
            raise ConfigError(f"control_value_epochs >= 0 and control_value_minibatch >= 1, got "
                              f"{control_value_epochs}, {control_value_minibatch}")
        self.gamma, self.lam, self.lr = float(control_gamma), float(control_gae_lambda), float(control_value_lr)
        self.epochs, self.minibatch = int(control_value_epochs), int(control_value_minibatch)
        self.hidden, self.layers, self.seed = int(control_value_hidden), int(control_value_layers), int(control_value_seed)
        self.whiten = bool(control_whiten)
        self.value: ValueMLP | None = None
        self.optimizer: torch.optim.Optimizer | None = None
        self.calls = 0
        self.last_value_loss: float | None = None

    def _build(self, d: int) -> None:
        state = torch.random.get_rng_state()
        torch.manual_seed(self.seed)  # the value's initialisation draws from its own seed, not the run's stream
        self.value = ValueMLP(d, self.hidden, self.layers)
        torch.random.set_rng_state(state)
        self.optimizer = torch.optim.Adam(self.value.parameters(), lr=self.lr, eps=1e-5)

    def __call__(self, rewards: torch.Tensor, group_ids: torch.Tensor, batch=None) -> torch.Tensor:
        if batch is None or "obs" not in batch.step_data or "step_rewards" not in batch.row_data:
            raise ConfigError("advantage control_gae reads per-step observations and rewards, which policy control "
                              "writes (step_data['obs'], row_data['step_rewards']): set policy: control")
        N = int(batch.row_data["agents"][0])
        obs = agent_sequences(batch.step_data["obs"].float(), N)  # [R*N, T, d]
        r = agent_sequences(batch.row_data["step_rewards"].float(), N)
        valid = agent_sequences(batch.completion_attention_mask > 0, N)
        lengths = valid.sum(1)
        if self.value is None:
            self._build(obs.shape[-1])
        with torch.no_grad():
            v = self.value(obs) * valid
            last = batch.row_data["last_obs"].float().reshape(-1, obs.shape[-1])  # [R*N, d]
            boot = self.value(last) * (~batch.row_data["terminal"]).repeat_interleave(N).float()
        adv, ret = gae(r, v, lengths, boot, self.gamma, self.lam)
        adv = agent_columns(adv.float(), N) * batch.completion_mask
        if self.whiten:
            adv = masked_whiten(adv, batch.completion_mask > 0)
        self._fit(obs[valid], ret.float()[valid])
        self.calls += 1
        return adv.to(rewards.dtype)

    def _fit(self, x: torch.Tensor, y: torch.Tensor) -> None:
        g = torch.Generator().manual_seed(self.seed * 1_000_003 + self.calls)
        loss = None
        for _ in range(self.epochs):
            order = torch.randperm(len(x), generator=g)
            for lo in range(0, len(x), self.minibatch):
                i = order[lo:lo + self.minibatch]
                loss = 0.5 * (self.value(x[i]) - y[i]).pow(2).mean()
                self.optimizer.zero_grad(set_to_none=True)
                loss.backward()
                torch.nn.utils.clip_grad_norm_(self.value.parameters(), 0.5)
                self.optimizer.step()
        self.last_value_loss = None if loss is None else float(loss.detach())

    def state_dict(self) -> dict:
        if self.value is None:
            return {"value": None, "calls": self.calls}
        return {"value": {k: t.detach().clone() for k, t in self.value.state_dict().items()},
                "optimizer": self.optimizer.state_dict(), "calls": self.calls,
                "input_dim": self.value.net[0].in_features}

    def load_state_dict(self, state: dict) -> None:
        self.calls = int(state.get("calls", 0))
        if state.get("value") is None:
            self.value, self.optimizer = None, None
            return
        self._build(int(state["input_dim"]))
        self.value.load_state_dict(state["value"])
        self.optimizer.load_state_dict(state["optimizer"])
