"""A RolloutContext built from its parts, without a Trainer: rollout strategies and batch stages run on it."""
import pytest
import torch

from grpolab.config import Config
from grpolab.data import model_texts
from grpolab.model.loading import load_policy
from grpolab.registry import BATCH_STAGES, ROLLOUT_STRATEGIES
from grpolab.rewards import BatchScorer, RewardFn, RewardScorer
from grpolab.rollouts.context import RolloutContext
from grpolab.tasks import get_task

G, MAX_LEN = 3, 5


@pytest.fixture(scope="module")
def parts():
    task = get_task("repeat")
    rows = [{**r, "hints": [f"the digit is {r['digit']}"]} for r in task.train_rows[:12]]  # for hint strategies
    model, tok = load_policy("tiny", task_texts=model_texts(rows), seed=0, log=lambda *a: None)
    model.eval()
    cfg = Config.build({"model": "tiny", "task": "repeat", "num_generations": G, "max_completion_length": MAX_LEN,
                        "micro_batch_size": 16})
    return cfg, model, tok, rows, [RewardFn(n, f, w) for n, f, w in task.rewards]


def make_ctx(parts, logs=None):
    cfg, model, tok, rows, rewards = parts
    scorer = BatchScorer(RewardScorer(rewards))
    return RolloutContext(cfg, tok, rows, policy=model, scorer=scorer, generator=torch.Generator().manual_seed(1),
                          log=(logs.append if logs is not None else lambda *a: None))


def run_strategy(ctx, name, uids, **params):
    ctx.new_step(3)
    offset = ctx.allocate_groups(len(uids))
    return ROLLOUT_STRATEGIES.get(name)(ctx=ctx, rows=[ctx.rows[u] for u in uids], uids=uids, group_offset=offset,
                                        **params)


def test_context_from_parts_exposes_what_components_use(parts):
    cfg, model, tok, rows, _ = parts
    ctx = make_ctx(parts)
    assert ctx.cfg is cfg and ctx.tokenizer is tok and ctx.rows is rows and ctx.policy is model
    assert ctx.sampling_generator is ctx.generator  # one generator on a CPU run
    ctx.new_step(7)
    assert ctx.step == 7 and ctx.allocate_groups(2) == 0 and ctx.allocate_groups(3) == 2
    ctx.metric("x", 1)
    assert ctx.metrics == {"x": 1.0}
    ctx.new_step(8)
    assert ctx.step == 8 and ctx.metrics == {} and ctx.allocate_groups(1) == 0
    # a callable policy is asked each time (the trainer's off-policy snapshot changes between steps)
    calls = []
    lazy = RolloutContext(cfg, tok, rows, policy=lambda: calls.append(1) or model, scorer=None,
                          generator=torch.Generator())
    assert lazy.policy is model and lazy.policy is model and len(calls) == 2


def test_plain_strategy_on_a_context_without_trainer(parts):
    ctx = make_ctx(parts)
    uids = [4, 0, 7]
    b = run_strategy(ctx, "plain", uids)
    assert b.num_rows == len(uids) * G and b.completion_ids.shape[1] <= MAX_LEN
    assert b.group_ids.tolist() == [g for g in range(3) for _ in range(G)]
    assert b.prompt_uids.tolist() == [u for u in uids for _ in range(G)]
    assert b.rewards is None  # plain leaves scoring to the caller
    scalar = ctx.score(b)
    assert b.rewards.shape == (b.num_rows, 1) and b.reward_names == ["match"] and scalar.shape == (b.num_rows,)
    assert not torch.isnan(scalar).any() and torch.equal(scalar, ctx.scalar(b)) and ctx.reward_errors == 0
    lp = ctx.logprobs(b)  # teacher-forced under the policy: the behaviour log-probs it was sampled with
    assert torch.allclose(lp, b.behavior_logprobs * b.completion_attention_mask, atol=1e-4)


def test_hint_strategy_on_a_context_without_trainer(parts):
    ctx = make_ctx(parts)
    uids = [1, 2]
    b = run_strategy(ctx, "guide", uids, success_threshold=1.0, guide_hint_level=0, guide_keep_failed=True)
    assert b.rewards is not None and not torch.isnan(b.rewards).all()  # guide scores the batch itself
    assert set(b.group_ids.tolist()) == {0, 1} and set(b.prompt_uids.tolist()) == set(uids)
    for g, u in zip((0, 1), uids):
        sel = b.group_ids == g
        assert (b.prompt_uids[sel] == u).all() and int(sel.sum()) in (G, 2 * G)  # + G hinted rows if all failed
    hinted = [lv > 0 for lv in b.columns["hint_level"]]
    assert len(hinted) == b.num_rows and any(hinted)  # the random tiny model fails: hints were needed
    assert all(p == ctx.rows[int(u)]["prompt"] for p, u in zip(b.columns["prompt"], b.prompt_uids))  # hint-free q


def test_batch_stage_on_a_context_without_trainer(parts):
    ctx = make_ctx(parts)
    b = run_strategy(ctx, "plain", [0, 1, 2, 3])
    scalar = ctx.score(b)
    from grpolab.algorithms import group_zscore
    b.scalar_rewards = scalar
    b.advantages = group_zscore(scalar, b.group_ids)[:, None] * b.completion_mask
    stage = BATCH_STAGES.get("cppo_prune")(cppo_pruning_rate=0.5, cppo_scope="group", cppo_refill=True, seed=0)
    out = stage(batch=b, ctx=ctx)
    assert out.num_rows == b.num_rows  # pruned, then refilled to the same size
    new = out.group_ids >= 4  # refill groups take fresh ids after the rollout's 0..3
    assert new.any() and (~new).any()
    assert out.rewards is not None and not torch.isnan(out.scalar_rewards).any()
    assert out.advantages.shape == out.completion_mask.shape
    assert not set(out.prompt_uids[new].tolist()) & {0, 1, 2, 3}  # new questions
