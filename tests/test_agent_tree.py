"""Tree-GRPO (seed 000-10), staged GRPO from MCTS prefixes (000-20) and turn-PPO's critic (000-14).

Expected numbers are worked out by hand in the comments (from the authors' verl code for Tree-GRPO: the sum of a
prompt-level and a tree-level z-score, unbiased std, a one-row group uses mean 0 / std 1; GAE as written in the
turn-PPO docstring), never by calling grpolab.
"""
import math
import sys
from pathlib import Path

import pytest
import torch

from grpolab.agents.base import AgentEnv, StepResult
from grpolab.agents.critic import TurnPPOCritic, masked_whiten, turn_gae, turn_starts
from grpolab.agents.tree import (StepNode, backpropagate, best_path, group_health, mcts_staged_advantage,
                                 prefix_stats, remedied_reveal, revealed_steps, select, stage_fraction,
                                 tree_grpo_advantage, uct_child)
from grpolab.algorithms.advantages import group_zscore
from grpolab.batch import ENVIRONMENT, INJECTED, SAMPLED, RolloutBatch
from grpolab.config import Config
from grpolab.data import model_texts
from grpolab.errors import ConfigError
from grpolab.generation.turns import Episode, pack_episodes
from grpolab.model.loading import load_policy
from grpolab.registry import ROLLOUT_STRATEGIES, TASKS
from grpolab.rewards import BatchScorer, RewardFn, RewardScorer
from grpolab.rollouts.context import RolloutContext
from grpolab.tasks import Task, get_task
from grpolab.train.metrics import read_metrics
from grpolab.train.trainer import Trainer

sys.path.insert(0, str(Path(__file__).parent))


# --------------------------------------------------------------------------- a deterministic test environment
class CountEnv(AgentEnv):
    """Deterministic given (row, seed) and the actions: observation ' obs<n>:<last char of action> ', done at 3."""
    resets = 0

    def reset(self, row, seed):
        CountEnv.resets += 1
        self.n, self.seed = 0, seed
        return ""

    def step(self, action):
        self.n += 1
        return StepResult(f" obs{self.n}:{action[-1:]} ", reward=0.25, done=self.n >= 3)

    def state_key(self):
        return str(self.n)


class NoisyEnv(CountEnv):
    """Not deterministic: each instance answers with its own counter, so a replayed branch differs."""
    made = 0

    def __init__(self):
        NoisyEnv.made += 1
        self.me = NoisyEnv.made

    def step(self, action):
        res = super().step(action)
        res.observation += str(self.me)
        return res


def _env_task(n_train: int = 40, n_eval: int = 8, seed: int = 0) -> Task:
    """The `repeat` rows with CountEnv as their environment (a test task, registered below).

    Provenance: grpolab's own — a test task; implements no published method.
    """
    base = get_task("repeat", n_train=n_train, n_eval=n_eval, seed=seed)
    return Task("tree_test_env", base.train_rows, base.eval_rows, base.rewards, base.accuracy_reward,
                extra={"environment": lambda row: CountEnv()})


@pytest.fixture(scope="module", autouse=True)
def _registered_test_task():
    """The test task exists while this file's tests run (the catalogue and its docs never see it)."""
    TASKS.register("tree_test_env")(_env_task)
    yield
    TASKS._items.pop("tree_test_env", None)


@pytest.fixture(scope="module")
def model_tok():
    rows = get_task("repeat").train_rows[:12]
    model, tok = load_policy("tiny", task_texts=model_texts(rows), seed=0, log=lambda *a: None)
    return model.eval(), tok, rows


def make_ctx(model_tok, **keys):
    model, tok, rows = model_tok
    cfg = Config.build({"model": "tiny", "task": "tree_test_env", "max_completion_length": 6, "micro_batch_size": 16,
                        **keys})
    task = get_task("repeat")
    scorer = BatchScorer(RewardScorer([RewardFn(n, f, w) for n, f, w in task.rewards]))
    ctx = RolloutContext(cfg, tok, rows, policy=model, scorer=scorer, generator=torch.Generator().manual_seed(1))
    ctx.environment = lambda row: CountEnv()
    ctx.new_step(0)
    return ctx


def run_strategy(ctx, name, uids, **params):
    offset = ctx.allocate_groups(len(uids))
    return ROLLOUT_STRATEGIES.get(name)(ctx=ctx, rows=[ctx.rows[u] for u in uids], uids=uids, group_offset=offset,
                                        **params)


# --------------------------------------------------------------------------- Tree-GRPO advantage
def _batch_with_trees(trees):
    b = RolloutBatch.__new__(RolloutBatch)
    b.columns = {"tree": trees}
    return b


def test_tree_grpo_advantage_by_hand():
    # prompt 0: tree 0 leaves [1, 0, 0], tree 1 leaves [1, 1, 0]; prompt 1: two one-leaf trees, both 0.5 (a tie);
    # prompt 2: one tree with one leaf, reward 2; prompt 3: a NaN (unscorable) row next to a 1.
    r = torch.tensor([1., 0., 0., 1., 1., 0., .5, .5, 2., float("nan"), 1.])
    g = torch.tensor([0, 0, 0, 0, 0, 0, 1, 1, 2, 3, 3])
    trees = [0, 0, 0, 1, 1, 1, 2, 3, 4, 5, 5]
    eps = 1e-6
    # prompt 0: mean 3/6 = 0.5, unbiased var = 6 * 0.25 / 5 = 0.3 -> z_P(1) = 0.5 / sqrt(0.3), z_P(0) = -0.5 / sqrt(.3)
    zp = 0.5 / (math.sqrt(0.3) + eps)
    # tree 0 [1,0,0]: mean 1/3, var = (4/9 + 2/9) / 2 = 1/3 -> z_T(1) = (2/3)/sqrt(1/3), z_T(0) = (-1/3)/sqrt(1/3)
    s3 = math.sqrt(1 / 3) + eps
    # tree 1 [1,1,0]: mean 2/3 -> z_T(1) = (1/3)/sqrt(1/3), z_T(0) = (-2/3)/sqrt(1/3)
    # prompt 1: std 0 -> z_P = 0 / eps = 0; each tree has one row -> mean 0, std 1: z_T = 0.5 / (1 + eps)
    # prompt 2: one row: z_P = 2 / (1 + eps) and z_T = 2 / (1 + eps) -> 4 (the authors' one-row rule, not 0)
    # prompt 3: the NaN row gets 0; the 1 is alone among scored rows of its group and tree: 1 + 1
    want = [zp + (2 / 3) / s3, -zp - (1 / 3) / s3, -zp - (1 / 3) / s3,
            zp + (1 / 3) / s3, zp + (1 / 3) / s3, -zp - (2 / 3) / s3,
            0.5 / (1 + eps), 0.5 / (1 + eps), 4 / (1 + eps), 0.0, 2 / (1 + eps)]
    got = tree_grpo_advantage(r, g, batch=_batch_with_trees(trees), advantage_epsilon=eps)
    assert torch.allclose(got.double(), torch.tensor(want, dtype=torch.float64), atol=1e-5)
    # relation: one tree per prompt -> both z-scores are the group's: twice group_zscore (groups of >= 2 rows)
    r2, g2 = torch.tensor([1., 0., 0., .3, .9]), torch.tensor([0, 0, 0, 1, 1])
    got2 = tree_grpo_advantage(r2, g2, batch=_batch_with_trees([7, 7, 7, 8, 8]), advantage_epsilon=eps)
    assert torch.allclose(got2, 2 * group_zscore(r2, g2, advantage_epsilon=eps), atol=1e-6)


def test_tree_grpo_advantage_needs_trees():
    b = _batch_with_trees(None)
    b.columns = {}
    with pytest.raises(ConfigError, match="rollout_strategy tree_grpo"):
        tree_grpo_advantage(torch.ones(2), torch.zeros(2, dtype=torch.long), batch=b)


# --------------------------------------------------------------------------- Tree-GRPO rollout
def _check_episode_rows(ctx, batch):
    """Origins, masks, spans and the episode records agree; behaviour log-probs equal a teacher-forced forward."""
    for r, ep in enumerate(batch.columns["episode"]):
        alive = batch.completion_attention_mask[r] > 0
        spans = batch.span_ids[r][alive]
        origin = batch.token_origin[r][alive]
        assert ep["num_turns"] == len(ep["turns"]) >= 1
        for k, turn in enumerate(ep["turns"]):
            assert turn["span"] == (1 if k == 0 else ep["turns"][k - 1]["obs_span"] + 1)
            if turn["obs_span"] is not None:
                assert turn["obs_span"] == turn["span"] + 1
                assert bool((origin[spans == turn["obs_span"]] == ENVIRONMENT).all())
        env_tok = batch.token_origin[r] == ENVIRONMENT
        assert float(batch.completion_mask[r][env_tok].sum()) == 0.0
    forced = ctx.logprobs(batch)
    sampled = (batch.token_origin == SAMPLED) & (batch.completion_attention_mask > 0)
    diff = (forced - batch.behavior_logprobs).abs()[sampled]
    assert float(diff.mean()) < 1e-5, float(diff.mean())
    # the shared-prefix forward (each distinct prompt once) gives the plain forward's log-probs on tree rows
    from grpolab.model.logprobs import completion_logprobs
    with torch.no_grad():
        plain = completion_logprobs(ctx.policy, batch, ctx.cfg.temperature, shared_prefix=False)[0]
        shared = completion_logprobs(ctx.policy, batch, ctx.cfg.temperature, shared_prefix=True)[0]
    alive = batch.completion_attention_mask > 0
    assert float((plain - shared).abs()[alive].max()) < 1e-5


def test_tree_grpo_rollout_structure(model_tok):
    """M=2 trees, N=2 nodes, L=1 round, K=3 leaves per tree: 6 rows per prompt, 3 per tree, shared prefixes."""
    ctx = make_ctx(model_tok, rollout_strategy="tree_grpo", num_generations=6)
    CountEnv.resets = 0
    b = run_strategy(ctx, "tree_grpo", [0, 1], tree_grpo_trees=2, tree_grpo_expand_nodes=2,
                     tree_grpo_expand_rounds=1, max_turn_tokens=4)
    assert b.group_ids.tolist() == [0] * 6 + [1] * 6
    assert b.columns["tree"] == [0, 0, 0, 1, 1, 1, 2, 2, 2, 3, 3, 3]
    assert b.prompt_uids.tolist() == [0] * 6 + [1] * 6
    # CountEnv ends every episode after 3 turns: 3 model turns, 2 observations (none after the last turn)
    assert all(ep["ended_by"] == "done" and ep["num_turns"] == 3 for ep in b.columns["episode"])
    assert all(ep["turns"][-1]["observation"] is None and ep["turns"][0]["state"] == "0"
               for ep in b.columns["episode"])
    # resets: one per chain grown (a branch replays its node's path on a fresh environment): 4 trees x (1 + 2)
    assert CountEnv.resets == 4 * 3
    # the leaves of a tree are distinct, and a branch from a non-root node shares that node's turn tokens
    sampled = ctx.metrics["tree/sampled_tokens"]
    assert sampled <= ctx.metrics["tree/row_model_tokens"]
    _check_episode_rows(ctx, b)


def test_tree_rollout_refuses_a_nondeterministic_env(model_tok):
    ctx = make_ctx(model_tok, rollout_strategy="tree_grpo", num_generations=6)
    ctx.environment = lambda row: NoisyEnv()
    with pytest.raises(RuntimeError, match="deterministic"):  # some branch starts below the root (seeded draws)
        for _ in range(5):
            run_strategy(ctx, "tree_grpo", [0, 1, 2], tree_grpo_expand_nodes=3, max_turn_tokens=3)


def test_tree_grpo_config_checks():
    base = {"model": "tiny", "task": "tree_test_env", "rollout_strategy": "tree_grpo"}
    with pytest.raises(ConfigError, match="multiple of 2"):
        Config.build({**base, "num_generations": 5})
    with pytest.raises(ConfigError, match="only 1 \\+ tree_grpo_expand_nodes"):  # 4 rows per tree, 3 leaves
        Config.build({**base, "num_generations": 8})
    assert Config.build({**base, "num_generations": 8, "tree_grpo_expand_rounds": 2}).tree_grpo_expand_rounds == 2


def test_tree_rollout_needs_an_environment(model_tok):
    ctx = make_ctx(model_tok, rollout_strategy="tree_grpo", num_generations=6)
    ctx.environment = None
    with pytest.raises(ConfigError, match="--env module:Class"):
        run_strategy(ctx, "tree_grpo", [0])


# --------------------------------------------------------------------------- MCTS pieces
def _node(parent=None, visits=0, value=0.0, leaf=False):
    n = StepNode(parent=parent, depth=0 if parent is None else parent.depth + 1, visits=visits, value_sum=value,
                 ended_by="done" if leaf else None)
    if parent is not None:
        parent.children.append(n)
    return n


def test_mcts_uct_select_backup_by_hand():
    root = _node(visits=10, value=5.0)
    a = _node(root, visits=6, value=4.2)   # Q = 0.7
    b = _node(root, visits=4, value=1.2)   # Q = 0.3
    # c = 1: UCT(a) = 0.7 + sqrt(ln 10 / 6) = 0.7 + 0.61948 = 1.31948; UCT(b) = 0.3 + sqrt(ln 10 / 4) = 1.05871
    assert uct_child(root, 1.0) is a
    # c = 2: UCT(a) = 0.7 + 1.23896 = 1.93896; UCT(b) = 0.3 + 1.51743 = 1.81743 -> still a; c = 3: a 2.5584, b 2.5761
    assert uct_child(root, 2.0) is a and uct_child(root, 3.0) is b
    u = _node(a)  # an unvisited child is taken first
    assert uct_child(a, 1.0) is u
    # select: root is full (2 children, branching 2) -> descend by UCT to a; a has 1 child < 2 -> stop at a
    assert select(root, 1.0, 2) is a
    assert select(root, 1.0, 3) is root
    leaf = _node(u, leaf=True)
    backpropagate(leaf, 1.0)
    assert (leaf.visits, u.visits, a.visits, root.visits) == (1, 1, 7, 11)
    assert (a.value_sum, root.value_sum) == (5.2, 6.0)
    # most visited path: a (7 > 4), then u, then leaf
    assert best_path(root) == [a, u, leaf]


def test_mcts_reveal_schedule_by_hand():
    sched = [0.75, 0.5, 0.25, 0.0]
    assert [stage_fraction(s, sched, 10) for s in (0, 9, 10, 25, 30, 99)] == [0.75, 0.75, 0.5, 0.25, 0.0, 0.0]
    # floor(f * n), capped at n - 1 so the policy always acts
    assert revealed_steps(4, 0.75) == 3 and revealed_steps(3, 0.75) == 2 and revealed_steps(3, 0.5) == 1
    assert revealed_steps(1, 0.75) == 0 and revealed_steps(3, 1.0) == 2 and revealed_steps(5, 0.0) == 0


def test_mcts_staged_rollout_injects_the_revealed_prefix(model_tok):
    ctx = make_ctx(model_tok, rollout_strategy="mcts_staged", num_generations=3)
    b = run_strategy(ctx, "mcts_staged", [0, 1], step=0, mcts_simulations=3, max_turn_tokens=4)
    assert b.group_ids.tolist() == [0, 0, 0, 1, 1, 1]
    # CountEnv: every MCTS trajectory has 3 steps; stage 0 reveals floor(0.75 * 3) = 2 of them
    assert b.columns["mcts_revealed_steps"] == [2] * 6 and ctx.metrics["mcts/reveal_fraction"] == 0.75
    for r, ep in enumerate(b.columns["episode"]):
        assert ep["num_turns"] == 3
        spans = b.span_ids[r]
        for k, turn in enumerate(ep["turns"]):
            want = INJECTED if k < 2 else SAMPLED
            assert bool((b.token_origin[r][spans == turn["span"]] == want).all())
            assert float(b.completion_mask[r][spans == turn["span"]].sum()) == (0 if k < 2 else
                                                                               float((spans == turn["span"]).sum()))
    # rows of a group share the revealed prefix tokens
    pre = [(b.span_ids[r] > 0) & (b.span_ids[r] <= 4) for r in range(3)]
    assert all(torch.equal(b.completion_ids[r][pre[r]], b.completion_ids[0][pre[0]]) for r in range(3))
    # injected tokens carry teacher-forced behaviour log-probs (equal to a fresh forward, like the sampled ones)
    forced = ctx.logprobs(b)
    alive = b.completion_attention_mask > 0
    assert float((forced - b.behavior_logprobs).abs()[alive & (b.token_origin != ENVIRONMENT)].max()) < 1e-5
    # a later stage reveals nothing: plain episodes, all sampled (the collapse remedy off: it would reveal one)
    ctx.new_step(40)
    b = run_strategy(ctx, "mcts_staged", [0], step=40, mcts_simulations=2, max_turn_tokens=4,
                     mcts_collapse_remedy="none")
    assert b.columns["mcts_revealed_steps"] == [0] * 3 and not bool((b.token_origin == INJECTED).any())


def test_mcts_group_health_and_remedy_by_hand():
    nan = float("nan")
    r = torch.tensor([1., 1., 1., 0., 0., 0., 1., 0., 1., 1., nan])
    g = torch.tensor([0, 0, 0, 1, 1, 1, 2, 2, 2, 3, 3])
    # g0 all >= 1: saturated; g1 all 0: std 0 -> collapsed; g2 [1, 0, 1]: mean 2/3, Bessel var
    # ((1/3)^2 * 2 + (2/3)^2) / 2 = 1/3, std 0.5774 > 0 -> ok; g3: its one scored row succeeded -> saturated
    assert group_health(r, g, 1.0, 0.0) == {0: "saturated", 1: "collapsed", 2: "ok", 3: "saturated"}
    # collapse_std 0.6 >= 0.5774: g2 collapsed too; success 0.5: g2 still has a 0, not saturated
    assert group_health(r, g, 1.0, 0.6)[2] == "collapsed" and group_health(r, g, 0.5, 0.0)[2] == "ok"
    assert group_health(torch.tensor([0.5, 0.75]), torch.tensor([0, 0]), 0.5, 0.0) == {0: "saturated"}
    assert group_health(torch.tensor([0.0, nan]), torch.tensor([0, 0]), 1.0, 0.0) == {0: "collapsed"}  # 1 scored
    # remedies: saturated reveals shift fewer (floor 0), collapsed shift more (cap n - 1), 'none' or ok: unchanged
    assert remedied_reveal(2, 3, "saturated", "reveal_less", "reveal_more", 1) == 1
    assert remedied_reveal(2, 4, "saturated", "reveal_less", "reveal_more", 3) == 0
    assert remedied_reveal(0, 3, "saturated", "reveal_less", "reveal_more", 1) == 0
    assert remedied_reveal(0, 3, "collapsed", "reveal_less", "reveal_more", 1) == 1
    assert remedied_reveal(1, 4, "collapsed", "reveal_less", "reveal_more", 5) == 3
    assert remedied_reveal(2, 3, "collapsed", "reveal_less", "reveal_more", 1) == 2
    assert remedied_reveal(2, 3, "saturated", "none", "reveal_more", 1) == 2
    assert remedied_reveal(0, 3, "collapsed", "reveal_less", "none", 1) == 0
    assert remedied_reveal(1, 3, "ok", "reveal_less", "reveal_more", 1) == 1


def _staged_ctx(model_tok, reward):
    model, tok, rows = model_tok
    cfg = Config.build({"model": "tiny", "task": "tree_test_env", "max_completion_length": 6, "micro_batch_size": 16,
                        "rollout_strategy": "mcts_staged", "num_generations": 3})
    scorer = BatchScorer(RewardScorer([RewardFn("staged", reward, 1.0)]))
    ctx = RolloutContext(cfg, tok, rows, policy=model, scorer=scorer, generator=torch.Generator().manual_seed(1))
    ctx.environment = lambda row: CountEnv()
    ctx.new_step(0)
    return ctx


def test_mcts_staged_saturated_group_is_redrawn_from_a_shorter_prefix(model_tok):
    """Stage 0 reveals 2 of CountEnv's 3 steps; the reward is 1 whenever 2 steps are revealed (every group
    saturates), else 1 on odd rows only, so the redraw from 1 revealed step has rewards [0, 1, 0], [1, 0, 1]."""
    def reward(prompts=None, completions=None, mcts_revealed_steps=None, **kw):
        return [1.0 if k >= 2 else float(i % 2) for i, k in enumerate(mcts_revealed_steps)]

    ctx = _staged_ctx(model_tok, reward)
    b = run_strategy(ctx, "mcts_staged", [0, 1], step=0, mcts_simulations=3, max_turn_tokens=4)
    assert b.columns["mcts_revealed_steps"] == [1] * 6 and b.columns["mcts_remedy"] == ["reveal_less"] * 6
    m = ctx.metrics
    assert (m["mcts/saturated_groups"], m["mcts/collapsed_groups"], m["mcts/remedied_groups"],
            m["mcts/saturated_after"], m["mcts/collapsed_after"]) == (1.0, 0.0, 1.0, 0.0, 0.0)
    for r, ep in enumerate(b.columns["episode"]):   # the redrawn rows: 1 injected turn, then 2 sampled ones
        spans = b.span_ids[r]
        for k, turn in enumerate(ep["turns"]):
            assert bool((b.token_origin[r][spans == turn["span"]] == (INJECTED if k < 1 else SAMPLED)).all())
    # remedy off: the saturated groups stay (and are reported)
    ctx = _staged_ctx(model_tok, reward)
    b = run_strategy(ctx, "mcts_staged", [0, 1], step=0, mcts_simulations=3, max_turn_tokens=4,
                     mcts_saturation_remedy="none")
    assert b.columns["mcts_revealed_steps"] == [2] * 6 and b.columns["mcts_remedy"] == [""] * 6
    assert ctx.metrics["mcts/saturated_groups"] == 1.0 and ctx.metrics["mcts/saturated_after"] == 1.0
    with pytest.raises(ConfigError, match="mcts_saturation_remedy"):
        run_strategy(ctx, "mcts_staged", [0], step=0, mcts_simulations=1, mcts_saturation_remedy="drop")


def test_mcts_staged_collapsed_group_is_redrawn_from_a_longer_prefix(model_tok):
    """At a late stage nothing is revealed; every completion fails (reward 0: collapse), so each group is drawn
    again from 1 revealed step, where the reward is 0.5 on even rows (rewards [0.5, 0, 0.5], [0, 0.5, 0])."""
    def reward(prompts=None, completions=None, mcts_revealed_steps=None, **kw):
        return [0.5 * (i % 2 == 0) if k >= 1 else 0.0 for i, k in enumerate(mcts_revealed_steps)]

    ctx = _staged_ctx(model_tok, reward)
    ctx.new_step(40)
    b = run_strategy(ctx, "mcts_staged", [0, 1], step=40, mcts_simulations=2, max_turn_tokens=4)
    assert b.columns["mcts_revealed_steps"] == [1] * 6 and b.columns["mcts_remedy"] == ["reveal_more"] * 6
    m = ctx.metrics
    assert (m["mcts/saturated_groups"], m["mcts/collapsed_groups"], m["mcts/remedied_groups"],
            m["mcts/collapsed_after"]) == (0.0, 1.0, 1.0, 0.0)


# --------------------------------------------------------------------------- turn-PPO critic
def _prefix_batch(**cols):
    b = RolloutBatch.__new__(RolloutBatch)
    b.columns = cols
    return b


def test_mcts_staged_advantage_by_hand():
    nan = float("nan")
    r = torch.tensor([1.0, 1.0, 1.0, 0.0, 1.0, 1.0, nan, 1.0, 0.0])
    g = torch.tensor([0, 0, 0, 0, 1, 1, 2, 2, 2])
    v = [0.5, 1.0, 0.5, 0.25, 0.2, 0.6, 0.3, 0.5, 0.5]
    opt = [1.0, 1.0, 1.0, 0.0, 1.0, 0.0, 1.0, 1.0, 1.0]
    b = _prefix_batch(mcts_prefix_value=v, mcts_prefix_optimistic=opt, mcts_prefix_pessimistic=[0.0] * 9)
    a = mcts_staged_advantage(r, g, batch=b)
    # group 0: u = r - V = [0.5, 0, 0.5, -0.25], mean 0.1875 -> [0.3125, -0.1875, 0.3125, -0.4375]
    # group 1 (every completion succeeded: GRPO gives 0): u = [0.8, 0.4], mean 0.6 -> [0.2, -0.2]
    # group 2: the NaN row is left out and gets 0; u = [0.5, -0.5], mean 0 -> [0.5, -0.5]
    want = [0.3125, -0.1875, 0.3125, -0.4375, 0.2, -0.2, 0.0, 0.5, -0.5]
    assert torch.allclose(a, torch.tensor(want), atol=1e-6)
    assert float(group_zscore(r, g)[4:6].abs().sum()) == 0.0  # the saturated group under GRPO
    # std scaling: group 1's u std = sqrt(2 * 0.2^2 / 1) = 0.282843 -> +-0.2 / (0.282843 + 1e-4) = +-0.706857
    a = mcts_staged_advantage(r, g, batch=b, mcts_adv_scale="std")
    assert abs(float(a[4]) - 0.706857) < 1e-5 and abs(float(a[5]) + 0.706857) < 1e-5
    # with a floor of 0.5 the nearly collapsed group is not blown up: +-0.2 / (0.5 + 1e-4) = +-0.399920
    a = mcts_staged_advantage(r, g, batch=b, mcts_adv_scale="std", mcts_adv_std_floor=0.5)
    assert abs(float(a[4]) - 0.399920) < 1e-5
    # alpha 0.5 on group 0: u = [0.75, 0.5, 0.75, -0.125], mean 0.46875 -> [0.28125, 0.03125, 0.28125, -0.59375]
    a = mcts_staged_advantage(r, g, batch=b, mcts_adv_alpha=0.5)
    assert torch.allclose(a[:4], torch.tensor([0.28125, 0.03125, 0.28125, -0.59375]), atol=1e-6)
    # the optimistic baseline on group 1: u = [1 - 1, 1 - 0] = [0, 1], mean 0.5 -> [-0.5, 0.5]
    a = mcts_staged_advantage(r, g, batch=b, mcts_adv_baseline="optimistic")
    assert torch.allclose(a[4:6], torch.tensor([-0.5, 0.5]))
    # relations: baseline none (or alpha 0) is plain centring; std with no floor and one prefix value per group
    # (mode stage: V constant within the group) is GRPO's z-score
    centred = torch.tensor([0.25, 0.25, 0.25, -0.75, 0.0, 0.0, 0.0, 0.5, -0.5])
    assert torch.allclose(mcts_staged_advantage(r, g, batch=b, mcts_adv_baseline="none"), centred)
    assert torch.allclose(mcts_staged_advantage(r, g, batch=b, mcts_adv_alpha=0.0), centred)
    const = _prefix_batch(mcts_prefix_value=[0.7] * 4 + [0.1] * 2 + [0.9] * 3)
    assert torch.allclose(mcts_staged_advantage(r, g, batch=const, mcts_adv_scale="std"), group_zscore(r, g),
                          atol=1e-6)
    with pytest.raises(ConfigError, match="rollout_strategy mcts_staged"):
        mcts_staged_advantage(r, g, batch=_prefix_batch())
    with pytest.raises(ConfigError, match="mcts_adv_baseline"):
        mcts_staged_advantage(r, g, batch=b, mcts_adv_baseline="max")


def test_mcts_prefix_stats_by_hand():
    # root -> a -> (leaf a1 = 1, leaf a2 = 0); root -> leaf b = 0.5; a2 backed up twice
    root = StepNode()
    a = StepNode(ids=[1], parent=root, depth=1)
    a1 = StepNode(ids=[2], parent=a, depth=2, ended_by="done")
    a2 = StepNode(ids=[3], parent=a, depth=2, ended_by="done")
    bleaf = StepNode(ids=[4], parent=root, depth=1, ended_by="done")
    unvisited = StepNode(ids=[5], parent=a, depth=2, ended_by="done")  # a completion leaf: not backed up
    root.children, a.children = [a, bleaf], [a1, a2, unvisited]
    for leaf, v in ((a1, 1.0), (a2, 0.0), (a2, 0.0), (bleaf, 0.5)):
        backpropagate(leaf, v)
    # a: visits 3, value (1 + 0 + 0) / 3; leaves 1 and 0; root: visits 4, value 1.5 / 4 = 0.375
    assert prefix_stats(a) == {"value": 1 / 3, "optimistic": 1.0, "pessimistic": 0.0, "visits": 3}
    assert prefix_stats(root) == {"value": 0.375, "optimistic": 1.0, "pessimistic": 0.0, "visits": 4}
    assert prefix_stats(bleaf) == {"value": 0.5, "optimistic": 0.5, "pessimistic": 0.5, "visits": 1}


def test_mcts_staged_tree_mode_spreads_rows_over_sibling_prefixes(model_tok):
    """CountEnv: 3-step trajectories; stage 0 reveals up to floor(0.75 * 3) = 2 steps, so rows j = 0, 1, 2 start
    after j mod 3 = 0, 1, 2 steps; every completion succeeds (saturated): each row's prefix moves one step up,
    not above the root, to 0, 0, 1."""
    ctx = _staged_ctx(model_tok, lambda completions=None, **kw: [1.0] * len(completions))
    b = run_strategy(ctx, "mcts_staged", [0], step=0, mcts_simulations=2, max_turn_tokens=4, mcts_prefix_mode="tree")
    assert b.columns["mcts_revealed_steps"] == [0, 0, 1] and b.columns["mcts_remedy"] == ["reveal_less"] * 3
    assert ctx.metrics["mcts/saturated_groups"] == 1.0
    for r, k in enumerate(b.columns["mcts_revealed_steps"]):
        assert int((b.token_origin[r] == INJECTED).any()) == (k > 0)
    # the depth-0 rows start at the root: 2 simulations, each valued 1, the root's value is mcts/root_value
    assert b.columns["mcts_prefix_visits"][:2] == [2, 2] and b.columns["mcts_prefix_value"][:2] == [1.0, 1.0]
    assert b.columns["mcts_prefix_value"][0] == ctx.metrics["mcts/root_value"]
    assert 1 <= b.columns["mcts_prefix_visits"][2] <= 2  # a node on the most-visited path: at most the root's
    assert b.columns["mcts_prefix_optimistic"] == b.columns["mcts_prefix_pessimistic"] == [1.0] * 3
    with pytest.raises(ConfigError, match="mcts_prefix_mode"):
        run_strategy(ctx, "mcts_staged", [0], step=0, mcts_simulations=1, mcts_prefix_mode="mixed")


def test_turn_ppo_gae_by_hand():
    # rewards [0, 0, 1], values [0.2, 0.5, 0.8], gamma 0.9, lambda 0.8 (gamma * lambda = 0.72):
    # k=2: delta = 1 + 0 - 0.8 = 0.2, A = 0.2;  k=1: delta = 0.9 * 0.8 - 0.5 = 0.22, A = 0.22 + 0.72 * 0.2 = 0.364
    # k=0: delta = 0.9 * 0.5 - 0.2 = 0.25, A = 0.25 + 0.72 * 0.364 = 0.51208; targets = A + V
    adv, ret = turn_gae([0.0, 0.0, 1.0], [0.2, 0.5, 0.8], 0.9, 0.8)
    assert all(abs(x - y) < 1e-9 for x, y in zip(adv, [0.51208, 0.364, 0.2]))
    assert all(abs(x - y) < 1e-9 for x, y in zip(ret, [0.71208, 0.864, 1.0]))
    # gamma = lambda = 1, V = 0: every turn's advantage is the sum of the rewards from it on
    assert turn_gae([0.25, 0.0, 1.0], [0.0] * 3, 1.0, 1.0)[0] == [1.25, 1.0, 1.0]
    # spans 1 (turn), 2 (obs), 3 (turn), 0 (pad): turn 3 starts after the 2 + 3 tokens of spans 1 and 2
    s = torch.tensor([1, 1, 2, 2, 2, 3, 0, 0])
    assert turn_starts(s, [1, 3]) == [0, 5]
    # whitening: mean 3, unbiased var of [1, 3, 5] = 4 -> [-1, 0, 1] (the masked entry stays 0)
    w = masked_whiten(torch.tensor([1., 3., 5., 9.]), torch.tensor([1, 1, 1, 0]))
    assert torch.allclose(w, torch.tensor([-1., 0., 1., 0.]), atol=1e-6)


def _two_episode_batch(tok):
    """Row 0: turn (3 tokens), obs (2), turn (2); row 1: one turn (4 tokens)."""
    e0 = Episode([5, 6]).add_model_turn([7, 8, 9], [-1.0] * 3).add_observation([10, 11]).add_model_turn(
        [12, 13], [-1.0] * 2)
    e1 = Episode([5, 6, 7]).add_model_turn([8, 9, 10, 11], [-1.0] * 4)
    b = pack_episodes(tok, [e0, e1], [{"prompt": "a"}, {"prompt": "b"}], [0, 1], [0, 1])
    b.columns["episode"] = [{"turns": [{"span": 1, "reward": 0.5}, {"span": 3, "reward": None}]},
                            {"turns": [{"span": 1, "reward": None}]}]
    return b


def test_turn_ppo_critic_advantages_training_and_state(model_tok):
    model, tok, _ = model_tok
    b = _two_episode_batch(tok)
    r = torch.tensor([1.0, -2.0])
    c = TurnPPOCritic(turn_ppo_whiten=False, turn_ppo_critic_epochs=20, turn_ppo_critic_lr=1e-2)
    a = c(r, torch.tensor([0, 1]), batch=b, policy=model)
    # first call: zero-initialised head, V = 0, gamma = lambda = 1 -> every turn gets its row's return:
    # row 0: turns 1 and 3 get 1.0 (the env reward 0.5 is off by default), the observation 0; row 1: -2
    assert a[0].tolist()[:7] == [1.0, 1.0, 1.0, 0.0, 0.0, 1.0, 1.0] and a[1].tolist()[:4] == [-2.0] * 4
    # the head learned: its values move towards the targets (1, 1, -2)
    assert c.last_value_loss is not None and c.last_value_loss < 0.5 * (1 + 1 + 4) / 3
    a2 = c(r, torch.tensor([0, 1]), batch=b, policy=model)
    assert not torch.equal(a2, a)
    # step rewards on: row 0 turn 1 gets 0.5 more (r_1 = 0.5, r_3 = 1 -> A_1 = 1.5 with V = 0)
    c3 = TurnPPOCritic(turn_ppo_whiten=False, turn_ppo_step_rewards=True)
    assert c3(r, torch.tensor([0, 1]), batch=b, policy=model)[0, 0] == 1.5
    # state round trip: a fresh critic loaded from the state gives the same advantages
    fresh = TurnPPOCritic(turn_ppo_whiten=False, turn_ppo_critic_epochs=20, turn_ppo_critic_lr=1e-2)
    fresh.load_state_dict(c.state_dict())
    assert torch.equal(fresh(r, torch.tensor([0, 1]), batch=b, policy=model),
                       c(r, torch.tensor([0, 1]), batch=b, policy=model))
    with pytest.raises(ConfigError, match="multi-turn episodes"):
        b.columns.pop("episode")
        TurnPPOCritic()(r, torch.tensor([0, 1]), batch=b, policy=model)


# --------------------------------------------------------------------------- smoke runs through the trainer
def _train(tmp_path, recipe, **keys):
    from grpolab.recipes import recipe_overrides
    args = {**recipe_overrides(recipe), "model": "tiny", "task": "tree_test_env", "steps": 2, "prompts_per_step": 2,
            "max_completion_length": 6, "max_turn_tokens": 4, "max_episode_tokens": 24,
            "learning_rate": 3e-3, "eval_before": False, "eval_after": False, "tensorboard": False,
            "save_steps": 1, "micro_batch_size": 16, "out": str(tmp_path / recipe), **keys}
    t = Trainer(Config.build(args), log=lambda *a: None)
    t.train(progress=False)
    rows = read_metrics(args["out"])
    assert len(rows) == 2 and all(r["skipped"] == 0 and r["loss"] is not None for r in rows)
    return t, rows, args


def test_tree_grpo_recipe_trains(tmp_path):
    t, rows, _ = _train(tmp_path, "tree_grpo", eval_after=True, eval_problems=2)
    assert rows[0]["rollout/tree/sampled_tokens"] <= rows[0]["rollout/tree/row_model_tokens"]
    assert 1.0 <= rows[0]["rollout/agent/turns_per_episode"] <= 3.0  # CountEnv: 3 turns, or the token budget


def test_mcts_staged_recipe_trains(tmp_path):
    _, rows, _ = _train(tmp_path, "mcts_staged_grpo", mcts_simulations=2)
    assert rows[0]["rollout/mcts/reveal_fraction"] == 0.75
    # the saturation / collapse rates are logged every step (shares of the step's groups)
    assert all(0.0 <= r[f"rollout/mcts/{k}"] <= 1.0 for r in rows
               for k in ("saturated_groups", "collapsed_groups", "remedied_groups", "saturated_after",
                         "collapsed_after"))


def test_turn_ppo_recipe_trains_and_resumes_its_critic(tmp_path):
    t, rows, args = _train(tmp_path, "turn_ppo", num_generations=2)  # the agent rollout, G episodes per prompt
    critic = t.components["advantage/turn_ppo"].fn
    assert critic.head is not None
    from grpolab.train.checkpoint import read_state
    state = read_state(Path(args["out"]) / "checkpoints" / "step_000002")
    saved = state["components"]["advantage/turn_ppo"]["head"]["weight"]
    assert torch.equal(saved, critic.head.weight.detach())
    t2 = Trainer(Config.build({**args, "steps": 3}), resume=True, log=lambda *a: None)
    assert torch.equal(t2.components["advantage/turn_ppo"].fn.head.weight.detach(), saved)


@pytest.fixture
def roomy_tiny(monkeypatch):
    """The tiny model with 8192 positions (its tokenizer has one token per character and the agent tasks' prompts
    are longer than its 512 positions; rotary embeddings have no table, so only the configured limit changes)."""
    from grpolab.model import loading
    orig = loading.build_tiny

    def build(*a, **k):
        model, tok = orig(*a, **k)
        model.config.max_position_embeddings = 8192
        return model, tok
    monkeypatch.setattr(loading, "build_tiny", build)


@pytest.mark.parametrize("recipe", ["tree_grpo", "mcts_staged_grpo", "turn_ppo"])
def test_recipe_trains_on_its_own_task(recipe, tmp_path, roomy_tiny):
    """Each recipe as shipped (its task: gridworld), 2 steps on the tiny model; the tree ones with smaller trees."""
    from grpolab.recipes import recipe_overrides
    rec = recipe_overrides(recipe)
    assert rec["task"] == "gridworld"
    small = {"tree_grpo": {"num_generations": 4}, "mcts_staged_grpo": {"mcts_simulations": 2, "num_generations": 2},
             "turn_ppo": {"num_generations": 2}}[recipe]
    args = {**rec, "model": "tiny", "steps": 2, "prompts_per_step": 1, "max_completion_length": 8,
            "max_prompt_length": 4096, "max_turns": 2, "max_episode_tokens": 160, "eval_before": False,
            "eval_after": False, "tensorboard": False, "out": str(tmp_path / recipe), **small}
    t = Trainer(Config.build(args), log=lambda *a: None)
    t.train(progress=False)
    rows = read_metrics(args["out"])
    assert len(rows) == 2 and all(r["skipped"] == 0 and r["loss"] is not None for r in rows)
    assert rows[-1]["rollout/agent/turns_per_episode"] >= 1
