"""Rollouts that search over agent steps: Tree-GRPO trees and staged GRPO from MCTS-derived prefixes.

Both build trees whose **node is one complete agent step** (the model's turn,
then the environment's answer), on the ``agent`` rollout's episode machinery
(``agents/rollout.py``: the same prompt and observation rendering, guarded
environment calls, limits, episode records, scoring, metrics and keys). A
node's tokens are sampled once, in the context of its ancestors, and shared
by every trajectory through it; a trajectory from the root to a leaf (an
episode that ended) becomes one row of the ``RolloutBatch``, so the rows of a
tree repeat their shared prefix tokens. The training forward encodes each
distinct prompt once (the shared-prefix forward,
``model/logprobs.py::shared_prefix_logits``); the shared step tokens after
the prompt are part of each row's completion and are forwarded once per row
(each carries its own row's advantage, as in the authors' code, where every
selected leaf is one full response row).

**Branching needs the environment in a node's state.** No environment is
kept alive per node: a branch starts a *fresh* environment ``factory(row)``,
``reset(row, seed)`` with the tree's seed, and replays the path's model turns
with ``step``. So environments used with these rollouts **must be
deterministic given (row, seed) and the actions**: every replayed prompt and
observation is compared with the recorded one and a mismatch is an error
(a tool that answers differently the second time would put the branch in
another state than its node). A replay re-runs the path's tool calls.

The environment is the ``agent`` rollout's: ``--tools`` / ``--env``, else the
task's ``extra["environment"]``. Each row's
:class:`~grpolab.agents.base.EpisodeRecord` is in ``batch.columns["episode"]``,
``columns["completion"]`` is the final model turn's text, and
``columns["tree"]`` the row's tree id. The strategies score their batch
(``ctx.score``; the environment's reward column ``env_reward`` as for
``agent``) and evaluate held-out rows like ``agent`` (one greedy episode).
"""
from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field

import torch

from ..batch import ENVIRONMENT, INJECTED, SAMPLED
from ..errors import ConfigError
from ..generation.plain import eos_token_ids
from ..registry import ADVANTAGES, ROLLOUT_STRATEGIES, param
from ..algorithms.advantages import group_stats
from .base import EPISODE_COLUMN
from .rollout import (ENV_REWARD_WEIGHT, ENVIRONMENT as ENVIRONMENT_KEY, ENVIRONMENT_KIND, MAX_EPISODE_TOKENS,
                      MAX_TOOL_CALLS, MAX_TURN_TOKENS, MAX_TURNS, TOOL_ISOLATION_KEY, TOOL_OUTPUT_CHARS,
                      TOOL_TIMEOUT, TOOLS, AgentSettings, LiveEpisode, _Renderers, _check, apply_step,
                      close_all, episode_setup, eval_rollout, extra_rewards, log_metrics, pack, play,
                      start_episodes, agent as _agent)

TREE_COLUMN = "tree"  # per row: the id of the tree the row's leaf belongs to (Tree-GRPO's intra-tree group)


# --------------------------------------------------------------------------- the tree
@dataclass
class StepNode:
    """One complete agent step: the model's turn (``ids``, ``logprobs``, ``text``) and the observation after it.

    The root of a tree has no turn (``depth`` 0). ``ended_by`` is set on a leaf
    (its episode ended: one of ``agents.base.ENDED_BY``); ``live`` is the
    leaf's whole episode (prompt, every step, record). A leaf may be an empty
    step (the episode ended before a new turn: ``no_action``, an error).
    ``visits`` / ``value_sum`` are the MCTS statistics (unused by Tree-GRPO).
    """
    ids: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    engine: bool = False
    text: str = ""
    state: str | None = None
    obs_ids: list[int] | None = None
    parent: "StepNode | None" = None
    children: list = field(default_factory=list)
    depth: int = 0
    ended_by: str | None = None
    live: LiveEpisode | None = None
    visits: int = 0
    value_sum: float = 0.0

    @property
    def is_leaf(self) -> bool:
        return self.ended_by is not None

    def path(self) -> list["StepNode"]:
        """The steps from the root's first child down to this node (the root itself excluded)."""
        out, node = [], self
        while node.parent is not None:
            out.append(node)
            node = node.parent
        return out[::-1]

    def subtree(self) -> list["StepNode"]:
        out, todo = [], list(self.children)
        while todo:
            n = todo.pop(0)
            out.append(n)
            todo.extend(n.children)
        return out


@dataclass
class Tree:
    """One search tree of one task instance: its row, uid, group, tree id, reset seed and temperature."""
    row: dict
    uid: int
    group: int
    tree_id: int
    seed: int
    temperature: float
    prompt: list[int] | None = None  # the rendered prompt tokens (checked on every replay)
    root: StepNode = field(default_factory=StepNode)


@dataclass
class Search:
    """What growing a tree needs: the environment factory, the agent settings and the renderer."""
    factory: object
    settings: AgentSettings
    renderer: object


def new_search(ctx, keys: dict) -> Search:
    """The ``agent`` rollout's settings and environment for this run (``keys``: the agent config keys)."""
    settings, factory = episode_setup(ctx, **{k: keys[k] for k in (
        "max_turns", "max_episode_tokens", "max_turn_tokens", "tool_timeout", "tool_output_chars", "max_tool_calls",
        "tool_isolation", "tools", "environment", "environment_kind")})
    return Search(factory, settings, _Renderers.get(ctx))


def new_trees(ctx, rows, uids, group_offset: int, per_row: int, temperatures=None) -> list[Tree]:
    """``per_row`` trees for each row (group ``group_offset + i``), each with its own reset seed."""
    temps = temperatures if temperatures is not None else [ctx.cfg.temperature] * len(rows)
    trees = []
    for i, (row, uid) in enumerate(zip(rows, uids)):
        for m in range(per_row):
            seed = int(torch.randint(0, 2 ** 31 - 1, (1,), generator=ctx.generator))
            trees.append(Tree(row, uid, group_offset + i, (group_offset + i) * per_row + m, seed, float(temps[i])))
    return trees


def _not_deterministic(live: LiveEpisode, depth: int, what: str) -> RuntimeError:
    return RuntimeError(f"tree rollout: replaying the environment ({type(live.env).__name__}) gave a different "
                        f"{what} at depth {depth}; tree rollouts need environments that are deterministic given "
                        f"(row, seed) and the actions (the branch would not be in its node's state)")


def _replay(ctx, search: Search, tree: Tree, node: StepNode, eos: set[int]) -> LiveEpisode:
    """A fresh episode in ``node``'s state: reset with the tree's seed, the path's turns replayed and checked."""
    live = start_episodes(ctx, [tree.row], [tree.uid], tree.group, [1], [tree.temperature], search.factory,
                          search.settings, search.renderer, seeds=[tree.seed])[0]
    if tree.prompt is None:
        tree.prompt = list(live.episode.prompt)
    elif live.episode.prompt != tree.prompt:
        close_all([live], search.settings.limits.timeout)
        raise _not_deterministic(live, 0, "first observation")
    for step in node.path():
        if live.finished:
            close_all([live], search.settings.limits.timeout)
            raise _not_deterministic(live, step.depth, "end of episode")
        live.episode.add_model_turn(step.ids, step.logprobs, engine=step.engine)
        apply_step(live, step.text, step.ids[-1], ctx, search.settings, search.renderer, eos, step.state)
        last = live.episode.segments[-1]
        got = None if live.finished or last.origin != ENVIRONMENT else last.ids
        if got != step.obs_ids:
            close_all([live], search.settings.limits.timeout)
            raise _not_deterministic(live, step.depth, "observation")
    return live


def grow(ctx, search: Search, starts: list[tuple[Tree, StepNode]]) -> list[StepNode]:
    """From each ``(tree, node)``, play one episode on from the node's state to its end; return the leaves.

    The environments are replayed to the nodes' states, then every branch
    plays on together (``agents.rollout.play``: one batched model turn per
    round), those at depth ``d`` with ``max_turns - d`` turns left. Each new
    turn becomes a child node of the one before it, so a start node gains one
    new branch; the leaf holds the whole episode (``live``).
    """
    eos = set(eos_token_ids(ctx.tokenizer, ctx.policy))
    lives = []
    try:
        for tree, node in starts:
            lives.append(_replay(ctx, search, tree, node, eos))
        by_depth: dict[int, list[LiveEpisode]] = {}
        for live, (_, node) in zip(lives, starts):
            by_depth.setdefault(node.depth, []).append(live)
        for depth, group in sorted(by_depth.items()):
            play(ctx, group, dataclasses.replace(search.settings, max_turns=search.settings.max_turns - depth),
                 search.renderer)
    finally:
        close_all(lives, search.settings.limits.timeout)
    leaves = []
    for live, (_, node) in zip(lives, starts):
        pairs = []  # (model turn segment, its observation segment or None), in order
        for seg in live.episode.segments:
            if seg.origin == ENVIRONMENT:
                pairs[-1][1] = seg
            else:
                pairs.append([seg, None])
        parent = node
        for (turn_seg, obs_seg), turn in zip(pairs[node.depth:], live.record.turns[node.depth:]):
            child = StepNode(ids=list(turn_seg.ids), logprobs=list(turn_seg.logprobs or []), engine=turn_seg.engine,
                             text=turn.text, state=turn.state, obs_ids=None if obs_seg is None else list(obs_seg.ids),
                             parent=parent, depth=parent.depth + 1)
            parent.children.append(child)
            parent = child
        if parent is node:  # the episode ended before a new turn: an empty leaf step
            parent = StepNode(parent=node, depth=node.depth + 1)
            node.children.append(parent)
        parent.ended_by, parent.live = live.record.ended_by, live
        leaves.append(parent)
    return leaves


def pack_leaves(ctx, search: Search, chosen: list[tuple[Tree, StepNode]], *, injected_steps: list[int] | None = None):
    """A RolloutBatch with one row per ``(tree, leaf)``: the leaf's episode (``agents.rollout.pack``).

    ``injected_steps[r]``: the first that many model turns of row ``r`` are an
    injected prefix (``INJECTED``, loss mask 0, behaviour log-probs
    teacher-forced with ``ctx.logprobs``); their observations stay
    ``ENVIRONMENT``. Adds ``columns["tree"]``.
    """
    lives = [leaf.live for _, leaf in chosen]
    if injected_steps is not None:
        lives = [dataclasses.replace(live, episode=dataclasses.replace(live.episode, segments=list(
            live.episode.segments))) for live in lives]
        for live, k in zip(lives, injected_steps):
            done = 0
            for j, seg in enumerate(live.episode.segments):
                if done >= k:
                    break
                if seg.origin != ENVIRONMENT:
                    live.episode.segments[j] = dataclasses.replace(seg, origin=INJECTED, train=False, logprobs=None,
                                                                   engine=False)
                    done += 1
    batch = pack(ctx, lives, search.settings)
    batch.columns[TREE_COLUMN] = [t.tree_id for t, _ in chosen]
    return batch


def _log_tree(ctx, trees: list[Tree], batch, scalar) -> None:
    """The agent metrics, plus model tokens sampled in the trees vs model tokens in the rows (the sharing)."""
    log_metrics(ctx, batch.columns[EPISODE_COLUMN], scalar)
    ctx.metric("tree/sampled_tokens", float(sum(len(n.ids) for t in trees for n in t.root.subtree())))
    ctx.metric("tree/row_model_tokens", float(((batch.token_origin == SAMPLED)
                                               & (batch.completion_attention_mask > 0)).sum()))


# --------------------------------------------------------------------------- Tree-GRPO
def _tree_grpo_check(cfg) -> None:
    _check(cfg)
    m, g = cfg.tree_grpo_trees, cfg.num_generations
    if m < 1 or g % m:
        raise ConfigError(f"num_generations: the tree_grpo rollout spreads each prompt's num_generations rows over "
                          f"tree_grpo_trees = {m} trees, so it must be a multiple of {m} (got {g})")
    leaves = 1 + cfg.tree_grpo_expand_nodes * cfg.tree_grpo_expand_rounds
    if g // m > leaves:
        raise ConfigError(f"num_generations: {g // m} rows per tree (num_generations / tree_grpo_trees), but a tree "
                          f"has only 1 + tree_grpo_expand_nodes x tree_grpo_expand_rounds = {leaves} leaves; lower "
                          f"num_generations or raise tree_grpo_expand_nodes / tree_grpo_expand_rounds")


@ROLLOUT_STRATEGIES.register("tree_grpo", check=_tree_grpo_check, needs=("text",))
def tree_grpo_rollout(ctx, rows, uids, group_offset, budgets=None, temperatures=None, *,
                      tree_grpo_trees: int = param(2, "Tree-GRPO: trees per prompt (M); each gives "
                                                      "num_generations / M of the prompt's rows"),
                      tree_grpo_expand_nodes: int = param(2, "Tree-GRPO: nodes expanded per tree per round (N)"),
                      tree_grpo_expand_rounds: int = param(1, "Tree-GRPO: expansion rounds (L)"),
                      max_turns: int = MAX_TURNS, max_episode_tokens: int = MAX_EPISODE_TOKENS,
                      max_turn_tokens: int = MAX_TURN_TOKENS, tool_timeout: float = TOOL_TIMEOUT,
                      tool_output_chars: int = TOOL_OUTPUT_CHARS, max_tool_calls: int = MAX_TOOL_CALLS,
                      env_reward_weight: float = ENV_REWARD_WEIGHT, tools: list = TOOLS,
                      environment: str | None = ENVIRONMENT_KEY, environment_kind: str = ENVIRONMENT_KIND,
                      tool_isolation: str = TOOL_ISOLATION_KEY):
    """Tree-GRPO tree search over agent steps (Tree Search for LLM Agent RL, arXiv:2509.21240; seed 000-10).

    Per prompt: ``M`` trees; each starts with one complete episode (a chain of
    agent steps, node = model turn + observation); then ``L`` rounds in which
    ``N`` nodes per tree are drawn uniformly, with replacement, from the root
    and the tree's non-leaf nodes, and a new chain is played from each (a new
    branch sharing the node's prefix); finally ``K = num_generations / M`` of
    each tree's ``1 + N L`` leaves are drawn without replacement and become the
    prompt's rows (group id = the prompt: the inter-tree group;
    ``batch.columns["tree"]`` = the tree: the intra-tree group, read by the
    ``tree_grpo`` advantage). Branches replay the environment (module
    docstring); the agent keys (``max_turns``, ``tools``, ...) are the
    ``agent`` rollout's. The authors' multi-hop QA script: m=2, n=2, l=1, k=3.

    Provenance: authors' code — https://github.com/AMAP-ML/Tree-GRPO, search_r1/llm_agent/generation_ts.py
    (LLMGenerationTreeSearchManager.run_llm_loop_tree_search, gen_action_chain) and
    search_r1/llm_agent/tree_node.py (TreeNode.get_expand_node, sample_leaf); matches: M initial chains, L rounds of
    N uniform draws with replacement over the root and non-leaf nodes (expand_mode random), K leaves sampled
    without replacement per tree, node = one model turn + its observation; differences: the authors' search env is
    stateless (no replay needed), here branches replay actions on a fresh environment; draws use the run's seeded
    generator instead of Python's random. Test: tests/test_agent_tree.py::test_tree_grpo_rollout_structure.
    """
    if budgets is not None:
        raise ConfigError("rollout_strategy tree_grpo: every prompt gets num_generations rows from its trees; a "
                          "prompt sampler that sets per-prompt budgets cannot be combined with it")
    search = new_search(ctx, dict(max_turns=max_turns, max_episode_tokens=max_episode_tokens,
                                  max_turn_tokens=max_turn_tokens, tool_timeout=tool_timeout,
                                  tool_output_chars=tool_output_chars, max_tool_calls=max_tool_calls, tools=tools,
                                  environment=environment, environment_kind=environment_kind,
                                  tool_isolation=tool_isolation))
    per_tree = ctx.cfg.num_generations // tree_grpo_trees
    trees = new_trees(ctx, rows, uids, group_offset, tree_grpo_trees, temperatures)
    grow(ctx, search, [(t, t.root) for t in trees])
    for _ in range(tree_grpo_expand_rounds):
        starts = []
        for t in trees:
            cands = [t.root] + [n for n in t.root.subtree() if not n.is_leaf]
            picks = torch.randint(0, len(cands), (tree_grpo_expand_nodes,), generator=ctx.generator).tolist()
            starts += [(t, cands[p]) for p in picks]
        grow(ctx, search, starts)
    chosen = []
    for t in trees:
        leaves = [n for n in t.root.subtree() if n.is_leaf]
        order = torch.randperm(len(leaves), generator=ctx.generator)[:per_tree].tolist()
        chosen += [(t, leaves[i]) for i in sorted(order)]
    batch = pack_leaves(ctx, search, chosen)
    scalar = ctx.score(batch)
    _log_tree(ctx, trees, batch, scalar)
    return batch


tree_grpo_rollout.extra_rewards = extra_rewards
tree_grpo_rollout.eval_rollout = eval_rollout
for _hook in ("max_prompt_length", "first_prompts", "model_texts"):  # episodes as the agent rollout's
    setattr(tree_grpo_rollout, _hook, getattr(_agent, _hook))


def _authors_zscore(values: torch.Tensor, ids: torch.Tensor, epsilon: float) -> torch.Tensor:
    """``(r - mean) / (std + eps)`` per group, unbiased std; a one-row group uses mean 0, std 1 (verl's rule)."""
    mean, std, count = group_stats(values, ids)
    single = count <= 1
    mean = torch.where(single, torch.zeros_like(mean), mean)
    std = torch.where(single, torch.ones_like(std), std)
    return ((values - mean) / (std + epsilon)).nan_to_num(0.0)


@ADVANTAGES.register("tree_grpo", min_group_size=2)
def tree_grpo_advantage(rewards: torch.Tensor, group_ids: torch.Tensor, *, batch=None,
                        advantage_epsilon: float = 1e-4) -> torch.Tensor:
    """Tree-GRPO intra-tree + inter-tree advantage (arXiv:2509.21240; seed 000-10).

    ``A_i = (r_i - mean_P(r)) / (std_P(r) + eps) + (r_i - mean_T(r)) / (std_T(r) + eps)``

    where ``P`` is the row's prompt group (all leaves of all trees of the prompt:
    inter-tree) and ``T`` its tree (``batch.columns["tree"]``: intra-tree); std
    is the unbiased one; a group with a single row uses mean 0 and std 1 (as
    verl's ``compute_grpo_outcome_advantage``). Rows whose reward is NaN get 0.

    Provenance: authors' code — https://github.com/AMAP-ML/Tree-GRPO, verl/trainer/ppo/ray_trainer_ts.py
    (compute_advantage, adv_estimator 'tree') and verl/trainer/ppo/core_algos.py (compute_grpo_outcome_advantage);
    matches the sum of the two z-scores with the single-row rule; epsilon is the run's advantage_epsilon (the
    authors use 1e-6; the tree_grpo recipe sets it). Test: tests/test_agent_tree.py::test_tree_grpo_advantage_by_hand.
    """
    if batch is None or TREE_COLUMN not in batch.columns:
        raise ConfigError("advantage tree_grpo needs each row's tree (batch.columns['tree']), which the tree_grpo "
                          "rollout writes: set rollout_strategy tree_grpo")
    trees = torch.as_tensor(batch.columns[TREE_COLUMN], dtype=torch.long)
    return (_authors_zscore(rewards, group_ids, advantage_epsilon)
            + _authors_zscore(rewards, trees, advantage_epsilon))


# --------------------------------------------------------------------------- staged GRPO from MCTS prefixes
def uct_child(node: StepNode, c: float) -> StepNode:
    """The child maximising ``Q(child) + c sqrt(ln N(node) / N(child))`` (unvisited children first; ties: first)."""
    best, best_score = None, -math.inf
    for ch in node.children:
        if ch.visits == 0:
            return ch
        score = ch.value_sum / ch.visits + c * math.sqrt(math.log(max(node.visits, 1)) / ch.visits)
        if score > best_score:
            best, best_score = ch, score
    return best


def select(root: StepNode, c: float, branching: int) -> StepNode:
    """Walk down by UCT until a node that can take a new child (fewer than ``branching``) or a leaf."""
    node = root
    while not node.is_leaf and len(node.children) >= branching:
        node = uct_child(node, c)
    return node


def backpropagate(leaf: StepNode, value: float) -> None:
    node = leaf
    while node is not None:
        node.visits += 1
        node.value_sum += value
        node = node.parent


def best_path(root: StepNode) -> list[StepNode]:
    """From the root, the most-visited child each time (ties: higher mean value, then the first), to a leaf."""
    out, node = [], root
    while node.children:
        node = max(node.children, key=lambda n: (n.visits, n.value_sum / max(n.visits, 1)))
        out.append(node)
    return out


def revealed_steps(path_len: int, fraction: float) -> int:
    """Steps of a ``path_len``-step MCTS trajectory revealed as the prefix: ``floor(fraction * len)``, at most len-1."""
    return max(0, min(path_len - 1, int(math.floor(fraction * path_len + 1e-9))))


def stage_fraction(step: int, schedule: list, stage_steps: int) -> float:
    """The revealed fraction at training ``step``: ``schedule[min(step // stage_steps, len - 1)]``."""
    return float(schedule[min(step // max(stage_steps, 1), len(schedule) - 1)])


SATURATED, COLLAPSED, HEALTHY = "saturated", "collapsed", "ok"


def group_health(scalar: torch.Tensor, group_ids: torch.Tensor, success: float, collapse_std: float) -> dict:
    """``{group id: state}`` of a staged batch's groups (one revealed prefix each), from the scored rows only.

    ``saturated``: every completion reached ``success`` (scalar reward >= success): the prefix made the task
    trivial and every advantage is 0 (advantage saturation). ``collapsed``: not saturated, and the rewards'
    Bessel std is <= ``collapse_std`` (identical rewards, e.g. every completion failed: the reward signal
    collapsed and again every advantage is 0); a group with fewer than two scored rows counts as collapsed.
    ``ok`` otherwise."""
    out = {}
    for g in torch.unique(group_ids).tolist():
        r = scalar[group_ids == g]
        r = r[~torch.isnan(r)].double()
        if len(r) and bool((r >= success).all()):
            out[g] = SATURATED
        elif len(r) < 2 or float(r.std()) <= collapse_std:
            out[g] = COLLAPSED
        else:
            out[g] = HEALTHY
    return out


def remedied_reveal(k: int, n: int, state: str, saturation_remedy: str, collapse_remedy: str, shift: int) -> int:
    """The revealed steps of a group's second try: a saturated group reveals ``shift`` steps fewer (not below 0:
    a harder sub-problem), a collapsed one ``shift`` more (at most ``n - 1``: an easier one), with remedies
    ``reveal_less`` / ``reveal_more``; otherwise (remedy ``none``, healthy, or no room) ``k``."""
    if state == SATURATED and saturation_remedy == "reveal_less":
        return max(0, k - shift)
    if state == COLLAPSED and collapse_remedy == "reveal_more":
        return max(k, min(n - 1, k + shift))
    return k


@ROLLOUT_STRATEGIES.register("mcts_staged", check=_check, needs=("text",))
def mcts_staged_rollout(ctx, rows, uids, group_offset, budgets=None, temperatures=None, step: int = 0, *,
                        mcts_simulations: int = param(6, "staged MCTS GRPO: MCTS simulations per prompt and step"),
                        mcts_uct_c: float = param(1.0, "staged MCTS GRPO: UCT exploration constant c"),
                        mcts_branching: int = param(2, "staged MCTS GRPO: most children a node gets before UCT "
                                                       "descends past it"),
                        mcts_reveal_schedule: list = param([0.75, 0.5, 0.25, 0.0], "staged MCTS GRPO: share of the "
                                                           "MCTS trajectory's steps revealed, one value per stage"),
                        mcts_stage_steps: int = param(10, "staged MCTS GRPO: training steps per stage"),
                        mcts_saturation_remedy: str = param("reveal_less", "staged MCTS GRPO: what a group whose "
                                                            "completions all succeed gets: 'reveal_less' (its "
                                                            "completions are drawn again from a prefix "
                                                            "mcts_remedy_shift steps shorter) or 'none'",
                                                            ["reveal_less", "none"]),
                        mcts_collapse_remedy: str = param("reveal_more", "staged MCTS GRPO: what a group whose "
                                                          "rewards collapsed (std <= mcts_collapse_std, not all "
                                                          "successes) gets: 'reveal_more' (drawn again from a "
                                                          "prefix mcts_remedy_shift steps longer) or 'none'",
                                                          ["reveal_more", "none"]),
                        mcts_remedy_shift: int = param(1, "staged MCTS GRPO: steps a remedy moves the reveal by"),
                        mcts_success_reward: float = param(1.0, "staged MCTS GRPO: a completion with scalar "
                                                           "reward >= this succeeded (saturation test)"),
                        mcts_collapse_std: float = param(0.0, "staged MCTS GRPO: a group whose reward std is <= "
                                                         "this (and not saturated) has collapsed"),
                        mcts_prefix_mode: str = param("stage", "staged MCTS GRPO: where a prompt's rows start: "
                                                      "'stage' (all from the stage's revealed prefix: one prefix "
                                                      "per group) or 'tree' (spread round-robin over the prefixes "
                                                      "of depth 0 .. the stage's reveal: sibling prefixes of "
                                                      "mixed depth in one group, for advantage mcts_staged)",
                                                      ["stage", "tree"]),
                        max_turns: int = MAX_TURNS, max_episode_tokens: int = MAX_EPISODE_TOKENS,
                        max_turn_tokens: int = MAX_TURN_TOKENS, tool_timeout: float = TOOL_TIMEOUT,
                        tool_output_chars: int = TOOL_OUTPUT_CHARS, max_tool_calls: int = MAX_TOOL_CALLS,
                        env_reward_weight: float = ENV_REWARD_WEIGHT, tools: list = TOOLS,
                        environment: str | None = ENVIRONMENT_KEY, environment_kind: str = ENVIRONMENT_KIND,
                        tool_isolation: str = TOOL_ISOLATION_KEY):
    """Staged GRPO from partially revealed MCTS rollouts (MCTS-derived prefixes; seed 000-20).

    Per prompt: an MCTS over agent steps (node = model turn + observation)
    with the current policy: ``mcts_simulations`` times, select by UCT
    ``Q + c sqrt(ln N_parent / N_child)`` down to a node with fewer than
    ``mcts_branching`` children (or a leaf), play one episode on from it to
    its end (expansion and simulation), score the leaf with the run's rewards
    (value = the scalar reward) and back it up (mean value). The MCTS
    trajectory is the most-visited root-to-leaf path; at training step ``s``
    its first ``floor(f * n)`` steps (at most ``n - 1``) are revealed,
    ``f = mcts_reveal_schedule[s // mcts_stage_steps]`` (the stages: a falling
    share, so the policy completes more of the trajectory stage by stage), and
    ``num_generations`` episodes continue from there. The revealed turns are
    INJECTED (loss mask 0, behaviour log-probs teacher-forced with
    ``ctx.logprobs``; their observations ENVIRONMENT); the continuations of one
    prefix form a GRPO group (rewards conditioned on the shared prefix). The
    agent keys are the ``agent`` rollout's.

    Saturation and collapse: after scoring, a group whose completions all succeed is drawn again once from a
    shorter prefix, one whose rewards have collapsed from a longer one (:class:`Remedies`: the rules, the
    ``mcts/*`` metrics and ``columns["mcts_remedy"]``).

    ``mcts_prefix_mode: tree`` spreads a prompt's rows over the prefixes of depth ``0 .. k`` of the trajectory
    (row ``j`` starts after ``j mod (k + 1)`` revealed steps, ``k`` the stage's reveal), so one group holds
    completions of sibling prefixes of mixed depth, as Tree-OPO's student completes prefixes of mixed depth
    (the remedies then move each row's prefix by ``mcts_remedy_shift``). Every row carries its start node's
    MCTS statistics, read before the completions are drawn (so they do not depend on them):
    ``columns["mcts_prefix_value"]`` (the node's mean backed-up value, ``value_sum / visits``),
    ``columns["mcts_prefix_optimistic"]`` / ``["mcts_prefix_pessimistic"]`` (the highest / lowest value of a
    simulated leaf under the node: with 0/1 rewards, "some simulation from here succeeded" / "none failed"),
    ``columns["mcts_prefix_visits"]``; ``advantage: mcts_staged`` reads them (:func:`mcts_staged_advantage`).

    Provenance: reconstructed from the abstract — the abstract (Tree-OPO, Huang, Nguyen and Zimmer,
    arXiv:2509.09284, seed 000-20) gives no MCTS settings, stage schedule or advantage formula and names
    "heuristic and statistical solutions" to advantage saturation and reward collapse without stating them;
    the paper's text could not be read here: UCT over agent steps with mean backed-up task reward, a fresh
    tree per prompt and step, the most-visited path as the trajectory, a falling reveal share per stage of
    mcts_stage_steps steps, one group per revealed prefix (use it with group_zscore), and the two remedies
    (a saturated group redrawn from a shorter prefix, a collapsed one from a longer prefix, once, with the
    tests above) are grpolab's; mode ``tree`` (rows from sibling prefixes of mixed depth) and the prefix
    statistics follow third-party summaries of the paper's later version (its student completes prefixes of
    mixed depth; its staged advantage uses tree-consistent prefix baselines: ``advantage: mcts_staged``); its
    projection onto the tree's order constraints and its offline teacher are not built.
    Test: tests/test_agent_tree.py::test_mcts_group_health_and_remedy_by_hand,
    tests/test_agent_tree.py::test_mcts_staged_saturated_group_is_redrawn_from_a_shorter_prefix,
    tests/test_agent_tree.py::test_mcts_staged_tree_mode_spreads_rows_over_sibling_prefixes.
    """
    if mcts_prefix_mode not in ("stage", "tree"):
        raise ConfigError(f"mcts_prefix_mode: '{mcts_prefix_mode}' is not valid; valid values: stage, tree")
    search = new_search(ctx, dict(max_turns=max_turns, max_episode_tokens=max_episode_tokens,
                                  max_turn_tokens=max_turn_tokens, tool_timeout=tool_timeout,
                                  tool_output_chars=tool_output_chars, max_tool_calls=max_tool_calls, tools=tools,
                                  environment=environment, environment_kind=environment_kind,
                                  tool_isolation=tool_isolation))
    trees = new_trees(ctx, rows, uids, group_offset, 1, temperatures)
    _mcts_search(ctx, search, trees, mcts_simulations, mcts_uct_c, mcts_branching)
    remedies = Remedies(mcts_saturation_remedy, mcts_collapse_remedy, mcts_remedy_shift, mcts_success_reward,
                        mcts_collapse_std)
    frac = stage_fraction(step, list(mcts_reveal_schedule), mcts_stage_steps)
    starts, reveal, paths = _staged_starts(ctx.cfg, trees, frac, budgets, mcts_prefix_mode)
    stats = [prefix_stats(node) for _, node in starts]  # before the completions join the tree
    chosen = [(t, leaf) for (t, _), leaf in zip(starts, grow(ctx, search, starts))]
    batch, scalar = _pack_staged(ctx, search, chosen, reveal, stats)
    # advantage saturation / reward collapse: one redraw per affected group from a shorter / longer prefix
    batch, scalar, health, after, redo = remedies.apply(ctx, search, trees, paths, chosen, reveal, batch, scalar,
                                                        stats)
    _log_mcts(ctx, trees, batch, scalar, health, after, redo, frac, reveal)
    return batch


def _mcts_search(ctx, search: Search, trees: list[Tree], simulations: int, c: float, branching: int) -> None:
    """``simulations`` rounds over every tree: UCT selection, one episode played on (expansion and simulation),
    the leaf scored with the run's rewards (value = the scalar reward, NaN as 0) and backed up."""
    for _ in range(simulations):
        starts = [(t, select(t.root, c, branching)) for t in trees]
        todo = [(t, n) for t, n in starts if not n.is_leaf]
        grown = iter(grow(ctx, search, todo) if todo else [])
        ends = [(t, n if n.is_leaf else next(grown)) for t, n in starts]
        values = ctx.score(pack_leaves(ctx, search, ends)).nan_to_num(0.0).tolist()
        for (_, leaf), v in zip(ends, values):
            backpropagate(leaf, float(v))


def _staged_starts(cfg, trees: list[Tree], frac: float, budgets, mode: str = "stage"):
    """Per tree: its MCTS trajectory (the most-visited path), the node(s) after its revealed prefix(es) and the
    rows drawn from them (the prompt's budget, else ``num_generations``): mode ``stage``, every row after the
    stage's ``k`` revealed steps; mode ``tree``, row ``j`` after ``j mod (k + 1)`` of them. Returns ``(starts,
    reveal, paths)``: one ``(tree, node)`` and one revealed step count per row, one ``(path, steps)`` per tree."""
    starts, reveal, paths = [], [], []
    for i, t in enumerate(trees):
        path = best_path(t.root)
        n_steps = len([n for n in path if n.ids or not n.is_leaf])
        k = revealed_steps(n_steps, frac)
        paths.append((path, n_steps))
        n = budgets[i] if budgets else cfg.num_generations
        ks = [k] * n if mode == "stage" else [j % (k + 1) for j in range(n)]
        starts += [(t, path[d - 1] if d else t.root) for d in ks]
        reveal += ks
    return starts, reveal, paths


def prefix_stats(node: StepNode) -> dict:
    """A prefix node's MCTS statistics: ``value`` (mean backed-up value ``value_sum / visits``; 0 when
    unvisited), ``optimistic`` / ``pessimistic`` (the highest / lowest mean value of a visited leaf in the
    node's subtree, the node itself if it is a leaf; ``value`` when none is visited) and ``visits``."""
    value = node.value_sum / node.visits if node.visits else 0.0
    leaves = [n for n in ([node] + node.subtree()) if n.is_leaf and n.visits]
    vals = [n.value_sum / n.visits for n in leaves] or [value]
    return {"value": value, "optimistic": max(vals), "pessimistic": min(vals), "visits": node.visits}


PREFIX_COLUMNS = {"value": "mcts_prefix_value", "optimistic": "mcts_prefix_optimistic",
                  "pessimistic": "mcts_prefix_pessimistic", "visits": "mcts_prefix_visits"}


def _pack_staged(ctx, search: Search, chosen: list, reveal: list[int], stats: list[dict]):
    """The staged batch (revealed turns injected, ``columns["mcts_revealed_steps"]`` and the start nodes'
    :func:`prefix_stats` as ``columns["mcts_prefix_*"]``) and its scalar reward."""
    batch = pack_leaves(ctx, search, chosen, injected_steps=reveal)
    batch.columns["mcts_revealed_steps"] = list(reveal)
    for key, col in PREFIX_COLUMNS.items():
        batch.columns[col] = [st[key] for st in stats]
    return batch, ctx.score(batch)


@dataclass(frozen=True)
class Remedies:
    """The staged rollout's saturation and collapse remedies (:func:`group_health`, :func:`remedied_reveal`).

    After scoring, a group whose completions all succeed (scalar reward >= ``mcts_success_reward``: advantage
    saturation, every advantage 0) is drawn again once from a prefix ``mcts_remedy_shift`` steps shorter
    (``mcts_saturation_remedy: reveal_less``), and a group whose rewards have collapsed (std <=
    ``mcts_collapse_std`` without all succeeding, e.g. all fail) once from a prefix that many steps longer
    (``mcts_collapse_remedy: reveal_more``, at most ``n - 1``); the second draw replaces the group (with
    ``mcts_prefix_mode: tree`` each row's prefix moves by the shift, within ``0 .. n - 1``). Metrics:
    ``mcts/saturated_groups`` and ``mcts/collapsed_groups`` (shares of the step's groups before the remedies),
    ``mcts/remedied_groups`` (share drawn again), ``mcts/saturated_after`` and ``mcts/collapsed_after`` (shares in
    the returned batch); ``columns["mcts_remedy"]`` names each row's remedy ("" for none).
    """
    saturation_remedy: str
    collapse_remedy: str
    shift: int
    success_reward: float
    collapse_std: float

    def __post_init__(self):
        for name, value, valid in (("mcts_saturation_remedy", self.saturation_remedy, ("reveal_less", "none")),
                                   ("mcts_collapse_remedy", self.collapse_remedy, ("reveal_more", "none"))):
            if value not in valid:
                raise ConfigError(f"{name}: '{value}' is not valid; valid values: {', '.join(valid)}")
        if self.shift < 1:
            raise ConfigError(f"mcts_remedy_shift: expected >= 1, got {self.shift}")

    def apply(self, ctx, search: Search, trees, paths, chosen: list, reveal: list[int], batch, scalar,
              stats: list[dict]):
        """The groups' health, one redraw of the remedied groups (``chosen``, ``reveal`` and ``stats`` updated in
        place) and their health after. Returns ``(batch, scalar, health, after, redo)``."""
        health = group_health(scalar, batch.group_ids, self.success_reward, self.collapse_std)
        redo = self.groups(trees, paths, chosen, reveal, health)
        remedy = [""] * len(chosen)
        if redo:
            for rows_g, _, nodes, _ in redo.values():  # the new start nodes' statistics, before their draws
                for r, node in zip(rows_g, nodes):
                    stats[r] = prefix_stats(node)
            _redraw(ctx, search, trees, redo, chosen, reveal, remedy)
            batch, scalar = _pack_staged(ctx, search, chosen, reveal, stats)
        after = group_health(scalar, batch.group_ids, self.success_reward, self.collapse_std)
        batch.columns["mcts_remedy"] = remedy
        return batch, scalar, health, after, redo

    def groups(self, trees, paths, chosen, reveal, health: dict) -> dict:
        """``{group: (rows, new reveal per row, new start node per row, remedy name)}`` of the groups a remedy
        draws again (a group is drawn again, every row, when some row's prefix moves)."""
        tree_of = {t.group: (j, t) for j, t in enumerate(trees)}
        redo = {}
        for g, state in health.items():
            j, t = tree_of[g]
            path, n_steps = paths[j]
            rows_g = [r for r, (tt, _) in enumerate(chosen) if tt is t]
            ks = [reveal[r] for r in rows_g]
            k2s = [remedied_reveal(k, n_steps, state, self.saturation_remedy, self.collapse_remedy, self.shift)
                   for k in ks]
            if k2s != ks:
                name = "reveal_less" if state == SATURATED else "reveal_more"
                redo[g] = (rows_g, k2s, [path[k2 - 1] if k2 else t.root for k2 in k2s], name)
        return redo


def _redraw(ctx, search: Search, trees, redo: dict, chosen: list, reveal: list[int], remedy: list[str]) -> None:
    """Draw the remedied groups' rows again from their new prefixes (``chosen``, ``reveal``, ``remedy`` in place)."""
    tree_of = {t.group: t for t in trees}
    again = [(tree_of[g], node) for g, (_, _, nodes, _) in redo.items() for node in nodes]
    new_leaves = iter(grow(ctx, search, again))
    for g, (rows_g, k2s, _, name) in redo.items():
        for r, k2 in zip(rows_g, k2s):
            chosen[r] = (chosen[r][0], next(new_leaves))
            reveal[r], remedy[r] = k2, name


def _log_mcts(ctx, trees, batch, scalar, health: dict, after: dict, redo: dict, frac: float, reveal) -> None:
    n_groups = max(len(health), 1)
    ctx.metric("mcts/saturated_groups", sum(s == SATURATED for s in health.values()) / n_groups)
    ctx.metric("mcts/collapsed_groups", sum(s == COLLAPSED for s in health.values()) / n_groups)
    ctx.metric("mcts/remedied_groups", len(redo) / n_groups)
    ctx.metric("mcts/saturated_after", sum(s == SATURATED for s in after.values()) / n_groups)
    ctx.metric("mcts/collapsed_after", sum(s == COLLAPSED for s in after.values()) / n_groups)
    _log_tree(ctx, trees, batch, scalar)
    ctx.metric("mcts/reveal_fraction", frac)
    ctx.metric("mcts/revealed_steps", sum(reveal) / max(len(reveal), 1))
    ctx.metric("mcts/root_value", sum(t.root.value_sum / max(t.root.visits, 1) for t in trees) / len(trees))


mcts_staged_rollout.extra_rewards = extra_rewards
mcts_staged_rollout.eval_rollout = eval_rollout
for _hook in ("max_prompt_length", "first_prompts", "model_texts"):  # episodes as the agent rollout's
    setattr(mcts_staged_rollout, _hook, getattr(_agent, _hook))


# --------------------------------------------------------------------------- the tree-structured staged advantage
MCTS_BASELINES = ("value", "optimistic", "pessimistic", "none")


@ADVANTAGES.register("mcts_staged", min_group_size=2)
def mcts_staged_advantage(rewards: torch.Tensor, group_ids: torch.Tensor, *, batch=None,
                          mcts_adv_baseline: str = param("value", "staged MCTS advantage: the prefix baseline V(p) "
                                                         "subtracted from each reward: 'value' (the start node's "
                                                         "mean MCTS value), 'optimistic' / 'pessimistic' (the "
                                                         "highest / lowest simulated leaf value under it) or "
                                                         "'none' (plain group centring)", list(MCTS_BASELINES)),
                          mcts_adv_alpha: float = param(1.0, "staged MCTS advantage: weight alpha of the prefix "
                                                        "baseline (A = r - alpha V(p), then centred)"),
                          mcts_adv_scale: str = param("none", "staged MCTS advantage: 'none' (centred only) or "
                                                      "'std' (divided by max(std_g, mcts_adv_std_floor) + eps)",
                                                      ["none", "std"]),
                          mcts_adv_std_floor: float = param(0.0, "staged MCTS advantage: with mcts_adv_scale std, "
                                                            "the smallest std divided by (a nearly collapsed "
                                                            "group is not blown up to unit advantages)"),
                          advantage_epsilon: float = 1e-4) -> torch.Tensor:
    """Staged advantage with MCTS prefix baselines (Tree-OPO, arXiv:2509.09284; seed 000-20).

    Each row ``i`` is a completion of a revealed MCTS prefix ``p_i`` (``rollout_strategy: mcts_staged``); its
    prefix baseline ``V(p_i)`` is read from the tree built before the completions were drawn
    (``columns["mcts_prefix_value" | "_optimistic" | "_pessimistic"]``)::

        u_i = r_i - alpha V(p_i)
        A_i = u_i - mean_g(u)                                              mcts_adv_scale = "none"
        A_i = (u_i - mean_g(u)) / (max(std_g(u), floor) + epsilon)         mcts_adv_scale = "std"

    over the row's group ``g`` (the prompt: with ``mcts_prefix_mode: tree`` it holds completions of sibling
    prefixes of mixed depth). With ``alpha = 0`` or baseline ``none`` this is group centring (``std``: GRPO's
    z-score with the floor); with one prefix per group (``mcts_prefix_mode: stage``) the baseline is a constant
    of the group and cancels. Advantage saturation: a group whose completions all succeed has ``A = 0`` under
    GRPO; here rows from prefixes the tree rated harder (lower ``V``) get ``A > 0`` and rows from easier ones
    ``A < 0``, so a success from a hard prefix is still credited. Reward collapse under ``std``: the floor keeps
    a group whose adjusted rewards are almost equal from being scaled up to unit advantages. NaN rewards are left
    out of the statistics and get 0.

    Provenance: reconstructed from the abstract — the v1 abstract (seed 000-20) names "a novel tree-structured
    setting for advantage estimation" and "heuristic and statistical solutions" without formulas, and the
    paper's text and code could not be read here; the form ``r - alpha V(prefix)`` with an expectation,
    optimistic or pessimistic tree baseline, centred over the group, follows third-party summaries of the
    paper's later version (Staged Advantage Estimation); V read from the online MCTS (not a teacher's offline
    tree), the leaf max / min as the optimistic / pessimistic baselines for non-binary rewards, the optional std
    scaling with its floor, and the defaults (value, alpha 1, none) are grpolab's choices. Not built: SAE's
    projection of the advantages onto the tree's order constraints (its quadratic program and heuristics).
    Test: tests/test_agent_tree.py::test_mcts_staged_advantage_by_hand.
    """
    if mcts_adv_baseline not in MCTS_BASELINES:
        raise ConfigError(f"mcts_adv_baseline: '{mcts_adv_baseline}' is not valid; valid values: "
                          f"{', '.join(MCTS_BASELINES)}")
    if mcts_adv_scale not in ("none", "std"):
        raise ConfigError(f"mcts_adv_scale: '{mcts_adv_scale}' is not valid; valid values: none, std")
    if mcts_adv_baseline == "none":
        base = torch.zeros_like(rewards)
    else:
        col = PREFIX_COLUMNS[mcts_adv_baseline]
        if batch is None or col not in batch.columns:
            raise ConfigError(f"advantage mcts_staged needs each row's MCTS prefix statistics "
                              f"(batch.columns['{col}']), which the mcts_staged rollout writes: set "
                              f"rollout_strategy mcts_staged (or mcts_adv_baseline none)")
        base = torch.as_tensor(batch.columns[col], dtype=rewards.dtype)
    u = rewards - mcts_adv_alpha * base
    mean, std, _ = group_stats(u, group_ids)
    adv = u - mean
    if mcts_adv_scale == "std":
        adv = adv / (std.clamp(min=mcts_adv_std_floor) + advantage_epsilon)
    return torch.nan_to_num(adv, nan=0.0, posinf=0.0, neginf=0.0)
