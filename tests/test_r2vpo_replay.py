"""R^2VPO's off-policy reuse of stale samples (batch stage r2vpo_replay, seed 000-75)."""
import copy
import math

import pytest
import torch

from grpolab.algorithms.losses.clipped import clipped_ratio
from grpolab.algorithms.regularizers import RatioVariance
from grpolab.config import Config, ConfigError
from grpolab.stages.batch_replay import R2VPOReplay
from test_stages import FakeCtx, make_batch, run_trainer


class Ctx(FakeCtx):
    def __init__(self, *a, **kw):
        super().__init__(*a, **kw)
        self.metrics = {}

    def metric(self, name, value):
        self.metrics[name] = float(value)


def step_batch(s):
    """Step s: two groups of two rows (uids 7, 8); behaviour log-probs -(10 s + i) / 10 mark the step."""
    return make_batch([1.0, 0.0, 0.0, 1.0], [0, 0, 1, 1], [7, 7, 8, 8], adv=[0.7, -0.7, -0.7, 0.7], lp_base=10 * s)


def test_rows_are_replayed_for_k_steps_with_their_behaviour_logprobs():
    st, ctx = R2VPOReplay(r2vpo_replay_steps=2), Ctx()
    out0 = st(batch=step_batch(0), ctx=ctx, step=0)
    assert out0.num_rows == 4 and out0.columns["replay_age"] == [0] * 4 and ctx.metrics["r2vpo_replayed_rows"] == 0
    out1 = st(batch=step_batch(1), ctx=ctx, step=1)
    # step 0's 4 rows come back after step 1's, their two groups under fresh ids 100, 101
    assert out1.num_rows == 8 and out1.group_ids.tolist() == [0, 0, 1, 1, 100, 100, 101, 101]
    assert out1.columns["replay_age"] == [0] * 4 + [1] * 4
    assert torch.allclose(out1.behavior_logprobs[4:, 0], torch.tensor([0.0, -0.1, -0.2, -0.3]))
    assert torch.allclose(out1.advantages[4:, 0], torch.tensor([0.7, -0.7, -0.7, 0.7]))
    out2 = st(batch=step_batch(2), ctx=ctx, step=2)
    assert out2.num_rows == 12 and out2.columns["replay_age"] == [0] * 4 + [2] * 4 + [1] * 4
    assert ctx.metrics == {"r2vpo_replayed_rows": 8.0, "r2vpo_replay_age_mean": 1.5}
    out3 = st(batch=step_batch(3), ctx=ctx, step=3)  # step 0 is 3 steps old: dropped
    assert out3.columns["replay_age"] == [0] * 4 + [2] * 4 + [1] * 4
    assert torch.allclose(out3.behavior_logprobs[4:, 0], torch.tensor([-1.0, -1.1, -1.2, -1.3,
                                                                        -2.0, -2.1, -2.2, -2.3]))


def test_max_rows_takes_the_newest():
    st, ctx = R2VPOReplay(r2vpo_replay_steps=3, r2vpo_replay_max_rows=3), Ctx()
    for s in range(2):
        st(batch=step_batch(s), ctx=ctx, step=s)
    out = st(batch=step_batch(2), ctx=ctx, step=2)
    # buffer: step 0 rows 0-3, step 1 rows 0-3; the newest 3 are step 1's rows 1, 2, 3
    assert torch.allclose(out.behavior_logprobs[4:, 0], torch.tensor([-1.1, -1.2, -1.3]))
    assert out.columns["replay_age"][4:] == [1, 1, 1]


def test_restored_state_replays_identically():
    a = R2VPOReplay()
    for s in range(2):
        a(batch=step_batch(s), ctx=Ctx(), step=s)
    b = R2VPOReplay()
    b.load_state_dict(copy.deepcopy(a.state_dict()))
    oa, ob = a(batch=step_batch(2), ctx=Ctx(), step=2), b(batch=step_batch(2), ctx=Ctx(), step=2)
    assert torch.equal(oa.behavior_logprobs, ob.behavior_logprobs) and oa.group_ids.tolist() == ob.group_ids.tolist()


@pytest.mark.parametrize("stale,lam,adv", [(0.5, 1.0, 1.0), (-0.3, 2.0, -0.5), (0.0, 1.0, 0.8)])
def test_stale_token_weight_is_ratio_times_damped_advantage(stale, lam, adv):
    """d/dlogpi of the recipe's per-token objective -r A + lambda (r - 1)^2, r = exp(logpi - log b), by hand:
    -r (A - 2 lambda (r - 1)); a fresh token (r = 1) gets the plain policy gradient -A."""
    logp = torch.zeros(1, 1, requires_grad=True)
    old = torch.full((1, 1), -stale)  # the behaviour policy's log-prob: stale by `stale` nats
    mask = torch.ones(1, 1)
    loss, _ = clipped_ratio(logp, old, torch.tensor([[adv]]), mask, epsilon=math.inf, epsilon_high=math.inf)
    term, _ = RatioVariance(r2vpo_lambda_init=lam)(logp, old, mask, step=0)
    (loss + term).sum().backward()
    r = math.exp(stale)
    assert float(logp.grad) == pytest.approx(-r * (adv - 2 * lam * (r - 1)), rel=1e-5)


def test_config_check():
    with pytest.raises(ConfigError, match="r2vpo_replay_steps"):
        Config.build({"batch_stages": ["r2vpo_replay"], "r2vpo_replay_steps": 0})


def test_second_step_trains_on_first_step_rows(tiny_args):
    _, seen = run_trainer(tiny_args, {"batch_stages": ["r2vpo_replay"], "regularizers": ["ratio_variance"],
                                      "epsilon": math.inf}, steps=2)
    first, second = seen
    assert second.num_rows == 2 * first.num_rows
    assert second.columns["replay_age"] == [0] * first.num_rows + [1] * first.num_rows
    W = min(first.completion_ids.shape[1], second.completion_ids.shape[1])
    R = first.num_rows
    assert torch.equal(second.completion_ids[R:, :W], first.completion_ids[:, :W])
    assert torch.allclose(second.behavior_logprobs[R:, :W], first.behavior_logprobs[:, :W])
