"""Credit assignment over the turns of agent episodes: GiGPO, SALT, GTPO (turns), Flow-GRPO, Step-GRPO, HRPO.

An agent batch (``rollout_strategy: agent``) has one row per episode and G episodes of the same task instance
per group. Its model turns are spans of ``batch.span_ids`` and ``batch.columns["episode"]`` holds one
episode record per row (``grpolab.agents.base.EpisodeRecord.as_dict()``): ``turns`` (each with ``span``,
``text``, ``tool_calls``, ``observation``, ``reward``, ``state``, ...), ``env_reward``, ``num_turns``.

The estimators here compute one value per (episode, turn) and give it to every token of that model turn
(:func:`turn_values_to_tokens`): the advantage is ``[R, T]``. Observation tokens have loss mask 0 and get 0.
A loss token outside every model turn of its episode record is an error (the batch and its record disagree).

``rewards`` (the run's scalar reward per row: reward functions, then transforms) is each episode's outcome
``R_i``. NaN rows (unscorable) are left out of every statistic and get advantage 0.
"""
from __future__ import annotations

import difflib
import json
import re
from collections import defaultdict

import torch

from ..registry import ADVANTAGES, param
from .advantages import group_stats

# The column the agent rollout writes (grpolab.agents.base.EPISODE_COLUMN; agents/ is a higher layer, so the
# name is repeated here and tests/test_agent_credit.py checks that the two are equal).
EPISODE_COLUMN = "episode"
HOPS_COLUMN = "hops"

TURN_REWARD_SOURCES = ["outcome", "env", "env+outcome"]


# ------------------------------------------------------------------------------------------- episode helpers


def episode_records(batch, method: str) -> list[dict]:
    """The episode record of every row, or an error naming what is missing and how to get it."""
    episodes = None if batch is None else batch.columns.get(EPISODE_COLUMN)
    if episodes is None:
        raise ValueError(f"{method}: needs the episode record of every row (batch.columns['{EPISODE_COLUMN}'], "
                         f"written by the multi-turn rollout); this batch has none. Train with rollout_strategy: "
                         f"agent on an agent task (e.g. --task search_qa) or with --env / --tools")
    for i, ep in enumerate(episodes):
        if not isinstance(ep, dict) or not isinstance(ep.get("turns"), list):
            raise ValueError(f"{method}: batch.columns['{EPISODE_COLUMN}'][{i}] is not an episode record (a dict "
                             f"with a 'turns' list, EpisodeRecord.as_dict()); got {type(ep).__name__}")
    return episodes


def turn_values_to_tokens(batch, completion_mask: torch.Tensor, values: list[list[float]], method: str,
                          episodes: list[dict] | None = None) -> torch.Tensor:
    """``[R, T]``: every token of model turn k of row i gets ``values[i][k]``; tokens off the loss mask get 0.

    A token on the loss mask that lies in no model turn of its row's episode record raises (its span id is
    named): an estimator never gives such a token a made-up value."""
    episodes = episode_records(batch, method) if episodes is None else episodes
    T = completion_mask.shape[1]
    spans = batch.span_ids[:, :T].long()
    alive = completion_mask > 0
    out = torch.zeros(completion_mask.shape, dtype=torch.float64)
    covered = torch.zeros(completion_mask.shape, dtype=torch.bool)
    for i, (ep, vals) in enumerate(zip(episodes, values)):
        for turn, v in zip(ep["turns"], vals):
            here = spans[i] == int(turn["span"])
            out[i, here] = float(v)
            covered[i] |= here
    stray = alive & ~covered
    if bool(stray.any()):
        i = int(stray.any(-1).nonzero()[0])
        ids = sorted(set(spans[i][stray[i]].tolist()))
        raise ValueError(f"{method}: row {i} has loss tokens in span ids {ids}, which are no model turn of its "
                         f"episode record (turn spans {[t['span'] for t in episodes[i]['turns']]}); the rollout "
                         f"must number every trained token's turn in batch.span_ids and the record")
    return out * alive


def discounted_returns(step_rewards: list[float], gamma: float) -> list[float]:
    """``G_k = r_k + gamma * G_{k+1}``, ``G_K = 0`` (from the last turn back)."""
    out, running = [0.0] * len(step_rewards), 0.0
    for k in range(len(step_rewards) - 1, -1, -1):
        running = float(step_rewards[k]) + gamma * running
        out[k] = running
    return out


def turn_rewards(episode: dict, outcome: float, source: str, method: str) -> list[float]:
    """Reward of each turn: ``outcome`` (the episode's outcome on the last turn, 0 before), ``env`` (the
    environment's step rewards; a step without one is 0) or ``env+outcome`` (both)."""
    turns = episode["turns"]
    if source not in TURN_REWARD_SOURCES:
        raise ValueError(f"{method}: turn reward source '{source}' is not valid; valid values: "
                         f"{', '.join(TURN_REWARD_SOURCES)}")
    env = [float(t.get("reward") or 0.0) for t in turns]
    last = [0.0] * len(turns)
    if turns:
        last[-1] = float(outcome)
    if source == "outcome":
        return last
    if source == "env":
        return env
    return [a + b for a, b in zip(env, last)]


def _check_env_rewards(episodes: list[dict], source: str, method: str, param_name: str) -> None:
    """``env`` turn rewards need an environment that gives some: no step reward anywhere is an error."""
    if source == "env" and not any(t.get("reward") is not None for ep in episodes for t in ep["turns"]):
        raise ValueError(f"{method}: {param_name}: env needs the environment's step rewards (turn 'reward' in the "
                         f"episode record), and no turn of this batch has one; use an environment whose step() "
                         f"returns StepResult(reward=...), or {param_name}: outcome / env+outcome")


def history_key(episode: dict, k: int, with_action: bool = False) -> str:
    """The interaction before turn k (each earlier turn's text and observation), and turn k's own text with
    ``with_action``: equal keys = the same history in the same task instance."""
    past = [[t.get("text", ""), t.get("observation")] for t in episode["turns"][:k]]
    if with_action:
        past.append([episode["turns"][k].get("text", ""), None])
    return json.dumps(past, ensure_ascii=False)


def _stats(values: list[float]) -> tuple[float, float]:
    """Mean and Bessel-corrected std (``nan`` for fewer than two values), in float64."""
    t = torch.tensor(values, dtype=torch.float64)
    return float(t.mean()), float(t.std()) if len(values) > 1 else float("nan")


def _norm(value: float, mean: float, std: float, use_std: bool, eps: float) -> float:
    return (value - mean) / (std + eps) if use_std else value - mean


def _groups(group_ids: torch.Tensor, scored: torch.Tensor) -> dict[int, list[int]]:
    out: dict[int, list[int]] = defaultdict(list)
    for i, (g, ok) in enumerate(zip(group_ids.tolist(), scored.tolist())):
        if ok:
            out[int(g)].append(i)
    return out


# ------------------------------------------------------------------------------------------------- GiGPO


GIGPO_NORMS = ["mean_std_norm", "mean_norm"]


@ADVANTAGES.register("gigpo", min_group_size=2, needs=("text",))
def gigpo(rewards: torch.Tensor, group_ids: torch.Tensor, completion_mask: torch.Tensor, batch, *,
          advantage_epsilon: float = 1e-4,
          gigpo_gamma: float = param(0.95, "GiGPO: discount of the step returns inside an episode"),
          gigpo_step_weight: float = param(1.0, "GiGPO: weight omega of the step-level (anchor-state) advantage"),
          gigpo_norm: str = param("mean_std_norm", "GiGPO: 'mean_std_norm' (z-score) or 'mean_norm' (mean only) "
                                  "for both levels (the authors' mode)", GIGPO_NORMS),
          gigpo_episode_stats: str = param("steps", "GiGPO: episode-level mean/std over every step of the group "
                                           "(each episode once per turn, the authors' default) or over episodes",
                                           ["steps", "episodes"]),
          gigpo_anchor: str = param("state", "GiGPO: anchor state of a turn: the environment's state_key() "
                                    "('state'; every turn must have one) or the interaction so far ('history')",
                                    ["state", "history"]),
          gigpo_step_rewards: str = param("outcome", "GiGPO: step rewards whose discounted returns are compared: "
                                          "the outcome on the last turn, the environment's step rewards, or both",
                                          TURN_REWARD_SOURCES)) -> torch.Tensor:
    """GiGPO group-in-group advantage (Feng et al., 2025, arXiv:2505.10978; seed 000-47).

    Episode level (Eq. 3): ``A^E_i = (R_i - mean_g R) / (std_g R + eps)`` over the group g of episodes of one
    task instance (``mean_norm``: no std). With ``gigpo_episode_stats: steps`` (the authors' code: one row per
    step, every step row of episode i carries R_i) the mean and std are taken over the multiset in which
    episode i appears once per turn, ``K_i`` times.

    Step level (Eqs. 5-7): the step return of turn k of episode i is
    ``G_ik = sum_{m >= k} gamma^(m-k) r_im`` (``r_im``: ``gigpo_step_rewards``); turns of the group's episodes
    whose anchor state ``s_ik`` is the same (``turns[k]['state']``, or the interaction history) form a step
    group S, and ``A^S_ik = (G_ik - mean_S G) / (std_S G + eps)``; a step group with one member gets 0
    (mean = itself, std = 1 in the authors' code).

    Combined (Eq. 8): every token of turn k of episode i gets ``A_ik = A^E_i + omega * A^S_ik``.

    Relations: with one turn per episode, ``omega = 0`` (or all anchor states distinct) gives GRPO's
    ``group_zscore``; with one turn and one shared initial state the step level equals the episode level.

    Provenance: authors' code — https://github.com/langfengQ/verl-agent, gigpo/core_gigpo.py
    (compute_gigpo_outcome_advantage, episode_norm_reward, build_step_group, step_norm_reward,
    compute_step_discounted_returns); read in a fork snapshot of the repository (the original was not
    stored). Matches: Bessel std (torch.std), mean_norm / mean_std_norm for both levels, episode statistics
    across steps (compute_mean_std_cross_steps=True), exact-match anchor grouping inside a task instance,
    discounted step returns, a singleton step group gets 0, A^E + w A^S; defaults gamma 0.95, w 1.0 and
    mode mean_std_norm from examples/gigpo_trainer/run_alfworld.sh. Differences: epsilon is grpolab's
    advantage_epsilon (1e-4; the code uses 1e-6); a group with a single scored episode gets 0 (the code uses
    mean 0, std 1 there, reachable only with group size 1); the similarity-based grouping option is not
    ported; the step rewards are the run's outcome on the last turn unless gigpo_step_rewards says otherwise
    (verl-agent's environments give the reward as step rewards).
    Test: tests/test_agent_credit.py::test_gigpo_matches_authors_formula_by_hand,
    tests/test_agent_credit.py::test_gigpo_mean_norm_episode_stats_and_env_rewards.
    """
    method = "gigpo"
    if gigpo_norm not in GIGPO_NORMS:
        raise ValueError(f"gigpo_norm: '{gigpo_norm}' is not valid; valid values: {', '.join(GIGPO_NORMS)}")
    if gigpo_episode_stats not in ("steps", "episodes"):
        raise ValueError(f"gigpo_episode_stats: '{gigpo_episode_stats}' is not valid; valid values: steps, episodes")
    if gigpo_anchor not in ("state", "history"):
        raise ValueError(f"gigpo_anchor: '{gigpo_anchor}' is not valid; valid values: state, history")
    episodes = episode_records(batch, method)
    _check_env_rewards(episodes, gigpo_step_rewards, method, "gigpo_step_rewards")
    use_std = gigpo_norm == "mean_std_norm"
    r = rewards.double().tolist()
    scored = ~torch.isnan(rewards)
    values = [[0.0] * len(ep["turns"]) for ep in episodes]
    for g, rows in _groups(group_ids, scored).items():
        ep_adv = _gigpo_episode_advantages(r, rows, episodes, gigpo_episode_stats, use_std, advantage_epsilon)
        returns, members = _gigpo_step_groups(r, rows, episodes, gigpo_step_rewards, gigpo_gamma, gigpo_anchor,
                                              method)
        for key, mem in members.items():
            if len(mem) == 1:
                step = {mem[0]: 0.0}
            else:
                mean, std = _stats([returns[m] for m in mem])
                step = {m: _norm(returns[m], mean, std, use_std, advantage_epsilon) for m in mem}
            for (i, k), a in step.items():
                values[i][k] = ep_adv[i] + gigpo_step_weight * a
    return turn_values_to_tokens(batch, completion_mask, values, method, episodes).to(rewards.dtype)


def _gigpo_episode_advantages(r: list[float], rows: list[int], episodes: list[dict], episode_stats: str,
                              use_std: bool, eps: float) -> dict[int, float]:
    """GiGPO's episode level ``A^E_i`` of the scored rows of one group (see :func:`gigpo`): over the multiset
    in which episode i appears once per turn (``episode_stats: steps``) or once; 0 for a single episode."""
    pool = [r[i] for i in rows for _ in range(max(1, len(episodes[i]["turns"])))] \
        if episode_stats == "steps" else [r[i] for i in rows]
    if len(rows) < 2:
        return {i: 0.0 for i in rows}
    mean, std = _stats(pool)
    return {i: _norm(r[i], mean, std, use_std, eps) for i in rows}


def _gigpo_step_groups(r: list[float], rows: list[int], episodes: list[dict], source: str, gamma: float,
                       anchor: str, method: str) -> tuple[dict, dict]:
    """GiGPO's step level inside one task instance (see :func:`gigpo`): ``(returns, members)``, the discounted
    step return ``G_ik`` of every turn ``(i, k)`` and the turns of each anchor-state group."""
    returns, members = {}, defaultdict(list)
    for i in rows:
        ep = episodes[i]
        rets = discounted_returns(turn_rewards(ep, r[i], source, method), gamma)
        for k, turn in enumerate(ep["turns"]):
            if anchor == "state":
                if turn.get("state") is None:
                    raise ValueError(f"gigpo: turn {k} of row {i} has no anchor state (turns[{k}]['state'] is "
                                     f"None: the environment's state_key() returned None); use an environment "
                                     f"with state_key(), or gigpo_anchor: history")
                key = str(turn["state"])
            else:
                key = history_key(ep, k)
            returns[(i, k)] = rets[k]
            members[key].append((i, k))
    return returns, members


# -------------------------------------------------------------------------------------------------- SALT


@ADVANTAGES.register("salt", min_group_size=2, needs=("text",))
def salt(rewards: torch.Tensor, group_ids: torch.Tensor, completion_mask: torch.Tensor, batch, *,
         advantage_epsilon: float = 1e-4,
         salt_node: str = param("history", "SALT: which steps are merged into one graph node: same interaction so "
                                "far and same action ('history', a prefix tree) or same anchor state and same "
                                "action ('state_action', needs state_key())", ["history", "state_action"])
         ) -> torch.Tensor:
    """SALT step advantages from a trajectory graph (Li et al., 2025, arXiv:2510.20022; seed 000-45).

    The group's episodes (trajectories of one prompt) form a graph whose nodes are steps, identical steps
    merged: with ``salt_node: history`` two turns are one node when everything before them and their own
    text are equal (a prefix tree); with ``state_action`` when the anchor state and the action text are
    equal (paths from different histories join). Each node's quality is the mean trajectory advantage of the
    distinct trajectories passing through it, and every turn gets its node's value:

    ``A^traj_i = (R_i - mean_g R) / (std_g R + eps)``  (GRPO)
    ``A_ik = mean_{j : node(j, .) = node(i, k)} A^traj_j``

    A step that every trajectory shares gets 0 (it decided nothing), a step only successful trajectories
    share gets their mean advantage. Relation: when no two trajectories share a step, ``A_ik = A^traj_i``
    (GRPO).

    Provenance: reconstructed from the abstract — no authors' code was found; choices: nodes are identical
    steps (prefix-merged by default, state + action optionally), a node's quality is the mean GRPO advantage
    of the trajectories through it (each trajectory once per node), every token of the turn gets it; shared
    steps thereby become neutral and distinct ones decisive, as summaries of the paper describe it.
    """
    method = "salt"
    if salt_node not in ("history", "state_action"):
        raise ValueError(f"salt_node: '{salt_node}' is not valid; valid values: history, state_action")
    episodes = episode_records(batch, method)
    mean, std, _ = group_stats(rewards, group_ids)
    traj = torch.nan_to_num((rewards - mean) / (std + advantage_epsilon), nan=0.0).double().tolist()
    scored = ~torch.isnan(rewards)
    values = [[0.0] * len(ep["turns"]) for ep in episodes]
    for g, rows in _groups(group_ids, scored).items():
        through: dict[str, set[int]] = defaultdict(set)
        node_of = {}
        for i in rows:
            for k, turn in enumerate(episodes[i]["turns"]):
                if salt_node == "history":
                    key = history_key(episodes[i], k, with_action=True)
                else:
                    if turn.get("state") is None:
                        raise ValueError(f"salt: turn {k} of row {i} has no state (turns[{k}]['state'] is None); "
                                         f"salt_node: state_action needs an environment with state_key(); use "
                                         f"salt_node: history")
                    key = json.dumps([str(turn["state"]), turn.get("text", "")], ensure_ascii=False)
                through[key].add(i)
                node_of[(i, k)] = key
        quality = {key: sum(traj[j] for j in js) / len(js) for key, js in through.items()}
        for (i, k), key in node_of.items():
            values[i][k] = quality[key]
    return turn_values_to_tokens(batch, completion_mask, values, method, episodes).to(rewards.dtype)


# ------------------------------------------------------------------------------------------- GTPO (turns)

_FENCE = re.compile(r"```[a-zA-Z0-9_+-]*\n(.*?)```", re.S)


def episode_code(episode: dict) -> str:
    """The code an episode wrote: fenced code blocks of its turns and the string arguments of its tool calls
    (a python tool's ``code``, a calculator's ``expression``, ...), in order, joined by newlines."""
    parts = []
    for turn in episode["turns"]:
        parts += [m.strip() for m in _FENCE.findall(turn.get("text") or "")]
        for call in turn.get("tool_calls") or []:
            args = call.get("arguments")
            if isinstance(args, dict):
                parts += [v.strip() for v in args.values() if isinstance(v, str)]
    return "\n".join(p for p in parts if p)


def code_similarity(a: str, b: str) -> float:
    """``difflib.SequenceMatcher(None, a, b).ratio()`` in [0, 1] (0 when either is empty)."""
    if not a or not b:
        return 0.0
    return difflib.SequenceMatcher(None, a, b).ratio()


def gtpo_shaped_outcomes(rewards: torch.Tensor, group_ids: torch.Tensor, episodes: list[dict],
                         coef: float) -> list[float]:
    """GTPO's self-supervised shaping of a failed episode's outcome: ``R'_i = R_i + coef * max_j sim(c_i, c_j)``
    over the successful episodes j (``R_j > 0``) of its group, ``c`` = :func:`episode_code`; successful
    episodes, and failed ones without code or without a successful peer, keep ``R_i``."""
    r = rewards.double().tolist()
    out = list(r)
    if coef == 0:
        return out
    codes = [episode_code(ep) for ep in episodes]
    for g, rows in _groups(group_ids, ~torch.isnan(rewards)).items():
        wins = [j for j in rows if r[j] > 0]
        for i in rows:
            if r[i] > 0 or not wins:
                continue
            out[i] = r[i] + coef * max(code_similarity(codes[i], codes[j]) for j in wins)
    return out


@ADVANTAGES.register("gtpo_turn", min_group_size=2, needs=("text",))
def gtpo_turn(rewards: torch.Tensor, group_ids: torch.Tensor, completion_mask: torch.Tensor, batch, *,
              advantage_epsilon: float = 1e-4,
              gtpo_gamma: float = param(0.9, "GTPO (turns): discount of the turn returns"),
              gtpo_turn_rewards: str = param("env+outcome", "GTPO (turns): reward of each turn: the environment's "
                                             "step rewards plus the (shaped) outcome on the last turn, or one of "
                                             "them", TURN_REWARD_SOURCES),
              gtpo_norm: str = param("group", "GTPO (turns): normalise the returns over every turn of the group "
                                     "('group') or over the group's turns with the same index ('turn_index')",
                                     ["group", "turn_index"]),
              gtpo_shaping_coef: float = param(0.5, "GTPO (turns): weight of the code-similarity reward a failed "
                                               "episode gets from its group's successful episodes (0 = off)")
              ) -> torch.Tensor:
    """GTPO, Group Turn Policy Optimization: turn rewards, normalised discounted returns, code-based shaping
    (Ding et al., 2025, arXiv:2511.14846; seed 000-76).

    1. Shaping (failed episodes, :func:`gtpo_shaped_outcomes`):
       ``R'_i = R_i + c * max_{j in g, R_j > 0} sim(code_i, code_j)`` if ``R_i <= 0``, else ``R_i``
       (``sim``: difflib ratio of the generated code, :func:`episode_code`; ``c = gtpo_shaping_coef``).
    2. Turn rewards ``r_ik``: the environment's step reward of turn k (0 if none) plus ``R'_i`` on the
       last turn (``gtpo_turn_rewards``).
    3. Returns ``G_ik = sum_{m >= k} gamma^(m-k) r_im``.
    4. ``A_ik = (G_ik - mean(G)) / (std(G) + eps)`` over every turn of the group's episodes (``group``) or
       over the group's turns with index k (``turn_index``); every token of turn k gets ``A_ik``.

    Relation: one turn per episode and ``c = 0`` (or no failed episode with code) is GRPO's ``group_zscore``.
    Named ``gtpo_turn``: the conflict-token GTPO (``gtpo_conflict``) is another paper.

    Provenance: reconstructed from the abstract — no authors' code was found; choices: intermediate turns get
    the environment's step reward, the last turn the outcome; returns normalised over the group's turns
    (mean, Bessel std); the code-based shaping is a difflib similarity between a failed episode's code
    (its tool calls' string arguments and fenced code blocks) and the closest successful episode's code in
    its group, weighted 0.5; gamma 0.9.
    """
    method = "gtpo_turn"
    if gtpo_norm not in ("group", "turn_index"):
        raise ValueError(f"gtpo_norm: '{gtpo_norm}' is not valid; valid values: group, turn_index")
    episodes = episode_records(batch, method)
    _check_env_rewards(episodes, gtpo_turn_rewards, method, "gtpo_turn_rewards")
    shaped = gtpo_shaped_outcomes(rewards, group_ids, episodes, gtpo_shaping_coef)
    values = [[0.0] * len(ep["turns"]) for ep in episodes]
    for g, rows in _groups(group_ids, ~torch.isnan(rewards)).items():
        rets = {i: discounted_returns(turn_rewards(episodes[i], shaped[i], gtpo_turn_rewards, method), gtpo_gamma)
                for i in rows}
        pools: dict[object, list[tuple[int, int]]] = defaultdict(list)
        for i in rows:
            for k in range(len(rets[i])):
                pools["all" if gtpo_norm == "group" else k].append((i, k))
        for mem in pools.values():
            if len({i for i, _ in mem}) < 2:
                continue  # one episode alone has nothing to be compared with: 0
            mean, std = _stats([rets[i][k] for i, k in mem])
            for i, k in mem:
                values[i][k] = _norm(rets[i][k], mean, std, True, advantage_epsilon)
    return turn_values_to_tokens(batch, completion_mask, values, method, episodes).to(rewards.dtype)


# ---------------------------------------------------------------------------------------------- Flow-GRPO


@ADVANTAGES.register("flow_grpo", min_group_size=2, needs=("text",))
def flow_grpo(rewards: torch.Tensor, group_ids: torch.Tensor, completion_mask: torch.Tensor, batch, *,
              advantage_epsilon: float = 1e-4,
              flow_grpo_stats: str = param("turns", "Flow-GRPO: group mean/std over the group's turns (each "
                                           "episode's outcome once per turn, as when every turn is its own "
                                           "single-turn sample) or over its episodes", ["turns", "episodes"])
              ) -> torch.Tensor:
    """Flow-GRPO: the episode's outcome broadcast to every turn, group-normalised (AgentFlow, Li et al.,
    2025, arXiv:2510.05592; seed 000-79).

    Each model turn is a single-turn update whose reward is the trajectory's verifiable outcome ``R_i``:
    ``A_ik = (R_i - mean) / (std + eps)`` for every turn k, the mean and (Bessel) std taken over the
    group's turn samples (``turns``: episode i counted ``K_i`` times) or its episodes (``episodes``,
    then it is GRPO's advantage on every turn). Observation tokens (not the planner's) get 0.

    Relation: one turn per episode gives ``group_zscore`` exactly (both settings).

    Provenance: reconstructed from the abstract — the outcome broadcast to every turn with group-normalised
    advantages; the authors' train/config.yaml (github.com/lupantech/AgentFlow) runs verl's 'grpo' estimator
    on per-turn samples (clip 0.2 / 0.3, KL 0.001, temperature 0.7), from which the per-turn statistics
    follow; its agentflow/verl/daemon.py (get_train_data_batch) makes each planner turn one sample carrying
    its rollout's reward, uid = the query's data_id (the lm_program rollout, recipe agentflow, builds exactly
    that: one row per planner turn, grouped by query).
    """
    method = "flow_grpo"
    if flow_grpo_stats not in ("turns", "episodes"):
        raise ValueError(f"flow_grpo_stats: '{flow_grpo_stats}' is not valid; valid values: turns, episodes")
    episodes = episode_records(batch, method)
    r = rewards.double().tolist()
    values = [[0.0] * len(ep["turns"]) for ep in episodes]
    for g, rows in _groups(group_ids, ~torch.isnan(rewards)).items():
        if len(rows) < 2:
            continue
        pool = [r[i] for i in rows for _ in range(max(1, len(episodes[i]["turns"])))] \
            if flow_grpo_stats == "turns" else [r[i] for i in rows]
        mean, std = _stats(pool)
        for i in rows:
            values[i] = [_norm(r[i], mean, std, True, advantage_epsilon)] * len(episodes[i]["turns"])
    return turn_values_to_tokens(batch, completion_mask, values, method, episodes).to(rewards.dtype)


# ---------------------------------------------------------------------------------------------- Step-GRPO


@ADVANTAGES.register("step_grpo", min_group_size=2, needs=("text",))
def step_grpo(rewards: torch.Tensor, group_ids: torch.Tensor, completion_mask: torch.Tensor, batch, *,
              advantage_epsilon: float = 1e-4) -> torch.Tensor:
    """Step-GRPO: step-specific rewards, group-normalised per step (R1-Router, Peng et al., 2025,
    arXiv:2505.22095; seed 000-98).

    Step k of episode i is rewarded on its own: ``s_ik`` = the environment's reward for that step (a
    reasoning / retrieval step, ``turns[k]['reward']``) for every step but the last, and the episode's
    outcome ``R_i`` for the last step (the answer). Each step is normalised against the same step of the
    group's other episodes:

    ``A_ik = (s_ik - mean_{j in g, K_j > k} s_jk) / (std_{j in g, K_j > k} s_jk + eps)``

    (a step index only one episode reached gets 0). Relation: one step per episode is GRPO's
    ``group_zscore``.

    Provenance: reconstructed from the abstract — no authors' code was read; choices: intermediate steps
    take the environment's step reward (a missing one is an error naming it), the last step the outcome,
    z-scores over the group's episodes at the same step index.
    """
    method = "step_grpo"
    episodes = episode_records(batch, method)
    r = rewards.double().tolist()
    values = [[0.0] * len(ep["turns"]) for ep in episodes]
    for g, rows in _groups(group_ids, ~torch.isnan(rewards)).items():
        steps = {}
        for i in rows:
            turns = episodes[i]["turns"]
            s = []
            for k, turn in enumerate(turns):
                if k == len(turns) - 1:
                    s.append(r[i])
                elif turn.get("reward") is None:
                    raise ValueError(f"step_grpo: step {k} of row {i} has no step reward (turns[{k}]['reward'] is "
                                     f"None); Step-GRPO rewards every step, so the environment's step() must "
                                     f"return StepResult(reward=...) for each intermediate step")
                else:
                    s.append(float(turn["reward"]))
            steps[i] = s
        for k in range(max((len(s) for s in steps.values()), default=0)):
            at = [i for i in rows if len(steps[i]) > k]
            if len(at) < 2:
                continue
            mean, std = _stats([steps[i][k] for i in at])
            for i in at:
                values[i][k] = _norm(steps[i][k], mean, std, True, advantage_epsilon)
    return turn_values_to_tokens(batch, completion_mask, values, method, episodes).to(rewards.dtype)


# --------------------------------------------------------------------------------------------------- HRPO


def hop_clusters(batch, n: int, method: str) -> list:
    """The ``hops`` value of every row (its cluster), or an error naming the column."""
    hops = None if batch is None else batch.columns.get(HOPS_COLUMN)
    if hops is None or len(hops) != n or any(h is None for h in hops):
        raise ValueError(f"{method}: needs the data column '{HOPS_COLUMN}' (the question's number of hops) on "
                         f"every row; the built-in search_qa task has it, other data must add it")
    return [str(h) for h in hops]


@ADVANTAGES.register("hrpo", columns=(HOPS_COLUMN,))
def hrpo(rewards: torch.Tensor, group_ids: torch.Tensor, batch, *, advantage_epsilon: float = 1e-4
         ) -> torch.Tensor:
    """HRPO, hop-grouped relative policy optimisation: the baseline of a hop cluster (Dr. Zero, Yue et al.,
    2026, arXiv:2601.07055; seed 000-110).

    Questions with the same hop structure (data column ``hops``) form one cluster c over the whole batch,
    whatever their prompt, and the group baseline is the cluster's:

    ``A_i = (R_i - mean_{c(i)} R) / (std_{c(i)} R + eps)``

    so a question needs few rollouts of its own (``num_generations`` may be 1). Relation: when every prompt
    group has a hop count of its own, this is GRPO's ``group_zscore``. A row's advantage is one scalar (every
    trained token of the episode gets it).

    Provenance: reconstructed from the abstract — the abstract names hop-grouped clusters and a cluster-level
    baseline; choices: the cluster is the exact value of the 'hops' column within the step's batch, z-score
    with Bessel std and grpolab's epsilon; a cluster with one scored row gets 0. The proposer/solver loop of
    Dr. Zero is not part of this component. The authors' code, found since (https://github.com/facebookresearch/drzero,
    verl/trainer/ppo/core_algos.py compute_grpo_batch_outcome_advantage), applies this baseline to the proposer's
    questions and gives a one-row cluster mean 0 and std 1 (A = R); ``dr_zero_hrpo`` (recipe ``dr_zero``)
    follows it.
    """
    clusters = hop_clusters(batch, rewards.shape[0], "hrpo")
    index = {c: n for n, c in enumerate(sorted(set(clusters)))}
    cid = torch.tensor([index[c] for c in clusters], dtype=torch.long)
    mean, std, _ = group_stats(rewards, cid)
    return torch.nan_to_num((rewards - mean) / (std + advantage_epsilon), nan=0.0)


DR_ZERO_SOLVER_GROUPS = ("question", "hops")


@ADVANTAGES.register("dr_zero_hrpo", columns=(HOPS_COLUMN,))
def dr_zero_hrpo(rewards: torch.Tensor, group_ids: torch.Tensor, batch, *, advantage_epsilon: float = 1e-4,
                 dr_zero_solver_groups: str = param("question", "dr_zero_hrpo: the solver's rows are grouped per "
                                                    "question (GRPO, the authors' solver) or per hop count over the "
                                                    "batch (HRPO)", list(DR_ZERO_SOLVER_GROUPS))) -> torch.Tensor:
    """Dr. Zero's advantages (Dr. Zero: Self-Evolving Search Agents without Training Data, Yue et al., 2026,
    arXiv:2601.07055; seed 000-110) for the ``dr_zero`` rollout's rows (column ``role``: proposer / solver).

    Every row gets a cluster ``c(i)``: a proposer row its hop count (column ``hops``: HRPO, the questions of one
    hop count in the step's batch share a baseline, so one question per document suffices); a solver row its
    question's group (``dr_zero_solver_groups: question``, GRPO) or its hop count (``hops``). Then

    ``A_i = (R_i - mean_{c(i)} R) / (std_{c(i)} R + eps)`` (Bessel std),

    and a cluster with a single scored row has mean 0 and std 1: ``A_i = R_i / (1 + eps)``. Unscored rows get 0.
    Relation: with every cluster of two or more rows, the proposer rows' advantages are ``hrpo``'s.

    Provenance: authors' code — https://github.com/facebookresearch/drzero verl/trainer/ppo/core_algos.py
    (compute_grpo_batch_outcome_advantage, keyed in ray_trainer.py by data_source = search_zero_<hops>; the
    proposer's estimator grpo_batch in iter*_challenger.sh, the solver's grpo in iter*_solver.sh); the singleton
    rule (mean 0, std 1) is theirs, the epsilon grpolab's advantage_epsilon (theirs 1e-6). Test:
    tests/test_dr_zero.py::test_hrpo_groups_by_hop_count.
    """
    if dr_zero_solver_groups not in DR_ZERO_SOLVER_GROUPS:
        raise ValueError(f"dr_zero_solver_groups: '{dr_zero_solver_groups}' is not valid; valid values: "
                         f"{', '.join(DR_ZERO_SOLVER_GROUPS)}")
    n = rewards.shape[0]
    hops = hop_clusters(batch, n, "dr_zero_hrpo")
    roles = batch.columns.get("role")
    if roles is None or len(roles) != n:
        raise ValueError("dr_zero_hrpo: needs the column 'role' (proposer / solver) that the dr_zero rollout sets")
    keys = [f"group:{int(g)}" if r == "solver" and dr_zero_solver_groups == "question" else f"{r}:hops:{h}"
            for r, h, g in zip(roles, hops, group_ids.tolist())]
    index = {k: i for i, k in enumerate(dict.fromkeys(keys))}
    cid = torch.tensor([index[k] for k in keys], dtype=torch.long)
    mean, std, count = group_stats(rewards, cid)
    single = count == 1
    mean = torch.where(single, torch.zeros_like(mean), mean)
    std = torch.where(single, torch.ones_like(std), std)
    return torch.nan_to_num((rewards - mean) / (std + advantage_epsilon), nan=0.0)
