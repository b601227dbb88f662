"""A learned critic on a turn-level MDP: turn-PPO's value head, GAE over turns (seed 000-14).

The critic is an advantage component with state: a linear value head on the
policy's final hidden state at each turn boundary, trained with its own AdamW
optimiser on the turn returns, saved and restored with every checkpoint
(``state_dict`` / ``load_state_dict``). It reads the current policy through
the advantage stage's ``policy`` input (the trainer hands its model to the
components that name it) and never changes it: the features are computed
under ``torch.no_grad`` and the head's loss does not reach the policy.
"""
from __future__ import annotations

import torch

from ..algorithms.gae import gae, masked_whiten
from ..errors import ConfigError
from ..model.hf import model_device
from ..model.logprobs import sequence_inputs
from ..registry import ADVANTAGES, param
from .base import EPISODE_COLUMN


def turn_starts(span_ids: torch.Tensor, spans: list[int]) -> list[int]:
    """Completion index where each model turn starts: the number of tokens whose span is below the turn's.

    Spans are numbered in order, so this also places a turn with no tokens."""
    return [int((span_ids > 0).logical_and(span_ids < s).sum()) for s in spans]


@torch.no_grad()
def boundary_states(policy, batch, starts: list[list[int]], rows: int = 16) -> list[torch.Tensor]:
    """Per row, the policy's last-layer hidden state at the position that predicts each turn's first token.

    For turn start ``t`` (completion index) that is sequence position ``P + t - 1`` (``P`` = the left-padded
    prompt width; ``t = 0`` gives the prompt's last token). Returns one float32 CPU tensor ``[turns, d]`` per row.
    """
    out = []
    dev = model_device(policy)
    P = batch.prompt_ids.shape[1]
    for lo in range(0, len(starts), rows):
        idx = torch.arange(lo, min(lo + rows, len(starts)))
        mb = batch.select(idx).to(dev)
        input_ids, attn, pos = sequence_inputs(mb)
        res = policy(input_ids=input_ids, attention_mask=attn, position_ids=pos, output_hidden_states=True,
                     use_cache=False)
        h = res.hidden_states[-1]
        for j, r in enumerate(idx.tolist()):
            where = torch.tensor([P + t - 1 for t in starts[r]], dtype=torch.long, device=h.device)
            out.append(h[j].index_select(0, where).float().cpu())
    return out


def turn_gae(rewards: list[float], values: list[float], gamma: float, lam: float) -> tuple[list[float], list[float]]:
    """GAE over one episode's turns (``algorithms/gae.py``, terminal value 0): ``delta_k = r_k + gamma V_{k+1} -
    V_k`` (``V_K = 0``), ``A_k = delta_k + gamma lam A_{k+1}``; returns ``(A, A + V)`` (advantages, value targets)."""
    K = len(rewards)
    f64 = torch.float64
    adv, ret = gae(torch.tensor([rewards], dtype=f64), torch.tensor([values], dtype=f64), torch.tensor([K]),
                   torch.zeros(1, dtype=f64), gamma, lam)
    return adv[0].tolist(), ret[0].tolist()


@ADVANTAGES.register("turn_ppo", needs=("text",))
class TurnPPOCritic:
    """turn-PPO: GAE over turns with a learned turn-level critic (seed 000-14).

    A turn-level MDP: state ``s_k`` = the episode up to model turn ``k`` (the
    prompt, earlier turns and observations), action = the whole turn. ``V(s_k)
    = w . h_k + b``, ``h_k`` the policy's last hidden state at the position that
    predicts the turn's first token (detached). Turn rewards: the row's scalar
    reward on its last turn (plus each turn's environment reward with
    ``turn_ppo_step_rewards``). GAE over turns,
    ``delta_k = r_k + gamma V(s_{k+1}) - V(s_k)`` (0 after the last turn),
    ``A_k = sum_j (gamma lambda)^j delta_{k+j}``; ``A_k`` is broadcast to the
    tokens of turn ``k`` (``batch.span_ids``; observations get none) and, with
    ``turn_ppo_whiten``, whitened over the batch's loss tokens (verl's PPO). The
    head is then trained on the targets ``A_k + V(s_k)`` (MSE/2,
    ``turn_ppo_critic_epochs`` full-batch AdamW steps, ``turn_ppo_critic_lr``).
    Use with ``policy_loss: clipped_ratio`` (PPO clip). Groups play no part:
    ``num_generations`` may be 1.

    Provenance: reconstructed from the abstract — the abstract states PPO on a turn-level MDP (per-turn value and
    advantage) and nothing else: a linear head on the policy's detached last hidden state at turn boundaries
    (the paper's critic is a separate value model), zero-initialised, its own AdamW; gamma = lambda = 1 by default
    (verl's GAE defaults); the outcome reward on the last turn; terminal value 0 also for episodes cut by the turn
    or token limit; token-level whitening as verl's GAE. Test: tests/test_agent_tree.py::test_turn_ppo_gae_by_hand.
    """

    def __init__(self, *, turn_ppo_gamma: float = param(1.0, "turn-PPO: discount between turns"),
                 turn_ppo_lambda: float = param(1.0, "turn-PPO: GAE lambda over turns"),
                 turn_ppo_critic_lr: float = param(1e-3, "turn-PPO: learning rate of the value head's AdamW"),
                 turn_ppo_critic_epochs: int = param(4, "turn-PPO: value-head optimiser steps per training step"),
                 turn_ppo_whiten: bool = param(True, "turn-PPO: whiten the advantages over the batch's loss tokens"),
                 turn_ppo_step_rewards: bool = param(False, "turn-PPO: add each turn's environment reward to its "
                                                            "turn reward (off: the outcome reward only)")):
        self.gamma, self.lam = float(turn_ppo_gamma), float(turn_ppo_lambda)
        self.lr, self.epochs = float(turn_ppo_critic_lr), int(turn_ppo_critic_epochs)
        self.whiten, self.step_rewards = bool(turn_ppo_whiten), bool(turn_ppo_step_rewards)
        self.head: torch.nn.Linear | None = None
        self.optimizer: torch.optim.Optimizer | None = None
        self.last_value_loss: float | None = None

    def _build(self, d: int) -> None:
        self.head = torch.nn.utils.skip_init(torch.nn.Linear, d, 1)  # no draw from the global RNG
        torch.nn.init.zeros_(self.head.weight)
        torch.nn.init.zeros_(self.head.bias)
        self.optimizer = torch.optim.AdamW(self.head.parameters(), lr=self.lr)

    def values(self, states: torch.Tensor) -> torch.Tensor:
        return self.head(states).squeeze(-1)

    def __call__(self, rewards: torch.Tensor, group_ids: torch.Tensor, batch=None, policy=None) -> torch.Tensor:
        if batch is None or EPISODE_COLUMN not in batch.columns or batch.span_ids is None:
            raise ConfigError("advantage turn_ppo needs multi-turn episodes (batch.columns['episode'] and "
                              "batch.span_ids), which an agent rollout writes: set rollout_strategy agent (or "
                              "tree_grpo / mcts_staged) and an environment")
        if policy is None:
            raise ConfigError("advantage turn_ppo reads the policy's hidden states: it needs the advantage stage's "
                              "'policy' input (the trainer provides it)")
        episodes = batch.columns[EPISODE_COLUMN]
        spans = [[t["span"] for t in ep["turns"]] for ep in episodes]
        starts = [turn_starts(batch.span_ids[r], spans[r]) for r in range(len(spans))]
        states = boundary_states(policy, batch, starts)
        if self.head is None:
            self._build(states[0].shape[-1])
        adv_tok = torch.zeros(batch.completion_ids.shape, dtype=torch.float32)
        feats, targets = [], []
        with torch.no_grad():
            for r, ep in enumerate(episodes):
                K = len(spans[r])
                if K == 0:
                    continue
                v = self.values(states[r]).tolist()
                outcome = float(rewards[r]) if not torch.isnan(rewards[r]) else 0.0
                rk = [float(t.get("reward") or 0.0) if self.step_rewards else 0.0 for t in ep["turns"]]
                rk[-1] += outcome
                adv, ret = turn_gae(rk, v, self.gamma, self.lam)
                for k, s in enumerate(spans[r]):
                    adv_tok[r][batch.span_ids[r] == s] = adv[k]
                feats.append(states[r])
                targets += ret
        mask = batch.completion_mask > 0
        adv_tok = adv_tok * mask
        if self.whiten:
            adv_tok = masked_whiten(adv_tok, mask)
        if feats:
            x, y = torch.cat(feats), torch.tensor(targets, dtype=torch.float32)
            for _ in range(self.epochs):
                self.optimizer.zero_grad(set_to_none=True)
                loss = 0.5 * ((self.values(x) - y) ** 2).mean()
                loss.backward()
                self.optimizer.step()
            self.last_value_loss = float(loss.detach())
        return adv_tok.to(rewards.dtype)

    def state_dict(self) -> dict:
        if self.head is None:
            return {"head": None}
        return {"head": {k: v.detach().clone() for k, v in self.head.state_dict().items()},
                "optimizer": self.optimizer.state_dict()}

    def load_state_dict(self, state: dict) -> None:
        if state.get("head") is None:
            self.head, self.optimizer = None, None
            return
        self._build(state["head"]["weight"].shape[-1])
        self.head.load_state_dict(state["head"])
        self.optimizer.load_state_dict(state["optimizer"])
