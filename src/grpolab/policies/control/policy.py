"""``control``: an MLP policy acting in Gymnasium and PettingZoo environments; one step = one environment step
of one agent.

A row is a task instance: an environment (``env``: a Gymnasium id or ``pettingzoo:<module>``, ``env_kwargs``) and
a start ``seed``. :meth:`ControlPolicy.sample` runs G episodes per row, every one reset with the row's seed, so
a group is G episodes from the same start state (and the same environment randomness): GRPO's group-relative
advantage compares them with no critic. Episodes end when the environment ends them or after
``max_completion_length`` steps (then ``truncated``). Layout of a batch (N agents, T the longest episode):

- column ``t * N + i`` = agent i's action at time t (N = 1 for Gymnasium);
- ``step_data["obs"]`` ``[R, T*N, D (+ N)]`` the actor's inputs (observation, + the agent's one-hot when N > 1),
  ``step_data["action"]`` ``[R, T*N]`` (Discrete) or ``[R, T*N, k]`` (Box, unclipped);
- ``row_data["step_rewards"]`` ``[R, T*N]`` each agent's reward of each step, ``row_data["terminal"]`` ``[R]``
  (ended in a terminal state: no bootstrap), ``row_data["last_obs"]`` ``[R, N, D (+ N)]`` (the inputs after the
  last step), ``row_data["agents"]`` ``[R]`` (N), ``row_data["agent_returns"]`` ``[R, N]``, ``row_data["step_costs"]``
  ``[R, T*N]`` each step's ``info["cost"]`` (0 when the environment reports none; constrained tasks, CAL);
- ``columns["completion"]`` = the episode's return (the mean over agents of each agent's summed reward): what
  the reward ``episode_return`` of task ``gym_control`` passes on.

Evaluation (``evaluation=True``): the deterministic policy (argmax / the Gaussian mean) from each held-out row's
seed. The network (policies/control/nets.py ``ControlActor``) is built from the first row's spaces with the run's seed
(``--model mlp``, the default) or loaded from a folder :meth:`save` wrote.
"""
from __future__ import annotations

from typing import Any

import numpy as np
import torch

from ...config import ConfigError
from .._control.envs import EnvPool, check_saved_spaces, env_key, named_envs, row_seed
from .._control.episodes import pack_episodes, start_episodes
from .nets import ControlActor, agent_inputs
from ...registry import POLICIES, param
from ..base import PolicyBase, load_config_module, save_config_module, saved_folder

BUILT_IN = ("mlp", "tiny")


def save_actor(module: ControlActor, path) -> None:
    save_config_module(module, path)


def load_actor(path) -> ControlActor:
    return load_config_module(ControlActor, path, "control")[0]


@POLICIES.register("control")
class ControlPolicy(PolicyBase):
    """An MLP actor (categorical for Discrete actions, Gaussian for a Box) acting in the rows' environments; G
    episodes from one seeded start state per row (module docstring).

    Provenance: grpolab's own — the group of the GRPO family (Shao et al., 2024, arXiv:2402.03300) taken as G
    episodes from one start state, the per-step log-probs of a categorical / Gaussian actor as in CleanRL's PPO
    (vwxyzjn/cleanrl ppo.py / ppo_continuous_action.py: orthogonal initialisation, state-independent log-std,
    the log-prob of the unclipped Gaussian action).
    """

    step = "environment step"
    capabilities = frozenset({"control"})
    description = "an MLP actor in Gymnasium / PettingZoo environments; one step = one agent's environment step"
    default_model = "mlp"
    default_task = "gym_control"
    float32_only = True

    def __init__(self, *, model: str, temperature: float, max_completion_length: int,
                 control_hidden: int = param(64, "control: hidden units of each actor layer"),
                 control_layers: int = param(2, "control: hidden layers of the actor MLP"),
                 control_log_std_init: float = param(0.0, "control: initial log-std of a Gaussian (Box) actor")):
        if control_hidden < 1 or control_layers < 0:
            raise ConfigError(f"control_hidden >= 1 and control_layers >= 0, got {control_hidden}, {control_layers}")
        self.model_name, self.temperature = model, float(temperature)
        self.max_steps = int(max_completion_length)
        self.hidden, self.layers, self.log_std_init = int(control_hidden), int(control_layers), control_log_std_init
        self.pool = EnvPool()
        self.unchecked = False  # an actor loaded without rows: its spaces are checked on the first sample

    @classmethod
    def api_rows(cls, rows: list[dict], what: str) -> list[dict]:
        """A row's ``env`` given as a Gymnasium environment object (an instance, a class or a factory) becomes the
        id it is registered under (``_control/envs.py``: :func:`env_id_of`)."""
        return named_envs(rows, what)

    def load(self, cfg, rows, eval_rows, *, extra_texts=(), log=print):
        """``model``: ``mlp`` (a new actor sized from the first row's environment, initialised with the run's
        seed) or a folder :meth:`save` wrote. Every row's environment must have the same spaces. A folder loads
        with no rows (``grpolab eval --model RUN/final``): the spaces are checked against the first rows sampled."""
        if not rows and self.model_name not in BUILT_IN:
            self.unchecked = True
            return load_actor(saved_folder(self.model_name, "control", ("config.json",), "a folder it saved "
                                           "(config.json + model.safetensors)", builds="'mlp' (a new MLP actor)"))
        if not rows:
            raise ConfigError("policy control: no train rows (model 'mlp' sizes the new actor from the first row's "
                              "environment); give rows (task gym_control or --data) or a saved actor's folder")
        info = self.pool.info(rows[0])
        for where, part in (("train", rows), ("held-out", eval_rows)):
            for i, row in enumerate(part):
                row_seed(row, i)
                other = self.pool.info(row) if env_key(row)[:2] != env_key(rows[0])[:2] else info
                if other != info:
                    raise ConfigError(f"{where} row {i}: env {row['env']} has other spaces ({other}) than the first "
                                      f"row's {rows[0]['env']} ({info}); one actor acts in environments with the "
                                      f"same observation and action spaces")
        if self.model_name in BUILT_IN:
            module = ControlActor(info.obs_dim, info.agents, info.discrete, info.act_dim, self.hidden, self.layers,
                                  self.log_std_init, info.low, info.high)
            log(f"[grpolab] policy control: a new MLP actor ({self.layers} x {self.hidden}, "
                f"{'categorical over ' + str(info.act_dim) if info.discrete else 'Gaussian in ' + str(info.act_dim)} "
                f"actions, {info.agents} agent(s), {sum(p.numel() for p in module.parameters())} parameters) for "
                f"{rows[0]['env']}")
        else:
            path = saved_folder(self.model_name, "control", ("config.json",),
                                "a folder it saved (config.json + model.safetensors)", builds="'mlp' (a new MLP actor)")
            module = load_actor(path)
            check_saved_spaces(path, module.config, info, ("obs_dim", "agents", "discrete", "act_dim"), rows[0]["env"])
        return module.float()

    def save(self, module, path) -> None:
        save_actor(module, path)

    @torch.no_grad()
    def sample(self, module, rows, uids, *, group_offset=0, num_generations, temperature=None, generator=None,
               evaluation=False):
        if self.unchecked and rows:
            check_saved_spaces(self.model_name, module.config, self.pool.info(rows[0]),
                               ("obs_dim", "agents", "discrete", "act_dim"), rows[0]["env"])
            self.unchecked = False
        counts, tau, envs, seeds, cur = start_episodes(  # cur: [R, N, D]
            self.pool, rows, num_generations, temperature if temperature is not None else self.temperature)
        R = sum(counts)
        c = module.config
        masked = c["discrete"] and any(e.action_mask is not None for e in envs)
        legal = torch.ones(R, self.max_steps, c["agents"], c["act_dim"], dtype=torch.bool) if masked else None
        N, Tmax = c["agents"], self.max_steps
        device = next(module.parameters()).device
        din = module.input_dim
        obs = torch.zeros(R, Tmax, N, din)
        act = torch.zeros(R, Tmax, N, dtype=torch.long) if c["discrete"] else torch.zeros(R, Tmax, N, c["act_dim"])
        lps, rew, cost = torch.zeros(R, Tmax, N), torch.zeros(R, Tmax, N), torch.zeros(R, Tmax, N)
        lengths = torch.full((R,), Tmax, dtype=torch.long)
        terminal, truncated = torch.zeros(R, dtype=torch.bool), torch.ones(R, dtype=torch.bool)
        alive = list(range(R))
        low, high = (np.array(c["low"], np.float32), np.array(c["high"], np.float32)) if not c["discrete"] else (0, 0)
        for t in range(Tmax):
            if not alive:
                break
            idx = torch.tensor(alive)
            x = agent_inputs(cur[idx], N)  # [A, N, din]
            m = None
            if masked:
                for r in alive:
                    if envs[r].action_mask is not None:
                        legal[r, t] = torch.from_numpy(envs[r].action_mask)
                m = legal[idx, t].reshape(-1, c["act_dim"])
            a, lp = module.act(x.reshape(-1, din).to(device), tau[idx].repeat_interleave(N), generator,
                               deterministic=evaluation, mask=m)
            a, lp = a.cpu().reshape(len(idx), N, *act.shape[3:]), lp.cpu().reshape(len(idx), N)
            obs[idx, t], act[idx, t], lps[idx, t] = x, a, lp
            still = []
            for j, r in enumerate(alive):
                a_env = a[j].numpy() if c["discrete"] else np.clip(a[j].numpy(), low, high)
                o, rw, done, term = envs[r].step(a_env)
                rew[r, t] = torch.from_numpy(rw)
                cost[r, t] = torch.from_numpy(envs[r].last_costs)
                cur[r] = torch.from_numpy(o)
                if done:
                    lengths[r], terminal[r], truncated[r] = t + 1, term, False
                else:
                    still.append(r)
            alive = still
        return pack_episodes(rows, counts, uids, seeds, group_offset=group_offset, lengths=lengths, obs=obs, act=act,
                             lps=lps, rew=rew, terminal=terminal, truncated=truncated, last_obs=agent_inputs(cur, N),
                             zero_logprobs=evaluation, step_extra={"step_costs": cost},
                             step_inputs={"action_mask": legal} if masked else None)

    def offers(self) -> frozenset[str]:
        return frozenset({"entropy"})

    def forward(self, module, mb, *, want: frozenset[str] = frozenset(), grad: bool = True) -> dict[str, Any]:
        """Per-step log-probs ``[R, T]`` of the stored actions under ``module`` (0 off the attention mask);
        ``entropy`` [R, T] (the policy's entropy at each step) on request."""
        device = next(module.parameters()).device
        R, T = mb.completion_mask.shape
        rows, cols = (mb.completion_attention_mask > 0).nonzero(as_tuple=True)
        x = mb.step_data["obs"][rows, cols].to(device)
        a = mb.step_data["action"][rows, cols].to(device)
        legal = mb.step_data.get("action_mask")  # turn-taking games' legal actions (_control/aec.py)
        legal = None if legal is None else legal[rows, cols]
        with torch.set_grad_enabled(grad):
            lp, ent = module.log_prob(x, a, self.temperature, entropy="entropy" in want, mask=legal)
            out = {"logprobs": torch.zeros(R, T, device=device).index_put((rows.to(device), cols.to(device)), lp)}
            if ent is not None:
                out["entropy"] = torch.zeros(R, T, device=device).index_put((rows.to(device), cols.to(device)), ent)
        return out

    def describe(self, batch, i: int) -> dict:
        return {"prompt": str(batch.columns["prompt"][i]),
                "completion": f"return {batch.columns['completion'][i]:.2f} in "
                              f"{batch.columns['episode_length'][i]} steps"}
