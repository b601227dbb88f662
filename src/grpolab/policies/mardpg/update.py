"""MARDPG's training on policy mardpg's episodes (update strategy ``mardpg``), seed 000-92."""
from __future__ import annotations

import torch

from .model import MARDPG, critic_loss
from ...errors import ConfigError
from ...registry import UPDATE_STRATEGIES, param


def _check(cfg) -> None:
    if cfg.policy != "mardpg":
        raise ConfigError(f"update_strategy: mardpg trains MARDPG's recurrent actors with a shared critic; it needs "
                          f"policy: mardpg (got {cfg.policy})")


def batch_episodes(batch) -> tuple[torch.Tensor, ...]:
    """Policy mardpg's batch as whole episodes: ``obs [R, T + 1, N, D]`` (``row_data["last_obs"]`` appended),
    ``act [R, T, N, A]`` (clipped to [-1, 1], what the environment received), ``rew [R, T]`` (the shared
    reward: the sum over agents), ``done [R, T]`` (1 at the last step of an episode that ended in a terminal
    state). Every episode must have the batch's length T."""
    rd, sd = batch.row_data, batch.step_data
    R, TN = batch.completion_mask.shape
    N = int(rd["agents"][0])
    T = TN // N
    lengths = batch.completion_attention_mask.reshape(R, T, N)[:, :, 0].sum(1)
    if not bool((lengths == T).all()):
        raise ConfigError(f"update_strategy: mardpg replays whole episodes of one length; this batch has lengths "
                          f"{sorted(set(lengths.tolist()))} (use an environment with a fixed horizon, e.g. "
                          f"pettingzoo:grpolab.policies.mardpg.rec_env, and max_completion_length >= it)")
    obs = torch.cat([sd["obs"].reshape(R, T, N, -1), rd["last_obs"][:, None].to(sd["obs"].dtype)], 1)
    act = sd["action"].reshape(R, T, N, -1).clamp(-1, 1)
    rew = rd["step_rewards"].reshape(R, T, N).sum(-1)
    done = torch.zeros(R, T)
    done[:, -1] = rd["terminal"].float()
    return obs, act, rew, done


@UPDATE_STRATEGIES.register("mardpg", check=_check)
class MARDPGUpdate:
    """MARDPG's DDPG-style step (policies/mardpg/model.py): each training step adds the batch's episodes to the episode
    buffer (:func:`batch_episodes`) and, once it holds ``mardpg_batch_size`` episodes, runs ``mardpg_updates``
    updates, each a critic step of the shared centralised critic to ``y_t = r_t + gamma (1 - done_t)
    Q'(c'_{t+1}, mu'(o_{<=t+1}))`` (``r_t``: the sum of the agents' rewards) and an actor step of
    ``-mean Q(c_t, mu^1(o^1_{<=t}), .., mu^N(o^N_{<=t}))`` through the recurrent actors and their messages,
    then Polyak updates of the targets. The critic, the targets, both Adam optimisers and the buffer are this
    component's state (``state_dict``).

    Not used: the trainer's optimiser and ``learning_rate``, ``num_iterations``, the advantages and the policy
    loss. ``loss`` is the mean critic loss of the step's updates, or, before the first, the critic's loss on the
    step's episodes. Metrics: ``mardpg/q_loss``, ``mardpg/p_loss``, ``mardpg/updates``, ``mardpg/buffer``
    (episodes held).

    Paper: arXiv:2407.02759, "Multi-Scenario Combination Based on Multi-Agent Reinforcement Learning to Optimize
    the Advertising Recommendation System", 2024 (seed 000-92's abstract), applying the MARDPG of Feng et al.,
    "Learning to Collaborate: Multi-Scenario Ranking via Multi-Agent Reinforcement Learning", WWW 2018.

    Provenance: reconstructed from the abstract — no public code; the choices (GRU actors and critic history,
    messages, whole-episode replay, gamma 0.9, tau 0.05, Adam 1e-3) are listed in policies/mardpg/model.py. Test:
    tests/test_mardpg.py::test_critic_loss_uses_the_shared_td_target,
    tests/test_mardpg.py::test_policy_batch_and_update_strategy_round_trip.
    """

    def __init__(self, *,
                 mardpg_gamma: float = param(0.9, "MARDPG: discount"),
                 mardpg_tau: float = param(0.05, "MARDPG: Polyak rate of the target networks"),
                 mardpg_lr: float = param(1e-3, "MARDPG: Adam learning rate of the actors and the critic"),
                 mardpg_batch_size: int = param(32, "MARDPG: episodes per update"),
                 mardpg_buffer_size: int = param(10_000, "MARDPG: episodes the replay buffer holds"),
                 mardpg_updates: int = param(8, "MARDPG: updates per training step"),
                 seed: int = 0):
        if mardpg_batch_size < 1 or mardpg_buffer_size < 1 or mardpg_updates < 0:
            raise ConfigError(f"mardpg_batch_size, mardpg_buffer_size >= 1 and mardpg_updates >= 0, got "
                              f"{mardpg_batch_size}, {mardpg_buffer_size}, {mardpg_updates}")
        self.kw = dict(gamma=mardpg_gamma, tau=mardpg_tau, lr=mardpg_lr, batch_size=mardpg_batch_size,
                       buffer_size=mardpg_buffer_size, seed=seed)
        self.n_updates = int(mardpg_updates)
        self.learner: MARDPG | None = None
        self._pending: dict | None = None

    def __call__(self, batch, model, ctx):
        if self.learner is None:
            self.learner = MARDPG(model, hidden=model.config["hidden"], **self.kw)
            if self._pending is not None:
                self.learner.load_state_dict(self._pending)
                self._pending = None
        L = self.learner
        obs, act, rew, done = batch_episodes(batch)
        L.buffer.add(obs, act, rew, done)
        n = self.n_updates if len(L.buffer) >= L.batch_size else 0
        model.train()
        stats = [L.update() for _ in range(n)]
        model.eval()
        if stats:
            q = sum(s["q_loss"] for s in stats) / n
            p = sum(s["p_loss"] for s in stats) / n
        else:
            with torch.no_grad():
                q = float(critic_loss(L.critic, L.target_critic, L.target_actors, obs, act, rew, done, L.gamma))
            p = None
        return {"loss": q, "grad_norm": None, "skipped": 0, "kl": None, "entropy": None, "clip_frac_low": 0.0,
                "clip_frac_high": 0.0, "mardpg/q_loss": q, "mardpg/p_loss": p, "mardpg/updates": n,
                "mardpg/buffer": len(L.buffer)}

    def state_dict(self) -> dict:
        return {"learner": self.learner.state_dict() if self.learner is not None else self._pending}

    def load_state_dict(self, s: dict) -> None:
        if self.learner is not None and s["learner"] is not None:
            self.learner.load_state_dict(s["learner"])
        else:
            self._pending = s["learner"]
