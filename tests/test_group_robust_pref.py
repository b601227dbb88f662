"""Group Robust Preference Optimization (arXiv:2405.20304, seed 000-57): task arithmetic_prefs, rollout
preference_pairs, update strategy group_robust_dpo (stages/update_group_robust_dpo.py), recipe group_robust_dpo.

Expected values are derived by hand in the comments (the authors' bandit code, group_robust_dpo_vectorised_gradfix.py
batch_update_once: group loss = batch mean of -log sigmoid(beta * margin) per group; alpha <- alpha * exp(eta * L),
renormalised, before the parameter step; step on sum_g alpha_g * mean_{p in g} grad l_p).
"""
from __future__ import annotations

import json
import math

import pytest
import torch
import torch.nn.functional as F

from grpolab.algorithms.aggregation import StepTotals, seq_mean_token_mean
from grpolab.algorithms.losses import group_dpo
from grpolab.batch import RolloutBatch
from grpolab.stages.update_group_robust_dpo import GroupRobustDPO, alpha_step, group_losses, pair_margins


def _batch(logp, ref, mask, chosen, labeller):
    R, T = logp.shape
    b = RolloutBatch(prompt_ids=torch.zeros(R, 1, dtype=torch.long), prompt_mask=torch.ones(R, 1, dtype=torch.long),
                     completion_ids=torch.ones(R, T, dtype=torch.long), completion_mask=mask.clone(),
                     behavior_logprobs=logp.detach().clone(), group_ids=torch.arange(R) // 2,
                     prompt_uids=torch.arange(R) // 2, truncated=torch.zeros(R, dtype=torch.bool))
    b.ref_logprobs = ref.clone()
    b.row_data["pref_chosen"] = torch.tensor(chosen, dtype=torch.float32)
    b.row_data["labeller_group"] = torch.tensor(labeller)
    b.scalar_rewards = torch.tensor(chosen, dtype=torch.float32)
    return b


# three pairs (rows 2k = chosen, 2k+1 = rejected); pairs 0, 1 labelled by group 0 (A), pair 2 by group 1 (B)
LOGP = torch.tensor([[-1.0, -2.0], [-3.0, -1.0],      # pair 0
                     [-2.0, -2.0], [-1.0, -0.5],      # pair 1
                     [-0.5, -9.0], [-4.0, -1.0]])     # pair 2: chosen row has one loss token (mask 1, 0)
REF = torch.tensor([[-2.0, -2.0], [-2.0, -2.0],
                    [-1.0, -1.0], [-1.0, -1.0],
                    [-1.0, -5.0], [-2.0, -2.0]])
MASK = torch.tensor([[1, 1], [1, 1], [1, 1], [1, 1], [1, 0], [1, 1]], dtype=torch.float32)
CHOSEN = [1, 0, 1, 0, 1, 0]
LABELLER = [0, 0, 0, 0, 1, 1]
# h = sum_t (logp - ref) * mask:
#   pair 0: h_w = (1) + (0) = 1;       h_l = (-1) + (1) = 0;       m0 = 1
#   pair 1: h_w = (-1) + (-1) = -2;    h_l = (0) + (0.5) = 0.5;    m1 = -2.5
#   pair 2: h_w = (0.5) (2nd masked);  h_l = (-2) + (1) = -1;      m2 = 1.5
MARGINS = [1.0, -2.5, 1.5]


def test_dpo_pair_loss_by_hand():
    m, rows = pair_margins(LOGP, REF, MASK, torch.arange(6) // 2, torch.tensor(CHOSEN, dtype=torch.float32))
    assert m.tolist() == pytest.approx(MARGINS)
    assert rows.tolist() == [0, 2, 4]
    beta = 0.1
    # l = -log sigmoid(0.1 m) = log(1 + exp(-0.1 m)):
    #   m0 = 1:    log(1 + e^-0.1)  = log(1.904837) = 0.644397
    #   m1 = -2.5: log(1 + e^0.25)  = log(2.284025) = 0.825939
    #   m2 = 1.5:  log(1 + e^-0.15) = log(1.860708) = 0.620957
    loss = -F.logsigmoid(beta * m)
    assert loss.tolist() == pytest.approx([0.644397, 0.825939, 0.620957], abs=1e-6)
    # group means: A = (0.644397 + 0.825939) / 2 = 0.735168; B = 0.620957
    L, counts = group_losses(loss, torch.tensor([0, 0, 1]), 2)
    assert L.tolist() == pytest.approx([0.735168, 0.620957], abs=1e-6) and counts.tolist() == [2, 1]
    # a group with no pair in the batch: loss 0, count 0
    L3, c3 = group_losses(loss, torch.tensor([0, 0, 1]), 3)
    assert L3[2] == 0 and c3[2] == 0
    with pytest.raises(ValueError, match="labeller groups must be 0..1"):
        group_losses(loss, torch.tensor([0, 2, 1]), 2)


def test_alpha_step_by_hand():
    # alpha = (0.5, 0.5), L = (0.2, 0.9), eta = 0.5: alpha ~ (0.5 e^0.1, 0.5 e^0.45) = (0.552585, 0.784156),
    # sum 1.336742 -> (0.413382, 0.586618)
    a = alpha_step(torch.tensor([0.5, 0.5], dtype=torch.float64), torch.tensor([0.2, 0.9], dtype=torch.float64), 0.5)
    assert a.tolist() == pytest.approx([0.413382, 0.586618], abs=1e-6)
    # unequal start (0.8, 0.2), L = (1, 3), eta = 1: (0.8 e, 0.2 e^3) = (2.174625, 4.017107) -> (0.351214, 0.648786)
    a = alpha_step(torch.tensor([0.8, 0.2], dtype=torch.float64), torch.tensor([1.0, 3.0], dtype=torch.float64), 1.0)
    assert a.tolist() == pytest.approx([0.351214, 0.648786], abs=1e-6)
    # eta 0 leaves alpha as it is; equal losses leave it as it is
    same = torch.tensor([0.3, 0.7], dtype=torch.float64)
    assert alpha_step(same, torch.tensor([0.1, 5.0], dtype=torch.float64), 0.0).tolist() == pytest.approx([0.3, 0.7])
    assert alpha_step(same, torch.tensor([2.0, 2.0], dtype=torch.float64), 3.0).tolist() == pytest.approx([0.3, 0.7])


def test_alpha_moves_towards_the_worse_group():
    """With fixed losses, the worse group's weight rises every step and tends to 1 (the max over the simplex)."""
    alpha = torch.tensor([0.9, 0.1], dtype=torch.float64)   # the worse group starts as the small one
    losses = torch.tensor([0.4, 0.7], dtype=torch.float64)
    seen = [float(alpha[1])]
    for _ in range(60):
        alpha = alpha_step(alpha, losses, 0.5)
        seen.append(float(alpha[1]))
    assert all(b > a for a, b in zip(seen, seen[1:]))
    # closed form: alpha_1(k) = 0.1 e^{0.35 k} / (0.9 e^{0.2 k} + 0.1 e^{0.35 k}); k = 60: 1 / (1 + 9 e^-9) = 0.998890
    assert seen[-1] == pytest.approx(1 / (1 + 9 * math.exp(-9)), abs=1e-6)


def test_update_strategy_alpha_and_row_weights_by_hand():
    """GroupRobustDPO.weights on the fabricated batch: alpha after one step and the per-row weights."""
    s = GroupRobustDPO(group_robust_dpo_num_groups=2, group_robust_dpo_eta=2.0)
    b = _batch(LOGP, REF, MASK, CHOSEN, LABELLER)
    out = s.weights(b, 0.1)
    # L = (0.735168, 0.620957); alpha ~ (0.5 e^{1.470336}, 0.5 e^{1.241914}) -> alpha_A = 1 / (1 + e^{-0.228422})
    alpha_a = 1 / (1 + math.exp(-2.0 * (0.735168 - 0.620957)))
    assert out["loss"].tolist() == pytest.approx([0.735168, 0.620957], abs=1e-6)
    assert s.alpha.tolist() == pytest.approx([alpha_a, 1 - alpha_a], abs=1e-6)
    # row weight = P alpha_g / N_g, P = 3: A rows 3 alpha_A / 2, B rows 3 alpha_B / 1
    w = b.token_weights[:, 0]
    assert w.tolist() == pytest.approx([1.5 * alpha_a] * 4 + [3 * (1 - alpha_a)] * 2, abs=1e-6)
    # the batch must come from preference_pairs; the run must use group_dpo and seq_mean_token_mean
    from types import SimpleNamespace
    from grpolab.stages.update_group_robust_dpo import _needs
    with pytest.raises(ValueError, match="pair labels"):
        s.weights(RolloutBatch(**{k: getattr(b, k) for k in ("prompt_ids", "prompt_mask", "completion_ids",
                                                             "completion_mask", "behavior_logprobs", "group_ids",
                                                             "prompt_uids", "truncated")}), 0.1)
    _needs(SimpleNamespace(rollout_strategy="preference_pairs", policy_loss="group_dpo",
                           loss_aggregation="seq_mean_token_mean"))
    with pytest.raises(ValueError, match="policy_loss: group_dpo"):
        _needs(SimpleNamespace(rollout_strategy="preference_pairs", policy_loss="clipped_ratio",
                               loss_aggregation="seq_mean_token_mean"))
    # state round trip
    t = GroupRobustDPO(group_robust_dpo_num_groups=2, group_robust_dpo_eta=2.0)
    t.load_state_dict(s.state_dict())
    assert t.alpha.tolist() == s.alpha.tolist()
    # a pair whose chosen row does not have the higher reward: group_dpo would train it the other way round
    bad = _batch(LOGP, REF, MASK, CHOSEN, LABELLER)
    bad.scalar_rewards = torch.zeros(6)
    with pytest.raises(ValueError, match="higher reward"):
        s.weights(bad, 0.1)


def test_weighted_loss_gradient_is_alpha_weighted_group_gradients():
    """The loss the trainer builds (group_dpo x token weights, seq_mean_token_mean) has gradient
    sum_g alpha_g grad L_g with the alpha *after* this step's update, L_g the mean pair loss of group g."""
    theta = torch.zeros(6, 2, requires_grad=True)
    logp = LOGP + theta * torch.arange(1, 13, dtype=torch.float32).view(6, 2) / 10  # logp depends on theta
    s = GroupRobustDPO(group_robust_dpo_num_groups=2, group_robust_dpo_eta=1.5)
    b = _batch(logp.detach(), REF, MASK, CHOSEN, LABELLER)
    s.weights(b, 0.1)
    alpha = s.alpha.clone()
    per_tok, _ = group_dpo(logp, b.behavior_logprobs, torch.zeros(6), MASK, b.group_ids, ref_logprobs=REF, batch=b,
                           dpo_beta=0.1)
    totals = StepTotals.from_masks([MASK], constant=2)
    loss = seq_mean_token_mean(per_tok * b.token_weights, MASK, totals)
    (g_loss,) = torch.autograd.grad(loss, theta, retain_graph=True)
    # independently: l_p = -log sigmoid(0.1 (h_w - h_l)) from logp, L_A = (l_0 + l_1) / 2, L_B = l_2
    h = ((logp - REF) * MASK).sum(-1)
    lp = -F.logsigmoid(0.1 * (h[[0, 2, 4]] - h[[1, 3, 5]]))
    target = alpha[0].float() * (lp[0] + lp[1]) / 2 + alpha[1].float() * lp[2]
    (g_ref,) = torch.autograd.grad(target, theta)
    assert loss.item() == pytest.approx(target.item(), rel=1e-5)
    assert torch.allclose(g_loss, g_ref, atol=1e-6)
    # and alpha is not uniform here, so this is not the plain mean over pairs
    assert abs(alpha[0] - 0.5) > 0.01


def test_task_groups_disagree_and_rollout_pairs(tiny_args):
    from grpolab.tasks import get_task
    t = get_task("arithmetic_prefs")
    tr, ev = t.train_rows, t.eval_rows
    assert len(tr) == 1722 and len(ev) == 400
    share_b = sum(r["labeller_group"] for r in tr) / len(tr)
    assert 0.2 < share_b < 0.3
    for r in tr[:50] + ev[:50]:   # A prefers 'Answer: v'; B the other reply: the groups disagree on every pair
        formatted = f"Answer: {r['answer']}"
        assert (r["chosen"] == formatted) == (r["labeller_group"] == 0)
        assert {r["chosen"], r["rejected"]} >= {formatted}
    assert [r["labeller_group"] for r in ev[:4]] == [0, 1, 0, 1] and ev[0]["chosen"] == ev[1]["rejected"]
    assert "Reader:" not in json.dumps(tr[0]["prompt"])
    tagged = get_task("arithmetic_prefs", arithmetic_prefs_tag_group=True)
    assert [r["prompt"][0]["content"].endswith(f"Reader: group {'AB'[r['labeller_group']]}.")
            for r in tagged.eval_rows[:2]] == [True, True]
    assert [r["chosen"] for r in tagged.train_rows[:20]] == [r["chosen"] for r in tr[:20]]  # same pairs, same labels
    reward = dict((n, f) for n, f, _ in t.rewards)["preferred"]
    assert reward(completions=["Answer: 3 ", "3"], chosen=["Answer: 3", "Answer: 3"]) == [1.0, 0.0]


def _run(tiny_args, **over):
    from grpolab.config import Config
    from grpolab.recipes import recipe_overrides
    from grpolab.train.trainer import Trainer
    args = {**recipe_overrides("group_robust_dpo"), "model": "tiny", "max_completion_length": 16,
            "micro_batch_size": 32, "threads": 1, "eval_before": False, "eval_after": False, "tensorboard": False,
            "save_steps": 1000, "out": tiny_args["out"], **over}
    t = Trainer(Config.build(args), log=lambda *a: None)
    t.train(progress=False)
    rows = [json.loads(x) for x in open(f"{args['out']}/metrics.jsonl")]
    return t, rows


def test_short_run_alpha_follows_the_worse_group(tiny_args):
    """A short run of the recipe: every step, alpha_B rises exactly when group B's batch loss is the larger
    (the exponentiated-gradient step), and eta 0 keeps alpha uniform."""
    t, rows = _run(tiny_args, steps=6, learning_rate=1e-3)
    assert t.ref_model is not None and len(rows) == 6
    prev, checked = 0.5, 0
    for r in rows:
        la, lb = r.get("rollout/grdpo_loss_0"), r.get("rollout/grdpo_loss_1")
        a_b = r["rollout/grdpo_alpha_1"]
        if la is not None and lb is not None and abs(la - lb) > 1e-9:
            assert (a_b > prev) == (lb > la)
            checked += 1
        prev = a_b
    assert checked >= 3  # steps with both groups in the batch and unequal losses
    _, rows0 = _run(tiny_args, steps=2, group_robust_dpo_eta=0.0, out=tiny_args["out"] + "_eta0")
    assert all(r["rollout/grdpo_alpha_1"] == pytest.approx(0.5) for r in rows0)


def heldout_preferences(t, beta=0.1):
    """Per labeller group on the held-out pairs (every held-out prompt labelled by both groups): the share of
    pairs whose margin h(y_w) - h(y_l) under the trained policy against the reference is > 0, and the mean DPO
    loss -log sigmoid(beta m)."""
    from grpolab.rollouts.preference_pairs import preference_pairs
    rows = t.eval_rows
    b = preference_pairs(t.ctx, rows, list(range(len(rows))), t.ctx.allocate_groups(len(rows)))
    logp = t.ctx.logprobs(b)
    with t.ctx.reference_policy() as ref:
        ref_logp = t.ctx.logprobs(b, model=ref)
    h = ((logp - ref_logp) * b.completion_mask).sum(-1).double()   # rows alternate chosen, rejected
    assert b.row_data["pref_chosen"].tolist() == [1.0, 0.0] * len(rows)
    m = h[0::2] - h[1::2]
    g = b.row_data["labeller_group"][0::2]
    return {k: (float((m[g == k] > 0).double().mean()), float(-F.logsigmoid(beta * m[g == k]).mean()))
            for k in (0, 1)}


def test_robust_weighting_protects_the_minority_group(tiny_args):
    """30 steps of the recipe on the tiny model against plain DPO (every pair weight 1). Measured on seeds
    0, 1, 2 (docs/variants/objectives.md, group_robust_dpo): worst-group held-out DPO loss robust 0.695 /
    0.798 / 0.806 against plain DPO 1.974 / 1.638 / 1.513; plain DPO's minority group B loses every held-out
    pair (accuracy 0.0 on all three); the robust run's worst-group accuracy is 0.45 / 0.0 / 0.0, so it is not
    higher on every seed, and neither is it against uniform alpha (eta 0: 0.0 / 0.27 / 0.40; the groups
    disagree on every pair, so any balanced weighting ends near a coin flip per prompt). Asserted here (seed 0):
    what held on all three seeds."""
    common = {"seed": 0, "steps": 30, "learning_rate": 1e-3}
    t, _ = _run(tiny_args, **common)
    robust = heldout_preferences(t)
    t, _ = _run({"out": tiny_args["out"] + "_dpo"}, group_robust_dpo_weighting="pairs", **common)
    plain = heldout_preferences(t)
    assert plain[1][0] == 0.0 and plain[0][0] == 1.0           # plain DPO: the majority's preference wins
    worst = lambda r: (min(r[0][0], r[1][0]), max(r[0][1], r[1][1]))  # noqa: E731
    assert worst(robust)[1] < worst(plain)[1] - 0.3             # measured gaps: 1.28, 0.84, 0.71
    assert worst(robust)[0] >= worst(plain)[0]
