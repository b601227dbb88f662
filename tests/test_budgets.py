"""Ragged groups, per-prompt temperatures and the budget-aware samplers (Knapsack RL, AR3PO, GAIN-RL,
automatic groups, ERPO, Rollout-GDRO): hand values, exact restore, ragged pipeline, end to end."""
import io
import math
from types import SimpleNamespace

import pytest
import torch

from grpolab.algorithms import group_stats
from grpolab.algorithms.advantages import group_zscore
from grpolab.batch import INJECTED, SAMPLED
from grpolab.config import Config, ConfigError
from grpolab.model.loading import build_tiny
from grpolab.model.logprobs import completion_logprobs
from grpolab.generation.plain import plain_rollout
from grpolab.rollouts.strategies import ROLLOUT_STRATEGIES
from grpolab.prompts import SAMPLERS
from grpolab.prompts.budgets import (angle_concentration, knapsack_allocate, knapsack_value, round_allocation,
                                      sqrt_allocation)
from grpolab.tasks import get_task
from grpolab.train.trainer import Trainer, build_sampler
from grpolab.train.checkpoint import decode_state, encode_state

T = torch.tensor
ROWS = get_task("repeat").train_rows
DISTINCT = list({r["prompt"]: r for r in ROWS}.values())[:3]  # three rows with different prompts


@pytest.fixture(scope="module")
def tiny():
    model, tok = build_tiny([r["prompt"] for r in ROWS] + ["0123456789"], seed=0)
    return model.eval(), tok


def rollout(tiny, G, temp, rows=ROWS[:3], seed=5, length=6):
    model, tok = tiny
    g = torch.Generator().manual_seed(seed)
    return plain_rollout(model, tok, rows, list(range(len(rows))), num_generations=G, max_completion_length=length,
                         max_prompt_length=64, temperature=temp, generator=g)


def fb(sampler, uids, rewards):
    sampler.feedback(prompt_uids=T(uids), rewards=T(rewards, dtype=torch.float32), group_ids=T(uids),
                     reward_matrix=T(rewards)[:, None], lengths=torch.ones(len(uids)), step=0)


# ----------------------------------------------------------------------------- A. ragged generation

def test_int_path_is_unchanged_and_equal_ragged_counts_give_the_same_tokens(tiny):
    a = rollout(tiny, 4, 0.9)
    # golden: the first row the int path produces (same seed, same model); pinned so that a change of the
    # sampler shows up here (the default exponential-race sampler)
    assert a.completion_ids[0].tolist() == [14, 16, 0, 9, 5, 0]
    assert torch.equal(a.completion_ids, rollout(tiny, 4, 0.9).completion_ids)  # same seed -> same tokens
    # the ragged path (repeat index + per-row temperature tensor) with equal counts is bit-identical
    b = rollout(tiny, [4, 4, 4], [0.9, 0.9, 0.9])
    assert torch.equal(a.completion_ids, b.completion_ids)
    assert torch.equal(a.behavior_logprobs, b.behavior_logprobs)
    assert torch.equal(a.truncated, b.truncated)


def test_ragged_groups_ids_columns_and_own_temperature_logprobs(tiny):
    model, _ = tiny
    temps = [0.0, 1.0, 2.0]
    R = DISTINCT
    b = rollout(tiny, [1, 3, 2], temps, rows=R)
    assert b.num_rows == 6
    assert b.group_ids.tolist() == [0, 1, 1, 1, 2, 2] and b.prompt_uids.tolist() == [0, 1, 1, 1, 2, 2]
    assert b.columns["digit"] == [R[0]["digit"]] + [R[1]["digit"]] * 3 + [R[2]["digit"]] * 2
    assert b.columns["prompt"] == [R[0]["prompt"]] + [R[1]["prompt"]] * 3 + [R[2]["prompt"]] * 2
    assert torch.equal(b.prompt_ids[1], b.prompt_ids[3]) and not torch.equal(b.prompt_ids[0], b.prompt_ids[1])
    # every row's behaviour log-probs are those of its own temperature (greedy = untempered, T = 1)
    for g, t in enumerate(temps):
        rows = (b.group_ids == g).nonzero().flatten()
        sub = b.select(rows)
        lp, _ = completion_logprobs(model, sub, t if t > 0 else 1.0, shared_prefix=False)
        assert torch.allclose(lp * sub.completion_mask, sub.behavior_logprobs, atol=1e-5)
    # greedy row: each token is the argmax, so its untempered log-prob is the row maximum
    sub = b.select([0])
    lp_all = torch.log_softmax(model(input_ids=torch.cat([sub.prompt_ids, sub.completion_ids], 1)).logits, -1)
    P, L = sub.prompt_ids.shape[1], int(sub.completion_mask.sum())
    assert sub.completion_ids[0, :L].tolist() == lp_all[0, P - 1:P - 1 + L].argmax(-1).tolist()


def test_ragged_counts_must_be_positive_and_match_prompts(tiny):
    with pytest.raises(ValueError, match="at least one completion"):
        rollout(tiny, [2, 0, 1], 1.0)
    with pytest.raises(ValueError, match="3 prompts"):
        rollout(tiny, [2, 2], 1.0)


def test_group_advantages_use_each_groups_own_size():
    r = T([1.0, 0.0, 1.0, 1.0, 0.0])
    g = T([0, 0, 1, 1, 1])
    mean, std, count = group_stats(r, g)
    # group 0 (2 rows): mean .5, std sqrt(2 * .25 / 1) = .70711; group 1 (3 rows): mean 2/3,
    # std sqrt((1/9 + 1/9 + 4/9) / 2) = sqrt(1/3) = .57735
    assert count.tolist() == [2, 2, 3, 3, 3]
    assert torch.allclose(mean, T([.5, .5, 2 / 3, 2 / 3, 2 / 3]))
    assert torch.allclose(std, T([.70711, .70711, .57735, .57735, .57735]), atol=1e-5)
    # A = (r - mean) / (std + 1e-4): +-.5 / .70721 = +-.70701; (1/3) / .57745 = .57725; -(2/3) / .57745 = -1.15450
    adv = group_zscore(r, g)
    assert torch.allclose(adv, T([.70701, -.70701, .57725, .57725, -1.15450]), atol=1e-4)


def test_shared_prefix_forward_is_exact_with_ragged_groups(tiny):
    model, _ = tiny
    b = rollout(tiny, [1, 4, 2], [0.7, 1.3, 1.0], rows=DISTINCT, length=8)
    shared, _ = completion_logprobs(model, b, 0.7, shared_prefix=True)
    full, _ = completion_logprobs(model, b, 0.7, shared_prefix=False)
    m = b.completion_mask
    assert torch.allclose(shared * m, full * m, atol=1e-5)


def tiny_cfg(tiny_args, **kw):
    return Config.build({**tiny_args, "steps": 1, "save_steps": 1, **kw})


def test_trainer_step_with_ragged_budgets(tiny_args):
    t = Trainer(tiny_cfg(tiny_args), log=lambda *a: None)
    t.sampler.budgets = lambda idx: [2, 3, 5, 6][:len(idx)]  # a sampler that returns ragged budgets
    seen, collect = [], t.collect
    t.collect = lambda: seen.append(collect()) or seen[-1]
    m = t.train_step()
    assert m["skipped"] == 0 and math.isfinite(m["loss"])
    batch = seen[0][0]
    sizes = torch.bincount(batch.group_ids).tolist()
    assert sizes == [2, 3, 5, 6] and batch.rewards.shape == (16, 1)
    assert [len(set(batch.prompt_uids[batch.group_ids == g].tolist())) for g in range(4)] == [1, 1, 1, 1]
    assert batch.advantages.shape == batch.completion_ids.shape  # the whole step ran on the ragged batch


# ----------------------------------------------------------------------------- B1. Knapsack RL

def test_knapsack_value_and_allocation_hand_values():
    # V(n, p) = (1 - p^n - (1-p)^n) p (1-p)^2: V(2, .5) = .5 * .5 * .25 = .0625; V(n, 1) = V(1, p) = 0
    assert knapsack_value(2, 0.5) == pytest.approx(0.0625)
    assert knapsack_value(8, 1.0) == 0.0 and knapsack_value(1, 0.3) == pytest.approx(0.0)
    # p = (.5, 1, .25), caps [2, 6], total 12: start (2, 2, 2), 6 more by marginal value
    # p=.5: IG=.125, gain(n)=.125*.5^n: n=2 .03125, 3 .015625, 4 .0078125
    # p=1: IG=0; p=.25: IG=.140625, gain(n)=IG*(.25^n*.75+.75^n*.25): 2 .026367, 3 .016479, 4 .011536, 5 .008446
    # six largest: .03125 .026367 .016479 .015625 .011536 .008446 -> p=.5 gets 2, p=.25 gets 4
    assert knapsack_allocate([0.5, 1.0, 0.25], 12, 2, 6) == [4, 2, 6]
    assert knapsack_allocate([0.5, 0.5], 3, 2, 6) == [2, 2]  # budget below the minimum: everyone at min


def test_knapsack_sampler_estimates_and_budgets():
    s = SAMPLERS.get("knapsack")(num_rows=4, seed=0, num_generations=4, knapsack_min_generations=2,
                                 knapsack_max_generations=6, knapsack_smoothing=1.0, knapsack_prior_success=0.5)
    fb(s, [0] * 4 + [1] * 4, [1, 1, 0, 0] + [1, 1, 1, 1])
    # smoothed p = (s + 1 * .5) / (n + 1): prompt 0 (2 + .5) / 5 = .5, prompt 1 4.5 / 5 = .9, unseen .5
    assert torch.allclose(s.success_rate(), T([.5, .9, .5, .5], dtype=torch.float64))
    b = s.budgets([0, 1, 2])
    assert sum(b) == 12 and b[1] == 2 and b[0] == b[2] == 5  # the solved prompt gives its budget away
    with pytest.raises(ConfigError, match="knapsack_min_generations"):
        Config.build({"prompt_sampler": "knapsack", "num_generations": 4, "knapsack_max_generations": 3})


# ----------------------------------------------------------------------------- B2. AR3PO

class FakeCtx:
    """A rollout context over the tiny model whose reward is 1 for prompts in ``good`` (by dataset uid).

    A reused (INJECTED) response scores 1: a stored correct response stays correct.
    """

    def __init__(self, tiny):
        self.model, self.tokenizer = tiny
        self.cfg = SimpleNamespace(max_prompt_length=64, temperature=1.0, micro_batch_size=64,
                                   shared_prefix_forward=True)
        self.generator = torch.Generator().manual_seed(3)
        self.good: set[int] = set()

    def generate(self, rows, uids, *, group_offset, num_generations=None, temperature=None, model=None):
        return plain_rollout(self.model, self.tokenizer, rows, uids, num_generations=num_generations,
                             max_completion_length=5, max_prompt_length=64,
                             temperature=1.0 if temperature is None else temperature, generator=self.generator,
                             group_offset=group_offset)

    def score(self, batch):
        reused = (batch.token_origin == INJECTED).any(-1).tolist()
        batch.rewards = T([[1.0 if int(u) in self.good or r else 0.0] for u, r in zip(batch.prompt_uids, reused)])
        batch.reward_names = ["good"]
        return batch.rewards[:, 0]

    def logprobs(self, batch, model=None):
        return completion_logprobs(self.model, batch, self.cfg.temperature)[0] * batch.completion_attention_mask


def test_ar3po_staged_rollout_and_response_reuse(tiny):
    ctx = FakeCtx(tiny)
    strat = ROLLOUT_STRATEGIES.get("ar3po")(ar3po_stage_size=2, ar3po_max_stages=2)
    rows, uids = DISTINCT, [0, 1, 2]
    ctx.good = {0, 1}
    b1 = strat(ctx, rows, uids, group_offset=0)
    # prompts 0, 1 succeed in stage 1 (2 rows, stop); prompt 2 fails both stages (4 rows) and has nothing stored
    assert torch.bincount(b1.group_ids).tolist() == [2, 2, 4]
    assert bool((b1.token_origin == SAMPLED).all()) and set(strat.store) == {0, 1}
    stored = list(strat.store[1]["tokens"])
    ctx.good = {0}
    b2 = strat(ctx, rows, uids, group_offset=10, budgets=[4, 4, 2])
    # prompt 1 now fails both stages (4 rows) and gets its stored correct response; prompt 2 is capped at 2
    assert torch.bincount(b2.group_ids - 10).tolist() == [2, 5, 2]
    assert b2.group_ids.tolist() == sorted(b2.group_ids.tolist())  # ordered by group
    injected = (b2.token_origin == INJECTED).any(-1)
    assert injected.nonzero().flatten().tolist() == [6]  # the last row of group 11 only
    row = b2.select([6])
    L = int(row.completion_attention_mask.sum())
    assert row.completion_ids[0, :L].tolist() == stored and int(row.prompt_uids) == 1
    assert bool((row.token_origin[0, :L] == INJECTED).all()) and row.completion_mask[0, :L].sum() == L
    tf = completion_logprobs(ctx.model, row, 1.0)[0] * row.completion_attention_mask
    assert torch.allclose(row.behavior_logprobs, tf, atol=1e-6) and row.behavior_logprobs[0, :L].lt(0).all()
    assert b2.rewards[6, 0] == 1.0 and b2.rewards.shape == (9, 1)
    # the store is checkpointed exactly
    again = ROLLOUT_STRATEGIES.get("ar3po")(ar3po_stage_size=2, ar3po_max_stages=2)
    again.load_state_dict(strat.state_dict())
    assert again.store == strat.store and again.reused == strat.reused == 1


def test_ar3po_sampler_caps_solved_prompts_to_one_stage():
    s = SAMPLERS.get("ar3po")(num_rows=3, seed=0, ar3po_stage_size=4, ar3po_max_stages=3)
    fb(s, [0, 0, 1, 1, 2, 2], [1, 1, 1, 0, 0, 0])
    assert s.budgets([0, 1, 2]) == [4, 12, 12]  # all correct -> one stage; mixed / all wrong -> 3 stages


def test_ar3po_end_to_end_injects_only_into_groups_without_a_sampled_success(tiny_args):
    t = Trainer(tiny_cfg(tiny_args, prompt_sampler="ar3po", rollout_strategy="ar3po", ar3po_stage_size=2,
                         ar3po_max_stages=2, success_threshold=0.25, prompts_per_step=6),
                log=lambda *a: None)
    strat = t.strategy.fn
    for u in range(len(t.rows)):  # a stored "correct" response for every prompt: "7"
        strat.store[u] = {"tokens": t.tok("7", add_special_tokens=False)["input_ids"], "truncated": True}
    seen, collect = [], t.collect
    t.collect = lambda: seen.append(collect()) or seen[-1]
    m = t.train_step()
    assert m["skipped"] == 0 and math.isfinite(m["loss"])
    batch = seen[0][0]
    scalar = batch.scalar_rewards
    injected = (batch.token_origin == INJECTED).any(-1)
    assert injected.any() and not injected.all()
    for g in batch.group_ids.unique():
        sel = batch.group_ids == g
        sampled_success = bool((scalar[sel & ~injected] >= 0.25).any())
        assert int(injected[sel].sum()) == (0 if sampled_success else 1)
        assert int((sel & ~injected).sum()) in (2, 4)  # one or two stages


# ----------------------------------------------------------------------------- B3. GAIN-RL

def test_angle_concentration_hand_values():
    h = T([[[1.0, 0.0], [2.0, 0.0], [0.0, 3.0], [5.0, 5.0]]])
    # first three tokens: cos(1,2) = 1, cos(1,3) = cos(2,3) = 0 -> (2 * 1) / (3 * 2) = 1/3 (token 4 is padding)
    assert angle_concentration(h, T([[1, 1, 1, 0]])).item() == pytest.approx(1 / 3)
    assert angle_concentration(h, T([[0, 0, 0, 1]])).item() == 1.0  # a single token


def test_gain_rl_order_schedule_and_window(tiny):
    s = SAMPLERS.get("gain_rl")(num_rows=10, seed=0, gain_rl_sigma=0.01, gain_rl_max_shift=0.1)
    s.set_scores(T([.1, .9, .5, .3, .2, .8, .7, .6, .4, .0]))
    assert s.order.tolist() == [1, 5, 6, 7, 2, 8, 3, 4, 0, 9]  # highest concentration first
    assert set(s.next(1)) == {1}  # sigma = .1 position around mu = 0: only the first position
    # shift = .1 * 10 * clamp(.5 tanh(2 (acc - .5)) + .5 tanh(2 ang), 0, 1)
    fb(s, [1, 1], [1.0, 1.0])  # acc 1, ang .9: .5 tanh(1) + .5 tanh(1.8) = .380797 + .473403 = .854200
    assert s.mu == pytest.approx(0.854200, abs=1e-5)
    fb(s, [9, 9], [0.0, 0.0])  # acc 0, ang 0: .5 tanh(-1) < 0 -> clamp 0, no move
    assert s.mu == pytest.approx(0.854200, abs=1e-5)
    s.mu = 4.0
    assert set(s.next(1)) == {2}  # position 4 of the order
    # attach scores every prompt with the policy's hidden states
    model, tok = tiny
    g = SAMPLERS.get("gain_rl")(num_rows=6, seed=0, gain_rl_refresh_steps=1)
    g.attach(SimpleNamespace(policy=model, tokenizer=tok, rows=ROWS[:6]))
    assert g.scores.shape == (6,) and bool((g.scores.abs() <= 1).all()) and g.scores.std() > 0
    g.scores.zero_()
    g.steps = 1
    g.next(2)  # refresh due: recomputed with the policy
    assert g.scores.std() > 0 and g.scored_at == 1


# ----------------------------------------------------------------------------- B4. automatic groups

def test_auto_group_partition_and_worst_group_weights():
    s = SAMPLERS.get("auto_group")(num_rows=4, seed=0, auto_group_num_groups=2, auto_group_eta=1.0,
                                   auto_group_gamma=0.0, auto_group_ema=0.0)
    assert s.group.tolist() == [0, 0, 1, 1]  # all at the prior: sorted by index
    fb(s, [0] * 4 + [1] * 4 + [2] * 4 + [3] * 4, [0] * 4 + [1] * 4 + [1, 1, 0, 0] + [1, 0, 0, 0])
    # groups before the update: g0 = {0, 1}: errors 4 + 0 of 8 = .5; g1 = {2, 3}: 2 + 3 of 8 = .625
    # log w = (.5, .625) -> w = softmax = (.46879, .53121): the worse group gains weight
    assert torch.allclose(s.weights(), T([.46879, .53121], dtype=torch.float64), atol=1e-5)
    # success rates (0, 1, .5, .25) -> sorted 0, 3 | 2, 1: the weakest half is group 0
    assert s.group.tolist() == [0, 1, 1, 0]
    s.log_w = T([0.0, -50.0], dtype=torch.float64)
    assert set(s.next(6)) == {0, 3}  # the worst group is all that is sampled


# ----------------------------------------------------------------------------- B5. ERPO

def test_erpo_temperatures_rise_on_residual_prompts_and_reset():
    s = SAMPLERS.get("erpo")(num_rows=3, seed=0, temperature=0.7, erpo_temperature_step=0.1,
                             erpo_max_temperature=0.9)
    assert s.temperatures([0, 1, 2]) == [0.7, 0.7, 0.7]
    out = []
    for _ in range(3):  # prompt 0 all correct three times, prompt 1 all wrong
        fb(s, [0, 0, 1, 1], [1, 1, 0, 0])
        out.append(s.temperatures([0, 1])[0])
    assert out == pytest.approx([0.8, 0.9, 0.9]) and s.temperatures([1]) == [0.7]  # capped at .9
    fb(s, [0, 0], [1, 0])  # variance returned: reset
    assert s.temperatures([0]) == [0.7]
    with pytest.raises(ConfigError, match="erpo_max_temperature"):
        Config.build({"prompt_sampler": "erpo", "temperature": 1.0, "erpo_max_temperature": 0.9})


def test_erpo_end_to_end_generates_at_the_prompts_temperature(tiny_args):
    t = Trainer(tiny_cfg(tiny_args, prompt_sampler="erpo", temperature=1.0, erpo_max_temperature=3.0),
                log=lambda *a: None)
    t.sampler.level[:] = 20  # every prompt residual for a long time: T = min(3, 1 + 2) = 3
    t.ctx.new_step()
    batch, _, _ = t.collect()
    sub = batch.select(list(range(4)))
    hot, _ = completion_logprobs(t.model, sub, 3.0)
    cold, _ = completion_logprobs(t.model, sub, 1.0)
    m = sub.completion_mask
    assert torch.allclose(hot * m, sub.behavior_logprobs, atol=1e-5)
    assert not torch.allclose(cold * m, sub.behavior_logprobs, atol=1e-3)


# ----------------------------------------------------------------------------- B6. Rollout-GDRO

def test_sqrt_allocation_hand_values():
    # prices (.25, .25, .0625): roots (.5, .5, .25), sum 1.25; total 12 -> scale 9.6 -> (4.8, 4.8, 2.4)
    # floors (4, 4, 2) = 10, two more to the largest remainders (.8, .8) -> (5, 5, 2); mu = 1 / 9.6^2
    n, mu = sqrt_allocation([0.25, 0.25, 0.0625], 12, 2, 16)
    assert n == [5, 5, 2] and mu == pytest.approx(1 / 9.6 ** 2)
    # caps: roots (1, .01, .01) -> prompt 0 would get 11.8 > 6: fixed at 6, the other two share 6 -> 3 each
    assert sqrt_allocation([1.0, 1e-4, 1e-4], 12, 2, 6)[0] == [6, 3, 3]
    assert round_allocation([2.5, 2.5, 3.0], 8, 2, 6) == [3, 2, 3]  # tie on remainders: the earlier prompt


def test_rollout_gdro_prices_bins_and_keeps_the_total():
    s = SAMPLERS.get("rollout_gdro")(num_rows=4, seed=0, num_generations=4, rgdro_bin_edges=[0.5], rgdro_window=1,
                                     rgdro_ema=0.0, rgdro_min_generations=2, rgdro_max_generations=8)
    assert s.budgets([0, 1, 2, 3]) == [4, 4, 4, 4]  # no data: every bin priced .25
    fb(s, [0] * 4 + [1] * 4, [1, 0, 0, 0] + [0, 0, 0, 0])
    # both were in bin 1 (initial pass@k .5): its error rate 7/8 -> price 7/8 * 1/8 = .109375
    # now prompt 0 has pass@k 1 (bin 1), prompt 1 has 0 (bin 0, no data: .25), unseen 2, 3 at .5 (bin 1)
    assert s.classifier.bins().tolist() == [1, 0, 1, 1]
    q = s.prices()
    assert q.tolist() == pytest.approx([0.25, 0.109375])
    b = s.budgets([0, 1, 2, 3])
    ref, _ = sqrt_allocation([0.109375, 0.25, 0.109375, 0.109375], 16, 2, 8)
    assert b == ref and sum(b) == 16 and b[1] > b[0]  # the uncertain bin gets more rollouts
    assert s.shadow_price > 0


# ----------------------------------------------------------------------------- restore (all samplers)

def outcome(s, uids):
    """Deterministic outcomes: completion j of prompt u succeeds when (u + j) % 3 == 0; counts from budgets."""
    counts = s.budgets(uids) if hasattr(s, "budgets") else [2] * len(uids)
    rows = [(u, j) for u, c in zip(uids, counts) for j in range(c)]
    return [u for u, _ in rows], [1.0 if (u + j) % 3 == 0 else 0.0 for u, j in rows]


def choices(s, k):
    idx = s.next(k)
    return idx, (s.budgets(idx) if hasattr(s, "budgets") else None), \
        (s.temperatures(idx) if hasattr(s, "temperatures") else None)


@pytest.mark.parametrize("name", ["knapsack", "ar3po", "gain_rl", "auto_group", "erpo", "rollout_gdro"])
def test_resumed_sampler_makes_the_same_choices(name):
    cfg = Config.build({"prompt_sampler": name, "num_generations": 4})
    a = build_sampler(cfg, [{}] * 7)
    if name == "gain_rl":
        a.set_scores(torch.linspace(0, 1, 7))
    for _ in range(3):
        fb(a, *outcome(a, choices(a, 3)[0]))
    buf = io.BytesIO()
    torch.save(encode_state(a.state_dict()), buf)  # the checkpoint format: tensors and plain data only
    buf.seek(0)
    b = build_sampler(cfg, [{}] * 7)
    b.load_state_dict(decode_state(torch.load(buf, weights_only=True)))
    for _ in range(6):
        ca, cb = choices(a, 3), choices(b, 3)
        assert ca == cb
        fb(a, *outcome(a, ca[0]))
        fb(b, *outcome(b, cb[0]))
    assert choices(a, 5) == choices(b, 5)
    with pytest.raises(ValueError, match="rows"):
        build_sampler(cfg, [{}] * 8).load_state_dict(a.state_dict())
