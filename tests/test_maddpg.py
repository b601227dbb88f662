"""MADDPG (seed 000-99): policies/_control/maddpg.py (formulas, learner, ensembles, the authors' loop) and the update strategy
maddpg (policies/control/maddpg_update.py) on the control policy's batches."""
import math

import pytest
import torch

from grpolab.policies._control.maddpg import (MADDPG, actor_loss, critic_input, gumbel_softmax, polyak_update, relu_mlp,
                                    td_target, train_maddpg)
from grpolab.policies.control.maddpg_update import MADDPGUpdate, batch_transitions

from _helpers import LEARNING_SEEDS


def test_gumbel_softmax_by_hand():
    # u = e^-1: -log(-log u) = -log 1 = 0, so the sample is softmax(z): z = (0, ln 2) -> (1/3, 2/3)
    z = torch.tensor([[0.0, math.log(2.0)]])
    assert torch.allclose(gumbel_softmax(z, torch.full_like(z, math.exp(-1))), torch.tensor([[1 / 3, 2 / 3]]))
    # u = (e^-1, e^-e): noise (0, -log e = -1): softmax(0, ln2 - 1) = (1, 2/e) / (1 + 2/e)
    out = gumbel_softmax(z, torch.tensor([[math.exp(-1), math.exp(-math.e)]]))
    w = 2 / math.e
    assert torch.allclose(out, torch.tensor([[1 / (1 + w), w / (1 + w)]]))


def test_td_target_and_actor_loss_by_hand():
    # y = r + gamma (1 - done) Q': 1 + 0.95 * 2 = 2.9; a done transition: y = r = 1; -0.5 + 0 = -0.5
    y = td_target(torch.tensor([1.0, 1.0, -0.5]), torch.tensor([0.0, 1.0, 0.0]), torch.tensor([2.0, 2.0, 0.0]), 0.95)
    assert torch.allclose(y, torch.tensor([2.9, 1.0, -0.5]))
    # -mean Q = -(1 + 3)/2 = -2; mean z^2 = (1 + 1 + 4 + 0)/4 = 1.5; loss = -2 + 1e-3 * 1.5 = -1.9985
    loss = actor_loss(torch.tensor([1.0, 3.0]), torch.tensor([[1.0, -1.0], [2.0, 0.0]]))
    assert float(loss) == pytest.approx(-1.9985, abs=1e-7)


def test_polyak_update_by_hand():
    src, tgt = torch.nn.Linear(2, 1), torch.nn.Linear(2, 1)
    with torch.no_grad():
        src.weight.fill_(1.0), src.bias.fill_(-2.0), tgt.weight.zero_(), tgt.bias.fill_(3.0)
    polyak_update(tgt, src, 0.01)  # 0.99 * 0 + 0.01 * 1 = 0.01; 0.99 * 3 + 0.01 * -2 = 2.95
    assert torch.allclose(tgt.weight, torch.full((1, 2), 0.01)) and float(tgt.bias.detach()) == pytest.approx(2.95)
    polyak_update(tgt, src, 0.01)  # 0.99 * 0.01 + 0.01 = 0.0199; 0.99 * 2.95 - 0.02 = 2.9005
    assert torch.allclose(tgt.weight, torch.full((1, 2), 0.0199)) and float(tgt.bias.detach()) == pytest.approx(2.9005)


def test_centralised_critic_sees_every_agents_observation_and_action():
    obs = torch.arange(6.0).reshape(1, 3, 2)  # 3 agents, D = 2
    act = torch.eye(3)[None] * 10  # A = 3
    assert critic_input(obs, act, 1).tolist() == [[0, 1, 2, 3, 4, 5, 10, 0, 0, 0, 10, 0, 0, 0, 10]]
    assert critic_input(obs, act, 1, local=True).tolist() == [[2, 3, 0, 10, 0]]
    # the learner's critics: input N (D + A) = 15, or D + A = 5 with local_q; changing agent 2's action moves
    # agent 0's centralised critic and leaves the local (DDPG) one unchanged
    for local, width in ((False, 15), (True, 5)):
        L = MADDPG([[relu_mlp(2, 8, 3) for _ in range(3)]], 2, 3, hidden=8, local_q=local, seed=0)
        assert L.critics[0][0][0].in_features == width
        a2 = act.clone()
        a2[0, 2] = torch.tensor([0.0, 10.0, 0.0])
        q = [float(L.critics[0][0](critic_input(obs, a, 0, local)).detach()) for a in (act, a2)]
        assert (q[0] != q[1]) == (not local)


def _random_buffer(learner, n=64, seed=0):
    g = torch.Generator().manual_seed(seed)
    N, D, A = learner.N, learner.obs_dim, learner.act_dim
    x, x2 = torch.randn(n, N, D, generator=g), torch.randn(n, N, D, generator=g)
    a, r = torch.randint(0, A, (n, N), generator=g), torch.randn(n, N, generator=g)
    done = (torch.rand(n, generator=g) < 0.2).float()
    return x, a, r, x2, done


def test_critic_step_fits_the_td_target_and_actor_step_climbs_the_critic():
    """gamma 0: the TD target is r, so the critic's reported loss is mean (Q(x, a) - r)^2 on the batch it drew
    (replayed here from the learner's generator state); the actor's step raises Q at its relaxed action."""
    torch.manual_seed(0)
    L = MADDPG([[relu_mlp(3, 16, 4) for _ in range(2)]], 3, 4, hidden=16, gamma=0.0, batch_size=32, lr=1e-2, seed=1)
    x, a, r, x2, done = _random_buffer(L)
    L.add(x, a, r, x2, done, torch.zeros(64, 2, dtype=torch.long))
    state = L.generator.get_state()
    xb, ab, rb, *_ = L.buffers[0][0].sample(32, torch.Generator().manual_seed(0).set_state(state))
    with torch.no_grad():
        q = L.critics[0][0](critic_input(xb, torch.nn.functional.one_hot(ab, 4).float(), 0))[:, 0]
    expect = float((q - rb[:, 0]).pow(2).mean())
    ql, _ = L._update_one(0, 0)
    assert ql == pytest.approx(expect, rel=1e-5)
    # the actor step: Q_1 at agent 1's softmax action (others from the buffer) rises after a few actor steps
    with torch.no_grad():
        def q_at_policy():
            act = torch.nn.functional.one_hot(a, 4).float()
            act[:, 1] = torch.softmax(L.actors[0][1](x[:, 1]), -1)
            return float(L.critics[0][1](critic_input(x, act, 1)).mean())
    L.critic_opt[0][1] = torch.optim.SGD(L.critics[0][1].parameters(), lr=0.0)  # critic fixed: only the actor moves
    q0 = q_at_policy()
    for _ in range(20):
        L._update_one(0, 1)
    assert q_at_policy() > q0


def test_target_networks_trail_by_tau_after_an_update():
    L = MADDPG([[relu_mlp(3, 8, 4) for _ in range(2)]], 3, 4, hidden=8, batch_size=16, tau=0.01, seed=0)
    L.add(*_random_buffer(L, 32), torch.zeros(32, 2, dtype=torch.long))
    before_t = [p.clone() for p in L.target_critics[0][0].parameters()]
    L.update()
    for pt0, pt, p in zip(before_t, L.target_critics[0][0].parameters(), L.critics[0][0].parameters()):
        assert torch.allclose(pt, 0.99 * pt0 + 0.01 * p, atol=1e-7)


def test_ensembles_keep_one_buffer_per_sub_policy():
    """K = 2: a transition goes to the buffer of each agent's drawn sub-policy, with the draws stored."""
    L = MADDPG([[relu_mlp(3, 8, 4) for _ in range(2)] for _ in range(2)], 3, 4, hidden=8, batch_size=4, seed=0)
    x, a, r, x2, done = _random_buffer(L, 6)
    ks = torch.tensor([[0, 1], [0, 0], [1, 1], [1, 0], [0, 1], [1, 1]])
    L.add(x, a, r, x2, done, ks)
    # agent 0's sub-policy 0 saw transitions 0, 1, 4; agent 1's sub-policy 1 saw 0, 2, 4, 5
    assert torch.equal(L.buffers[0][0].x[:3], x[[0, 1, 4]]) and len(L.buffers[0][0]) == 3
    assert torch.equal(L.buffers[1][1].ks[:4], ks[[0, 2, 4, 5]]) and len(L.buffers[1][1]) == 4
    assert len(L.buffers[1][0]) == 3 and len(L.buffers[0][1]) == 2
    L.update()  # every (k, i) trains on its own buffer
    assert L.updates == 1
    out = train_maddpg(episodes=3, ensemble=2, seed=0, batch_size=8, update_every=10, warmup=8)
    assert len(out["returns"]) == 3 and out["updates"] > 0


def _control_batch():
    from grpolab.policies.control.policy import ControlPolicy
    p = ControlPolicy(model="mlp", temperature=1.0, max_completion_length=4)
    rows = [{"prompt": "s", "env": "pettingzoo:mpe2.simple_spread_v3", "seed": s,
             "env_kwargs": {"N": 3, "max_cycles": 25}} for s in (0, 1)]
    torch.manual_seed(0)
    m = p.load(None, rows, [], log=lambda *a: None)
    return m, p.sample(m, rows, [0, 1], num_generations=2, generator=torch.Generator().manual_seed(0))


def test_batch_transitions_follow_the_control_layout():
    m, b = _control_batch()
    x, a, r, x2, done = batch_transitions(b)
    assert x.shape == (4 * 4, 3, 18 + 3) and a.shape == (16, 3) and r.shape == (16, 3)
    obs = b.step_data["obs"].reshape(4, 4, 3, 21)
    assert torch.equal(x[:4], obs[0]) and torch.equal(x2[:3], obs[0, 1:])
    assert torch.equal(x2[3], b.row_data["last_obs"][0])
    assert torch.equal(a[:4], b.step_data["action"].reshape(4, 4, 3)[0])
    assert torch.equal(r[4:8], b.row_data["step_rewards"].reshape(4, 4, 3)[1])
    assert done.sum() == 0  # cut at max_completion_length 4: time limits bootstrap


def test_update_strategy_trains_and_checkpoints_its_state():
    m, b = _control_batch()
    s = MADDPGUpdate(maddpg_batch_size=8, maddpg_update_every=4, maddpg_warmup=8, seed=0)

    class Ctx:
        pass
    w0 = [p.clone() for p in m.parameters()]
    out = s(batch=b, model=m, ctx=Ctx())
    assert out["maddpg/updates"] == 4 and out["maddpg/buffer"] == 16 and math.isfinite(out["loss"])
    assert any(not torch.equal(p0, p) for p0, p in zip(w0, m.parameters()))  # the shared actor moved
    state = s.state_dict()
    s2 = MADDPGUpdate(maddpg_batch_size=8, maddpg_update_every=4, maddpg_warmup=8, seed=0)
    s2.load_state_dict(state)
    s2.learner = s2._build(m)  # built at its first call; the loaded state is applied then
    for c, c2 in zip(s.learner.critics[0], s2.learner.critics[0]):
        assert all(torch.equal(p, q) for p, q in zip(c.parameters(), c2.parameters()))
    assert torch.equal(s2.learner.buffers[0][0].x[:16], s.learner.buffers[0][0].x[:16]) and s2.steps == 16


@pytest.mark.parametrize("seed", LEARNING_SEEDS)
def test_critic_learns_and_actors_improve_against_it(seed):
    """The smaller property (MADDPG's return on simple_spread needs a few hundred episodes, more than the suite
    affords: docs/control.md has that run): on 20 random-policy episodes of simple_spread (N = 3) held in the
    buffers, 100 MADDPG updates (batch 64) lower the critics' squared TD error on those transitions and make
    each agent's greedy action score higher under its critic than the random behaviour action (the mean over
    agents of Q_i(greedy a_i, the others' stored actions) - Q_i(stored actions)). Measured (seeds 0 / 1 / 2, one
    thread): TD error 1.369 -> 0.018, 1.266 -> 0.020, 1.418 -> 0.024; greedy-minus-behaviour Q 0.051, 0.047,
    0.041. Asserted: TD error at most half its start, the gap above 0.02."""
    from grpolab.policies._control.envs import Env
    env = Env("pettingzoo:mpe2.simple_spread_v3", {"N": 3, "max_cycles": 25})
    g = torch.Generator().manual_seed(seed)
    xs, as_, rs, x2s, ds = [], [], [], [], []
    for ep in range(20):
        o, done = torch.from_numpy(env.reset(seed * 1000 + ep)), False
        while not done:
            a = torch.randint(0, 5, (3,), generator=g)
            o2, rw, done, term = env.step(a.numpy())
            o2 = torch.from_numpy(o2)
            xs.append(o), as_.append(a), rs.append(torch.from_numpy(rw)), x2s.append(o2), ds.append(float(term))
            o = o2
    x, a, r, x2, done = torch.stack(xs), torch.stack(as_), torch.stack(rs), torch.stack(x2s), torch.tensor(ds)
    torch.manual_seed(seed)
    L = MADDPG([[relu_mlp(18, 64, 5) for _ in range(3)]], 18, 5, batch_size=64, seed=seed)
    L.add(x, a, r, x2, done, torch.zeros(len(x), 3, dtype=torch.long))

    @torch.no_grad()
    def measure():
        onehot = torch.nn.functional.one_hot(a, 5).float()
        td, gap = [], []
        for i in range(3):
            z = L.actors[0][i](x[:, i])
            greedy = onehot.clone()
            greedy[:, i] = torch.nn.functional.one_hot(z.argmax(-1), 5).float()
            q = L.critics[0][i](critic_input(x, onehot, i))[:, 0]
            a2 = torch.stack([torch.softmax(L.target_actor(0, j)(x2[:, j]), -1) for j in range(3)], 1)
            y = td_target(r[:, i], done, L.target_critics[0][i](critic_input(x2, a2, i))[:, 0], L.gamma)
            td.append(float((q - y).pow(2).mean()))
            gap.append(float((L.critics[0][i](critic_input(x, greedy, i))[:, 0] - q).mean()))
        return sum(td) / 3, sum(gap) / 3
    td0, _ = measure()
    for _ in range(100):
        L.update()
    td1, gap1 = measure()
    assert td1 < 0.5 * td0 and gap1 > 0.02, (td0, td1, gap1)


@pytest.mark.parametrize("seed", LEARNING_SEEDS)
def test_train_maddpg_raises_the_return_on_every_seed(seed):
    """The return rises: train_maddpg on simple_spread with 2 agents and 10-step episodes (a smaller instance than
    the docs' N = 3, 25 steps, so that it fits the suite), 160 episodes, batch 128, an update every 2 environment
    steps after 128 transitions (737 updates). The mean return of the last 40 episodes minus the first 40's,
    measured (one thread): seeds 0 / 1 / 2: +0.75, +1.62, +1.05 (seeds 3 / 4 / 5: +0.33, +1.43, +0.65); at 240
    episodes +1.11, +3.50, +0.71. Asserted: a rise of 0.25."""
    from grpolab.policies._control.maddpg import train_maddpg

    r = train_maddpg(env_kwargs={"N": 2, "max_cycles": 10}, episodes=160, seed=seed, batch_size=128,
                     update_every=2, warmup=128, max_steps=10)
    first, last = sum(r["returns"][:40]) / 40, sum(r["returns"][-40:]) / 40
    assert last > first + 0.25, (first, last)


def test_per_variable_clipping_and_per_agent_targets_as_the_authors():
    """openai/maddpg clips each variable's gradient on its own (tf_util.minimize_and_clip: tf.clip_by_norm per
    variable) and moves an agent's targets right after its own update (train.py: each agent.update ends with its
    p_update / q_update). By hand on a Linear(3, 2): weight gradient all ones (norm sqrt 6 = 2.449) -> each entry
    0.5 / sqrt 6; bias gradient (0.03, 0.04) (norm 0.05 < 0.5) unchanged. The global form scales both by
    0.5 / sqrt(6 + 0.0025). Order: when agent 1's update starts, agent 0's target actor has already moved to
    0.99 target + 0.01 actor (per_agent, the default); with after_all it has not."""
    from grpolab.policies._control.maddpg import clip_gradients
    lin = torch.nn.Linear(3, 2)
    for mode in ("per_variable", "global"):
        lin.weight.grad, lin.bias.grad = torch.ones(2, 3), torch.tensor([0.03, 0.04])
        clip_gradients(lin.parameters(), 0.5, mode)
        f = 0.5 / math.sqrt(6) if mode == "per_variable" else 0.5 / math.sqrt(6 + 0.0025)
        assert torch.allclose(lin.weight.grad, torch.full((2, 3), f), atol=1e-6)
        want_b = torch.tensor([0.03, 0.04]) * (1.0 if mode == "per_variable" else f)
        assert torch.allclose(lin.bias.grad, want_b, atol=1e-7), mode
    for mode, moved in (("per_agent", True), ("after_all", False)):
        torch.manual_seed(0)
        L = MADDPG([[relu_mlp(3, 8, 4) for _ in range(2)]], 3, 4, hidden=8, batch_size=16, tau=0.01, seed=0,
                   target_update=mode)
        L.add(*_random_buffer(L, 32), torch.zeros(32, 2, dtype=torch.long))
        t0 = [p.clone() for p in L.target_actor(0, 0).parameters()]
        seen, inner = {}, L._update_one

        def spy(k, i, inner=inner, L=L):
            if i == 1:
                seen["t"] = [p.clone() for p in L.target_actor(0, 0).parameters()]
                seen["a"] = [p.clone() for p in L.actors[0][0].parameters()]
            return inner(k, i)
        L._update_one = spy
        L.update()
        want = [0.99 * a + 0.01 * b for a, b in zip(t0, seen["a"])] if moved else t0
        assert all(torch.allclose(p, q, atol=1e-7) for p, q in zip(seen["t"], want)), mode
    with pytest.raises(Exception, match="clip mode"):
        MADDPG([[relu_mlp(3, 8, 4) for _ in range(2)]], 3, 4, clip_mode="norm")
