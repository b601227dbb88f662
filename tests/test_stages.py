"""Batch stages and update strategies: CPPO pruning, EFRame, RePO replay, SFPO."""
import copy
import math
from types import SimpleNamespace

import pytest
import torch

from grpolab.batch import RolloutBatch
from grpolab.config import Config, ConfigError
from grpolab.stages import BATCH_STAGES, UPDATE_STRATEGIES
from grpolab.stages.batch_pruning import CPPOPrune, row_advantage, top_abs_advantage
from grpolab.stages.batch_replay import EFRame, RePOReplay
from grpolab.stages.update_sfpo import SFPO
from grpolab.train.trainer import Trainer, build_sampler


# ----------------------------------------------------------------------------- helpers

def make_batch(rewards, group_ids, uids, adv=None, T=3, lp_base=0.0):
    """A scored batch: row i has completion [i+1, i+1, i+1], behaviour log-prob -(lp_base + i)/10."""
    R = len(rewards)
    comp = torch.tensor([[i + 1] * T for i in range(R)])
    scalar = torch.tensor(rewards, dtype=torch.float32)
    b = RolloutBatch(prompt_ids=torch.full((R, 2), 5), prompt_mask=torch.ones(R, 2, dtype=torch.long),
                     completion_ids=comp, completion_mask=torch.ones(R, T),
                     behavior_logprobs=-(lp_base + torch.arange(R, dtype=torch.float32))[:, None].repeat(1, T) / 10,
                     group_ids=torch.tensor(group_ids), prompt_uids=torch.tensor(uids),
                     truncated=torch.zeros(R, dtype=torch.bool), rewards=scalar[:, None].clone(),
                     reward_names=["r"], scalar_rewards=scalar,
                     columns={"prompt": [f"p{u}" for u in uids]})
    a = torch.zeros(R) if adv is None else torch.tensor(adv, dtype=torch.float32)
    b.advantages = a[:, None] * b.completion_mask
    return b


class FakeCtx:
    """Deterministic stand-in for RolloutContext: generated row j of every prompt gets reward ``gen_rewards[j]``."""

    def __init__(self, gen_rewards=(1.0, 0.0, 0.0, 0.0), num_rows=20, G=4, eps=0.0):
        self.cfg = SimpleNamespace(advantage_epsilon=eps, mask_truncated_completions=False, num_generations=G)
        self.tokenizer = SimpleNamespace(pad_token_id=0)
        self.pad_id = 0  # RolloutContext.pad_id: the policy's filler for RolloutBatch.concat
        self.rows = [{"prompt": f"p{i}"} for i in range(num_rows)]
        self.gen_rewards = list(gen_rewards)
        self.next_group = 100
        self.calls = []
        self.reward_errors = 0

    def allocate_groups(self, n):
        first = self.next_group
        self.next_group += n
        return first

    def generate(self, rows, uids, *, group_offset, num_generations=None, temperature=None, model=None):
        n = num_generations or self.cfg.num_generations
        self.calls.append({"uids": list(uids), "n": n, "temperature": temperature})
        R = n * len(uids)
        b = make_batch([0.0] * R, [group_offset + i for i in range(len(uids)) for _ in range(n)],
                       [u for u in uids for _ in range(n)], lp_base=50)
        b.rewards = b.scalar_rewards = b.advantages = None
        return b

    def score(self, batch):
        n = batch.num_rows
        G = len(self.gen_rewards)
        r = torch.tensor([self.gen_rewards[i % G] for i in range(n)], dtype=torch.float32)
        batch.rewards, batch.reward_names = r[:, None].clone(), ["r"]
        return r

    def log(self, *a):
        pass


def adv_of(batch):
    return row_advantage(batch)


def run_trainer(tiny_args, extra, steps=2, rows=None):
    """Build a Trainer; record (a clone of) every batch the update sees."""
    cfg = Config.build({**tiny_args, "steps": steps, **extra})
    t = Trainer(cfg, log=lambda *a: None)
    if rows is not None:  # restrict the data so prompts repeat across steps
        t.rows = t.rows[:rows]
        t.sampler = build_sampler(cfg, t.rows)
    seen, original = [], t.update

    def recording_update(batch):
        seen.append(copy.deepcopy(batch))
        return original(batch)

    t.update = recording_update
    t.train(progress=False)
    return t, seen


# ----------------------------------------------------------------------------- CPPO (000-84)

def test_cppo_keeps_largest_abs_advantage_per_group_and_batch():
    b = make_batch([0] * 8, [0, 0, 0, 0, 1, 1, 1, 1], [3, 3, 3, 3, 4, 4, 4, 4],
                   adv=[0.1, -2.0, 0.5, 1.0, 0.3, -0.2, 0.0, 0.9])
    # per group, P = 0.5 keeps floor(4 * 0.5) = 2: |A| group 0 -> rows 1 (2.0), 3 (1.0); group 1 -> 7 (0.9), 4 (0.3)
    assert top_abs_advantage(b, 0.5, "group").tolist() == [1, 3, 4, 7]
    # whole batch keeps 4: 2.0 (1), 1.0 (3), 0.9 (7), 0.5 (2)
    assert top_abs_advantage(b, 0.5, "batch").tolist() == [1, 2, 3, 7]
    # P = 0.9 on a group of 4: floor(0.4) = 0 -> at least one row is kept
    assert top_abs_advantage(b, 0.9, "group").tolist() == [1, 7]
    stage = CPPOPrune(cppo_pruning_rate=0.5, cppo_refill=False)
    out = stage(batch=b, ctx=FakeCtx())
    assert out.num_rows == 4
    # kept rows are unchanged: advantages, behaviour log-probs, group ids, completions
    idx = torch.tensor([1, 3, 4, 7])
    assert torch.equal(out.advantages, b.advantages[idx])
    assert torch.equal(out.behavior_logprobs, b.behavior_logprobs[idx])
    assert torch.equal(out.group_ids, b.group_ids[idx])
    assert torch.equal(out.completion_ids, b.completion_ids[idx])


def test_cppo_batch_scope_matches_the_authors_selection():
    # authors (lzhxmu/CPPO, cppo_ray_trainer.py, with metric=smallest from math_cppo.sh / cppo_trainer.yaml):
    # k = int(R * (1 - pruning_rate)); indices = topk(|A|, k, largest=True); indices.sort(): plain python here.
    # Groups: a single correct row (big |A|), an all-correct and an all-wrong group (A = 0), an unequal one.
    adv = [2.25, -0.75, -0.75, -0.75, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 1.1, 1.1, -0.6, -1.6]
    g = [0] * 4 + [1] * 4 + [2] * 4 + [3] * 4

    def authors(a, rate):
        k = int(len(a) * (1 - rate))
        return sorted(sorted(range(len(a)), key=lambda i: -abs(a[i]))[:k])

    b = make_batch([0.0] * 16, g, g, adv=adv)
    for rate in (0.5, 0.75):
        assert top_abs_advantage(b, rate, "batch").tolist() == authors(adv, rate)
    assert authors(adv, 0.75) == [0, 12, 13, 15]  # by hand: |A| 2.25, 1.6, 1.1, 1.1
    # the paper's per-question scope (the default) keeps one row of the zero-advantage groups too
    assert top_abs_advantage(b, 0.75, "group").tolist() != authors(adv, 0.75)


def test_cppo_refill_restores_row_count_with_pruned_fresh_groups():
    b = make_batch([0] * 8, [0, 0, 0, 0, 1, 1, 1, 1], [3, 3, 3, 3, 4, 4, 4, 4],
                   adv=[0.1, -2.0, 0.5, 1.0, 0.3, -0.2, 0.0, 0.9])
    ctx = FakeCtx(gen_rewards=(1.0, 0.0, 0.0, 0.0), G=4, eps=0.0)
    out = CPPOPrune(cppo_pruning_rate=0.5, cppo_refill=True, seed=0)(batch=b, ctx=ctx)
    assert out.num_rows == 8  # 4 kept + 4 freed refilled
    # freed = 4, each new group keeps floor(4 * 0.5) = 2 -> ceil(4 / 2) = 2 new prompts, not already in the batch
    assert len(ctx.calls) == 1 and len(ctx.calls[0]["uids"]) == 2
    assert not set(ctx.calls[0]["uids"]) & {3, 4}
    assert torch.equal(out.advantages[:4], b.advantages[[1, 3, 4, 7]])
    new = out.select(list(range(4, 8)))
    # rewards [1, 0, 0, 0]: mean 0.25, std (n-1) = sqrt((0.5625 + 3 * 0.0625) / 3) = 0.5 -> A = [1.5, -0.5, -0.5, -0.5];
    # top-2 |A| keeps j = 0 (1.5) and j = 1 (-0.5, the earliest of the ties)
    assert torch.allclose(adv_of(new), torch.tensor([1.5, -0.5, 1.5, -0.5]))
    assert torch.equal(new.scalar_rewards, torch.tensor([1.0, 0.0, 1.0, 0.0]))
    assert new.group_ids.tolist() == [100, 100, 101, 101]  # fresh ids from allocate_groups
    assert new.rewards.shape == (4, 1)


def test_cppo_restored_state_draws_the_same_refill_prompts():
    def batch():
        return make_batch([0] * 4, [0, 0, 1, 1], [3, 3, 4, 4], adv=[1.0, 0.0, 1.0, 0.0])
    a = CPPOPrune(cppo_pruning_rate=0.5, seed=7)
    a(batch=batch(), ctx=FakeCtx())
    b = CPPOPrune(cppo_pruning_rate=0.5, seed=123)
    b.load_state_dict(copy.deepcopy(a.state_dict()))
    ca, cb = FakeCtx(), FakeCtx()
    for _ in range(3):
        oa, ob = a(batch=batch(), ctx=ca), b(batch=batch(), ctx=cb)
        assert torch.equal(oa.prompt_uids, ob.prompt_uids)
    assert [c["uids"] for c in ca.calls] == [c["uids"] for c in cb.calls]


def test_cppo_config_checks():
    with pytest.raises(ConfigError, match="cppo_pruning_rate"):
        Config.build({"batch_stages": ["cppo_prune"], "cppo_pruning_rate": 1.0})


def test_cppo_trains_on_kept_rows(tiny_args):
    # 4 prompts x 4 completions = 16 rows; P = 0.75 keeps 1 per group -> 4 rows reach the update
    _, seen = run_trainer(tiny_args, {"batch_stages": ["cppo_prune"], "cppo_pruning_rate": 0.75,
                                      "cppo_refill": False}, steps=1)
    assert seen[0].num_rows == 4 and len(set(seen[0].group_ids.tolist())) == 4
    # with refill the update sees 16 rows again, from 4 + ceil(12 / 1) = 16 groups, each one prompt
    _, seen = run_trainer(tiny_args, {"batch_stages": ["cppo_prune"], "cppo_pruning_rate": 0.75,
                                      "out": tiny_args["out"] + "2"}, steps=1)
    b = seen[0]
    assert b.num_rows == 16 and len(set(b.group_ids.tolist())) == 16
    for g in set(b.group_ids.tolist()):
        assert len(set(b.prompt_uids[b.group_ids == g].tolist())) == 1


# ----------------------------------------------------------------------------- EFRame (000-11)

def test_eframe_explores_hard_prompts_filters_and_remembers():
    # group 0 (uid 3) all fail, zero advantage: hard. group 1 (uid 4) rewards [1, 0, 0, 0] -> A [1.5, -.5, -.5, -.5]
    b = make_batch([0, 0, 0, 0, 1, 0, 0, 0], [0] * 4 + [1] * 4, [3] * 4 + [4] * 4,
                   adv=[0, 0, 0, 0, 1.5, -0.5, -0.5, -0.5])
    ctx = FakeCtx(gen_rewards=(1.0, 0.0, 0.0, 0.0))
    st = EFRame(eframe_explore_n=4, eframe_explore_temperature=1.2, eframe_replay_freq=5)
    out = st(batch=b, ctx=ctx, step=0)
    assert ctx.calls == [{"uids": [3], "n": 4, "temperature": 1.2}]
    # filter keeps group 1's 4 rows (|A| > 0.05); exploration keeps only |A| = 1.5 > 1
    assert out.num_rows == 5
    assert torch.equal(out.completion_ids[:4], b.completion_ids[4:])
    assert float(adv_of(out)[4]) == pytest.approx(1.5) and int(out.group_ids[4]) == 100
    # replay buffer: rows with |A| > 1 -> group 1's first row and the exploration success; capacity 2 x 8 rows
    assert len(st.buffer) == 2 and st.capacity == 16 and st.batch_rows == 8
    assert torch.equal(st.buffer[0].behavior_logprobs, b.behavior_logprobs[4:5])


def test_eframe_overlong_filter_and_fallback():
    b = make_batch([1, 0, 0, 0], [0] * 4, [3] * 4, adv=[1.5, -0.5, -0.5, -0.5])
    b.truncated[0] = True  # truncated with positive advantage: dropped
    out = EFRame()(batch=b, ctx=FakeCtx(), step=0)
    assert out.num_rows == 3 and torch.equal(out.completion_ids, b.completion_ids[1:])
    # nothing passes (zero advantages, a successful reward so not hard): the batch is kept as is
    z = make_batch([1, 1], [0, 0], [3, 3], adv=[0, 0])
    assert EFRame()(batch=z, ctx=FakeCtx(), step=0).num_rows == 2


def test_eframe_replay_schedule_and_fifo():
    st = EFRame(eframe_replay_freq=3, eframe_replay_threshold=1.0, seed=0)
    st.batch_rows, st.capacity = 2, 4
    ctx = FakeCtx()
    for s in range(3):  # 2 rows with |A| = 2 per step -> 6 pushed, FIFO keeps the last 4
        st.remember(make_batch([1, 0, 0], [0, 0, 0], [s, s, s], adv=[2.0, -2.0, 0.5], lp_base=10 * s), step=s)
    assert len(st.buffer) == 4 and [k[0] for k in st.buffer_keys] == [1, 1, 2, 2]
    assert st.draw_replay(ctx, step=0) is None and st.draw_replay(ctx, step=1) is None
    rep = st.draw_replay(ctx, step=2)  # (2 + 1) % 3 == 0 and the buffer is full: all 4 rows
    assert rep.num_rows == 4
    assert torch.equal(rep.behavior_logprobs[:, 0], torch.tensor([-1.0, -1.1, -2.0, -2.1]))
    assert torch.equal(adv_of(rep), torch.tensor([2.0, -2.0, 2.0, -2.0]))
    # rows of one original group share one fresh group id
    assert rep.group_ids.tolist() == [100, 100, 101, 101]


def test_eframe_restored_state_replays_identically():
    def step_batch(s):
        return make_batch([1, 0, 0, 0], [0] * 4, [s] * 4, adv=[1.5, -0.5, -0.5, -0.5], lp_base=s)
    a = EFRame(eframe_replay_freq=2, eframe_replay_size=3.0, eframe_replay_threshold=0.4, seed=1)
    for s in range(3):
        a(batch=step_batch(s), ctx=FakeCtx(), step=s)
    b = EFRame(eframe_replay_freq=2, eframe_replay_size=3.0, eframe_replay_threshold=0.4, seed=99)
    b.load_state_dict(copy.deepcopy(a.state_dict()))
    for s in range(3, 8):
        oa, ob = a(batch=step_batch(s), ctx=FakeCtx(), step=s), b(batch=step_batch(s), ctx=FakeCtx(), step=s)
        assert torch.equal(oa.behavior_logprobs, ob.behavior_logprobs)
        assert torch.equal(oa.advantages, ob.advantages)
    assert oa.num_rows > 4  # replay happened (not capacity-full, so a random draw was compared)


def test_eframe_trains_on_filtered_rows(tiny_args):
    _, seen = run_trainer(tiny_args, {"batch_stages": ["eframe"], "eframe_explore_n": 4}, steps=1)
    for b in seen:
        assert b.num_rows >= 1
        assert bool((adv_of(b).abs() > 0.05).all())  # no zero-advantage row reaches the loss


# ----------------------------------------------------------------------------- RePO (000-34)

def repo_with_buffer(strategy, rewards, k=2, **kw):
    st = RePOReplay(repo_strategy=strategy, repo_num_replay=k, repo_buffer_size=8, **kw)
    st.push(make_batch(rewards, [0] * len(rewards), [7] * len(rewards), lp_base=20))
    return st


def test_repo_retrieval_strategies_hand_computed():
    rewards = [0.2, 1.0, 0.5, 1.0, 0.0]  # oldest -> newest
    pick = lambda st: [float(r.scalar_rewards[0]) for r in st.retrieve(7)]  # noqa: E731
    assert pick(repo_with_buffer("all", rewards)) == pytest.approx(rewards)
    assert pick(repo_with_buffer("recent_k", rewards)) == [1.0, 0.0]          # the 2 newest
    st = repo_with_buffer("highest_k", rewards)
    assert [float(r.behavior_logprobs[0, 0]) for r in st.retrieve(7)] == pytest.approx([-2.3, -2.1])  # the two 1.0s, newest first
    # population variance of pairs: {1.0, 0.0} gives 0.25 (max); (1, 4) and (3, 4) tie on sum too -> first, (1, 4)
    st = repo_with_buffer("max_variance_k", rewards)
    assert [float(r.behavior_logprobs[0, 0]) for r in st.retrieve(7)] == pytest.approx([-2.1, -2.4])
    got = pick(repo_with_buffer("random_k", rewards))
    assert len(got) == 2
    assert repo_with_buffer("all", rewards, repo_min_buffer=6).retrieve(7) == []
    assert repo_with_buffer("all", rewards).retrieve(8) == []


def test_repo_buffer_is_fifo_per_prompt():
    st = RePOReplay(repo_buffer_size=3, repo_strategy="all")
    st.push(make_batch([0.1, 0.2, 0.3, 0.4], [0, 0, 1, 1], [7, 7, 8, 8]))
    st.push(make_batch([0.5, 0.6], [0, 0], [7, 7]))
    assert [float(r.scalar_rewards[0]) for r in st.buffers[7]] == pytest.approx([0.2, 0.5, 0.6])
    assert [float(r.scalar_rewards[0]) for r in st.buffers[8]] == pytest.approx([0.3, 0.4])


def test_repo_mixed_union_group_advantages():
    st = repo_with_buffer("highest_k", [1.0, 0.0, 1.0])  # replays the two 1.0s
    b = make_batch([1.0, 0.0], [0, 0], [7, 7], adv=[0.7, -0.7])
    out = st(batch=b, ctx=FakeCtx(eps=0.0))
    assert out.num_rows == 4 and out.group_ids.tolist() == [0, 0, 0, 0]
    # union rewards [1, 0, 1, 1]: mean 0.75, std (n-1) = sqrt((3 * 0.0625 + 0.5625) / 3) = 0.5 -> [.5, -1.5, .5, .5]
    assert torch.allclose(adv_of(out), torch.tensor([0.5, -1.5, 0.5, 0.5]))
    # replayed rows keep the behaviour log-probs they were sampled with (rows 2 and 0 of the pushed batch)
    assert torch.equal(out.behavior_logprobs[2:, 0], torch.tensor([-2.2, -2.0]))
    # the on-policy rows were pushed after retrieval
    assert len(st.buffers[7]) == 5


def test_repo_split_keeps_on_policy_advantages():
    st = repo_with_buffer("all", [1.0, 0.0], repo_adv_norm="split")
    b = make_batch([1.0, 0.0], [0, 0], [7, 7], adv=[0.7, -0.7])
    out = st(batch=b, ctx=FakeCtx(eps=0.0))
    assert torch.equal(out.advantages[:2], b.advantages)
    assert out.group_ids.tolist() == [0, 0, 100, 100]
    # replayed [1, 0]: mean 0.5, std sqrt(0.5) -> +-0.7071
    assert torch.allclose(adv_of(out)[2:], torch.tensor([0.70710678, -0.70710678]))


def test_repo_restored_state_replays_identically():
    a = RePOReplay(repo_strategy="random_k", repo_num_replay=2, seed=3)
    for s in range(3):
        a(batch=make_batch([s / 3, 1.0, 0.0], [0, 0, 0], [7, 7, 7], lp_base=10 * s), ctx=FakeCtx())
    b = RePOReplay(repo_strategy="random_k", repo_num_replay=2, seed=4)
    b.load_state_dict(copy.deepcopy(a.state_dict()))
    for s in range(3, 6):
        nb = make_batch([0.5, 1.0, 0.0], [0, 0, 0], [7, 7, 7], lp_base=10 * s)
        oa, ob = a(batch=nb, ctx=FakeCtx()), b(batch=copy.deepcopy(nb), ctx=FakeCtx())
        assert torch.equal(oa.behavior_logprobs, ob.behavior_logprobs) and oa.num_rows == 5


def test_repo_second_step_replays_first_step_rows(tiny_args):
    # 4 data rows, 4 prompts per step: every prompt recurs in step 2 and gets k = 2 replayed rows
    _, seen = run_trainer(tiny_args, {"batch_stages": ["repo_replay"], "repo_num_replay": 2}, steps=2, rows=4)
    first, second = seen
    assert first.num_rows == 16 and second.num_rows == 16 + 4 * 2
    old = {(tuple(first.completion_ids[i].tolist()), tuple(first.behavior_logprobs[i].tolist()))
           for i in range(first.num_rows)}
    W = first.completion_ids.shape[1]

    def key(b, i):
        w = min(W, b.completion_ids.shape[1])
        ids = b.completion_ids[i, :w].tolist() + [0] * (W - w)
        lp = b.behavior_logprobs[i, :w].tolist() + [0.0] * (W - w)
        return tuple(ids), tuple(lp)

    replayed = [i for i in range(second.num_rows) if key(second, i) in old]
    assert len(replayed) == 8  # exactly the replayed rows carry step-1 behaviour log-probs
    for i in replayed:  # replayed rows sit in their prompt's on-policy group (mixed)
        g = second.group_ids[i]
        assert len(set(second.prompt_uids[second.group_ids == g].tolist())) == 1


# ----------------------------------------------------------------------------- SFPO (000-59)

def linear_setup(opt="adamw", seed=0):
    torch.manual_seed(seed)
    model = torch.nn.Linear(3, 1)
    optim = (torch.optim.AdamW(model.parameters(), lr=0.05) if opt == "adamw"
             else torch.optim.SGD(model.parameters(), lr=0.1))
    x, y = torch.randn(8, 3), torch.randn(8, 1)

    def update(batch=None):
        optim.zero_grad()
        loss = ((model(x) - y) ** 2).mean()
        loss.backward()
        optim.step()
        return {"loss": float(loss.detach()), "skipped": 0, "entropy": 1.0}

    return model, optim, update


def params_of(model):
    return [p.detach().clone() for p in model.parameters()]


def twin_setups(warm=0):
    """Two identical :func:`linear_setup` s, each after ``warm`` plain updates: ``(model, optim, update)`` twice."""
    one, two = linear_setup(), linear_setup()
    for _ in range(warm):
        one[2](), two[2]()
    return one, two


def same_params(m1, m2):
    return all(torch.equal(a, b) for a, b in zip(params_of(m1), params_of(m2)))


@pytest.mark.parametrize("warm", [0, 2])
def test_sfpo_alpha_one_equals_k_plus_one_updates(warm):
    (m1, o1, u1), (m2, o2, u2) = twin_setups(warm)
    SFPO(sfpo_fast_steps=3, sfpo_alpha=1.0)(update=u1, batch=None, model=m1, optimizer=o1)
    for _ in range(4):
        u2()
    assert same_params(m1, m2)


@pytest.mark.parametrize("warm", [0, 2])
def test_sfpo_alpha_zero_equals_one_update_from_theta0(warm):
    # grpolab's option sfpo_reposition_optimizer: the optimiser state is repositioned too
    (m1, o1, u1), (m2, o2, u2) = twin_setups(warm)
    SFPO(sfpo_fast_steps=3, sfpo_alpha=0.0, sfpo_reposition_optimizer=True)(update=u1, batch=None, model=m1,
                                                                             optimizer=o1)
    u2()
    assert same_params(m1, m2)
    # the optimiser state was repositioned too: the next updates still agree
    u1(), u2()
    assert same_params(m1, m2)


def test_sfpo_default_keeps_the_fast_trajectorys_optimizer_state():
    # authors' sfpo_update_actor (Urheen/SFPO): only the trainable weights are repositioned
    # (slow + step_size * (fast - slow)); Adam's moments and step count stay those after the K fast updates
    (m1, o1, u1), (m2, o2, u2) = twin_setups()
    theta0 = params_of(m2)
    SFPO(sfpo_fast_steps=3, sfpo_alpha=0.5)(update=u1, batch=None, model=m1, optimizer=o1)
    for _ in range(3):  # the reference: 3 fast updates, weights moved half way back by hand, one more update
        u2()
    with torch.no_grad():
        for p, w0 in zip(m2.parameters(), theta0):
            p.copy_(w0 + 0.5 * (p.detach() - w0))
    u2()
    assert all(torch.allclose(a, b, atol=1e-7) for a, b in zip(params_of(m1), params_of(m2)))
    assert o1.state[next(m1.parameters())]["step"] == 4  # 3 fast + 1 slow, no rewind of the step count


def test_sfpo_interpolation_hand_computed_sgd():
    w = torch.nn.Parameter(torch.tensor([1.0]))
    model = torch.nn.Module()
    model.w = w
    opt = torch.optim.SGD([w], lr=0.1)

    def update(batch=None):  # loss 0.5 w^2, gradient w: w <- 0.9 w
        opt.zero_grad()
        (0.5 * w ** 2).sum().backward()
        opt.step()
        return {"loss": 0.0, "skipped": 0, "entropy": 1.0}

    SFPO(sfpo_fast_steps=2, sfpo_alpha=0.5)(update=update, batch=None, model=model, optimizer=opt)
    # fast: 1 -> 0.9 -> 0.81; reposition 1 + 0.5 (0.81 - 1) = 0.905; slow: 0.9 * 0.905 = 0.8145
    assert float(w.detach()) == pytest.approx(0.8145, abs=1e-6)


def test_sfpo_entropy_switch_and_restore():
    # authors (Urheen/SFPO ray_trainer.py): window = last zscore_w entropies (newest included),
    # z = (newest - mean) / (np.std + 1e-9) (population std), stop when z >= zscore_threshold
    def authors_z(hist, w):
        win = hist[-w:]
        m = sum(win) / w
        sd = math.sqrt(sum((x - m) ** 2 for x in win) / w)
        return (win[-1] - m) / (sd + 1e-9)
    hist = [1.0, 1.1, 0.9]
    s = SFPO(sfpo_entropy_window=3, sfpo_entropy_z=1.0)
    for h in hist:
        s.observe_entropy(h)
    assert authors_z(hist, 3) == pytest.approx(-1.224745, abs=1e-5) and s.active  # a drop never switches off
    r = SFPO(sfpo_entropy_window=3, sfpo_entropy_z=1.0)
    r.load_state_dict(copy.deepcopy(s.state_dict()))
    for x in (s, r):
        x.observe_entropy(1.05)  # window [1.1, 0.9, 1.05]: z = .3922
        assert authors_z(hist + [1.05], 3) == pytest.approx(0.392232, abs=1e-5) and x.active
        x.observe_entropy(1.2)  # window [0.9, 1.05, 1.2]: z = 1.2247 >= 1
        assert authors_z(hist + [1.05, 1.2], 3) == pytest.approx(1.224745, abs=1e-5) and not x.active
    # the former two-sided |z| > 3 rule with the window before the newest value would have stayed on here
    calls = []
    m, o, u = linear_setup()
    s(update=lambda b: calls.append(1) or u(), batch=None, model=m, optimizer=o)
    assert len(calls) == 1  # switched off: one standard update per step


def test_sfpo_trainer_runs_fast_and_slow_updates(tiny_args):
    t, seen = run_trainer(tiny_args, {"update_strategy": "sfpo", "sfpo_fast_steps": 2}, steps=1)
    assert len(seen) == 3  # K = 2 fast + 1 slow update per step, on the same batch
    assert torch.equal(seen[0].completion_ids, seen[2].completion_ids)
    assert t.components["update/sfpo"].fn.entropies  # the entropy window is filled (and checkpointed)


# ----------------------------------------------------------------------------- DCPO (000-35)

def test_dcpo_mix_hand_computed_from_the_authors_loop():
    from grpolab.stages.batch_dcpo import dcpo_alpha, dcpo_mix
    # authors (597358816/DCPO ray_trainer.py, alg == "DCPO"): entropy 0 before the first step, entropy_base .5
    # -> alpha = min(|.5 - 0|, .1) / true_ratio, alpha = alpha / (alpha + 1); true_ratio = share of scores > .05
    scores = [1.0, 0.0, 0.04, 0.5]  # 2 of 4 above .05
    a = min(abs(0.5 - 0.0), 0.1) / 0.5
    alpha = a / (a + 1)  # 0.2 / 1.2
    assert dcpo_alpha(0.5, 0.5, 0.1) == pytest.approx(alpha) == pytest.approx(1 / 6)
    assert dcpo_alpha(-0.03, 0.25, 0.1) == pytest.approx((0.03 / 0.25) / (1 + 0.03 / 0.25))  # |delta| below the cap
    assert dcpo_alpha(0.2, 0.0, 0.1) == 1.0 and dcpo_alpha(0.0, 0.0, 0.1) == 0.0  # the authors' 0/0 -> NaN case
    adv = torch.tensor([[1.0, 1.0], [-1.0, -1.0], [0.5, 0.5], [0.2, 0.2]])
    lp_old = torch.log(torch.tensor([[0.5, 0.25], [0.5, 0.5], [0.1, 0.2], [0.9, 0.3]]))
    lp_t = torch.log(torch.tensor([[0.4, 0.3], [0.45, 0.5], [0.15, 0.2], [0.8, 0.35]]))
    mask = torch.tensor([[1.0, 1.0], [1.0, 1.0], [1.0, 1.0], [1.0, 0.0]])
    correct = torch.tensor([s > 0.05 for s in scores])
    out = dcpo_mix(adv, correct, lp_t, lp_old, mask, alpha)
    # advantages = (1 - alpha) A + alpha * bool_reward * exp(old_log_probs_t - old_log_probs)
    expect = [[(1 - alpha) * 1.0 + alpha * 0.4 / 0.5, (1 - alpha) * 1.0 + alpha * 0.3 / 0.25],
              [(1 - alpha) * -1.0, (1 - alpha) * -1.0],
              [(1 - alpha) * 0.5, (1 - alpha) * 0.5],
              [(1 - alpha) * 0.2 + alpha * 0.8 / 0.9, 0.0]]
    assert out.tolist() == [pytest.approx(r, abs=1e-6) for r in expect]


def test_dcpo_stage_uses_temperature_distributions_and_tracks_entropy():
    from grpolab.model.loading import build_tiny
    from grpolab.stages.batch_dcpo import DCPO
    model, tok = build_tiny(["abc 0123456789"], seed=3)
    b = make_batch([1.0, 0.0, 1.0, 0.0], [0, 0, 1, 1], [0, 0, 1, 1], adv=[1.0, -1.0, 1.0, -1.0])
    b.completion_ids = torch.tensor([[7, 8, 9], [9, 9, 7], [8, 7, 7], [10, 11, 8]])
    ctx = SimpleNamespace(policy=model.eval(), cfg=SimpleNamespace(shared_prefix_forward=False, micro_batch_size=4,
                                                                   micro_batch_tokens=0))
    stage = DCPO()
    before = b.advantages.clone()
    out = stage(copy.deepcopy(b), b.scalar_rewards, ctx, step=0)
    # independent: logits of the prompt + completion, log_softmax(logits / T) at the sampled tokens
    ids = torch.cat([b.prompt_ids, b.completion_ids], 1)
    with torch.no_grad():
        logits = model(input_ids=ids).logits[:, 1:-1].float()  # positions predicting completion tokens
    def lp(T):
        return torch.log_softmax(logits / T, -1).gather(-1, b.completion_ids[..., None]).squeeze(-1)
    a = min(0.5, 0.1) / 0.5  # first step: H = 0 <= .5 -> T = 1.2; 2 of 4 rows correct
    alpha = a / (a + 1)
    rho = torch.exp(lp(1.2) - lp(1.0))
    expect = (1 - alpha) * before + alpha * torch.tensor([1.0, 0.0, 1.0, 0.0])[:, None] * rho
    assert torch.allclose(out.advantages, expect, atol=1e-5)
    assert stage.entropy == pytest.approx(float(-lp(1.0).mean()), abs=1e-5)
    # a high recorded entropy switches to the colder target T = 0.8
    stage2 = DCPO()
    stage2.load_state_dict({"entropy": 9.0})
    out2 = stage2(copy.deepcopy(b), b.scalar_rewards, ctx, step=1)
    a2 = min(abs(0.5 - 9.0), 0.1) / 0.5
    alpha2 = a2 / (a2 + 1)
    expect2 = (1 - alpha2) * before + alpha2 * torch.tensor([1.0, 0.0, 1.0, 0.0])[:, None] * torch.exp(lp(0.8) - lp(1.0))
    assert torch.allclose(out2.advantages, expect2, atol=1e-5)
    assert stage2.state_dict() == {"entropy": pytest.approx(stage.entropy)}


def test_dcpo_recipe_trains(tiny_args):
    from grpolab.recipes import recipe_overrides
    _, seen = run_trainer(tiny_args, {**recipe_overrides("dcpo")}, steps=2)
    assert len(seen) == 2 and all(torch.isfinite(b.advantages).all() for b in seen)


def test_registries_and_recipes_validate():
    assert {"cppo_prune", "eframe", "repo_replay"} <= set(BATCH_STAGES.names())
    assert "sfpo" in UPDATE_STRATEGIES.names()
    from grpolab.recipes import recipe_overrides
    assert "dcpo" in BATCH_STAGES.names()
    for name in ("cppo", "eframe", "repo", "sfpo", "dcpo"):
        Config.build(recipe_overrides(name))
