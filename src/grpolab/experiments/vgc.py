"""VGC-Bench's baselines on Pokémon VGC doubles with poke-env and a local Showdown server (seed 000-90).

*VGC-Bench: Towards Mastering Diverse Team Strategies in Competitive Pokémon* (Angliss et al.,
arXiv:2506.10326), seed 000-90. What is built here, at a size that runs on a CPU against a local server
(:mod:`grpolab.experiments.showdown`):

- **Heuristic baselines** (:func:`make_player`): poke-env's ``RandomPlayer``, ``MaxBasePowerPlayer`` and
  ``SimpleHeuristicsPlayer`` in the VGC format ``gen9vgc2025regi`` (open team sheets, bring 6 pick 4, level 50)
  with hand-written, server-validated teams (:data:`TEAMS`: A and B, and the learning test's fairy and dark,
  read from ``vgc_teams/<name>.txt``); :func:`win_rate_matrix` plays every pair and
  returns ``W[i, j]`` = the win rate of player i against player j (``W[j, i] = 1 - W[i, j]`` up to ties, diagonal
  0.5 as the authors' payoff matrix).
- **Population schemes** (:func:`opponent_distribution`, :class:`DoubleOracle`): the distribution over saved
  policies from which the opponents of the next rollout are drawn: pure self-play (the latest policy only),
  fictitious play (uniform over the saved policies), double oracle (the Nash equilibrium of the empirical payoff
  matrix ``W``, a symmetric constant-sum game, solved as the row player's maximin linear program
  (:func:`nash_zero_sum`)::

      max_{p, v} v   s.t.   sum_i p_i W[i, j] >= v  for every column j,   sum_i p_i = 1,   p >= 0

  with ``scipy.optimize.linprog``). The double-oracle matrix grows as the authors': a new policy with win rates
  ``w_j`` against the saved ones adds the column ``1 - w`` and the row ``[w, 0.5]``.
- **A learned policy** (:class:`VGCPolicy`, :class:`PolicyPlayer`, :func:`train_vgc`): a small MLP over an
  embedded battle (:func:`embed_battle`, the authors' ``embed_battle`` in spirit and much smaller: HP, faint,
  active-slot, status flags of the 12 Pokémon, and per move of each own active Pokémon its base power, accuracy,
  category, priority, spread flag and type effectiveness against each opposing active Pokémon), two masked
  categorical heads over poke-env's doubles action space (107 actions per slot in gen 9: pass, 6 switches,
  4 moves x 5 targets x (none, mega, z, dynamax, tera)), the second slot's mask updated with the first slot's
  action (no switch to the same Pokémon, no second tera, no pass unless forced), as the authors'
  ``MaskedActorCriticPolicy._update_mask``. Terminal reward only, ``+1`` win, ``-1`` loss, ``0`` otherwise (the
  authors' ``calc_reward``). Trained against a fixed opponent (the authors' "exploiter" scheme) with the
  library's group-relative advantage: the battles of one iteration are one group, ``A_b = (r_b - mean r) /
  (std r + eps)`` (``group_zscore``) given to every decision of battle b, and the PPO clipped surrogate
  (``clipped_ratio``) over ``epochs`` passes; no critic. :data:`LEARNING_TEST` is a short setting of
  :func:`train_vgc` for the test suite (two four-Pokémon teams where one move is clearly right; about a minute of
  battles per seed); the documented default run (team A against team B, 25 iterations) is unchanged.

Provenance: authors' code — https://github.com/cameronangliss/vgc-bench vgc_bench/src/callback.py (``Callback``:
payoff matrix starts ``[[0.5]]``, ``update_payoff_matrix`` appends the column ``1 - win_rates`` and the row
``[win_rates, 0.5]``, opponent distribution ``Game(payoff_matrix).linear_program()[0]`` (nashpy), fictitious play
samples checkpoints with ``prob_dist=None`` i.e. uniformly, ``compare`` = player 1's ``win_rate``),
vgc_bench/src/env.py (``calc_reward``: 1 / -1 / 0), vgc_bench/src/policy_player.py (``embed_battle``: global,
side and per-Pokémon features, 12 Pokémon), vgc_bench/src/policy.py (``MaskedActorCriticPolicy``: masked logits
``+ -inf``, second action's mask updated from the first), vgc_bench/train.py (SB3 PPO, gamma 1, lr 1e-5, batch
512, d_model 256); read, not copied. Our choices: the LP is scipy's ``linprog`` (HiGHS) instead of nashpy (both
give the row player's maximin strategy; with several equilibria they may pick different ones); the embedding,
network (2 x 64 MLP instead of the authors' attention extractor over learned ability/item/move embeddings),
the group-relative advantage instead of SB3 PPO's critic, and the budget are ours; the format is the npm
server's ``gen9vgc2025regi`` with two teams written here (the authors use their Showdown fork's
``gen9championsvgc2026reg*`` formats and thousands of scraped teams, not available offline); teams are picked
at random at team preview (the authors' default without ``choose_on_teampreview``); behaviour cloning (from
self-generated heuristic battles: the authors' scraped human replays are not available offline) and the LLM
player are in ``experiments/vgc_baselines.py``; the test setting's teams (:data:`LEARNING_TEST`) are ours. Test:
tests/test_vgc.py::test_nash_rock_paper_scissors_is_uniform,
tests/test_vgc.py::test_double_oracle_grows_like_the_authors,
tests/test_vgc.py::test_learned_policy_learns_the_super_effective_spread_move.
"""
from __future__ import annotations

import asyncio
import copy
import math
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch
from torch import nn

from ..algorithms.advantages import group_zscore
from ..algorithms.losses import clipped_ratio
from ..errors import ConfigError

VGC_FORMAT = "gen9vgc2025regi"
ACT_LEN = 107  # poke-env DoublesEnv.get_action_space_size(9)
SCHEMES = ("self_play", "fictitious_play", "double_oracle")
PLAYER_KINDS = ("random", "max_base_power", "simple_heuristics")

#: Two teams written for these tests (common VGC Pokémon, legal in gen9vgc2025regi: checked with the server's
#: ``pokemon-showdown validate-team gen9vgc2025regi``): "A" and "B". And the learning test's pair
#: (:data:`LEARNING_TEST`), four Pokémon each (legal: the format's minimum): every Pokémon of "fairy" has Dazzling
#: Gleam as its first move (Fairy, hits both foes, super effective against every Pokémon of "dark", 4x on Roaring
#: Moon and Hydreigon) and three Psychic moves, to which Dark types are immune (their tera type is Dark too, so a
#: tera keeps the immunity); "dark" attacks with no protection. Showdown team texts, one file a team in
#: ``vgc_teams/<name>.txt`` (shipped as package data).
TEAMS_DIR = Path(__file__).resolve().parent / "vgc_teams"
TEAMS = {name: (TEAMS_DIR / f"{name}.txt").read_text(encoding="utf-8") for name in ("A", "B", "fairy", "dark")}

#: The learning test's setting (``train_vgc(server, seed=s, **LEARNING_TEST)``): the right decision is one move
#: (move 1 of every Pokémon of team "fairy", action indices 7-11 / 87-91 of each slot) and a battle lasts a few
#: turns, so the return rises within about a minute of battles. Uniform policy: win rate 0.08-0.25 against the
#: random player with team "dark"; always Dazzling Gleam: 1.0 in 2-3 turns (docs/control.md, VGC-Bench).
LEARNING_TEST = {"team": "fairy", "opponent_team": "dark", "iterations": 8, "battles_per_iteration": 16,
                 "eval_battles": 24, "lr": 1e-2, "concurrent": 8}


# ------------------------------------------------------------------ population schemes (no server needed)
def nash_zero_sum(payoff) -> tuple[np.ndarray, float]:
    """The row player's maximin (Nash) mixed strategy ``p`` and the game's value ``v`` of the matrix game
    ``payoff`` (the row player receives ``payoff[i, j]``; a constant-sum matrix such as win rates is the same
    game). Linear program: maximise ``v`` s.t. ``payoff^T p >= v``, ``sum p = 1``, ``p >= 0``."""
    from scipy.optimize import linprog

    m = np.asarray(payoff, dtype=np.float64)
    if m.ndim != 2 or m.size == 0 or not np.isfinite(m).all():
        raise ConfigError(f"nash_zero_sum: payoff must be a finite 2-D matrix, got shape {m.shape}")
    n_rows, n_cols = m.shape
    c = np.zeros(n_rows + 1)
    c[-1] = -1.0  # minimise -v
    a_ub = np.hstack([-m.T, np.ones((n_cols, 1))])  # v - sum_i p_i m[i, j] <= 0
    a_eq = np.hstack([np.ones((1, n_rows)), np.zeros((1, 1))])
    bounds = [(0.0, None)] * n_rows + [(None, None)]
    res = linprog(c, A_ub=a_ub, b_ub=np.zeros(n_cols), A_eq=a_eq, b_eq=[1.0], bounds=bounds, method="highs")
    if not res.success:
        raise ConfigError(f"nash_zero_sum: the linear program failed: {res.message}")
    p = np.clip(res.x[:-1], 0.0, None)
    return p / p.sum(), float(res.x[-1])


def opponent_distribution(scheme: str, n_policies: int, payoff=None) -> np.ndarray:
    """Probabilities over the ``n_policies`` saved policies (oldest first) from which opponents are drawn:
    ``self_play`` = the latest only, ``fictitious_play`` = uniform, ``double_oracle`` = the Nash strategy of
    ``payoff`` (:func:`nash_zero_sum`)."""
    if n_policies < 1:
        raise ConfigError(f"opponent_distribution: n_policies must be >= 1, got {n_policies}")
    if scheme == "self_play":
        p = np.zeros(n_policies)
        p[-1] = 1.0
        return p
    if scheme == "fictitious_play":
        return np.full(n_policies, 1.0 / n_policies)
    if scheme == "double_oracle":
        if payoff is None or np.shape(payoff) != (n_policies, n_policies):
            raise ConfigError(f"opponent_distribution: double_oracle needs the {n_policies}x{n_policies} payoff "
                              f"matrix, got {None if payoff is None else np.shape(payoff)}")
        return nash_zero_sum(payoff)[0]
    raise ConfigError(f"opponent_distribution: scheme {scheme!r} is not one of {', '.join(SCHEMES)}")


class DoubleOracle:
    """The authors' double-oracle bookkeeping: the payoff matrix ``W`` (win rate of policy i against j) over the
    saved policies, starting at ``[[0.5]]`` for the first; :meth:`add` appends a new policy from its win rates
    against the saved ones; :meth:`distribution` is the Nash strategy to sample opponents from."""

    def __init__(self):
        self.payoff = np.array([[0.5]])

    def add(self, win_rates) -> None:
        w = np.asarray(win_rates, dtype=np.float64).reshape(-1)
        if w.shape[0] != self.payoff.shape[0]:
            raise ConfigError(f"DoubleOracle.add: need {self.payoff.shape[0]} win rates (one per saved policy), "
                              f"got {w.shape[0]}")
        col = (1.0 - w).reshape(-1, 1)
        self.payoff = np.vstack([np.hstack([self.payoff, col]), np.append(w, 0.5)[None, :]])

    def distribution(self) -> np.ndarray:
        return nash_zero_sum(self.payoff)[0]

    def sample(self, k: int, rng: np.random.Generator) -> np.ndarray:
        return rng.choice(self.payoff.shape[0], size=k, p=self.distribution())

    def state_dict(self) -> dict:
        return {"payoff": self.payoff.tolist()}

    def load_state_dict(self, state: dict) -> None:
        self.payoff = np.asarray(state["payoff"], dtype=np.float64)


# ------------------------------------------------------------------ players and battles (need the server)
def make_player(kind, server, *, team: str = "A", battle_format: str = VGC_FORMAT, concurrent: int = 4,
                **kwargs):
    """A poke-env player of ``kind`` (one of :data:`PLAYER_KINDS`, or a ``Player`` subclass) on ``server``."""
    from poke_env.player import MaxBasePowerPlayer, RandomPlayer, SimpleHeuristicsPlayer

    classes = {"random": RandomPlayer, "max_base_power": MaxBasePowerPlayer,
               "simple_heuristics": SimpleHeuristicsPlayer}
    cls = classes.get(kind, kind)
    if isinstance(cls, str):
        raise ConfigError(f"make_player: kind {kind!r} is not one of {', '.join(PLAYER_KINDS)}")
    if team not in TEAMS:
        raise ConfigError(f"make_player: team {team!r} is not one of {', '.join(TEAMS)}")
    return cls(server_configuration=server.server_configuration, battle_format=battle_format,
               team=TEAMS[team].strip() if "random" not in battle_format else None,
               max_concurrent_battles=concurrent, accept_open_team_sheet=True, open_timeout=None,
               ping_interval=None, ping_timeout=None, log_level=40, **kwargs)


def play(p1, p2, n_battles: int) -> dict:
    """``n_battles`` battles of ``p1`` against ``p2``: p1's wins, losses, ties and win rate (wins / finished)."""
    asyncio.run(p1.battle_against(p2, n_battles=n_battles))
    battles = list(p1.battles.values())
    won = sum(bool(b.won) for b in battles)
    lost = sum(bool(b.lost) for b in battles)
    finished = sum(bool(b.finished) for b in battles)
    out = {"won": won, "lost": lost, "tied": finished - won - lost, "finished": finished,
           "win_rate": won / max(finished, 1), "turns": [b.turn for b in battles]}
    p1.reset_battles()
    p2.reset_battles()
    return out


def close_players(*players) -> None:
    """Disconnect the players' WebSockets (before the server stops, so no client logs a dropped connection)."""
    for p in players:
        try:
            asyncio.run(p.ps_client.stop_listening())
        except Exception:  # already closed
            pass


def win_rate_matrix(kinds, server, n_battles: int, *, concurrent: int = 4) -> np.ndarray:
    """``W[i, j]`` = the win rate of player ``kinds[i]`` (team A) against ``kinds[j]`` (team B) over ``n_battles``
    battles; ``W[j, i] = 1 - W[i, j]`` (a tie counts as half a win to each); diagonal 0.5."""
    k = len(kinds)
    w = np.full((k, k), 0.5)
    for i in range(k):
        for j in range(i + 1, k):
            a = make_player(kinds[i], server, team="A", concurrent=concurrent)
            b = make_player(kinds[j], server, team="B", concurrent=concurrent)
            r = play(a, b, n_battles)
            close_players(a, b)
            w[i, j] = (r["won"] + 0.5 * r["tied"]) / max(r["finished"], 1)
            w[j, i] = 1.0 - w[i, j]
    return w


# ------------------------------------------------------------------ the learned policy
_STATUS = ("brn", "frz", "par", "psn", "slp", "tox")
_SPREAD = ("ALL_ADJACENT", "ALL_ADJACENT_FOES")
POKEMON_FEATURES = 5 + len(_STATUS)  # hp, fainted, active a, active b, revealed, status one-hot
MOVE_FEATURES = 9  # power, accuracy, physical, special, status, priority, spread, eff vs foe a, eff vs foe b
OBS_LEN = 1 + 12 * POKEMON_FEATURES + 2 * 4 * MOVE_FEATURES


def _pokemon_features(p, active) -> list[float]:
    status = p.status.name.lower() if p.status is not None else ""
    return [p.current_hp_fraction, float(p.fainted), float(active[0] is p), float(active[1] is p),
            float(p.revealed)] + [float(status == s) for s in _STATUS]


def _eff(move, foe) -> float:
    if foe is None or move.category.name == "STATUS":
        return 0.0
    m = foe.damage_multiplier(move)
    return math.log2(m) / 2 if m > 0 else -1.5


def embed_battle(battle) -> np.ndarray:
    """The observation: turn, 12 Pokémon (own team in ``battle.team`` order, then the opponent's), and per own
    active slot its first 4 known moves (the order poke-env's action indices use). Length :data:`OBS_LEN`."""
    x = [min(battle.turn, 20) / 20]
    own, foes = battle.active_pokemon, battle.opponent_active_pokemon
    for team, active in ((battle.team, own), (battle.opponent_team, foes)):
        mons = list(team.values())[:6]
        for p in mons:
            x += _pokemon_features(p, active)
        x += [0.0] * POKEMON_FEATURES * (6 - len(mons))
    for slot in range(2):
        mon = own[slot]
        moves = list(mon.moves.values())[:4] if mon is not None else []
        for mv in moves:
            cat = mv.category.name
            x += [mv.base_power / 150, mv.accuracy if isinstance(mv.accuracy, float) else 1.0,
                  float(cat == "PHYSICAL"), float(cat == "SPECIAL"), float(cat == "STATUS"), mv.priority / 5,
                  float(mv.target is not None and mv.target.name in _SPREAD), _eff(mv, foes[0]), _eff(mv, foes[1])]
        x += [0.0] * MOVE_FEATURES * (4 - len(moves))
    return np.asarray(x, dtype=np.float32)


def second_mask(mask2: torch.Tensor, first: torch.Tensor, first_mask: torch.Tensor) -> torch.Tensor:
    """Slot 2's action mask given slot 1's action ``first`` (as the authors' ``_update_mask``): no switch to the
    Pokémon slot 1 switches to, no second tera (actions 87..106), no pass (0) when slot 1 passed by choice (slot 1
    was not forced to pass, i.e. its mask allowed more than the pass). Rows where that leaves nothing keep
    ``mask2``."""
    idx = torch.arange(ACT_LEN).unsqueeze(0)
    first = first.unsqueeze(-1)
    forced_pass = (first_mask[:, :1] > 0) & (first_mask.sum(-1, keepdim=True) == 1)
    banned = (((idx == first) & (first >= 1) & (first <= 6))
              | ((idx >= 87) & (first >= 87))
              | ((idx == 0) & (first == 0) & ~forced_pass))
    out = mask2 * ~banned
    empty = out.sum(-1, keepdim=True) == 0
    return torch.where(empty, mask2, out)


class VGCPolicy(nn.Module):
    """MLP ``OBS_LEN -> hidden -> hidden`` (tanh) and two heads of :data:`ACT_LEN` logits (slot 1, slot 2; slot 2
    also reads slot 1's action as a one-hot); masked logits ``+ -inf`` on illegal actions."""

    def __init__(self, hidden: int = 64):
        super().__init__()
        self.body = nn.Sequential(nn.Linear(OBS_LEN, hidden), nn.Tanh(), nn.Linear(hidden, hidden), nn.Tanh())
        self.head1 = nn.Linear(hidden, ACT_LEN)
        self.head2 = nn.Linear(hidden + ACT_LEN, ACT_LEN)
        for head in (self.head1, self.head2):
            nn.init.zeros_(head.weight)
            nn.init.zeros_(head.bias)

    @staticmethod
    def _masked(logits, mask):
        return torch.where(mask > 0, logits, torch.full_like(logits, -1e9))

    def head_logprobs(self, obs, mask1, mask2, a1):
        """``(l1, l2, m2)``: the two heads' masked log-probabilities ``[N, ACT_LEN]`` (slot 2's given slot 1's
        action ``a1``) and slot 2's mask updated with ``a1`` (:func:`second_mask`)."""
        h = self.body(obs)
        l1 = torch.log_softmax(self._masked(self.head1(h), mask1), -1)
        m2 = second_mask(mask2, a1, mask1)
        h2 = torch.cat([h, nn.functional.one_hot(a1, ACT_LEN).float()], -1)
        return l1, torch.log_softmax(self._masked(self.head2(h2), m2), -1), m2

    def log_prob(self, obs, mask1, mask2, a1, a2) -> torch.Tensor:
        l1, l2, _ = self.head_logprobs(obs, mask1, mask2, a1)
        return l1.gather(-1, a1[:, None])[:, 0] + l2.gather(-1, a2[:, None])[:, 0]

    @torch.no_grad()
    def act(self, obs, mask1, mask2, generator: torch.Generator, greedy: bool = False):
        h = self.body(obs)
        l1 = self._masked(self.head1(h), mask1)
        a1 = l1.argmax(-1) if greedy else torch.multinomial(torch.softmax(l1, -1), 1, generator=generator)[:, 0]
        m2 = second_mask(mask2, a1, mask1)
        l2 = self._masked(self.head2(torch.cat([h, nn.functional.one_hot(a1, ACT_LEN).float()], -1)), m2)
        a2 = l2.argmax(-1) if greedy else torch.multinomial(torch.softmax(l2, -1), 1, generator=generator)[:, 0]
        return a1, a2


@dataclass
class Decision:
    obs: np.ndarray
    mask1: np.ndarray
    mask2: np.ndarray
    a1: int
    a2: int
    logp: float


@dataclass
class _Log:
    decisions: dict = field(default_factory=dict)  # battle tag -> [Decision]
    fallbacks: int = 0


def policy_player_class():
    """The poke-env ``Player`` subclass that acts with a :class:`VGCPolicy` (built lazily: poke-env imports at
    call time)."""
    from poke_env.environment import DoublesEnv
    from poke_env.player import DefaultBattleOrder, Player

    class PolicyPlayer(Player):
        """Acts with ``self.policy``; records every decision per battle in ``self.log`` (for training)."""

        def __init__(self, *args, policy: VGCPolicy, seed: int = 0, greedy: bool = False, **kwargs):
            super().__init__(*args, **kwargs)
            self.policy = policy
            self.greedy = greedy
            self.generator = torch.Generator().manual_seed(seed)
            self.log = _Log()

        def choose_move(self, battle):
            if battle._wait:
                return DefaultBattleOrder()
            obs = embed_battle(battle)
            mask = np.asarray(DoublesEnv.get_action_mask(battle), dtype=np.float32)
            m1, m2 = mask[:ACT_LEN], mask[ACT_LEN:]
            t = lambda a: torch.as_tensor(a)[None]  # noqa: E731
            a1, a2 = self.policy.act(t(obs), t(m1), t(m2), self.generator, self.greedy)
            a1, a2 = int(a1), int(a2)
            with torch.no_grad():
                lp = float(self.policy.log_prob(t(obs), t(m1), t(m2), torch.tensor([a1]), torch.tensor([a2])))
            try:
                order = DoublesEnv.action_to_order(np.array([a1, a2]), battle, strict=True)
            except ValueError:
                self.log.fallbacks += 1
                return self.choose_random_move(battle)
            self.log.decisions.setdefault(battle.battle_tag, []).append(Decision(obs, m1, m2, a1, a2, lp))
            return order

    return PolicyPlayer


def stack_decisions(decisions: list) -> tuple[torch.Tensor, ...]:
    """``(obs, mask1, mask2, a1, a2)`` of recorded decisions (:class:`Decision`, or anything with those fields), one
    row each."""
    return (torch.as_tensor(np.stack([d.obs for d in decisions])),
            torch.as_tensor(np.stack([d.mask1 for d in decisions])),
            torch.as_tensor(np.stack([d.mask2 for d in decisions])),
            torch.tensor([d.a1 for d in decisions]), torch.tensor([d.a2 for d in decisions]))


def pg_update(policy: VGCPolicy, opt, decisions: list, advantages: torch.Tensor, *, epochs: int = 2,
              epsilon: float = 0.2) -> float:
    """``epochs`` steps of the clipped surrogate ``-min(rho A, clip(rho, 1 - eps, 1 + eps) A)`` averaged over the
    decisions (``rho = exp(log pi(a1, a2 | s) - logp_behaviour)``, one advantage per decision: its battle's).
    Returns the last loss."""
    obs, m1, m2, a1, a2 = stack_decisions(decisions)
    old = torch.tensor([d.logp for d in decisions])
    loss = torch.tensor(0.0)
    for _ in range(epochs):
        lp = policy.log_prob(obs, m1, m2, a1, a2)[:, None]
        loss = clipped_ratio(lp, old[:, None], advantages, torch.ones_like(lp), epsilon=epsilon)[0].mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
    return float(loss.detach())


def calc_reward(battle) -> float:
    """The authors' terminal reward: 1 won, -1 lost, 0 otherwise (tie, unfinished)."""
    if not battle.finished:
        return 0.0
    return 1.0 if battle.won else (-1.0 if battle.lost else 0.0)


def train_vgc(server, *, seed: int = 0, iterations: int = 10, battles_per_iteration: int = 16,
              eval_battles: int = 40, opponent: str = "random", lr: float = 3e-3, epochs: int = 2,
              epsilon: float = 0.2, hidden: int = 64, concurrent: int = 4, team: str = "A",
              opponent_team: str = "B", log=print) -> dict:
    """Train a :class:`VGCPolicy` against a fixed ``opponent`` (one of :data:`PLAYER_KINDS`) for ``iterations``
    of ``battles_per_iteration`` battles (``team`` against the opponent's ``opponent_team``, keys of
    :data:`TEAMS`); each iteration's battles are one
    group (``group_zscore`` of the terminal rewards), ``epochs`` passes of the clipped surrogate over all its
    decisions. Evaluates the sampling policy's win rate against the opponent over ``eval_battles`` battles before
    and after training. Returns ``{"before", "after", "history", "fallbacks", "policy"}``."""
    if opponent not in PLAYER_KINDS:
        raise ConfigError(f"train_vgc: opponent {opponent!r} is not one of {', '.join(PLAYER_KINDS)}")
    torch.manual_seed(seed)
    policy = VGCPolicy(hidden)
    opt = torch.optim.Adam(policy.parameters(), lr=lr)
    cls = policy_player_class()
    me = make_player(cls, server, team=team, concurrent=concurrent, policy=policy, seed=seed)
    opp = make_player(opponent, server, team=opponent_team, concurrent=concurrent)
    history = []
    try:
        before = play(me, opp, eval_battles)["win_rate"] if eval_battles else None
        me.log = _Log()
        for it in range(iterations):
            battles = dict(me.battles)
            asyncio.run(me.battle_against(opp, n_battles=battles_per_iteration))
            new = [b for tag, b in me.battles.items() if tag not in battles]
            rewards = torch.tensor([calc_reward(b) for b in new], dtype=torch.float32)
            adv = group_zscore(rewards, torch.zeros(len(new), dtype=torch.long))
            rows = [(d, float(a)) for b, a in zip(new, adv) for d in me.log.decisions.get(b.battle_tag, [])]
            me.log = _Log(fallbacks=me.log.fallbacks)
            me.reset_battles()
            opp.reset_battles()
            if rows:
                pg_update(policy, opt, [d for d, _ in rows], torch.tensor([x for _, x in rows]), epochs=epochs,
                          epsilon=epsilon)
            wr = float((rewards > 0).float().mean()) if len(new) else float("nan")
            history.append({"iteration": it, "train_win_rate": wr, "decisions": len(rows)})
            log(f"[vgc] seed {seed} iteration {it}: train win rate {wr:.2f} over {len(new)} battles, "
                f"{len(rows)} decisions")
        after = play(me, opp, eval_battles)["win_rate"] if eval_battles else None
    finally:
        close_players(me, opp)
    return {"before": before, "after": after, "history": history, "fallbacks": me.log.fallbacks,
            "policy": copy.deepcopy(policy)}


def main(argv=None) -> None:
    """``python scripts/vgc_bench.py matrix|train``: the heuristic win-rate matrix and its Nash
    distribution, or a training run against a fixed opponent, on a local server started for the command."""
    import argparse
    import json

    from .showdown import ShowdownServer

    ap = argparse.ArgumentParser(prog="python scripts/vgc_bench.py", description=main.__doc__)
    ap.add_argument("command", choices=["matrix", "train"])
    ap.add_argument("--battles", type=int, default=20, help="matrix: battles per pair")
    ap.add_argument("--players", default=",".join(PLAYER_KINDS), help="matrix: comma-separated player kinds")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--iterations", type=int, default=25)
    ap.add_argument("--battles_per_iteration", type=int, default=16)
    ap.add_argument("--eval_battles", type=int, default=48)
    ap.add_argument("--opponent", default="random", choices=PLAYER_KINDS)
    ap.add_argument("--lr", type=float, default=3e-3)
    a = ap.parse_args(argv)
    with ShowdownServer() as server:
        print(f"[vgc] server on port {server.port}, ready after {server.start_seconds:.1f} s", flush=True)
        if a.command == "matrix":
            kinds = a.players.split(",")
            w = win_rate_matrix(kinds, server, a.battles)
            p, v = nash_zero_sum(w)
            print(json.dumps({"players": kinds, "win_rate": np.round(w, 3).tolist(),
                              "nash": np.round(p, 3).tolist(), "value": round(v, 3)}))
        else:
            out = train_vgc(server, seed=a.seed, iterations=a.iterations, battles_per_iteration=a.battles_per_iteration,
                            eval_battles=a.eval_battles, opponent=a.opponent, lr=a.lr)
            print(json.dumps({k: out[k] for k in ("before", "after", "fallbacks")}))


if __name__ == "__main__":
    main()
