"""CAL (update strategy ``cal``, policies/control/cal.py; seed 000-102) on the constrained task grpolab/SpeedLimitPoint-v0
(policies/control/gymenvs/safety.py): the UCB cost estimate, the rectification, the actor and dual losses by hand, the
per-step costs policy control records, the checkpoint state, and a learning run on 3 seeds."""
import math

import pytest
import torch

from grpolab.policies.control.policy import ControlPolicy
from grpolab.policies.control.cal import CAL, actor_loss, cost_budget, dual_loss, rectification, transitions, ucb_cost

from _helpers import LEARNING_SEEDS

ENV = "grpolab.policies.control.gymenvs.safety:grpolab/SpeedLimitPoint-v0"


def test_ucb_cost_by_hand():
    # E = 4 members, 2 states. Column 0: values 1, 3, 5, 7: mean 4, std with Bessel's correction
    # sqrt((9 + 1 + 1 + 9) / 3) = sqrt(20/3) = 2.581989; k = 0.5: 4 + 1.290994 = 5.290994.
    # Column 1: all 2: std 0, UCB 2. One member: the member itself (std taken as 0).
    q = torch.tensor([[1.0, 2.0], [3.0, 2.0], [5.0, 2.0], [7.0, 2.0]])
    assert torch.allclose(ucb_cost(q, 0.5), torch.tensor([5.290994, 2.0]), atol=1e-5)
    assert torch.allclose(ucb_cost(q, 0.0), torch.tensor([4.0, 2.0]))
    assert torch.equal(ucb_cost(q[:1], 0.5), q[0])


def test_rect_and_actor_loss_by_hand():
    # c = 10, d = 1: slack Q_c = [0.8, 0.6]: c mean(d - Q_c) = 10 x 0.3 = 3.0, clipped above at lambda
    assert math.isclose(float(rectification(10.0, 1.0, torch.tensor([0.8, 0.6]), 5.0)), 3.0, rel_tol=1e-6)
    assert math.isclose(float(rectification(10.0, 1.0, torch.tensor([0.8, 0.6]), 0.5)), 0.5, rel_tol=1e-6)
    # violated Q_c = [1.5, 1.3]: 10 x mean(-0.5, -0.3) = -4.0 (no lower clip)
    rect = rectification(10.0, 1.0, torch.tensor([1.5, 1.3]), 1.0)
    assert math.isclose(float(rect), -4.0, rel_tol=1e-6)
    # actor loss, alpha 0.2, lambda 1, rect -4 (multiplier 5): rows
    #   0.2 x -1 - 3 + 5 x 0.5 = -0.7   and   0.2 x -2 - 1 + 5 x 1.5 = 6.1   ->  mean 2.7
    loss = actor_loss(0.2, torch.tensor([-1.0, -2.0]), torch.tensor([3.0, 1.0]), 1.0, rect, torch.tensor([0.5, 1.5]))
    assert math.isclose(float(loss), 2.7, rel_tol=1e-6)
    # the multiplier lambda - rect is >= 0 always (rect <= lambda): slack with rect = lambda cancels the cost term
    loss0 = actor_loss(0.2, torch.tensor([-1.0]), torch.tensor([3.0]), 0.5, torch.tensor(0.5), torch.tensor([9.0]))
    assert math.isclose(float(loss0), -3.2, rel_tol=1e-6)


def test_dual_update_by_hand():
    # lambda = 2 (log 2), d = 1, Q_c = [1.5, 1.3]: loss = 2 x mean(-0.5, -0.3) = -0.8, and its gradient on
    # log lambda is lambda x mean(d - Q_c) = -0.8 < 0: Adam's first step (lr 0.1) moves log lambda by +0.1,
    # lambda -> 2 e^0.1 = 2.210342. Slack Q_c = [0.5, 0.7]: the step moves it by -0.1, lambda -> 1.809675.
    for qc, want in (([1.5, 1.3], 2.210342), ([0.5, 0.7], 1.809675)):
        log_lam = torch.tensor([math.log(2.0)], requires_grad=True)
        opt = torch.optim.Adam([log_lam], lr=0.1)
        loss = dual_loss(log_lam, 1.0, torch.tensor(qc))
        loss.backward()
        assert math.isclose(float(log_lam.grad), 2.0 * (1.0 - sum(qc) / 2), rel_tol=1e-6)
        opt.step()
        assert math.isclose(float(log_lam.exp()), want, rel_tol=1e-5)
    assert math.isclose(float(dual_loss(torch.tensor([math.log(2.0)]), 1.0, torch.tensor([1.5, 1.3]))), -0.8,
                        rel_tol=1e-6)
    # budget: 2 (1 - 0.9^20) / (1 - 0.9) / 20 = 2 x 0.878423 / 2 = 0.878423; gamma_c = 1: the limit itself
    assert math.isclose(cost_budget(2.0, 0.9, 20), 0.878423, rel_tol=1e-5)
    assert cost_budget(5.0, 1.0, 10) == 5.0


def _setup(seed, eps=16, **kw):
    torch.manual_seed(seed)
    p = ControlPolicy(model="mlp", temperature=1.0, max_completion_length=20, control_log_std_init=-1.0)
    rows = [{"prompt": f"p{s}", "env": ENV, "env_kwargs": {}, "seed": s} for s in range(eps)]
    m = p.load(None, rows, [], log=lambda *a: None)
    cfg = dict(cal_hidden=32, cal_warmup=320, cal_batch_size=64, cal_utd=0.125, cal_buffer_size=1600,
               cal_gamma=0.9, cal_cost_gamma=0.9, cal_tau=0.05, cal_target_every=1, cal_lr=3e-3, cal_cost_lr=3e-3,
               cal_cost_limit=2.0, max_completion_length=20, cal_seed=seed)
    cfg.update(kw)
    return p, rows, m, CAL(**cfg)


def test_costs_and_transitions_of_the_constrained_task():
    """Policy control records info["cost"]: on SpeedLimitPoint the reward is the clipped velocity and the cost
    1[|a| > 0.5]; the transitions chain each step to the next observation and the last one to last_obs."""
    p, rows, m, _ = _setup(0, eps=3)
    b = p.sample(m, rows, [0, 1, 2], num_generations=1, generator=torch.Generator().manual_seed(0))
    a = b.step_data["action"][..., 0].clamp(-1, 1)
    assert torch.allclose(b.row_data["step_rewards"], a, atol=1e-6)
    assert torch.equal(b.row_data["step_costs"], (a.abs() > 0.5).float())
    tr = transitions(b)
    assert len(tr["s"]) == 60 and not tr["d"].any()  # 3 episodes x 20 steps, time limits only
    assert torch.equal(tr["s2"][:19], b.step_data["obs"][0, 1:]) and torch.equal(tr["s2"][19], b.row_data["last_obs"][0, 0])
    # the observation's second entry is t / 20
    assert torch.allclose(tr["s"][:20, 1], torch.arange(20) / 20)


def test_state_dict_round_trip():
    p, rows, m, cal = _setup(0, eps=16, cal_warmup=0, cal_utd=0.01)
    opt = torch.optim.Adam(m.parameters(), lr=1e-3)
    cal(p.sample(m, rows, list(range(16)), num_generations=1, generator=torch.Generator().manual_seed(1)), m, opt)
    other = CAL(cal_hidden=32, max_completion_length=20)
    other.load_state_dict(cal.state_dict())
    b = {k: v[:8] for k, v in cal.buf.items()}
    assert torch.equal(ucb_cost(other.qc(b["s"], b["a"]), 0.5), ucb_cost(cal.qc(b["s"], b["a"]), 0.5))
    assert other.size == cal.size == 320 and float(other.log_lam) == float(cal.log_lam)


@pytest.mark.parametrize("seed", LEARNING_SEEDS)
def test_cal_raises_return_within_budget(seed):
    """12 steps of 16 episodes (320 env steps each, 40 CAL updates per step after a 320-step warm-up): the mean
    return of the last 3 steps beats the first step's by > 1.0 (the initial actor, mean ~0: return ~0, cost ~3
    per episode), while the last 3 steps' mean episode cost stays within 1.25 x the limit 2."""
    p, rows, m, cal = _setup(seed)
    opt = torch.optim.Adam(m.parameters(), lr=3e-3)
    g = torch.Generator().manual_seed(seed)
    rets, costs = [], []
    for _ in range(12):
        b = p.sample(m, rows, list(range(16)), num_generations=1, generator=g)
        out = cal(b, m, opt)
        rets.append(sum(b.columns["completion"]) / 16)
        costs.append(out["cal/episode_cost"])
    late_ret, late_cost = sum(rets[-3:]) / 3, sum(costs[-3:]) / 3
    assert late_ret > rets[0] + 1.0, (rets, costs)
    assert late_cost <= 1.25 * 2.0, (rets, costs)
