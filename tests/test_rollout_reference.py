"""AAPO's reference rollout (rollouts/reference.py): r_ref from the frozen initial policy, one per row."""
import copy

import pytest
import torch

from grpolab.config import Config
from grpolab.recipes import recipe_overrides
from grpolab.registry import ROLLOUT_STRATEGIES
from grpolab.rewards import BatchScorer, RewardFn, RewardScorer
from grpolab.rollouts.context import RolloutContext
from grpolab.train.metrics import read_metrics
from grpolab.train.trainer import Trainer

from _helpers import tiny_model_on_repeat

G, MAX_LEN, SEED = 3, 5, 1


@pytest.fixture(scope="module")
def parts():
    _, rows, model, tok = tiny_model_on_repeat(8)
    cfg = Config.build({"model": "tiny", "task": "repeat", "num_generations": G, "max_completion_length": MAX_LEN,
                        "micro_batch_size": 16, "rollout_strategy": "aapo_reference"})
    return cfg, model, tok, rows


def length_reward(calls):
    """A reward that records the completion ids it is given and scores each by its length (distinguishable)."""
    def reward(completions, completion_ids, **kw):
        calls.append([list(ids) for ids in completion_ids])
        return [float(len(ids)) for ids in completion_ids]
    return reward


def context(parts, policy, reference, calls):
    cfg, _, tok, rows = parts
    scorer = BatchScorer(RewardScorer([RewardFn("len", length_reward(calls), 1.0)]))
    return RolloutContext(cfg, tok, rows, policy=policy, scorer=scorer, reference=reference,
                          generator=torch.Generator().manual_seed(SEED))


def ids_of(batch):
    return [row[:int(n)].tolist() for row, n in zip(batch.completion_ids, batch.completion_attention_mask.sum(-1))]


def run_strategy(ctx, uids, **params):
    ctx.new_step(0)
    offset = ctx.allocate_groups(len(uids))
    return ROLLOUT_STRATEGIES.get("aapo_reference")(ctx=ctx, rows=[ctx.rows[u] for u in uids], uids=uids,
                                                     group_offset=offset, **params)


@pytest.fixture(scope="module")
def changed_policy(parts):
    """The reference is the initial model; the policy is that model with its weights changed (as after training)."""
    _, model, _, _ = parts
    reference = copy.deepcopy(model).requires_grad_(False)
    policy = copy.deepcopy(model)
    gen = torch.Generator().manual_seed(7)
    with torch.no_grad():
        for p in policy.parameters():
            p.add_(torch.randn(p.shape, generator=gen) * 0.5)
    return policy, reference


def test_reference_rows_come_from_the_frozen_model_and_are_not_trained_on(parts, changed_policy):
    policy, reference = changed_policy
    calls = []
    uids = [4, 0, 7]
    batch = run_strategy(context(parts, policy, reference, calls), uids, aapo_ref_samples="row")
    assert len(calls) == 2  # the policy's completions, then the reference's
    policy_ids, ref_ids = calls
    assert batch.num_rows == len(uids) * G and ids_of(batch) == policy_ids  # reference rows are not batch rows
    assert batch.rewards is not None  # scored: the trainer does not score again (nor hand ref_reward to rewards)
    # the same token draws, replayed by hand: policy first, then the frozen initial model
    replay = context(parts, policy, None, [])
    assert ids_of(replay.generate([replay.rows[u] for u in uids], uids, group_offset=0)) == policy_ids
    assert ids_of(replay.generate([replay.rows[u] for u in uids], uids, group_offset=0, model=reference)) == ref_ids
    # ... which the changed policy would not have drawn at that point
    again = context(parts, policy, None, [])
    again.generate([again.rows[u] for u in uids], uids, group_offset=0)
    assert ids_of(again.generate([again.rows[u] for u in uids], uids, group_offset=0, model=policy)) != ref_ids
    # one r_ref per row: the reward (= length) of its own reference completion, paired by index
    assert batch.columns["ref_reward"] == [float(len(ids)) for ids in ref_ids]


def test_reference_rollout_one_sample_per_prompt_and_ragged_groups(parts, changed_policy):
    policy, reference = changed_policy
    calls = []
    ctx = context(parts, policy, reference, calls)
    b = run_strategy(ctx, [1, 2], budgets=[2, 4], aapo_ref_samples="prompt")
    assert b.num_rows == 6 and len(calls[1]) == 2  # one reference completion per prompt
    want = [float(len(calls[1][0]))] * 2 + [float(len(calls[1][1]))] * 4  # every row of a group: its prompt's r_ref
    assert b.columns["ref_reward"] == want
    assert ctx.metrics["aapo_ref_reward"] == pytest.approx(sum(len(i) for i in calls[1]) / 2)
    calls.clear()
    b = run_strategy(ctx, [1, 2], budgets=[2, 4], aapo_ref_samples="row")
    assert len(calls[1]) == 6 and b.columns["ref_reward"] == [float(len(i)) for i in calls[1]]


def test_reference_rollout_needs_a_reference_model(parts):
    _, model, _, _ = parts
    with pytest.raises(RuntimeError, match="no reference model"):
        run_strategy(context(parts, model, None, []), [0])
    with pytest.raises(ValueError, match="aapo_ref_samples"):
        run_strategy(context(parts, model, model, []), [0], aapo_ref_samples="group")


def test_aapo_recipe_trains_with_reference_samples(tiny_args):
    args = {**recipe_overrides("aapo"), **tiny_args, "steps": 2}
    cfg = Config.build(args)
    assert cfg.beta == 0 and cfg.rollout_strategy == "aapo_reference"
    t = Trainer(cfg, log=lambda *a: None)
    assert t.ref_model is not None  # beta = 0, yet the reference rollout needs the frozen initial policy
    initial = {n: p.detach().clone() for n, p in t.ref_model.named_parameters()}
    assert not any(p.requires_grad for p in t.ref_model.parameters())
    t.ctx.new_step(0)
    batch = t.rollout()
    col = batch.columns["ref_reward"]
    assert len(col) == batch.num_rows and all(v is None or isinstance(v, float) for v in col)
    batch.scalar_rewards = t.scorer.scalar(batch)
    t.compute_advantages(batch)  # the reference baseline finds its column: no error
    t.train(progress=False)
    rows = read_metrics(args["out"])
    assert len(rows) == 2 and all(r["skipped"] == 0 and r["loss"] is not None for r in rows)
    assert all("rollout/aapo_ref_reward" in r for r in rows)
    changed = any(not torch.equal(initial[n], p) for n, p in t.model.named_parameters())
    assert changed and all(torch.equal(initial[n], p) for n, p in t.ref_model.named_parameters())


def test_aapo_recipe_with_lora_uses_the_base_model_as_reference(tiny_args):
    args = {**recipe_overrides("aapo"), **tiny_args, "steps": 1, "use_lora": True,
            "lora_target_modules": "q_proj,v_proj"}
    t = Trainer(Config.build(args), log=lambda *a: None)
    assert t.ref_model is None  # the base model with adapters off is the reference
    with torch.no_grad():  # make the adapters matter
        for n, p in t.model.named_parameters():
            if "lora_B" in n:
                p.add_(1.0)
    x = torch.tensor([[1, 2, 3]])
    with t.ctx.reference_policy() as ref:
        base = ref(x).logits
    assert not torch.allclose(base, t.model(x).logits)  # adapters back on after the block
    t.train(progress=False)
    assert "rollout/aapo_ref_reward" in read_metrics(args["out"])[0]


def test_aapo_without_reference_rollout_stops_with_the_fix(tiny_args):
    args = {**recipe_overrides("aapo"), **tiny_args, "steps": 1, "rollout_strategy": "plain"}
    args.pop("aapo_ref_samples")  # a parameter of the aapo_reference rollout this run does not select
    t = Trainer(Config.build(args), log=lambda *a: None)
    with pytest.raises(ValueError, match="rollout_strategy: aapo_reference"):
        t.train(progress=False)
    ema = Trainer(Config.build({**args, "aapo_baseline": "ema", "out": args["out"] + "_ema"}), log=lambda *a: None)
    assert ema.ref_model is None  # plain rollout, beta 0: no reference model kept
    ema.train(progress=False)
