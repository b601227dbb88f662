"""The control policy's networks: an MLP actor with a categorical (Discrete) or Gaussian (Box) head, and an MLP
value function (the PPO baseline's critic).

Actor: ``h = MLP(o)`` (``layers`` hidden layers of ``hidden`` units, tanh), then

- Discrete(n): logits ``z = W h + b``, ``pi(a | o) = softmax(z / tau)_a`` (tau: the sampling temperature);
- Box(k): mean ``mu = W h + b`` and a state-independent ``log_std`` vector (a parameter), ``a ~ N(mu,
  (tau * exp(log_std))^2)`` per dimension, ``log pi(a | o) = sum_j log N(a_j; mu_j, sigma_j)``; the environment
  receives ``a`` clipped to the Box (the log-prob is of the unclipped ``a``, as in CleanRL's and SB3's PPO).

In a turn-taking game with legal-action masks (``mask``: ``[rows, n]`` bool) the illegal actions' logits are
``-1e9`` after the temperature: ``pi(a | o) = softmax(z / tau + log mask)_a`` (PettingZoo's classic games'
``action_mask``; the masked softmax of CleanRL's and RLCard's PPO / DQN on them).

With several agents the observation is ``[o, one_hot(agent)]`` (one shared actor; parameter sharing). The
initialisation is CleanRL's PPO one (orthogonal, gain sqrt 2 for hidden layers, 0.01 for the policy's output,
1 for the value's output; biases 0).
"""
from __future__ import annotations

import math

import torch
from torch import nn


def _layer(i: int, o: int, gain: float) -> nn.Linear:
    lin = nn.Linear(i, o)
    nn.init.orthogonal_(lin.weight, gain)
    nn.init.zeros_(lin.bias)
    return lin


def mlp(inp: int, hidden: int, layers: int, out: int, out_gain: float) -> nn.Sequential:
    mods, d = [], inp
    for _ in range(layers):
        mods += [_layer(d, hidden, math.sqrt(2)), nn.Tanh()]
        d = hidden
    mods.append(_layer(d, out, out_gain))
    return nn.Sequential(*mods)


class ControlActor(nn.Module):
    """``pi_theta(a | o)`` over one environment's spaces (module docstring). ``config`` holds what rebuilding it
    needs (saved as config.json)."""

    def __init__(self, obs_dim: int, agents: int, discrete: bool, act_dim: int, hidden: int = 64, layers: int = 2,
                 log_std_init: float = 0.0, low: list | tuple = (), high: list | tuple = ()):
        super().__init__()
        self.config = {"obs_dim": int(obs_dim), "agents": int(agents), "discrete": bool(discrete),
                       "act_dim": int(act_dim), "hidden": int(hidden), "layers": int(layers),
                       "log_std_init": float(log_std_init), "low": list(low), "high": list(high)}
        self.net = mlp(self.input_dim, hidden, layers, act_dim, 0.01)
        if not discrete:
            self.log_std = nn.Parameter(torch.full((act_dim,), float(log_std_init)))

    @property
    def input_dim(self) -> int:
        c = self.config
        return c["obs_dim"] + (c["agents"] if c["agents"] > 1 else 0)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Logits (Discrete) or the Gaussian mean (Box) for inputs ``x`` (observations with the agent one-hot)."""
        return self.net(x)

    def log_prob(self, x: torch.Tensor, actions: torch.Tensor, temperature: float | torch.Tensor = 1.0,
                 entropy: bool = False, mask: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor | None]:
        """``(log pi(a | x), entropy or None)`` per row of ``x`` (``temperature``: a number or one per row;
        ``mask``: the legal actions, Discrete only)."""
        out = self.net(x).float()
        tau = _per_row(temperature, len(x), out.device)
        if self.config["discrete"]:
            logp = torch.log_softmax(_masked(out / tau, mask), -1)
            lp = logp.gather(-1, actions.long()[..., None])[..., 0]
            ent = -(logp.exp() * logp).sum(-1) if entropy else None
            return lp, ent
        log_std = self.log_std.float()[None] + tau.log()
        z = (actions.float() - out) / log_std.exp()
        lp = (-0.5 * z.pow(2) - log_std - 0.5 * math.log(2 * math.pi)).sum(-1)
        ent = (log_std + 0.5 * math.log(2 * math.pi * math.e)).sum(-1) if entropy else None
        return lp, ent

    @torch.no_grad()
    def act(self, x: torch.Tensor, temperature: float | torch.Tensor, generator: torch.Generator | None,
            deterministic: bool = False, mask: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """``(actions, log-probs)``: drawn with ``generator`` (argmax / the mean when ``deterministic``; log-probs
        0 then); ``mask``: the legal actions (Discrete only)."""
        out = self.net(x).float()
        if self.config["discrete"]:
            if deterministic:
                return _masked(out, mask).argmax(-1), torch.zeros(len(x))
            probs = torch.softmax(_masked(out / _per_row(temperature, len(x), out.device), mask), -1)
            a = torch.multinomial(probs, 1, generator=generator)[:, 0]
        else:
            if deterministic:
                return out, torch.zeros(len(x))
            std = self.log_std.float().exp()[None] * _per_row(temperature, len(x), out.device)
            noise = torch.randn(out.shape, generator=generator, device=out.device)
            a = out + std * noise
        return a, self.log_prob(x, a, temperature, mask=mask)[0]


def _masked(z: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
    """Logits with the illegal actions (``mask`` False) at -1e9 (unchanged without a mask)."""
    return z if mask is None else z.masked_fill(~mask.to(z.device, torch.bool), -1e9)


def _per_row(t, n: int, device) -> torch.Tensor:
    """A temperature as ``[n, 1]`` (a number, or one per row)."""
    t = torch.as_tensor(t, dtype=torch.float32, device=device)
    return (t.expand(n) if t.dim() == 0 else t.reshape(n))[:, None]


class ValueMLP(nn.Module):
    """``V_phi(x)``: an MLP from the actor's input (observation + agent one-hot) to one number."""

    def __init__(self, input_dim: int, hidden: int = 64, layers: int = 2):
        super().__init__()
        self.net = mlp(input_dim, hidden, layers, 1, 1.0)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x.float())[..., 0]


def agent_inputs(obs: torch.Tensor, agents: int) -> torch.Tensor:
    """``[..., N, D]`` observations -> ``[..., N, D + N]`` with each agent's one-hot (unchanged when N = 1)."""
    if agents <= 1:
        return obs
    eye = torch.eye(agents, dtype=obs.dtype, device=obs.device).expand(*obs.shape[:-1], agents)
    return torch.cat([obs, eye], -1)
