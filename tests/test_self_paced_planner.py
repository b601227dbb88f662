"""Self-Paced GRPO (seed 000-36: reward transform self_paced, task digit_frames, policy flow_frames) and the
multi-head diffusion planner (seed 000-55: policy ddpm_planner, task toy_planner). Expected values by hand."""
import math

import numpy as np
import pytest
import torch

from grpolab.rewards.transforms import SelfPaced, self_paced_weights

NAMES = ["frame_fidelity", "frame_coherence", "frame_alignment"]


def _sig(x):
    return 1 / (1 + math.exp(-x))


# ------------------------------------------------------------------------------------------- self_paced


def test_self_paced_hand_weights():
    # tau = 1/3, 2/3, kappa = 0.1: g1(0) = sig(-10/3), g2(0) = sig(-20/3); c = 1/2: sig(+-5/3); c = 1 mirrors c = 0
    g_a, g_b, g_c = 1 / (1 + math.exp(10 / 3)), 1 / (1 + math.exp(20 / 3)), 1 / (1 + math.exp(-5 / 3))
    assert self_paced_weights(0.0) == pytest.approx([1 - g_a, g_a - g_b, g_b], abs=1e-12)
    assert self_paced_weights(0.5) == pytest.approx([1 - g_c, g_c - (1 - g_c), 1 - g_c], abs=1e-12)
    assert self_paced_weights(1.0) == pytest.approx([g_b, g_a - g_b, 1 - g_a], abs=1e-12)
    assert self_paced_weights(0.0) == pytest.approx([0.96555, 0.03318, 0.00127], abs=1e-5)
    assert self_paced_weights(0.5) == pytest.approx([0.15887, 0.68226, 0.15887], abs=1e-5)
    # the transform: the first batch sets c to its normalised mean fidelity, the scalar is sum_j w_j R_j
    t = SelfPaced()
    R = torch.tensor([[0.4, -0.1, 0.2], [0.6, -0.3, 0.8]])  # mean fidelity 0.5 -> c = 0.5
    out = t(torch.zeros(2), R, NAMES, step=0)
    w = [1 - g_c, 2 * g_c - 1, 1 - g_c]
    assert t.competence == pytest.approx(0.5)
    assert out.tolist() == pytest.approx([0.4 * w[0] - 0.1 * w[1] + 0.2 * w[2], 0.6 * w[0] - 0.3 * w[1] + 0.8 * w[2]],
                                         abs=1e-6)
    # the next step: c = 0.9 * 0.5 + 0.1 * 1.0 = 0.55; called twice in a step, the update is not applied twice
    R2 = torch.tensor([[1.0, 0.0, 0.0], [1.0, 0.0, 1.0]])
    t(torch.zeros(2), R2, NAMES, step=1)
    out2 = t(torch.zeros(2), R2, NAMES, step=1)
    assert t.competence == pytest.approx(0.55)
    g1, g2 = _sig((0.55 - 1 / 3) / 0.1), _sig((0.55 - 2 / 3) / 0.1)
    assert out2.tolist() == pytest.approx([1 - g1, 1 - g1 + g2], abs=1e-6)
    # fidelity range: [0.2, 0.6] maps mean 0.5 to c = 0.75; a NaN row stays NaN and is left out of c
    t = SelfPaced(self_paced_fidelity_range=[0.2, 0.6])
    R = torch.tensor([[0.4, 0.0, 0.0], [0.6, 0.0, 0.0], [0.0, float("nan"), 0.0]])
    out = t(torch.zeros(3), R, NAMES, step=0)
    assert t.competence == pytest.approx(0.75) and math.isnan(out[2]) and not math.isnan(out[0])
    with pytest.raises(ValueError, match="frame_alignment"):
        SelfPaced()(torch.zeros(1), torch.zeros(1, 2), NAMES[:2], step=0)


def test_self_paced_monotone_hand_over():
    cs = np.linspace(0, 1, 101)
    W = np.array([self_paced_weights(c) for c in cs])
    assert np.allclose(W.sum(1), 1) and (W >= 0).all()
    assert (np.diff(W[:, 0]) < 0).all() and (np.diff(W[:, 2]) > 0).all()  # fidelity falls, alignment rises
    stage = W.argmax(1)
    assert (np.diff(stage) >= 0).all() and set(stage) == {0, 1, 2}  # fidelity -> coherence -> alignment, in order
    assert W[:, 1].argmax() == 50  # coherence peaks midway between the thresholds
    # competence rising over steps moves the weight along the curriculum
    t = SelfPaced(self_paced_momentum=0.5)
    seen = []
    for step, fid in enumerate([0.0, 0.2, 0.5, 0.8, 1.0, 1.0, 1.0]):
        t(torch.zeros(1), torch.tensor([[fid, 0.0, 0.0]]), NAMES, step=step)
        seen.append(t.weights())
    assert [int(np.argmax(w)) for w in seen] == sorted(int(np.argmax(w)) for w in seen)
    assert np.argmax(seen[0]) == 0 and np.argmax(seen[-1]) == 2


def test_self_paced_state_round_trip():
    a = SelfPaced()
    for step, fid in enumerate([0.3, 0.7]):
        a(torch.zeros(1), torch.tensor([[fid, 0.0, 0.0]]), NAMES, step=step)
    import json
    state = json.loads(json.dumps(a.state_dict()))  # plain numbers: checkpoints and JSON keep them
    b = SelfPaced()
    b.load_state_dict(state)
    R = torch.tensor([[0.9, -0.2, 0.5]])
    assert b(torch.zeros(1), R, NAMES, step=2).item() == a(torch.zeros(1), R, NAMES, step=2).item()
    assert b.competence == a.competence == pytest.approx(0.9 * (0.9 * 0.3 + 0.1 * 0.7) + 0.1 * 0.9)
    # a resumed run that re-scores the step it stopped in recomputes that step's update, as the original did
    c = SelfPaced()
    c.load_state_dict(a.state_dict())
    assert c(torch.zeros(1), R, NAMES, step=2).item() == a(torch.zeros(1), R, NAMES, step=2).item()


# ------------------------------------------------------------------------------------------- digit_frames


def _stack(img: np.ndarray) -> np.ndarray:
    """[8, 8] in [0, 1] -> [8, 8, 3]: frame t shifted right by t pixels."""
    from grpolab.policies.flow_frames.tasks import shift
    return np.stack([shift(img, t) for t in range(3)], -1).astype(np.float32)


def test_digit_frames_rewards_on_hand_made_frames():
    from sklearn.datasets import load_digits

    from grpolab.policies.flow_frames.tasks import frame_alignment, frame_coherence, frame_fidelity, frames_correct

    # one lit pixel at (3, 3) in every frame (no motion): |f1 - S1 f0| is 1 at (3, 3) and (3, 4): 2/64 per pair
    dot = np.zeros((8, 8, 3), np.float32)
    dot[3, 3] = 1
    assert frame_coherence(None, [dot]) == pytest.approx([-2 / 64])
    # the same pixel moving right one column a frame: coherent
    assert frame_coherence(None, [_stack(dot[..., 0])]) == pytest.approx([0.0])
    # frames 0 / 1 / 1: pair (0, 1) coherent, pair (1, 2) off by 2 pixels -> (0 + 2/64) / 2
    half = _stack(dot[..., 0])
    half[..., 2] = half[..., 1]
    assert frame_coherence(None, [half]) == pytest.approx([-1 / 64])
    # a real digit moving right: coherent, a clean digit in every frame, the asked class on the last frame
    d = load_digits()
    img = (d.images[1] / 16.0).astype(np.float32)  # a held-out (odd-indexed) digit
    k = int(d.target[1])
    frames = _stack(img)
    assert frame_coherence(None, [frames]) == pytest.approx([0.0])
    fid = frame_fidelity(None, [frames])[0]
    right, wrong = frame_alignment(None, [frames, frames], label=[k, (k + 1) % 10])
    assert fid > 0.8 and right > 0.8 and wrong < 0.1
    assert frames_correct(None, [frames, frames], label=[k, (k + 1) % 10]) == [1.0, 0.0]
    # alignment reads the last frame only: a blank last frame loses it, the first two keep some fidelity
    blank_last = frames.copy()
    blank_last[..., 2] = 0
    assert frame_alignment(None, [blank_last], label=[k])[0] < right
    assert frame_fidelity(None, [blank_last])[0] < fid
    with pytest.raises(ValueError, match=r"\[8, 8, 3\]"):
        frame_fidelity(None, [np.zeros((8, 8, 1), np.float32)])
    assert frame_fidelity(None, []) == [] and frame_coherence(None, []) == []


# ------------------------------------------------------------------------------------------- toy_planner / ddpm_planner


def test_toy_planner_rewards_hand_computed():
    from grpolab.policies.ddpm_planner.tasks import (planner_fast, planner_reached, planner_safe, planner_speed,
                                           planner_strategy, toy_planner)

    s, g = [-1.0, 0.0], [1.0, 0.0]
    line = np.array([[-1 + 0.25 * k, 0.0] for k in range(1, 9)], np.float32)  # the demonstration: 0.25 a step
    far, near = [0.0, 0.5, 0.2], [0.0, 0.1, 0.2]  # obstacle 0.5 above waypoint 4 (0, 0) / 0.1 above, radius 0.2
    assert planner_fast(None, [line], start=[s], goal=[g]) == pytest.approx([0.25])
    assert planner_speed(None, [line], start=[s]) == pytest.approx([0.25])
    # clearance 0.5 - 0.2 = 0.3, capped at 0.25; smoothness 0 on a constant-speed line
    assert planner_safe(None, [line, line], start=[s, s], obstacle=[far, near]) == pytest.approx([0.25, -0.1])
    # a kink: waypoint 4 lifted to (0, 0.1): accelerations (0, .1), (0, -.2), (0, .1) at k = 3, 4, 5 -> mean |.|^2
    # over 7 = (0.01 + 0.04 + 0.01) / 7; clearance from (0, 0.5): 0.4 - 0.2
    kink = line.copy()
    kink[3, 1] = 0.1
    assert planner_safe(None, [kink], start=[s], obstacle=[far]) == pytest.approx([0.2 - 10 * 0.06 / 7])
    # twice as fast, stopping at x = 1 after 4 steps: progress (2 / 8) stays, the speed is the mean step length
    dash = np.array([[min(-1 + 0.5 * k, 1.0), 0.0] for k in range(1, 9)], np.float32)
    assert planner_fast(None, [dash], start=[s], goal=[g]) == pytest.approx([0.25])
    assert planner_speed(None, [dash], start=[s]) == pytest.approx([0.25])
    over = line * np.array([1.5, 1.0], np.float32) + np.array([0.5, 0.0], np.float32)  # p_8 = (2, 0)
    assert planner_fast(None, [over], start=[s], goal=[g]) == pytest.approx([3 / 8])
    # the row's head picks its reward; head 2 has none
    r = planner_strategy(None, [line, line, line], head=[0, 1, 2], start=[s] * 3, goal=[g] * 3, obstacle=[near] * 3)
    assert r[0] == pytest.approx(0.25) and r[1] == pytest.approx(-0.1) and r[2] is None
    assert planner_reached(None, [line, line, over], goal=[g] * 3, obstacle=[far, near, far]) == [1.0, 0.0, 0.0]
    with pytest.raises(ValueError, match=r"\[8, 2\]"):
        planner_fast(None, [np.zeros((8, 3), np.float32)], start=[s], goal=[g])
    # one row per (scene, head): both heads of every scene, the same scene columns
    task = toy_planner(n_scenes=3)
    assert len(task.train_rows) == 6 and len(task.eval_rows) == 16
    by_scene = {}
    for row in task.train_rows:
        by_scene.setdefault(row["prompt"].rsplit(" head", 1)[0], []).append(row)
    assert all(sorted(r["head"] for r in rs) == [0, 1] and rs[0]["obstacle"] == rs[1]["obstacle"]
               for rs in by_scene.values())


def test_ddpm_planner_first_pass_ratio_is_one_and_steps_are_ddim():
    from grpolab.policies.ddpm_planner.policy import DDPMPlannerPolicy, PlannerDenoiser
    from grpolab.policies.ddpm_planner.tasks import planner_rows

    assert DDPMPlannerPolicy.schedule(10) == [(901, 801), (801, 701), (701, 601), (601, 501), (501, 401),
                                              (401, 301), (301, 201), (201, 101), (101, 1), (1, -99)]
    pol = DDPMPlannerPolicy(model="tiny")
    torch.manual_seed(0)
    net = PlannerDenoiser(width=16, heads=2)
    rows = planner_rows(2, 0)
    b = pol.sample(net, rows, [0, 1, 2, 3], num_generations=3, generator=torch.Generator().manual_seed(0))
    assert b.group_ids.tolist() == [0, 0, 0, 1, 1, 1, 2, 2, 2, 3, 3, 3]
    assert b.row_data["head"].tolist() == [0, 0, 0, 1, 1, 1] * 2
    assert b.columns["completion"][0].shape == (8, 2) and b.columns["completion"][0].dtype == np.float32
    lp = pol.forward(net, b, grad=False)["logprobs"]
    assert torch.allclose(lp, b.behavior_logprobs, atol=1e-5)
    # the last step (t = 1 -> t' clamped to 0): std = eta * sigma_t with alphas_cumprod[1], [0]
    acp = pol.alphas_cumprod.double()
    var = (1 - acp[0]) / (1 - acp[1]) * (1 - acp[1] / acp[0])
    std = pol.forward(net, b, want=frozenset({"step_std_dev"}), grad=False)["step_std_dev"][0, -1]
    assert std.item() == pytest.approx(var.sqrt().item(), rel=1e-4)


PLANNER_SEEDS = (0, 1, 2)


def test_planner_heads_tied_at_step_0_and_head_0_faster_after_training(tmp_path):
    """Heads identical at step 0 (weights and samples); after 8 GRPO steps, head 0 (progress reward) is faster than
    head 1 (clearance + smoothness) on each of 3 seeds. Measured (8 steps x 4 scenes-heads x 8 samples, held-out
    DDIM eta = 0 on 16 scenes): see the assertion's comment."""
    from grpolab.config import Config
    from grpolab.recipes import recipe_overrides
    from grpolab.policies.ddpm_planner.tasks import planner_rows, planner_speed
    from grpolab.train.trainer import Trainer

    rows = planner_rows(16, 777, noise=True)

    def speeds(t):
        b = t.policy.sample(t.model, rows, list(range(len(rows))), num_generations=1, evaluation=True)
        sp = np.array(planner_speed(None, b.columns["completion"], start=b.columns["start"]))
        h = np.array(b.columns["head"])
        return sp[h == 0], sp[h == 1]

    gaps = []
    for seed in PLANNER_SEEDS:
        args = {**recipe_overrides("mhd_planner_grpo"), "model": "tiny", "steps": 8, "prompts_per_step": 4,
                "seed": seed, "eval_before": False, "eval_after": False, "tensorboard": False,
                "out": str(tmp_path / f"run{seed}")}
        t = Trainer(Config.build(args), log=lambda *a: None)
        heads = t.model.heads
        assert all(torch.equal(p, q) for p, q in zip(heads[0].parameters(), heads[1].parameters()))
        f0, s0 = speeds(t)
        assert np.array_equal(f0, s0)  # tied heads: the same trajectory for the same scene and noise
        trunk = {n: p.detach().clone() for n, p in t.model.trunk.named_parameters()}
        t.train(progress=False)
        assert all(torch.equal(trunk[n], p) for n, p in t.model.trunk.named_parameters())  # trunk frozen
        f1, s1 = speeds(t)
        gaps.append(float(f1.mean() - s1.mean()))
    # measured [2-core CPU, busy]: gaps 0.155 / 0.119 / 0.074 on seeds 0 / 1 / 2 (head speeds 0.451 / 0.296,
    # 0.393 / 0.275, 0.369 / 0.295; 0.253 on both heads before; 6 steps: 0.10 / 0.09 / 0.06); the margin is ~2.5x
    # below the smallest
    assert min(gaps) > 0.03, gaps
