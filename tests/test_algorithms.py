"""Hand-computed values and required relations for the algorithm core."""
import math

import pytest
import torch

from grpolab.algorithms import (ADVANTAGES, AGGREGATIONS, KL_ESTIMATORS, POLICY_LOSSES, StepTotals,
                                combine_rewards, group_stats, kl_penalty)

from _helpers import micro_batched_loss

nan = float("nan")


def test_group_zscore_hand_computed():
    r = torch.tensor([1.0, 0.0, 0.0, 1.0])
    g = torch.zeros(4, dtype=torch.long)
    std = math.sqrt(1 / 3)  # Bessel: sum of squares 1.0 over n-1 = 3
    a = ADVANTAGES.get("group_zscore")(r, g, advantage_epsilon=1e-4)
    expected = torch.tensor([0.5, -0.5, -0.5, 0.5]) / (std + 1e-4)
    assert torch.allclose(a, expected, atol=1e-6)
    assert abs(float(a[0]) - 0.865875) < 1e-5


def test_group_zscore_nan_ragged_and_zero_variance():
    r = torch.tensor([1.0, 0.0, nan, 2.0, 2.0, 2.0, 5.0])
    g = torch.tensor([0, 0, 0, 1, 1, 1, 2])
    a = ADVANTAGES.get("group_zscore")(r, g, advantage_epsilon=1e-4)
    s = math.sqrt(0.5)
    assert torch.allclose(a[:2], torch.tensor([0.5, -0.5]) / (s + 1e-4), atol=1e-6)
    assert a[2] == 0  # unscorable row: no advantage
    assert torch.equal(a[3:6], torch.zeros(3))  # zero-variance group: exactly 0
    assert a[6] == 0  # single-row group
    mean, std, count = group_stats(r, g)
    assert count.tolist() == [2, 2, 2, 3, 3, 3, 1]
    assert float(mean[0]) == 0.5 and torch.isnan(std[6])


def test_group_mean_and_group_ids_not_order():
    r = torch.tensor([1.0, 3.0, 0.0, nan])
    g = torch.tensor([7, 2, 7, 2])  # interleaved, non-contiguous ids
    a = ADVANTAGES.get("group_mean")(r, g)
    assert a.tolist() == [0.5, 0.0, -0.5, 0.0]


def test_combine_rewards_weights_and_nan():
    m = torch.tensor([[1.0, nan], [nan, nan], [0.5, 1.0]])
    out = combine_rewards(m, torch.tensor([1.0, 0.5]))
    assert out[0] == 1.0 and torch.isnan(out[1]) and out[2] == 1.0


def test_clipped_ratio_values_and_metrics():
    fn = POLICY_LOSSES.get("clipped_ratio")
    logp = torch.log(torch.tensor([[1.5, 1.5, 0.5, 1.0]]))
    old = torch.zeros(1, 4)
    adv = torch.tensor([[1.0, -1.0, -1.0, 2.0]])
    mask = torch.ones(1, 4)
    loss, m = fn(logp, old, adv, mask, epsilon=0.2)
    # r=1.5,A=1 -> clip at 1.2; r=1.5,A=-1 -> unclipped -1.5 is the min; r=0.5,A=-1 -> clip 0.8; r=1 -> -A
    assert torch.allclose(loss, torch.tensor([[-1.2, 1.5, 0.8, -2.0]]), atol=1e-6)
    assert m["clip_frac_high"].tolist() == [[1.0, 0.0, 0.0, 0.0]]
    assert m["clip_frac_low"].tolist() == [[0.0, 0.0, 1.0, 0.0]]
    loss_hi, _ = fn(logp, old, adv, mask, epsilon=0.2, epsilon_high=0.28)
    assert abs(float(loss_hi[0, 0]) + 1.28) < 1e-6


def test_clipped_ratio_gradient_zero_when_clipped_and_pg_at_ratio_one():
    fn = POLICY_LOSSES.get("clipped_ratio")
    logp = torch.tensor([[math.log(1.5), 0.0]], requires_grad=True)
    adv = torch.tensor([1.0, 1.0])  # [R] advantages broadcast over tokens
    loss, _ = fn(logp, torch.zeros(1, 2), adv[:1], torch.ones(1, 2), epsilon=0.2)
    loss.sum().backward()
    assert logp.grad[0, 0] == 0  # clipped: no gradient
    assert abs(float(logp.grad[0, 1]) + 1.0) < 1e-6  # ratio 1: gradient of -A * logp


def test_kl_estimators_hand_computed():
    logp = torch.tensor([0.0])
    ref = torch.log(torch.tensor([0.5]))
    x = math.log(0.5)
    assert abs(float(KL_ESTIMATORS.get("k1")(logp, ref)) - (-x)) < 1e-6
    assert abs(float(KL_ESTIMATORS.get("k2")(logp, ref)) - 0.5 * x * x) < 1e-6
    assert abs(float(KL_ESTIMATORS.get("k3")(logp, ref)) - (0.5 - x - 1)) < 1e-6
    assert float(KL_ESTIMATORS.get("k3")(ref, ref)) == 0.0


def test_kl_straight_through_value_of_one_gradient_of_other():
    ref = torch.tensor([-1.0, -2.0, -0.3])
    lp1 = torch.tensor([-0.5, -2.5, -0.1], requires_grad=True)
    lp2 = lp1.detach().clone().requires_grad_(True)
    v = kl_penalty(lp1, ref, "k3", gradient="k2")
    v.sum().backward()
    KL_ESTIMATORS.get("k2")(lp2, ref).sum().backward()
    assert torch.allclose(v, KL_ESTIMATORS.get("k3")(lp1.detach(), ref))
    assert torch.allclose(lp1.grad, lp2.grad)


def test_aggregation_hand_computed():
    loss = torch.tensor([[1.0, 2.0, 3.0], [4.0, 9.0, 9.0]])
    mask = torch.tensor([[1.0, 1.0, 1.0], [1.0, 0.0, 0.0]])
    totals = StepTotals.from_masks([mask], constant=3)
    assert float(AGGREGATIONS.get("seq_mean_token_mean")(loss, mask, totals)) == pytest.approx(3.0)
    assert float(AGGREGATIONS.get("token_mean")(loss, mask, totals)) == pytest.approx(2.5)
    assert float(AGGREGATIONS.get("constant")(loss, mask, totals)) == pytest.approx(10 / 6)


def test_dr_grpo_equals_dapo_aggregation_at_full_length():
    torch.manual_seed(0)
    loss = torch.randn(5, 7)
    mask = torch.ones(5, 7)
    totals = StepTotals.from_masks([mask], constant=7)
    assert torch.allclose(AGGREGATIONS.get("constant")(loss, mask, totals),
                          AGGREGATIONS.get("token_mean")(loss, mask, totals))


def test_dr_grpo_and_dapo_normalisers_differ_on_unequal_lengths():
    """Dr. GRPO (arXiv:2503.20783) divides by G * L_max, DAPO (arXiv:2503.14476) by the step's token count;
    GRPO averages each sequence first. Hand-computed on lengths [7, 3, 5, 1] with L_max = 7 and per-row
    constant losses [1, 2, 3, 4]: masked sum = 7 + 6 + 15 + 4 = 32, tokens = 16."""
    lengths, values = [7, 3, 5, 1], [1.0, 2.0, 3.0, 4.0]
    mask = torch.tensor([[1.0] * n + [0.0] * (7 - n) for n in lengths])
    loss = torch.tensor(values)[:, None].expand(4, 7).clone()
    totals = StepTotals.from_masks([mask], constant=7)
    dr = AGGREGATIONS.get("constant")(loss, mask, totals)
    dapo = AGGREGATIONS.get("token_mean")(loss, mask, totals)
    grpo = AGGREGATIONS.get("seq_mean_token_mean")(loss, mask, totals)
    assert dr.item() == pytest.approx(32 / (4 * 7))      # 1.142857...
    assert dapo.item() == pytest.approx(32 / 16)         # 2.0
    assert grpo.item() == pytest.approx((1 + 2 + 3 + 4) / 4)  # 2.5
    # the normalisers are distinguishable: Dr. GRPO's does not depend on the lengths, DAPO's does
    mask2 = mask.clone()
    mask2[0, 5:] = 0  # row 0 two tokens shorter
    t2 = StepTotals.from_masks([mask2], constant=7)
    assert AGGREGATIONS.get("constant")(loss, mask2, t2).item() == pytest.approx(30 / 28)
    assert AGGREGATIONS.get("token_mean")(loss, mask2, t2).item() == pytest.approx(30 / 14)


@pytest.mark.parametrize("mode", ["seq_mean_token_mean", "token_mean", "constant"])
def test_aggregation_same_gradient_whole_micro_batched_and_ranks(mode):
    torch.manual_seed(1)
    R, T = 8, 6
    w = torch.randn(R, T, requires_grad=True)
    mask = (torch.rand(R, T) > 0.3).float()
    mask[:, 0] = 1
    agg = AGGREGATIONS.get(mode)

    def per_token(rows):
        return (w[rows] ** 2) * 0.5  # any differentiable per-token loss

    whole, g_whole = micro_batched_loss(agg, per_token, mask, [slice(None)], T, w)
    # micro-batches of 3 with accumulation: totals are for the whole step
    acc, g_acc = micro_batched_loss(agg, per_token, mask, [slice(0, 3), slice(3, 6), slice(6, 8)], T, w)
    # two simulated ranks, each with two micro-batches, summed (all-reduce sum)
    ranks = [[slice(0, 2), slice(2, 4)], [slice(4, 7), slice(7, 8)]]
    totals_r = StepTotals.from_masks([mask[c] for r in ranks for c in r], constant=T)
    dist = sum(sum(agg(per_token(c), mask[c], totals_r) for c in r) for r in ranks)
    g_dist, = torch.autograd.grad(dist, w)
    assert torch.allclose(whole, acc) and torch.allclose(whole, dist)
    assert torch.allclose(g_whole, g_acc, atol=1e-7) and torch.allclose(g_whole, g_dist, atol=1e-7)


def test_two_grpo_mixed_pair_opposite_equal():
    a = ADVANTAGES.get("group_zscore")(torch.tensor([1.0, 0.0, 1.0, 1.0]), torch.tensor([0, 0, 1, 1]))
    assert float(a[0]) == pytest.approx(-float(a[1]))
    assert float(a[0]) == pytest.approx(0.5 / (math.sqrt(0.5) + 1e-4))  # = 1/sqrt(2) up to epsilon
    assert a[2] == 0 and a[3] == 0


def test_registries_list_names():
    assert {"group_zscore", "group_mean"} <= set(ADVANTAGES.names())
    assert "clipped_ratio" in POLICY_LOSSES.names()
    assert {"k1", "k2", "k3"} <= set(KL_ESTIMATORS.names())
    with pytest.raises(KeyError, match="valid: .*group_zscore"):
        ADVANTAGES.get("nope")
