"""Achievement distillation: PPO plus an auxiliary phase of contrastive achievement prediction and
cross-episode achievement matching (update strategy ``achievement_distillation``), seed 000-81."""
from __future__ import annotations

import copy
from collections import deque

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from .nets import mlp
from ...errors import ConfigError
from ...registry import UPDATE_STRATEGIES, param


# ------------------------------------------------------------------ goals of one episode (hand-tested)
def goal_steps(rewards: torch.Tensor, threshold: float = 0.1) -> torch.Tensor:
    """The achievement steps of an episode ``[L]`` of rewards: ``{t + 1 : r_t > threshold, t < L - 1}`` (the
    index of the observation *after* the rewarded step; the last step has no next observation in the episode)."""
    return (rewards[:-1] > threshold).nonzero().reshape(-1) + 1


def goals(obs: torch.Tensor, rewards: torch.Tensor, threshold: float = 0.1) -> dict[str, torch.Tensor]:
    """An episode's achievements: ``goal_steps`` and each one's ``(goal_obs, goal_next_obs) = (o_{g-1}, o_g)``."""
    g = goal_steps(rewards, threshold)
    return {"goal_steps": g, "goal_obs": obs[g - 1], "goal_next_obs": obs[g]}


def next_goals(steps: torch.Tensor, goal_obs: torch.Tensor, goal_next_obs: torch.Tensor,
               obs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Each step's *next* achievement ``[L, ...]`` x 2: for the steps ``[g_{i-1}, g_i)`` (``g_{-1} = 0``) the
    achievement ``i``; after the last one, ``(o_{L-1}, 0)`` (the episode's last observation and a zero
    observation: "no next achievement")."""
    bounds = sorted({0, *steps.tolist(), len(obs)})
    a, b = [], []
    for i, (lo, hi) in enumerate(zip(bounds[:-1], bounds[1:])):
        if i == len(bounds) - 2:
            ga, gb = obs[-1], torch.zeros_like(obs[-1])
        else:
            ga, gb = goal_obs[i], goal_next_obs[i]
        a.append(ga[None].expand(hi - lo, *ga.shape))
        b.append(gb[None].expand(hi - lo, *gb.shape))
    return torch.cat(a), torch.cat(b)


def entropic_partial_ot(a: torch.Tensor, b: torch.Tensor, M: torch.Tensor, reg: float, m: float | None = None,
                        iters: int = 100) -> torch.Tensor:
    """Entropic partial optimal transport: the plan ``T >= 0`` of total mass ``m`` (default ``min(sum a, sum
    b)``) with ``T 1 <= a``, ``T^T 1 <= b`` minimising ``<T, M> - reg H(T)``, by iterated Bregman (KL)
    projections onto the three constraint sets (Benamou et al., 2015, "Iterative Bregman projections for
    regularized transportation problems", Prop. 5), ``iters`` rounds (numpy) from ``K = exp(-M / reg)`` scaled to
    mass ``m``; the algorithm of POT's ``ot.partial.entropic_partial_wasserstein`` (float64 here)."""
    a, b, M = (np.asarray(torch.as_tensor(x).detach().cpu(), np.float64) for x in (a, b, M))
    m = float(min(a.sum(), b.sum())) if m is None else float(m)
    K = np.exp(-M / reg)
    K = K * m / K.sum()
    q1, q2, q3 = np.ones_like(K), np.ones_like(K), np.ones_like(K)
    with np.errstate(divide="ignore", invalid="ignore"):
        for _ in range(iters):
            Kp = K
            K = K * q1
            K1 = np.minimum(a / K.sum(1), 1.0)[:, None] * K
            q1 = q1 * Kp / K1
            K1p = K1
            K1 = K1 * q2
            K2 = K1 * np.minimum(b / K1.sum(0), 1.0)[None, :]
            q2 = q2 * K1p / K2
            K2p = K2
            K2 = K2 * q3
            K = K2 * (m / K2.sum())
            q3 = q3 * K2p / K
            if not np.isfinite(K).all():
                break
    return torch.from_numpy(K)


def contrastive_loss(anchor: torch.Tensor, pos: torch.Tensor, neg: torch.Tensor, temperature: float) -> torch.Tensor:
    """``mean_b CE([a.p, a.n] / temperature, 0)`` = ``mean_b -log(e^{a.p/t} / (e^{a.p/t} + e^{a.n/t}))``."""
    logits = torch.stack([(anchor * pos).sum(-1), (anchor * neg).sum(-1)], -1) / temperature
    return F.cross_entropy(logits, torch.zeros(len(logits), dtype=torch.long, device=logits.device))


def categorical_kl(new_logits: torch.Tensor, old_logits: torch.Tensor) -> torch.Tensor:
    """``KL(pi_new || pi_old)`` per row (the authors' ``kl_divergence(pi_logits, old_pi_logits)``)."""
    lq, lp = torch.log_softmax(new_logits, -1), torch.log_softmax(old_logits, -1)
    return (lq.exp() * (lq - lp)).sum(-1)


def encode(actor, x: torch.Tensor) -> torch.Tensor:
    """The actor's encoder: its MLP up to the last hidden layer (the latent ``h`` the logits are read from)."""
    return actor.net[:-1](x.float())


def achievement_states(actor, goal_obs: torch.Tensor, goal_next_obs: torch.Tensor) -> torch.Tensor:
    """An achievement's representation ``normalize(h(o_g) - h(o_{g-1}))``, with ``h`` of an all-zero observation
    taken as 0 (the authors' ``get_states``)."""
    z0 = (goal_obs.reshape(len(goal_obs), -1) == 0).all(-1, keepdim=True)
    z1 = (goal_next_obs.reshape(len(goal_next_obs), -1) == 0).all(-1, keepdim=True)
    h0 = torch.where(z0, 0.0, encode(actor, goal_obs))
    h1 = torch.where(z1, 0.0, encode(actor, goal_next_obs))
    return F.normalize(h1 - h0, dim=-1)


class ADHeads(nn.Module):
    """The auxiliary heads: FiLM of the latent by the action, ``(1 + gamma(a)) h + beta(a)``
    (``gamma, beta`` from an MLP of the action's one-hot), then an MLP predicting the next achievement's
    representation, normalised."""

    def __init__(self, n_actions: int, latent: int, hidden: int):
        super().__init__()
        self.n_actions = n_actions
        self.action_mlp = mlp(n_actions, hidden, 1, 2 * latent, 1.0)
        self.pred_mlp = mlp(latent, hidden, 1, latent, 1.0)

    def forward(self, h: torch.Tensor, actions: torch.Tensor) -> torch.Tensor:
        g, b = self.action_mlp(F.one_hot(actions.long(), self.n_actions).float()).chunk(2, -1)
        return F.normalize(self.pred_mlp((1 + g) * h + b), dim=-1)


def _check(cfg) -> None:
    if cfg.policy != "control":
        raise ConfigError(f"update_strategy: achievement_distillation runs on policy control (a categorical actor "
                          f"in a Gymnasium environment, e.g. grpolab/Crafter-v0); got policy {cfg.policy}")
    if cfg.ad_aux_freq < 1 or cfg.ad_aux_epochs < 0 or cfg.ad_batch_size < 1 or cfg.ad_match_targets < 1:
        raise ConfigError(f"ad_aux_freq >= 1, ad_aux_epochs >= 0, ad_batch_size >= 1, ad_match_targets >= 1; got "
                          f"{cfg.ad_aux_freq}, {cfg.ad_aux_epochs}, {cfg.ad_batch_size}, {cfg.ad_match_targets}")


@UPDATE_STRATEGIES.register("achievement_distillation", check=_check, needs=("control",))
class AchievementDistillation:
    """PPO's update every step, and every ``ad_aux_freq`` steps an auxiliary phase on the last ``ad_aux_freq``
    batches' episodes.

    Achievement steps of an episode are the steps whose reward exceeds ``ad_goal_threshold`` (0.1: Crafter
    pays +1 per new achievement and +-0.1 per health point; :func:`goals`). An achievement is represented by
    ``s = normalize(h(o_g) - h(o_{g-1}))`` with ``h`` the actor's encoder (:func:`achievement_states`). For
    ``ad_aux_epochs`` epochs:

    1. *matching* (cross-episode): for each episode with achievements (source, in random order) and up to
       ``ad_match_targets`` other such episodes (targets), the plan ``T`` of entropic partial OT between the
       two episodes' achievements with unit masses, cost ``1 - s_i . s_j``, regularisation
       ``ad_match_reg`` (:func:`entropic_partial_ot`); pairs with ``T_ij > ad_match_threshold`` are positives,
       a random achievement of the same target the negative, and ``L_match = contrastive(s_src, s_pos, s_neg)``
       (gradients through the anchor only);
    2. *prediction* (intra-episode): for each step ``t`` of each episode with achievements, the anchor is its
       next achievement's ``s`` (:func:`next_goals`; no gradient), the positive the prediction
       ``f(h(o_t), a_t)`` (:class:`ADHeads`), the negative the prediction at a random other step of the same
       episode: ``L_pred = contrastive(s_next, f_t, f_neg)``;

    each in minibatches of at most ``ad_batch_size``, with ``contrastive(a, p, n) = CE([a.p, a.n] / tau, 0)``
    (``tau = ad_temperature``, 0.1) plus ``ad_pi_dist_coef x KL(pi_theta || pi_old)`` at the minibatch's
    observations (``pi_old``: the actor before the phase), by Adam (``ad_lr``; one optimiser per loss as the
    authors), gradients clipped to norm 0.5. The PPO phase is the recipe's (``control_gae``'s value network
    and GAE, the clipped ratio).

    Metrics (on aux steps): ``ad/match_loss``, ``ad/pred_loss``, ``ad/pi_dist`` (means over the phase),
    ``ad/match_pairs`` (matched pairs, last epoch), ``ad/episodes_with_goals``; every step
    ``ad/achievements`` (the batch's mean number of achievement steps per episode).

    Paper: Moon, Yeom, Park, Song, "Discovering Hierarchical Achievements in Reinforcement Learning via
    Contrastive Learning", NeurIPS 2023, arXiv:2307.03486 (seed 000-81).

    Provenance: authors' code — https://github.com/snu-mllab/Achievement-Distillation
    achievement_distillation/algorithm/ppo_ad.py (``Buffer.get_goals``: reward > 0.1 on ``rewards[:-1]``, +1;
    ``get_next_goals``: the last segment's anchor is ``(obs[-1], 0)``; ``get_match_data_loader``: 16 target
    trajectories, ``entropic_partial_wasserstein(ones, ones, 1 - s_s s_t^T, reg=0.05, numItermax=100)``,
    ``T > 0.5``, random negatives of the target; ``get_pred_data_loader``: negatives by a permutation of the
    same trajectory; ``PPOADAlgorithm.update``: the aux phase every ``aux_freq`` updates, matching then
    prediction each epoch, separate Adam optimisers, ``clip_grad_norm_`` 0.5), model/ppo_ad.py
    (``get_states`` with zero-observation masking, ``film``, ``get_next_goal_preds``, ``compute_pred_losses`` /
    ``compute_match_losses``: two-way logits over temperature 0.1, cross-entropy to the positive,
    ``pi_dist = kl_divergence(pi_logits, old_pi_logits)``), configs/ppo_ad.yaml (aux_freq 8, aux_nepoch 6,
    pi_dist_coef 1, vf_dist_coef 1); read, not copied. Differences: policy control's MLP actor (its hidden
    layers are the encoder ``h``) on Crafter's semantic local view (policies/control/gymenvs/crafter_env.py) instead
    of the IMPALA CNN on pixels; no memory: the authors feed the previous achievement's representation to
    the policy and value heads (``use_memory``), not done here; no value distillation: the value network is
    control_gae's, which shares no parameter with the actor, so the aux phase cannot move it (the authors'
    ``vf_dist`` keeps a shared trunk's value head in place); the partial OT is this module's Bregman
    iteration (POT is not a dependency); achievement steps from the reward only (the authors also assert it
    equals the change of Crafter's success vector); episodes are the batch's whole episodes.
    Test: tests/test_achievement_distillation.py::test_goal_steps_and_next_goals_by_hand,
    tests/test_achievement_distillation.py::test_partial_ot_matches_the_right_pairs,
    tests/test_achievement_distillation.py::test_contrastive_and_kl_by_hand,
    tests/test_achievement_distillation.py::test_aux_phase_lowers_its_losses.
    """

    def __init__(self, *, ad_aux_freq: int = param(8, "achievement_distillation: PPO updates between aux phases"),
                 ad_aux_epochs: int = param(6, "achievement_distillation: epochs of each aux phase"),
                 ad_pi_dist_coef: float = param(1.0, "achievement_distillation: weight of KL(pi || pi_old) in the "
                                                     "aux losses"),
                 ad_temperature: float = param(0.1, "achievement_distillation: temperature of the contrastive "
                                                    "logits"),
                 ad_lr: float = param(3e-4, "achievement_distillation: Adam learning rate of the aux phase"),
                 ad_batch_size: int = param(512, "achievement_distillation: samples per aux minibatch"),
                 ad_match_reg: float = param(0.05, "achievement_distillation: entropic regularisation of the "
                                                   "partial OT matching"),
                 ad_match_threshold: float = param(0.5, "achievement_distillation: plan entries above it are "
                                                        "matched pairs"),
                 ad_match_targets: int = param(16, "achievement_distillation: target episodes per source "
                                                   "episode in the matching"),
                 ad_goal_threshold: float = param(0.1, "achievement_distillation: a step whose reward exceeds it "
                                                       "is an achievement"),
                 ad_seed: int = param(0, "achievement_distillation: seed of the heads and the aux sampling")):
        self.freq, self.epochs, self.pi_coef = int(ad_aux_freq), int(ad_aux_epochs), float(ad_pi_dist_coef)
        self.temp, self.lr, self.bs = float(ad_temperature), float(ad_lr), int(ad_batch_size)
        self.reg, self.thr, self.n_targets = float(ad_match_reg), float(ad_match_threshold), int(ad_match_targets)
        self.goal_thr, self.seed = float(ad_goal_threshold), int(ad_seed)
        self.buffer: deque = deque(maxlen=self.freq)
        self.count = 0
        self.heads: ADHeads | None = None
        self.gen = torch.Generator().manual_seed(self.seed)

    # -------------------------------------------------------------- state
    def _build(self, actor) -> None:
        state = torch.random.get_rng_state()
        torch.manual_seed(self.seed)
        latent = actor.net[-1].in_features
        self.heads = ADHeads(actor.config["act_dim"], latent, latent)
        torch.random.set_rng_state(state)

    def _optimisers(self, actor):
        params = list(actor.parameters()) + list(self.heads.parameters())
        if not hasattr(self, "match_opt"):
            self.match_opt = torch.optim.Adam(params, lr=self.lr)
            self.pred_opt = torch.optim.Adam(params, lr=self.lr)
        return self.match_opt, self.pred_opt

    def state_dict(self) -> dict:
        return {"count": self.count, "gen": self.gen.get_state(), "buffer": list(self.buffer),
                "heads": None if self.heads is None else self.heads.state_dict(),
                "match_opt": self.match_opt.state_dict() if hasattr(self, "match_opt") else None,
                "pred_opt": self.pred_opt.state_dict() if hasattr(self, "pred_opt") else None}

    def load_state_dict(self, state: dict) -> None:
        self.count = int(state["count"])
        self.gen.set_state(state["gen"])
        self.buffer = deque(state["buffer"], maxlen=self.freq)
        self._pending = state  # heads and optimisers need the actor: restored at the next call

    def _restore(self, actor) -> None:
        st = getattr(self, "_pending", None)
        if st is None:
            return
        self._pending = None
        if st.get("heads") is not None:
            self._build(actor)
            self.heads.load_state_dict(st["heads"])
        if st.get("match_opt") is not None:
            m, p = self._optimisers(actor)
            m.load_state_dict(st["match_opt"])
            p.load_state_dict(st["pred_opt"])

    # -------------------------------------------------------------- episodes
    def episodes(self, batch) -> list[dict]:
        """The batch's episodes as ``{obs [L, D], actions [L], rewards [L]}`` with their goals."""
        out = []
        lengths = (batch.completion_attention_mask > 0).sum(1).tolist()
        for i, L in enumerate(lengths):
            obs = batch.step_data["obs"][i, :L].float()
            ep = {"obs": obs, "actions": batch.step_data["action"][i, :L].long(),
                  "rewards": batch.row_data["step_rewards"][i, :L].float()}
            ep.update(goals(obs, ep["rewards"], self.goal_thr))
            out.append(ep)
        return out

    # -------------------------------------------------------------- the aux phase
    def _minibatches(self, n: int):
        order = torch.randperm(n, generator=self.gen)
        return [order[i:i + self.bs] for i in range(0, n, self.bs)]

    def match_batches(self, actor, eps: list[dict]):
        """The matching phase's samples: ``(anc_obs, anc_next, pos_obs, pos_next, neg_obs, neg_next, obs)``
        per source episode (class docstring, step 1); ``obs`` are random observations of the source for the
        policy's KL term."""
        eps = [e for e in eps if len(e["goal_steps"]) > 0]
        n = len(eps)
        for i in torch.randperm(n, generator=self.gen).tolist():
            src = eps[i]
            with torch.no_grad():
                s_src = achievement_states(actor, src["goal_obs"], src["goal_next_obs"])
            parts = []
            for j in torch.randperm(max(n - 1, 0), generator=self.gen)[:self.n_targets].tolist():
                tgt = eps[j + 1 if j >= i else j]
                with torch.no_grad():
                    s_tgt = achievement_states(actor, tgt["goal_obs"], tgt["goal_next_obs"])
                T = entropic_partial_ot(torch.ones(len(s_src)), torch.ones(len(s_tgt)), 1 - s_src @ s_tgt.T, self.reg)
                r, c = torch.where(T > self.thr)
                if len(r) == 0:
                    continue
                neg = torch.randint(len(s_tgt), (len(c),), generator=self.gen)
                parts.append((src["goal_obs"][r], src["goal_next_obs"][r], tgt["goal_obs"][c], tgt["goal_next_obs"][c],
                              tgt["goal_obs"][neg], tgt["goal_next_obs"][neg]))
            if not parts:
                continue
            cat = [torch.cat(x) for x in zip(*parts)]
            obs = src["obs"][torch.randint(len(src["obs"]), (len(cat[0]),), generator=self.gen)]
            yield (*cat, obs)

    def pred_batches(self, eps: list[dict]):
        """The prediction phase's samples per episode with achievements: ``(anc_obs, anc_next, obs, actions,
        neg_obs, neg_actions)`` (class docstring, step 2)."""
        for i in torch.randperm(len(eps), generator=self.gen).tolist():
            e = eps[i]
            if len(e["goal_steps"]) == 0:
                continue
            a, b = next_goals(e["goal_steps"], e["goal_obs"], e["goal_next_obs"], e["obs"])
            perm = torch.randperm(len(e["obs"]), generator=self.gen)
            yield a, b, e["obs"], e["actions"], e["obs"][perm], e["actions"][perm]

    def aux_phase(self, actor, eps: list[dict]) -> dict:
        if self.heads is None:
            self._build(actor)
        match_opt, pred_opt = self._optimisers(actor)
        old = copy.deepcopy(actor).eval()
        params = list(actor.parameters()) + list(self.heads.parameters())
        actor.train()
        stats = {"match": [], "pred": [], "dist": [], "pairs": 0}

        def pi_dist(x):
            with torch.no_grad():
                old_logits = old(x)
            return categorical_kl(actor(x), old_logits).mean()

        def step(opt, loss):
            opt.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(params, 0.5)
            opt.step()

        for _ in range(self.epochs):
            stats["pairs"] = 0
            for ao, an, po, pn, no, nn_, obs in self.match_batches(actor, eps):
                stats["pairs"] += len(ao)
                for idx in self._minibatches(len(ao)):
                    anc = achievement_states(actor, ao[idx], an[idx])
                    with torch.no_grad():
                        pos, neg = achievement_states(actor, po[idx], pn[idx]), achievement_states(actor, no[idx], nn_[idx])
                    lm, d = contrastive_loss(anc, pos, neg, self.temp), pi_dist(obs[idx])
                    step(match_opt, lm + self.pi_coef * d)
                    stats["match"].append(float(lm.detach()))
                    stats["dist"].append(float(d.detach()))
            for ao, an, obs, act, nobs, nact in self.pred_batches(eps):
                for idx in self._minibatches(len(obs)):
                    with torch.no_grad():
                        anc = achievement_states(actor, ao[idx], an[idx])
                    pos = self.heads(encode(actor, obs[idx]), act[idx])
                    neg = self.heads(encode(actor, nobs[idx]), nact[idx])
                    lp = contrastive_loss(anc, pos, neg, self.temp)
                    d = pi_dist(torch.cat([obs[idx], nobs[idx]]))
                    step(pred_opt, lp + self.pi_coef * d)
                    stats["pred"].append(float(lp.detach()))
                    stats["dist"].append(float(d.detach()))
        actor.eval()

        def mean(v):
            return sum(v) / len(v) if v else 0.0
        return {"ad/match_loss": mean(stats["match"]), "ad/pred_loss": mean(stats["pred"]),
                "ad/pi_dist": mean(stats["dist"]), "ad/match_pairs": float(stats["pairs"]),
                "ad/episodes_with_goals": float(sum(len(e["goal_steps"]) > 0 for e in eps)),
                "ad/first_pred_loss": stats["pred"][0] if stats["pred"] else 0.0,
                "ad/last_pred_loss": stats["pred"][-1] if stats["pred"] else 0.0}

    def __call__(self, update, batch, model):
        if not model.config["discrete"] or model.config["agents"] != 1 or model.config["layers"] < 1:
            raise ConfigError("update_strategy: achievement_distillation needs one agent, Discrete actions and an "
                              "actor with at least one hidden layer (control_layers >= 1)")
        self._restore(model)
        metrics = dict(update(batch))
        eps = self.episodes(batch)
        self.buffer.append(eps)
        self.count += 1
        metrics["ad/achievements"] = sum(len(e["goal_steps"]) for e in eps) / max(len(eps), 1)
        if self.count % self.freq == 0:
            metrics.update(self.aux_phase(model, [e for part in self.buffer for e in part]))
        return metrics
